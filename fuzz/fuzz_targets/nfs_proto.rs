//! Fuzzes every parser of NFS bytes from the network: record marks and fragments, RPC call
//! headers and credentials, and the arguments of every NFSv3 and MOUNT procedure, answered by
//! a service over in-memory volumes; every reply is checked to be one well-formed record. The
//! input layout is documented in `lograid_nfs::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let service = lograid_nfs::fuzzing::fuzz_service();
    lograid_nfs::fuzzing::fuzz_stream(&service, data);
});
