//! The MOUNT protocol, version 3 (RFC 1813, appendix I), served on the NFS port: NULL, MNT,
//! DUMP, UMNT, UMNTALL and EXPORT for the one export `/`.
//!
//! Owns: the answers to MOUNT calls. Must never: hand out a handle for any path but `/`, or
//! keep state per client (DUMP lists nobody; UMNT has nothing to forget).

use crate::files::Namespace;
use crate::handle::Node;
use crate::rpc::AUTH_SYS;
use crate::xdr::{XdrError, XdrReader, XdrWriter};

pub const PROGRAM: u32 = 100_005;
pub const VERSION: u32 = 3;

const PROC_NULL: u32 = 0;
const PROC_MNT: u32 = 1;
const PROC_DUMP: u32 = 2;
const PROC_UMNT: u32 = 3;
const PROC_UMNTALL: u32 = 4;
const PROC_EXPORT: u32 = 5;

/// The procedures' names, by number (for counters and logs).
pub const PROCEDURE_NAMES: [&str; 6] = ["null", "mnt", "dump", "umnt", "umntall", "export"];

const MNT3_OK: u32 = 0;
const MNT3ERR_NOENT: u32 = 2;
/// `MNTPATHLEN`.
const MAX_PATH_BYTES: u32 = 1024;
/// The one export.
pub const EXPORT_PATH: &[u8] = b"/";

/// Whether `procedure` is one of MOUNT version 3's.
pub fn known(procedure: u32) -> bool {
    procedure <= PROC_EXPORT
}

/// Parses the arguments of `procedure` (known) and appends its results to `out`.
pub fn serve(
    namespace: &Namespace,
    procedure: u32,
    args: &mut XdrReader<'_>,
    out: &mut Vec<u8>,
) -> Result<(), XdrError> {
    match procedure {
        PROC_MNT => {
            let path = args.opaque(MAX_PATH_BYTES)?;
            if path == EXPORT_PATH {
                tracing::debug!("MNT /");
                out.put_u32(MNT3_OK);
                out.put_opaque(&namespace.handle_of(Node::Root));
                out.put_u32(1);
                out.put_u32(AUTH_SYS);
            } else {
                tracing::info!(path = %String::from_utf8_lossy(path), "MNT of a path that is not exported");
                out.put_u32(MNT3ERR_NOENT);
            }
        }
        PROC_UMNT => {
            args.opaque(MAX_PATH_BYTES)?;
        }
        PROC_DUMP => out.put_bool(false),
        PROC_EXPORT => {
            out.put_bool(true);
            out.put_opaque(EXPORT_PATH);
            out.put_bool(false); // no groups: every client that reaches the port
            out.put_bool(false);
        }
        PROC_NULL | PROC_UMNTALL => {}
        _ => {}
    }
    Ok(())
}
