//! The row header: the first `header_blocks` blocks of a row's first data
//! column. It names the row's place in its log head's chain (sequence number,
//! previous header's CRC, the opening nonce), its geometry, and one entry per
//! data slot or logged trim. Recovery and the cleaner read rows through it.
//! Layout: docs/FORMAT.md, "Row header".

use super::{crc32c_skipping, ByteReader, ByteWriter, FormatError, BLOCK_SIZE, FORMAT_VERSION};

pub const ROW_MAGIC: [u8; 8] = *b"LGRDROW1";
/// Bytes of the fixed part of the header; entries follow.
pub const HEADER_FIXED_BYTES: usize = 128;
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 32;
/// Offset of the header CRC within the fixed part.
const CRC_AT: usize = 124;
/// Header blocks per row, at most (bounds what a hostile image can ask us to read).
pub const MAX_HEADER_BLOCKS: u16 = 64;

/// Offsets in the fixed part (docs/FORMAT.md, "Row header: fixed part").
const HEADER_BLOCKS_AT: usize = 12;
/// The geometry `peek_geometry` reads: `segment` to `members_mask`.
const GEOMETRY_AT: usize = 52;
const GEOMETRY_END: usize = 69;
const ENTRY_COUNT_AT: usize = 77;
/// End of the last field (`flushed_seq`); reserved bytes follow up to the CRC.
const FIXED_FIELDS_END: usize = 109;

/// Widths of the fixed part's fields, in the order they are written: magic,
/// version, header_blocks, kind, head, pool_uuid, nonce, seq, prev_crc,
/// segment, offset_blocks, height, data_columns, width, parity,
/// members_mask, next_segment, slots, entry_count, checkpoint_id,
/// checkpoint_offset, payload_bytes, flushed_seq.
const FIXED_FIELD_BYTES: [usize; 23] = {
    const U8: usize = size_of::<u8>();
    const U16: usize = size_of::<u16>();
    const U32: usize = size_of::<u32>();
    const U64: usize = size_of::<u64>();
    const U128: usize = size_of::<u128>();
    [
        ROW_MAGIC.len(),
        U32,
        U16,
        U8,
        U8,
        U128,
        U64,
        U64,
        U32,
        U32,
        U32,
        U16,
        U8,
        U8,
        U8,
        U32,
        U32,
        U32,
        U32,
        U64,
        U64,
        U32,
        U64,
    ]
};

/// Offset of fixed field `i` (its index in `FIXED_FIELD_BYTES`).
const fn fixed_field_at(i: usize) -> usize {
    let mut at = 0;
    let mut k = 0;
    while k < i {
        at += FIXED_FIELD_BYTES[k];
        k += 1;
    }
    at
}

// The documented offsets are the sums of the fields' widths.
const _: () = {
    assert!(fixed_field_at(2) == HEADER_BLOCKS_AT);
    assert!(fixed_field_at(9) == GEOMETRY_AT);
    assert!(fixed_field_at(16) == GEOMETRY_END);
    assert!(fixed_field_at(18) == ENTRY_COUNT_AT);
    assert!(fixed_field_at(FIXED_FIELD_BYTES.len()) == FIXED_FIELDS_END);
    assert!(FIXED_FIELDS_END <= CRC_AT);
    assert!(CRC_AT + size_of::<u32>() == HEADER_FIXED_BYTES);
    assert!(HEADER_FIXED_BYTES <= BLOCK_SIZE);
    // Entry: kind, 3 reserved, volume, lba, crc, count, source.
    assert!(ENTRY_BYTES == 1 + 3 + 4 + 8 + 4 + 4 + 8);
    // entry_count and slots are u32: the largest header's entries fit.
    assert!(
        (MAX_HEADER_BLOCKS as usize * BLOCK_SIZE - HEADER_FIXED_BYTES) / ENTRY_BYTES
            <= u32::MAX as usize
    );
};

/// Which log head wrote a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeadId {
    /// Users' writes.
    User = 0,
    /// Blocks the cleaner moves for the first time (from the users' head),
    /// and users' writes judged long-lived (`pool/lifetime.rs`).
    Cleaner = 1,
    Checkpoint = 2,
    /// Blocks the cleaner moves again (from segments the cleaner's heads
    /// wrote): the coldest data, kept apart so that its segments stay full.
    Cold = 3,
}

impl HeadId {
    pub const ALL: [HeadId; 4] = [
        HeadId::User,
        HeadId::Cleaner,
        HeadId::Checkpoint,
        HeadId::Cold,
    ];
    /// The heads that write data rows (followed by recovery, sealed by a flush).
    pub const DATA: [HeadId; 3] = [HeadId::User, HeadId::Cleaner, HeadId::Cold];
    pub fn from_code(c: u8) -> Result<HeadId, FormatError> {
        match c {
            0 => Ok(HeadId::User),
            1 => Ok(HeadId::Cleaner),
            2 => Ok(HeadId::Checkpoint),
            3 => Ok(HeadId::Cold),
            _ => Err(FormatError::Invalid(format!("log head {c}"))),
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What an entry records. Data and Relocated entries own the next data slot of
/// the row, in order; Trim and Zero own no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A volume block written by a user.
    Data = 1,
    /// A block moved by the cleaner from `source` (applied only if the map
    /// still points at `source` when replayed).
    Relocated = 2,
    /// `count` blocks from `lba` were trimmed (unmapped).
    Trim = 3,
    /// `count` blocks from `lba` were zeroed (allocated, reading zero).
    Zero = 4,
    /// A block of checkpoint payload (checkpoint rows).
    Payload = 5,
}

impl EntryKind {
    pub fn from_code(c: u8) -> Result<EntryKind, FormatError> {
        match c {
            1 => Ok(EntryKind::Data),
            2 => Ok(EntryKind::Relocated),
            3 => Ok(EntryKind::Trim),
            4 => Ok(EntryKind::Zero),
            5 => Ok(EntryKind::Payload),
            _ => Err(FormatError::Invalid(format!("entry kind {c}"))),
        }
    }
    pub fn owns_slot(self) -> bool {
        matches!(
            self,
            EntryKind::Data | EntryKind::Relocated | EntryKind::Payload
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub volume: u32,
    pub lba: u64,
    /// CRC-32C of the block (Data, Relocated).
    pub crc: u32,
    /// Blocks covered (Trim, Zero); 1 otherwise.
    pub count: u32,
    /// Previous location (Relocated), as an encoded physical block address.
    pub source: u64,
}

/// Row kinds: volume data, or a piece of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    Data = 0,
    Checkpoint = 1,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowHeader {
    pub header_blocks: u16,
    pub kind: RowKind,
    pub head: HeadId,
    pub pool_uuid: u128,
    /// Random per pool opening: a row left over from before a crash can never
    /// chain onto a row written after it.
    pub nonce: u64,
    /// Global row sequence number (strictly increasing over all heads).
    pub seq: u64,
    /// Header CRC of the previous row of the same head (0 for its first row).
    pub prev_crc: u32,
    pub segment: u32,
    pub offset_blocks: u32,
    /// Blocks per column in this row.
    pub height: u16,
    /// Data columns holding blocks (header included); the rest read as zero.
    pub data_columns: u8,
    /// Columns of the segment (data and parity).
    pub width: u8,
    pub parity: u8,
    /// Bit i set: member i holds a column of this segment.
    pub members_mask: u32,
    /// Segment the head moves to when this one is full.
    pub next_segment: u32,
    /// Data slots (blocks after the header).
    pub slots: u32,
    /// Checkpoint rows: which checkpoint, and where this payload sits in it.
    pub checkpoint_id: u64,
    pub checkpoint_offset: u64,
    /// Payload bytes (checkpoint rows).
    pub payload_bytes: u32,
    /// Every row with `seq <= flushed_seq` was durable when this row was
    /// sealed: recovery uses it to tell a torn row from a rotted one.
    pub flushed_seq: u64,
    pub entries: Vec<Entry>,
}

/// Geometry read from a header's first block before it is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeekedGeometry {
    pub header_blocks: u16,
    pub segment: u32,
    pub offset_blocks: u32,
    pub height: u16,
    pub data_columns: u8,
    pub width: u8,
    pub parity: u8,
    pub members_mask: u32,
}

/// Header blocks needed for `entries` entries.
pub fn header_blocks_for(entries: usize) -> u16 {
    (HEADER_FIXED_BYTES + entries * ENTRY_BYTES).div_ceil(BLOCK_SIZE) as u16
}

/// Entries that fit in `blocks` header blocks.
pub fn entries_capacity(blocks: u16) -> usize {
    (blocks as usize * BLOCK_SIZE - HEADER_FIXED_BYTES) / ENTRY_BYTES
}

impl RowHeader {
    /// Encodes into exactly `header_blocks * BLOCK_SIZE` bytes; returns them and the header CRC.
    pub fn encode(&self) -> (Vec<u8>, u32) {
        assert_eq!(
            self.header_blocks,
            header_blocks_for(self.entries.len()),
            "header size"
        );
        let total = self.header_blocks as usize * BLOCK_SIZE;
        let mut w = ByteWriter::with_capacity(total);
        w.raw(&ROW_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u16(self.header_blocks);
        w.u8(self.kind as u8);
        w.u8(self.head as u8);
        w.u128(self.pool_uuid);
        w.u64(self.nonce);
        w.u64(self.seq);
        w.u32(self.prev_crc);
        w.u32(self.segment);
        w.u32(self.offset_blocks);
        w.u16(self.height);
        w.u8(self.data_columns);
        w.u8(self.width);
        w.u8(self.parity);
        w.u32(self.members_mask);
        w.u32(self.next_segment);
        w.u32(self.slots);
        w.u32(self.entries.len() as u32);
        w.u64(self.checkpoint_id);
        w.u64(self.checkpoint_offset);
        w.u32(self.payload_bytes);
        w.u64(self.flushed_seq);
        debug_assert_eq!(w.len(), FIXED_FIELDS_END, "row header layout");
        assert!(w.len() <= CRC_AT);
        w.bytes.resize(HEADER_FIXED_BYTES, 0);
        for e in &self.entries {
            w.u8(e.kind as u8);
            w.u8(0);
            w.u16(0);
            w.u32(e.volume);
            w.u64(e.lba);
            w.u32(e.crc);
            w.u32(e.count);
            w.u64(e.source);
        }
        let mut b = w.bytes;
        b.resize(total, 0);
        let crc = crc32c_skipping(&b, CRC_AT);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        // Paired with `decode`: what is written reads back as itself.
        debug_assert!(
            matches!(RowHeader::decode(&b), Ok((ref d, c)) if d == self && c == crc),
            "row header {} does not decode to itself",
            self.seq
        );
        (b, crc)
    }

    /// How many header blocks a row claims, from its first block (validated
    /// before the rest is read).
    pub fn peek_header_blocks(first_block: &[u8]) -> Result<u16, FormatError> {
        if first_block.len() < HEADER_FIXED_BYTES {
            return Err(FormatError::Truncated {
                needed: HEADER_FIXED_BYTES,
                available: first_block.len(),
            });
        }
        if first_block[..8] != ROW_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let hb = u16::from_le_bytes([
            first_block[HEADER_BLOCKS_AT],
            first_block[HEADER_BLOCKS_AT + 1],
        ]);
        if hb == 0 || hb > MAX_HEADER_BLOCKS {
            return Err(FormatError::Invalid(format!("row header blocks {hb}")));
        }
        Ok(hb)
    }

    /// The geometry fields of a header's first block, unverified (the CRC
    /// covers every header block): used to locate the rest of a header.
    pub fn peek_geometry(first_block: &[u8]) -> Result<PeekedGeometry, FormatError> {
        let header_blocks = Self::peek_header_blocks(first_block)?;
        let mut r = ByteReader::new(&first_block[GEOMETRY_AT..]);
        let segment = r.u32()?;
        let offset_blocks = r.u32()?;
        let height = r.u16()?;
        let data_columns = r.u8()?;
        let width = r.u8()?;
        let parity = r.u8()?;
        let members_mask = r.u32()?;
        if height == 0 || data_columns == 0 {
            return Err(FormatError::Invalid("row geometry".into()));
        }
        Ok(PeekedGeometry {
            header_blocks,
            segment,
            offset_blocks,
            height,
            data_columns,
            width,
            parity,
            members_mask,
        })
    }

    /// Decodes and verifies a header; returns it with its CRC. In order:
    /// the header's blocks and CRC, the fixed part, its sizes and geometry,
    /// then the entries.
    pub fn decode(bytes: &[u8]) -> Result<(RowHeader, u32), FormatError> {
        let (bytes, stored) = verified_header_blocks(bytes)?;
        let mut r = ByteReader::new(bytes);
        let (mut header, entry_count) = read_fixed_part(&mut r)?;
        check_entry_count(header.header_blocks, entry_count)?;
        check_geometry(&header)?;
        header.entries = read_entries(bytes, entry_count, header.slots)?;
        Ok((header, stored))
    }
}

/// The `header_blocks` blocks a header claims, after its magic and block
/// count (`peek_header_blocks`), its length and its CRC; with the CRC.
fn verified_header_blocks(bytes: &[u8]) -> Result<(&[u8], u32), FormatError> {
    let hb = RowHeader::peek_header_blocks(bytes)?;
    let total = hb as usize * BLOCK_SIZE;
    let Some(bytes) = bytes.get(..total) else {
        return Err(FormatError::Truncated {
            needed: total,
            available: bytes.len(),
        });
    };
    let mut crc_field = ByteReader::new(bytes.get(CRC_AT..).unwrap_or_default());
    let stored = crc_field.u32()?;
    let computed = crc32c_skipping(bytes, CRC_AT);
    if stored != computed {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    Ok((bytes, stored))
}

/// The fixed part after the magic: version, codes, chain, geometry,
/// checkpoint fields. The header comes back without its entries, with the
/// entry count read.
fn read_fixed_part(r: &mut ByteReader) -> Result<(RowHeader, usize), FormatError> {
    r.take(ROW_MAGIC.len())?;
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::BadVersion(version));
    }
    let header_blocks = r.u16()?;
    let kind = match r.u8()? {
        0 => RowKind::Data,
        1 => RowKind::Checkpoint,
        k => return Err(FormatError::Invalid(format!("row kind {k}"))),
    };
    let head = HeadId::from_code(r.u8()?)?;
    let pool_uuid = r.u128()?;
    let nonce = r.u64()?;
    let seq = r.u64()?;
    let prev_crc = r.u32()?;
    let segment = r.u32()?;
    let offset_blocks = r.u32()?;
    let height = r.u16()?;
    let data_columns = r.u8()?;
    let width = r.u8()?;
    let parity = r.u8()?;
    let members_mask = r.u32()?;
    let next_segment = r.u32()?;
    let slots = r.u32()?;
    let entry_count = r.u32()? as usize;
    let header = RowHeader {
        header_blocks,
        kind,
        head,
        pool_uuid,
        nonce,
        seq,
        prev_crc,
        segment,
        offset_blocks,
        height,
        data_columns,
        width,
        parity,
        members_mask,
        next_segment,
        slots,
        checkpoint_id: r.u64()?,
        checkpoint_offset: r.u64()?,
        payload_bytes: r.u32()?,
        flushed_seq: r.u64()?,
        entries: Vec::new(),
    };
    Ok((header, entry_count))
}

/// The entries fit in the header's blocks, and the header is exactly as
/// many blocks as they need.
fn check_entry_count(header_blocks: u16, entry_count: usize) -> Result<(), FormatError> {
    if entry_count > entries_capacity(header_blocks) {
        return Err(FormatError::Invalid(format!(
            "{entry_count} entries in {header_blocks} header blocks"
        )));
    }
    if header_blocks != header_blocks_for(entry_count) {
        return Err(FormatError::Invalid(
            "header size does not match entry count".into(),
        ));
    }
    Ok(())
}

/// Columns within the limits and the members mask, and the header and
/// slots within the row's data blocks.
fn check_geometry(h: &RowHeader) -> Result<(), FormatError> {
    if h.height == 0
        || h.data_columns == 0
        || h.parity as usize > super::MAX_PARITY
        || (h.width as usize) > super::MAX_MEMBERS
        || h.data_columns as usize + h.parity as usize > h.width as usize
        || h.members_mask.count_ones() != h.width as u32
    {
        return Err(FormatError::Invalid("row geometry".into()));
    }
    let capacity = h.height as u64 * h.data_columns as u64;
    if h.header_blocks as u64 + h.slots as u64 > capacity {
        return Err(FormatError::Invalid("row slots exceed its geometry".into()));
    }
    Ok(())
}

/// The `entry_count` entries after the fixed part of `bytes` (the whole
/// header); as many of them must own a slot as the header has `slots`.
fn read_entries(bytes: &[u8], entry_count: usize, slots: u32) -> Result<Vec<Entry>, FormatError> {
    let mut r = ByteReader::new(bytes);
    r.take(HEADER_FIXED_BYTES)?;
    let mut entries = Vec::with_capacity(entry_count);
    let mut slot_entries = 0u32;
    for _ in 0..entry_count {
        let entry = read_entry(&mut r)?;
        if entry.kind.owns_slot() {
            slot_entries += 1;
        }
        entries.push(entry);
    }
    if slot_entries != slots {
        return Err(FormatError::Invalid(
            "slot entries do not match slot count".into(),
        ));
    }
    Ok(entries)
}

/// One 32-byte entry: kind, 3 reserved bytes, then its fields.
fn read_entry(r: &mut ByteReader) -> Result<Entry, FormatError> {
    let kind = EntryKind::from_code(r.u8()?)?;
    r.take(3)?;
    Ok(Entry {
        kind,
        volume: r.u32()?,
        lba: r.u64()?,
        crc: r.u32()?,
        count: r.u32()?,
        source: r.u64()?,
    })
}
