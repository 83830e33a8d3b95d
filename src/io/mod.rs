//! Bytes in and out of archives: the services every format's read path is built on.
//!
//! - [`blob`]: byte sources (local files, slices of other blobs, objects of a source);
//! - [`cache`]: the byte-budgeted cache of decoded blocks, shared by every archive of a
//!   mount and every generation of it;
//! - [`digest`]: content digests (`sha256:…`) and the hashing that checks them;
//! - [`remote`] and [`registry`]: objects on S3 and HTTP servers, and blobs of container
//!   registries, as blobs (ranges fetched, kept in memory, cached on disk);
//! - [`diskcache`]: the disk cache of remote sources, fetched ranges kept as files and
//!   shared by mounts and across them;
//! - [`verified`]: `--verify`'s blobs, whose reads are widened to whole blocks and checked
//!   against a seal's hashes before anything is returned;
//! - [`inflate`]: deflate decoders that can be copied mid-stream, and the one-call one;
//! - [`Io`] (here): the cache with its fill slots (concurrent misses on one block share
//!   one decompression, and a decoder parks in its slot between reads), the store of
//!   deflate checkpoints, the counters, and [`gather`], which cuts a read out of
//!   cached blocks without copying when it lies in one.
//!
//! Nothing here knows a format: a format's read path (in `crate::format`) names its
//! blocks with a [`BlockKey`] and decides what a block is.

pub mod blob;
pub mod cache;
pub mod digest;
pub mod diskcache;
pub mod inflate;
pub mod memory;
pub mod registry;
pub mod remote;
pub mod starts;
pub mod verified;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use self::cache::{Block, BlockCache};
use self::inflate::Checkpoint;
use crate::error::{Error, Result};
use crate::sync::lock;

/// Decompressed bytes per cache block of a stream (formats whose unit is a frame cache
/// whole frames instead).
pub const BLOCK_SIZE: u64 = 256 * 1024;
/// Most checkpoints kept in all (each holds a decoder: its 32 KiB window and state,
/// about 45 KiB); the least recently used member's are dropped first.
const MAX_CHECKPOINTS: usize = 512;
/// How many members or frames may have a fill slot (a slot can hold a parked decoder:
/// a window and an input buffer).
const PARKED_STREAMS: usize = 64;
/// Extents of an archive this close together are read ahead as one (reading through the
/// gap costs less than another request).
pub const ADVISE_GAP: u64 = 64 * 1024;

/// Counters of the read path.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Bytes read from archive files (compressed or stored data and headers).
    pub archive_bytes: AtomicU64,
    /// Bytes produced by decompression.
    pub decompressed_bytes: AtomicU64,
    /// Decoders started from a member's beginning.
    pub streams_started: AtomicU64,
    /// Blocks produced by decompression.
    pub blocks_decoded: AtomicU64,
    /// Decoders resumed from a checkpoint instead of the start.
    pub checkpoint_resumes: AtomicU64,
}

/// Names a cached block: archive (by `format::Archive::key`, unique in the process, so
/// generations share the cache without ever confusing a removed package's blocks with
/// another's), a unit of that archive chosen by its format (a ZIP member's record, a
/// frame, a stream) and a block number in the unit.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct BlockKey {
    /// The archive.
    pub archive: u32,
    /// The unit (member, frame, stream) in the archive.
    pub unit: u64,
    /// The block in the unit.
    pub block: u64,
}

/// A fill slot: whoever holds its lock is filling the blocks of one unit; between reads
/// it may hold that unit's parked decoder (of the format's own type).
pub type Slot = Arc<Mutex<Option<Box<dyn Any + Send>>>>;

/// Deflate checkpoints by unit (archive key, unit), each unit's in output order.
type Checkpoints = LruCache<(u32, u64), Vec<Checkpoint>>;

/// The shared read services of a mount.
pub struct Io {
    cache: BlockCache<BlockKey>,
    slots: Mutex<LruCache<BlockKey, Slot>>,
    /// Deflate checkpoints by unit (archive key, unit), in output order, with their
    /// total count.
    checkpoints: Mutex<(Checkpoints, usize)>,
    /// Activity counters.
    pub stats: ReadStats,
}

impl Io {
    /// Read services with a block cache of `cache_bytes`.
    pub fn new(cache_bytes: u64) -> Self {
        let cap =
            std::num::NonZeroUsize::new(PARKED_STREAMS).unwrap_or(std::num::NonZeroUsize::MIN);
        Io {
            cache: BlockCache::new(cache_bytes),
            slots: Mutex::new(LruCache::new(cap)),
            checkpoints: Mutex::new((LruCache::unbounded(), 0)),
            stats: ReadStats::default(),
        }
    }

    /// The block cache.
    pub fn cache(&self) -> &BlockCache<BlockKey> {
        &self.cache
    }

    /// The fill slot of the unit `key` names (its block number is ignored).
    pub fn slot(&self, key: BlockKey) -> Slot {
        let unit = BlockKey { block: 0, ..key };
        lock(&self.slots).get_or_insert(unit, Slot::default).clone()
    }

    /// Block `key` from the cache, or made by `fill` under the unit's fill slot: a miss
    /// waits for a concurrent fill of the same unit and then finds its block. `fill` gets
    /// the slot's parked state and inserts into the cache what it decodes (it may decode
    /// more blocks than asked, in order); it returns the block asked for.
    pub fn block(
        &self,
        key: BlockKey,
        fill: impl FnOnce(&mut Option<Box<dyn Any + Send>>) -> Result<Arc<Block>>,
    ) -> Result<Arc<Block>> {
        if let Some(b) = self.cache.get(&key) {
            return Ok(b);
        }
        let slot = self.slot(key);
        let mut parked = lock(&slot);
        // Another thread may have produced the block while this one waited.
        if self.cache.contains(&key)
            && let Some(b) = self.cache.get(&key)
        {
            return Ok(b);
        }
        fill(&mut parked)
    }

    /// Count bytes read from an archive.
    pub fn count_read(&self, n: usize) {
        self.stats
            .archive_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Count a decoded block of `n` bytes.
    pub fn count_decoded(&self, n: usize) {
        self.stats.blocks_decoded.fetch_add(1, Ordering::Relaxed);
        self.stats
            .decompressed_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The checkpoint of unit (archive, unit) at the largest output position at most
    /// `target`, copied, if there is one past `better_than`.
    pub fn resume_checkpoint(
        &self,
        unit: (u32, u64),
        target: u64,
        better_than: Option<u64>,
    ) -> Result<Option<Checkpoint>> {
        let mut guard = lock(&self.checkpoints);
        let Some(list) = guard.0.get_mut(&unit) else {
            return Ok(None);
        };
        let i = list.partition_point(|c| c.out_pos <= target);
        let Some(cp) = i.checked_sub(1).and_then(|i| list.get_mut(i)) else {
            return Ok(None);
        };
        if better_than.is_some_and(|p| p >= cp.out_pos) {
            return Ok(None);
        }
        self.stats
            .checkpoint_resumes
            .fetch_add(1, Ordering::Relaxed);
        cp.try_clone().map(Some)
    }

    /// Keep a checkpoint of unit (archive, unit) at output position `out_pos` (once per
    /// position; `make` is called only if there is none), within `MAX_CHECKPOINTS` (512).
    pub fn save_checkpoint(
        &self,
        unit: (u32, u64),
        out_pos: u64,
        make: impl FnOnce() -> Option<Checkpoint>,
    ) {
        let mut guard = lock(&self.checkpoints);
        let (lru, total) = &mut *guard;
        let list = lru.get_or_insert_mut(unit, Vec::new);
        let i = list.partition_point(|c| c.out_pos < out_pos);
        if list.get(i).is_some_and(|c| c.out_pos == out_pos) {
            return;
        }
        let Some(cp) = make() else {
            return;
        };
        list.insert(i, cp);
        *total += 1;
        while *total > MAX_CHECKPOINTS {
            match lru.pop_lru() {
                Some((k, v)) if k == unit => {
                    // Only this unit is left: thin it instead.
                    let dropped = v.len() / 2;
                    *total -= dropped;
                    lru.put(k, v.into_iter().step_by(2).collect());
                    if dropped == 0 {
                        break;
                    }
                }
                Some((_, v)) => *total -= v.len(),
                None => break,
            }
        }
    }
}

/// Bytes read: owned, or a range of a cached block shared without a copy (a read that
/// falls inside one block, the common case for small files and kernel-sized requests).
#[derive(Debug, Clone)]
pub enum ReadData {
    /// Bytes of their own (in a pooled buffer: a read across blocks of a large file
    /// allocates none once the pool has one of its size).
    Owned(Block),
    /// `block[start..end]`.
    Shared {
        /// The cached block.
        block: Arc<Block>,
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
}

impl std::ops::Deref for ReadData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadData::Owned(b) => b,
            ReadData::Shared { block, start, end } => &block[*start..*end],
        }
    }
}

impl ReadData {
    /// No bytes.
    pub fn empty() -> Self {
        ReadData::Owned(Block::new(Vec::new()))
    }

    /// The bytes as a vector of their own.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            ReadData::Owned(b) => b.into_vec(),
            shared => shared.to_vec(),
        }
    }
}

/// How much of a range a read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// All of it (up to the end of the member).
    Whole,
    /// As much as the block holding its start has.
    Piece,
}

/// Bytes `[start, end)` out of a sequence of cached blocks: `block_at(pos)` returns the
/// block holding `pos` and the offset where that block starts. Within one block, the
/// block itself is handed out; across blocks, the bytes are copied together, unless
/// `span` asks only for the first block's part.
pub fn gather(
    start: u64,
    end: u64,
    span: Span,
    mut block_at: impl FnMut(u64) -> Result<(u64, Arc<Block>)>,
) -> Result<ReadData> {
    if start >= end {
        return Ok(ReadData::empty());
    }
    let (first_start, first) = block_at(start)?;
    let within = (start - first_start) as usize;
    let end = match span {
        Span::Whole => end,
        Span::Piece => end.min(first_start + first.len() as u64),
    };
    if end <= start {
        return Err(Error::Corrupt(
            "decoded data is shorter than its index says".into(),
        ));
    }
    if (within as u64).saturating_add(end - start) <= first.len() as u64 {
        return Ok(ReadData::Shared {
            start: within,
            end: within + (end - start) as usize,
            block: first,
        });
    }
    let mut out = Block::empty((end - start) as usize);
    let mut pos = start;
    let mut next = Some((first_start, first));
    while pos < end {
        let (block_start, block) = match next.take() {
            Some(b) => b,
            None => block_at(pos)?,
        };
        let within = (pos - block_start) as usize;
        let take = (block.len().saturating_sub(within) as u64).min(end - pos) as usize;
        if take == 0 {
            return Err(Error::Corrupt(
                "decoded data is shorter than its index says".into(),
            ));
        }
        out.extend_from_slice(&block[within..within + take]);
        pos += take as u64;
    }
    Ok(ReadData::Owned(Block::new(out)))
}

/// What to ask the disk to read ahead of the extents (byte ranges) of one archive, given
/// in the order they will be read: nothing if that order is ascending (the kernel's own
/// read-ahead follows it), else the extents sorted, with those that overlap or lie at most
/// [`ADVISE_GAP`] apart merged.
pub fn advice(v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    if v.windows(2).all(|w| w[0].0 <= w[1].0) {
        return Vec::new();
    }
    merged(v)
}

/// The extents sorted, with those that overlap or lie at most [`ADVISE_GAP`] apart
/// merged: the advice for an object on a server, where reads in order cost a round trip
/// each too.
pub fn merged(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (start, end) in v {
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(ADVISE_GAP) => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_advice_is_nothing_in_order_and_merged_out_of_order() {
        assert_eq!(advice(vec![]), vec![]);
        assert_eq!(advice(vec![(0, 10), (10, 20), (500_000, 600_000)]), vec![]);
        let gap = ADVISE_GAP;
        assert_eq!(
            advice(vec![
                (1_000_000, 1_000_100),
                (0, 100),
                (100 + gap, 200 + gap),
                (50, 80),
                (100 + 3 * gap, 101 + 3 * gap),
            ]),
            vec![
                (0, 200 + gap),
                (100 + 3 * gap, 101 + 3 * gap),
                (1_000_000, 1_000_100)
            ]
        );
    }

    #[test]
    fn gather_shares_one_block_and_copies_across_blocks() {
        let blocks: Vec<Arc<Block>> = (0..3u8)
            .map(|i| Arc::new(Block::new(vec![i; 10])))
            .collect();
        let at = |pos: u64| Ok(((pos / 10) * 10, blocks[(pos / 10) as usize].clone()));
        let one = gather(12, 15, Span::Whole, at).unwrap();
        assert!(matches!(
            one,
            ReadData::Shared {
                start: 2,
                end: 5,
                ..
            }
        ));
        let across = gather(8, 23, Span::Whole, at).unwrap();
        assert_eq!(&*across, &[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]);
        let piece = gather(8, 23, Span::Piece, at).unwrap();
        assert_eq!(&*piece, &[0, 0]);
        // A block shorter than the range it should cover is corrupt data.
        let short = |_pos: u64| Ok((0, Arc::new(Block::new(vec![0; 4]))));
        assert!(gather(0, 10, Span::Whole, short).is_err());
        assert!(gather(5, 10, Span::Piece, short).is_err());
        assert!(gather(5, 5, Span::Whole, at).unwrap().is_empty());
    }
}
