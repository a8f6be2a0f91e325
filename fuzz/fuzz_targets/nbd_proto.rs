//! Fuzzes every parser of NBD bytes from the network: client flags, option headers and data,
//! the option-haggling state machine, request headers and their validation, and reply building
//! against a stub export. The input layout is documented in `lograid_nbd::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lograid_nbd::fuzzing::fuzz_protocol(data);
});
