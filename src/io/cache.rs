//! A byte-budgeted LRU cache of immutable blocks.
//!
//! Values are `Arc<Block>` so a hit hands out a reference without copying and an evicted
//! block stays alive for the readers still using it. The budget counts bytes of block
//! data, not entries; a block larger than the whole budget is returned to its caller but
//! never cached, so a small `--cache-size` can never be exceeded.
//!
//! A [`Block`]'s buffer goes back to a small pool when its last reference is dropped and
//! is decoded into again: blocks are large (256 KiB), a read-all replaces them at hundreds
//! of MB/s, and a fresh buffer of that size comes from `mmap` (see `daemon`'s allocator
//! settings), costing 64 page faults, the zeroing of its pages and an `munmap` — about a
//! tenth of the decoding thread's time in a profile of a read-all. Buffers come in
//! power-of-two size classes, so blocks of slightly different sizes (frames end at file
//! boundaries) share them, and reads that gather several blocks (large files) take their
//! buffers from the pool too ([`crate::io::ReadData::Owned`]). Each class has its own
//! free list and limit: with one shared limit, evicted 256 KiB blocks filled the pool and
//! every gathering read of another class mapped, faulted in and unmapped a fresh buffer
//! (a quarter of the daemon's page faults in a read-all of ZIP packages). Buffers under
//! 64 KiB come from the heap, unpooled: pooling them too rounded small files up to a
//! power of two and cost more memory than it saved faults.
//!
//! A block leaves the cache early once the kernel has been given all of its bytes
//! ([`BlockCache::delivered`], [`BlockCache::delivered_bytes`]; after a short grace): a
//! mount keeps the kernel's page cache, which then holds those bytes, so keeping them
//! here too would only double their memory. The budget is left to blocks still on their
//! way (decoded ahead, or partly read), and the dropped blocks' buffers are decoded into
//! again while still in the CPU's caches instead of fresh pages being faulted in
//! (docs/BENCHMARKS.md, "Blocks the kernel holds").
//!
//! This cache only stores and evicts. Sharing one decompression between concurrent misses
//! is the job of the caller, [`crate::io::Io::block`], which serialises fills per unit (a
//! member or a frame) under that unit's fill slot.

use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;

/// Counters of cache activity, readable while the cache is in use.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Lookups that found their block.
    pub hits: AtomicU64,
    /// Lookups that did not.
    pub misses: AtomicU64,
    /// Blocks evicted to stay within the budget.
    pub evictions: AtomicU64,
    /// Blocks dropped because the kernel had been given all of their bytes.
    pub released: AtomicU64,
}

/// The smallest pooled class (smaller buffers come from the heap, unpooled).
const POOL_MIN: usize = 64 * 1024;
/// The largest pooled class (larger buffers are rare: frames of unusual size).
const POOL_MAX_CAPACITY: usize = 4 * 1024 * 1024;
/// Bytes of buffers (capacity) each class keeps at most, and buffers it may always keep:
/// enough for the threads that decode and gather at once, little next to the cache
/// budget. Classes are kept apart so that buffers of one kind (blocks evicted from the
/// cache) never crowd out another (the short-lived buffers of reads that gather several
/// blocks).
const CLASS_BYTES: usize = 4 * 1024 * 1024;
const CLASS_MIN_BUFFERS: usize = 2;
const CLASSES: usize =
    (POOL_MAX_CAPACITY.trailing_zeros() - POOL_MIN.trailing_zeros()) as usize + 1;

/// The capacity pooled buffers for `len` bytes have: the next power of two, so that
/// blocks of slightly different sizes (frames end at file boundaries) share buffers.
/// Pages of a buffer that are never written are never faulted in, so the rounding costs
/// address space, not memory. `None`: not pooled.
fn size_class(len: usize) -> Option<usize> {
    (POOL_MIN..=POOL_MAX_CAPACITY)
        .contains(&len)
        .then(|| len.next_power_of_two())
}

/// The pool's slot for buffers of capacity `class` (a power of two in the pooled range).
fn slot(class: usize) -> usize {
    (class.trailing_zeros() - POOL_MIN.trailing_zeros()) as usize
}

static POOL: Mutex<[Vec<Vec<u8>>; CLASSES]> = Mutex::new([const { Vec::new() }; CLASSES]);

fn pool() -> MutexGuard<'static, [Vec<Vec<u8>>; CLASSES]> {
    crate::sync::lock(&POOL)
}

/// A buffer with room for `len` bytes: a pooled one of its size class, or a new one of
/// that class.
fn take(len: usize) -> Vec<u8> {
    let Some(class) = size_class(len) else {
        return Vec::with_capacity(len);
    };
    let reused = pool()[slot(class)].pop();
    reused.unwrap_or_else(|| Vec::with_capacity(class))
}

/// Give a buffer back to the pool if it is of a pooled class with room left.
fn give(v: Vec<u8>) {
    let cap = v.capacity();
    if size_class(cap) == Some(cap) {
        let mut p = pool();
        let stack = &mut p[slot(cap)];
        if stack.len() < CLASS_MIN_BUFFERS.max(CLASS_BYTES / cap) {
            stack.push(v);
        }
    }
}

/// A decoded block of bytes; immutable once made.
#[derive(Debug, Clone)]
pub struct Block(Vec<u8>);

impl Block {
    /// A buffer of `len` bytes (contents unspecified) to decode into, reused from the pool
    /// when one of its size class is free.
    pub fn buffer(len: usize) -> Vec<u8> {
        let mut v = take(len);
        if v.len() >= len {
            v.truncate(len);
        } else {
            v.resize(len, 0);
        }
        v
    }

    /// An empty buffer with room for `capacity` bytes to decode into (nothing is
    /// zeroed), reused from the pool when one of its size class is free.
    pub fn empty(capacity: usize) -> Vec<u8> {
        let mut v = take(capacity);
        v.clear();
        v
    }

    /// A block holding `data`.
    pub fn new(data: Vec<u8>) -> Self {
        Block(data)
    }

    /// The bytes as a vector of their own (the buffer leaves the pool's care).
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

struct Inner<K: Hash + Eq> {
    lru: LruCache<K, Entry>,
    bytes: u64,
    /// Blocks the kernel has had in full, oldest first, with their sizes: dropped once
    /// more than [`RELEASE_GRACE`] bytes of them are waiting.
    done: VecDeque<(K, u64)>,
    /// Sum of the sizes in `done`.
    done_bytes: u64,
}

/// How many bytes of blocks the kernel has had in full stay cached before the oldest is
/// dropped. A read the kernel sent before a push of the same file completed may still be
/// on its way to a worker when the push ends; the grace keeps its block there for it
/// instead of decoding it again (a block of a large member may need its stream
/// restarted). A few milliseconds of a reader's progress.
pub const RELEASE_GRACE: u64 = 8 * 1024 * 1024;

/// The smallest unit of delivery: a page (the kernel gives and takes whole pages, except
/// at the end of a file).
const UNIT_MIN: usize = 4096;

/// A cached block and what of it the kernel has been given.
struct Entry {
    block: Arc<Block>,
    given: Given,
}

/// What of a block the kernel has been given.
#[derive(Clone, Copy)]
enum Given {
    /// Bit `i`: the kernel has had unit `i` of the block (see [`units`]).
    Pages(u64),
    /// Bytes given, counted rather than placed, out of `of`, the block's bytes that can be
    /// given at all (a frame of a package also holds tar headers, which never are).
    Bytes { given: u64, of: u64 },
}

impl Entry {
    /// Whether the kernel has had every byte of the block it can have.
    fn whole(&self) -> bool {
        match self.given {
            Given::Pages(mask) => {
                let len = self.block.len();
                mask == units(len, 0, len)
            }
            Given::Bytes { given, of } => given >= of,
        }
    }
}

/// The units of a block of `len` bytes that lie wholly inside `[start, end)`, as a bit
/// mask: a block is cut into at most 64 units of equal size, a multiple of a page (a page
/// for blocks of up to 256 KiB), the last one possibly shorter.
fn units(len: usize, start: usize, end: usize) -> u64 {
    let unit = len.div_ceil(64).max(1).next_multiple_of(UNIT_MIN);
    let count = len.div_ceil(unit);
    let first = start.div_ceil(unit);
    let last = if end >= len { count } else { end / unit };
    if first >= last {
        return 0;
    }
    let upto = |n: usize| if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    upto(last) & !upto(first)
}

/// The cache. `K` identifies a block (pkgfs uses `(member, block index)`).
pub struct BlockCache<K: Hash + Eq> {
    inner: Mutex<Inner<K>>,
    budget: u64,
    /// Activity counters.
    pub stats: CacheStats,
}

impl<K: Hash + Eq> BlockCache<K> {
    /// A cache that holds at most `budget` bytes of blocks.
    pub fn new(budget: u64) -> Self {
        BlockCache {
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                done: VecDeque::new(),
                done_bytes: 0,
            }),
            budget,
            stats: CacheStats::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        // A panic while holding the lock cannot leave the LRU half-updated in a way that
        // matters (every operation is a single call), so a poisoned lock is still usable.
        crate::sync::lock(&self.inner)
    }

    /// The block for `key`, marking it most recently used.
    pub fn get(&self, key: &K) -> Option<Arc<Block>> {
        let hit = self.lock().lru.get(key).map(|e| e.block.clone());
        let counter = if hit.is_some() {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Whether `key` is cached, without touching its recency or the counters.
    pub fn contains(&self, key: &K) -> bool {
        self.lock().lru.contains(key)
    }

    /// Store a block, evicting least recently used blocks to stay within the budget.
    pub fn insert(&self, key: K, block: Arc<Block>) {
        let len = block.len() as u64;
        if len > self.budget {
            return;
        }
        // Evicted blocks are dropped after the lock is released.
        let mut evicted = Vec::new();
        let mut inner = self.lock();
        if let Some(old) = inner.lru.put(
            key,
            Entry {
                block,
                given: Given::Pages(0),
            },
        ) {
            inner.bytes -= old.block.len() as u64;
            evicted.push(old);
        }
        inner.bytes += len;
        while inner.bytes > self.budget {
            match inner.lru.pop_lru() {
                Some((_, old)) => {
                    inner.bytes -= old.block.len() as u64;
                    self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                    evicted.push(old);
                }
                None => break,
            }
        }
        drop(inner);
        drop(evicted);
    }

    /// The kernel has been given bytes `[start, end)` of the block for `key` and keeps
    /// them in its page cache: once it has had every byte of the block, the block is
    /// dropped, after [`RELEASE_GRACE`] bytes of other blocks have been. Bytes given twice
    /// (a push and a read of the same file) count once.
    pub fn delivered(&self, key: &K, start: usize, end: usize)
    where
        K: Clone,
    {
        self.give(key, |given, len| {
            if let Given::Pages(mask) = given {
                *mask |= units(len, start, end);
            }
        });
    }

    /// [`BlockCache::delivered`] for a block of which only `of` bytes can ever be given
    /// (a frame of a package: its files' bytes, not their tar headers), counting `bytes`
    /// more given without placing them. Bytes given twice count twice, which can drop the
    /// block early: a decoding more if it is asked for again, never a wrong byte.
    pub fn delivered_bytes(&self, key: &K, bytes: u64, of: u64)
    where
        K: Clone,
    {
        self.give(key, |given, _| match given {
            Given::Pages(0) => *given = Given::Bytes { given: bytes, of },
            Given::Bytes { given, .. } => *given += bytes,
            Given::Pages(_) => {}
        });
    }

    /// Record a delivery with `mark` (given the block's length) and drop blocks the
    /// kernel has had whole beyond the grace.
    fn give(&self, key: &K, mark: impl FnOnce(&mut Given, usize))
    where
        K: Clone,
    {
        let mut inner = self.lock();
        let Some(e) = inner.lru.peek_mut(key) else {
            return;
        };
        if e.whole() {
            return;
        }
        let len = e.block.len();
        mark(&mut e.given, len);
        if !e.whole() {
            return;
        }
        inner.done.push_back((key.clone(), len as u64));
        inner.done_bytes += len as u64;
        let mut gone = Vec::new();
        while inner.done_bytes > RELEASE_GRACE {
            let Some((k, n)) = inner.done.pop_front() else {
                break;
            };
            inner.done_bytes -= n;
            // The block may have been evicted, or replaced by one not yet delivered.
            if inner.lru.peek(&k).is_some_and(Entry::whole)
                && let Some(e) = inner.lru.pop(&k)
            {
                inner.bytes -= e.block.len() as u64;
                self.stats.released.fetch_add(1, Ordering::Relaxed);
                gone.push(e);
            }
        }
        drop(inner);
        drop(gone);
    }

    /// Bytes of block data currently held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Arc<Block> {
        Arc::new(Block::new(vec![0u8; n]))
    }

    #[test]
    fn evicts_least_recently_used_to_stay_in_budget() {
        let c = BlockCache::new(100);
        c.insert(1, block(40));
        c.insert(2, block(40));
        assert!(c.get(&1).is_some()); // 1 is now the most recent
        c.insert(3, block(40));
        assert!(c.contains(&1) && c.contains(&3));
        assert!(!c.contains(&2), "the least recently used block goes first");
        assert_eq!(c.bytes(), 80);
        assert_eq!(c.stats.evictions.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn buffers_of_dropped_blocks_are_reused() {
        let mut b = Block::buffer(256 * 1024);
        assert_eq!(b.len(), 256 * 1024);
        b[0] = 7;
        let ptr = b.as_ptr();
        drop(Block::new(b));
        // Other tests share the pool: look for the buffer among a few takes.
        let again: Vec<Vec<u8>> = (0..CLASS_BYTES / (256 * 1024))
            .map(|_| Block::buffer(200 * 1024))
            .collect();
        assert!(again.iter().all(|b| b.len() == 200 * 1024));
        assert!(
            again.iter().any(|b| b.as_ptr() == ptr),
            "the buffer came back"
        );
        // Small buffers are not pooled.
        assert_eq!(Block::buffer(100).len(), 100);
    }

    #[test]
    fn blocks_of_other_sizes_in_the_same_class_share_buffers() {
        // Frames end at file boundaries, so consecutive blocks differ in size; a buffer
        // returned after one of another class must still be found.
        let a = Block::empty(150 * 1024);
        let ptr = a.as_ptr();
        drop(Block::new(a));
        drop(Block::new(Block::empty(100 * 1024)));
        let again: Vec<Vec<u8>> = (0..CLASS_BYTES / (256 * 1024))
            .map(|_| Block::empty(240 * 1024))
            .collect();
        assert!(again.iter().all(|b| b.capacity() >= 240 * 1024));
        assert!(
            again.iter().any(|b| b.as_ptr() == ptr),
            "the 256 KiB-class buffer came back for a block of another size"
        );
    }

    #[test]
    fn oversized_blocks_are_not_cached() {
        let c = BlockCache::new(10);
        c.insert(1, block(11));
        assert!(!c.contains(&1));
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn replacing_a_key_keeps_the_byte_count_right() {
        let c = BlockCache::new(100);
        c.insert(1, block(30));
        c.insert(1, block(50));
        assert_eq!(c.bytes(), 50);
        assert!(c.get(&9).is_none());
        assert_eq!(c.stats.misses.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn units_are_whole_pages_inside_the_range() {
        let k = 256 * 1024;
        assert_eq!(units(k, 0, k), u64::MAX, "64 pages");
        assert_eq!(units(k, 0, 4096), 1);
        assert_eq!(
            units(k, 1, 8192),
            0b10,
            "a page partly given is not counted"
        );
        assert_eq!(units(k, 4096, 4095 + 8192), 0b10);
        // A short block: its last unit ends with it, whatever its length.
        assert_eq!(units(10_000, 0, 10_000), 0b111);
        assert_eq!(units(10_000, 8192, 10_000), 0b100);
        assert_eq!(units(10_000, 8192, 9_999), 0, "one byte short of the end");
        // A large block: units of several pages, still page-aligned.
        assert_eq!(units(4 << 20, 0, 64 * 1024), 1);
        assert_eq!(units(4 << 20, 0, 64 * 1024 - 4096), 0);
        assert_eq!(units(0, 0, 0), 0);
    }

    #[test]
    fn blocks_the_kernel_has_whole_leave_after_the_grace() {
        let n = 256 * 1024;
        let count = RELEASE_GRACE as usize / n + 1;
        let c = BlockCache::new(1 << 30);
        for k in 0..count {
            c.insert(k, block(n));
        }
        // Block 0 is given in two halves, twice over for the first: nothing is released
        // until every byte has been given, and repeats count once.
        c.delivered(&0, 0, n / 2);
        c.delivered(&0, 0, n / 2);
        assert_eq!(c.stats.released.load(Ordering::Relaxed), 0);
        c.delivered(&0, n / 2, n);
        c.delivered(&0, 0, n);
        // Blocks done within the grace stay.
        for k in 1..count - 1 {
            c.delivered(&k, 0, n);
        }
        assert!(c.contains(&0));
        assert_eq!(c.stats.released.load(Ordering::Relaxed), 0);
        // One more block done: the oldest goes, its bytes with it.
        c.delivered(&(count - 1), 0, n);
        assert!(!c.contains(&0), "the first block done is dropped");
        assert!(c.contains(&1) && c.contains(&(count - 1)));
        assert_eq!(c.stats.released.load(Ordering::Relaxed), 1);
        assert_eq!(c.bytes(), ((count - 1) * n) as u64);
        // A block replaced after it was done is not dropped for the old one's delivery.
        c.insert(1, block(n));
        c.insert(count, block(n));
        c.delivered(&count, 0, n);
        assert!(
            c.contains(&1),
            "the new block 1 has not been given to the kernel"
        );
        assert_eq!(c.stats.released.load(Ordering::Relaxed), 1);
        c.insert(count + 1, block(n));
        c.delivered(&(count + 1), 0, n);
        assert!(!c.contains(&2), "the next block done goes");
        assert_eq!(c.stats.released.load(Ordering::Relaxed), 2);
        // Unknown keys are ignored.
        c.delivered(&(count + 5), 0, n);
    }
}
