//! Plain directory entries: which READDIRPLUS entries are handed out without attributes.
//!
//! A READDIRPLUS entry with attributes makes the kernel create an inode and a dentry for
//! it (`fuse_direntplus_link`). A walk that stats what it lists (`ls -l`, `find -size`,
//! a build system checking times) saves a LOOKUP a name that way; a walk that needs only
//! names and types (`find`, `find -name`, `du --inodes`, a glob) pays for 83,000 inodes
//! of the Linux tree it never uses: profiled, that was a third of a cold `find`'s time
//! (docs/BENCHMARKS.md, "Cold walks"). An entry with node ID 0 is listed (name, type and
//! inode number reach `readdir`) and nothing is created for it.
//!
//! So a mount starts *plain*: READDIRPLUS hands out directories with their attributes
//! (a walk enters them: a LOOKUP saved each) and everything else plain. A LOOKUP of a
//! name in a directory whose last listing was plain means someone wants attributes after
//! all: for [`FULL_HOLD`] after it, every listing is full, so a walk that stats pays the
//! LOOKUPs of one directory only, and a stat walk that goes on keeps it full. The choice
//! never changes what anyone sees: a plain entry costs one LOOKUP when it is used, and
//! the kernel holds no reference to it (nothing to count, nothing to invalidate).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How long listings stay full after a LOOKUP of a name listed plain.
pub const FULL_HOLD: Duration = Duration::from_secs(5);
/// Directories remembered as listed plain; past this the set starts over (a LOOKUP in a
/// forgotten one only costs the full listings it would have switched on).
const REMEMBERED: usize = 1 << 16;

/// The mount's choice between plain and full entries.
#[derive(Debug)]
pub struct EntryPolicy {
    /// Plain entries at all (off: every entry full, as before plain entries existed).
    enabled: AtomicBool,
    /// Listings are full until this many nanoseconds after `epoch`.
    full_until: AtomicU64,
    epoch: Instant,
    /// Directories whose last listing handed out plain entries.
    listed_plain: Mutex<HashSet<u64>>,
    /// Entries handed out plain.
    pub plain: AtomicU64,
    /// LOOKUPs of names listed plain that switched listings to full.
    pub switched: AtomicU64,
}

impl EntryPolicy {
    /// A policy that hands out plain entries when `enabled`.
    pub fn new(enabled: bool) -> Self {
        EntryPolicy {
            enabled: AtomicBool::new(enabled),
            full_until: AtomicU64::new(0),
            epoch: Instant::now(),
            listed_plain: Mutex::new(HashSet::new()),
            plain: AtomicU64::new(0),
            switched: AtomicU64::new(0),
        }
    }

    /// Hand out plain entries, or not (`--full-entries`).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether a listing starting now may hand out plain entries.
    pub fn plain_now(&self) -> bool {
        self.enabled.load(Relaxed) && self.now() >= self.full_until.load(Relaxed)
    }

    /// Directory `dir` was just listed with `n` plain entries.
    pub fn listed(&self, dir: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.plain.fetch_add(n, Relaxed);
        let mut set = lock(&self.listed_plain);
        if set.len() >= REMEMBERED {
            set.clear();
        }
        set.insert(dir);
    }

    /// Whether directory `dir`'s last listing handed out plain entries (and no LOOKUP in
    /// it has come since).
    pub fn listed_plain(&self, dir: u64) -> bool {
        self.plain.load(Relaxed) > 0 && lock(&self.listed_plain).contains(&dir)
    }

    /// A LOOKUP of a name in directory `parent` succeeded: if `parent` was listed plain,
    /// listings are full for a while.
    pub fn looked_up(&self, parent: u64) {
        if !self.enabled.load(Relaxed) {
            return;
        }
        let was_plain = lock(&self.listed_plain).remove(&parent);
        if was_plain {
            self.switched.fetch_add(1, Relaxed);
            let until = self.now() + FULL_HOLD.as_nanos() as u64;
            self.full_until.fetch_max(until, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_in_a_directory_listed_plain_makes_listings_full_for_a_while() {
        let p = EntryPolicy::new(true);
        assert!(p.plain_now());
        // A lookup in a directory never listed plain changes nothing.
        p.looked_up(7);
        assert!(p.plain_now());
        p.listed(7, 3);
        p.listed(8, 0);
        assert!(p.plain_now());
        p.looked_up(8);
        assert!(p.plain_now(), "8 was listed without plain entries");
        p.looked_up(7);
        assert!(!p.plain_now());
        assert_eq!((p.plain.load(Relaxed), p.switched.load(Relaxed)), (3, 1));
        // Once: the next lookup in 7 is an ordinary one.
        p.looked_up(7);
        assert_eq!(p.switched.load(Relaxed), 1);
        // The hold ends.
        p.full_until.store(p.now(), Relaxed);
        assert!(p.plain_now());
    }

    #[test]
    fn disabled_it_is_always_full() {
        let p = EntryPolicy::new(false);
        assert!(!p.plain_now());
    }
}
