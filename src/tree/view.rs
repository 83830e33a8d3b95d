//! Generations of the mounted tree, and inode numbers that outlive them.
//!
//! A [`View`] is one immutable generation: a merged [`Tree`], the archives it was built
//! from, and the map between the tree's own node numbers ("local" numbers, breadth-first
//! from 1) and the inode numbers the kernel knows ("global" numbers).
//!
//! The first generation uses its local numbers as inode numbers. When packages are added,
//! removed or replaced under a live mount, a new generation is built from scratch and
//! [`carry_over`] walks the old and new trees side by side, by path, so that everything
//! that did not change keeps its inode number (and with it the kernel's cached entries,
//! attributes and pages), while anything that changed gets a number never used before.
//! The walk also yields the exact list of kernel cache entries to invalidate: a name
//! whose inode changed, appeared or disappeared, and a directory whose listing or
//! attributes changed. Nothing else is touched, so long cache timeouts stay safe.
//!
//! What counts as unchanged:
//! - a directory at the same path stays the same inode (its listing may change);
//! - a file or symlink stays the same inode only if it comes from the *same archive
//!   file* (the same open archive object, not just the same path) at the same place in
//!   it, with the same attributes. A package replaced by a new version gets new inodes
//!   for all its files: without reading data pkgfs cannot prove a member's bytes equal.
//! - a [`Graft`] directory (a package of a layout that gives each package a directory,
//!   indexed on first use) stays the same inode only while it is the same graft: a
//!   package replaced at that path is a new directory.
//!
//! A graft's contents are a generation of their own ([`View`] with graft numbering):
//! made once, the first time the directory is looked into, from the package alone. Its
//! root is the graft directory's inode; its other nodes take a range of fresh inode
//! numbers, so the top generation never changes when a package is indexed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::Error;
use crate::format::Archive;
use crate::tree::{Kind, Node, Ownership, ROOT_INO, Tree, TreeBuilder};

/// A fast hasher for inode numbers (they are already well spread, and not chosen by an
/// attacker).
#[derive(Default)]
pub struct InoHasher(u64);

impl Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map keyed by inode number.
pub type InoMap<V> = HashMap<u64, V, BuildHasherDefault<InoHasher>>;

/// One archive of a generation.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The archive.
    pub archive: Arc<Archive>,
    /// How many entries its index holds.
    pub entries: usize,
    /// Where a layout folded its entries in, other than at the root: each place's
    /// prefix, `/`-joined (npm's `node_modules/NAME`). Empty: at the root alone.
    pub places: Vec<Vec<u8>>,
}

impl Layer {
    /// `archive`, whose index holds `entries` entries, at the root.
    pub fn new(archive: Arc<Archive>, entries: usize) -> Layer {
        Layer {
            archive,
            entries,
            places: Vec::new(),
        }
    }
}

/// A fact about a member that holds for one epoch of the kernel's page cache
/// (`fs::PkgFs::epoch`): set in an epoch, it reads as unset once the epoch has moved on.
/// Epochs start at 1; 0 is never.
#[derive(Debug, Default)]
pub struct Mark(AtomicU32);

impl Mark {
    /// Whether it was set in `epoch`.
    pub fn is(&self, epoch: u32) -> bool {
        self.0.load(Ordering::Relaxed) == epoch
    }
    /// Set it in `epoch`.
    pub fn set(&self, epoch: u32) {
        self.0.store(epoch, Ordering::Relaxed);
    }
    /// Set it in `epoch`; whether it was set in `epoch` already.
    pub fn test_and_set(&self, epoch: u32) -> bool {
        self.0.swap(epoch, Ordering::Relaxed) == epoch
    }
}

/// What a generation knows of each member: whether the kernel has it, and what the
/// directory read-ahead did with it, each for the page cache's current epoch. (What the
/// read path learns of a member is its format's, kept with the archive.)
#[derive(Debug, Default)]
pub struct MemberState {
    /// The kernel has been given (or asked for) its data from the start: a read at
    /// offset 0 or a prefetch push (see `prefetch`).
    pub cached: Mark,
    /// The kernel has sent a READ for it at offset 0.
    pub requested: Mark,
    /// A push stored the whole file into the kernel's page cache.
    pub pushed: Mark,
    /// Decoded ahead of a walk (see `prefetch::Warmer`).
    pub warmed: Mark,
    /// Its archive bytes have been asked of the disk ahead of decoding (see
    /// `fs::PkgFs::will_need`).
    pub advised: Mark,
    /// The kernel has been given an inode of it (LOOKUP or READDIRPLUS): only then can
    /// data be pushed into its page cache.
    pub known: AtomicBool,
}

/// How a graft's package is indexed: what a layout hands the tree for each package
/// placed by name alone.
pub trait GraftSource: Send + Sync + std::fmt::Debug {
    /// The package (its path or URL), for messages and status.
    fn name(&self) -> &Path;
    /// The version of its bytes when it was listed: a rescan keeps a graft whose
    /// package still has this version.
    fn version(&self) -> &str;
    /// Read the package's index and build its own tree, with its layers.
    fn index(&self) -> crate::error::Result<(Tree, Vec<Layer>)>;
}

/// A directory whose contents are one package, indexed the first time it is looked into
/// and then shared by every reader (and by later generations while the package is
/// unchanged). A package whose index fails is an empty directory; the error is logged
/// once and kept for `pkgfs status`.
#[derive(Debug)]
pub struct Graft {
    /// How to index it.
    pub source: Box<dyn GraftSource>,
    view: OnceLock<Arc<View>>,
    error: OnceLock<Error>,
    /// No longer in the current generation (an activation removed or replaced it).
    pub retired: AtomicBool,
}

impl Graft {
    /// A graft not indexed yet.
    pub fn new(source: Box<dyn GraftSource>) -> Self {
        Graft {
            source,
            view: OnceLock::new(),
            error: OnceLock::new(),
            retired: AtomicBool::new(false),
        }
    }

    /// Its generation, if it has been indexed.
    pub fn indexed(&self) -> Option<&Arc<View>> {
        self.view.get()
    }

    /// Why its index failed, if it did.
    pub fn error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// Its generation, indexing it on first use (concurrent callers wait for the one
    /// that indexes). `root` is the graft directory's inode, `parent` its parent's;
    /// `made` hears of a generation made here (to find its inodes later).
    pub fn enter(
        &self,
        root: u64,
        parent: u64,
        next_ino: &AtomicU64,
        made: impl FnOnce(&Arc<View>),
    ) -> &Arc<View> {
        let mut fresh = false;
        let view = self.view.get_or_init(|| {
            fresh = true;
            let indexed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.source.index()))
                    .unwrap_or_else(|_| {
                        Err(Error::Internal(
                            "indexing panicked (a bug: please report it)".into(),
                        ))
                    });
            let (tree, layers) = indexed.unwrap_or_else(|e| {
                log::warn!(
                    "{}: cannot index it, its directory is empty: {e}",
                    self.source.name().display()
                );
                let _ = self.error.set(e);
                (
                    TreeBuilder::new(Ownership::defaults(0, 0)).finish(),
                    Vec::new(),
                )
            });
            Arc::new(View::grafted(tree, layers, root, parent, next_ino))
        });
        if fresh {
            made(view);
        }
        view
    }
}

/// Where graft inode ranges start: far above any number a tree or its activations take
/// (those count up from the tree's size).
const GRAFT_SPACE: u64 = 1 << 40;
/// The most inodes one graft's range holds beyond its root.
const GRAFT_RANGE: u64 = 1 << 24;

/// The first inode of the range of the graft whose directory is inode `root`, if its
/// `extra` inodes fit there: a function of `root` alone, so every server numbers a
/// package the same way.
fn graft_base(root: u64, extra: u64) -> Option<u64> {
    if extra >= GRAFT_RANGE {
        return None;
    }
    root.checked_mul(GRAFT_RANGE)?.checked_add(GRAFT_SPACE)
}

/// The directory inode of the graft whose fixed range holds `ino`, if `ino` lies in the
/// graft space: a new server asked for a number an older one gave out indexes that graft
/// first (its numbers are the same whoever indexes it).
pub fn graft_root_of(ino: u64) -> Option<u64> {
    ino.checked_sub(GRAFT_SPACE).map(|off| off / GRAFT_RANGE)
}

/// Local (tree) numbers to global (kernel) inode numbers and back.
#[derive(Debug)]
enum Numbering {
    /// Global numbers are the local ones (the first generation).
    Identity,
    /// A graft's package: its root is the graft directory (`root`, whose parent is
    /// `parent`), local node `l > 1` is `base + l - 2`.
    Graft { root: u64, parent: u64, base: u64 },
    /// Anything else.
    Mapped {
        to_global: Vec<u64>,
        to_local: InoMap<u64>,
    },
}

/// One immutable generation of the mounted tree.
#[derive(Debug)]
pub struct View {
    /// 0 for the tree built at mount, then one more per activation.
    pub generation: u64,
    /// The merged tree.
    pub tree: Tree,
    /// The archives, in layer order (`Member::archive` and `Node::archive` index this).
    pub layers: Vec<Layer>,
    members: Vec<MemberState>,
    numbering: Numbering,
    /// The grafts of this generation (`Tree::graft` numbers index this).
    pub grafts: Vec<Arc<Graft>>,
    /// Its numbering digest (`fs::numbering_digest`), once computed or known.
    pub digest: std::sync::OnceLock<String>,
}

impl View {
    /// The first generation: inode numbers are the tree's own.
    pub fn first(tree: Tree, layers: Vec<Layer>) -> Self {
        let members = (0..tree.member_count())
            .map(|_| MemberState::default())
            .collect();
        View {
            generation: 0,
            tree,
            layers,
            members,
            numbering: Numbering::Identity,
            grafts: Vec::new(),
            digest: std::sync::OnceLock::new(),
        }
    }

    /// The same generation with `grafts` (the trees' graft numbers index them).
    pub fn with_grafts(mut self, grafts: Vec<Arc<Graft>>) -> Self {
        self.grafts = grafts;
        self
    }

    /// A graft's generation: its root is inode `root` (child of `parent`), the rest
    /// take the numbers [`graft_base`] fixes for that root, whatever order packages
    /// are indexed in (a new server behind a keeper indexes them in another order and
    /// must give the kernel's numbers the same meaning); fresh numbers from `next_ino`
    /// only for a graft too large for its range.
    fn grafted(
        tree: Tree,
        layers: Vec<Layer>,
        root: u64,
        parent: u64,
        next_ino: &AtomicU64,
    ) -> Self {
        let extra = tree.len().saturating_sub(1) as u64;
        let base = graft_base(root, extra)
            .unwrap_or_else(|| next_ino.fetch_add(extra, std::sync::atomic::Ordering::Relaxed));
        // A number no generation of the top tree will have: whatever keeps state by
        // generation (the read-ahead's windows) never takes a graft's nodes for the
        // top tree's.
        static GRAFT_GENERATIONS: AtomicU64 = AtomicU64::new(u64::MAX);
        let mut v = View::first(tree, layers);
        v.generation = GRAFT_GENERATIONS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        v.numbering = Numbering::Graft { root, parent, base };
        v
    }

    /// The global number of every local node (`l - 1` holds node `l`'s): what a new
    /// server needs to number this generation as this one does (`crate::keeper`).
    pub fn numbering_table(&self) -> Vec<u64> {
        // Hard-link aliases take their target's number, as `global` gives it.
        (1..=self.tree.len() as u64)
            .map(|l| self.global(l))
            .collect()
    }

    /// Number this generation by `table` (as [`View::numbering_table`] gave it, from a
    /// generation with the same tree). False, and nothing changed, if it does not fit.
    pub fn set_numbering(&mut self, table: Vec<u64>) -> bool {
        if table.len() != self.tree.len() || table.contains(&0) {
            return false;
        }
        let to_local = local_numbers(&self.tree, &table);
        self.numbering = Numbering::Mapped {
            to_global: table,
            to_local,
        };
        true
    }

    /// The inodes this generation numbers beyond its root, if it is a graft's: `base..end`.
    pub fn graft_range(&self) -> Option<std::ops::Range<u64>> {
        match self.numbering {
            Numbering::Graft { base, .. } => {
                Some(base..base + self.tree.len().saturating_sub(1) as u64)
            }
            _ => None,
        }
    }

    /// The graft of local node `local`, if it is a graft directory.
    pub fn graft_at(&self, local: u64) -> Option<&Arc<Graft>> {
        self.tree
            .graft(local)
            .and_then(|g| self.grafts.get(g as usize))
    }

    /// The global inode of the parent of local node `local` (a graft's root has its
    /// parent in the generation above).
    pub fn parent_of(&self, local: u64, node: &Node) -> u64 {
        match self.numbering {
            Numbering::Graft { parent, .. } if local == ROOT_INO => parent,
            _ => self.global(node.parent),
        }
    }

    /// The global inode number of local node `local` (after hard-link resolution).
    pub fn global(&self, local: u64) -> u64 {
        let local = self.tree.canonical(local);
        match &self.numbering {
            Numbering::Identity => local,
            Numbering::Graft { root, base, .. } => match local {
                0 => 0,
                1 => *root,
                l => base + l - 2,
            },
            Numbering::Mapped { to_global, .. } => local
                .checked_sub(1)
                .and_then(|i| to_global.get(i as usize))
                .copied()
                .unwrap_or(0),
        }
    }

    /// The local node of global inode `ino`, if this generation has it.
    pub fn local(&self, ino: u64) -> Option<u64> {
        match &self.numbering {
            Numbering::Identity => self.tree.node(ino).map(|_| ino),
            Numbering::Graft { root, base, .. } => {
                if ino == *root {
                    Some(ROOT_INO)
                } else {
                    let l = ino.checked_sub(*base)? + 2;
                    self.tree.node(l).map(|_| l)
                }
            }
            Numbering::Mapped { to_local, .. } => to_local.get(&ino).copied(),
        }
    }

    /// The lazily learnt state of member number `idx`.
    pub fn member_state(&self, idx: u32) -> Option<&MemberState> {
        self.members.get(idx as usize)
    }

    /// Every global inode number of this generation with its local node (hard-link
    /// aliases excluded).
    #[cfg(test)]
    pub fn inodes(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (1..=self.tree.len() as u64)
            .filter(|&l| self.tree.canonical(l) == l)
            .map(|l| (self.global(l), l))
    }
}

/// A kernel cache entry that an activation made stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// The name `name` in directory `parent` no longer resolves to inode `old` (it is gone
    /// or resolves to a new inode). The kernel drops the entry and treats `old` as
    /// deleted, so it forgets `old` as soon as nothing uses it any more.
    Delete {
        /// Directory inode.
        parent: u64,
        /// The name.
        name: Vec<u8>,
        /// The inode it resolved to.
        old: u64,
    },
    /// The name `name` in directory `parent` is new: drop any cached negative entry.
    Entry {
        /// Directory inode.
        parent: u64,
        /// The name.
        name: Vec<u8>,
    },
    /// The attributes or the listing of directory `ino` changed.
    Dir(u64),
}

/// Whether two non-directory nodes are the same file: same archive object, same member,
/// same attributes.
fn same_file(old: &View, o: &Node, new: &View, n: &Node) -> bool {
    if (o.kind, o.perm, o.uid, o.gid, o.mtime, o.size, o.nlink)
        != (n.kind, n.perm, n.uid, n.gid, n.mtime, n.size, n.nlink)
    {
        return false;
    }
    let (Some(om), Some(nm)) = (old.tree.member(o), new.tree.member(n)) else {
        return false;
    };
    let (Some(oa), Some(na)) = (
        old.layers.get(om.archive as usize),
        new.layers.get(nm.archive as usize),
    ) else {
        return false;
    };
    Arc::ptr_eq(&oa.archive, &na.archive) && om.loc == nm.loc && om.size == nm.size
}

/// Deletions for everything under old directory `dir` (local `dl`), deepest first, so
/// the kernel can drop a whole removed subtree even where it has cached its contents.
fn delete_subtree(old: &View, dl: u64, out: &mut Vec<Invalidation>) {
    let Some(d) = old.tree.node(dl) else { return };
    let parent = old.global(dl);
    for (ci, c) in old.tree.children(d) {
        delete_entry(old, parent, ci, c, out);
    }
}

/// Deletion of the old entry `name` -> local `ol` in `parent`, with its subtree.
fn delete_entry(old: &View, parent: u64, ol: u64, o: &Node, out: &mut Vec<Invalidation>) {
    if o.kind == Kind::Dir {
        delete_subtree(old, ol, out);
    }
    out.push(Invalidation::Delete {
        parent,
        name: old.tree.name(o).to_vec(),
        old: old.global(ol),
    });
}

fn same_dir_attrs(o: &Node, n: &Node) -> bool {
    (o.perm, o.uid, o.gid, o.mtime, o.nlink) == (n.perm, n.uid, n.gid, n.mtime, n.nlink)
}

/// Build generation `generation` from `tree` and `layers`, numbering its inodes so that
/// what is unchanged since `old` keeps its number; new numbers come from `next_ino`
/// (which is advanced). Returns the view and the kernel cache entries to invalidate.
pub fn carry_over(
    old: &View,
    tree: Tree,
    layers: Vec<Layer>,
    grafts: Vec<Arc<Graft>>,
    generation: u64,
    next_ino: &AtomicU64,
) -> (View, Vec<Invalidation>) {
    let members = (0..tree.member_count())
        .map(|_| MemberState::default())
        .collect();
    let mut view = View {
        generation,
        tree,
        layers,
        members,
        numbering: Numbering::Identity,
        grafts,
        digest: std::sync::OnceLock::new(),
    };
    let mut carry = Carry::new(view.tree.len());
    while let Some((ol, nl)) = carry.stack.pop() {
        carry.dir(old, &view, ol, nl);
    }
    carry.number_the_rest(&view.tree, next_ino);
    let (to_global, inval) = carry.invalidations(&view.tree);
    let to_local = local_numbers(&view.tree, &to_global);
    view.numbering = Numbering::Mapped {
        to_global,
        to_local,
    };
    (view, inval)
}

/// The numbering of a new generation as [`carry_over`] makes it: a walk of the
/// directories present at the same path in both generations, then fresh numbers for the
/// rest, then what the kernel must forget.
struct Carry {
    /// The global inode number of each local node of the new tree (`l - 1`), 0 while
    /// not yet known.
    to_global: Vec<u64>,
    /// Names present in both generations whose fate depends on the final numbering:
    /// (parent inode, name, old inode, new local node).
    pairs: Vec<(u64, Vec<u8>, u64, u64)>,
    /// The invalidations found so far.
    inval: Vec<Invalidation>,
    /// Directories whose attributes or listing changed (inode numbers).
    changed_dirs: Vec<u64>,
    /// Directories present at the same path in both still to compare: (old local, new
    /// local).
    stack: Vec<(u64, u64)>,
}

impl Carry {
    /// Nothing known yet of a new tree of `len` nodes but its root.
    fn new(len: usize) -> Self {
        let mut to_global = vec![0u64; len];
        to_global[0] = ROOT_INO;
        Carry {
            to_global,
            pairs: Vec::new(),
            inval: Vec::new(),
            changed_dirs: Vec::new(),
            stack: vec![(ROOT_INO, ROOT_INO)],
        }
    }

    /// Compare old directory `ol` with new directory `nl` (the same path), name by name
    /// in their sorted order.
    fn dir(&mut self, old: &View, new: &View, ol: u64, nl: u64) {
        let (Some(od), Some(nd)) = (old.tree.node(ol), new.tree.node(nl)) else {
            return;
        };
        let dir_ino = old.global(ol);
        let mut dir_changed = !same_dir_attrs(od, nd);
        let mut oc = old.tree.children(od).peekable();
        let mut nc = new.tree.children(nd).peekable();
        loop {
            let order = match (oc.peek(), nc.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((_, o)), Some((_, n))) => old.tree.name(o).cmp(new.tree.name(n)),
            };
            match order {
                std::cmp::Ordering::Less => {
                    // Gone.
                    let Some((oi, o)) = oc.next() else { break };
                    delete_entry(old, dir_ino, oi, o, &mut self.inval);
                    dir_changed = true;
                }
                std::cmp::Ordering::Greater => {
                    // New (also clears a cached negative entry).
                    let Some((_, n)) = nc.next() else { break };
                    self.inval.push(Invalidation::Entry {
                        parent: dir_ino,
                        name: new.tree.name(n).to_vec(),
                    });
                    dir_changed = true;
                }
                std::cmp::Ordering::Equal => {
                    let (Some(o), Some(n)) = (oc.next(), nc.next()) else {
                        break;
                    };
                    dir_changed |= self.same_name(old, new, dir_ino, o, n);
                }
            }
        }
        if dir_changed {
            self.changed_dirs.push(dir_ino);
        }
    }

    /// A name of directory `dir_ino` in both generations, old node `oi` and new `ni`:
    /// a directory is carried over (and compared later), a file keeps its number if it
    /// is the same file, anything else is deleted. Whether the directory's listing
    /// changed.
    fn same_name(
        &mut self,
        old: &View,
        new: &View,
        dir_ino: u64,
        (oi, o): (u64, &Node),
        (ni, n): (u64, &Node),
    ) -> bool {
        let old_ino = old.global(oi);
        let same_graft = match (old.graft_at(oi), new.graft_at(ni)) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        match (o.kind, n.kind) {
            (Kind::Dir, Kind::Dir) if same_graft => {
                self.to_global[ni as usize - 1] = old_ino;
                if old.graft_at(oi).is_none() {
                    self.stack.push((oi, ni));
                }
                false
            }
            (Kind::Dir, _) | (_, Kind::Dir) => {
                delete_entry(old, dir_ino, oi, o, &mut self.inval);
                true
            }
            _ => {
                let oc_l = old.tree.canonical(oi);
                let nc_l = new.tree.canonical(ni);
                let (Some(ocn), Some(ncn)) = (old.tree.node(oc_l), new.tree.node(nc_l)) else {
                    return false;
                };
                let slot = &mut self.to_global[nc_l as usize - 1];
                if *slot == 0 && same_file(old, ocn, new, ncn) {
                    *slot = old_ino;
                }
                self.pairs
                    .push((dir_ino, new.tree.name(n).to_vec(), old_ino, ni));
                false
            }
        }
    }

    /// Everything of `tree` not carried over gets a fresh number from `next_ino`
    /// (aliases share their canonical's).
    fn number_the_rest(&mut self, tree: &Tree, next_ino: &AtomicU64) {
        use std::sync::atomic::Ordering::Relaxed;
        let len = self.to_global.len() as u64;
        for l in 1..=len {
            if tree.canonical(l) == l && self.to_global[l as usize - 1] == 0 {
                self.to_global[l as usize - 1] = next_ino.fetch_add(1, Relaxed);
            }
        }
        for l in 1..=len {
            let c = tree.canonical(l);
            if c != l {
                self.to_global[l as usize - 1] = self.to_global[c as usize - 1];
            }
        }
    }

    /// The final numbering and every invalidation: a name kept in both whose inode
    /// changed is stale too, and so is its directory's listing (readdir caches inode
    /// numbers); the changed directories come last.
    fn invalidations(self, tree: &Tree) -> (Vec<u64>, Vec<Invalidation>) {
        let Carry {
            to_global,
            pairs,
            mut inval,
            mut changed_dirs,
            ..
        } = self;
        for (parent, name, old_ino, ni) in pairs {
            let c = tree.canonical(ni);
            if to_global[c as usize - 1] != old_ino {
                inval.push(Invalidation::Delete {
                    parent,
                    name,
                    old: old_ino,
                });
                if changed_dirs.last() != Some(&parent) && !changed_dirs.contains(&parent) {
                    changed_dirs.push(parent);
                }
            }
        }
        inval.extend(changed_dirs.into_iter().map(Invalidation::Dir));
        (to_global, inval)
    }
}

/// The local node of each global inode number of `to_global` (canonical nodes only).
fn local_numbers(tree: &Tree, to_global: &[u64]) -> InoMap<u64> {
    let mut to_local = InoMap::default();
    to_local.reserve(to_global.len());
    for (i, &g) in to_global.iter().enumerate() {
        let l = i as u64 + 1;
        if tree.canonical(l) == l {
            to_local.insert(g, l);
        }
    }
    to_local
}

/// Entries, archives and layered trees for the unit tests of this and other modules.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::format::{Entry, EntryKind, Loc};
    use crate::tree::{Ownership, TreeBuilder};

    pub(crate) fn file(path: &str, off: u64) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            perm: 0o644,
            mtime: 100,
            uid: None,
            gid: None,
            size: 1,
            data: Loc::Record(off as u32),
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    pub(crate) fn archive(name: &str) -> Arc<Archive> {
        Arc::new(Archive::detached(name))
    }

    pub(crate) fn build(layers: &[(Arc<Archive>, Vec<Entry>)]) -> (Tree, Vec<Layer>) {
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        let mut out = Vec::new();
        for (i, (a, e)) in layers.iter().enumerate() {
            b.add_layer(i as u32, 0, e);
            out.push(Layer {
                archive: a.clone(),
                entries: e.len(),
                places: Vec::new(),
            });
        }
        (b.finish(), out)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{archive, build, file};
    use super::*;

    fn ino(v: &View, path: &str) -> u64 {
        v.global(v.tree.resolve(path.as_bytes()).unwrap())
    }

    #[test]
    fn unchanged_paths_keep_inodes_and_only_changes_are_invalidated() {
        let (a, b, c) = (archive("a"), archive("b"), archive("c"));
        let la = (a.clone(), vec![file("lib/a.py", 1), file("bin/x", 2)]);
        let lb = (b.clone(), vec![file("lib/b.py", 1), file("bin/x", 9)]);
        let (t, l) = build(&[la.clone(), lb]);
        let old = View::first(t, l);
        let next = AtomicU64::new(old.tree.len() as u64 + 1);
        // Remove b (the winner of bin/x), add c.
        let lc = (c.clone(), vec![file("share/c", 1)]);
        let (t, l) = build(&[la, lc]);
        let (new, inval) = carry_over(&old, t, l, Vec::new(), 1, &next);
        assert_eq!(ino(&new, "lib"), ino(&old, "lib"));
        assert_eq!(ino(&new, "lib/a.py"), ino(&old, "lib/a.py"));
        assert_ne!(
            ino(&new, "bin/x"),
            ino(&old, "bin/x"),
            "the loser is uncovered"
        );
        assert!(ino(&new, "share/c") > old.tree.len() as u64);
        let (lib, bin, root) = (ino(&old, "lib"), ino(&old, "bin"), ROOT_INO);
        let entry = |parent, name: &str| Invalidation::Entry {
            parent,
            name: name.as_bytes().to_vec(),
        };
        let delete = |parent, name: &str, path: &str| Invalidation::Delete {
            parent,
            name: name.as_bytes().to_vec(),
            old: ino(&old, path),
        };
        let mut want = vec![
            entry(root, "share"),
            delete(lib, "b.py", "lib/b.py"),
            delete(bin, "x", "bin/x"),
            Invalidation::Dir(root),
            Invalidation::Dir(lib),
            Invalidation::Dir(bin),
        ];
        let mut got = inval.clone();
        let key = |i: &Invalidation| format!("{i:?}");
        want.sort_by_key(key);
        got.sort_by_key(key);
        assert_eq!(got, want);
        // Every inode of the new generation maps back.
        for (g, l) in new.inodes() {
            assert_eq!(new.local(g), Some(l));
        }
        assert_eq!(new.local(ino(&old, "lib/b.py")), None);
    }

    #[test]
    fn identical_rebuild_invalidates_nothing() {
        let a = archive("a");
        let la = (a, vec![file("d/e/f", 1), file("g", 2)]);
        let (t, l) = build(std::slice::from_ref(&la));
        let old = View::first(t, l);
        let next = AtomicU64::new(100);
        let (t, l) = build(&[la]);
        let (new, inval) = carry_over(&old, t, l, Vec::new(), 1, &next);
        assert!(inval.is_empty(), "{inval:?}");
        assert_eq!(ino(&new, "d/e/f"), ino(&old, "d/e/f"));
        assert_eq!(next.load(std::sync::atomic::Ordering::Relaxed), 100);
    }

    #[test]
    fn replaced_archive_gets_new_inodes_even_with_equal_entries() {
        let la = (archive("v1"), vec![file("m", 1)]);
        let lb = (archive("v1-again"), vec![file("m", 1)]);
        let (t, l) = build(&[la]);
        let old = View::first(t, l);
        let next = AtomicU64::new(10);
        let (t, l) = build(&[lb]);
        let (new, inval) = carry_over(&old, t, l, Vec::new(), 1, &next);
        assert_eq!(ino(&new, "m"), 10);
        assert!(inval.contains(&Invalidation::Delete {
            parent: ROOT_INO,
            name: b"m".to_vec(),
            old: ino(&old, "m"),
        }));
    }

    #[test]
    fn a_removed_subtree_is_deleted_deepest_first() {
        let (a, b) = (archive("a"), archive("b"));
        let la = (a, vec![file("keep", 1)]);
        let lb = (b, vec![file("app/lib/x", 1), file("app/y", 2)]);
        let (t, l) = build(&[la.clone(), lb]);
        let old = View::first(t, l);
        let next = AtomicU64::new(100);
        let (t, l) = build(&[la]);
        let (_, inval) = carry_over(&old, t, l, Vec::new(), 1, &next);
        let names: Vec<String> = inval
            .iter()
            .filter_map(|i| match i {
                Invalidation::Delete { name, .. } => Some(String::from_utf8_lossy(name).into()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["x", "lib", "y", "app"]);
    }
}
