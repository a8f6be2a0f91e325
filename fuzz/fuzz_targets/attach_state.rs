//! Fuzzes the parser of the attachments state file (`lograid attach`'s record of each loop
//! device it made, read by `detach` and `attach --list` from the state directory). Whatever
//! parses must format and parse back to the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    lograid_nbd::fuzzing::fuzz_attach_state(text);
});
