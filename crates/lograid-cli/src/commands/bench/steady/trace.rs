//! Block traces in the SNIA / MSR Cambridge CSV format, one request a line:
//!
//!     Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
//!     128166372003061629,hm,1,Write,3154152448,4096,5354
//!
//! Type is Read or Write (any case), Offset and Size in bytes. A first line
//! naming the columns, blank lines and lines starting with `#` are skipped.
//! Only the writes are kept; they are replayed in order, looped, as fast as
//! the writers go (the timestamps are not used), each offset taken modulo
//! the volume's size and aligned down to 4 KiB, each size rounded up to
//! 4 KiB (and moved back to fit if it would run past the volume's end).

use super::pattern::Req;
use std::path::Path;

const BLOCK: u64 = 4096;
const FIELDS: &str = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime";

/// The writes of a trace.
#[derive(Debug)]
pub struct Trace {
    /// (offset, size) in bytes, as in the file.
    writes: Vec<(u64, u32)>,
    pub reads_skipped: u64,
}

impl Trace {
    pub fn load(path: &Path) -> Result<Trace, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("trace {}: {e}", path.display()))?;
        Trace::parse(&text).map_err(|e| format!("trace {}: {e}", path.display()))
    }

    /// Parses the text of a trace; errors name the line (from 1).
    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut trace = Trace {
            writes: Vec::new(),
            reads_skipped: 0,
        };
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if trace.writes.is_empty()
                && trace.reads_skipped == 0
                && fields[0].eq_ignore_ascii_case("timestamp")
            {
                continue; // the column names
            }
            if fields.len() != 7 {
                return Err(format!(
                    "line {n}: expected 7 comma-separated fields ({FIELDS}), found {}",
                    fields.len()
                ));
            }
            let whole = |at: usize, name: &str| -> Result<u64, String> {
                fields[at]
                    .parse::<u64>()
                    .map_err(|_| format!("line {n}: {name} '{}' is not a whole number", fields[at]))
            };
            whole(0, "Timestamp")?;
            whole(2, "DiskNumber")?;
            whole(6, "ResponseTime")?;
            let offset = whole(4, "Offset")?;
            let size = whole(5, "Size")?;
            if size == 0 || size > 1 << 30 {
                return Err(format!(
                    "line {n}: Size {size} is not between 1 byte and 1 GiB"
                ));
            }
            match fields[3].to_ascii_lowercase().as_str() {
                "write" => trace.writes.push((offset, size as u32)),
                "read" => trace.reads_skipped += 1,
                _ => {
                    return Err(format!(
                        "line {n}: Type '{}' is neither Read nor Write",
                        fields[3]
                    ))
                }
            }
        }
        if trace.writes.is_empty() {
            return Err(format!(
                "no writes in it (an empty file, or reads only: {} read(s)); expected lines of {FIELDS}",
                trace.reads_skipped
            ));
        }
        Ok(trace)
    }

    pub fn writes(&self) -> usize {
        self.writes.len()
    }

    /// The longest write, rounded up to 4 KiB.
    pub fn max_len(&self) -> u64 {
        self.writes
            .iter()
            .map(|&(_, s)| (s as u64).next_multiple_of(BLOCK))
            .max()
            .unwrap_or(BLOCK)
    }

    /// The i-th write of the looped trace on a volume of `volume_bytes`.
    pub fn request(&self, i: u64, volume_bytes: u64) -> Req {
        let (offset, size) = self.writes[(i % self.writes.len() as u64) as usize];
        let volume = (volume_bytes / BLOCK * BLOCK).max(BLOCK);
        let len = (size as u64).next_multiple_of(BLOCK).min(volume);
        let offset = (offset % volume / BLOCK * BLOCK).min(volume - len);
        Req { offset, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
# made up for this test
Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
128166372003061629,hm,1,Write,3154152448,4096,5354
128166372003061630,hm,1,Read,8192,512,100

128166372003061631,hm,1,write,12800,5000,0
128166372003061632, hm , 0 , WRITE , 1048576000 , 65536 , 7
";

    #[test]
    fn a_good_trace_keeps_its_writes() {
        let t = Trace::parse(GOOD).unwrap();
        assert_eq!(t.writes(), 3);
        assert_eq!(t.reads_skipped, 1);
        assert_eq!(t.max_len(), 65536);
        let volume = 1 << 30;
        // Modulo the volume (1006668800), aligned down; sizes rounded up.
        assert_eq!(
            t.request(0, volume),
            Req {
                offset: 1006665728,
                len: 4096
            }
        );
        assert_eq!(
            t.request(1, volume),
            Req {
                offset: 12288,
                len: 8192
            }
        );
        // 1048576000 is 1000 MiB: offset 0 in a volume of that size.
        assert_eq!(
            t.request(2, 1000 << 20),
            Req {
                offset: 0,
                len: 65536
            }
        );
        // Looped.
        assert_eq!(t.request(3, volume), t.request(0, volume));
        // A write that would run past the end is moved back to fit.
        assert_eq!(
            t.request(2, 1048576000 + 8192),
            Req {
                offset: 1048576000 + 8192 - 65536,
                len: 65536
            }
        );
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, says) in [
            ("1,h,1,Write,0,4096\n", "line 1: expected 7 comma-separated fields"),
            (
                "1,h,1,Write,0,4096,1\n2,h,1,Erase,0,4096,1\n",
                "line 2: Type 'Erase' is neither Read nor Write",
            ),
            (
                "\n\n1,h,1,Write,-5,4096,1\n",
                "line 3: Offset '-5' is not a whole number",
            ),
            ("1,h,1,Write,0,0,1\n", "line 1: Size 0 is not between"),
            ("x,h,1,Write,0,4096,1\n", "line 1: Timestamp 'x'"),
            (
                "1,h,1,Write,0,4096,1\nTimestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n",
                "line 2: Timestamp 'Timestamp'",
            ),
        ] {
            let err = Trace::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_trace_without_writes_is_refused() {
        for text in ["", "\n# nothing\n", "1,h,1,Read,0,4096,1\n"] {
            let err = Trace::parse(text).unwrap_err();
            assert!(err.contains("no writes"), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_sample_trace_in_the_repository_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/traces/sample-msr.csv");
        let t = Trace::load(&path).unwrap();
        assert!(t.writes() > 1000 && t.reads_skipped > 0, "{t:?}");
    }
}
