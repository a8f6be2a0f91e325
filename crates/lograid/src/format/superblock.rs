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

/// Offsets and sizes of docs/FORMAT.md, "Superblock: fields" (`L` is the
/// pool name's length, `n` the member count).
const POOL_NAME_AT: usize = 30;
/// `member_count` is at `64 + L`; the member table follows it.
const MEMBER_COUNT_AT_LESS_NAME: usize = 64;
/// "Superblock: member record".
const MEMBER_RECORD_BYTES: usize = 25;
/// The checkpoint pointer ends at `97 + L + 25n`; reserved bytes follow.
const FIELDS_END_LESS_NAME_AND_TABLE: usize = 97;
/// `L + 25n` at most: what the name and the member table may fill.
const NAME_AND_TABLE_MAX: usize = 3995;

// The documented offsets are the sums of the fields' widths, in the order
// they are written.
const _: () = {
    const U8: usize = size_of::<u8>();
    const U16: usize = size_of::<u16>();
    const U32: usize = size_of::<u32>();
    const U64: usize = size_of::<u64>();
    const U128: usize = size_of::<u128>();
    // magic, version, pool_uuid, pool_name_len.
    assert!(SUPERBLOCK_MAGIC.len() + U32 + U128 + U16 == POOL_NAME_AT);
    // created_unix, member_index, generation, parity, chunk_blocks,
    // segment_blocks, data_start_block.
    assert!(POOL_NAME_AT + U64 + U8 + U64 + U8 + U32 + U32 + U64 == MEMBER_COUNT_AT_LESS_NAME);
    // uuid, size_blocks, state.
    assert!(MEMBER_RECORD_BYTES == U128 + U64 + U8);
    // member_count, then the checkpoint pointer: checkpoint_id, segment,
    // offset_blocks, first_row_crc, blob_bytes, blob_crc.
    assert!(
        MEMBER_COUNT_AT_LESS_NAME + U8 + U64 + 3 * U32 + U64 + U32
            == FIELDS_END_LESS_NAME_AND_TABLE
    );
    assert!(FIELDS_END_LESS_NAME_AND_TABLE + NAME_AND_TABLE_MAX == CRC_AT);
    assert!(CRC_AT + U32 == BLOCK_SIZE);
    // A full member table fits, with room for a name; its count is a u8.
    assert!(MAX_MEMBERS * MEMBER_RECORD_BYTES < NAME_AND_TABLE_MAX);
    assert!(MAX_MEMBERS <= u8::MAX as usize);
};

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
        debug_assert_eq!(
            w.len(),
            FIELDS_END_LESS_NAME_AND_TABLE
                + self.pool_name.len().min(u16::MAX as usize)
                + MEMBER_RECORD_BYTES * self.members.len(),
            "superblock layout"
        );
        assert!(w.len() <= CRC_AT, "superblock overflows its block");
        let mut b = w.bytes;
        b.resize(BLOCK_SIZE, 0);
        let crc = crc32c_skipping(&b, CRC_AT);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        // Paired with `decode`: what is written reads back as itself, or,
        // if a field breaks a decoding rule, is refused for that rule (tests
        // write such superblocks on purpose, for open to refuse).
        debug_assert!(
            match (self.check_fields(), Superblock::decode(&b)) {
                (Ok(()), Ok(d)) => d == *self,
                (Err(rule), Err(refused)) => rule == refused,
                _ => false,
            },
            "superblock generation {} does not decode to itself",
            self.generation
        );
        b
    }

    /// The decoding rules on the fields, in the order `decode` checks them.
    fn check_fields(&self) -> Result<(), FormatError> {
        check_config(self, self.members.len())?;
        for m in &self.members {
            check_member(m, self.data_start_block)?;
        }
        Ok(())
    }

    /// Decodes and verifies one block, in order: its length, magic and
    /// CRC, the pool fields, the member count and configuration checks, the
    /// member table, the checkpoint pointer.
    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        let body = verified_block(block)?;
        let mut r = ByteReader::new(body);
        let mut sb = read_pool_fields(&mut r)?;
        let count = r.u8()? as usize;
        check_config(&sb, count)?;
        sb.members = read_member_table(&mut r, count, sb.data_start_block)?;
        sb.checkpoint = read_checkpoint_pointer(&mut r)?;
        Ok(sb)
    }

    /// Block numbers on a member of `size_blocks` where generation `g` goes.
    pub fn slot_blocks(size_blocks: u64, generation: u64) -> [u64; 2] {
        let slot = generation % 2;
        [slot, size_blocks - super::TAIL_BLOCKS + slot]
    }
}

/// The first block of `block`, checked for its magic and CRC; returns the
/// bytes before the CRC.
fn verified_block(block: &[u8]) -> Result<&[u8], FormatError> {
    let Some(block) = block.get(..BLOCK_SIZE) else {
        return Err(FormatError::Truncated {
            needed: BLOCK_SIZE,
            available: block.len(),
        });
    };
    if !block.starts_with(&SUPERBLOCK_MAGIC) {
        return Err(FormatError::BadMagic);
    }
    let Some((body, crc_field)) = block.split_at_checked(CRC_AT) else {
        return Err(FormatError::Truncated {
            needed: BLOCK_SIZE,
            available: block.len(),
        });
    };
    let stored = ByteReader::new(crc_field).u32()?;
    let computed = crc32c_skipping(block, CRC_AT);
    if stored != computed {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    Ok(body)
}

/// Magic and version, then the fields up to the member count: the pool's
/// identity, this member's index and the generation, the configuration.
/// The superblock comes back without members and with a default pointer.
fn read_pool_fields(r: &mut ByteReader) -> Result<Superblock, FormatError> {
    r.take(SUPERBLOCK_MAGIC.len())?;
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::BadVersion(version));
    }
    Ok(Superblock {
        pool_uuid: r.u128()?,
        pool_name: r.str16()?,
        created_unix: r.u64()?,
        member_index: r.u8()?,
        generation: r.u64()?,
        parity: r.u8()?,
        chunk_blocks: r.u32()?,
        segment_blocks: r.u32()?,
        data_start_block: r.u64()?,
        members: Vec::new(),
        checkpoint: CheckpointPointer::default(),
    })
}

/// The member count, index, parity and row geometry rules (the fields of
/// `sb` before its member table; `count` members).
fn check_config(sb: &Superblock, count: usize) -> Result<(), FormatError> {
    let member_index = sb.member_index;
    if count == 0 || count > MAX_MEMBERS || member_index as usize >= count {
        return Err(FormatError::Invalid(format!(
            "member count {count}, index {member_index}"
        )));
    }
    let parity = sb.parity;
    if parity as usize > super::MAX_PARITY || parity as usize >= count {
        return Err(FormatError::Invalid(format!(
            "parity {parity} for {count} members"
        )));
    }
    let (chunk_blocks, segment_blocks) = (sb.chunk_blocks, sb.segment_blocks);
    if !chunk_blocks.is_power_of_two()
        || chunk_blocks > 256
        || segment_blocks == 0
        || segment_blocks % chunk_blocks != 0
        || !(2..=1 << 20).contains(&sb.data_start_block)
    {
        return Err(FormatError::Invalid(format!(
            "chunk {chunk_blocks} / segment {segment_blocks} blocks"
        )));
    }
    Ok(())
}

/// The member table: `count` records of uuid, size and state.
fn read_member_table(
    r: &mut ByteReader,
    count: usize,
    data_start_block: u64,
) -> Result<Vec<MemberRecord>, FormatError> {
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        let member = MemberRecord {
            uuid: r.u128()?,
            size_blocks: r.u64()?,
            state: MemberState::from_code(r.u8()?)?,
        };
        check_member(&member, data_start_block)?;
        members.push(member);
    }
    Ok(members)
}

/// A member's size: at most `MAX_MEMBER_BLOCKS`, and room for the data
/// area and the tail slots unless the slot is removed (records no size).
fn check_member(m: &MemberRecord, data_start_block: u64) -> Result<(), FormatError> {
    let size_blocks = m.size_blocks;
    if size_blocks > super::MAX_MEMBER_BLOCKS
        || (m.state.may_hold_rows() && size_blocks < data_start_block + super::TAIL_BLOCKS)
    {
        return Err(FormatError::Invalid(format!(
            "member size {size_blocks} blocks"
        )));
    }
    Ok(())
}

/// The pointer to the newest checkpoint, after the member table.
fn read_checkpoint_pointer(r: &mut ByteReader) -> Result<CheckpointPointer, FormatError> {
    Ok(CheckpointPointer {
        checkpoint_id: r.u64()?,
        segment: r.u32()?,
        offset_blocks: r.u32()?,
        first_row_crc: r.u32()?,
        blob_bytes: r.u64()?,
        blob_crc: r.u32()?,
    })
}
