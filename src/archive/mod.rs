//! Archive readers: turn an archive file into a flat list of [`Entry`] values.
//!
//! A reader looks only at an archive's index (for ZIP, the end record and the central
//! directory), never at member data: mounting costs the size of the indexes. Each entry
//! carries the raw path as stored (normalisation and merging are the tree's job, see
//! [`crate::tree`]) and a [`DataRef`] that says where its bytes live, which the read path
//! ([`crate::read`]) later resolves.

pub mod zip;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::error::{Error, Result};

/// What kind of node an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link; the target is the member's data.
    Symlink,
    /// A device, FIFO or socket: listed by the reader, never mounted.
    Special,
}

/// Where a member's bytes are and how they are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZipData {
    /// Absolute offset of the member's local file header in the archive file.
    pub header_offset: u64,
    /// Size of the (possibly compressed) data.
    pub compressed_size: u64,
    /// CRC-32 of the uncompressed data, from the central directory.
    pub crc32: u32,
    /// The ZIP compression method number (0 stored, 8 deflate, 93 zstd, …).
    pub method: u16,
    /// The member is encrypted (general purpose flag bit 0).
    pub encrypted: bool,
}

/// The location of an entry's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataRef {
    /// Directories carry no data.
    None,
    /// A ZIP member.
    Zip(ZipData),
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
    pub data: DataRef,
}

/// The supported archive formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A ZIP archive (also .jar, .whl, .apk…).
    Zip,
}

/// An open archive file with its parsed index.
#[derive(Debug)]
pub struct Archive {
    /// The path it was opened from.
    pub path: PathBuf,
    /// The open file; reads use positional I/O, so one handle serves every thread.
    pub file: File,
    /// The file's size when it was indexed.
    pub size: u64,
    /// The file's modification time (seconds), used for implied directories.
    pub mtime: i64,
    /// Its format.
    pub format: Format,
}

/// An archive together with the entries of its index.
#[derive(Debug)]
pub struct Indexed {
    /// The open archive.
    pub archive: Archive,
    /// Its entries, in index order.
    pub entries: Vec<Entry>,
}

/// Why an archive could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The file is not an archive of a known format (it is ignored quietly when found in
    /// a directory).
    NotAnArchive,
    /// It looks like an archive but cannot be used.
    Bad(Error),
}

/// Open `path`, detect its format by content and read its index.
pub fn open(path: &Path) -> std::result::Result<Indexed, OpenError> {
    let file = File::open(path).map_err(|e| OpenError::Bad(Error::Io(e)))?;
    let meta = file.metadata().map_err(|e| OpenError::Bad(Error::Io(e)))?;
    if !meta.is_file() {
        return Err(OpenError::NotAnArchive);
    }
    let size = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    let entries = match zip::read_index(&file, size) {
        Ok(entries) => entries,
        Err(zip::IndexError::NotZip) => return Err(OpenError::NotAnArchive),
        Err(zip::IndexError::Bad(e)) => return Err(OpenError::Bad(e)),
    };
    Ok(Indexed {
        archive: Archive {
            path: path.to_path_buf(),
            file,
            size,
            mtime,
            format: Format::Zip,
        },
        entries,
    })
}

/// Read exactly `buf.len()` bytes at `offset`, or fail with a clear error if the file
/// ends first (a truncated archive).
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(Error::Format(format!(
                    "unexpected end of file at offset {}",
                    offset + done as u64
                )));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Io(e)),
        }
    }
    Ok(())
}
