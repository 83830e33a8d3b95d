//! Archive formats: one module per format, each with its index and its read path.
//!
//! A format recognises its files by content ([`Format::open`], tried in the order of
//! [`FORMATS`]) and reads only their index: mounting costs the size of the indexes. It
//! returns the entries of that index, each with the raw path as stored (normalisation and
//! merging are the tree's job, see [`crate::tree`]) and a [`Loc`] saying where its bytes
//! are, in the terms of the format; and a [`Package`], the open archive's read path,
//! which later turns a `Loc` and a byte range into bytes through the shared services of
//! [`crate::io`]. Nothing else in pkgfs looks inside a `Loc`.
//!
//! Adding a format is a module here and a line in [`FORMATS`].

pub mod cache;
pub mod floor;
pub mod plaintar;
pub mod raw;
pub mod seekable;
pub mod targz;
pub mod toc;
pub mod zip;
pub mod zstdtar;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::digest::Digest;
use crate::io::{Io, ReadData, Span};

pub use self::cache::IndexCache;
pub use self::floor::entry::{Entry, EntryKind, Loc, Probe, Reading, Xattrs};
pub use self::floor::pass::DigestOf;

/// Told how a pass over an archive's data (the index pass of a tar.gz) is going.
pub trait IndexProgress: Sync {
    /// `done` of the `total` bytes of the archive `name` have been read.
    fn indexing(&self, name: &Path, done: u64, total: u64);
}

/// What an image's manifest promises about a layer, for the format to check as it opens
/// it (see [`open_layer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerCheck {
    /// The digest the layer must have.
    pub digest: Digest,
    /// What it is the digest of.
    pub of: DigestOf,
    /// The digest of the layer's table of contents as stored (zstd:chunked's
    /// `manifest-checksum` annotation), when the manifest gives one: a format that reads
    /// the layer through its table checks the table instead of the layer, and every
    /// chunk it serves against the table's own digests.
    pub toc_blob: Option<Digest>,
    /// The digest of the table's JSON (eStargz's `toc.digest` annotation), likewise.
    pub toc_json: Option<Digest>,
    /// A SOCI zTOC for the layer (from a SOCI index the image names): a gzip layer is
    /// then indexed from it instead of by a pass, each span checked against the zTOC's
    /// digests before it is decoded.
    pub ztoc: Option<ZtocRef>,
}

/// A zTOC blob and the digest its SOCI index gives it.
#[derive(Clone, Debug)]
pub struct ZtocRef {
    /// Its bytes.
    pub blob: Arc<dyn Blob>,
    /// What they must hash to.
    pub digest: Digest,
}

impl PartialEq for ZtocRef {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for ZtocRef {}

/// How much of a layer a format checked while opening it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checked {
    /// Nothing: whoever needs the layer checked reads it whole.
    Nothing,
    /// The layer's digest (its index pass hashed every byte).
    Digest,
    /// The digest of its table of contents; chunks are checked as they are read.
    Toc,
    /// The digest of its SOCI zTOC; spans are checked against the zTOC as they are read.
    Ztoc,
}

/// What opening needs besides the blob.
#[derive(Clone, Copy, Default)]
pub struct OpenContext<'a> {
    /// The promises of an image manifest about this blob, if it is an image's layer.
    pub layer: Option<&'a LayerCheck>,
    /// Where to keep indexes that cost a pass over the data to make (None: no cache).
    pub index_cache: Option<&'a IndexCache>,
    /// An archive larger than this that needs a pass over its data (its index is in no
    /// cache) is not opened now: [`Error::Deferred`], so the caller can do it in the
    /// background. `None`: always now.
    pub defer_over: Option<u64>,
    /// Who hears about passes over archives' data.
    pub progress: Option<&'a dyn IndexProgress>,
}

impl std::fmt::Debug for OpenContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenContext")
            .field("layer", &self.layer)
            .field("index_cache", &self.index_cache)
            .field("defer_over", &self.defer_over)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// An opened archive of some format: its read path and what it needs to keep.
pub trait Package: Send + Sync + std::fmt::Debug {
    /// The format's name, for `status` and messages.
    fn format(&self) -> &'static str;
    /// Itself, to reach a format's own type (tests, format-specific reports).
    fn as_any(&self) -> &dyn std::any::Any;
    /// The entries of the index, read again (a live rescan reuses an unchanged archive
    /// and reads its index anew rather than keeping every entry in memory). The same
    /// entries, with the same [`Loc`]s, as when it was opened.
    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>>;
    /// Bytes `[offset, end)` of the member `r` names (`end` at most its size); with
    /// [`Span::Piece`], as far as the first decoded unit goes.
    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData>;
    /// The bytes of the blob that reading the member whole reads: a hint for read-ahead,
    /// not a bound. `None` if unknown.
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)>;
    /// The kernel has been given bytes `[start, end)` of the member and keeps them:
    /// blocks it now holds whole may leave the cache ([`crate::io::cache::BlockCache::delivered`]).
    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64);
    /// The bytes of the blob its format says a start reads first and should be fetched
    /// at once (eStargz's prioritized files), if any.
    fn read_first(&self) -> Option<(u64, u64)> {
        None
    }
    /// The CRC-32 the index records for the member's bytes, if the format has one
    /// (`pkgfs check` compares it with what it reads).
    fn crc32(&self, _loc: &Loc) -> Option<u32> {
        None
    }
    /// Checks of the whole archive beyond reading every member (`pkgfs check`): the
    /// problems found.
    fn verify(&self, _archive: &Archive, _cx: &OpenContext) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// Where an archive's index came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexOrigin {
    /// The archive's own index (a ZIP's central directory, a package's index frame).
    Archive,
    /// The index cache.
    Cache,
    /// A pass over the archive's data (then stored in the cache, if there is one).
    Pass,
    /// A SOCI zTOC of the layer.
    Ztoc,
    /// Not read yet: the mount's tree was kept by an earlier mount (`source::kept`), and
    /// the index is read the first time a request needs it.
    Kept,
}

/// What a [`Format`] makes of a blob it recognises.
pub struct Opened {
    /// The read path.
    pub package: Box<dyn Package>,
    /// The index.
    pub entries: Vec<Entry>,
    /// Where the index came from.
    pub origin: IndexOrigin,
    /// What of [`OpenContext::layer`] was checked.
    pub checked: Checked,
}

/// One archive format.
pub trait Format: Sync {
    /// Its name.
    fn name(&self) -> &'static str;
    /// Open `blob` if it is in this format, reading its index; `Ok(None)` if it is not
    /// (the next format is tried). An error means it is this format but unusable.
    fn open(&self, blob: &Arc<dyn Blob>, probe: &Probe, cx: &OpenContext)
    -> Result<Option<Opened>>;
}

/// The formats pkgfs serves, in the order they are tried. A seekable zstd file is
/// recognised by its last bytes, a ZIP by its end record near the end: a file that is
/// both (one appended to the other) is read as the one whose index ends it. A gzip tar
/// archive is recognised by its first bytes (and the tar header they decode to).
pub static FORMATS: &[&dyn Format] = &[
    &toc::Toc,
    &seekable::SeekableZstd,
    &zip::Zip,
    &targz::TarGz,
    &zstdtar::ZstdTar,
    &plaintar::Tar,
];

/// An archive with its format's read path.
#[derive(Debug)]
pub struct Archive {
    /// How it is named (the path of a local file).
    pub path: PathBuf,
    /// Its bytes.
    pub blob: Arc<dyn Blob>,
    /// Its format's read path.
    pub package: Box<dyn Package>,
    /// A number no other archive opened by this process has: cache keys use it, so
    /// blocks of a removed or replaced package can never be served for another.
    pub key: u32,
    /// Where its index came from when it was opened.
    pub origin: IndexOrigin,
    /// What of an image layer's digests was checked (see [`open_layer`]).
    pub checked: Checked,
}

/// Source of [`Archive::key`].
static NEXT_KEY: AtomicU32 = AtomicU32::new(0);

impl Archive {
    /// An archive of `blob` read through `package`, whose index came from `origin`.
    pub fn new(blob: Arc<dyn Blob>, package: Box<dyn Package>, origin: IndexOrigin) -> Self {
        Archive {
            path: blob.name().to_path_buf(),
            blob,
            package,
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            origin,
            checked: Checked::Nothing,
        }
    }

    /// The format's name.
    pub fn format(&self) -> &'static str {
        self.package.format()
    }

    /// Its modification time (directories it implies take it).
    pub fn mtime(&self) -> i64 {
        self.blob.mtime()
    }

    /// The index again (see [`Package::entries`]).
    pub fn entries(&self, cx: &OpenContext) -> Result<Vec<Entry>> {
        self.package.entries(&self.blob, cx)
    }

    /// Up to `len` bytes at `offset` of the member at `loc` of `size` bytes; fewer only
    /// at its end. Bytes kept in the index are served here; the rest by the format.
    pub fn read(
        &self,
        io: &Io,
        loc: &Loc,
        size: u64,
        offset: u64,
        len: u32,
        span: Span,
    ) -> Result<ReadData> {
        if offset >= size {
            return Ok(ReadData::empty());
        }
        let end = size.min(offset.saturating_add(u64::from(len)));
        match loc {
            Loc::None => Err(Error::Format("file has no data".into())),
            Loc::Inline(bytes) => Ok(ReadData::Owned(crate::io::cache::Block::new(
                bytes
                    .get(offset as usize..end as usize)
                    .ok_or_else(|| Error::Format("inline data shorter than its size".into()))?
                    .to_vec(),
            ))),
            _ => self.package.read(
                &Reading {
                    io,
                    blob: &*self.blob,
                    key: self.key,
                    loc,
                    size,
                },
                offset,
                end,
                span,
            ),
        }
    }

    /// See [`Package::extent`]; the range is clipped to the blob.
    pub fn extent(&self, io: &Io, loc: &Loc, size: u64) -> Option<(u64, u64)> {
        if matches!(loc, Loc::None | Loc::Inline(_)) {
            return None;
        }
        let r = Reading {
            io,
            blob: &*self.blob,
            key: self.key,
            loc,
            size,
        };
        let (start, end) = self.package.extent(&r)?;
        let end = end.min(self.blob.size());
        (start < end).then_some((start, end))
    }

    /// See [`Package::delivered`].
    pub fn delivered(&self, io: &Io, loc: &Loc, size: u64, start: u64, end: u64) {
        let end = end.min(size);
        if start >= end || matches!(loc, Loc::None | Loc::Inline(_)) {
            return;
        }
        let r = Reading {
            io,
            blob: &*self.blob,
            key: self.key,
            loc,
            size,
        };
        self.package.delivered(&r, start, end);
    }

    /// An archive with no bytes and no format (unit tests of the layers above).
    #[cfg(test)]
    pub(crate) fn detached(name: &str) -> Self {
        Archive::new(
            Arc::new(crate::io::blob::Bytes::new(name, Vec::new())),
            Box::new(testing::NoData),
            IndexOrigin::Archive,
        )
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
        Some(if floor::frames::is_plain_zstd(head) {
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
            Foreign::Zstd => "a zstd file that holds no tar archive: it cannot be mounted",
            Foreign::Gzip => "a gzip file that holds no tar archive: it cannot be mounted",
            Foreign::Bzip2 => "a bzip2 file (a .tar.bz2?): it cannot be read in place",
            Foreign::Xz => "an xz file (a .tar.xz?): it cannot be read in place",
            Foreign::Tar => "a tar archive whose first header is damaged: it cannot be mounted",
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

    /// The fix, for messages: what turns it into something pkgfs serves.
    pub fn fix(self) -> String {
        match (self, self.pipe(Some("FILE"), "PACKAGE")) {
            // A gzip or zstd tarball is served as it is: this one holds something else.
            (Foreign::Gzip, _) => "pkgfs serves gzip files that hold a tar archive".into(),
            (Foreign::Zstd, _) => "pkgfs serves zstd files that hold a tar archive".into(),
            (Foreign::Tar, _) => "repack it with `pkgfs pack FILE -o PACKAGE`".into(),
            (_, Some(pipe)) => format!("convert it through a pipe with `{pipe}`"),
            (_, None) => "convert it with `pkgfs pack FILE -o PACKAGE`".into(),
        }
    }
}

/// Detect the format of `blob` by content and read its index.
pub fn open(blob: Arc<dyn Blob>, cx: &OpenContext) -> std::result::Result<Indexed, OpenError> {
    let probe = Probe::read(&*blob).map_err(OpenError::Bad)?;
    for f in FORMATS {
        if let Some(o) = f.open(&blob, &probe, cx).map_err(OpenError::Bad)? {
            let mut archive = Archive::new(blob, o.package, o.origin);
            archive.checked = o.checked;
            return Ok(Indexed {
                archive,
                entries: o.entries,
            });
        }
    }
    match Foreign::detect(&probe.head) {
        Some(f) => Err(OpenError::Bad(Error::Unsupported(format!(
            "{}; {}",
            f.what(),
            f.fix()
        )))),
        None => Err(OpenError::NotAnArchive),
    }
}

/// Open `blob`, a layer of an image, and check it against what the image's manifest
/// says of it (`check`): the format checks what it reads anyway (an index pass hashes
/// the layer; a table of contents is checked against its digest, and chunks against the
/// table as they are read); a layer opened without either is read whole once and
/// hashed here, the result kept in the index cache (keyed by the blob's version and the
/// digest) so the next mount does not read it again. A layer that fails its check is
/// an error naming it.
pub fn open_layer(
    blob: Arc<dyn Blob>,
    check: &LayerCheck,
    cx: &OpenContext,
) -> std::result::Result<Indexed, OpenError> {
    let cx = OpenContext {
        layer: Some(check),
        ..*cx
    };
    targz::will_read_ztoc(&*blob, &cx);
    let r = open_checked(blob.clone(), check, &cx);
    if let Err(OpenError::Bad(Error::Corrupt(_))) = &r {
        // Bytes that fail their digest (or do not decode) are never kept for another
        // try: a source that serves the right bytes later is asked again.
        blob.forget();
    }
    r
}

fn open_checked(
    blob: Arc<dyn Blob>,
    check: &LayerCheck,
    cx: &OpenContext,
) -> std::result::Result<Indexed, OpenError> {
    let indexed = open(blob, cx)?;
    if indexed.archive.checked != Checked::Nothing {
        return Ok(indexed);
    }
    if check.of == DigestOf::Tar && indexed.archive.format() != "tar" {
        return Err(OpenError::Bad(Error::Unsupported(format!(
            "the digest of the tar stream of a {} layer cannot be checked without a pass",
            indexed.archive.format()
        ))));
    }
    check_whole(&*indexed.archive.blob, &check.digest, cx).map_err(OpenError::Bad)?;
    let mut indexed = indexed;
    indexed.archive.checked = Checked::Digest;
    Ok(indexed)
}

/// Hash all of `blob` and compare with `digest`; remembered in the index cache.
fn check_whole(blob: &dyn Blob, digest: &Digest, cx: &OpenContext) -> Result<()> {
    let key = cx
        .index_cache
        .map(|c| (c, c.key("digest", blob, &digest.to_string())));
    if let Some((c, k)) = &key
        && c.load(k).is_some()
    {
        return Ok(());
    }
    const CHUNK: u64 = 1 << 20;
    let size = blob.size();
    let report = cx.progress.filter(|_| size > 8 * CHUNK);
    let mut h = digest.hasher();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(CHUNK) as usize;
        blob.read_exact_at(&mut buf[..n], at)?;
        h.update(&buf[..n]);
        at += n as u64;
        if let Some(p) = report
            && at % (8 * CHUNK) == 0
        {
            p.indexing(blob.name(), at, size);
        }
    }
    if let Some(p) = report {
        p.indexing(blob.name(), size, size);
    }
    let got = h.finish();
    if got != *digest {
        return Err(crate::io::digest::mismatch("the layer", digest, &got));
    }
    if let Some((c, k)) = &key
        && let Err(e) = c.store(k, b"checked\n")
    {
        log::warn!(
            "cannot note the checked digest of {} in {}: {e}",
            blob.name().display(),
            k.path().display()
        );
    }
    Ok(())
}

/// Open the local file at `path` and index it (see [`open`]).
pub fn open_path(path: &Path, cx: &OpenContext) -> std::result::Result<Indexed, OpenError> {
    let blob = crate::io::blob::LocalFile::open(path).map_err(|e| match e {
        Error::Format(_) => OpenError::NotAnArchive,
        e => OpenError::Bad(e),
    })?;
    open(blob, cx)
}

#[cfg(test)]
mod layer_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A package without data: reads fail.
    #[derive(Debug)]
    pub(crate) struct NoData;

    impl Package for NoData {
        fn format(&self) -> &'static str {
            "none"
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn entries(&self, _: &Arc<dyn Blob>, _: &OpenContext) -> Result<Vec<Entry>> {
            Ok(Vec::new())
        }
        fn read(&self, _: &Reading<'_>, _: u64, _: u64, _: Span) -> Result<ReadData> {
            Err(Error::Format("no data".into()))
        }
        fn extent(&self, _: &Reading<'_>) -> Option<(u64, u64)> {
            None
        }
        fn delivered(&self, _: &Reading<'_>, _: u64, _: u64) {}
    }
}
