//! The filesystem operations, with no FUSE in them.
//!
//! [`PkgFs`] answers `lookup`, `getattr`, `readdir`, `readlink`, `read` and `statfs` over
//! the current generation of the merged tree ([`View`]) and its archives, returning
//! [`Result`]s. The FUSE adapter (`crate::transport::fuse`) only translates; the offline tools
//! (`ls`, `cat`, `check`) and the tests call this directly. Everything here is `&self`
//! and thread-safe.
//!
//! A live mount ([`PkgFs::activate`]) swaps in a new generation atomically: a request
//! sees the old tree or the new one, never a mix. Inodes the kernel still holds from an
//! older generation (a file open in a package that was removed, a directory someone is
//! in) keep being served from that generation, which stays alive, with its archives
//! open, until the kernel forgets the last of them. To know that, a live mount counts
//! lookups the way the kernel does (every entry returned by `lookup` and `readdirplus`
//! is one reference, `forget` drops them).

pub mod entries;
pub mod prefetch;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use log::{debug, warn};

use crate::error::{Error, Result};
use crate::format::Archive;
use crate::io::{Io, ReadData, Span};
use crate::sync::lock;
use crate::tree::view::{Graft, InoMap, Invalidation, Layer, View};
use crate::tree::{Kind, Node, Tree};

/// Block size reported in `st_blksize` and used by `statfs`.
pub const BLKSIZE: u32 = 4096;
/// Longest symlink target served (`PATH_MAX` less the terminating NUL).
const MAX_LINK: u64 = 4095;

/// Attributes of an inode, as `stat` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Type.
    pub kind: Kind,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks (the uncompressed size rounded up).
    pub blocks: u64,
    /// Modification time (also used for atime and ctime), seconds since the epoch.
    pub mtime: i64,
    /// A device's number in the kernel's 32-bit encoding (`new_encode_dev`, what FUSE's
    /// `fuse_attr.rdev` carries); 0 for anything else.
    pub rdev: u32,
}

/// A device number (`makedev(major, minor)`) as FUSE carries it: the kernel's
/// `new_encode_dev`.
pub fn fuse_rdev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// One directory entry handed to a `readdir` callback.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    /// Inode number.
    pub ino: u64,
    /// Offset to resume after this entry.
    pub next_offset: u64,
    /// Its attributes (for READDIRPLUS).
    pub attr: Attr,
    /// Name.
    pub name: &'a [u8],
    /// READDIRPLUS: hand it out without attributes (node ID 0), so the kernel lists it
    /// without instantiating it (see `entries`).
    pub plain: bool,
}

/// What `statfs` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks of [`BLKSIZE`] bytes (the file data, uncompressed).
    pub blocks: u64,
    /// Number of inodes.
    pub files: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

/// The kernel's caches, as far as the filesystem acts on them: data stored into the page
/// cache of an inode the kernel holds (directory read-ahead), and cached entries that an
/// activation made stale. The transport implements it (`transport::fuse::KernelNotifier`);
/// unit tests record the calls.
pub trait KernelCache: Send + Sync {
    /// Store `data` at `offset` in the page cache of inode `ino`. Fails if the kernel
    /// refuses (the mount is going away).
    fn store(&self, ino: u64, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Drop one cached entry or directory. `ENOENT` means the kernel had nothing cached.
    fn invalidate(&self, inv: &Invalidation) -> std::io::Result<()>;
}

/// A namespace that grows when looked into: names that are not in the tree until a
/// lookup asks for them, and signals carried by requests that would otherwise change the
/// tree (`pkgfs store`: an image reference in the root, a layer digest in an image's
/// directory; `create` of a layer's `use` file and `rmdir` of a layer directory, the
/// additional layer store protocol of containers/storage). The tree stays read-only:
/// what grows is a new generation, activated like a rescan's.
pub trait Grow: Send + Sync {
    /// A lookup of `name` in directory `dir` (a `/`-separated path from the root, empty
    /// for the root) missed. The next generation that holds it, or `None` if there is no
    /// such name. Calls are serialised, each followed by the activation of what it
    /// returned.
    fn grow(&self, dir: &[u8], name: &[u8]) -> Result<Option<Generation>>;
    /// A `create` (or `mknod`) of `name` in `dir` arrived: a signal, never a file.
    /// Whether the source takes it as one; any other create is refused (`EROFS`).
    fn created(&self, dir: &[u8], name: &[u8]) -> bool;
    /// An `rmdir` of `name` in `dir` arrived: a signal, nothing is removed.
    fn removed(&self, dir: &[u8], name: &[u8]);
}

/// A generation to activate: its tree, archives and grafts.
pub type Generation = (Tree, Vec<Layer>, Vec<Arc<Graft>>);

/// Counters of filesystem requests.
#[derive(Debug, Default)]
pub struct OpStats {
    /// `lookup` requests.
    pub lookups: AtomicU64,
    /// `getattr` requests.
    pub getattrs: AtomicU64,
    /// `readdir` and `readdirplus` requests.
    pub readdirs: AtomicU64,
    /// `readlink` requests.
    pub readlinks: AtomicU64,
    /// `read` requests.
    pub reads: AtomicU64,
    /// Bytes returned by `read`.
    pub read_bytes: AtomicU64,
    /// Requests that failed with a data error (EIO: corrupt or unreadable archive data).
    pub errors: AtomicU64,
    /// Files pushed into the kernel's page cache ahead of a reader (see `prefetch`).
    pub prefetched: AtomicU64,
    /// Packages with directories of their own indexed ahead of a walk heading for them
    /// (see `prefetch::Warmer`), not by the walker.
    pub indexed_ahead: AtomicU64,
    /// Bytes of those files.
    pub prefetched_bytes: AtomicU64,
    /// Pushes the kernel refused (the mount is going away).
    pub prefetch_failed: AtomicU64,
    /// Times the kernel was seen to have dropped pages it had ([`PkgFs::epoch`]).
    pub page_drops: AtomicU64,
    /// Hints sent to the read-ahead thread (misses and ends of listings).
    pub hints: AtomicU64,
    /// Hints the read-ahead thread has taken into account.
    pub hints_taken: AtomicU64,
    /// The read-ahead thread has nothing to push and waits for a hint.
    pub prefetch_idle: AtomicBool,
}

/// The generation and local node that serve an inode.
type Served = (Arc<View>, u64);

/// Lookup counts and the inodes of older generations the kernel still holds.
struct Inodes {
    /// The current generation (the same as `PkgFs::current`, but changed only under this
    /// lock, so a lookup counted here is never lost by a concurrent activation).
    current: Arc<View>,
    /// The kernel's lookup count of each inode it has been given (live mounts only).
    counts: InoMap<u64>,
    /// Inodes no longer in the current generation that the kernel still references, with
    /// the generation and local node that serve them.
    retired: InoMap<(Arc<View>, u64)>,
}

/// What an activation changed.
#[derive(Debug)]
pub struct Activation {
    /// The new generation number.
    pub generation: u64,
    /// The kernel cache entries to invalidate, in order.
    pub invalidations: Vec<Invalidation>,
    /// Inodes of older generations still referenced by the kernel after the swap.
    pub retired: usize,
}

/// What hears of a new generation ([`PkgFs::on_change`]).
pub type ChangeHook = Box<dyn Fn(&View, u64) + Send + Sync>;

/// An inode of an older generation the kernel still holds: its number, its generation,
/// its node there.
pub type Retired = (u64, Arc<View>, u64);

/// What hears of the inodes of older generations the kernel holds, after each
/// activation ([`PkgFs::on_retire`]).
pub type RetireHook = Box<dyn Fn(&[Retired]) + Send + Sync>;

/// What hears of a name a growing tree grew by ([`PkgFs::on_grow`]): the directory's
/// path and the name.
pub type GrowHook = Box<dyn Fn(&[u8], &[u8]) + Send + Sync>;

/// A digest of what the kernel's inode numbers mean in generation `v`, numbering aside:
/// every node of its tree (local number, parent, name, type, attributes, hard-link
/// target) and every grafted package (name and version; a graft numbers its own nodes
/// from its directory's number). Two servers whose trees have the same digest number
/// them the same way given the same numbering table (the first generation's is the
/// tree's own), so a new server may take over from an old one (`crate::keeper`).
///
/// Computed once per generation (a tree of 50,000 nodes takes about 20 ms here, the
/// SHA-256 in software); a kept tree brings the digest its fold computed
/// ([`tree_digest`]).
pub fn numbering_digest(v: &View) -> String {
    v.digest
        .get_or_init(|| tree_digest(&v.tree, &v.grafts))
        .clone()
}

/// [`numbering_digest`] of a generation of `tree` and `grafts`.
pub fn tree_digest(tree: &crate::tree::Tree, grafts: &[Arc<Graft>]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((tree.len() as u64).to_le_bytes());
    for ino in 1..=tree.len() as u64 {
        let Some(n) = tree.node(ino) else { continue };
        h.update(n.parent.to_le_bytes());
        h.update([n.kind as u8]);
        h.update(n.perm.to_le_bytes());
        h.update(n.uid.to_le_bytes());
        h.update(n.gid.to_le_bytes());
        h.update(n.mtime.to_le_bytes());
        h.update(n.size.to_le_bytes());
        h.update(tree.canonical(ino).to_le_bytes());
        let name = tree.name(n);
        h.update((name.len() as u32).to_le_bytes());
        h.update(name);
    }
    for g in grafts {
        let name = g.source.name().as_os_str().as_encoded_bytes();
        h.update((name.len() as u32).to_le_bytes());
        h.update(name);
        h.update(g.source.version().as_bytes());
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The mounted filesystem.
pub struct PkgFs {
    current: RwLock<Arc<View>>,
    inodes: Mutex<Inodes>,
    /// Count lookups and keep retired generations (a mount that can change).
    live: bool,
    next_ino: AtomicU64,
    /// The grafts of the current generation that have been indexed, by the first inode
    /// of their range (see [`View::graft_range`]).
    grafted: RwLock<BTreeMap<u64, Arc<Graft>>>,
    io: Io,
    reported: Mutex<HashSet<u64>>,
    /// Extended attributes are served (see [`PkgFs::xattrs_served`]).
    xattrs: bool,
    /// What makes names on lookup, if the tree grows ([`PkgFs::growing`]); the lock
    /// serialises growth and its activation.
    grow: Option<(Arc<dyn Grow>, Mutex<()>)>,
    /// Request counters.
    pub stats: OpStats,
    /// Which READDIRPLUS entries go out plain (see `entries`; off until the mount turns
    /// it on).
    pub entries: entries::EntryPolicy,
    /// Told of every activation ([`PkgFs::on_change`]).
    changed: std::sync::OnceLock<ChangeHook>,
    /// Told of every name the tree grew by ([`PkgFs::on_grow`]).
    grown: std::sync::OnceLock<GrowHook>,
    /// Told of the retired inodes after every activation ([`PkgFs::on_retire`]).
    retiring: std::sync::OnceLock<RetireHook>,
    /// The epoch of the kernel's page cache ([`PkgFs::epoch`]).
    epoch: AtomicU32,
}

impl PkgFs {
    /// Assemble a fixed filesystem from its tree and the archives the tree refers to.
    pub fn new(tree: Tree, archives: Vec<Archive>, cache_bytes: u64) -> Self {
        let layers = archives
            .into_iter()
            .map(|a| Layer::new(Arc::new(a), 0))
            .collect();
        Self::with_layers(tree, layers, cache_bytes, false)
    }

    /// Assemble the filesystem; `live` prepares it for [`PkgFs::activate`].
    pub fn with_layers(tree: Tree, layers: Vec<Layer>, cache_bytes: u64, live: bool) -> Self {
        Self::with_grafts(tree, layers, Vec::new(), cache_bytes, live)
    }

    /// [`PkgFs::with_layers`] with the packages a layout grafts, indexed on first use.
    pub fn with_grafts(
        tree: Tree,
        layers: Vec<Layer>,
        grafts: Vec<Arc<Graft>>,
        cache_bytes: u64,
        live: bool,
    ) -> Self {
        let view = Arc::new(View::first(tree, layers).with_grafts(grafts));
        PkgFs {
            current: RwLock::new(view.clone()),
            inodes: Mutex::new(Inodes {
                current: view.clone(),
                counts: InoMap::default(),
                retired: InoMap::default(),
            }),
            live,
            next_ino: AtomicU64::new(view.tree.len() as u64 + 1),
            grafted: RwLock::new(BTreeMap::new()),
            io: Io::new(cache_bytes),
            reported: Mutex::new(HashSet::new()),
            xattrs: view.tree.has_xattrs,
            grow: None,
            stats: OpStats::default(),
            entries: entries::EntryPolicy::new(false),
            changed: std::sync::OnceLock::new(),
            grown: std::sync::OnceLock::new(),
            retiring: std::sync::OnceLock::new(),
            epoch: AtomicU32::new(1),
        }
    }

    /// The epoch of the kernel's page cache. What pkgfs knows the kernel holds (files
    /// read or pushed from their start, decoded ahead of a walk, asked of the disk:
    /// `view::MemberState`) holds for one epoch. The kernel does not say when it drops
    /// pages; a READ at offset 0 of a file it had whole in this epoch says so (memory
    /// pressure, `drop_caches`, `POSIX_FADV_DONTNEED`), and pages are dropped together:
    /// the epoch moves on and the directory read-ahead treats every file as new again.
    /// Without it a tree walked a second time after its pages were dropped got no
    /// read-ahead at all, and took twice as long as the first walk.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Relaxed)
    }

    /// The kernel asked again for a file it had whole in epoch `seen`: a new epoch
    /// (once, however many readers notice).
    fn pages_dropped(&self, seen: u32) {
        let next = seen.checked_add(1).unwrap_or(1);
        if self
            .epoch
            .compare_exchange(seen, next, Relaxed, Relaxed)
            .is_ok()
        {
            self.stats.page_drops.fetch_add(1, Relaxed);
            debug!("the kernel dropped pages it had: read-ahead starts over (epoch {next})");
        }
    }

    /// A filesystem whose tree grows on lookup through `grow` (see [`Grow`]): it starts
    /// from `tree` (its root, usually empty), counts references as a live mount does, and
    /// serves extended attributes whatever its first generation holds.
    pub fn growing(tree: Tree, cache_bytes: u64, grow: Arc<dyn Grow>) -> Self {
        let mut fs = Self::with_layers(tree, Vec::new(), cache_bytes, true);
        fs.xattrs = true;
        fs.grow = Some((grow, Mutex::new(())));
        fs
    }

    /// Whether the tree grows on lookup: a missing name is then not final (the kernel
    /// must not cache it) and `create`/`rmdir` are signals ([`Grow`]).
    pub fn grows(&self) -> bool {
        self.grow.is_some()
    }

    /// `create`/`mknod` of `name` in `parent`: a signal to [`Grow`], if the tree grows
    /// and it takes it as one; refused (`ReadOnly`) otherwise.
    pub fn created(&self, parent: u64, name: &[u8]) -> Result<()> {
        let (grow, _) = self.grow.as_ref().ok_or(Error::ReadOnly)?;
        let taken = self
            .top_path(parent)
            .is_some_and(|dir| grow.created(&dir, name));
        if taken { Ok(()) } else { Err(Error::ReadOnly) }
    }

    /// `rmdir` of `name` in `parent`: a signal to [`Grow`], if the tree grows.
    pub fn removed(&self, parent: u64, name: &[u8]) -> Result<()> {
        let (grow, _) = self.grow.as_ref().ok_or(Error::ReadOnly)?;
        if let Some(dir) = self.top_path(parent) {
            grow.removed(&dir, name);
        }
        Ok(())
    }

    /// The path of directory `ino` if it is a node of the current top generation (a
    /// graft's own directories have none there: what grows is the top).
    fn top_path(&self, ino: u64) -> Option<Vec<u8>> {
        let v = self.view();
        let l = v.local(ino)?;
        Some(v.tree.path_of(l))
    }

    /// A lookup of `name` in `parent` missed: grow the tree if it grows and the name
    /// comes to be. Only directories of the top generation grow (a graft is one
    /// package's own tree).
    fn grow_into(&self, parent: u64, name: &[u8]) -> Result<bool> {
        let Some((grow, serial)) = &self.grow else {
            return Ok(false);
        };
        let _one = lock(serial);
        // Another lookup may have grown it meanwhile.
        let v = self.view();
        let Some(pl) = v.local(parent) else {
            return Ok(false);
        };
        if v.graft_at(pl).is_some() {
            return Ok(false);
        }
        let dir = Self::node(&v, pl)?;
        if v.tree.lookup(dir, name).is_some() {
            return Ok(true);
        }
        let path = v.tree.path_of(pl);
        let Some((tree, layers, grafts)) = grow.grow(&path, name)? else {
            return Ok(false);
        };
        if let Some(f) = self.grown.get() {
            f(&path, name);
        }
        // Only names are added: the kernel has cached no entry of them (a growing tree's
        // misses are not cached), so there is nothing to invalidate.
        self.activate_with(tree, layers, grafts);
        Ok(true)
    }

    /// The current generation.
    pub fn view(&self) -> Arc<View> {
        crate::sync::read(&self.current).clone()
    }

    /// The global inode of a `/`-separated path in the current generation (entering
    /// grafts on the way, as lookups do).
    pub fn resolve(&self, path: &[u8]) -> Option<u64> {
        let mut ino = crate::tree::ROOT_INO;
        for comp in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            let (v, l) = self.dir(ino)?;
            let child = v.tree.lookup(v.tree.node(l)?, comp)?;
            ino = v.global(child);
        }
        Some(ino)
    }

    /// The read services (statistics, cache).
    pub fn io(&self) -> &Io {
        &self.io
    }

    /// How many inodes of older generations are still held by the kernel.
    pub fn retired_count(&self) -> usize {
        lock(&self.inodes).retired.len()
    }

    /// The generation and local node serving `ino`: the current generation (or one of
    /// its indexed grafts), else an older one the kernel still holds it from. A graft
    /// directory is served by the generation above it (its attributes need no index).
    pub(crate) fn find(&self, ino: u64) -> Result<(Arc<View>, u64)> {
        let v = self.view();
        if let Some(found) = self.locate(&v, ino) {
            return Ok(found);
        }
        if !self.live {
            return Err(Error::NotFound);
        }
        lock(&self.inodes)
            .retired
            .get(&ino)
            .cloned()
            .ok_or(Error::NotFound)
    }

    /// `ino` in generation `top` or in one of the grafts indexed so far.
    fn locate(&self, top: &Arc<View>, ino: u64) -> Option<(Arc<View>, u64)> {
        if let Some(l) = top.local(ino) {
            return Some((top.clone(), l));
        }
        {
            let grafted = crate::sync::read(&self.grafted);
            if let Some((_, g)) = grafted.range(..=ino).next_back()
                && let Some(v) = g.indexed()
                && let Some(l) = v.local(ino)
            {
                return Some((v.clone(), l));
            }
        }
        // A number in a graft not indexed here yet: given out by an earlier server
        // (`crate::keeper`), whose graft ranges are the same as ours. Index it now.
        let root = crate::tree::view::graft_root_of(ino)?;
        let rl = top.local(root)?;
        let g = top.graft_at(rl)?.clone();
        let v = self.enter(top, rl, &g);
        v.local(ino).map(|l| (v, l))
    }

    /// The generation and node whose children directory `ino` lists: for a graft, its
    /// package's own generation (indexed now if it is the first look into it). Current
    /// generation only: a directory no longer there has no children.
    pub(crate) fn dir(&self, ino: u64) -> Option<(Arc<View>, u64)> {
        let v = self.view();
        match v.local(ino) {
            Some(l) => match v.graft_at(l) {
                Some(g) => Some((self.enter(&v, l, g), crate::tree::ROOT_INO)),
                None => Some((v, l)),
            },
            None => self.locate(&v, ino),
        }
    }

    /// Graft `g` at node `l` of `v`, indexed on first use.
    fn enter(&self, v: &View, l: u64, g: &Arc<Graft>) -> Arc<View> {
        self.enter_graft(v, l, g, false)
    }

    /// [`PkgFs::enter`], by the read-ahead (`ahead`) or by a request.
    fn enter_graft(&self, v: &View, l: u64, g: &Arc<Graft>, ahead: bool) -> Arc<View> {
        let parent = v.tree.node(l).map_or(0, |n| v.global(n.parent));
        g.enter(v.global(l), parent, &self.next_ino, |made| {
            if ahead {
                self.stats.indexed_ahead.fetch_add(1, Relaxed);
            }
            let Some(range) = made.graft_range().filter(|r| !r.is_empty()) else {
                return;
            };
            let mut grafted = crate::sync::write(&self.grafted);
            grafted.insert(range.start, g.clone());
            // Removed by an activation while it was being indexed: not current.
            if g.retired.load(Relaxed) {
                grafted.remove(&range.start);
            }
        })
        .clone()
    }

    /// Packages placed by a layout in directories of their own: how many the current
    /// generation lists, how many have been indexed, how many of those failed.
    pub fn graft_counts(&self) -> (usize, usize, usize) {
        let v = self.view();
        let indexed = v.grafts.iter().filter(|g| g.indexed().is_some()).count();
        let failed = v.grafts.iter().filter(|g| g.error().is_some()).count();
        (v.grafts.len(), indexed, failed)
    }

    /// Count one kernel reference to `ino` (served by `view`'s node `local`).
    fn note_lookup(&self, inodes: &mut Inodes, ino: u64, view: &Arc<View>, local: u64) {
        *inodes.counts.entry(ino).or_insert(0) += 1;
        // An activation may have happened since `view` was read: keep what this
        // reference points at alive.
        if !Arc::ptr_eq(&inodes.current, view)
            && !inodes.retired.contains_key(&ino)
            && self.locate(&inodes.current, ino).is_none()
        {
            inodes.retired.insert(ino, (view.clone(), local));
        }
    }

    /// The kernel dropped `n` references to `ino`. Older generations are released once
    /// nothing refers to them (closing their archives).
    pub fn forget(&self, ino: u64, n: u64) {
        if !self.live {
            return;
        }
        let released = {
            let mut inodes = lock(&self.inodes);
            let left = match inodes.counts.get_mut(&ino) {
                Some(c) => {
                    *c = c.saturating_sub(n);
                    *c
                }
                None => return,
            };
            if left > 0 {
                return;
            }
            inodes.counts.remove(&ino);
            inodes.retired.remove(&ino)
        };
        // Dropping the last reference to a generation frees its tree: outside the lock.
        drop(released);
    }

    /// Swap in a new generation built from `tree` and `layers`. Returns the kernel cache
    /// entries that became stale. Activations must not run concurrently with each other
    /// (one watcher thread does them); requests run concurrently with it freely.
    pub fn activate(&self, tree: Tree, layers: Vec<Layer>) -> Activation {
        self.activate_with(tree, layers, Vec::new())
    }

    /// [`PkgFs::activate`] with the grafts of the new generation.
    pub fn activate_with(
        &self,
        tree: Tree,
        layers: Vec<Layer>,
        grafts: Vec<Arc<Graft>>,
    ) -> Activation {
        let old = self.view();
        let generation = old.generation + 1;
        let (view, invalidations) =
            crate::tree::view::carry_over(&old, tree, layers, grafts, generation, &self.next_ino);
        if let Some(f) = self.changed.get() {
            f(&view, self.next_ino.load(Relaxed));
        }
        let view = Arc::new(view);
        let kept: HashSet<*const Graft> = view.grafts.iter().map(Arc::as_ptr).collect();
        let gone: Vec<&Arc<Graft>> = old
            .grafts
            .iter()
            .filter(|g| !kept.contains(&Arc::as_ptr(g)))
            .collect();
        let retired = {
            let mut inodes = lock(&self.inodes);
            // Where each inode the kernel holds is served from before the swap.
            let before: Vec<(u64, Option<Served>)> = inodes
                .counts
                .keys()
                .filter(|ino| !inodes.retired.contains_key(ino))
                .map(|&ino| (ino, self.locate(&old, ino)))
                .collect();
            {
                let mut grafted = crate::sync::write(&self.grafted);
                for g in &gone {
                    g.retired.store(true, Relaxed);
                    if let Some(r) = g.indexed().and_then(|v| v.graft_range()) {
                        grafted.remove(&r.start);
                    }
                }
            }
            *crate::sync::write(&self.current) = view.clone();
            inodes.current = view.clone();
            for (ino, was) in before {
                if self.locate(&view, ino).is_none()
                    && let Some(was) = was
                {
                    inodes.retired.insert(ino, was);
                }
            }
            // An inode that came back (a package removed, then restored) is current again.
            let Inodes { retired, .. } = &mut *inodes;
            retired.retain(|ino, _| view.local(*ino).is_none());
            retired.len()
        };
        if let Some(f) = self.retiring.get() {
            f(&self.retired_inodes());
        }
        // Archives that only older generations use must stay open for them: they must
        // not be closed to save descriptors (their files may be gone).
        let live_keys: HashSet<u32> = view.layers.iter().map(|l| l.archive.key).collect();
        for l in &old.layers {
            if !live_keys.contains(&l.archive.key) {
                l.archive.blob.pin();
            }
        }
        for g in gone {
            for l in g.indexed().map(|v| &v.layers[..]).unwrap_or_default() {
                l.archive.blob.pin();
            }
        }
        Activation {
            generation,
            invalidations,
            retired,
        }
    }

    /// Call `f` with every new generation before the kernel can see it (a live
    /// change, a store's growth), and the next fresh inode number: its numbering then
    /// depends on history, and a keeper must hold it before any number of it is given
    /// out. Set once.
    pub fn on_change(&self, f: ChangeHook) {
        let _ = self.changed.set(f);
    }

    /// Call `f` with the directory and name of every lookup that grows the tree, before
    /// the new generation is made ([`PkgFs::on_change`] follows): a new server grows
    /// the same names in the same order to come to the same tree. Set once.
    pub fn on_grow(&self, f: GrowHook) {
        let _ = self.grown.set(f);
    }

    /// Look `name` up in the directory at `dir` as a lookup would, growing the tree if
    /// it grows (a new server repeating what an old one grew). Whether the name is
    /// there now.
    pub fn replay_growth(&self, dir: &[u8], name: &[u8]) -> Result<bool> {
        match self.resolve(dir) {
            Some(ino) => self.grow_into(ino, name),
            None => Ok(false),
        }
    }

    /// Call `f` after every activation with the inodes of older generations the kernel
    /// still holds (a file open in a package the activation removed): a keeper keeps
    /// their archives for a next server. Set once.
    pub fn on_retire(&self, f: RetireHook) {
        let _ = self.retiring.set(f);
    }

    /// Where inode `ino` is served from now (the current generation or an indexed
    /// graft), indexing the graft whose range holds it if need be.
    pub fn served(&self, ino: u64) -> Option<Retired> {
        self.locate(&self.view(), ino).map(|(v, l)| (ino, v, l))
    }

    /// The inodes of older generations the kernel still holds.
    pub fn retired_inodes(&self) -> Vec<Retired> {
        lock(&self.inodes)
            .retired
            .iter()
            .map(|(&ino, (v, l))| (ino, v.clone(), *l))
            .collect()
    }

    /// Serve `ino` from node `local` of `view` (an older generation an earlier server
    /// served it from), until the kernel forgets it. Only before serving.
    pub fn adopt_retired(&self, ino: u64, view: Arc<View>, local: u64) {
        let mut inodes = lock(&self.inodes);
        inodes.retired.insert(ino, (view, local));
        *inodes.counts.entry(ino).or_insert(0) += 1;
    }

    /// The current generation's numbering digest ([`numbering_digest`]).
    pub fn numbering_digest(&self) -> String {
        numbering_digest(&self.view())
    }

    /// Number the current generation as another server numbered the same tree
    /// (`table` from [`View::numbering_table`], `next_ino` its next fresh number).
    /// Only before the filesystem serves: the current generation must not be shared.
    pub fn adopt_numbering(&self, table: Vec<u64>, next_ino: u64) -> Result<()> {
        let mut current = crate::sync::write(&self.current);
        let mut inodes = lock(&self.inodes);
        let empty = Arc::new(View::first(
            crate::tree::TreeBuilder::new(crate::tree::Ownership::defaults(0, 0)).finish(),
            Vec::new(),
        ));
        inodes.current = empty.clone();
        let shared = std::mem::replace(&mut *current, empty);
        let mut view = match Arc::try_unwrap(shared) {
            Ok(v) => v,
            Err(shared) => {
                inodes.current = shared.clone();
                *current = shared;
                return Err(Error::Internal("the generation is in use".into()));
            }
        };
        let fits = view.set_numbering(table);
        let view = Arc::new(view);
        inodes.current = view.clone();
        *current = view;
        if !fits {
            return Err(Error::Internal(
                "the numbering does not fit this tree".into(),
            ));
        }
        self.next_ino.store(next_ino, Relaxed);
        Ok(())
    }

    /// The kernel now holds an inode of file `node` (see `prefetch`).
    fn note_known(v: &View, node: &Node) {
        if let Some(s) = v.tree.member_index(node).and_then(|i| v.member_state(i)) {
            s.known.store(true, Relaxed);
        }
    }

    fn attr_of(v: &View, local: u64, ino: u64, n: &Node) -> Attr {
        let rdev = if n.kind.is_special() {
            v.tree.extra(local).map_or(0, |x| fuse_rdev(x.rdev))
        } else {
            0
        };
        Attr {
            ino,
            kind: n.kind,
            perm: n.perm,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            size: n.size,
            blocks: n.size.div_ceil(512),
            mtime: n.mtime,
            rdev,
        }
    }

    fn node(view: &View, local: u64) -> Result<&Node> {
        view.tree.node(local).ok_or(Error::NotFound)
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.stats.getattrs.fetch_add(1, Relaxed);
        let (v, l) = self.find(ino)?;
        Ok(Self::attr_of(&v, l, ino, Self::node(&v, l)?))
    }

    /// Find `name` in directory `parent`. On a live mount this counts as one kernel
    /// reference to the inode returned.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.stats.lookups.fetch_add(1, Relaxed);
        // Lookups are answered from the current generation only: a directory that is no
        // longer there (someone's working directory in a removed package) is empty.
        let (v, pl) = self.dir(parent).ok_or(Error::NotFound)?;
        let dir = Self::node(&v, pl)?;
        if dir.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let (v, local) = match name {
            b"." => self.find(parent)?,
            b".." => self.find(v.parent_of(pl, dir))?,
            _ => match v.tree.lookup(dir, name) {
                Some(i) => (v.clone(), v.tree.canonical(i)),
                None if self.grow_into(parent, name)? => {
                    let v = self.view();
                    let pl = v.local(parent).ok_or(Error::NotFound)?;
                    let l = v
                        .tree
                        .lookup(Self::node(&v, pl)?, name)
                        .ok_or(Error::NotFound)?;
                    (v.clone(), v.tree.canonical(l))
                }
                None => return Err(Error::NotFound),
            },
        };
        let ino = v.global(local);
        let node = Self::node(&v, local)?;
        let attr = Self::attr_of(&v, local, ino, node);
        if node.kind != Kind::Dir {
            self.entries.looked_up(parent);
        }
        Self::note_known(&v, node);
        if self.live {
            self.note_lookup(&mut lock(&self.inodes), ino, &v, local);
        }
        Ok(attr)
    }

    /// List directory `ino` from `offset` (0 to start; then the `next_offset` of the last
    /// entry taken). `add` returns `true` when the caller's buffer is full (the entry was
    /// not taken). Entries come in a fixed order: `.`, `..`, then children in byte order
    /// of their names. With `plus` (READDIRPLUS), every entry taken other than `.` and
    /// `..` counts as a kernel reference, as a lookup does.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.stats.readdirs.fetch_add(1, Relaxed);
        let Some((v, dl)) = self.dir(ino) else {
            // Not in the current generation: a removed directory lists as empty.
            return match self.find(ino) {
                Ok((old, l)) if Self::node(&old, l)?.kind != Kind::Dir => Err(Error::NotDir),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
        };
        let dir = Self::node(&v, dl)?;
        if dir.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        // Positions: 0 is ".", 1 is "..", 2 + i is child i. Resuming at a large offset
        // must not walk the entries before it (directories can hold 100,000 names).
        // The dots carry the directory's own attributes (the kernel ignores them); ".."
        // of a graft's root is in the generation above.
        let dots = [
            (dl, v.global(dl), &b"."[..]),
            (dl, v.parent_of(dl, dir), &b".."[..]),
        ];
        let children = v
            .tree
            .children_from(dir, offset.saturating_sub(2))
            .map(|(i, n)| {
                let c = v.tree.canonical(i);
                (c, v.global(c), v.tree.name(n))
            });
        let entries = dots
            .into_iter()
            .skip(offset.min(2) as usize)
            .chain(children);
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let may_be_plain = plus && self.entries.plain_now();
        let mut plain = 0u64;
        for (pos, (child, child_ino, name)) in (offset..).zip(entries) {
            let node = Self::node(&v, child)?;
            // Directories always with attributes: a walk enters them.
            let is_plain = may_be_plain && pos >= 2 && node.kind != Kind::Dir;
            let full = add(DirEntry {
                ino: child_ino,
                next_offset: pos + 1,
                attr: Self::attr_of(&v, child, child_ino, node),
                name,
                plain: is_plain,
            });
            if full {
                break;
            }
            if is_plain {
                plain += 1;
            } else if plus && pos >= 2 {
                Self::note_known(&v, node);
                if self.live {
                    taken.push((child_ino, child));
                }
            }
        }
        self.entries.listed(ino, plain);
        if !taken.is_empty() {
            let mut inodes = lock(&self.inodes);
            for (ino, local) in taken {
                self.note_lookup(&mut inodes, ino, &v, local);
            }
        }
        Ok(())
    }

    /// Whether extended attributes are served: the first generation had some. (A mount
    /// without any answers `ENOSYS`, after which the kernel never asks again: an `exec`
    /// or an `ls -l` then costs no request for them.)
    pub fn xattrs_served(&self) -> bool {
        self.xattrs
    }

    /// The value of extended attribute `name` of `ino`.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let (v, l) = self.find(ino)?;
        let x = v.tree.extra(l).map_or(&[][..], |x| &x.xattrs[..]);
        x.binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .map(|i| x[i].1.clone())
            .map_err(|_| Error::NoXattr)
    }

    /// The names of the extended attributes of `ino`, each followed by a NUL.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let (v, l) = self.find(ino)?;
        let mut out = Vec::new();
        for (name, _) in v.tree.extra(l).map_or(&[][..], |x| &x.xattrs[..]) {
            out.extend_from_slice(name);
            out.push(0);
        }
        Ok(out)
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.stats.readlinks.fetch_add(1, Relaxed);
        let (v, l) = self.find(ino)?;
        let node = Self::node(&v, l)?;
        if node.kind != Kind::Symlink {
            return Err(Error::NotSymlink);
        }
        if node.size == 0 || node.size > MAX_LINK {
            return self.report(
                &v,
                l,
                ino,
                Error::Corrupt(format!("symlink target of {} bytes", node.size)),
            );
        }
        let target = self
            .read_node(&v, l, ino, node, 0, node.size as u32, Span::Whole)?
            .into_vec();
        if target.contains(&0) {
            return self.report(
                &v,
                l,
                ino,
                Error::Corrupt("symlink target contains NUL".into()),
            );
        }
        Ok(target)
    }

    /// Read up to `size` bytes of file `ino` at `offset`.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_shared(ino, offset, size).map(ReadData::into_vec)
    }

    /// [`PkgFs::read`] without a copy where the bytes lie in one cached block.
    pub fn read_shared(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData> {
        self.stats.reads.fetch_add(1, Relaxed);
        self.entries.interest();
        let (v, l) = self.find(ino)?;
        let node = Self::node(&v, l)?;
        let data = match node.kind {
            Kind::Dir => Err(Error::IsDir),
            _ => {
                if offset == 0 {
                    // The kernel is reading the file from its start: it will have it.
                    if let Some(state) = v.tree.member_index(node).and_then(|i| v.member_state(i)) {
                        let e = self.epoch();
                        if state.requested.is(e) || state.pushed.is(e) {
                            // It had the file whole: its pages were dropped.
                            self.pages_dropped(e);
                        }
                        let e = self.epoch();
                        state.requested.set(e);
                        state.cached.set(e);
                    }
                }
                self.read_node(&v, l, ino, node, offset, size, Span::Whole)
            }
        }?;
        self.stats.read_bytes.fetch_add(data.len() as u64, Relaxed);
        Ok(data)
    }

    /// Read `size` bytes at `offset` of `node` (local node `local`, inode `ino` of view
    /// `v`), all of them or, with [`Span::Piece`], as far as one decoded block goes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_node(
        &self,
        v: &View,
        local: u64,
        ino: u64,
        node: &Node,
        offset: u64,
        size: u32,
        span: Span,
    ) -> Result<ReadData> {
        let found = v
            .tree
            .member(node)
            .and_then(|m| Some((m, v.layers.get(m.archive as usize)?)));
        let Some((member, layer)) = found else {
            return self.report(v, local, ino, Error::Format("file has no data".into()));
        };
        match layer
            .archive
            .read(&self.io, &member.loc, member.size, offset, size, span)
        {
            Ok(data) => Ok(data),
            Err(e) => self.report(v, local, ino, e),
        }
    }

    /// The kernel has been given bytes `[offset, offset + len)` of inode `ino` and keeps
    /// them in its page cache (the FUSE adapter says so after a READ): decoded blocks it
    /// now holds entirely leave the block cache.
    pub fn delivered(&self, ino: u64, offset: u64, len: u64) {
        if let Ok((v, l)) = self.find(ino) {
            self.delivered_node(&v, l, offset, len);
        }
    }

    /// [`PkgFs::delivered`] for local node `local` of view `v`.
    pub(crate) fn delivered_node(&self, v: &View, local: u64, offset: u64, len: u64) {
        let Some(m) = v.tree.node(local).and_then(|n| v.tree.member(n)) else {
            return;
        };
        if let Some(layer) = v.layers.get(m.archive as usize) {
            layer
                .archive
                .delivered(&self.io, &m.loc, m.size, offset, offset.saturating_add(len));
        }
    }

    /// Start reading the archive bytes of `files` (local nodes of view `v`), which are
    /// about to be decoded: each archive is asked for its extents of them once they are
    /// sorted and merged ([`crate::io::advice`]: nothing if the walk visits them in
    /// archive order, which the kernel's own read-ahead follows). Each member is asked
    /// for once an epoch (a walk plans the same files again each time the reader moves).
    pub(crate) fn will_need(&self, v: &View, files: &[u64]) {
        let epoch = self.epoch();
        let mut wanted: Vec<(u32, (u64, u64))> = files
            .iter()
            .filter_map(|&local| {
                let n = v.tree.node(local)?;
                let m = v.tree.member(n)?;
                let state = v.member_state(v.tree.member_index(n)?)?;
                if state.advised.test_and_set(epoch) {
                    return None;
                }
                let layer = v.layers.get(m.archive as usize)?;
                Some((m.archive, layer.archive.extent(&self.io, &m.loc, m.size)?))
            })
            .collect();
        // Stable: each archive's extents stay in walk order.
        wanted.sort_by_key(|&(a, _)| a);
        for group in wanted.chunk_by(|x, y| x.0 == y.0) {
            if let Some(layer) = v.layers.get(group[0].0 as usize) {
                let extents = group.iter().map(|&(_, e)| e).collect();
                let blob = &layer.archive.blob;
                let advice = if blob.round_trips() {
                    crate::io::merged(extents)
                } else {
                    crate::io::advice(extents)
                };
                blob.will_need(&advice);
            }
        }
    }

    /// Log a data error once per inode, naming the file and its archive, and return it.
    fn report<T>(&self, v: &View, local: u64, ino: u64, e: Error) -> Result<T> {
        self.stats.errors.fetch_add(1, Relaxed);
        let first = lock(&self.reported).insert(ino);
        if first {
            let archive = v
                .tree
                .node(local)
                .and_then(|n| v.layers.get(n.archive as usize))
                .map_or_else(|| "?".into(), |l| l.archive.path.display().to_string());
            warn!(
                "read error in /{} (from {archive}): {e}; reads return EIO",
                String::from_utf8_lossy(&v.tree.path_of(local))
            );
        }
        Err(e)
    }

    /// Filesystem statistics.
    pub fn statfs(&self) -> StatFs {
        let v = self.view();
        StatFs {
            blocks: v.tree.total_bytes.div_ceil(u64::from(BLKSIZE)),
            files: v.tree.len() as u64,
            bsize: BLKSIZE,
            namelen: crate::tree::path::NAME_MAX as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Entry, EntryKind, Loc};
    use crate::tree::{Ownership, ROOT_INO as ROOT, TreeBuilder};

    #[test]
    fn readdir_resumes_at_any_offset_in_name_order() {
        let entries: Vec<Entry> = (0..50)
            .rev()
            .map(|i| Entry {
                path: format!("d/f{i:02}").into_bytes(),
                kind: EntryKind::Dir,
                perm: 0o755,
                mtime: 0,
                uid: None,
                gid: None,
                size: 0,
                data: Loc::None,
                link: Vec::new(),
                rdev: 0,
                xattrs: Vec::new(),
            })
            .collect();
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        b.add_layer(0, 0, &entries);
        let fs = PkgFs::new(b.finish(), Vec::new(), 0);
        let d = fs.lookup(1, b"d").unwrap().ino;
        let list = |from: u64, max: usize| {
            let mut got = Vec::new();
            fs.readdir(d, from, false, |e| {
                got.push((String::from_utf8_lossy(e.name).into_owned(), e.next_offset));
                got.len() == max
            })
            .unwrap();
            got
        };
        let all = list(0, usize::MAX);
        assert_eq!(all.len(), 52);
        assert_eq!(
            (all[0].0.as_str(), all[1].0.as_str(), all[2].0.as_str()),
            (".", "..", "f00")
        );
        // Reading in pages of 7 entries gives the same listing.
        let mut paged = Vec::new();
        let mut off = 0;
        loop {
            let page = list(off, 7);
            if page.is_empty() {
                break;
            }
            off = page.last().unwrap().1;
            paged.extend(page);
        }
        assert_eq!(paged, all);
        assert!(list(52, 10).is_empty());
        assert_eq!(list(51, 10)[0].0, "f49");
    }

    #[test]
    fn a_new_filesystem_takes_the_numbering_an_activated_one_gave_out() {
        use crate::tree::view::testing::{archive, build, file};
        let (a, b, c) = (archive("a"), archive("b"), archive("c"));
        let la = vec![file("d/a1", 1), file("d/a2", 2)];
        let lb = vec![file("d/b1", 3), file("e/b2", 4)];
        let lc = vec![file("d/c1", 5), file("f/c2", 6)];
        let (t, l) = build(&[(a.clone(), la.clone()), (b.clone(), lb.clone())]);
        let old = PkgFs::with_layers(t, l, 0, true);
        let heard = Arc::new(Mutex::new(None));
        let h = heard.clone();
        old.on_change(Box::new(move |v, next| {
            *lock(&h) = Some((numbering_digest(v), v.numbering_table(), next));
        }));
        // b replaced by c: d/b1 and e go, d/c1 and f come with fresh numbers.
        let (t, l) = build(&[(a.clone(), la.clone()), (c.clone(), lc.clone())]);
        old.activate(t, l);
        let (digest, table, next) = lock(&heard).take().expect("told of the generation");
        assert_eq!(
            digest,
            old.numbering_digest(),
            "told before the swap, of the same tree"
        );

        // A new server scans the same sources: the same tree, first-generation numbers.
        let (t, l) = build(&[(a, la), (c, lc)]);
        let new = PkgFs::with_layers(t, l, 0, true);
        assert_eq!(new.numbering_digest(), digest);
        let paths: [&[u8]; 6] = [b"d", b"d/a1", b"d/a2", b"d/c1", b"f", b"f/c2"];
        let differs = paths.iter().any(|p| new.resolve(p) != old.resolve(p));
        assert!(differs, "without the table the numbers differ");
        new.adopt_numbering(table, next).unwrap();
        for p in paths {
            let ino = old.resolve(p).unwrap();
            assert_eq!(new.resolve(p), Some(ino), "{}", String::from_utf8_lossy(p));
            assert_eq!(
                new.getattr(ino).unwrap().size,
                old.getattr(ino).unwrap().size
            );
        }
        assert!(
            new.adopt_numbering(vec![1], next).is_err(),
            "a table of another tree"
        );
    }

    #[test]
    fn plain_entries_are_not_references_and_a_lookup_makes_listings_full() {
        use crate::tree::view::testing::{archive, build, file};
        let mount = |plain: bool| {
            let (t, l) = build(&[(archive("a"), vec![file("d/f", 1), file("d/sub/g", 2)])]);
            let fs = PkgFs::with_layers(t, l, 0, true);
            fs.entries.set_enabled(plain);
            let d = fs.lookup(ROOT, b"d").unwrap().ino;
            // Listings go plain after a run of quiet ones (the root's, here).
            for _ in 0..entries::QUIET_LISTINGS {
                fs.readdir(ROOT, 0, true, |_| false).unwrap();
            }
            (fs, d)
        };
        let list = |fs: &PkgFs, d: u64, plus: bool| {
            let mut got = Vec::new();
            fs.readdir(d, 0, plus, |e| {
                got.push((String::from_utf8_lossy(e.name).into_owned(), e.plain));
                false
            })
            .unwrap();
            got
        };
        let entry = |name: &str, plain: bool| (name.to_string(), plain);
        let without_f = || build(&[(archive("b"), vec![file("d/sub/g", 2)])]);
        // READDIR has no attributes to leave out; READDIRPLUS leaves out the file's.
        let (fs, d) = mount(true);
        assert!(list(&fs, d, false).iter().all(|(_, p)| !p));
        assert_eq!(
            list(&fs, d, true),
            [
                entry(".", false),
                entry("..", false),
                entry("f", true),
                entry("sub", false)
            ]
        );
        // A plain entry is no kernel reference: an activation without it retires
        // nothing, where the same listing with full entries holds it.
        let (t, l) = without_f();
        assert_eq!(fs.activate(t, l).retired, 0);
        let (full, fd) = mount(false);
        assert!(list(&full, fd, true).iter().all(|(_, p)| !p));
        let (t, l) = without_f();
        assert_eq!(full.activate(t, l).retired, 1);
        // A lookup of a name listed plain: listings are full from then on.
        let (fs, d) = mount(true);
        list(&fs, d, true);
        fs.lookup(d, b"f").unwrap();
        assert_eq!(fs.entries.switched.load(Relaxed), 1);
        assert!(list(&fs, d, true).iter().all(|(_, p)| !p));
    }

    #[test]
    fn retired_inodes_are_served_until_forgotten() {
        use crate::tree::view::testing::{archive, build, file};
        let a = archive("a");
        let b = archive("b");
        let la = vec![file("d/keep", 1)];
        let lb = vec![file("d/gone", 2)];
        let (t, l) = build(&[(a.clone(), la.clone()), (b.clone(), lb)]);
        let fs = PkgFs::with_layers(t, l, 0, true);
        let d = fs.lookup(ROOT, b"d").unwrap().ino;
        let gone = fs.lookup(d, b"gone").unwrap().ino;
        // Listed twice by READDIRPLUS: two more references ("." and ".." are not).
        for _ in 0..2 {
            fs.readdir(d, 0, true, |_| false).unwrap();
        }
        let keep = fs.resolve(b"d/keep").unwrap();
        let weak_b = Arc::downgrade(&b);
        drop(b);
        let (t, l) = build(&[(a, la)]);
        let act = fs.activate(t, l);
        assert_eq!(act.retired, 1, "only d/gone is referenced and gone");
        assert!(fs.lookup(d, b"gone").is_err(), "the new tree has no d/gone");
        assert_eq!(fs.getattr(gone).unwrap().ino, gone, "still served");
        assert_eq!(fs.resolve(b"d/keep"), Some(keep), "unchanged: same inode");
        fs.forget(gone, 2);
        assert!(fs.getattr(gone).is_ok());
        assert!(
            weak_b.upgrade().is_some(),
            "the old generation holds archive b"
        );
        fs.forget(gone, 1);
        assert!(fs.getattr(gone).is_err());
        assert_eq!(fs.retired_count(), 0);
        assert!(
            weak_b.upgrade().is_none(),
            "archive b is released with its generation"
        );
    }

    fn node(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            perm: 0o644,
            mtime: 0,
            uid: None,
            gid: None,
            size: 0,
            data: Loc::None,
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn devices_fifos_and_extended_attributes_are_served() {
        let x = |n: &str, v: &str| (n.as_bytes().to_vec(), v.as_bytes().to_vec());
        let mut null = node("dev/null", EntryKind::CharDev);
        null.rdev = libc::makedev(1, 3);
        null.size = 99; // a device has no data, whatever the archive says
        let mut disk = node("dev/sda", EntryKind::BlockDev);
        disk.rdev = libc::makedev(8, 0x123);
        let mut ping = node("bin/ping", EntryKind::File);
        ping.xattrs = vec![
            x("user.z", "1"),
            x("security.capability", "caps"),
            x("user.z", "2"),
        ];
        let mut link = node("bin/ping6", EntryKind::HardLink);
        link.link = b"bin/ping".to_vec();
        let entries = vec![
            null,
            disk,
            node("run/fifo", EntryKind::Fifo),
            node("run/sock", EntryKind::Socket),
            ping,
            link,
        ];
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        b.add_layer(0, 0, &entries);
        let fs = PkgFs::new(b.finish(), Vec::new(), 0);
        assert!(fs.xattrs_served());
        let at = |p: &str| fs.getattr(fs.resolve(p.as_bytes()).unwrap()).unwrap();
        let n = at("dev/null");
        assert_eq!((n.kind, n.size, n.rdev), (Kind::CharDev, 0, 0x103));
        let d = at("dev/sda");
        // minor 0x123: low byte in bits 0-7, the rest from bit 20 (new_encode_dev).
        assert_eq!(
            (d.kind, d.rdev),
            (Kind::BlockDev, 0x23 | (8 << 8) | (1 << 20))
        );
        assert_eq!(at("run/fifo").kind, Kind::Fifo);
        assert_eq!(at("run/sock").kind, Kind::Socket);
        assert_eq!(at("run/fifo").rdev, 0);
        let ping = fs.resolve(b"bin/ping").unwrap();
        assert_eq!(
            fs.listxattr(ping).unwrap(),
            b"security.capability\0user.z\0"
        );
        assert_eq!(
            fs.getxattr(ping, b"user.z").unwrap(),
            b"2",
            "the last value wins"
        );
        assert_eq!(fs.getxattr(ping, b"security.capability").unwrap(), b"caps");
        assert!(matches!(fs.getxattr(ping, b"user.y"), Err(Error::NoXattr)));
        let ping6 = fs.resolve(b"bin/ping6").unwrap();
        assert_eq!(fs.listxattr(ping6).unwrap(), fs.listxattr(ping).unwrap());
        let null = fs.resolve(b"dev/null").unwrap();
        assert_eq!(fs.listxattr(null).unwrap(), b"");
        // A tree without any extended attribute does not serve them.
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        b.add_layer(0, 0, &entries[..4]);
        assert!(!PkgFs::new(b.finish(), Vec::new(), 0).xattrs_served());
    }

    /// A package of `files` (name, bytes) that counts how often it is indexed.
    #[derive(Debug)]
    struct Counted {
        name: std::path::PathBuf,
        version: String,
        files: Vec<(&'static str, &'static str)>,
        fail: bool,
        indexed: Arc<AtomicU64>,
    }

    impl crate::tree::view::GraftSource for Counted {
        fn name(&self) -> &std::path::Path {
            &self.name
        }
        fn version(&self) -> &str {
            &self.version
        }
        fn index(&self) -> Result<(Tree, Vec<Layer>)> {
            self.indexed.fetch_add(1, Relaxed);
            // Readers arriving meanwhile must wait for this one, not index again.
            std::thread::sleep(std::time::Duration::from_millis(50));
            if self.fail {
                return Err(Error::Corrupt("a damaged package".into()));
            }
            let entries: Vec<Entry> = self
                .files
                .iter()
                .map(|(p, data)| {
                    crate::layout::inline_file(p.as_bytes(), data.as_bytes(), 0o644, 7)
                })
                .collect();
            let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
            b.add_layer(0, 7, &entries);
            let layers = vec![Layer::new(
                crate::layout::own_archive("test", entries.clone()),
                entries.len(),
            )];
            Ok((b.finish(), layers))
        }
    }

    fn grafted(
        names: &[&str],
        fail: &[&str],
        counter: &Arc<AtomicU64>,
        live: bool,
    ) -> (Tree, Vec<Arc<Graft>>) {
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        let mut grafts = Vec::new();
        for (i, n) in names.iter().enumerate() {
            assert!(b.add_graft(&[n.as_bytes()], i as u32, u32::MAX, 5));
            grafts.push(Arc::new(Graft::new(Box::new(Counted {
                name: n.into(),
                version: format!("{n}-{live}"),
                files: vec![("lib/a.txt", "alpha"), ("b.txt", "beta")],
                fail: fail.contains(n),
                indexed: counter.clone(),
            }))));
        }
        (b.finish(), grafts)
    }

    #[test]
    fn decoding_ahead_of_a_walk_goes_on_into_the_next_packages_and_indexes_only_those() {
        let counter = Arc::new(AtomicU64::new(0));
        let names = ["p1", "p2", "p3", "p4", "p5"];
        let (tree, grafts) = grafted(&names, &[], &counter, false);
        let fs = Arc::new(PkgFs::with_grafts(tree, Vec::new(), grafts, 1 << 20, false));
        // Walk order in a package: b.txt, lib, lib/a.txt.
        let last = |p: &str| fs.resolve(format!("{p}/lib/a.txt").as_bytes()).unwrap();
        let mut w = crate::fs::prefetch::Warmer::new(fs.clone());
        // A walk in one package: the scan stops at its end (a walk of p1's directory
        // alone is not heading for p2).
        assert_eq!(w.warm(last("p1"), 9, &|| false), 0);
        assert_eq!(fs.graft_counts(), (5, 1, 0));
        // The walk goes on to p2: now it crosses. A window of 9 bytes (a package's two
        // files): p3's are decoded, p4 scanned (the scan holds two windows), p5 never
        // reached.
        assert_eq!(w.warm(last("p2"), 9, &|| false), 9);
        assert_eq!(fs.graft_counts(), (5, 4, 0));
        assert_eq!(counter.load(Relaxed), 4, "each indexed once");
        assert_eq!(fs.stats.indexed_ahead.load(Relaxed), 2);
        // The walker arrives in p3: nothing is indexed again; the next step reaches p5.
        assert_eq!(w.warm(last("p3"), 9, &|| false), 9);
        assert_eq!(counter.load(Relaxed), 5);
        // The end of the last package ends the walk.
        assert_eq!(w.warm(last("p5"), 9, &|| false), 0);
        // Back to an earlier package: no crossing (a random reader).
        let mut w = crate::fs::prefetch::Warmer::new(fs.clone());
        w.warm(last("p4"), 9, &|| false);
        assert_eq!(w.warm(last("p1"), 9, &|| false), 0);
    }

    #[test]
    fn a_graft_numbers_alike_in_any_order_and_an_unindexed_ones_inode_indexes_it() {
        let counter = Arc::new(AtomicU64::new(0));
        let (tree, grafts) = grafted(&["p1", "p2"], &[], &counter, false);
        let old = PkgFs::with_grafts(tree, Vec::new(), grafts, 1 << 20, true);
        let p2 = old.lookup(ROOT, b"p2").unwrap();
        let b2 = old.lookup(p2.ino, b"b.txt").unwrap();
        let p1 = old.lookup(ROOT, b"p1").unwrap();
        let lib1 = old.lookup(p1.ino, b"lib").unwrap();
        // A new server of the same sources, asked first for numbers the old one gave
        // out (the kernel still holds them), in another order.
        let (tree, grafts) = grafted(&["p1", "p2"], &[], &counter, false);
        let new = PkgFs::with_grafts(tree, Vec::new(), grafts, 1 << 20, true);
        assert_eq!(new.getattr(lib1.ino).unwrap().kind, Kind::Dir);
        assert_eq!(new.lookup(lib1.ino, b"a.txt").unwrap().size, 5);
        assert_eq!(new.read(b2.ino, 0, 100).unwrap(), b"beta");
        assert_eq!(
            new.lookup(new.lookup(ROOT, b"p2").unwrap().ino, b"b.txt")
                .unwrap()
                .ino,
            b2.ino
        );
    }

    #[test]
    fn a_graft_is_indexed_once_on_first_look_and_its_stat_needs_no_index() {
        let counter = Arc::new(AtomicU64::new(0));
        let (tree, grafts) = grafted(&["p1", "p2", "bad"], &["bad"], &counter, false);
        let fs = Arc::new(PkgFs::with_grafts(tree, Vec::new(), grafts, 1 << 20, true));
        let p1 = fs.lookup(ROOT, b"p1").unwrap();
        assert_eq!(p1.kind, Kind::Dir);
        assert_eq!(p1.mtime, 5);
        fs.getattr(p1.ino).unwrap();
        let mut names = Vec::new();
        fs.readdir(ROOT, 0, true, |e| {
            names.push(e.name.to_vec());
            false
        })
        .unwrap();
        assert_eq!(names.len(), 5);
        assert_eq!(
            fs.graft_counts(),
            (3, 0, 0),
            "nothing indexed by stat and listing"
        );
        assert_eq!(counter.load(Relaxed), 0);
        // Eight first readers at once: one index.
        let inos: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| fs.lookup(p1.ino, b"b.txt").unwrap().ino))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(inos.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(counter.load(Relaxed), 1);
        assert_eq!(fs.graft_counts(), (3, 1, 0));
        assert_eq!(fs.read(inos[0], 0, 100).unwrap(), b"beta");
        let lib = fs.lookup(p1.ino, b"lib").unwrap();
        let a = fs.lookup(lib.ino, b"a.txt").unwrap();
        assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"alpha");
        assert_eq!(fs.lookup(lib.ino, b"..").unwrap().ino, p1.ino);
        assert_eq!(fs.lookup(p1.ino, b"..").unwrap().ino, ROOT);
        // Inodes of two packages never meet.
        let p2 = fs.lookup(ROOT, b"p2").unwrap();
        let b2 = fs.lookup(p2.ino, b"b.txt").unwrap();
        assert_ne!(b2.ino, inos[0]);
        assert_eq!(fs.getattr(inos[0]).unwrap().size, 4);
        // A package whose index fails is an empty directory, counted.
        let bad = fs.lookup(ROOT, b"bad").unwrap();
        let mut n = 0;
        fs.readdir(bad.ino, 0, false, |_| {
            n += 1;
            false
        })
        .unwrap();
        assert_eq!(n, 2, "only . and ..");
        assert_eq!(fs.graft_counts(), (3, 3, 1));
    }

    #[test]
    fn a_replaced_graft_is_a_new_directory_and_held_inodes_stay_served() {
        let counter = Arc::new(AtomicU64::new(0));
        let (tree, grafts) = grafted(&["p1", "p2"], &[], &counter, false);
        let keep = grafts[1].clone();
        let fs = PkgFs::with_grafts(tree, Vec::new(), grafts, 1 << 20, true);
        let p1 = fs.lookup(ROOT, b"p1").unwrap();
        let held = fs.lookup(p1.ino, b"b.txt").unwrap();
        let p2 = fs.lookup(ROOT, b"p2").unwrap();
        let p2b = fs.lookup(p2.ino, b"b.txt").unwrap();
        // p1 replaced by another version, p2 unchanged.
        let (tree, mut grafts) = grafted(&["p1", "p2"], &[], &counter, true);
        grafts[1] = keep;
        let act = fs.activate_with(tree, Vec::new(), grafts);
        assert!(act.invalidations.iter().any(
            |i| matches!(i, Invalidation::Delete { name, old, .. } if name == b"p1" && *old == p1.ino)
        ));
        let p1_new = fs.lookup(ROOT, b"p1").unwrap();
        assert_ne!(p1_new.ino, p1.ino, "a replaced package is a new directory");
        assert_eq!(fs.lookup(ROOT, b"p2").unwrap().ino, p2.ino);
        assert_eq!(
            fs.lookup(p2.ino, b"b.txt").unwrap().ino,
            p2b.ino,
            "kept, not re-indexed"
        );
        // The old version's file the kernel holds is still served.
        assert_eq!(fs.read(held.ino, 0, 10).unwrap(), b"beta");
        assert_eq!(fs.retired_count(), 2, "the old p1 and its b.txt");
        fs.forget(held.ino, 1);
        fs.forget(p1.ino, 1);
        assert_eq!(fs.retired_count(), 0);
        assert!(fs.getattr(held.ino).is_err());
    }

    /// A namespace where every lookup in the root of a name starting `pkg` makes that
    /// name a graft, and signals are recorded.
    #[derive(Default)]
    struct Growing {
        made: Mutex<Vec<String>>,
        grafts: Mutex<Vec<Arc<Graft>>>,
        signals: Mutex<Vec<String>>,
        counter: Arc<AtomicU64>,
    }

    impl Grow for Growing {
        fn grow(&self, dir: &[u8], name: &[u8]) -> Result<Option<Generation>> {
            if !dir.is_empty() || !name.starts_with(b"pkg") {
                return Ok(None);
            }
            let mut made = lock(&self.made);
            let mut grafts = lock(&self.grafts);
            made.push(String::from_utf8_lossy(name).into_owned());
            grafts.push(Arc::new(Graft::new(Box::new(Counted {
                name: String::from_utf8_lossy(name).into_owned().into(),
                version: "1".into(),
                files: vec![("a.txt", "alpha")],
                fail: false,
                indexed: self.counter.clone(),
            }))));
            let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
            for (i, n) in made.iter().enumerate() {
                assert!(b.add_graft(&[n.as_bytes()], i as u32, u32::MAX, 5));
            }
            Ok(Some((b.finish(), Vec::new(), grafts.clone())))
        }
        fn created(&self, dir: &[u8], name: &[u8]) -> bool {
            lock(&self.signals).push(format!(
                "create {}/{}",
                String::from_utf8_lossy(dir),
                String::from_utf8_lossy(name)
            ));
            true
        }
        fn removed(&self, dir: &[u8], name: &[u8]) {
            lock(&self.signals).push(format!(
                "rmdir {}/{}",
                String::from_utf8_lossy(dir),
                String::from_utf8_lossy(name)
            ));
        }
    }

    #[test]
    fn a_growing_tree_makes_names_on_lookup_and_keeps_their_inodes() {
        let grow = Arc::new(Growing::default());
        let fs = PkgFs::growing(
            TreeBuilder::new(Ownership::defaults(0, 0)).finish(),
            1 << 20,
            grow.clone(),
        );
        assert!(fs.grows() && fs.xattrs_served());
        assert!(matches!(fs.lookup(ROOT, b"other"), Err(Error::NotFound)));
        let a = fs.lookup(ROOT, b"pkg-a").unwrap();
        let a_file = fs.lookup(a.ino, b"a.txt").unwrap();
        assert_eq!(fs.read(a_file.ino, 0, 100).unwrap(), b"alpha");
        // A second name: a new generation, the first name's inodes unchanged.
        let b = fs.lookup(ROOT, b"pkg-b").unwrap();
        assert_ne!(a.ino, b.ino);
        assert_eq!(fs.lookup(ROOT, b"pkg-a").unwrap().ino, a.ino);
        assert_eq!(fs.lookup(a.ino, b"a.txt").unwrap().ino, a_file.ino);
        assert_eq!(fs.read(a_file.ino, 0, 100).unwrap(), b"alpha");
        // Looked up again: not made again, not indexed again.
        assert_eq!(lock(&grow.made).len(), 2);
        assert_eq!(grow.counter.load(Relaxed), 1);
        // Inside a graft nothing grows.
        assert!(matches!(fs.lookup(a.ino, b"pkg-c"), Err(Error::NotFound)));
        assert_eq!(lock(&grow.made).len(), 2);
        // Signals name the directory they came to (in the top generation only).
        fs.created(a.ino, b"use").unwrap();
        fs.created(fs.lookup(a.ino, b".").unwrap().ino, b"again")
            .unwrap();
        fs.removed(ROOT, b"pkg-a").unwrap();
        // Not a signal: refused.
        assert!(matches!(
            fs.created(a_file.ino, b"inside-a-graft"),
            Err(Error::ReadOnly)
        ));
        assert_eq!(
            *lock(&grow.signals),
            ["create pkg-a/use", "create pkg-a/again", "rmdir /pkg-a"]
        );
        // A tree that does not grow refuses them.
        let fixed = PkgFs::new(
            TreeBuilder::new(Ownership::defaults(0, 0)).finish(),
            Vec::new(),
            0,
        );
        assert!(matches!(fixed.created(ROOT, b"use"), Err(Error::ReadOnly)));
    }
}
