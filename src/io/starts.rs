//! A start's reads: what a program read of a blob from a server in the first seconds
//! after the blob was opened, recorded, so that the next start of the same image fetches
//! all of it at once and in parallel instead of one round trip per file.
//!
//! A layer read lazily from a registry costs a start one round trip for every file it
//! opens, one after the other: python's start through a 40 ms link reads some sixty
//! files, and waits more than two seconds on the network for bytes that would cross the
//! link in half a second. An image that says what its start reads (eStargz's prioritized
//! files) is fetched ahead already; for the others, the first start on a node is
//! [`Recorder`]ed (every read, hits included, in the order of first touch, for a window
//! after the open) and the next fetches the record ahead of the reads
//! ([`Blob::fetch_in_order`]). Where records are kept and under which key (the image's
//! digest and the layer's) is the caller's choice (`source::start`): this module
//! knows blobs only.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::blob::Blob;
use crate::error::{Error, Result};

/// Ranges a record holds at most (each a read, or reads merged): more is not a start.
pub const MAX_RANGES: usize = 65_536;
/// Bytes a record covers at most.
pub const MAX_BYTES: u64 = 1 << 30;
/// Reads that start at most this far past the end of the range noted before them join
/// it: one request for a file's chunks one after another, the gap costs less than a
/// round trip (16 KiB cross a 100 Mbit/s link in 1.3 ms).
const JOIN_GAP: u64 = 16 << 10;
/// First line of a record.
const MAGIC: &str = "pkgfs-start 1";

/// The reads of one blob in a window, in the order of first touch.
#[derive(Debug)]
pub struct Recorder {
    window: Duration,
    /// Set by [`Recorder::arm`]: reads before it (the open's own: a table of contents
    /// is kept in the index cache) are not the start's.
    armed: Mutex<Option<Instant>>,
    /// The window is over, or the record was taken.
    closed: AtomicBool,
    noted: Mutex<Noted>,
}

#[derive(Debug, Default)]
struct Noted {
    /// In the order of first touch.
    order: Vec<(u64, u64)>,
    /// What `order` covers, by start: reads inside it are not noted again.
    covered: std::collections::BTreeMap<u64, u64>,
    bytes: u64,
}

impl Noted {
    fn covers(&self, s: u64, e: u64) -> bool {
        self.covered
            .range(..=s)
            .next_back()
            .is_some_and(|(_, &end)| end >= e)
    }

    fn add(&mut self, s: u64, e: u64) {
        // Merge into what it touches, so `covers` sees one range.
        let (mut a, mut b) = (s, e);
        let touching: Vec<u64> = self
            .covered
            .range(..=e)
            .rev()
            .take_while(|(_, end)| **end >= s)
            .map(|(start, _)| *start)
            .collect();
        for start in touching {
            if let Some(end) = self.covered.remove(&start) {
                a = a.min(start);
                b = b.max(end);
            }
        }
        self.covered.insert(a, b);
        match self.order.last_mut() {
            Some(last) if s >= last.0 && s <= last.1 + JOIN_GAP => last.1 = last.1.max(e),
            _ => self.order.push((s, e)),
        }
        self.bytes += e - s;
    }
}

impl Recorder {
    /// A recorder of the reads made within `window` of [`Recorder::arm`].
    pub fn new(window: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            window,
            armed: Mutex::new(None),
            closed: AtomicBool::new(false),
            noted: Mutex::default(),
        })
    }

    /// The start begins now.
    pub fn arm(&self) {
        *crate::sync::lock(&self.armed) = Some(Instant::now());
    }

    /// When the window ends (None: not armed).
    pub fn ends(&self) -> Option<Instant> {
        crate::sync::lock(&self.armed).map(|t| t + self.window)
    }

    fn note(&self, s: u64, e: u64) {
        if s >= e || self.closed.load(Ordering::Relaxed) {
            return;
        }
        let Some(armed) = *crate::sync::lock(&self.armed) else {
            return;
        };
        if armed.elapsed() >= self.window {
            self.closed.store(true, Ordering::Relaxed);
            return;
        }
        let mut n = crate::sync::lock(&self.noted);
        if n.covers(s, e) {
            return;
        }
        if n.order.len() >= MAX_RANGES || n.bytes + (e - s) > MAX_BYTES {
            self.closed.store(true, Ordering::Relaxed);
            return;
        }
        n.add(s, e);
    }

    /// The ranges read, in the order of first touch; nothing is noted after this.
    pub fn take(&self) -> Vec<(u64, u64)> {
        self.closed.store(true, Ordering::Relaxed);
        std::mem::take(&mut crate::sync::lock(&self.noted).order)
    }
}

/// `inner`, its reads noted by `recorder`.
pub fn recording(inner: Arc<dyn Blob>, recorder: Arc<Recorder>) -> Arc<dyn Blob> {
    Arc::new(Recording { inner, recorder })
}

/// A blob whose reads a [`Recorder`] notes; everything else is its inner blob's.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Blob>,
    recorder: Arc<Recorder>,
}

impl Blob for Recording {
    fn name(&self) -> &Path {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.recorder.note(offset, offset + buf.len() as u64);
        self.inner.read_exact_at(buf, offset)
    }
    fn round_trips(&self) -> bool {
        self.inner.round_trips()
    }
    fn first_tail(&self) -> u64 {
        self.inner.first_tail()
    }
    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<()> {
        for (buf, offset) in reads.iter() {
            self.recorder.note(*offset, *offset + buf.len() as u64);
        }
        self.inner.read_many(reads)
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.inner.will_need(ranges);
    }
    fn fetch_in_order(&self, ranges: &[(u64, u64)]) {
        self.inner.fetch_in_order(ranges);
    }
    fn fetch_in_background(&self) {
        self.inner.fetch_in_background();
    }
    fn version(&self) -> &str {
        self.inner.version()
    }
    fn mtime(&self) -> i64 {
        self.inner.mtime()
    }
    fn pin(&self) {
        self.inner.pin();
    }
    fn duplicate_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.inner.duplicate_fd()
    }
    fn object(&self) -> Option<super::remote::ObjectVersion> {
        self.inner.object()
    }
    fn fetch_sparingly(&self, sequential: u64) {
        self.inner.fetch_sparingly(sequential);
    }
    fn forget(&self) {
        self.inner.forget();
    }
    fn fetched(&self) -> Option<u64> {
        self.inner.fetched()
    }
    fn set_keep_gate(&self, gate: super::blob::KeepGate) {
        self.inner.set_keep_gate(gate);
    }
}

/// A record as kept: a line of magic, then `START END` per range, in order.
pub fn encode(ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut out = format!("{MAGIC}\n");
    for (s, e) in ranges {
        out.push_str(&format!("{s} {e}\n"));
    }
    out.into_bytes()
}

/// A kept record of a blob of `size` bytes: its ranges, each inside the blob, at most
/// [`MAX_RANGES`] of them covering at most [`MAX_BYTES`].
pub fn decode(bytes: &[u8], size: u64) -> Result<Vec<(u64, u64)>> {
    let bad = |why: &str| Error::Corrupt(format!("a start's record: {why}"));
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?;
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(bad("not a record"));
    }
    let mut out = Vec::new();
    let mut total = 0u64;
    for line in lines {
        let (s, e) = line
            .split_once(' ')
            .and_then(|(s, e)| Some((s.parse::<u64>().ok()?, e.parse::<u64>().ok()?)))
            .ok_or_else(|| bad(&format!("line {line:?}")))?;
        if s >= e || e > size {
            return Err(bad(&format!("{s}-{e} is not inside {size} bytes")));
        }
        total += e - s;
        out.push((s, e));
        if out.len() > MAX_RANGES || total > MAX_BYTES {
            return Err(bad("larger than a start"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::blob::Bytes;

    #[test]
    fn reads_after_arming_are_recorded_once_in_order_and_joined_when_close() {
        let r = Recorder::new(Duration::from_secs(60));
        let blob = recording(Arc::new(Bytes::new("b", vec![0u8; 1 << 20])), r.clone());
        let mut buf = vec![0u8; 100];
        blob.read_exact_at(&mut buf, 900_000).unwrap(); // the open's: not armed yet
        r.arm();
        blob.read_exact_at(&mut buf, 500_000).unwrap();
        blob.read_exact_at(&mut buf, 500_100).unwrap(); // right after: joins it
        blob.read_exact_at(&mut buf, 1_000).unwrap();
        blob.read_exact_at(&mut buf, 500_020).unwrap(); // read before: not again
        let mut a = [0u8; 10];
        let mut b = [0u8; 10];
        blob.read_many(&mut [(&mut a[..], 700_000), (&mut b[..], 1_000)])
            .unwrap();
        assert_eq!(
            r.take(),
            [(500_000, 500_200), (1_000, 1_100), (700_000, 700_010)]
        );
        // Taken: nothing more is noted.
        blob.read_exact_at(&mut buf, 20_000).unwrap();
        assert!(r.take().is_empty());
    }

    #[test]
    fn nothing_is_recorded_after_the_window() {
        let r = Recorder::new(Duration::ZERO);
        let blob = recording(Arc::new(Bytes::new("b", vec![0u8; 4096])), r.clone());
        r.arm();
        blob.read_exact_at(&mut [0u8; 10], 0).unwrap();
        assert!(r.take().is_empty());
        assert!(r.ends().is_some());
    }

    #[test]
    fn a_record_reads_back_and_a_bad_one_is_refused() {
        let ranges = vec![(10, 20), (0, 5), (4096, 8192)];
        assert_eq!(decode(&encode(&ranges), 8192).unwrap(), ranges);
        assert!(decode(&encode(&ranges), 8000).is_err(), "past the blob");
        assert!(decode(b"pkgfs-start 1\n5 5\n", 10).is_err(), "empty range");
        assert!(decode(b"pkgfs-start 1\n1 x\n", 10).is_err());
        assert!(decode(b"something else\n", 10).is_err());
        assert!(decode(b"\xff", 10).is_err());
        let huge = encode(&[(0, MAX_BYTES), (0, 1)]);
        assert!(decode(&huge, MAX_BYTES).is_err(), "more than a start");
    }
}
