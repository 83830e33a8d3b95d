//! The ground floor of the formats: what more than one format reads or writes, so that a
//! format module imports this floor (and `crate::io`, `crate::error`) and never another
//! format.
//!
//! - [`tar`]: tar headers (reading, scanning, writing), for every tar-based format;
//! - [`codec`]: the pkgfs index encoding (docs/FORMAT.md), which pkgfs packages embed and
//!   the index cache keeps for tarballs indexed by a pass;
//! - [`frames`]: a zstd stream of independent frames with a seek table, read frame by
//!   frame (pkgfs packages, seekable tar.zst, the frames of a zstd tarball);
//! - [`plain`]: the read path of an uncompressed tar stream, members read in place;
//! - [`gzip`]: gzip member headers;
//! - [`entry`]: the shapes every format shares (an index [`Entry`] and its [`Loc`], a
//!   blob's [`Probe`], a member's [`Reading`]), re-exported by `crate::format`;
//! - [`pass`]: what the index passes of compressed tarballs share (their decoder read
//!   as a tar stream, a layer's digest checked on the way);
//! - here: the limits every format applies, a bounds-checked byte [`Cursor`], and
//!   [`Capped`], the entry collector of a header walk.

pub mod codec;
pub mod entry;
pub mod frames;
pub mod gzip;
pub mod pass;
pub mod plain;
pub mod tar;
pub mod ztoc;

pub use self::entry::{Entry, EntryKind, Loc, Probe, Reading, Xattrs};
use crate::error::{Error, Result};

/// Most entries any archive's index may have (a hostile archive cannot make the tree
/// builder allocate without bound).
pub const MAX_ENTRIES: usize = 2_000_000;

/// The header of a zstd skippable frame: magic and length.
pub const SKIPPABLE_HEADER: usize = 8;

/// The little-endian `u32` at `at` of `b` (the caller has checked the length).
pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A little-endian reader over bytes that fails instead of panicking: every read is
/// bounds-checked, and running out is an error naming what was being read.
pub struct Cursor<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    /// A cursor over `bytes`, which hold `what` (for the error when they run out).
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Cursor { rest: bytes, what }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(Error::Format(format!("{} is truncated", self.what)));
        }
        let (h, t) = self.rest.split_at(n);
        self.rest = t;
        Ok(h)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        let mut x = [0u8; 8];
        x.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(x))
    }

    /// What is left.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

/// The entries of a header walk (`tar::each`, `tar::walk_blob`), at most
/// [`MAX_ENTRIES`], each with its data at its offset in the tar stream.
#[derive(Default)]
pub struct Capped {
    /// The entries so far.
    pub entries: Vec<Entry>,
}

impl Capped {
    /// Take one header: an error past [`MAX_ENTRIES`] or for an entry the header walk
    /// cannot make.
    pub fn push(&mut self, te: &tar::TarEntry) -> std::result::Result<(), tar::TarError> {
        if self.entries.len() >= MAX_ENTRIES {
            return Err(tar::TarError::Format(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        let e = te
            .clone()
            .into_entry(Loc::Stream)
            .map_err(tar::TarError::Format)?;
        self.entries.push(e);
        Ok(())
    }
}
