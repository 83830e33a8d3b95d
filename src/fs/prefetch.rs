//! Directory read-ahead: push the files that follow a file being read into the kernel's
//! page cache before anyone asks for them.
//!
//! A program that walks a tree (`tar`, `cp -r`, `rsync`, an interpreter importing a
//! package, a compiler reading a directory of headers) reads one small file after
//! another. The kernel reads ahead inside a file, never across files, so on a tree of
//! small files every file costs a FUSE round trip during which the reader waits: those
//! round trips, not decompression or the disk, bound the speed of a cold walk
//! (docs/BENCHMARKS.md). FUSE lets the server store data into the page cache of any inode
//! the kernel holds (`FUSE_NOTIFY_STORE`), and READDIRPLUS has made the kernel hold every
//! entry of a directory that was listed. So when a read starts at offset 0 of a file (the
//! kernel had none of it: a *miss*), a prefetch thread decodes the files that follow it
//! in its directory, in the order `readdir` lists them, and stores them; the reader then
//! finds them cached, and the decoding runs on another core while it works.
//!
//! The window works like the kernel's own readahead. The first miss in a directory plans
//! the following files up to [`INITIAL_WINDOW`] bytes. A miss at or inside the window
//! of a directory means a reader is walking it: the window doubles, up to the configured
//! maximum, from where the pushes have got to. A reader that has caught up with the
//! pushes is left the next file (its worker decodes it) and the pushes resume after it,
//! so the two decode different files in parallel instead of the same one twice. A miss
//! anywhere else (a random reader) starts over at the initial window, so random access
//! costs little extra decoding. Files larger than the maximum are left to the kernel's
//! readahead; a file is pushed at most once per generation and epoch of the page cache
//! ([`PkgFs::epoch`]: the kernel asking again from the start for a file it had whole has
//! dropped pages, and read-ahead starts over), never after the kernel has
//! read it itself, and only if the kernel holds its inode (pkgfs notes which files it
//! has given the kernel, by LOOKUP or READDIRPLUS): a reader that opens files by name
//! without listing the directory gets no pushes and costs no decoding.
//!
//! A walk goes from directory to directory. While one is under way (a sequential miss
//! within the last [`WALK_TIMEOUT`]), the first miss in a new directory starts with the
//! walk's window, and so does the end of a *listing* of a new directory (READDIRPLUS,
//! which must come before any of its files can be pushed): its first files are pushed
//! before the reader asks for them. A random miss ends the walk. A `find` that lists
//! directories without reading files never starts one.
//!
//! Pushing costs a copy into the page cache; decoding costs more. During a walk a second
//! thread, the [`Warmer`], decodes the files ahead of the reader in walk order (depth
//! first, in name order, as `tar` goes) into the block cache, [`WARM_WINDOWS`] windows
//! ahead, on the core the reader leaves idle while it waits, so that pushes and the
//! reader's own misses find their blocks decoded. It first asks the kernel for the
//! archive bytes of what it will decode when the walk visits an archive out of order
//! (`zip -r` stores files in `readdir` order), so a cold disk reads them in a few large
//! requests rather than one per member.
//!
//! Planning ([`Prefetcher::missed`], [`Prefetcher::listed`]) and pushing
//! ([`Prefetcher::step`], one file at a time) are separate, so the thread that runs them
//! takes every new hint into account between two files: a reader's position steers the
//! pushes as soon as it is known.
//!
//! Correctness does not depend on any of this: an inode number's contents never change
//! during a mount (a changed file gets a new inode, see `view`), so a push can be early
//! or useless but never stale; a push for an inode the kernel has dropped is ignored by
//! the kernel. The module knows nothing of FUSE: the caller passes the function that
//! stores data into the kernel.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use log::debug;

use crate::fs::{KernelCache, PkgFs};
use crate::io::Span;
use crate::tree::Kind;
use crate::tree::view::View;

/// The first window of a directory, in bytes of file data.
pub const INITIAL_WINDOW: u64 = 128 * 1024;

/// How long a walk lasts after its last sequential miss (a walk served entirely from
/// pushes does not miss: the next directory that does renews it).
pub const WALK_TIMEOUT: Duration = Duration::from_millis(500);

/// How many of the walk's windows the warmer decodes ahead of the reader. One left the
/// second core idle whenever the reader waited on a round trip (15–25% of a cold
/// read-all); four keep it decoding (docs/BENCHMARKS.md). Bounded by the block cache.
pub const WARM_WINDOWS: u64 = 4;

/// The largest window a listing starts (the reader has not read anything there yet).
const LISTED_WINDOW: u64 = 1024 * 1024;

/// What the FUSE adapter tells the read-ahead thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// A read at offset 0 of this inode (the kernel had none of the file).
    Missed(u64),
    /// A READDIRPLUS listing of this directory reached its end (the kernel has taken in
    /// every entry before it).
    Listed(u64),
}

/// Entries one step looks at, at most (directories of empty files or subdirectories).
const MAX_SCAN: usize = 4096;

/// Directories whose window is remembered; more are forgotten all at once.
const MAX_DIRS: usize = 4096;

/// The read-ahead state of one directory.
#[derive(Debug, Clone)]
struct Window {
    /// The generation the local node numbers belong to (the top tree's, or a graft's).
    /// Weak: a window must not keep an old generation, and its archives' descriptors,
    /// alive once the kernel has let go of it.
    view: Weak<View>,
    /// The last miss (local node): a miss from here to `cursor` is sequential.
    start: u64,
    /// The next file to consider (local node).
    cursor: u64,
    /// The end of the directory's children (local node, exclusive).
    end: u64,
    /// The window size, bytes.
    bytes: u64,
    /// Bytes of the window not covered yet.
    budget: u64,
    /// The window stopped at a file the kernel holds no inode of: the reader opens files
    /// by name, it is not walking a listing (its misses never count as sequential).
    blind: bool,
}

/// Whether every file from local node `from` up to (not including) `to` has been read or
/// pushed in `epoch` (looking at no more than [`MAX_SCAN`] of them).
fn read_between(view: &View, from: u64, to: u64, epoch: u32) -> bool {
    to.saturating_sub(from) <= MAX_SCAN as u64
        && (from..to).all(|l| {
            let canon = view.tree.canonical(l);
            match view.tree.node(canon) {
                Some(n) if n.kind == Kind::File && n.size > 0 => view
                    .tree
                    .member_index(n)
                    .and_then(|i| view.member_state(i))
                    .is_some_and(|s| s.cached.is(epoch)),
                _ => true,
            }
        })
}

/// Stores bytes into the kernel's page cache: `store(inode, offset, data)`.
pub type Store<'a> = dyn FnMut(u64, u64, &[u8]) -> std::io::Result<()> + 'a;

/// The kernel's page size. The kernel marks a page up to date only when one store fills
/// it from its start (or to the end of the file), so pieces of a push begin on page
/// boundaries.
const PAGE: u64 = 4096;

/// Push file `n` (canonical local node `canon`, inode `target`) into the kernel's page
/// cache, one decoded block at a time, so a large file is never copied together first;
/// the one page that straddles two blocks is. Stops early, keeping what it pushed, when
/// the reader asks for the file itself (its READ holds the pages: a push would wait for
/// its reply to no purpose) or when the data cannot be read (a real read reports that).
/// Returns the bytes pushed, or the kernel's refusal.
#[allow(clippy::too_many_arguments)]
fn push_file(
    fs: &PkgFs,
    view: &View,
    canon: u64,
    target: u64,
    n: &crate::tree::Node,
    state: &crate::tree::view::MemberState,
    epoch: u32,
    store: &mut Store<'_>,
) -> std::io::Result<u64> {
    let mut off = 0u64;
    while off < n.size {
        let left = (n.size - off) as u32;
        let Ok(piece) = fs.read_node(view, canon, target, n, off, left, Span::Piece) else {
            break;
        };
        if state.requested.is(epoch) || piece.is_empty() {
            break;
        }
        let end = off + piece.len() as u64;
        if end == n.size || end.is_multiple_of(PAGE) {
            store(target, off, &piece)?;
            off = end;
            continue;
        }
        let aligned = end - end % PAGE;
        if aligned > off {
            store(target, off, &piece[..(aligned - off) as usize])?;
            off = aligned;
        }
        drop(piece);
        let edge = PAGE.min(n.size - off) as u32;
        let Ok(page) = fs.read_node(view, canon, target, n, off, edge, Span::Whole) else {
            break;
        };
        if page.is_empty() {
            break;
        }
        store(target, off, &page)?;
        off += page.len() as u64;
    }
    // The kernel holds what was stored: the cache need not.
    fs.delivered_node(view, canon, 0, off);
    if off == n.size {
        state.pushed.set(epoch);
    }
    Ok(off)
}

/// Plans and pushes directory read-ahead for one mount. One thread owns it.
pub struct Prefetcher {
    fs: Arc<PkgFs>,
    max: u64,
    windows: HashMap<u64, Window>,
    /// Directories with pushes to do, the most recent miss first.
    active: VecDeque<u64>,
    /// The walk under way: its window and when it was last seen.
    walk: Option<(u64, Instant)>,
    /// Where the walk under way has got to (global inode), for the [`Warmer`].
    walk_at: Option<u64>,
    /// The page cache's epoch the windows were planned in ([`PkgFs::epoch`]).
    epoch: u32,
}

impl Prefetcher {
    /// Read-ahead for `fs`, with windows up to `max` bytes (0: none).
    pub fn new(fs: Arc<PkgFs>, max: u64) -> Self {
        Prefetcher {
            epoch: fs.epoch(),
            fs,
            max,
            windows: HashMap::new(),
            active: VecDeque::new(),
            walk: None,
            walk_at: None,
        }
    }

    /// Windows say what was pushed in one epoch of the page cache: once the kernel has
    /// dropped pages (a new epoch), they are forgotten and every directory starts afresh
    /// (a walk under way goes on).
    fn follow_epoch(&mut self) {
        let e = self.fs.epoch();
        if e != self.epoch {
            self.epoch = e;
            self.windows.clear();
            self.active.clear();
        }
    }

    /// Where the walk under way has got to (the last file missed or directory listed)
    /// and its window, if one is under way.
    pub fn walk_position(&self) -> Option<(u64, u64)> {
        self.walking()
            .zip(self.walk_at)
            .map(|(bytes, at)| (at, bytes))
    }

    /// Take a hint from the FUSE adapter.
    pub fn hint(&mut self, hint: Hint) {
        match hint {
            Hint::Missed(ino) => self.missed(ino),
            Hint::Listed(ino) => self.listed(ino),
        }
    }

    /// The window of the walk under way, if one is.
    fn walking(&self) -> Option<u64> {
        self.walk
            .filter(|(_, seen)| seen.elapsed() < WALK_TIMEOUT)
            .map(|(bytes, _)| bytes)
    }

    /// Start (or restart) the window of directory `dir` (global inode): the miss at local
    /// node `start`, pushes from `cursor` to `end`.
    fn open_window(
        &mut self,
        dir: u64,
        view: &Arc<View>,
        start: u64,
        cursor: u64,
        end: u64,
        bytes: u64,
    ) {
        if self.windows.len() >= MAX_DIRS {
            self.windows.clear();
            self.active.clear();
        }
        self.windows.insert(
            dir,
            Window {
                view: Arc::downgrade(view),
                start,
                cursor,
                end,
                bytes,
                budget: bytes,
                blind: false,
            },
        );
        self.active.retain(|&d| d != dir);
        self.active.push_front(dir);
    }

    /// Directory `ino` was listed to its end: during a walk, push its first files now.
    pub fn listed(&mut self, ino: u64) {
        self.follow_epoch();
        let Some(bytes) = self.walking() else {
            return;
        };
        // The generation that lists it (a graft's package for a graft directory).
        let Some((view, local)) = self.fs.dir(ino) else {
            return;
        };
        let Some(dir) = view.tree.node(local) else {
            return;
        };
        let range = view.tree.child_range(dir);
        if range.is_empty()
            || self
                .windows
                .get(&ino)
                .is_some_and(|w| std::ptr::eq(w.view.as_ptr(), Arc::as_ptr(&view)))
        {
            return;
        }
        let bytes = bytes.min(LISTED_WINDOW);
        self.walk_at = Some(ino);
        self.open_window(ino, &view, range.start, range.start, range.end, bytes);
    }

    /// A read at offset 0 of `ino` missed the kernel's cache (the worker serving it has
    /// marked it as cached): plan what follows it. Cheap; the pushes are [`Self::step`]'s.
    pub fn missed(&mut self, ino: u64) {
        if self.max == 0 {
            return;
        }
        self.follow_epoch();
        let Ok((view, local)) = self.fs.find(ino) else {
            return;
        };
        let epoch = self.fs.epoch();
        let Some(node) = view.tree.node(local) else {
            return;
        };
        let Some(parent) = view.tree.node(node.parent) else {
            return;
        };
        if node.kind != Kind::File {
            return;
        }
        let dir = view.global(node.parent);
        let initial = INITIAL_WINDOW.min(self.max);
        let range = view.tree.child_range(parent);
        // Sequential: at or after the last miss, and either within the pushes or ahead
        // of them with every file in between read already.
        let known = self
            .windows
            .get(&dir)
            .filter(|w| std::ptr::eq(w.view.as_ptr(), Arc::as_ptr(&view)));
        let sequential = known.is_some_and(|w| {
            !w.blind
                && w.start <= local
                && (local <= w.cursor || read_between(&view, w.cursor, local, epoch))
        });
        let known = known.is_some();
        log::trace!(
            "miss on inode {ino} (position {} in directory {dir}): {}",
            local - range.start,
            if sequential {
                "sequential"
            } else {
                "new window"
            }
        );
        if sequential && let Some(w) = self.windows.get_mut(&dir) {
            if local + 1 >= w.cursor {
                // Caught up: the reader's worker will decode the next file.
                w.cursor = local + 2;
            }
            w.start = local;
            w.bytes = w.bytes.saturating_mul(2).min(self.max);
            w.budget = w.bytes;
            self.walk = Some((w.bytes, Instant::now()));
            self.walk_at = Some(ino);
            self.active.retain(|&d| d != dir);
            self.active.push_front(dir);
            return;
        }
        // A first miss in a directory, on its first file (nothing before it is a file
        // not read yet), during a walk: the walk goes on. Any other miss is random and
        // ends it.
        let bytes = match self.walking() {
            Some(walk) if !known && read_between(&view, range.start, local, epoch) => {
                self.walk_at = Some(ino);
                walk
            }
            _ => {
                self.walk = None;
                initial
            }
        };
        self.open_window(dir, &view, local, local + 1, range.end, bytes);
    }

    /// Push the next planned file with `store(inode, offset, data)`. Returns `false` when
    /// there is nothing left to push.
    pub fn step(&mut self, store: &mut Store<'_>) -> bool {
        self.follow_epoch();
        let current = self.fs.view();
        let stats = &self.fs.stats;
        let epoch = self.fs.epoch();
        while let Some(&dir) = self.active.front() {
            // Windows of an older top generation are dropped; a graft's generation
            // lives as long as its package is unchanged.
            let w = match self.windows.get_mut(&dir) {
                Some(w) => w,
                None => {
                    self.active.pop_front();
                    continue;
                }
            };
            let view = match w.view.upgrade() {
                Some(v) if Arc::ptr_eq(&v, &current) || v.graft_range().is_some() => v,
                _ => {
                    self.active.pop_front();
                    continue;
                }
            };
            for _ in 0..MAX_SCAN {
                if w.budget == 0 || w.cursor >= w.end {
                    break;
                }
                let cl = w.cursor;
                w.cursor += 1;
                let canon = view.tree.canonical(cl);
                let Some(n) = view.tree.node(canon) else {
                    continue;
                };
                if n.kind != Kind::File
                    || n.size == 0
                    || n.size > self.max
                    || n.size > u64::from(u32::MAX)
                {
                    continue;
                }
                let Some(state) = view.tree.member_index(n).and_then(|i| view.member_state(i))
                else {
                    continue;
                };
                // The kernel refuses data for inodes it does not hold, and a reader that
                // opens files by name has not listed the directory: the window ends here
                // (running on over such files would make any later miss in the
                // directory look sequential).
                if !state.known.load(Relaxed) {
                    w.cursor = cl;
                    w.budget = 0;
                    w.blind = true;
                    break;
                }
                // Files the kernel already has count towards the window, as cached pages
                // count towards the kernel's: a reader ahead of the pushes does not make
                // the window run on.
                w.budget = w.budget.saturating_sub(n.size);
                if state.cached.test_and_set(epoch) {
                    continue;
                }
                let target = view.global(canon);
                match push_file(&self.fs, &view, canon, target, n, state, epoch, store) {
                    Ok(0) => {}
                    Ok(bytes) => {
                        stats.prefetched.fetch_add(1, Relaxed);
                        stats.prefetched_bytes.fetch_add(bytes, Relaxed);
                    }
                    Err(e) => {
                        stats.prefetch_failed.fetch_add(1, Relaxed);
                        debug!("prefetch of inode {target} refused: {e}");
                        w.budget = 0;
                    }
                }
                return true;
            }
            if w.budget == 0 || w.cursor >= w.end {
                self.active.pop_front();
            }
        }
        false
    }
}

/// A node of the warmer's kept scan, resolved once when scanned: a pass looks at each of
/// them again, and following the node and its alias each time cost 3% of a read-all.
#[derive(Clone)]
struct Ahead {
    /// The generation it is in (a package's own, past the end of the walker's).
    view: Arc<View>,
    /// The node (local).
    local: u64,
    /// Its canonical node (the node itself, or what it is a hard link to).
    canon: u64,
    /// The file's bytes: files of at most the window with a member; 0 for anything else.
    bytes: u64,
    /// The member of a file with bytes.
    member: u32,
}

/// Decodes files ahead of a walk into the block cache (one thread runs it).
///
/// Each pass starts at the walk's position, which moves a file or a directory at a time,
/// so the nodes after it in walk order are kept from pass to pass (`ahead`, with the
/// bytes of the files among them): a pass drops those the walk has passed and scans on
/// only beyond the last one, instead of walking the same window of the tree again.
///
/// Walk order crosses packages with directories of their own (`--layout each`,
/// `cargo`): at a package's directory the scan goes into the package, indexing it if
/// nobody has yet (the walk is heading there: its index is read on this thread, not on
/// the walker's when it arrives), and at the end of a package's tree it goes on after
/// the package's directory. Packages no walk heads for stay unindexed: the scan crosses
/// into packages only once the walk itself has gone from one package on to a later one
/// in the same directory (a walk of one package's directory never reaches the next).
pub struct Warmer {
    fs: Arc<PkgFs>,
    /// Nodes after the walk's position, in walk order.
    ahead: VecDeque<Ahead>,
    /// Sum of the bytes in `ahead`.
    ahead_bytes: u64,
    /// The last node scanned (the next scan continues after it), `None` past the end.
    scanned: Option<(Arc<View>, u64)>,
    /// Generation of the mount, window and crossing the kept scan was made for (any
    /// changing starts over).
    made_for: (u64, u64, bool),
    /// The files (generation, local node) of the current pass to decode, and to ask the
    /// disk for: kept between passes so that planning allocates little.
    plan: Vec<(Arc<View>, u64)>,
    advise: Vec<u64>,
    /// The directory (global inode) of the package the walk was last seen in.
    last_package: Option<u64>,
    /// The walk went on from one package to a later one: the scan crosses packages.
    crossing: bool,
}

/// Whether `a` is local node `local` of generation `view`.
fn is_at(a: &Ahead, view: &View, local: u64) -> bool {
    a.local == local && a.view.generation == view.generation
}

impl Warmer {
    /// A warmer for `fs`.
    pub fn new(fs: Arc<PkgFs>) -> Self {
        Warmer {
            fs,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            scanned: None,
            made_for: (u64::MAX, 0, false),
            plan: Vec::new(),
            advise: Vec::new(),
            last_package: None,
            crossing: false,
        }
    }

    /// Note the package the walk is in (`view`, if it is a package's): crossing
    /// packages starts when the walk goes on to a later package of the same directory,
    /// and stops when it goes back or elsewhere.
    fn follow(&mut self, view: &View) {
        if view.graft_range().is_none() {
            return;
        }
        let here = view.global(crate::tree::ROOT_INO);
        let Some(before) = self.last_package.replace(here) else {
            return;
        };
        if before == here {
            return;
        }
        let top = self.fs.view();
        let node = |ino| {
            top.local(ino)
                .and_then(|l| Some((l, top.tree.node(l)?.parent)))
        };
        self.crossing = match (node(before), node(here)) {
            (Some((b, bp)), Some((h, hp))) => bp == hp && h > b,
            _ => false,
        };
    }

    /// Move the kept scan to start after local node `from` of `view`: drop the nodes up
    /// to it if it is among them (or was the last scanned), else start over from it.
    fn move_to(&mut self, view: &Arc<View>, from: u64, made_for: (u64, u64, bool)) {
        if self.made_for == made_for {
            if let Some(i) = self.ahead.iter().position(|a| is_at(a, view, from)) {
                for a in self.ahead.drain(..=i) {
                    self.ahead_bytes -= a.bytes;
                }
                return;
            }
            if self.ahead.is_empty()
                && self
                    .scanned
                    .as_ref()
                    .is_some_and(|(v, l)| *l == from && v.generation == view.generation)
            {
                return;
            }
        }
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.scanned = Some((view.clone(), from));
        self.made_for = made_for;
    }

    /// The node after local node `l` of `view` in walk order: into a package's directory
    /// (its tree, indexed now if it was not), and out of a package's tree at its end.
    fn next_in_walk(&self, view: &Arc<View>, l: u64) -> Option<(Arc<View>, u64)> {
        if !self.crossing {
            return view.tree.next_in_walk(l).map(|n| (view.clone(), n));
        }
        if let Some(g) = view.graft_at(l) {
            let inner = self.fs.enter_graft(view, l, g, true);
            if let Some(first) = inner.tree.next_in_walk(crate::tree::ROOT_INO) {
                return Some((inner, first));
            }
        }
        let (mut view, mut l) = (view.clone(), l);
        loop {
            if let Some(next) = view.tree.next_in_walk(l) {
                return Some((view, next));
            }
            // The end of a package's tree: on after its directory, in the generation
            // that serves that directory.
            view.graft_range()?;
            let (up, at) = self.fs.find(view.global(crate::tree::ROOT_INO)).ok()?;
            (view, l) = (up, at);
        }
    }

    /// Decode the files after node `from` (global inode) in walk order into the block
    /// cache, until `ahead` bytes of files are covered (files the kernel has count; the
    /// walk's window, so a walk that has just begun costs little) or `stop()` says the
    /// walk has moved on. Returns the bytes decoded.
    pub fn warm(&mut self, from: u64, ahead: u64, stop: &dyn Fn() -> bool) -> u64 {
        let Ok((view, from_local)) = self.fs.find(from) else {
            return 0;
        };
        self.follow(&view);
        self.move_to(
            &view,
            from_local,
            (self.fs.view().generation, ahead, self.crossing),
        );
        // Scan on until the files ahead hold twice the window: the first window is
        // decoded, and the archive bytes of both are asked of the disk first, all at
        // once, so the disk reads them in archive order one window ahead of the decoding.
        let target = ahead.saturating_mul(2);
        let mut steps = 0;
        while self.ahead_bytes < target && steps < MAX_SCAN * 8 {
            let Some((v, next)) = self
                .scanned
                .as_ref()
                .and_then(|(v, l)| self.next_in_walk(v, *l))
            else {
                self.scanned = None;
                break;
            };
            steps += 1;
            let canon = v.tree.canonical(next);
            let (bytes, member) = v
                .tree
                .node(canon)
                .filter(|n| n.kind == Kind::File && n.size <= ahead)
                .and_then(|n| Some((n.size, v.tree.member_index(n)?)))
                .unwrap_or((0, 0));
            self.ahead.push_back(Ahead {
                view: v.clone(),
                local: next,
                canon,
                bytes,
                member,
            });
            self.scanned = Some((v, next));
            self.ahead_bytes += bytes;
        }
        self.plan.clear();
        let mut covered = 0u64;
        let mut advise_in: Option<Arc<View>> = None;
        let epoch = self.fs.epoch();
        for a in &self.ahead {
            if covered >= target {
                break;
            }
            if a.bytes == 0 {
                continue;
            }
            let Some(state) = a.view.member_state(a.member) else {
                continue;
            };
            if !state.cached.is(epoch) {
                if covered < ahead && !state.warmed.is(epoch) {
                    self.plan.push((a.view.clone(), a.canon));
                }
                if !state.advised.is(epoch) {
                    // One request of the disk a generation: flush the last one's.
                    if advise_in
                        .as_ref()
                        .is_some_and(|v| v.generation != a.view.generation)
                        && let Some(v) = advise_in.take()
                    {
                        self.fs.will_need(&v, &self.advise);
                        self.advise.clear();
                    }
                    advise_in.get_or_insert_with(|| a.view.clone());
                    self.advise.push(a.canon);
                }
            }
            covered += a.bytes;
        }
        if let Some(v) = advise_in {
            self.fs.will_need(&v, &self.advise);
        }
        self.advise.clear();
        let mut decoded = 0u64;
        for (view, canon) in &self.plan {
            if stop() {
                break;
            }
            let canon = *canon;
            let Some(n) = view.tree.node(canon) else {
                continue;
            };
            let Some(state) = view.tree.member_index(n).and_then(|i| view.member_state(i)) else {
                continue;
            };
            if state.cached.is(epoch) || state.warmed.test_and_set(epoch) {
                continue;
            }
            // Block by block: the blocks are what is wanted, not a copy of the file.
            let global = view.global(canon);
            let mut off = 0;
            while off < n.size {
                let left = (n.size - off) as u32;
                match self
                    .fs
                    .read_node(view, canon, global, n, off, left, Span::Piece)
                {
                    Ok(piece) if !piece.is_empty() => off += piece.len() as u64,
                    _ => break,
                }
            }
            decoded += off;
        }
        decoded
    }
}

/// Where a walk has got to (global inode) and its window: written by the [`Pusher`],
/// read by the [`WarmLoop`].
#[derive(Debug, Default)]
pub struct WalkPosition {
    at: AtomicU64,
    window: AtomicU64,
}

/// Hints waiting for the read-ahead thread; more are dropped (a worker never waits).
pub const HINT_QUEUE: usize = 1024;

/// The directory read-ahead thread's loop: takes hints from the operation layer, plans
/// with a [`Prefetcher`], pushes into the kernel's page cache, and tells the warmer where
/// a walk has got to. It runs until every sender of hints is gone (the session has
/// ended). A panic is logged and the loop carries on with the next hint.
pub struct Pusher {
    prefetcher: Prefetcher,
    hints: Receiver<Hint>,
    kernel: Arc<dyn KernelCache>,
    walk: Arc<WalkPosition>,
    wake: SyncSender<()>,
}

/// The warmer thread's loop: decodes ahead of the walk each time the [`Pusher`] says it
/// moved, until the pusher is gone. Runs as `SCHED_BATCH`.
pub struct WarmLoop {
    warmer: Warmer,
    walk: Arc<WalkPosition>,
    woken: Receiver<()>,
}

/// The two read-ahead loops of a mount, connected: a [`Pusher`] taking `hints` and
/// pushing through `kernel` with windows up to `max` bytes, and the [`WarmLoop`] it
/// wakes. The caller gives each a thread.
pub fn read_ahead(
    fs: Arc<PkgFs>,
    max: u64,
    hints: Receiver<Hint>,
    kernel: Arc<dyn KernelCache>,
) -> (Pusher, WarmLoop) {
    let walk = Arc::new(WalkPosition::default());
    let (wake, woken) = sync_channel(1);
    let pusher = Pusher {
        prefetcher: Prefetcher::new(fs.clone(), max),
        hints,
        kernel,
        walk: walk.clone(),
        wake,
    };
    let warm = WarmLoop {
        warmer: Warmer::new(fs),
        walk,
        woken,
    };
    (pusher, warm)
}

/// Start the read-ahead of a mount ([`read_ahead`]) on its two threads, `pkgfs-prefetch`
/// (the pusher) and `pkgfs-warm` (the warmer); they end when the hint senders are gone.
pub fn start(
    fs: Arc<PkgFs>,
    max: u64,
    hints: Receiver<Hint>,
    kernel: Arc<dyn KernelCache>,
) -> std::io::Result<()> {
    let (pusher, warm) = read_ahead(fs, max, hints, kernel);
    std::thread::Builder::new()
        .name("pkgfs-warm".into())
        .spawn(move || warm.run())?;
    std::thread::Builder::new()
        .name("pkgfs-prefetch".into())
        .spawn(move || pusher.run())?;
    Ok(())
}

impl Pusher {
    fn take(&mut self, hint: Hint) {
        self.prefetcher.hint(hint);
        self.prefetcher.fs.stats.hints_taken.fetch_add(1, Relaxed);
        if let Some((at, window)) = self.prefetcher.walk_position() {
            self.walk.window.store(window, Relaxed);
            if self.walk.at.swap(at, Relaxed) != at {
                let _ = self.wake.try_send(());
            }
        }
    }

    /// Serve hints until the senders are gone.
    pub fn run(mut self) {
        loop {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.turn()));
            match r {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => log::error!("directory read-ahead panicked; carrying on"),
            }
        }
    }

    /// Take every hint waiting before the next push (a reader's position steers what is
    /// pushed next), push while there is something to push, then wait for a hint.
    /// Returns `false` once the senders are gone.
    fn turn(&mut self) -> bool {
        let kernel = self.kernel.clone();
        let mut store = |ino: u64, offset: u64, data: &[u8]| kernel.store(ino, offset, data);
        loop {
            match self.hints.try_recv() {
                Ok(hint) => self.take(hint),
                Err(TryRecvError::Empty) => {
                    if !self.prefetcher.step(&mut store) {
                        break;
                    }
                }
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        let stats = &self.prefetcher.fs.stats;
        stats.prefetch_idle.store(true, Relaxed);
        let next = self.hints.recv();
        stats.prefetch_idle.store(false, Relaxed);
        match next {
            Ok(hint) => {
                self.take(hint);
                true
            }
            Err(_) => false,
        }
    }
}

impl WarmLoop {
    /// Decode ahead each time the walk moves, until the pusher is gone.
    pub fn run(mut self) {
        as_batch();
        while self.woken.recv().is_ok() {
            let walk = &self.walk;
            let (at, window) = (walk.at.load(Relaxed), walk.window.load(Relaxed));
            let warmer = &mut self.warmer;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                warmer.warm(at, window.saturating_mul(WARM_WINDOWS), &|| {
                    walk.at.load(Relaxed) != at
                })
            }));
            match r {
                Ok(bytes) => log::trace!("walk at inode {at}: {bytes} bytes decoded ahead"),
                Err(_) => log::error!("decoding ahead of a walk panicked; carrying on"),
            }
        }
    }
}

/// Run the calling thread under `SCHED_BATCH`: same share of the CPU, but it never
/// preempts a thread that wakes up. Decoding ahead is throughput work; the reader, the
/// FUSE workers and the push thread each wake for a short burst, and on a machine with
/// few cores, waiting for the warmer's time slice to end was waiting on the reader's
/// critical path (docs/BENCHMARKS.md, "Scheduling the decoder"). A failure only costs
/// that.
fn as_batch() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        debug!(
            "cannot run the warmer as SCHED_BATCH: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Ownership, TreeBuilder};
    use std::io::Write;

    /// A mount (no FUSE) of the archive at `path` alone, with a 1 MiB cache.
    fn fs_of(path: &std::path::Path) -> PkgFs {
        let idx = crate::format::open_path(path, &crate::format::OpenContext::default()).unwrap();
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        b.add_layer(0, 0, &idx.entries);
        PkgFs::new(b.finish(), vec![idx.archive], 1 << 20)
    }

    /// A mount (no FUSE) of a real ZIP holding `n` deflated files of `size` bytes in
    /// directory `d` (`d/f000`, ...) and a subdirectory `d/sub` with one file.
    fn mount(n: usize, size: usize) -> (Arc<PkgFs>, tempfile::TempDir) {
        mount_with(n, size, true)
    }

    /// [`mount`], with the directory listed by the kernel (READDIRPLUS) or not.
    fn mount_with(n: usize, size: usize, listed: bool) -> (Arc<PkgFs>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.zip");
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let mut names: Vec<String> = (0..n).map(|i| format!("d/f{i:03}")).collect();
        names.push("d/sub/x".into());
        for (i, name) in names.iter().enumerate() {
            w.start_file(name.as_str(), ::zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(&vec![b'a' + (i % 26) as u8; size]).unwrap();
        }
        w.finish().unwrap();
        let fs = fs_of(&path);
        if listed {
            // The kernel lists the directory with READDIRPLUS: it holds every file.
            let d = fs.resolve(b"d").unwrap();
            fs.readdir(d, 0, true, |_| false).unwrap();
        }
        (Arc::new(fs), dir)
    }

    /// A large file is pushed block by block, every piece starting on a page boundary
    /// (the kernel marks a page up to date only when one store fills it from its start),
    /// and the pieces put together are the file.
    #[test]
    fn large_files_are_pushed_in_page_aligned_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/a"), b"first").unwrap();
        // Pseudo-random, so frames compress to different sizes.
        let mut x = 12345u32;
        let big: Vec<u8> = (0..150_000)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (x >> 24) as u8 & 0x3f
            })
            .collect();
        std::fs::write(src.join("d/big"), &big).unwrap();
        let out = dir.path().join("p.tar.zst");
        crate::tools::pack::pack(&crate::tools::pack::PackConfig {
            dir: src,
            output: out.clone(),
            level: 3,
            threads: 1,
            // Frames end at offsets that are not page boundaries.
            frame_size: 10_000,
            mtime_clamp: None,
            owner: None,
            follow: crate::tools::pack::Follow::Never,
        })
        .unwrap();
        let fs = Arc::new(fs_of(&out));
        let d = fs.resolve(b"d").unwrap();
        fs.readdir(d, 0, true, |_| false).unwrap();
        let a = fs.resolve(b"d/a").unwrap();
        let big_ino = fs.resolve(b"d/big").unwrap();
        fs.read(a, 0, 4096).unwrap();
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        p.missed(a);
        let mut pieces = Vec::new();
        while p.step(&mut |ino, off, data| {
            pieces.push((ino, off, data.to_vec()));
            Ok(())
        }) {}
        assert!(pieces.len() > 10, "{} pieces", pieces.len());
        let mut whole = Vec::new();
        for (ino, off, data) in &pieces {
            assert_eq!(*ino, big_ino);
            assert_eq!(*off, whole.len() as u64, "pieces follow each other");
            assert_eq!(off % PAGE, 0, "a piece starts on a page boundary");
            whole.extend_from_slice(data);
        }
        assert!(whole == big, "the pieces are the file");
        let s = &fs.stats;
        assert_eq!(s.prefetched.load(Relaxed), 1);
        assert_eq!(s.prefetched_bytes.load(Relaxed), big.len() as u64);
    }

    /// Push everything planned, logging (path, length) of each push.
    fn drain(p: &mut Prefetcher, fs: &PkgFs) -> Vec<(String, usize)> {
        let view = fs.view();
        let mut log = Vec::new();
        while p.step(&mut |ino, _, data| {
            let local = view.local(ino).unwrap();
            log.push((
                String::from_utf8(view.tree.path_of(local)).unwrap(),
                data.len(),
            ));
            Ok(())
        }) {}
        log
    }

    /// A miss on `path` (the worker's read, then the hint), and the pushes it causes.
    fn push_log(p: &mut Prefetcher, fs: &PkgFs, path: &str) -> Vec<(String, usize)> {
        let ino = fs.resolve(path.as_bytes()).unwrap();
        fs.read(ino, 0, 4096).unwrap();
        p.missed(ino);
        drain(p, fs)
    }

    fn names(log: &[(String, usize)]) -> Vec<&str> {
        log.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The kernel's page cache as the loops see it: stores recorded, invalidations
    /// ignored.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(u64, u64, usize)>>);

    impl KernelCache for Recorder {
        fn store(&self, ino: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.0.lock().unwrap().push((ino, offset, data.len()));
            Ok(())
        }
        fn invalidate(&self, _: &crate::tree::view::Invalidation) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_loops_push_what_hints_plan_and_end_with_their_senders() {
        let (fs, _f) = mount(40, 16 * 1024);
        let kernel = Arc::new(Recorder::default());
        let (tx, rx) = sync_channel(HINT_QUEUE);
        let (pusher, warm) = read_ahead(fs.clone(), 1 << 20, rx, kernel.clone());
        let walk = pusher.walk.clone();
        let warming = std::thread::spawn(move || warm.run());
        let pushing = std::thread::spawn(move || pusher.run());
        // Two sequential misses in `d`, the second once the first window is pushed: a
        // walk, whose window doubles.
        let deadline = Instant::now() + Duration::from_secs(10);
        // (A first miss is no walk yet: the warmer is told only of the second.)
        for (f, pushed, walking) in [("d/f000", 8, false), ("d/f009", 8 + 16, true)] {
            let ino = fs.resolve(f.as_bytes()).unwrap();
            fs.read(ino, 0, 4096).unwrap();
            tx.send(Hint::Missed(ino)).unwrap();
            while (walk.at.load(Relaxed) == ino) != walking
                || kernel.0.lock().unwrap().len() < pushed
            {
                assert!(Instant::now() < deadline, "the pusher never caught up");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Dropping the last sender ends the pusher, which ends the warmer.
        drop(tx);
        pushing.join().unwrap();
        warming.join().unwrap();
        let stored = kernel.0.lock().unwrap().clone();
        assert!(
            stored
                .iter()
                .all(|&(_, off, len)| off == 0 && len == 16 * 1024)
        );
        let view = fs.view();
        let first = view.tree.path_of(view.local(stored[0].0).unwrap());
        assert_eq!(first, b"d/f001", "pushes start after the missed file");
        assert_eq!(
            walk.window.load(Relaxed),
            256 * 1024,
            "the walk's window doubled"
        );
        assert_eq!(
            fs.stats.prefetched.load(Relaxed),
            stored.len() as u64,
            "every push counted"
        );
    }

    #[test]
    fn a_walk_grows_the_window_and_a_random_read_resets_it() {
        let (fs, _f) = mount(200, 16 * 1024);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        // First miss: 128 KiB of the following files (8 of 16 KiB).
        let log = push_log(&mut p, &fs, "d/f000");
        assert_eq!(names(&log)[..2], ["d/f001", "d/f002"]);
        assert_eq!(log.len(), 8);
        assert!(log.iter().all(|(_, len)| *len == 16 * 1024));
        // The reader reaches the end of the window: it is left the next file, and the
        // next window, twice as large, starts after that.
        let log = push_log(&mut p, &fs, "d/f009");
        assert_eq!((names(&log)[0], log.len()), ("d/f011", 16));
        let log = push_log(&mut p, &fs, "d/f027");
        assert_eq!((names(&log)[0], log.len()), ("d/f029", 32));
        // Capped at the maximum window (1 MiB = 64 files).
        let log = push_log(&mut p, &fs, "d/f061");
        assert_eq!(log.len(), 64);
        let log = push_log(&mut p, &fs, "d/f127");
        assert_eq!((names(&log)[0], log.len()), ("d/f129", 64));
        // A random miss elsewhere, on f010 (left to a reader that never came), starts
        // over small (f011 to f018), and files already pushed are not pushed again:
        // they fill the window.
        let log = push_log(&mut p, &fs, "d/f010");
        assert!(log.is_empty(), "{log:?}");
        // A read from the start of f005, pushed whole: the kernel dropped its pages. In
        // the new epoch the files after it are pushed again, a first window of them.
        let log = push_log(&mut p, &fs, "d/f005");
        assert_eq!((names(&log)[0], log.len()), ("d/f006", 8));
        // The directory ends: the subdirectory and what is inside it are not pushed.
        let log = push_log(&mut p, &fs, "d/f193");
        assert_eq!(
            names(&log),
            ["d/f194", "d/f195", "d/f196", "d/f197", "d/f198", "d/f199"]
        );
        assert_eq!(
            fs.stats.prefetched.load(Relaxed),
            8 + 16 + 32 + 64 + 64 + 8 + 6
        );
    }

    /// The kernel asking again from the start for a file it had whole (read or pushed)
    /// has dropped pages: a new epoch, in which a walk's listing and misses push the
    /// files it had again.
    #[test]
    fn after_the_kernel_drops_pages_a_walk_is_pushed_again() {
        let (fs, _f) = mount(40, 16 * 1024);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        let d = fs.resolve(b"d").unwrap();
        let e = fs.epoch();
        // A walk: a miss on f000 (eight files pushed), then a sequential one on f009.
        assert_eq!(names(&push_log(&mut p, &fs, "d/f000"))[0], "d/f001");
        assert!(!push_log(&mut p, &fs, "d/f009").is_empty());
        // The same epoch: the directory listed again pushes nothing new.
        p.listed(d);
        assert!(drain(&mut p, &fs).is_empty());
        assert_eq!((fs.epoch(), fs.stats.page_drops.load(Relaxed)), (e, 0));
        // A file pushed whole is asked for from its start: the kernel dropped it.
        fs.read(fs.resolve(b"d/f001").unwrap(), 0, 4096).unwrap();
        assert_eq!((fs.epoch(), fs.stats.page_drops.load(Relaxed)), (e + 1, 1));
        // Listed again in the walk, the directory's files are pushed again (all but the
        // one just read).
        p.listed(d);
        let again = drain(&mut p, &fs);
        assert_eq!(names(&again)[..2], ["d/f000", "d/f002"]);
        // A file read from its start in this epoch and asked for again: one more.
        fs.read(fs.resolve(b"d/f001").unwrap(), 0, 4096).unwrap();
        assert_eq!((fs.epoch(), fs.stats.page_drops.load(Relaxed)), (e + 2, 2));
    }

    #[test]
    fn a_reader_ahead_of_the_pushes_moves_them_on() {
        let (fs, _f) = mount(100, 16 * 1024);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        let ino = |name: &str| fs.resolve(name.as_bytes()).unwrap();
        fs.read(ino("d/f000"), 0, 1).unwrap();
        p.missed(ino("d/f000"));
        // Two files pushed, then the reader misses on f004 (it read f003 itself).
        let mut n = 0;
        while n < 2 && p.step(&mut |_, _, _| Ok(())) {
            n += 1;
        }
        for f in ["d/f003", "d/f004"] {
            fs.read(ino(f), 0, 1).unwrap();
        }
        p.missed(ino("d/f004"));
        let log = drain(&mut p, &fs);
        // f003 and f004 were the reader's; f005 is left for it, the pushes go on at f006
        // with a doubled window (256 KiB = 16 files).
        assert_eq!((names(&log)[0], log.len()), ("d/f006", 16));
    }

    #[test]
    fn the_warmer_decodes_ahead_of_a_walk_in_walk_order() {
        let (fs, _f) = mount(10, 16 * 1024);
        let decoded = || fs.io().stats.decompressed_bytes.load(Relaxed);
        let from = fs.resolve(b"d/f005").unwrap();
        // A 64 KiB window: f006 to f009.
        assert_eq!(
            Warmer::new(fs.clone()).warm(from, 64 * 1024, &|| false),
            64 * 1024
        );
        assert_eq!(decoded(), 64 * 1024);
        // The archive bytes of twice the window were asked of the disk first.
        let advised = |name: &str| {
            let (v, local) = fs.find(fs.resolve(name.as_bytes()).unwrap()).unwrap();
            let n = v.tree.node(local).unwrap();
            let i = v.tree.member_index(n).unwrap();
            v.member_state(i).unwrap().advised.is(fs.epoch())
        };
        let names: Vec<String> = (0..10).map(|i| format!("d/f{i:03}")).collect();
        let expect: Vec<bool> = (0..10).map(|i| (6..10).contains(&i)).collect();
        assert_eq!(names.iter().map(|n| advised(n)).collect::<Vec<_>>(), expect);
        assert!(advised("d/sub/x"));
        // Further, the walk leaves the directory's files for its subdirectory; what was
        // decoded already is not decoded again.
        let mut w = Warmer::new(fs.clone());
        assert_eq!(w.warm(from, 1 << 20, &|| false), 16 * 1024);
        assert_eq!(decoded(), 80 * 1024);
        // The walk moving on stops it at once.
        assert_eq!(w.warm(fs.resolve(b"d/f000").unwrap(), 1 << 20, &|| true), 0);
    }

    #[test]
    fn the_warmer_keeps_its_scan_as_the_walk_moves() {
        let (fs, _f) = mount(10, 16 * 1024);
        let decoded = || fs.io().stats.decompressed_bytes.load(Relaxed);
        let at = |name: &str| fs.resolve(name.as_bytes()).unwrap();
        let mut w = Warmer::new(fs.clone());
        // A 32 KiB window after f005: f006 and f007; f006 to f009 are scanned.
        assert_eq!(w.warm(at("d/f005"), 32 * 1024, &|| false), 32 * 1024);
        let kept: Vec<u64> = w.ahead.iter().map(|a| a.local).collect();
        assert_eq!(kept, ["d/f006", "d/f007", "d/f008", "d/f009"].map(at));
        // The walk reaches f006: the scan goes on from f009 (to the subdirectory and its
        // file), and only f008 is new to decode.
        assert_eq!(w.warm(at("d/f006"), 32 * 1024, &|| false), 16 * 1024);
        let kept: Vec<u64> = w.ahead.iter().map(|a| a.local).collect();
        assert_eq!(
            kept,
            ["d/f007", "d/f008", "d/f009", "d/sub", "d/sub/x"].map(at)
        );
        assert_eq!(decoded(), 48 * 1024);
        // A jump back starts over from there.
        assert_eq!(w.warm(at("d/f000"), 32 * 1024, &|| false), 32 * 1024);
        let kept: Vec<u64> = w.ahead.iter().map(|a| a.local).collect();
        assert_eq!(kept, ["d/f001", "d/f002", "d/f003", "d/f004"].map(at));
        // The end of the walk: nothing after the last file.
        assert_eq!(w.warm(at("d/sub/x"), 32 * 1024, &|| false), 0);
        assert!(w.ahead.is_empty() && w.scanned.is_none());
    }

    #[test]
    fn pushes_the_bytes_of_the_files_and_honours_the_limits() {
        let (fs, _f) = mount(4, 100);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        let ino = fs.resolve(b"d/f000").unwrap();
        fs.read(ino, 0, 100).unwrap();
        let mut got = Vec::new();
        p.missed(ino);
        while p.step(&mut |ino, _, data| {
            got.push((ino, data.to_vec()));
            Ok(())
        }) {}
        assert_eq!(got.len(), 3);
        for (ino, data) in &got {
            assert_eq!(*data, fs.read(*ino, 0, 1000).unwrap());
        }
        // Only files the kernel holds an inode of can be pushed, and a window ends at the
        // first one it does not hold: a reader opening files by name gets no pushes, and
        // its misses do not look like a walk.
        let (fs, _f) = mount_with(4, 100, false);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        let d = fs.resolve(b"d").unwrap();
        let f0 = fs.lookup(d, b"f000").unwrap().ino;
        let f2 = fs.lookup(d, b"f002").unwrap().ino;
        let mut got = Vec::new();
        for f in [f0, f2] {
            fs.read(f, 0, 1).unwrap();
            p.missed(f);
            while p.step(&mut |ino, _, _| {
                got.push(ino);
                Ok(())
            }) {}
        }
        assert!(got.is_empty(), "{got:?}");
        assert_eq!(p.walk_position(), None);
        // Disabled: nothing.
        let (fs, _f) = mount(4, 100);
        let mut p = Prefetcher::new(fs.clone(), 0);
        p.missed(fs.resolve(b"d/f000").unwrap());
        assert!(!p.step(&mut |_, _, _| Ok(())));
        // Files larger than the window are left to the kernel.
        let (fs, _f) = mount(4, 64 * 1024);
        let mut p = Prefetcher::new(fs.clone(), 32 * 1024);
        p.missed(fs.resolve(b"d/f000").unwrap());
        assert!(!p.step(&mut |_, _, _| Ok(())));
        // A refused push stops the window and is counted.
        let (fs, _f) = mount(4, 100);
        let mut p = Prefetcher::new(fs.clone(), 1 << 20);
        p.missed(fs.resolve(b"d/f000").unwrap());
        while p.step(&mut |_, _, _| Err(std::io::Error::other("gone"))) {}
        assert_eq!(fs.stats.prefetched.load(Relaxed), 0);
        assert_eq!(fs.stats.prefetch_failed.load(Relaxed), 1);
    }
}
