//! Archive readers: turn an archive file into a flat list of [`Entry`] values.
//!
//! A reader looks only at an archive's index (for ZIP, the end record and the central
//! directory), never at member data: mounting costs the size of the indexes. Each entry
//! carries the raw path as stored (normalisation and merging are the tree's job, see
//! [`crate::tree`]) and a [`DataRef`] that says where its bytes live, which the read path
//! ([`crate::read`]) later resolves.

pub mod inflate;

pub mod seekable;
pub mod tar;
pub mod zip;

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
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
    /// A hard link to an earlier entry (tar); the target path is in [`Entry::link`].
    HardLink,
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
    /// Length and CRC-32 of the name stored in the central directory: the local header
    /// must carry the same name, or the entry overlaps another (a zip-bomb trick).
    pub name_len: u16,
    /// See `name_len`.
    pub name_crc: u32,
}

/// The location of an entry's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataRef {
    /// Directories carry no data.
    None,
    /// A ZIP member.
    Zip(ZipData),
    /// Bytes of the decompressed stream of a seekable-zstd archive, from this offset.
    Seekable {
        /// Offset in the decompressed (tar) stream.
        offset: u64,
    },
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
    /// Symlink target (when the format stores it in the index, as tar does; ZIP stores
    /// it as data) or hard-link target path.
    pub link: Vec<u8>,
}

/// The supported archive formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A ZIP archive (also .jar, .whl, .apk…).
    Zip,
    /// A seekable-zstd archive of a tar stream (`pkgfs pack`, t2sz, pyzstd…).
    SeekableTar,
}

/// An archive file with its parsed index.
///
/// Its descriptor may be closed to stay under the process's file limit (thousands of
/// packages) and reopened by path on the next read; a reopened file must be the same
/// file (device, inode, size and mtime), or reads fail rather than serve another file.
#[derive(Debug)]
pub struct Archive {
    /// The path it was opened from.
    pub path: PathBuf,
    /// The open file, when open; reads use positional I/O, so one handle serves every
    /// thread, and an `Arc` keeps it alive for readers while it is being closed.
    file: Mutex<Option<Arc<File>>>,
    /// Device and inode of the file.
    id: (u64, u64),
    /// The file's size when it was indexed.
    pub size: u64,
    /// The file's modification time (seconds), used for implied directories.
    pub mtime: i64,
    /// The file's modification time (seconds, nanoseconds) when indexed: a write to the
    /// file changes it, which is how a rewritten archive is noticed (see
    /// [`Archive::unchanged`]). Not the ctime: renaming or deleting a package changes its
    /// ctime but not its bytes, and must not break reads.
    pub mtime_ns: (i64, i64),
    /// Its format.
    pub format: Format,
    /// The seek table of a seekable-zstd archive.
    pub table: Option<seekable::SeekTable>,
    /// A number no other archive opened by this process has: the read path's cache keys
    /// use it, so blocks of a removed or replaced package can never be served for another.
    pub key: u32,
}

/// Source of [`Archive::key`].
static NEXT_KEY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn next_key() -> u32 {
    NEXT_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Archive {
    /// Device and inode number of the file.
    pub fn file_id(&self) -> (u64, u64) {
        self.id
    }

    /// An archive object with no file behind it (unit tests of the layers above).
    #[cfg(test)]
    pub(crate) fn detached(name: &str) -> Self {
        Archive {
            path: PathBuf::from(name),
            file: Mutex::new(None),
            id: (0, 0),
            size: 0,
            mtime: 0,
            mtime_ns: (0, 0),
            format: Format::Zip,
            table: None,
            key: next_key(),
        }
    }

    /// The open file, reopening it by path if it was closed.
    pub fn file(&self) -> Result<Arc<File>> {
        let mut slot = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let f = File::open(&self.path)?;
        let meta = f.metadata()?;
        if (meta.dev(), meta.ino()) != self.id {
            return Err(Error::Corrupt(
                "the archive was replaced by another file while mounted".into(),
            ));
        }
        let f = Arc::new(f);
        *slot = Some(f.clone());
        drop(slot);
        self.unchanged_in(&meta)?;
        Ok(f)
    }

    /// Whether the descriptor is open.
    pub fn is_open(&self) -> bool {
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Close the descriptor (readers holding it keep it until they finish).
    pub fn close(&self) {
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Check that the file still has the size and modification time it was indexed with.
    /// Called after reading from it: bytes read from a file rewritten in place must not
    /// be served as if they were the old ones.
    pub fn unchanged(&self) -> Result<()> {
        let meta = self.file()?.metadata()?;
        self.unchanged_in(&meta)
    }

    fn unchanged_in(&self, meta: &std::fs::Metadata) -> Result<()> {
        if meta.len() != self.size || (meta.mtime(), meta.mtime_nsec()) != self.mtime_ns {
            return Err(Error::Corrupt(format!(
                "the archive changed while mounted (size {} -> {}); its reads return EIO until remounted",
                self.size,
                meta.len()
            )));
        }
        Ok(())
    }
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

/// A file pkgfs recognises by its first bytes but cannot serve in place: tarballs and
/// container image layers as usually shipped. In a package directory such a file is
/// skipped with a warning that names the fix, not ignored in silence; `pkgfs pack`
/// converts the tar streams among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// zstd frames without a seek table.
    Zstd,
    /// gzip.
    Gzip,
    /// bzip2.
    Bzip2,
    /// xz.
    Xz,
    /// An uncompressed tar archive.
    Tar,
}

impl Foreign {
    /// The format of a file starting with `head` (its first bytes, up to 512).
    pub fn detect(head: &[u8]) -> Option<Foreign> {
        Some(if seekable::is_plain_zstd(head) {
            Foreign::Zstd
        } else if head.starts_with(&[0x1f, 0x8b]) {
            Foreign::Gzip
        } else if head.starts_with(b"BZh") {
            Foreign::Bzip2
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Foreign::Xz
        } else if head.get(257..262) == Some(b"ustar") {
            Foreign::Tar
        } else {
            return None;
        })
    }

    /// What it is, and why it cannot be served in place.
    pub fn what(self) -> &'static str {
        match self {
            Foreign::Zstd => {
                "a zstd file without a seek table (not seekable): it cannot be read in place"
            }
            Foreign::Gzip => "a gzip file (a .tar.gz?): it cannot be read in place",
            Foreign::Bzip2 => "a bzip2 file (a .tar.bz2?): it cannot be read in place",
            Foreign::Xz => "an xz file (a .tar.xz?): it cannot be read in place",
            Foreign::Tar => {
                "an uncompressed tar archive: it has no index, so mounting it would read it all"
            }
        }
    }

    /// For the formats `pkgfs pack` does not decompress itself (it reads plain, gzip and
    /// zstd tar streams): the pipe that packs `file` (standard input if `None`) into
    /// `package`, e.g. `xz -dc FILE | pkgfs pack - -o PACKAGE`.
    pub fn pipe(self, file: Option<&str>, package: &str) -> Option<String> {
        let tool = match self {
            Foreign::Bzip2 => "bzip2",
            Foreign::Xz => "xz",
            _ => return None,
        };
        let file = file.map(|f| format!(" {f}")).unwrap_or_default();
        Some(format!("{tool} -dc{file} | pkgfs pack - -o {package}"))
    }

    /// The fix, for messages.
    pub fn fix(self) -> String {
        match self.pipe(Some("FILE"), "PACKAGE") {
            Some(pipe) => format!("convert it through a pipe with `{pipe}`"),
            None => "convert it with `pkgfs pack FILE -o PACKAGE`".into(),
        }
    }
}

/// Open `path`, detect its format by content and read its index. `cache` keeps the
/// indexes of seekable archives that have no pkgfs index.
pub fn open(
    path: &Path,
    cache: Option<&seekable::IndexCache>,
) -> std::result::Result<Indexed, OpenError> {
    let bad = |e: Error| OpenError::Bad(e);
    let file = File::open(path).map_err(|e| bad(Error::Io(e)))?;
    let meta = file.metadata().map_err(|e| bad(Error::Io(e)))?;
    if !meta.is_file() {
        return Err(OpenError::NotAnArchive);
    }
    let size = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    let (tail, _) = zip::first_tail(&file, size).map_err(bad)?;
    let (format, table, entries) = match seekable::read_table(&file, size, &tail).map_err(bad)? {
        Some(mut table) => {
            let entries =
                seekable_entries(path, &file, &meta, &table, &tail, size, cache).map_err(bad)?;
            table.count_file_bytes(&entries);
            (Format::SeekableTar, Some(table), entries)
        }
        None => match zip::read_index_from(&file, size, tail) {
            Ok(entries) => (Format::Zip, None, entries),
            Err(zip::IndexError::NotZip) => {
                let mut head = [0u8; 512];
                let n = head.len().min(usize::try_from(size).unwrap_or(usize::MAX));
                if read_exact_at(&file, &mut head[..n], 0).is_ok()
                    && let Some(f) = Foreign::detect(&head[..n])
                {
                    return Err(bad(Error::Unsupported(format!(
                        "{}; {}",
                        f.what(),
                        f.fix()
                    ))));
                }
                return Err(OpenError::NotAnArchive);
            }
            Err(zip::IndexError::Bad(e)) => return Err(bad(e)),
        },
    };
    Ok(Indexed {
        archive: Archive {
            path: path.to_path_buf(),
            file: Mutex::new(Some(Arc::new(file))),
            id: (meta.dev(), meta.ino()),
            size,
            mtime,
            mtime_ns: (meta.mtime(), meta.mtime_nsec()),
            format,
            table,
            key: next_key(),
        },
        entries,
    })
}

/// Read the index of an already open archive again (a live mount rebuilding its tree
/// keeps archive objects, not their entries, so memory stays proportional to the tree).
/// Fails if the file changed since it was indexed.
pub fn reindex(archive: &Archive, cache: Option<&seekable::IndexCache>) -> Result<Vec<Entry>> {
    let file = archive.file()?;
    let meta = file.metadata()?;
    archive.unchanged_in(&meta)?;
    let (tail, _) = zip::first_tail(&file, archive.size)?;
    let entries = match &archive.table {
        Some(table) => seekable_entries(
            &archive.path,
            &file,
            &meta,
            table,
            &tail,
            archive.size,
            cache,
        )?,
        None => match zip::read_index_from(&file, archive.size, tail) {
            Ok(entries) => entries,
            Err(zip::IndexError::NotZip) => {
                return Err(Error::Corrupt("the archive is no longer a ZIP file".into()));
            }
            Err(zip::IndexError::Bad(e)) => return Err(e),
        },
    };
    archive.unchanged()?;
    Ok(entries)
}

/// The entries of a seekable archive: its pkgfs index, else a cached index, else a scan
/// of its tar headers (stored in the cache for next time).
fn seekable_entries(
    path: &Path,
    file: &File,
    meta: &std::fs::Metadata,
    table: &seekable::SeekTable,
    tail: &[u8],
    size: u64,
    cache: Option<&seekable::IndexCache>,
) -> Result<Vec<Entry>> {
    if let Some(entries) = seekable::read_embedded_index(file, table, tail, size)? {
        return Ok(entries);
    }
    let key = cache.map(|c| (c, c.key_path(meta, table)));
    if let Some((c, k)) = &key
        && let Some(entries) = c.load(k, table)
    {
        log::debug!("{}: index from cache {}", path.display(), k.display());
        return Ok(entries);
    }
    log::warn!(
        "{}: seekable archive without a pkgfs index: scanning its tar headers (once{})",
        path.display(),
        if key.is_some() {
            "; the index is cached"
        } else {
            "; no index cache"
        }
    );
    let entries = tar::scan(seekable::StreamReader::new(file, table))
        .map_err(|e| Error::Format(format!("tar stream: {e}")))?
        .into_iter()
        .map(tar_entry)
        .collect::<Result<Vec<_>>>()?;
    for e in &entries {
        if let DataRef::Seekable { offset } = e.data
            && offset
                .checked_add(e.size)
                .is_none_or(|end| end > table.total)
        {
            return Err(Error::Format(
                "a tar entry runs past the end of the stream".into(),
            ));
        }
    }
    if let Some((c, k)) = &key
        && let Err(e) = c.store(k, &entries)
    {
        log::warn!(
            "cannot store the index of {} in {}: {e}",
            path.display(),
            k.display()
        );
    }
    Ok(entries)
}

/// `pkgfs check` of a seekable archive: decode every frame (verifying the zstd
/// checksums), scan the tar stream, and compare it with the index the mount uses.
/// Returns the differences found.
pub fn verify_seekable(archive: &Archive, index: &[Entry]) -> Result<Vec<String>> {
    let table = archive
        .table
        .as_ref()
        .ok_or_else(|| Error::Format("not a seekable archive".into()))?;
    let file = archive.file()?;
    let scanned: Vec<Entry> = tar::scan(seekable::StreamReader::new(&file, table))
        .map_err(|e| Error::Corrupt(format!("tar stream: {e}")))?
        .into_iter()
        .map(tar_entry)
        .collect::<Result<_>>()?;
    let mut problems = Vec::new();
    if scanned.len() != index.len() {
        problems.push(format!(
            "the index lists {} entries, the tar stream has {}",
            index.len(),
            scanned.len()
        ));
    }
    let trim = |p: &[u8]| -> Vec<u8> {
        let p = p.strip_prefix(b"./").unwrap_or(p);
        p.strip_suffix(b"/").unwrap_or(p).to_vec()
    };
    for (i, s) in index.iter().zip(&scanned) {
        let same = trim(&i.path) == trim(&s.path)
            && i.kind == s.kind
            && i.size == s.size
            && i.data == s.data
            && i.link == s.link;
        if !same {
            problems.push(format!(
                "index entry {:?} disagrees with the tar stream ({:?})",
                String::from_utf8_lossy(&i.path),
                String::from_utf8_lossy(&s.path)
            ));
        }
    }
    Ok(problems)
}

/// Convert a scanned tar entry.
fn tar_entry(t: tar::TarEntry) -> Result<Entry> {
    let kind = match t.kind {
        tar::TarKind::File => EntryKind::File,
        tar::TarKind::Dir => EntryKind::Dir,
        tar::TarKind::Symlink => EntryKind::Symlink,
        tar::TarKind::HardLink => EntryKind::HardLink,
        tar::TarKind::Other(_) => EntryKind::Special,
    };
    Ok(Entry {
        size: match kind {
            EntryKind::File => t.size,
            EntryKind::Symlink => t.link.len() as u64,
            _ => 0,
        },
        data: if kind == EntryKind::File {
            DataRef::Seekable {
                offset: t.data_offset,
            }
        } else {
            DataRef::None
        },
        path: t.path,
        kind,
        perm: (t.mode & 0o7777) as u16,
        mtime: t.mtime,
        uid: u32::try_from(t.uid).ok(),
        gid: u32::try_from(t.gid).ok(),
        link: t.link,
    })
}

/// How many archives may keep a descriptor open: the soft `RLIMIT_NOFILE` less a reserve
/// for FUSE channels, logs and the index cache. Beyond it, descriptors are closed and
/// reopened on demand.
pub fn descriptor_budget() -> usize {
    // SAFETY: getrlimit fills a local struct.
    let soft = unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur
        } else {
            1024
        }
    };
    (soft.min(1 << 20) as usize).saturating_sub(128).max(16)
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
