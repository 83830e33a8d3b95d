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
//! So once a walk looks like one that needs names only, READDIRPLUS hands out
//! directories with their attributes (a walk enters them: a LOOKUP saved each) and
//! everything else plain. Looking like one: [`QUIET_LISTINGS`] listings in a row with no
//! LOOKUP of a file and no READ between them. (A walk that stats what full listings gave
//! it sends no request either, so it looks the same: it finds out at the first plain
//! directory.) A LOOKUP of a name in a directory whose last listing was plain means
//! someone wants attributes after all: for [`FULL_HOLD`] after it, every listing is
//! full, so a walk that stats pays the LOOKUPs of one directory at most every
//! [`FULL_HOLD`]. The kernel keeps a directory's listing (`FOPEN_CACHE_DIR`), plain
//! entries and all, so that switch also drops the listings it holds of every directory
//! listed plain ([`EntryPolicy::set_kernel`]): a `find` and then a walk that stats
//! (`find -size`, `du`, `tar`) got the first walk's plain listings back from the
//! kernel, and paid a LOOKUP a file (2.97 s for the Linux tree where a stat walk of a
//! fresh mount takes 1.2 s). A mount starts full, so a program that lists a directory and then reads
//! its files gets them pushed by the directory read-ahead (which needs the kernel to
//! hold them). The choice never changes what anyone sees: a plain entry costs one LOOKUP
//! when it is used, and the kernel holds no reference to it (nothing to count, nothing
//! to invalidate).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use log::debug;

use crate::fs::KernelCache;
use crate::sync::lock;
use crate::tree::view::Invalidation;

/// Listings in a row with no LOOKUP of a file and no READ between them before listings
/// go plain.
pub const QUIET_LISTINGS: u64 = 16;
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
    /// Listings since the last LOOKUP of a file or READ.
    quiet: AtomicU64,
    epoch: Instant,
    /// Directories whose last listing handed out plain entries.
    listed_plain: Mutex<HashSet<u64>>,
    /// Entries handed out plain.
    pub plain: AtomicU64,
    /// LOOKUPs of names listed plain that switched listings to full.
    pub switched: AtomicU64,
    /// Listings of directories listed plain handed to the thread that has the kernel
    /// drop them at a switch, and how many of those it has dropped.
    pub relist_queued: AtomicU64,
    /// See `relist_queued`.
    pub relisted: Arc<AtomicU64>,
    /// Where those listings are dropped (the mount's kernel; none in tests without one).
    kernel: Kernel,
}

/// [`EntryPolicy`]'s kernel, once the mount has one.
#[derive(Default)]
struct Kernel(OnceLock<Arc<dyn KernelCache>>);

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Kernel(set)"
        } else {
            "Kernel(none)"
        })
    }
}

impl EntryPolicy {
    /// A policy that hands out plain entries when `enabled`.
    pub fn new(enabled: bool) -> Self {
        EntryPolicy {
            enabled: AtomicBool::new(enabled),
            full_until: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
            epoch: Instant::now(),
            listed_plain: Mutex::new(HashSet::new()),
            plain: AtomicU64::new(0),
            switched: AtomicU64::new(0),
            relist_queued: AtomicU64::new(0),
            relisted: Arc::new(AtomicU64::new(0)),
            kernel: Kernel::default(),
        }
    }

    /// The kernel whose cached listings of directories listed plain a switch drops.
    pub fn set_kernel(&self, kernel: Arc<dyn KernelCache>) {
        let _ = self.kernel.0.set(kernel);
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
        self.enabled.load(Relaxed)
            && self.quiet.load(Relaxed) >= QUIET_LISTINGS
            && self.now() >= self.full_until.load(Relaxed)
    }

    /// Someone read a file, or looked one up: a walk that wants more than names.
    pub fn interest(&self) {
        if self.quiet.load(Relaxed) != 0 {
            self.quiet.store(0, Relaxed);
        }
    }

    /// Directory `dir` was just listed (READDIRPLUS) with `n` plain entries.
    pub fn listed(&self, dir: u64, n: u64) {
        self.quiet.fetch_add(1, Relaxed);
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

    /// A LOOKUP of a file in directory `parent` succeeded: if `parent` was listed plain,
    /// listings are full for a while.
    pub fn looked_up(&self, parent: u64) {
        if !self.enabled.load(Relaxed) {
            return;
        }
        self.interest();
        // Every directory listed plain, `parent` first: the kernel may hold their
        // listings, which a walk that stats would get back plain.
        let stale: Option<Vec<u64>> = {
            let mut set = lock(&self.listed_plain);
            set.remove(&parent)
                .then(|| std::iter::once(parent).chain(set.drain()).collect())
        };
        if let Some(dirs) = stale {
            self.switched.fetch_add(1, Relaxed);
            let until = self.now() + FULL_HOLD.as_nanos() as u64;
            self.full_until.fetch_max(until, Relaxed);
            self.relist(dirs);
        }
    }

    /// Have the kernel drop its listings of `dirs`, on a thread of its own (thousands
    /// of notifications; the LOOKUP that switched is not held up): their next listings
    /// come from READDIRPLUS, full while the switch holds.
    fn relist(&self, dirs: Vec<u64>) {
        let Some(kernel) = self.kernel.0.get().cloned() else {
            return;
        };
        self.relist_queued.fetch_add(dirs.len() as u64, Relaxed);
        let done = self.relisted.clone();
        let spawned = std::thread::Builder::new()
            .name("pkgfs-relist".into())
            .spawn(move || {
                for d in dirs {
                    // A directory the kernel no longer holds: nothing to drop.
                    let _ = kernel.invalidate(&Invalidation::Dir(d));
                    done.fetch_add(1, Relaxed);
                }
            });
        if let Err(e) = spawned {
            debug!("no thread to drop plain listings: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_in_a_directory_listed_plain_makes_listings_full_for_a_while() {
        let p = EntryPolicy::new(true);
        // Full until a run of quiet listings; a read starts the run over.
        for _ in 0..QUIET_LISTINGS - 1 {
            p.listed(1, 0);
        }
        assert!(!p.plain_now());
        p.interest();
        for _ in 0..QUIET_LISTINGS {
            assert!(!p.plain_now());
            p.listed(1, 0);
        }
        assert!(p.plain_now());
        // Plain listings of 7 (3 entries) and 8 (none: all directories).
        p.listed(7, 3);
        p.listed(8, 0);
        assert!(p.plain_now());
        // A lookup of a file in 8, not listed plain: interest (the quiet run starts
        // over), no switch.
        p.looked_up(8);
        assert!(!p.plain_now());
        assert_eq!(p.switched.load(Relaxed), 0);
        for _ in 0..QUIET_LISTINGS {
            p.listed(9, 0);
        }
        assert!(p.plain_now());
        // A lookup in 7, listed plain: full for FULL_HOLD, once.
        p.looked_up(7);
        assert_eq!((p.plain.load(Relaxed), p.switched.load(Relaxed)), (3, 1));
        for _ in 0..QUIET_LISTINGS {
            p.listed(9, 0);
        }
        assert!(!p.plain_now(), "held full");
        p.looked_up(7);
        assert_eq!(p.switched.load(Relaxed), 1);
        // The hold ends, and quiet listings follow.
        p.full_until.store(p.now(), Relaxed);
        for _ in 0..QUIET_LISTINGS {
            p.listed(2, 0);
        }
        assert!(p.plain_now());
    }

    /// The kernel as the policy sees it: the directories it was told to drop.
    #[derive(Default)]
    struct Dropped(Mutex<Vec<u64>>);

    impl KernelCache for Dropped {
        fn store(&self, _: u64, _: u64, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
        fn invalidate(&self, inv: &Invalidation) -> std::io::Result<()> {
            if let Invalidation::Dir(d) = inv {
                lock(&self.0).push(*d);
            }
            Ok(())
        }
    }

    #[test]
    fn a_switch_has_the_kernel_drop_every_listing_handed_out_plain() {
        let p = EntryPolicy::new(true);
        let kernel = Arc::new(Dropped::default());
        p.set_kernel(kernel.clone());
        for _ in 0..QUIET_LISTINGS {
            p.listed(1, 0);
        }
        // Plain listings of 7, 8 and 9; 10 listed with directories only.
        for (dir, plain) in [(7, 3), (8, 1), (9, 2), (10, 0)] {
            p.listed(dir, plain);
        }
        // A lookup in 8: listings go full, and the kernel is told to drop its listings
        // of 8 (first), 7 and 9, on a thread.
        p.looked_up(8);
        assert_eq!(p.relist_queued.load(Relaxed), 3);
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.relisted.load(Relaxed) < 3 {
            assert!(Instant::now() < deadline, "the listings were never dropped");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut dropped = lock(&kernel.0).clone();
        assert_eq!(dropped[0], 8);
        dropped.sort();
        assert_eq!(dropped, [7, 8, 9]);
        // None is listed plain any more: a lookup in 7 switches nothing, drops nothing.
        assert!(!p.listed_plain(7));
        p.looked_up(7);
        assert_eq!(
            (p.switched.load(Relaxed), p.relist_queued.load(Relaxed)),
            (1, 3)
        );
    }

    #[test]
    fn disabled_it_is_always_full() {
        let p = EntryPolicy::new(false);
        assert!(!p.plain_now());
    }
}
