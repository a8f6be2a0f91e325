//! The member superblock: identity of the pool and of this member, the pool's
//! static configuration, the member table, and the pointer to the newest
//! checkpoint. Two slots at the start of every member (blocks 0 and 1) and two
//! at the end (last two blocks); generation `g` is written to slot `g % 2` at
//! both ends, so a torn superblock write always leaves the previous
//! generation intact. Layout: docs/FORMAT.md, "Superblock".

use super::{
    crc32c_skipping, ByteReader, ByteWriter, FormatError, BLOCK_SIZE, FORMAT_VERSION, MAX_MEMBERS,
};

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"LGRDSUPR";
/// The CRC-32C over the block sits in the last 4 bytes.
const CRC_AT: usize = BLOCK_SIZE - 4;

/// State of a member as recorded in the member table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Holds rows; new segments are laid over it.
    Active,
    /// Failed; its columns are rebuilt from parity on read. No new segments.
    Faulted,
    /// Added: segments taken after the checkpoint this superblock points at
    /// may or may not include it (it becomes active once a superblock that
    /// records it is durable on every member).
    Joining,
    /// Being replaced or removed: no new segments; the rows that use it are
    /// being moved to the other members. Still read while present.
    Removing,
    /// An empty slot: no row uses it; a later member may take the index.
    Removed,
}

impl MemberState {
    /// Rows may have columns on a member in this state.
    pub fn may_hold_rows(self) -> bool {
        self != MemberState::Removed
    }
    fn code(self) -> u8 {
        match self {
            MemberState::Active => 0,
            MemberState::Faulted => 1,
            MemberState::Joining => 2,
            MemberState::Removing => 3,
            MemberState::Removed => 4,
        }
    }
    fn from_code(c: u8) -> Result<Self, FormatError> {
        match c {
            0 => Ok(MemberState::Active),
            1 => Ok(MemberState::Faulted),
            2 => Ok(MemberState::Joining),
            3 => Ok(MemberState::Removing),
            4 => Ok(MemberState::Removed),
            _ => Err(FormatError::Invalid(format!("member state {c}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    pub uuid: u128,
    pub size_blocks: u64,
    pub state: MemberState,
}

/// Where the newest checkpoint starts and how to verify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointPointer {
    /// Identifies the checkpoint (increments by one per checkpoint).
    pub checkpoint_id: u64,
    /// Segment and block offset of its first row.
    pub segment: u32,
    pub offset_blocks: u32,
    /// Header CRC of the first row (guards against a reused segment).
    pub first_row_crc: u32,
    /// Length and CRC-32C of the serialized checkpoint.
    pub blob_bytes: u64,
    pub blob_crc: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub pool_uuid: u128,
    pub pool_name: String,
    pub created_unix: u64,
    pub member_index: u8,
    pub generation: u64,
    /// Parity columns per row for new rows.
    pub parity: u8,
    /// Height of a full row's column, in blocks (the chunk size).
    pub chunk_blocks: u32,
    /// Blocks per member per segment.
    pub segment_blocks: u32,
    pub data_start_block: u64,
    pub members: Vec<MemberRecord>,
    pub checkpoint: CheckpointPointer,
}

impl Superblock {
    pub fn member_uuid(&self) -> u128 {
        self.members[self.member_index as usize].uuid
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = ByteWriter::with_capacity(BLOCK_SIZE);
        w.raw(&SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u128(self.pool_uuid);
        w.str16(&self.pool_name);
        w.u64(self.created_unix);
        w.u8(self.member_index);
        w.u64(self.generation);
        w.u8(self.parity);
        w.u32(self.chunk_blocks);
        w.u32(self.segment_blocks);
        w.u64(self.data_start_block);
        w.u8(self.members.len() as u8);
        for m in &self.members {
            w.u128(m.uuid);
            w.u64(m.size_blocks);
            w.u8(m.state.code());
        }
        let c = &self.checkpoint;
        w.u64(c.checkpoint_id);
        w.u32(c.segment);
        w.u32(c.offset_blocks);
        w.u32(c.first_row_crc);
        w.u64(c.blob_bytes);
        w.u32(c.blob_crc);
        assert!(w.len() <= CRC_AT, "superblock overflows its block");
        let mut b = w.bytes;
        b.resize(BLOCK_SIZE, 0);
        let crc = crc32c_skipping(&b, CRC_AT);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        if block.len() < BLOCK_SIZE {
            return Err(FormatError::Truncated {
                needed: BLOCK_SIZE,
                available: block.len(),
            });
        }
        let block = &block[..BLOCK_SIZE];
        if block[..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let stored = u32::from_le_bytes(block[CRC_AT..].try_into().expect("4 bytes"));
        let computed = crc32c_skipping(block, CRC_AT);
        if stored != computed {
            return Err(FormatError::BadChecksum { stored, computed });
        }
        let mut r = ByteReader::new(&block[..CRC_AT]);
        r.take(8)?;
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(FormatError::BadVersion(version));
        }
        let pool_uuid = r.u128()?;
        let pool_name = r.str16()?;
        let created_unix = r.u64()?;
        let member_index = r.u8()?;
        let generation = r.u64()?;
        let parity = r.u8()?;
        let chunk_blocks = r.u32()?;
        let segment_blocks = r.u32()?;
        let data_start_block = r.u64()?;
        let count = r.u8()? as usize;
        if count == 0 || count > MAX_MEMBERS || member_index as usize >= count {
            return Err(FormatError::Invalid(format!(
                "member count {count}, index {member_index}"
            )));
        }
        if parity as usize > super::MAX_PARITY || parity as usize >= count {
            return Err(FormatError::Invalid(format!(
                "parity {parity} for {count} members"
            )));
        }
        if !chunk_blocks.is_power_of_two()
            || chunk_blocks > 256
            || segment_blocks == 0
            || segment_blocks % chunk_blocks != 0
            || !(2..=1 << 20).contains(&data_start_block)
        {
            return Err(FormatError::Invalid(format!(
                "chunk {chunk_blocks} / segment {segment_blocks} blocks"
            )));
        }
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let uuid = r.u128()?;
            let size_blocks = r.u64()?;
            let state = MemberState::from_code(r.u8()?)?;
            // A removed slot records no size.
            if size_blocks > super::MAX_MEMBER_BLOCKS
                || (state.may_hold_rows() && size_blocks < data_start_block + super::TAIL_BLOCKS)
            {
                return Err(FormatError::Invalid(format!(
                    "member size {size_blocks} blocks"
                )));
            }
            members.push(MemberRecord {
                uuid,
                size_blocks,
                state,
            });
        }
        let checkpoint = CheckpointPointer {
            checkpoint_id: r.u64()?,
            segment: r.u32()?,
            offset_blocks: r.u32()?,
            first_row_crc: r.u32()?,
            blob_bytes: r.u64()?,
            blob_crc: r.u32()?,
        };
        Ok(Superblock {
            pool_uuid,
            pool_name,
            created_unix,
            member_index,
            generation,
            parity,
            chunk_blocks,
            segment_blocks,
            data_start_block,
            members,
            checkpoint,
        })
    }

    /// Block numbers on a member of `size_blocks` where generation `g` goes.
    pub fn slot_blocks(size_blocks: u64, generation: u64) -> [u64; 2] {
        let slot = generation % 2;
        [slot, size_blocks - super::TAIL_BLOCKS + slot]
    }
}
