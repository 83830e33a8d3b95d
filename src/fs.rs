//! The filesystem operations, with no FUSE in them.
//!
//! [`PkgFs`] answers `lookup`, `getattr`, `readdir`, `readlink`, `read` and `statfs` over
//! the merged [`Tree`] and the [`Reader`], returning [`Result`]s. The FUSE adapter
//! (`crate::fuse`) only translates; the offline tools (`ls`, `cat`, `check`) and the
//! tests call this directly. Everything here is `&self` and thread-safe: the tree is
//! immutable, and the reader's caches lock internally.

use std::collections::HashSet;
use std::sync::Mutex;

use log::warn;

use crate::archive::Archive;
use crate::error::{Error, Result};
use crate::read::Reader;
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
}

/// One directory entry handed to a `readdir` callback.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    /// Inode number.
    pub ino: u64,
    /// Offset to resume after this entry.
    pub next_offset: u64,
    /// Type.
    pub kind: Kind,
    /// Name.
    pub name: &'a [u8],
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

/// The mounted filesystem.
pub struct PkgFs {
    tree: Tree,
    reader: Reader,
    reported: Mutex<HashSet<u64>>,
}

impl PkgFs {
    /// Assemble the filesystem from its tree and the archives the tree refers to.
    pub fn new(tree: Tree, archives: Vec<Archive>, cache_bytes: u64) -> Self {
        let members = tree.member_count();
        PkgFs {
            reader: Reader::new(archives, members, cache_bytes),
            tree,
            reported: Mutex::new(HashSet::new()),
        }
    }

    /// The merged tree.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The read path (statistics, archives).
    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    fn node(&self, ino: u64) -> Result<&Node> {
        self.tree.node(ino).ok_or(Error::NotFound)
    }

    fn attr_of(&self, ino: u64, n: &Node) -> Attr {
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
        }
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.attr_of(ino, self.node(ino)?))
    }

    /// Find `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let dir = self.node(parent)?;
        if dir.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let ino = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => self
                .tree
                .lookup(dir, name)
                .map(|i| self.tree.canonical(i))
                .ok_or(Error::NotFound)?,
        };
        self.getattr(ino)
    }

    /// List directory `ino` from `offset` (0 to start; then the `next_offset` of the last
    /// entry taken). `add` returns `true` when the caller's buffer is full. Entries come
    /// in a fixed order: `.`, `..`, then children in byte order of their names.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let dir = self.node(ino)?;
        if dir.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        // Positions: 0 is ".", 1 is "..", 2 + i is child i. Resuming at a large offset
        // must not walk the entries before it (directories can hold 100,000 names).
        let dots = [(ino, &b"."[..]), (dir.parent, &b".."[..])];
        let children = self
            .tree
            .children_from(dir, offset.saturating_sub(2))
            .map(|(i, n)| (self.tree.canonical(i), self.tree.name(n)));
        let entries = dots
            .into_iter()
            .skip(offset.min(2) as usize)
            .chain(children);
        for (pos, (child, name)) in (offset..).zip(entries) {
            let kind = self.node(child)?.kind;
            let full = add(DirEntry {
                ino: child,
                next_offset: pos + 1,
                kind,
                name,
            });
            if full {
                break;
            }
        }
        Ok(())
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        if node.kind != Kind::Symlink {
            return Err(Error::NotSymlink);
        }
        if node.size == 0 || node.size > MAX_LINK {
            return self.report(
                ino,
                Error::Corrupt(format!("symlink target of {} bytes", node.size)),
            );
        }
        let target = self.read_node(ino, node, 0, node.size as u32)?;
        if target.contains(&0) {
            return self.report(ino, Error::Corrupt("symlink target contains NUL".into()));
        }
        Ok(target)
    }

    /// Read up to `size` bytes of file `ino` at `offset`.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        match node.kind {
            Kind::Dir => Err(Error::IsDir),
            _ => self.read_node(ino, node, offset, size),
        }
    }

    fn read_node(&self, ino: u64, node: &Node, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (Some(idx), Some(member)) = (self.tree.member_index(node), self.tree.member(node))
        else {
            return self.report(ino, Error::Format("file has no data".into()));
        };
        match self.reader.read(idx, member, offset, size) {
            Ok(data) => Ok(data),
            Err(e) => self.report(ino, e),
        }
    }

    /// Log a data error once per inode, naming the file and its archive, and return it.
    fn report<T>(&self, ino: u64, e: Error) -> Result<T> {
        let first = self
            .reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ino);
        if first {
            let archive = self
                .tree
                .node(ino)
                .and_then(|n| self.reader.archives().get(n.archive as usize))
                .map_or_else(|| "?".into(), |a| a.path.display().to_string());
            warn!(
                "read error in /{} (from {archive}): {e}; reads return EIO",
                String::from_utf8_lossy(&self.tree.path_of(ino))
            );
        }
        Err(e)
    }

    /// Filesystem statistics.
    pub fn statfs(&self) -> StatFs {
        StatFs {
            blocks: self.tree.total_bytes.div_ceil(u64::from(BLKSIZE)),
            files: self.tree.len() as u64,
            bsize: BLKSIZE,
            namelen: crate::path::NAME_MAX as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{DataRef, Entry, EntryKind};
    use crate::tree::{Ownership, TreeBuilder};

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
                data: DataRef::None,
                link: Vec::new(),
            })
            .collect();
        let mut b = TreeBuilder::new(Ownership {
            uid: 0,
            gid: 0,
            force_uid: false,
            force_gid: false,
        });
        b.add_layer(0, 0, &entries);
        let fs = PkgFs::new(b.finish(), Vec::new(), 0);
        let d = fs.lookup(1, b"d").unwrap().ino;
        let list = |from: u64, max: usize| {
            let mut got = Vec::new();
            fs.readdir(d, from, |e| {
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
}
