//! NFS file handles: what a handle holds and how it is checked.
//!
//! A handle names the pool (its UUID) and, for a volume's file, the volume's id, which the
//! engine never reuses. Nothing in it depends on the server process, so a handle a client
//! got before a restart still names the same file after it (RFC 1813 asks handles to stay
//! valid across server restarts). Layout (28 bytes): magic `LRNF`, format version 1, kind
//! (1 the export's root directory, 2 a volume's file), two zero bytes, the pool UUID (16
//! bytes, little-endian), the volume id (4 bytes, little-endian; 0 for the root).
//!
//! Owns: encoding and decoding handles. Must never: accept a handle of another pool or of
//! another layout as one of ours.

/// Bytes of every handle this server makes.
pub const HANDLE_BYTES: usize = 28;
/// Largest handle NFSv3 allows (`NFS3_FHSIZE`).
pub const MAX_HANDLE_BYTES: u32 = 64;
const MAGIC: &[u8; 4] = b"LRNF";
const FORMAT_VERSION: u8 = 1;
const KIND_ROOT: u8 = 1;
const KIND_VOLUME: u8 = 2;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Root,
    /// The file of the volume with this id.
    Volume(u32),
}

/// Why a handle names nothing served here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// Not a handle this server makes (`NFS3ERR_BADHANDLE`).
    Bad,
    /// One of ours, for another pool (`NFS3ERR_STALE`).
    OtherPool,
}

/// The handle of `node` in the pool `pool_uuid`.
pub fn encode(pool_uuid: u128, node: Node) -> [u8; HANDLE_BYTES] {
    let mut handle = [0u8; HANDLE_BYTES];
    handle[..4].copy_from_slice(MAGIC);
    handle[4] = FORMAT_VERSION;
    let (kind, volume_id) = match node {
        Node::Root => (KIND_ROOT, 0),
        Node::Volume(id) => (KIND_VOLUME, id),
    };
    handle[5] = kind;
    handle[8..24].copy_from_slice(&pool_uuid.to_le_bytes());
    handle[24..28].copy_from_slice(&volume_id.to_le_bytes());
    handle
}

/// What `handle` names, if it is one of ours for the pool `pool_uuid`.
pub fn decode(pool_uuid: u128, handle: &[u8]) -> Result<Node, HandleError> {
    let Ok(handle) = <&[u8; HANDLE_BYTES]>::try_from(handle) else {
        return Err(HandleError::Bad);
    };
    if &handle[..4] != MAGIC || handle[4] != FORMAT_VERSION || handle[6..8] != [0, 0] {
        return Err(HandleError::Bad);
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&handle[8..24]);
    let volume_id = u32::from_le_bytes([handle[24], handle[25], handle[26], handle[27]]);
    let node = match (handle[5], volume_id) {
        (KIND_ROOT, 0) => Node::Root,
        (KIND_VOLUME, id) if id != 0 => Node::Volume(id),
        _ => return Err(HandleError::Bad),
    };
    if u128::from_le_bytes(uuid) != pool_uuid {
        return Err(HandleError::OtherPool);
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_strangers() {
        let pool = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;
        for node in [Node::Root, Node::Volume(1), Node::Volume(u32::MAX)] {
            assert_eq!(decode(pool, &encode(pool, node)), Ok(node));
            assert_eq!(
                decode(pool + 1, &encode(pool, node)),
                Err(HandleError::OtherPool)
            );
        }
        let good = encode(pool, Node::Volume(3));
        assert_eq!(decode(pool, &good[..27]), Err(HandleError::Bad));
        assert_eq!(decode(pool, &[]), Err(HandleError::Bad));
        for index in [0, 4, 5, 6] {
            let mut bad = good;
            bad[index] ^= 0x40;
            assert_eq!(decode(pool, &bad), Err(HandleError::Bad), "byte {index}");
        }
        let mut root_with_id = encode(pool, Node::Root);
        root_with_id[24] = 1;
        assert_eq!(decode(pool, &root_with_id), Err(HandleError::Bad));
        assert_eq!(
            decode(pool, &encode(pool, Node::Volume(0))),
            Err(HandleError::Bad)
        );
    }
}
