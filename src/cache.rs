//! A byte-budgeted LRU cache of immutable blocks.
//!
//! Values are `Arc<[u8]>` so a hit hands out a reference without copying and an evicted
//! block stays alive for the readers still using it. The budget counts bytes of block
//! data, not entries; a block larger than the whole budget is returned to its caller but
//! never cached, so a small `--cache-size` can never be exceeded.
//!
//! This cache only stores and evicts. Sharing one decompression between concurrent misses
//! is the job of the caller ([`crate::read`]), which serialises fills per member.

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
}

struct Inner<K: Hash + Eq> {
    lru: LruCache<K, Arc<[u8]>>,
    bytes: u64,
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
            }),
            budget,
            stats: CacheStats::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        // A panic while holding the lock cannot leave the LRU half-updated in a way that
        // matters (every operation is a single call), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block for `key`, marking it most recently used.
    pub fn get(&self, key: &K) -> Option<Arc<[u8]>> {
        let hit = self.lock().lru.get(key).cloned();
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
    pub fn insert(&self, key: K, block: Arc<[u8]>) {
        let len = block.len() as u64;
        if len > self.budget {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.lru.put(key, block) {
            inner.bytes -= old.len() as u64;
        }
        inner.bytes += len;
        while inner.bytes > self.budget {
            match inner.lru.pop_lru() {
                Some((_, old)) => {
                    inner.bytes -= old.len() as u64;
                    self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
            }
        }
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

    fn block(n: usize) -> Arc<[u8]> {
        vec![0u8; n].into()
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
}
