//! The merged tree: every archive's entries folded into one immutable directory tree.
//!
//! Building happens once per mount ([`TreeBuilder`]); the result ([`Tree`]) is frozen into
//! flat arrays so lookups are binary searches and a million entries cost well under a
//! hundred bytes each. Inode numbers are assigned breadth-first with each directory's
//! children sorted by name, so a directory's children are a contiguous range of inodes:
//! a directory node stores only where that range starts and how long it is.
//!
//! Merge rules (docs/SEMANTICS.md has the user-facing version):
//! - layers are applied in order; later layers are "above" earlier ones;
//! - directories merge; an explicit directory entry sets the directory's metadata, the
//!   last explicit entry wins; a directory only implied by deeper paths is 0755 with the
//!   mtime of the last archive that implied it;
//! - a file or symlink replaces an earlier file or symlink at the same path (a conflict);
//! - a directory always beats a file or symlink at the same path, whichever comes first,
//!   so no single stray file can hide a whole subtree (also a conflict).
//! - with whiteouts on ([`TreeBuilder::with_whiteouts`], for OCI image layers): a
//!   `.wh.NAME` entry removes NAME (and everything under it) as the layers below
//!   provide it, and a `.wh..wh..opq` entry removes everything the layers below put in
//!   its directory; the layer's own entries stay, whatever their order in the archive,
//!   because a layer's whiteouts are applied before its entries. Whiteout entries are
//!   not shown, but the directories holding them exist in their layer.

pub mod kept;
pub mod path;
pub mod view;

use std::collections::HashMap;

use self::path::PathError;
use crate::format::{Entry, EntryKind, Loc};
use std::collections::BTreeMap;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// The prefix of a whiteout entry's name (OCI image layers, as overlayfs and Docker
/// write them in tar layers).
pub const WHITEOUT_PREFIX: &[u8] = b".wh.";

/// The name of an opaque-directory whiteout.
pub const OPAQUE_WHITEOUT: &[u8] = b".wh..wh..opq";

/// Node types in the mounted tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Character device (its number in [`Extra::rdev`]).
    CharDev,
    /// Block device (its number in [`Extra::rdev`]).
    BlockDev,
    /// FIFO.
    Fifo,
    /// Socket.
    Socket,
}

impl Kind {
    /// The file type bits of `st_mode` (`S_IFREG`…).
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
        }
    }

    /// Devices, FIFOs and sockets: nodes with no data.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::CharDev | Kind::BlockDev | Kind::Fifo | Kind::Socket
        )
    }
}

/// What few nodes have: a device number, extended attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extra {
    /// A device's number (`makedev(major, minor)`); 0 for anything else.
    pub rdev: u64,
    /// Extended attributes, by name (sorted, each name once).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Extra {
    /// The extra of an entry, if it has any.
    fn of(e: &Entry) -> Option<Box<Extra>> {
        if e.rdev == 0 && e.xattrs.is_empty() {
            return None;
        }
        let mut xattrs = e.xattrs.clone();
        // The last value of a name wins, as the archive's order says.
        xattrs.reverse();
        xattrs.sort_by(|a, b| a.0.cmp(&b.0));
        xattrs.dedup_by(|a, b| a.0 == b.0);
        Some(Box::new(Extra {
            rdev: e.rdev,
            xattrs,
        }))
    }
}

/// Who owns nodes whose archive records no owner, and whether to override recorded ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Default (or forced) user id.
    pub uid: u32,
    /// Default (or forced) group id.
    pub gid: u32,
    /// Use `uid` for every node, ignoring the archive.
    pub force_uid: bool,
    /// Use `gid` for every node, ignoring the archive.
    pub force_gid: bool,
}

impl Ownership {
    /// `uid` and `gid` for nodes whose archive records no owner; recorded owners kept.
    pub const fn defaults(uid: u32, gid: u32) -> Self {
        Ownership {
            uid,
            gid,
            force_uid: false,
            force_gid: false,
        }
    }
}

/// A file's data: which archive and where in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Index of the archive (layer) in mount order.
    pub archive: u32,
    /// Where in that archive, in the terms of its format.
    pub loc: Loc,
    /// Uncompressed size.
    pub size: u64,
}

/// One node of the frozen tree.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    name_off: u32,
    name_len: u32,
    /// Parent inode (the root is its own parent).
    pub parent: u64,
    /// Node type.
    pub kind: Kind,
    /// Permission bits.
    pub perm: u16,
    /// Link count: 2 + subdirectories for a directory, else 1.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Size: bytes of data, or the target length of a symlink, 0 for a directory.
    pub size: u64,
    /// Index of the archive that provides this node (the winning layer).
    pub archive: u32,
    /// Directory: first child inode; file/symlink: index into the member table.
    a: u64,
    /// Directory: number of children.
    b: u32,
    /// For the second and later names of a hard link: the inode they all share.
    alias: u64,
}

/// Two layers provided the same path; `winner` is visible, `loser` is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The normalised path, `/`-separated.
    pub path: Vec<u8>,
    /// Archive index of the visible entry.
    pub winner: u32,
    /// Archive index of the hidden entry.
    pub loser: u32,
    /// Why the loser lost.
    pub reason: &'static str,
}

/// An entry that was not mounted and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Archive index.
    pub archive: u32,
    /// The raw stored path.
    pub path: Vec<u8>,
    /// Why.
    pub reason: String,
}

/// Where a layer's entries go (see [`TreeBuilder::add_layer_at`]): the first `strip`
/// components of each stored path are dropped, as tar's `--strip-components` drops them
/// (an entry with no more components than that is left out), then `prefix` is put in
/// front. The default places every entry where its archive says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// Leading components dropped.
    pub strip: usize,
    /// Components put in front (plain names, checked by whoever made them).
    pub prefix: Vec<Vec<u8>>,
}

impl Place {
    /// The components of `comps` placed, into `out` (cleared first); `false` when the
    /// entry is left out (no more components than `strip`).
    fn apply<'a>(&'a self, comps: &[&'a [u8]], out: &mut Vec<&'a [u8]>) -> bool {
        out.clear();
        if comps.len() <= self.strip {
            return false;
        }
        out.extend(self.prefix.iter().map(Vec::as_slice));
        out.extend_from_slice(&comps[self.strip..]);
        true
    }

    fn is_identity(&self) -> bool {
        self.strip == 0 && self.prefix.is_empty()
    }
}

/// The immutable merged tree.
#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    names: Vec<u8>,
    members: Vec<Member>,
    /// Paths provided by more than one layer.
    pub conflicts: Vec<Conflict>,
    /// Entries that were refused.
    pub skipped: Vec<Skipped>,
    /// Sum of the sizes of all files.
    pub total_bytes: u64,
    /// Device numbers and extended attributes, by node.
    extras: HashMap<u64, Box<Extra>>,
    /// Whether any node has extended attributes.
    pub has_xattrs: bool,
    /// Directories whose contents are a package of their own, indexed on first use
    /// (see [`view::Graft`]): node → graft number.
    grafts: HashMap<u64, u32>,
}

impl Tree {
    /// The graft number of directory node `ino`, if its contents are a package indexed
    /// on first use ([`TreeBuilder::add_graft`]).
    pub fn graft(&self, ino: u64) -> Option<u32> {
        if self.grafts.is_empty() {
            return None;
        }
        self.grafts.get(&ino).copied()
    }

    /// The nodes that are grafts, with their graft numbers.
    pub fn grafts(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.grafts.iter().map(|(&n, &g)| (n, g))
    }

    /// The device number and extended attributes of node `ino` (after hard links are
    /// followed: see [`Tree::canonical`]).
    pub fn extra(&self, ino: u64) -> Option<&Extra> {
        self.extras.get(&self.canonical(ino)).map(|b| &**b)
    }

    /// The node of inode `ino`, if it exists.
    pub fn node(&self, ino: u64) -> Option<&Node> {
        let idx = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(idx)
    }

    /// Number of inodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree holds only the root.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// Name of a node (empty for the root).
    pub fn name(&self, node: &Node) -> &[u8] {
        let start = node.name_off as usize;
        &self.names[start..start + node.name_len as usize]
    }

    /// Number of file and symlink members.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// The member table entry of a file or symlink.
    pub fn member(&self, node: &Node) -> Option<&Member> {
        match node.kind {
            Kind::Dir => None,
            _ => self.members.get(node.a as usize),
        }
    }

    /// The index of a file's member (stable for the mount; used as a cache key).
    pub fn member_index(&self, node: &Node) -> Option<u32> {
        match node.kind {
            Kind::Dir => None,
            _ => Some(node.a as u32),
        }
    }

    /// Children of a directory as `(inode, node)` pairs in name order.
    pub fn children(&self, dir: &Node) -> impl Iterator<Item = (u64, &Node)> {
        self.children_from(dir, 0)
    }

    /// Children of a directory from position `skip` on, in constant time per step (a
    /// directory's children are a contiguous range of inodes).
    pub fn children_from(&self, dir: &Node, skip: u64) -> impl Iterator<Item = (u64, &Node)> {
        let (first, count) = match dir.kind {
            Kind::Dir => (dir.a, u64::from(dir.b)),
            _ => (0, 0),
        };
        (first + skip.min(count)..first + count)
            .filter_map(move |ino| self.node(ino).map(|n| (ino, n)))
    }

    /// The inodes of a directory's children: a contiguous range, in name order (the
    /// order `readdir` lists them in). Empty for anything but a directory.
    pub fn child_range(&self, dir: &Node) -> std::ops::Range<u64> {
        match dir.kind {
            Kind::Dir => dir.a..dir.a + u64::from(dir.b),
            _ => 0..0,
        }
    }

    /// The node after `local` in a depth-first walk in name order (the order `tar`, `cp
    /// -r` and `find` visit a tree in): its first child, else its next sibling, else the
    /// next sibling of the nearest ancestor that has one.
    pub fn next_in_walk(&self, local: u64) -> Option<u64> {
        let node = self.node(local)?;
        if node.kind == Kind::Dir && node.b > 0 && local != node.a {
            return Some(node.a);
        }
        let mut cur = local;
        while cur != ROOT_INO {
            let n = self.node(cur)?;
            let parent = self.node(n.parent)?;
            if cur + 1 < parent.a + u64::from(parent.b) {
                return Some(cur + 1);
            }
            cur = n.parent;
        }
        None
    }

    /// Number of children of a directory.
    pub fn child_count(&self, dir: &Node) -> u32 {
        if dir.kind == Kind::Dir { dir.b } else { 0 }
    }

    /// The inode a name resolves to: itself, or for a hard link the shared inode.
    pub fn canonical(&self, ino: u64) -> u64 {
        match self.node(ino) {
            Some(n) if n.alias != 0 => n.alias,
            _ => ino,
        }
    }

    /// Find `name` in directory `dir`.
    pub fn lookup(&self, dir: &Node, name: &[u8]) -> Option<u64> {
        if dir.kind != Kind::Dir {
            return None;
        }
        let first = usize::try_from(dir.a.checked_sub(1)?).ok()?;
        let slice = self.nodes.get(first..first + dir.b as usize)?;
        slice
            .binary_search_by(|n| self.name(n).cmp(name))
            .ok()
            .map(|i| (first + i + 1) as u64)
    }

    /// Resolve a `/`-separated path from the root (no symlinks are followed).
    pub fn resolve(&self, path: &[u8]) -> Option<u64> {
        let mut ino = ROOT_INO;
        for comp in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            ino = self.lookup(self.node(ino)?, comp)?;
        }
        Some(ino)
    }

    /// The full path of an inode, `/`-separated, without a leading slash.
    pub fn path_of(&self, mut ino: u64) -> Vec<u8> {
        let mut parts = Vec::new();
        while ino != ROOT_INO {
            let Some(node) = self.node(ino) else { break };
            parts.push(self.name(node));
            ino = node.parent;
        }
        parts.reverse();
        parts.join(&b'/')
    }
}

/// A node while the tree is being built. Its name is the key under which its parent's
/// `children` holds it (stored once: a million entries make this matter).
struct Building {
    kind: Kind,
    perm: u16,
    mtime: i64,
    uid: u32,
    gid: u32,
    size: u64,
    archive: u32,
    explicit: bool,
    member: Option<Member>,
    /// A directory's children, by name: an index into the builder's `dirs`, made with
    /// the first child ([`NO_CHILDREN`] until then, and for files): most nodes are files,
    /// and a map in each would cost 48 bytes a node.
    children: u32,
    /// Hard-link group: nodes with the same group share one inode.
    group: Option<u32>,
    /// Device number, extended attributes.
    extra: Option<Box<Extra>>,
}

/// Whether `path` (`/`-separated) is the path of the components `comps`.
fn same_path(path: &[u8], comps: &[&[u8]]) -> bool {
    let mut rest = path;
    for (i, c) in comps.iter().enumerate() {
        if i > 0 {
            match rest.split_first() {
                Some((b'/', r)) => rest = r,
                _ => return false,
            }
        }
        match rest.strip_prefix(*c) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

/// [`Building::children`] of a node that has none.
const NO_CHILDREN: u32 = u32::MAX;

/// A directory's children by name, while building. Names come from archives, so the
/// hash is keyed per process (foldhash's, as hashbrown's default: several times
/// cheaper than SipHash on short names, and not predictable from outside).
type NameMap = HashMap<Vec<u8>, usize, foldhash::fast::RandomState>;

/// Folds layers into a [`Tree`].
pub struct TreeBuilder {
    nodes: Vec<Building>,
    /// Children of directories, by name.
    dirs: Vec<NameMap>,
    owner: Ownership,
    conflicts: Vec<Conflict>,
    skipped: Vec<Skipped>,
    groups: u32,
    /// The parent directory of the last entry inserted in this layer: its normalised
    /// path (`/`-separated) and node. Archives list a directory's entries together, so
    /// most entries skip the walk from the root (a directory node stays a directory, so
    /// the node stays right for the layer; walking again would change nothing).
    last_parent: Option<(Vec<u8>, usize)>,
    /// Whether `.wh.` entries are whiteouts.
    whiteouts: bool,
    /// Graft directories: building node → graft number.
    grafts: HashMap<usize, u32>,
}

impl TreeBuilder {
    /// A builder holding only the root directory.
    pub fn new(owner: Ownership) -> Self {
        let root = Building {
            kind: Kind::Dir,
            perm: 0o755,
            mtime: 0,
            uid: owner.uid,
            gid: owner.gid,
            size: 0,
            archive: 0,
            explicit: false,
            member: None,
            children: NO_CHILDREN,
            group: None,
            extra: None,
        };
        TreeBuilder {
            nodes: vec![root],
            dirs: Vec::new(),
            owner,
            conflicts: Vec::new(),
            skipped: Vec::new(),
            groups: 0,
            last_parent: None,
            whiteouts: false,
            grafts: HashMap::new(),
        }
    }

    /// Treat `.wh.NAME` and `.wh..wh..opq` entries as OCI whiteouts (see the module
    /// documentation) instead of as files.
    pub fn with_whiteouts(mut self, on: bool) -> Self {
        self.whiteouts = on;
        self
    }

    fn implied_dir(&self, archive: u32, mtime: i64) -> Building {
        Building {
            kind: Kind::Dir,
            perm: 0o755,
            mtime,
            uid: self.owner.uid,
            gid: self.owner.gid,
            size: 0,
            archive,
            explicit: false,
            member: None,
            children: NO_CHILDREN,
            group: None,
            extra: None,
        }
    }

    /// Apply one layer: the entries of archive number `archive`, whose file has
    /// modification time `archive_mtime` (used for implied directories).
    pub fn add_layer(&mut self, archive: u32, archive_mtime: i64, entries: &[Entry]) {
        self.add_layer_at(archive, archive_mtime, entries, &Place::default());
    }

    /// [`TreeBuilder::add_layer`] with every path placed by `place` (a layout's
    /// `--strip-components`, a package's own directory).
    pub fn add_layer_at(
        &mut self,
        archive: u32,
        archive_mtime: i64,
        entries: &[Entry],
        place: &Place,
    ) {
        let root = &mut self.nodes[0];
        root.mtime = root.mtime.max(archive_mtime);
        if self.whiteouts {
            self.apply_whiteouts(archive, entries, place);
        }
        // Walks of this layer update implied directories' times: none carries over.
        self.last_parent = None;
        let mut raw = Vec::new();
        let mut placed = Vec::new();
        for entry in entries {
            match path::components_into(&entry.path, &mut raw) {
                Ok(()) => {}
                // "./" or "/" as a directory entry names the root: nothing to add.
                Err(PathError::Empty) if entry.kind == EntryKind::Dir => continue,
                Err(e) => {
                    self.skip(archive, entry, e.to_string());
                    continue;
                }
            };
            let comps: &[&[u8]] = if place.is_identity() {
                &raw
            } else if place.apply(&raw, &mut placed) {
                &placed
            } else {
                continue;
            };
            if self.whiteouts
                && let Some((last, parents)) = comps.split_last()
                && last.starts_with(WHITEOUT_PREFIX)
            {
                // Applied already; not shown. Its directory exists in this layer.
                self.walk(archive, archive_mtime, parents);
                self.last_parent = None;
                continue;
            }
            let kind = match entry.kind {
                EntryKind::File => Kind::File,
                EntryKind::Dir => Kind::Dir,
                EntryKind::Symlink => Kind::Symlink,
                EntryKind::CharDev => Kind::CharDev,
                EntryKind::BlockDev => Kind::BlockDev,
                EntryKind::Fifo => Kind::Fifo,
                EntryKind::Socket => Kind::Socket,
                EntryKind::HardLink => {
                    self.hard_link(archive, archive_mtime, comps, entry, place);
                    continue;
                }
                EntryKind::Special => {
                    self.skip(
                        archive,
                        entry,
                        "a sparse file or an entry of an unknown type".into(),
                    );
                    continue;
                }
            };
            self.insert(archive, archive_mtime, comps, kind, entry);
        }
    }

    /// A directory at `comps` (made with its parents; none may be there yet) whose
    /// contents are graft number `graft`: a package indexed on first use. Its attributes
    /// are the ones given, whatever the package holds. `false` if the path is taken.
    pub fn add_graft(&mut self, comps: &[&[u8]], graft: u32, archive: u32, mtime: i64) -> bool {
        let Some((last, parents)) = comps.split_last() else {
            return false;
        };
        let root = &mut self.nodes[0];
        root.mtime = root.mtime.max(mtime);
        self.last_parent = None;
        let dir = self.walk(archive, mtime, parents);
        if self.child(dir, last).is_some() {
            return false;
        }
        let mut node = self.implied_dir(archive, mtime);
        node.explicit = true;
        let idx = self.push_child(dir, last.to_vec(), node);
        self.grafts.insert(idx, graft);
        true
    }

    /// Remove what the layer's whiteouts hide from the layers below, before any of the
    /// layer's own entries is added (so none of those is hidden, whatever the order).
    /// Each removal is recorded as a conflict lost by the layer below.
    fn apply_whiteouts(&mut self, archive: u32, entries: &[Entry], place: &Place) {
        let mut raw = Vec::new();
        let mut comps = Vec::new();
        for entry in entries {
            if path::components_into(&entry.path, &mut raw).is_err()
                || !place.apply(&raw, &mut comps)
            {
                continue;
            }
            let Some((last, parents)) = comps.split_last() else {
                continue;
            };
            let Some(name) = last.strip_prefix(WHITEOUT_PREFIX) else {
                continue;
            };
            let Some(dir) = self.existing_dir(parents) else {
                continue;
            };
            let (removed, reason): (Vec<(Vec<u8>, usize)>, _) = if *last == OPAQUE_WHITEOUT {
                (
                    self.children_mut(dir)
                        .map(std::mem::take)
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                    "hidden by an opaque directory whiteout",
                )
            } else if name.starts_with(WHITEOUT_PREFIX) {
                // Other `.wh..wh.` names are reserved: hidden, no effect.
                continue;
            } else {
                match self.children_mut(dir).and_then(|c| c.remove(name)) {
                    Some(child) => (vec![(name.to_vec(), child)], "removed by a whiteout"),
                    None => continue,
                }
            };
            for (child_name, child) in removed {
                let mut path = parents.join(&b'/');
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(&child_name);
                self.conflicts.push(Conflict {
                    path,
                    winner: archive,
                    loser: self.nodes[child].archive,
                    reason,
                });
            }
        }
    }

    /// The directory node at `parents` if the tree has one (nothing is made).
    fn existing_dir(&self, parents: &[&[u8]]) -> Option<usize> {
        parents.iter().try_fold(0usize, |dir, c| {
            let child = self.child(dir, c)?;
            (self.nodes[child].kind == Kind::Dir).then_some(child)
        })
    }

    /// A hard link: a new name for an earlier entry's inode. Its target must already be
    /// in the tree (tar writes the target first) and must not be a directory.
    fn hard_link(
        &mut self,
        archive: u32,
        archive_mtime: i64,
        comps: &[&[u8]],
        entry: &Entry,
        place: &Place,
    ) {
        let mut placed = Vec::new();
        let target = path::components(&entry.link).ok().and_then(|t| {
            if !place.apply(&t, &mut placed) {
                return None;
            }
            placed
                .iter()
                .try_fold(0usize, |dir, c| self.child(dir, c))
                .filter(|&i| self.nodes[i].kind != Kind::Dir && i != 0)
        });
        let Some(target) = target else {
            self.skip(
                archive,
                entry,
                "hard link to a missing entry or a directory".into(),
            );
            return;
        };
        let group = match self.nodes[target].group {
            Some(g) => g,
            None => {
                self.groups += 1;
                self.nodes[target].group = Some(self.groups);
                self.groups
            }
        };
        let t = &self.nodes[target];
        let linked = Entry {
            path: entry.path.clone(),
            kind: match t.kind {
                Kind::Symlink => EntryKind::Symlink,
                _ => EntryKind::File,
            },
            perm: t.perm,
            mtime: t.mtime,
            uid: Some(t.uid),
            gid: Some(t.gid),
            size: t.size,
            data: Loc::None,
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        };
        let (kind, member, extra) = (t.kind, t.member.clone(), t.extra.clone());
        if let Some(idx) = self.insert(archive, archive_mtime, comps, kind, &linked) {
            let n = &mut self.nodes[idx];
            n.member = member;
            n.group = Some(group);
            n.extra = extra;
        }
    }

    fn skip(&mut self, archive: u32, entry: &Entry, reason: String) {
        self.skipped.push(Skipped {
            archive,
            path: entry.path.clone(),
            reason,
        });
    }

    /// Insert an entry; returns the node that now holds it (None if it lost).
    fn insert(
        &mut self,
        archive: u32,
        archive_mtime: i64,
        comps: &[&[u8]],
        kind: Kind,
        e: &Entry,
    ) -> Option<usize> {
        let (last, parents) = comps.split_last()?;
        let dir = match &self.last_parent {
            Some((path, dir)) if same_path(path, parents) => *dir,
            _ => {
                let dir = self.walk(archive, archive_mtime, parents);
                let mut path = self.last_parent.take().map(|p| p.0).unwrap_or_default();
                path.clear();
                for (i, c) in parents.iter().enumerate() {
                    if i > 0 {
                        path.push(b'/');
                    }
                    path.extend_from_slice(c);
                }
                self.last_parent = Some((path, dir));
                dir
            }
        };
        self.insert_in(archive, dir, comps, last, kind, e)
    }

    /// The directory node at `parents`, made (implied) where missing; a file standing
    /// where a directory is needed is replaced. Implied directories on the way take this
    /// layer's time.
    fn walk(&mut self, archive: u32, archive_mtime: i64, parents: &[&[u8]]) -> usize {
        let mut dir = 0usize;
        for (depth, comp) in parents.iter().enumerate() {
            dir = match self.child(dir, comp) {
                Some(child) if self.nodes[child].kind == Kind::Dir => {
                    let c = &mut self.nodes[child];
                    if !c.explicit {
                        c.mtime = archive_mtime;
                        c.archive = archive;
                    }
                    child
                }
                Some(child) => {
                    // A deeper path implies a directory where a file stood: the directory wins.
                    self.conflicts.push(Conflict {
                        path: parents[..=depth].join(&b'/'),
                        winner: archive,
                        loser: self.nodes[child].archive,
                        reason: "a directory replaces a file",
                    });
                    self.nodes[child] = self.implied_dir(archive, archive_mtime);
                    child
                }
                None => {
                    let node = self.implied_dir(archive, archive_mtime);
                    self.push_child(dir, comp.to_vec(), node)
                }
            };
        }
        dir
    }

    /// Insert entry `e` named `last` into directory node `dir` (`comps` is its whole
    /// path, for conflict reports).
    fn insert_in(
        &mut self,
        archive: u32,
        dir: usize,
        comps: &[&[u8]],
        last: &[u8],
        kind: Kind,
        e: &Entry,
    ) -> Option<usize> {
        let owner = self.owner;
        let uid = match e.uid {
            Some(u) if !owner.force_uid => u,
            _ => owner.uid,
        };
        let gid = match e.gid {
            Some(g) if !owner.force_gid => g,
            _ => owner.gid,
        };
        let loc = match (&e.data, kind) {
            (_, Kind::Dir) => None,
            (_, k) if k.is_special() => None,
            (Loc::None, Kind::Symlink) => Some(Loc::Inline(e.link.clone().into_boxed_slice())),
            (Loc::None, _) => Some(Loc::Inline(Box::default())),
            (loc, _) => Some(loc.clone()),
        };
        let member = loc.map(|loc| Member {
            archive,
            loc,
            size: e.size,
        });
        let node = Building {
            kind,
            perm: if kind == Kind::Symlink { 0o777 } else { e.perm },
            mtime: e.mtime,
            uid,
            gid,
            size: if kind == Kind::Dir || kind.is_special() {
                0
            } else {
                e.size
            },
            archive,
            explicit: true,
            member,
            children: NO_CHILDREN,
            group: None,
            extra: Extra::of(e),
        };
        match self.child(dir, last) {
            None => Some(self.push_child(dir, last.to_vec(), node)),
            Some(existing) => {
                let old = &mut self.nodes[existing];
                match (old.kind == Kind::Dir, kind == Kind::Dir) {
                    (true, true) => {
                        // Directories merge; the last explicit entry sets the metadata.
                        old.perm = node.perm;
                        old.mtime = node.mtime;
                        old.uid = node.uid;
                        old.gid = node.gid;
                        old.archive = archive;
                        old.explicit = true;
                        old.extra = node.extra;
                        Some(existing)
                    }
                    (true, false) => {
                        self.conflicts.push(Conflict {
                            path: comps.join(&b'/'),
                            winner: old.archive,
                            loser: archive,
                            reason: "a directory hides a later file",
                        });
                        None
                    }
                    (false, is_dir) => {
                        self.conflicts.push(Conflict {
                            path: comps.join(&b'/'),
                            winner: archive,
                            loser: old.archive,
                            reason: if is_dir {
                                "a directory replaces a file"
                            } else {
                                "a later file replaces an earlier one"
                            },
                        });
                        *old = node;
                        Some(existing)
                    }
                }
            }
        }
    }

    fn push_child(&mut self, dir: usize, name: Vec<u8>, node: Building) -> usize {
        let idx = self.nodes.len();
        if self.nodes[dir].children == NO_CHILDREN {
            self.nodes[dir].children = self.dirs.len() as u32;
            self.dirs.push(NameMap::default());
        }
        self.dirs[self.nodes[dir].children as usize].insert(name, idx);
        self.nodes.push(node);
        idx
    }

    /// The child of node `dir` named `name`.
    fn child(&self, dir: usize, name: &[u8]) -> Option<usize> {
        self.dirs
            .get(self.nodes[dir].children as usize)?
            .get(name)
            .copied()
    }

    /// The children of node `dir`, if it has had any.
    fn children_mut(&mut self, dir: usize) -> Option<&mut NameMap> {
        self.dirs.get_mut(self.nodes[dir].children as usize)
    }

    /// Freeze into the immutable [`Tree`], numbering inodes breadth-first.
    pub fn finish(self) -> Tree {
        let TreeBuilder {
            nodes,
            dirs,
            conflicts,
            skipped,
            grafts: graft_nodes,
            ..
        } = self;
        let mut f = Frozen::breadth_first(nodes, dirs, &graft_nodes);
        f.link_groups();
        f.dir_link_counts();
        let has_xattrs = f.extras.values().any(|x| !x.xattrs.is_empty());
        Tree {
            nodes: f.nodes,
            names: f.names,
            members: f.members,
            conflicts,
            skipped,
            total_bytes: f.total_bytes,
            extras: f.extras,
            has_xattrs,
            grafts: f.grafts,
        }
    }
}

/// A tree being frozen by [`TreeBuilder::finish`]: its nodes in inode order and what
/// goes with them.
struct Frozen {
    nodes: Vec<Node>,
    names: Vec<u8>,
    members: Vec<Member>,
    total_bytes: u64,
    extras: HashMap<u64, Box<Extra>>,
    /// The inodes of each hard-link group, in order.
    groups: BTreeMap<u32, Vec<u64>>,
    grafts: HashMap<u64, u32>,
}

impl Frozen {
    /// The nodes of a builder numbered breadth-first (each directory's children sorted
    /// by name, so they are consecutive and in order).
    fn breadth_first(
        mut nodes: Vec<Building>,
        mut dirs: Vec<NameMap>,
        graft_nodes: &HashMap<usize, u32>,
    ) -> Frozen {
        let mut f = Frozen {
            nodes: Vec::with_capacity(nodes.len()),
            names: Vec::new(),
            members: Vec::new(),
            total_bytes: 0,
            extras: HashMap::new(),
            groups: BTreeMap::new(),
            grafts: HashMap::new(),
        };
        // Queue of (building index, parent inode, name); the output index is the queue
        // position.
        let mut queue: Vec<(usize, u64, Vec<u8>)> = Vec::with_capacity(nodes.len());
        queue.push((0, ROOT_INO, Vec::new()));
        let mut head = 0;
        while head < queue.len() {
            let (bi, parent) = (queue[head].0, queue[head].1);
            let name = std::mem::take(&mut queue[head].2);
            let ino = head as u64 + 1;
            head += 1;
            let b = &mut nodes[bi];
            let mut kids: Vec<(Vec<u8>, usize)> = dirs
                .get_mut(b.children as usize)
                .map(std::mem::take)
                .unwrap_or_default()
                .into_iter()
                .collect();
            kids.sort_unstable();
            let first_child = queue.len() as u64 + 1;
            let count = kids.len() as u32;
            for (kid_name, k) in kids {
                queue.push((k, ino, kid_name));
            }
            if !graft_nodes.is_empty()
                && let Some(&g) = graft_nodes.get(&bi)
            {
                f.grafts.insert(ino, g);
            }
            f.push(&mut nodes[bi], ino, parent, &name, (first_child, count));
        }
        f
    }

    /// Node `ino` named `name` in `parent`, from `b`; a directory's `children` are its
    /// first child's inode and their count.
    fn push(&mut self, b: &mut Building, ino: u64, parent: u64, name: &[u8], children: (u64, u32)) {
        let name_off = self.names.len() as u32;
        self.names.extend_from_slice(name);
        if let Some(g) = b.group {
            self.groups.entry(g).or_default().push(ino);
        }
        if let Some(x) = b.extra.take() {
            self.extras.insert(ino, x);
        }
        let (a, count, nlink) = match (b.kind, b.member.take()) {
            (Kind::Dir, _) => (children.0, children.1, 0),
            (_, Some(m)) => {
                self.total_bytes += m.size;
                self.members.push(m);
                ((self.members.len() - 1) as u64, 0, 1)
            }
            // Devices, FIFOs and sockets: no data.
            (_, None) => (u64::MAX, 0, 1),
        };
        self.nodes.push(Node {
            name_off,
            name_len: name.len() as u32,
            parent,
            kind: b.kind,
            perm: b.perm,
            nlink,
            uid: b.uid,
            gid: b.gid,
            mtime: b.mtime,
            size: b.size,
            archive: b.archive,
            a,
            b: count,
            alias: 0,
        });
    }

    /// Hard links: every name of a group shares the inode of its first name (and its
    /// extras); the data is counted once.
    fn link_groups(&mut self) {
        for inos in self.groups.values() {
            let canonical = inos[0];
            for &ino in inos {
                let n = &mut self.nodes[ino as usize - 1];
                n.nlink = inos.len() as u32;
                if ino != canonical {
                    n.alias = canonical;
                    self.total_bytes -= n.size;
                }
            }
            for &ino in &inos[1..] {
                self.extras.remove(&ino);
            }
        }
    }

    /// Directory link counts: 2 plus one per subdirectory.
    fn dir_link_counts(&mut self) {
        let out = &mut self.nodes;
        for i in 0..out.len() {
            if out[i].kind == Kind::Dir {
                let first = out[i].a as usize;
                let n = out[i].b as usize;
                let subdirs = out[first - 1..first - 1 + n]
                    .iter()
                    .filter(|c| c.kind == Kind::Dir)
                    .count();
                out[i].nlink = 2 + subdirs as u32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: Ownership = Ownership::defaults(7, 8);

    fn file(path: &str, size: u64) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            perm: 0o644,
            mtime: 100,
            uid: None,
            gid: None,
            size,
            data: Loc::Record(size as u32),
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    fn dir(path: &str, perm: u16) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::Dir,
            perm,
            mtime: 200,
            uid: Some(1),
            gid: Some(2),
            size: 0,
            data: Loc::None,
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn places_strip_components_and_put_a_prefix_in_front() {
        let link = Entry {
            kind: EntryKind::HardLink,
            link: b"pkg-1.0/lib/a".to_vec(),
            ..file("pkg-1.0/lib/b", 0)
        };
        let entries = vec![
            dir("pkg-1.0/", 0o700),
            file("pkg-1.0/lib/a", 3),
            link,
            file("top-level", 4),
        ];
        let mut b = TreeBuilder::new(OWNER);
        let place = Place {
            strip: 1,
            prefix: vec![b"x".to_vec(), b"node_modules".to_vec()],
        };
        b.add_layer_at(0, 0, &entries, &place);
        let t = b.finish();
        assert!(t.skipped.is_empty(), "{:?}", t.skipped);
        let a = t.resolve(b"x/node_modules/lib/a").unwrap();
        let hb = t.resolve(b"x/node_modules/lib/b").unwrap();
        assert_eq!(t.canonical(hb), a, "the hard link's target is placed too");
        assert!(
            t.resolve(b"x/node_modules/top-level").is_none(),
            "no more components than stripped: left out, as tar leaves it"
        );
        assert!(t.resolve(b"pkg-1.0").is_none());
        assert_eq!(
            t.len(),
            6,
            "/, x, node_modules, lib, a, b (a name of a's inode)"
        );
    }

    fn build(layers: &[Vec<Entry>]) -> Tree {
        let mut b = TreeBuilder::new(OWNER);
        for (i, l) in layers.iter().enumerate() {
            b.add_layer(i as u32, 1000 + i as i64, l);
        }
        b.finish()
    }

    fn names(t: &Tree, path: &str) -> Vec<String> {
        let d = t.node(t.resolve(path.as_bytes()).unwrap()).unwrap();
        t.children(d)
            .map(|(_, n)| String::from_utf8_lossy(t.name(n)).into_owned())
            .collect()
    }

    #[test]
    fn implied_directories_and_sorted_children() {
        let t = build(&[vec![file("b/z", 1), file("b/a", 2), file("a/x/y", 3)]]);
        assert_eq!(names(&t, ""), ["a", "b"]);
        assert_eq!(names(&t, "b"), ["a", "z"]);
        let x = t.node(t.resolve(b"a/x").unwrap()).unwrap();
        assert_eq!(
            (x.kind, x.perm, x.mtime, x.uid),
            (Kind::Dir, 0o755, 1000, 7)
        );
        assert_eq!(t.node(ROOT_INO).unwrap().nlink, 4);
        assert_eq!(t.path_of(t.resolve(b"a/x/y").unwrap()), b"a/x/y");
        assert_eq!(t.total_bytes, 6);
        assert!(t.resolve(b"a/nope").is_none());
        assert!(t.resolve(b"b/a/deeper").is_none(), "a file has no children");
    }

    #[test]
    fn a_walk_visits_the_tree_depth_first_in_name_order() {
        let t = build(&[vec![
            file("b/z", 1),
            file("b/a", 2),
            file("a/x/y", 3),
            file("a/w", 1),
            dir("c/", 0o755),
            file("a/z", 1),
        ]]);
        let mut order = Vec::new();
        let mut at = ROOT_INO;
        while let Some(next) = t.next_in_walk(at) {
            order.push(String::from_utf8(t.path_of(next)).unwrap());
            at = next;
        }
        // `find` prints the same order.
        assert_eq!(
            order,
            ["a", "a/w", "a/x", "a/x/y", "a/z", "b", "b/a", "b/z", "c"]
        );
    }

    #[test]
    fn later_file_wins_inside_an_implied_directory() {
        let t = build(&[
            vec![dir("a/", 0o755), file("a/x", 1), file("s/v", 1)],
            vec![file("d/r", 3), file("s/v", 2)],
        ]);
        let v = t.node(t.resolve(b"s/v").unwrap()).unwrap();
        assert_eq!((v.size, v.archive), (2, 1));
    }

    #[test]
    fn later_file_wins_and_conflict_is_recorded() {
        let t = build(&[vec![file("f", 1)], vec![file("f", 2)]]);
        let f = t.node(t.resolve(b"f").unwrap()).unwrap();
        assert_eq!((f.size, f.archive), (2, 1));
        assert_eq!(t.conflicts.len(), 1);
        assert_eq!((t.conflicts[0].winner, t.conflicts[0].loser), (1, 0));
    }

    #[test]
    fn directories_beat_files_in_either_order() {
        // Earlier directory, later file: the directory stays.
        let t = build(&[vec![file("d/inner", 1)], vec![file("d", 5)]]);
        assert_eq!(names(&t, "d"), ["inner"]);
        // Earlier file, later directory (implied or explicit): the directory replaces it.
        let t = build(&[vec![file("d", 5)], vec![file("d/inner", 1)]]);
        assert_eq!(names(&t, "d"), ["inner"]);
        let t = build(&[vec![file("d", 5)], vec![dir("d/", 0o700)]]);
        assert_eq!(t.node(t.resolve(b"d").unwrap()).unwrap().perm, 0o700);
        assert_eq!(t.conflicts.len(), 1);
    }

    #[test]
    fn explicit_directory_metadata_last_wins() {
        let t = build(&[
            vec![dir("d/", 0o700), file("d/f", 1)],
            vec![dir("d/", 0o750)],
        ]);
        let d = t.node(t.resolve(b"d").unwrap()).unwrap();
        assert_eq!((d.perm, d.mtime, d.uid, d.gid), (0o750, 200, 1, 2));
        assert_eq!(names(&t, "d"), ["f"]);
        // A later layer that only implies the directory leaves explicit metadata alone.
        let t = build(&[vec![dir("d/", 0o700)], vec![file("d/g", 1)]]);
        assert_eq!(t.node(t.resolve(b"d").unwrap()).unwrap().perm, 0o700);
    }

    #[test]
    fn unsafe_paths_are_skipped_and_reported() {
        let t = build(&[vec![
            file("../evil", 1),
            file("/abs", 1),
            file("ok", 1),
            dir("./", 0o700),
        ]]);
        assert_eq!(names(&t, ""), ["ok"]);
        assert_eq!(t.skipped.len(), 2);
        assert_eq!(t.node(ROOT_INO).unwrap().perm, 0o755);
    }

    #[test]
    fn same_path_matches_whole_components_only() {
        assert!(same_path(b"", &[]));
        assert!(same_path(b"a/bc", &[b"a", b"bc"]));
        assert!(!same_path(b"a", &[]));
        assert!(!same_path(b"a/b", &[b"a", b"bc"]));
        assert!(!same_path(b"a/bc", &[b"a", b"b"]));
        assert!(!same_path(b"ab", &[b"a", b"b"]));
        assert!(!same_path(b"a/b", &[b"a"]));
    }

    /// The builder remembers the last entry's parent directory within a layer; these
    /// sequences change the tree between entries with the same parent.
    #[test]
    fn entries_of_one_directory_land_there_whatever_comes_between() {
        let t = build(&[
            vec![
                file("a/b/x", 1),
                file("a/b", 9),
                file("a/b/y", 1),
                file("a\\b\\w", 1),
                file("./a//b/v", 1),
                file("c/d", 1),
                file("e", 5),
                file("e/f", 1),
                file("e/g", 1),
                file("a/b/z", 1),
                dir("a/b/", 0o700),
                file("a/b/q", 1),
            ],
            vec![file("a/b/n", 1)],
        ]);
        assert_eq!(names(&t, "a/b"), ["n", "q", "v", "w", "x", "y", "z"]);
        assert_eq!(names(&t, "e"), ["f", "g"]);
        assert_eq!(names(&t, "c"), ["d"]);
        let ab = t.node(t.resolve(b"a/b").unwrap()).unwrap();
        assert_eq!((ab.kind, ab.perm, ab.mtime), (Kind::Dir, 0o700, 200));
        // Implied by both layers: the second layer walks again (its first entry has the
        // same parent as the first layer's last) and updates it.
        let a = t.node(t.resolve(b"a").unwrap()).unwrap();
        assert_eq!((a.mtime, a.archive), (1001, 1));
        let reasons: Vec<_> = t.conflicts.iter().map(|c| c.reason).collect();
        assert_eq!(
            reasons,
            [
                "a directory hides a later file",
                "a directory replaces a file"
            ]
        );
    }

    fn build_oci(layers: &[Vec<Entry>]) -> Tree {
        let mut b = TreeBuilder::new(OWNER).with_whiteouts(true);
        for (i, l) in layers.iter().enumerate() {
            b.add_layer(i as u32, 1000 + i as i64, l);
        }
        b.finish()
    }

    #[test]
    fn whiteouts_remove_what_lower_layers_provide() {
        let lower = vec![
            file("etc/passwd", 10),
            file("etc/motd", 20),
            file("usr/lib/a.so", 30),
            file("usr/lib/b.so", 40),
            file("opt/x/1", 1),
            file("opt/x/2", 2),
            file("opt/y", 3),
            file("keep", 4),
        ];
        let upper = vec![
            // The layer's own `motd`, listed before its whiteout: it stays.
            file("etc/motd", 21),
            file("etc/.wh.motd", 0),
            file("etc/.wh.passwd", 0),
            file("usr/.wh.lib", 0),
            file("opt/x/3", 5),
            file("opt/x/.wh..wh..opq", 0),
            file("opt/x/4", 6),
            file("new/.wh.nothing", 0),
            file(".wh.absent", 0),
        ];
        let t = build_oci(&[lower.clone(), upper.clone()]);
        assert_eq!(names(&t, ""), ["etc", "keep", "new", "opt", "usr"]);
        assert_eq!(names(&t, "etc"), ["motd"]);
        let motd = t.node(t.resolve(b"etc/motd").unwrap()).unwrap();
        assert_eq!((motd.size, motd.archive), (21, 1));
        assert!(
            names(&t, "usr").is_empty(),
            "the directory and all below it"
        );
        assert_eq!(names(&t, "opt/x"), ["3", "4"], "opaque: only this layer's");
        assert_eq!(names(&t, "opt"), ["x", "y"]);
        assert!(names(&t, "new").is_empty(), "a whiteout's directory exists");
        assert_eq!(t.total_bytes, 21 + 3 + 4 + 5 + 6);
        let mut hidden: Vec<_> = t
            .conflicts
            .iter()
            .map(|c| {
                (
                    String::from_utf8(c.path.clone()).unwrap(),
                    c.winner,
                    c.loser,
                )
            })
            .collect();
        hidden.sort();
        assert_eq!(
            hidden,
            [
                ("etc/motd".to_string(), 1, 0),
                ("etc/passwd".to_string(), 1, 0),
                ("opt/x/1".to_string(), 1, 0),
                ("opt/x/2".to_string(), 1, 0),
                ("usr/lib".to_string(), 1, 0),
            ]
        );
        // A third layer can bring a whited-out path back.
        let t = build_oci(&[lower.clone(), upper.clone(), vec![file("usr/lib/c.so", 7)]]);
        assert_eq!(names(&t, "usr/lib"), ["c.so"]);
        // Without whiteouts the markers are plain files.
        let t = build(&[lower, upper]);
        assert_eq!(
            names(&t, "etc"),
            [".wh.motd", ".wh.passwd", "motd", "passwd"]
        );
        assert_eq!(names(&t, "usr/lib"), ["a.so", "b.so"]);
    }

    #[test]
    fn forced_owner_overrides_archive() {
        let mut b = TreeBuilder::new(Ownership {
            force_uid: true,
            ..OWNER
        });
        b.add_layer(0, 0, &[dir("d/", 0o755)]);
        let t = b.finish();
        let d = t.node(2).unwrap();
        assert_eq!((d.uid, d.gid), (7, 2));
    }
}
