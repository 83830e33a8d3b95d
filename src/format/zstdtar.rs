//! Zstandard-compressed tar archives without a seek table: the zstd layers of container
//! images (`application/vnd.oci.image.layer.v1.tar+zstd`), `tar --zstd` output.
//!
//! A zstd frame cannot be entered in the middle (its blocks refer back into a window of
//! up to 128 MiB, and carry entropy tables forward), so such an archive is **indexed in
//! one streaming pass** ([`Pass`]): the decompressed stream flows through the tar header
//! scanner while the frame boundaries are noted. Then:
//!
//! - **Frames of at most [`MAX_FRAME`] bytes** (`pzstd`, `zstd --rsyncable`… any writer
//!   that starts a new frame every few MiB): the archive is served in place, frame by
//!   frame through the block cache, exactly as a seekable archive is (the frame table
//!   stands in for the seek table it lacks).
//! - **Larger frames** (one frame for the whole stream is what `zstd`, skopeo, buildah
//!   and docker write): the pass keeps a **decompressed copy** of the tar stream, and
//!   the archive is served from it as an uncompressed tar ([`super::plaintar`]). This is
//!   the one-time cost such an archive asks: the disk space of its uncompressed size
//!   (runs of zeros are left as holes), in the index cache beside the index (or, with no
//!   index cache, in an unlinked temporary file that lives as long as the mount). A copy
//!   that would leave its file system with less than [`KEEP_FREE`] free is refused.
//!
//! The index (entries, frames, which of the two) is kept in the index cache, keyed by
//! the blob's version; an image layer's digest (of the blob, or of its tar stream) is
//! checked by the pass, and a cached index of a layer is one whose pass checked it.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{info, warn};
use zstd::zstd_safe;

use super::floor::frames::{Frame, FrameReader, SeekTable};
use super::floor::pass::{PassDigest, PassReader, Produce};
use super::floor::plain;
use super::{
    Checked, Entry, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe, Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::{Blob, LocalFile};
use crate::io::{ReadData, Span};

/// Frames up to this many bytes of output are served in place; an archive with a larger
/// one is served from a decompressed copy.
pub const MAX_FRAME: u64 = 8 << 20;
/// A decompressed copy may not leave its file system with less free space than this.
pub const KEEP_FREE: u64 = 1 << 30;
/// Compressed input is read in chunks of this size.
const PASS_CHUNK: usize = 1 << 20;
/// Output handed to the tar scanner at a time.
const PASS_OUTPUT: usize = 256 * 1024;
/// Free space is looked at again after this many bytes of copy.
const SPACE_EVERY: u64 = 64 << 20;
/// How often the pass reports its progress, in compressed bytes.
const REPORT_EVERY: u64 = 8 << 20;
/// The cached index's magic and version.
const INDEX_MAGIC: &[u8; 8] = b"PKGFSZTR";
const INDEX_VERSION: u32 = 1;

/// The zstd-tar format.
pub struct ZstdTar;

/// Whether `blob` is a zstd stream whose output starts with a tar header.
fn is_zstd_tar(blob: &dyn Blob, probe: &Probe) -> bool {
    if !super::floor::frames::is_plain_zstd(&probe.head) {
        return false;
    }
    let mut head = vec![0u8; blob.size().min(256 * 1024) as usize];
    if blob.read_exact_at(&mut head, 0).is_err() {
        return false;
    }
    let mut d = zstd_safe::DCtx::create();
    let mut out = [0u8; 512];
    let mut input = zstd_safe::InBuffer::around(&head);
    let mut output = zstd_safe::OutBuffer::around(&mut out[..]);
    while output.pos() < 512 {
        let before = (input.pos, output.pos());
        if d.decompress_stream(&mut output, &mut input).is_err()
            || (input.pos, output.pos()) == before
        {
            return false;
        }
    }
    super::floor::tar::is_header(&out)
}

/// How the archive is served.
#[derive(Debug)]
enum Served {
    /// In place, frame by frame.
    Frames(FrameReader),
    /// From a decompressed copy of the tar stream.
    Copy(Arc<dyn Blob>),
}

/// The read path of a zstd tar archive.
#[derive(Debug)]
pub struct ZstdTarPackage {
    served: Served,
}

impl Format for ZstdTar {
    fn name(&self) -> &'static str {
        "tar.zst"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        if !is_zstd_tar(&**blob, probe) {
            return Ok(None);
        }
        let (served, entries, origin) = index(&**blob, cx)?;
        Ok(Some(Opened {
            package: Box::new(ZstdTarPackage { served }),
            entries,
            origin,
            checked: if cx.layer.is_some() {
                Checked::Digest
            } else {
                Checked::Nothing
            },
        }))
    }
}

/// What a pass learns, and what the cache keeps.
struct Index {
    total: u64,
    frames: Vec<Frame>,
    /// The decompressed copy (its path in the cache, or an unlinked file).
    copy: Option<Arc<dyn Blob>>,
}

/// The key's extra part: the layer digest a pass checked, if any.
fn extra(cx: &OpenContext) -> String {
    cx.layer
        .map(|l| format!("{} {:?}", l.digest, l.of))
        .unwrap_or_default()
}

/// The index of `blob`: from the cache, else by a pass (stored in the cache after).
fn index(blob: &dyn Blob, cx: &OpenContext) -> Result<(Served, Vec<Entry>, IndexOrigin)> {
    let key = cx
        .index_cache
        .map(|c| (c, c.key("tar.zst", blob, &extra(cx))));
    if let Some((c, k)) = &key
        && let Some(bytes) = c.load(k)
    {
        match decode(&bytes, blob.size(), &copy_path(k.path())) {
            Ok((ix, entries)) => return Ok((served(ix, &entries), entries, IndexOrigin::Cache)),
            Err(e) => log::debug!("{}: cached index unusable: {e}", k.path().display()),
        }
    }
    if cx.defer_over.is_some_and(|limit| blob.size() > limit) {
        return Err(Error::Deferred);
    }
    let copy_to = key
        .as_ref()
        .map(|(c, k)| (c.dir().to_path_buf(), copy_path(k.path())));
    let started = std::time::Instant::now();
    let (ix, entries) = pass(
        blob,
        cx,
        copy_to.as_ref().map(|(d, p)| (d.as_path(), p.as_path())),
    )?;
    info!(
        "{}: indexed {} MiB of zstd ({} MiB of tar, {} entries, {} frames{}) in {:.2} s",
        blob.name().display(),
        blob.size() >> 20,
        ix.total >> 20,
        entries.len(),
        ix.frames.len(),
        if ix.copy.is_some() {
            "; served from a decompressed copy"
        } else {
            ""
        },
        started.elapsed().as_secs_f64(),
    );
    if let Some((c, k)) = &key {
        let stored = encode(&ix, &entries).and_then(|b| c.store(k, &b));
        if let Err(e) = stored {
            warn!(
                "cannot store the index of {} in {}: {e}",
                blob.name().display(),
                k.path().display()
            );
        }
    }
    Ok((served(ix, &entries), entries, IndexOrigin::Pass))
}

/// Where the decompressed copy of the archive indexed at `index` is kept.
fn copy_path(index: &Path) -> PathBuf {
    index.with_extension("tar")
}

fn served(ix: Index, entries: &[Entry]) -> Served {
    match ix.copy {
        Some(copy) => Served::Copy(copy),
        None => {
            let mut table = SeekTable {
                frames: ix.frames,
                total: ix.total,
                data_end: 0,
                table_start: 0,
                file_bytes: Vec::new(),
            };
            table.count_file_bytes(entries);
            Served::Frames(FrameReader { table })
        }
    }
}

/// The decompressed copy being written.
struct Copy {
    file: std::fs::File,
    /// Where it goes when done (None: unlinked already).
    path: Option<(tempfile::TempPath, PathBuf)>,
    written: u64,
    next_space_check: u64,
}

impl Copy {
    /// A copy beside the index cache's files, or (no cache) an unlinked file in the
    /// temporary directory.
    fn create(to: Option<(&Path, &Path)>) -> Result<Copy> {
        let (file, path) = match to {
            Some((dir, dest)) => {
                std::fs::create_dir_all(dir)?;
                let t = tempfile::NamedTempFile::new_in(dir)?;
                let (file, tmp) = t.into_parts();
                (file, Some((tmp, dest.to_path_buf())))
            }
            None => (tempfile::tempfile()?, None),
        };
        Ok(Copy {
            file,
            path,
            written: 0,
            next_space_check: 0,
        })
    }

    /// Append `bytes`; whole 4 KiB blocks of zeros become holes.
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if self.written >= self.next_space_check {
            let free = free_space(&self.file)?;
            if free < KEEP_FREE + SPACE_EVERY {
                return Err(Error::Unsupported(format!(
                    "the decompressed copy this archive needs would leave less than {} GiB free (it is {} MiB so far)",
                    KEEP_FREE >> 30,
                    self.written >> 20
                )));
            }
            self.next_space_check = self.written + SPACE_EVERY;
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rest.len().min(4096 - (self.written % 4096) as usize);
            let (chunk, tail) = rest.split_at(n);
            if chunk.len() == 4096 && chunk.iter().all(|&b| b == 0) {
                self.file.seek(SeekFrom::Current(4096))?;
            } else {
                self.file.write_all(chunk)?;
            }
            self.written += n as u64;
            rest = tail;
        }
        Ok(())
    }

    /// The finished copy as a blob.
    fn finish(self) -> Result<Arc<dyn Blob>> {
        self.file.set_len(self.written)?;
        match self.path {
            Some((tmp, dest)) => {
                tmp.persist(&dest).map_err(|e| Error::Io(e.error))?;
                let blob: Arc<dyn Blob> = LocalFile::open(&dest)?;
                Ok(blob)
            }
            None => {
                // The unlinked file is named by its descriptor for as long as it lives.
                let path = PathBuf::from(format!("/proc/self/fd/{}", {
                    use std::os::fd::AsRawFd;
                    self.file.as_raw_fd()
                }));
                let blob = LocalFile::open(&path)?;
                blob.pin();
                drop(self.file);
                let blob: Arc<dyn Blob> = blob;
                Ok(blob)
            }
        }
    }
}

/// Free bytes of the file system holding `file`.
fn free_space(file: &std::fs::File) -> Result<u64> {
    use std::os::fd::AsRawFd;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statvfs struct we own.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The streaming pass: decompresses the archive once, through the tar scanner.
struct Pass<'a> {
    blob: &'a dyn Blob,
    size: u64,
    cx: &'a OpenContext<'a>,
    dctx: zstd_safe::DCtx<'static>,
    input: Vec<u8>,
    /// Blob offset of `input[0]`, and how much of `input` is consumed.
    in_off: u64,
    in_pos: usize,
    out: Box<[u8]>,
    ostart: usize,
    oend: usize,
    total: u64,
    frames: Vec<Frame>,
    /// Where the current frame started (compressed, decompressed), if inside one.
    frame_start: Option<(u64, u64)>,
    ended: bool,
    /// An image layer's digest, checked by the pass.
    digest: Option<PassDigest<'a>>,
    copy: Option<Copy>,
    /// Output kept while the copy is not yet known to be needed.
    held: Vec<u8>,
    copy_to: Option<(&'a Path, &'a Path)>,
    next_report: u64,
}

impl<'a> Pass<'a> {
    fn new(
        blob: &'a dyn Blob,
        cx: &'a OpenContext<'a>,
        copy_to: Option<(&'a Path, &'a Path)>,
    ) -> Self {
        Pass {
            blob,
            size: blob.size(),
            cx,
            dctx: zstd_safe::DCtx::create(),
            input: Vec::with_capacity(PASS_CHUNK),
            in_off: 0,
            in_pos: 0,
            out: vec![0u8; PASS_OUTPUT].into_boxed_slice(),
            ostart: 0,
            oend: 0,
            total: 0,
            frames: Vec::new(),
            frame_start: None,
            ended: false,
            digest: cx.layer.map(|l| PassDigest::new(&l.digest, l.of)),
            copy: None,
            held: Vec::new(),
            copy_to,
            next_report: REPORT_EVERY,
        }
    }

    /// Decode the next stretch of output into `out`; false at the end of the stream.
    fn produce(&mut self) -> Result<bool> {
        self.ostart = 0;
        self.oend = 0;
        while !self.ended && self.oend == 0 {
            if self.in_pos == self.input.len() {
                let at = self.in_off + self.input.len() as u64;
                if at >= self.size {
                    if self.frame_start.is_some() {
                        return Err(Error::Corrupt(format!(
                            "the zstd stream is truncated (it ends inside a frame, after {} bytes of output)",
                            self.total
                        )));
                    }
                    self.ended = true;
                    break;
                }
                let n = (self.size - at).min(PASS_CHUNK as u64) as usize;
                self.input.resize(n, 0);
                self.blob.read_exact_at(&mut self.input, at)?;
                if let Some(d) = &mut self.digest {
                    d.blob(at, &self.input);
                }
                self.in_off = at;
                self.in_pos = 0;
                if let Some(p) = self.cx.progress
                    && at + n as u64 >= self.next_report
                    && self.size > REPORT_EVERY
                {
                    p.indexing(self.blob.name(), at + n as u64, self.size);
                    self.next_report = at + n as u64 + REPORT_EVERY;
                }
            }
            let coff = self.in_off + self.in_pos as u64;
            if self.frame_start.is_none() {
                self.frame_start = Some((coff, self.total));
            }
            let mut input = zstd_safe::InBuffer {
                src: &self.input,
                pos: self.in_pos,
            };
            let mut output = zstd_safe::OutBuffer::around(&mut self.out[..]);
            let hint = self
                .dctx
                .decompress_stream(&mut output, &mut input)
                .map_err(|code| {
                    Error::Corrupt(format!(
                        "the zstd stream does not decompress after {} bytes of output: {}",
                        self.total,
                        zstd_safe::get_error_name(code)
                    ))
                })?;
            let produced = output.pos();
            self.in_pos = input.pos;
            self.oend = produced;
            self.total += produced as u64;
            if hint == 0 {
                // A frame ended (skippable frames produce nothing and are not noted).
                if let Some((c, d)) = self.frame_start.take() {
                    let end = self.in_off + self.in_pos as u64;
                    let dsize = self.total - d;
                    if dsize > 0 {
                        self.frames.push(Frame {
                            coff: c,
                            csize: u32::try_from(end - c).unwrap_or(u32::MAX),
                            doff: d,
                            dsize: u32::try_from(dsize).unwrap_or(u32::MAX),
                        });
                    }
                }
            }
        }
        if let Some(d) = &mut self.digest {
            d.tar(&self.out[..self.oend]);
        }
        self.keep(self.oend)?;
        Ok(self.oend > 0)
    }

    /// Whether the stream so far needs a copy: a frame (finished or not) is larger than
    /// [`MAX_FRAME`].
    fn needs_copy(&self) -> bool {
        let open = self.frame_start.map_or(0, |(_, d)| self.total - d);
        open > MAX_FRAME || self.frames.iter().any(|f| u64::from(f.dsize) > MAX_FRAME)
    }

    /// Keep the first `n` bytes of `out` for the copy, if there is or may be one. Until
    /// a frame turns out too large for in-place reads, only the current frame's output is
    /// held (at most [`MAX_FRAME`] and one stretch); when one does, the copy starts with
    /// the frames before it, decoded again from the blob (each is small), then what is
    /// held.
    fn keep(&mut self, n: usize) -> Result<()> {
        if self.copy.is_none() && self.needs_copy() {
            let mut c = Copy::create(self.copy_to)?;
            let mut buf = Vec::new();
            for f in &self.frames {
                decode_frame(self.blob, f, &mut buf)?;
                c.write(&buf)?;
            }
            c.write(&self.held)?;
            self.held = Vec::new();
            self.copy = Some(c);
        }
        match &mut self.copy {
            Some(c) => c.write(&self.out[..n]),
            None => {
                if self.frame_start.is_none() {
                    // The frame ended: its output is not needed again.
                    self.held.clear();
                } else {
                    self.held.extend_from_slice(&self.out[..n]);
                }
                Ok(())
            }
        }
    }
}

impl Produce for Pass<'_> {
    fn produce(&mut self) -> Result<bool> {
        Pass::produce(self)
    }

    fn unread(&self) -> &[u8] {
        &self.out[self.ostart..self.oend]
    }

    fn consume(&mut self, n: usize) {
        self.ostart += n;
    }
}

/// The pass: entries and frames, and the copy if one is needed.
fn pass(
    blob: &dyn Blob,
    cx: &OpenContext,
    copy_to: Option<(&Path, &Path)>,
) -> Result<(Index, Vec<Entry>)> {
    if let Some(p) = cx.progress
        && blob.size() > REPORT_EVERY
    {
        p.indexing(blob.name(), 0, blob.size());
    }
    let mut p = Pass::new(blob, cx, copy_to);
    let mut capped = super::floor::Capped::default();
    let scanned = super::floor::tar::each(PassReader(&mut p), |te, _| capped.push(te));
    let entries = capped.entries;
    if let Err(e) = scanned {
        return Err(Error::Corrupt(format!(
            "tar stream unusable after {} entries: {e}",
            entries.len()
        )));
    }
    // The rest of the stream (end blocks, trailing frames): the whole stream must decode.
    while p.produce()? {}
    if let Some(d) = p.digest.take() {
        d.check(blob)?;
    }
    if let Some(pr) = cx.progress
        && blob.size() > REPORT_EVERY
    {
        pr.indexing(blob.name(), blob.size(), blob.size());
    }
    if let Some(e) = entries.iter().find(|e| {
        matches!(e.data, Loc::Stream(o) if o.checked_add(e.size).is_none_or(|end| end > p.total))
    }) {
        return Err(Error::Corrupt(format!(
            "{:?} runs past the end of the tar stream",
            String::from_utf8_lossy(&e.path)
        )));
    }
    let copy = match p.copy.take() {
        Some(c) => Some(c.finish()?),
        None => None,
    };
    Ok((
        Index {
            total: p.total,
            frames: std::mem::take(&mut p.frames),
            copy,
        },
        entries,
    ))
}

/// Decode frame `f` of `blob` (at most [`MAX_FRAME`] bytes) into `out`.
fn decode_frame(blob: &dyn Blob, f: &Frame, out: &mut Vec<u8>) -> Result<()> {
    let mut src = vec![0u8; f.csize as usize];
    blob.read_exact_at(&mut src, f.coff)?;
    out.clear();
    out.reserve_exact(f.dsize as usize);
    let n = zstd::bulk::Decompressor::new()?
        .decompress_to_buffer(src.as_slice(), out)
        .map_err(|e| Error::Corrupt(format!("a zstd frame does not decompress: {e}")))?;
    if n != f.dsize as usize {
        return Err(Error::Corrupt("a zstd frame changed size".into()));
    }
    Ok(())
}

fn encode(ix: &Index, entries: &[Entry]) -> Result<Vec<u8>> {
    let mut o = Vec::new();
    o.extend_from_slice(INDEX_MAGIC);
    o.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    o.extend_from_slice(&ix.total.to_le_bytes());
    o.push(u8::from(ix.copy.is_some()));
    o.extend_from_slice(&(ix.frames.len() as u32).to_le_bytes());
    for f in &ix.frames {
        o.extend_from_slice(&f.coff.to_le_bytes());
        o.extend_from_slice(&f.csize.to_le_bytes());
        o.extend_from_slice(&f.doff.to_le_bytes());
        o.extend_from_slice(&f.dsize.to_le_bytes());
    }
    let frame = super::floor::codec::encode_index(entries, 3)?;
    o.extend_from_slice(&frame);
    let crc = crc32fast::hash(&o);
    o.extend_from_slice(&crc.to_le_bytes());
    Ok(o)
}

fn decode(bytes: &[u8], blob_size: u64, copy: &Path) -> Result<(Index, Vec<Entry>)> {
    let bad = |m: &str| Error::Format(format!("cached tar.zst index: {m}"));
    let (body, crc) = bytes
        .split_last_chunk::<4>()
        .ok_or_else(|| bad("too short"))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(bad("checksum mismatch"));
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let s = body.get(at..at + n).ok_or_else(|| bad("too short"))?;
        at += n;
        Ok(s)
    };
    if take(8)? != INDEX_MAGIC || take(4)? != INDEX_VERSION.to_le_bytes() {
        return Err(bad("not an index of this version"));
    }
    let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
    let total = u64_of(take(8)?);
    let has_copy = take(1)?[0] != 0;
    let n = u32_of(take(4)?) as usize;
    if n > body.len() / 24 {
        return Err(bad("frame count"));
    }
    let mut frames = Vec::with_capacity(n);
    let mut doff = 0u64;
    for _ in 0..n {
        let f = Frame {
            coff: u64_of(take(8)?),
            csize: u32_of(take(4)?),
            doff: u64_of(take(8)?),
            dsize: u32_of(take(4)?),
        };
        if f.coff
            .checked_add(u64::from(f.csize))
            .is_none_or(|e| e > blob_size)
            || f.doff < doff
            || u64::from(f.dsize) > MAX_FRAME && !has_copy
        {
            return Err(bad("frame outside the archive"));
        }
        doff = f.doff + u64::from(f.dsize);
        frames.push(f);
    }
    let rest = &body[at..];
    let entries = super::floor::codec::decode_index(rest, total)?;
    let copy = if has_copy {
        let blob = LocalFile::open(copy).map_err(|_| bad("the decompressed copy is gone"))?;
        if blob.size() != total {
            return Err(bad("the decompressed copy has the wrong size"));
        }
        let blob: Arc<dyn Blob> = blob;
        Some(blob)
    } else {
        None
    };
    Ok((
        Index {
            total,
            frames,
            copy,
        },
        entries,
    ))
}

impl Package for ZstdTarPackage {
    fn format(&self) -> &'static str {
        "tar.zst"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        index(&**blob, cx).map(|(_, e, _)| e)
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        match &self.served {
            Served::Frames(p) => p.read(r, offset, end, span),
            Served::Copy(copy) => plain::read_from(&**copy, r, offset, end),
        }
    }

    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        match &self.served {
            Served::Frames(p) => p.extent(r),
            // The copy is not the blob: its bytes are nowhere in it.
            Served::Copy(_) => None,
        }
    }

    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        if let Served::Frames(p) = &self.served {
            p.delivered(r, start, end);
        }
    }
}
