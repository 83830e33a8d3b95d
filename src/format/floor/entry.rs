//! The shapes every format shares: an index entry ([`Entry`], its [`EntryKind`] and the
//! [`Loc`] of its bytes), what is known of a blob before a format looks at it
//! ([`Probe`]), and what a read path is handed for one member ([`Reading`]).
//!
//! They live on the floor because the floor's own readers make and read them (the tar
//! header walk makes entries, the index codec encodes them, the frame and plain read
//! paths serve a `Reading`); `crate::format` re-exports them under their usual names.

use crate::error::Result;
use crate::io::Io;
use crate::io::blob::Blob;

/// What kind of node an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link; the target is the member's data, or [`Entry::link`].
    Symlink,
    /// A hard link to an earlier entry (tar); the target path is in [`Entry::link`].
    HardLink,
    /// A character device; its number is [`Entry::rdev`].
    CharDev,
    /// A block device; its number is [`Entry::rdev`].
    BlockDev,
    /// A FIFO (named pipe).
    Fifo,
    /// A socket.
    Socket,
    /// Something that cannot be served (a sparse file, an unknown type): listed by the
    /// reader, skipped by the tree with a warning.
    Special,
}

/// Extended attributes: (name, value) pairs, in the order the archive gives them.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Where an entry's bytes are, in the terms of its archive's format. Only the archive's
/// read path (its format's `Package`) interprets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// No bytes of its own (a directory; a tar symlink, whose target is
    /// [`Entry::link`]).
    None,
    /// The bytes themselves, kept in the index (a symlink target from a tar header).
    Inline(Box<[u8]>),
    /// From this offset of the archive's decompressed stream (tar-based formats).
    Stream(u64),
    /// The format's own record number `n` of the archive (a ZIP member: its local
    /// header, method, sizes and CRC).
    Record(u32),
}

/// One entry of an archive's index, before path normalisation and merging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path bytes as stored in the archive.
    pub path: Vec<u8>,
    /// File, directory, symlink…
    pub kind: EntryKind,
    /// Permission bits (`0o7777` mask).
    pub perm: u16,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Owner recorded in the archive, if any.
    pub uid: Option<u32>,
    /// Group recorded in the archive, if any.
    pub gid: Option<u32>,
    /// Uncompressed size in bytes.
    pub size: u64,
    /// Where the bytes are.
    pub data: Loc,
    /// Symlink target (when the format stores it in the index, as tar does; ZIP stores
    /// it as data) or hard-link target path.
    pub link: Vec<u8>,
    /// A device's number (`makedev(major, minor)`); 0 for anything else.
    pub rdev: u64,
    /// Extended attributes (pax `SCHILY.xattr.*` records, a TOC's `xattrs`).
    pub xattrs: Xattrs,
}

/// What is known of a file before any format looks at it: its first and last bytes.
#[derive(Debug)]
pub struct Probe {
    /// The first bytes (up to 512).
    pub head: Vec<u8>,
    /// The last bytes (up to [`Blob::first_tail`]): end records and seek tables live
    /// there, and a small archive's whole index often does.
    pub tail: Vec<u8>,
    /// The size of the blob.
    pub size: u64,
}

impl Probe {
    /// Read the head and tail of `blob` (one read for a small blob; otherwise both at
    /// once, which a remote blob fetches concurrently).
    pub fn read(blob: &dyn Blob) -> Result<Probe> {
        let size = blob.size();
        let tail_len = size.min(blob.first_tail());
        let mut tail = vec![0u8; tail_len as usize];
        let head_len = size.min(512) as usize;
        let head = if size <= tail_len {
            blob.read_exact_at(&mut tail, 0)?;
            tail[..head_len].to_vec()
        } else {
            let mut h = vec![0u8; head_len];
            blob.read_many(&mut [(&mut tail[..], size - tail_len), (&mut h[..], 0)])?;
            h
        };
        Ok(Probe { head, tail, size })
    }

    /// Offset of the tail in the blob.
    pub fn tail_start(&self) -> u64 {
        self.size - self.tail.len() as u64
    }
}

/// A member being read: what a format's read path gets.
#[derive(Clone, Copy)]
pub struct Reading<'a> {
    /// The shared read services.
    pub io: &'a Io,
    /// The archive's bytes.
    pub blob: &'a dyn Blob,
    /// The archive's cache key (`Archive::key`): the blocks of its members are named by
    /// it.
    pub key: u32,
    /// Where the member's bytes are.
    pub loc: &'a Loc,
    /// The member's size.
    pub size: u64,
}
