//! Whole-column buffers kept between the row reads of the cleaner, scrub
//! and rebuild (`Engine::read_row_columns`): a row's columns are read into
//! buffers taken here and given back once the row is done, instead of a
//! fresh allocation per column per row. Fresh ones came from the arenas of
//! the I/O threads that read them (each arena keeping its own peak: the
//! server held three times the memory it used while the cleaner ran), and
//! were zeroed each time.
//!
//! Owns: the kept buffers and their bound. Must never: keep more than
//! `KEPT_MAX` buffers, or hand out one of another length than asked.

use crate::device::AlignedBuf;
use crate::sync::Mutex;

/// Buffers kept at most: two rows of the widest stripe (64 columns).
const KEPT_MAX: usize = 128;

#[derive(Default)]
pub(crate) struct ColumnBuffers {
    kept: Mutex<Vec<AlignedBuf>>,
}

impl ColumnBuffers {
    /// A buffer of `bytes` (its contents unspecified: a reader overwrites it).
    pub fn take(&self, bytes: usize) -> AlignedBuf {
        let mut kept = self.kept.lock();
        match kept.iter().position(|b| b.len() == bytes) {
            Some(i) => kept.swap_remove(i),
            None => {
                drop(kept);
                AlignedBuf::zeroed(bytes)
            }
        }
    }

    /// Keeps `columns`' buffers for the next rows (those of another length
    /// than the newest first, and any past the bound, are freed).
    pub fn give_back(&self, columns: impl IntoIterator<Item = Option<AlignedBuf>>) {
        let mut freed = Vec::new();
        {
            let mut kept = self.kept.lock();
            for buf in columns.into_iter().flatten() {
                if kept.first().is_some_and(|k| k.len() != buf.len()) {
                    freed.append(&mut kept);
                }
                if kept.len() < KEPT_MAX {
                    kept.push(buf);
                } else {
                    freed.push(buf);
                }
            }
        }
        drop(freed);
    }

    /// Bytes kept now.
    pub fn kept_bytes(&self) -> u64 {
        self.kept.lock().iter().map(|b| b.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_length_and_bounded() {
        let pool = ColumnBuffers::default();
        let a = pool.take(8192);
        let at = a.as_ptr() as usize;
        pool.give_back([Some(a), None]);
        assert_eq!(pool.kept_bytes(), 8192);
        // The same buffer again; another length is a new one.
        assert_eq!(pool.take(8192).as_ptr() as usize, at);
        assert_eq!(pool.take(4096).len(), 4096);
        // A length change frees what was kept; the bound holds.
        pool.give_back([Some(AlignedBuf::zeroed(8192))]);
        pool.give_back([Some(AlignedBuf::zeroed(4096))]);
        assert_eq!(pool.kept_bytes(), 4096);
        pool.give_back((0..KEPT_MAX + 5).map(|_| Some(AlignedBuf::zeroed(4096))));
        assert_eq!(pool.kept_bytes(), KEPT_MAX as u64 * 4096);
    }
}
