//! Gzip-compressed tar archives read in place: `.tar.gz`, `.tgz`, `.crate`, npm's
//! tarballs, Python sdists, source tarballs, image layers (recognised by content: gzip
//! magic, a tar header inside).
//!
//! A gzip stream cannot be entered in the middle without the decoder's state there, so
//! the archive is **indexed in one streaming pass** ([`Indexer`]): the decompressed
//! stream flows through the tar header scanner while, at the first deflate block
//! boundary after every [`SPACING`] bytes of output, a *point* is noted: the bit position
//! where the next block starts and the 32 KiB of output before it (the window a later
//! block may refer back into), as zlib's `zran.c` does. The start of every gzip member
//! (`pigz`, `bgzip`, concatenated files) is a point too, needing no window. A member of
//! at most [`WHOLE_MEMBER`] bytes keeps no points inside it, so it is decoded in one call
//! by libdeflate. The stretch from one point to the next is a *segment*: the unit of
//! decoding and caching. Each segment carries the CRC-32 of its output, checked whenever
//! it is decoded again; each member's trailer (CRC-32 and size) is checked by the pass.
//!
//! The index (entries, members, points with their windows compressed) is kept in the
//! index cache, keyed by the blob's version: a second mount reads it instead of the
//! archive. A read decodes at most one segment (about [`SPACING`] plus a deflate block,
//! a few MiB at worst for ordinary compressors); a segment larger than
//! [`WHOLE_SEGMENT`] (a hostile stream with one huge block) is decoded in blocks with a
//! parked decoder, so memory stays bounded whatever the input.
//!
//! **Trust.** Bytes of a member whose trailer does not verify (bad CRC or size, a
//! truncated stream, a deflate error) cannot be trusted: every read touching them fails
//! with `EIO`, with the reason logged; the entries the pass saw are listed, and the rest
//! of the archive is served. Garbage after the last member is ignored with a warning
//! (zeros, as tape blocking leaves, silently). An archive whose first member is
//! unusable before any tar header is skipped.

use std::path::Path;
use std::sync::Arc;

use log::warn;

use super::floor::Cursor;
use super::floor::gzip::{MAX_HEADER, gzip_header};
use super::floor::pass::{PassDigest, PassReader, Produce};
use super::{
    Archive, Entry, EntryKind, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe,
    Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::cache::Block;
use crate::io::digest::mismatch;
use crate::io::inflate::{Inflater, OneShot, WINDOW};
use crate::io::{BLOCK_SIZE, BlockKey, ReadData, Span, gather};

/// Output between two points, at least (the next point is the first deflate block
/// boundary after it).
pub const SPACING: u64 = 1 << 20;
/// Members up to this many bytes of output keep no points inside: one segment, decoded
/// in one call.
pub const WHOLE_MEMBER: u64 = 4 << 20;
/// Segments up to this many bytes are decoded whole into one cached block; larger ones
/// in blocks of [`BLOCK_SIZE`].
pub const WHOLE_SEGMENT: u64 = 8 << 20;
/// Compressed input is read in chunks of this size by the index pass.
const PASS_CHUNK: usize = 1 << 20;
/// ... and by reads.
const READ_CHUNK: usize = 128 * 1024;
/// How far into a file read from a server through a zTOC its spans are fetched ahead of
/// the read ([`TarGzPackage::fetch_ahead`]).
const FILE_AHEAD: u64 = 8 << 20;
/// Decompressed bytes handed to the tar scanner at a time.
const PASS_OUTPUT: usize = 256 * 1024;
/// How often the index pass reports its progress, in compressed bytes.
const REPORT_EVERY: u64 = 8 << 20;

/// A gzip member of the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    /// Blob offset of its header.
    header: u64,
    /// Blob offset of its deflate data.
    data: u64,
    /// Blob offset just past its trailer (0 if the stream ends before).
    end: u64,
    /// Offset of its output in the decompressed stream.
    out: u64,
    /// Bytes of output (as far as they could be decoded).
    len: u64,
    /// Its trailer verified the CRC-32 and size of its output.
    ok: bool,
}

/// Where a segment starts, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Point {
    /// Offset in the decompressed stream.
    out: u64,
    /// Bytes of output up to the next point.
    len: u64,
    /// Bit offset in the blob where decoding resumes (a member's data, or a deflate
    /// block boundary).
    bit: u64,
    /// The member it lies in.
    member: u32,
    /// The output before it, up to 32 KiB (raw length, deflate-compressed bytes); none
    /// at the start of a member.
    window: Option<(u32, Box<[u8]>)>,
    /// CRC-32 of the segment's output.
    crc: u32,
    /// Every member the segment touches verified.
    ok: bool,
}

/// What the index pass learns: the decompressed size, the members and the points.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct GzIndex {
    total: u64,
    members: Vec<Member>,
    points: Vec<Point>,
    /// Why some bytes cannot be trusted (empty if all can).
    note: String,
    /// An index from a SOCI zTOC: per point, the compressed bytes `[start, end)` its
    /// segment decodes from and their sha256, checked before the segment is decoded
    /// (the points then carry no CRC). Empty for an index made by a pass.
    spans: Vec<(u64, u64, crate::io::digest::Digest)>,
}

/// The gzip-tar format.
pub struct TarGz;

/// Whether `blob` holds a gzip stream whose output starts with a tar header: the first
/// 512 bytes of output are decoded and looked at.
fn is_gzip_tar(blob: &dyn Blob, probe: &Probe) -> Result<bool> {
    if !probe.head.starts_with(&[0x1f, 0x8b, 8]) {
        return Ok(false);
    }
    let n = blob.size().min(MAX_HEADER as u64 + 64 * 1024) as usize;
    let mut head = vec![0u8; n];
    blob.read_exact_at(&mut head, 0)?;
    let Ok(Some(h)) = gzip_header(&head) else {
        return Ok(false);
    };
    let mut d = Inflater::new()?;
    let mut out = [0u8; 512];
    let mut got = 0;
    let mut at = h;
    while got < out.len() {
        let Ok(p) = d.step(&head[at..], &mut out[got..]) else {
            return Ok(false);
        };
        at += p.consumed;
        got += p.produced;
        if p.ended || (p.consumed == 0 && p.produced == 0) {
            break;
        }
    }
    Ok(got == 512 && super::floor::tar::is_header(&out))
}

impl Format for TarGz {
    fn name(&self) -> &'static str {
        "tar.gz"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        if !is_gzip_tar(&**blob, probe)? {
            return Ok(None);
        }
        let (idx, entries, origin) = index(&**blob, cx)?;
        let from_ztoc = !idx.spans.is_empty();
        let package = TarGzPackage::new(idx, &entries);
        let checked = if from_ztoc {
            super::Checked::Ztoc
        } else if cx.layer.is_some() {
            super::Checked::Digest
        } else {
            super::Checked::Nothing
        };
        Ok(Some(Opened {
            package: Box::new(package),
            entries,
            origin,
            checked,
        }))
    }
}

/// Where the index made from zTOC `z` of `blob` is kept.
fn ztoc_key(c: &super::IndexCache, blob: &dyn Blob, z: &super::ZtocRef) -> super::cache::CacheKey {
    c.key("tar.gz ztoc", blob, &z.digest.to_string())
}

/// A layer about to be opened (`blob`, its zTOC in `cx`) whose index will be made from
/// its zTOC (none kept in the index cache): ask for the zTOC's bytes now. Finding the
/// layer's format costs a few round trips before [`index`] reads the zTOC; the zTOC's
/// transfer (3.5 MB for the benchmark image's large layer, 0.28 s at 100 Mbit/s) then
/// runs during them instead of after (docs/BENCHMARKS.md, containerd). Advice: the read
/// waits for the fetch under way rather than asking again.
pub(super) fn will_read_ztoc(blob: &dyn Blob, cx: &OpenContext) {
    let Some(z) = cx.layer.and_then(|l| l.ztoc.as_ref()) else {
        return;
    };
    let size = z.blob.size();
    if size > super::floor::ztoc::MAX_ZTOC
        || cx
            .index_cache
            .is_some_and(|c| ztoc_key(c, blob, z).path().exists())
    {
        return;
    }
    z.blob.will_need(&[(0, size)]);
}

/// The index of `blob`: from the layer's SOCI zTOC when it has one, else from the
/// cache, else by a pass (stored in the cache after).
fn index(blob: &dyn Blob, cx: &OpenContext) -> Result<(GzIndex, Vec<Entry>, IndexOrigin)> {
    if let Some(z) = cx.layer.and_then(|l| l.ztoc.as_ref()) {
        // Made from a zTOC once (its windows compressed, its entries converted), then
        // kept in the index cache under the zTOC's digest.
        let key = cx.index_cache.map(|c| (c, ztoc_key(c, blob, z)));
        if let Some((c, k)) = &key
            && let Some(bytes) = c.load(k)
            && let Ok((idx, entries)) = decode(&bytes, blob.size())
            && !idx.spans.is_empty()
        {
            return Ok((idx, entries, IndexOrigin::Cache));
        }
        match from_ztoc(blob, z) {
            Ok((idx, entries)) => {
                if let Some((c, k)) = &key
                    && let Err(e) = encode(&idx, &entries).and_then(|b| c.store(k, &b))
                {
                    warn!(
                        "cannot keep the zTOC index of {}: {e}",
                        blob.name().display()
                    );
                }
                return Ok((idx, entries, IndexOrigin::Ztoc));
            }
            Err(e) => warn!(
                "{}: its zTOC cannot be used ({e}): indexing it by a pass instead",
                blob.name().display()
            ),
        }
    }
    // An index made by a pass that checked a layer's digest is kept apart from one that
    // did not: a cached index of a layer is a checked one.
    let extra = cx
        .layer
        .map(|l| format!("{} {:?}", l.digest, l.of))
        .unwrap_or_default();
    let key = cx.index_cache.map(|c| (c, c.key("tar.gz", blob, &extra)));
    if let Some((c, k)) = &key
        && let Some(bytes) = c.load(k)
    {
        match decode(&bytes, blob.size()) {
            Ok((idx, entries)) => {
                if !idx.note.is_empty() {
                    warn!("{}: {}", blob.name().display(), idx.note);
                }
                log::debug!(
                    "{}: index from cache {}",
                    blob.name().display(),
                    k.path().display()
                );
                return Ok((idx, entries, IndexOrigin::Cache));
            }
            Err(e) => log::debug!("{}: cached index unusable: {e}", k.path().display()),
        }
    }
    if cx.defer_over.is_some_and(|limit| blob.size() > limit) {
        return Err(Error::Deferred);
    }
    let started = std::time::Instant::now();
    let (idx, entries) = pass(blob, cx)?;
    log::info!(
        "{}: indexed {} MiB of gzip ({} MiB of tar, {} entries, {} points) in {:.2} s{}",
        blob.name().display(),
        blob.size() >> 20,
        idx.total >> 20,
        entries.len(),
        idx.points.len(),
        started.elapsed().as_secs_f64(),
        if key.is_some() { "; cached" } else { "" }
    );
    if let Some((c, k)) = &key {
        let stored = encode(&idx, &entries).and_then(|b| c.store(k, &b));
        if let Err(e) = stored {
            warn!(
                "cannot store the index of {} in {}: {e}",
                blob.name().display(),
                k.path().display()
            );
        }
    }
    Ok((idx, entries, IndexOrigin::Pass))
}

/// The index a SOCI zTOC gives (its bytes checked against the digest the SOCI index
/// names): its files as entries, its checkpoints as points, one gzip member, and the
/// digest of each span's compressed bytes.
fn from_ztoc(blob: &dyn Blob, z: &super::ZtocRef) -> Result<(GzIndex, Vec<Entry>)> {
    use super::floor::ztoc;
    let size = z.blob.size();
    if size > ztoc::MAX_ZTOC {
        return Err(Error::Format(format!(
            "{size} bytes, more than the {} MiB pkgfs reads",
            ztoc::MAX_ZTOC >> 20
        )));
    }
    let mut bytes = vec![0u8; size as usize];
    z.blob.read_exact_at(&mut bytes, 0)?;
    if let Err(e) = z.digest.check(&bytes, "the zTOC") {
        z.blob.forget();
        return Err(e);
    }
    let t = ztoc::parse(&bytes)?;
    drop(bytes);
    if t.algorithm != ztoc::Algorithm::Gzip {
        return Err(Error::Unsupported("a zTOC of an uncompressed layer".into()));
    }
    if t.compressed_size != blob.size() {
        return Err(Error::Format(format!(
            "it describes a layer of {} bytes, the layer has {}",
            t.compressed_size,
            blob.size()
        )));
    }
    let first = t
        .checkpoints
        .first()
        .ok_or_else(|| Error::Format("no checkpoints".into()))?;
    let mut points = Vec::with_capacity(t.checkpoints.len());
    let mut spans = Vec::with_capacity(t.checkpoints.len());
    for (i, c) in t.checkpoints.iter().enumerate() {
        let next = t
            .checkpoints
            .get(i + 1)
            .map_or(t.uncompressed_size, |n| n.output);
        points.push(Point {
            out: c.output,
            len: next - c.output,
            bit: c.bit(),
            member: 0,
            window: (i > 0).then(|| (ztoc::WINDOW as u32, compress_window(&c.window))),
            crc: 0,
            ok: true,
        });
        let (a, b) = t.span_input(i);
        spans.push((a, b, t.span_digests[i].clone()));
    }
    let idx = GzIndex {
        total: t.uncompressed_size,
        members: vec![Member {
            header: 0,
            data: first.input,
            end: blob.size(),
            out: 0,
            len: t.uncompressed_size,
            ok: true,
        }],
        points,
        note: String::new(),
        spans,
    };
    let mut entries = Vec::with_capacity(t.files.len());
    for f in t.files {
        match f.into_entry(Loc::Stream) {
            Ok(e) => entries.push(e),
            Err(why) => warn!("{}: {why}", blob.name().display()),
        }
    }
    log::debug!(
        "{}: index from its zTOC ({} entries, {} spans of {} KiB)",
        blob.name().display(),
        entries.len(),
        idx.points.len(),
        t.span_size >> 10
    );
    Ok((idx, entries))
}

/// The index pass: one streaming decode of the whole archive through the tar scanner.
fn pass(blob: &dyn Blob, cx: &OpenContext) -> Result<(GzIndex, Vec<Entry>)> {
    if let Some(p) = cx.progress
        && blob.size() > REPORT_EVERY
    {
        p.indexing(blob.name(), 0, blob.size());
    }
    let mut ix = Indexer::new(blob, cx);
    let mut capped = super::floor::Capped::default();
    let scanned = super::floor::tar::each(PassReader(&mut ix), |te, _| capped.push(te));
    let entries = capped.entries;
    if let Err(e) = scanned
        && ix.problems.is_empty()
    {
        // A gzip failure reached the scanner as an I/O error and is recorded already.
        ix.problems.push(format!(
            "the tar stream is unusable after {} entries ({e})",
            entries.len()
        ));
    }
    // The rest of the stream (the tar's end blocks, later members): every trailer is
    // checked, and the end of the stream is found.
    while ix.produce()? {
        ix.ostart = ix.oend;
    }
    if let Some(d) = ix.digest.take() {
        d.check(blob)?;
    }
    if let Some(p) = cx.progress
        && blob.size() > REPORT_EVERY
    {
        p.indexing(blob.name(), blob.size(), blob.size());
    }
    let idx = ix.finish();
    if entries.is_empty() && !idx.note.is_empty() && !idx.points.iter().any(|p| p.ok) {
        return Err(Error::Corrupt(idx.note));
    }
    if !idx.note.is_empty() {
        warn!("{}: {}", blob.name().display(), idx.note);
    }
    if let Some(e) = entries.iter().find(|e| {
        matches!(e.data, Loc::Stream(o) if o.checked_add(e.size).is_none_or(|end| end > idx.total))
    }) {
        warn!(
            "{}: {:?} and what follows run past the end of the tar stream: they read as EIO",
            blob.name().display(),
            String::from_utf8_lossy(&e.path)
        );
    }
    Ok((idx, entries))
}

/// Where the index pass is in the gzip stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Body,
    Trailer,
    Done,
}

/// The index pass: reads the blob from its start, decodes member after member, and hands
/// the output to whoever reads it (the tar scanner), noting points, members and CRCs.
struct Indexer<'a> {
    blob: &'a dyn Blob,
    size: u64,
    cx: &'a OpenContext<'a>,
    input: Vec<u8>,
    /// Blob offset of `input[0]`.
    in_off: u64,
    /// Bytes of `input` consumed.
    in_pos: usize,
    phase: Phase,
    inflater: Option<Inflater>,
    member_crc: crc32fast::Hasher,
    /// CRC of the current segment so far.
    seg_crc: crc32fast::Hasher,
    out: u64,
    obuf: Box<[u8]>,
    ostart: usize,
    oend: usize,
    idx: GzIndex,
    problems: Vec<String>,
    next_report: u64,
    /// The current segment's CRC as the current member started, and whether a point
    /// starts there: a member that fails is split off into segments of its own.
    member_seg_crc: crc32fast::Hasher,
    member_point: bool,
    /// The next member starts a point (the one before failed).
    force_point: bool,
    /// An image layer's digest (of the blob or of the tar stream), checked by the pass.
    digest: Option<PassDigest<'a>>,
}

impl<'a> Indexer<'a> {
    fn new(blob: &'a dyn Blob, cx: &'a OpenContext<'a>) -> Self {
        Indexer {
            blob,
            size: blob.size(),
            cx,
            input: Vec::with_capacity(PASS_CHUNK),
            in_off: 0,
            in_pos: 0,
            phase: Phase::Header,
            inflater: None,
            member_crc: crc32fast::Hasher::new(),
            seg_crc: crc32fast::Hasher::new(),
            out: 0,
            obuf: vec![0u8; PASS_OUTPUT].into_boxed_slice(),
            ostart: 0,
            oend: 0,
            idx: GzIndex::default(),
            problems: Vec::new(),
            next_report: REPORT_EVERY,
            member_seg_crc: crc32fast::Hasher::new(),
            member_point: false,
            force_point: false,
            digest: cx.layer.map(|l| PassDigest::new(&l.digest, l.of)),
        }
    }

    /// Blob offset of the next unconsumed byte.
    fn pos(&self) -> u64 {
        self.in_off + self.in_pos as u64
    }

    /// Make at least `n` unconsumed bytes available if the blob has them; returns how
    /// many there are.
    fn fill(&mut self, n: usize) -> Result<usize> {
        let have = self.input.len() - self.in_pos;
        if have >= n {
            return Ok(have);
        }
        self.input.drain(..self.in_pos);
        self.in_off += self.in_pos as u64;
        self.in_pos = 0;
        let end = self.in_off + self.input.len() as u64;
        let want = (n.max(PASS_CHUNK) - self.input.len()) as u64;
        let take = want.min(self.size - end) as usize;
        if take > 0 {
            let at = self.input.len();
            self.input.resize(at + take, 0);
            self.blob.read_exact_at(&mut self.input[at..], end)?;
            if let Some(d) = &mut self.digest {
                d.blob(end, &self.input[at..]);
            }
            if let Some(p) = self.cx.progress
                && end + take as u64 >= self.next_report
            {
                p.indexing(self.blob.name(), end + take as u64, self.size);
                self.next_report = end + take as u64 + REPORT_EVERY;
            }
        }
        Ok(self.input.len())
    }

    /// Start a segment at `bit` with `window` (compressed here).
    fn point(&mut self, bit: u64, window: Option<Vec<u8>>) {
        self.close_segment();
        let member = self.idx.members.len().saturating_sub(1) as u32;
        self.idx.points.push(Point {
            out: self.out,
            len: 0,
            bit,
            member,
            window: window.map(|w| (w.len() as u32, compress_window(&w))),
            crc: 0,
            ok: true,
        });
    }

    /// Close the current segment: its length and CRC.
    fn close_segment(&mut self) {
        if let Some(last) = self.idx.points.last_mut() {
            last.len = self.out - last.out;
            last.crc = std::mem::take(&mut self.seg_crc).finalize();
        }
    }

    fn output(&mut self, n: usize) {
        let bytes = &self.obuf[self.oend..self.oend + n];
        if let Some(d) = &mut self.digest {
            d.tar(bytes);
        }
        self.member_crc.update(bytes);
        self.seg_crc.update(bytes);
        self.out += n as u64;
        self.oend += n;
    }

    fn last_point_out(&self) -> u64 {
        self.idx.points.last().map_or(0, |p| p.out)
    }

    /// The current member's output could not be verified: it is split off into
    /// segments of its own, and the stream ends here.
    fn member_fails(&mut self, why: String) {
        if let Some(m) = self.idx.members.last_mut() {
            m.len = self.out - m.out;
            m.ok = false;
        }
        self.isolate_member();
        self.problems.push(why);
        self.phase = Phase::Done;
    }

    /// Give the current (failed) member segments of its own, so the segment before it
    /// holds only trusted bytes; the next member starts a new segment.
    fn isolate_member(&mut self) {
        self.force_point = true;
        if self.member_point {
            return;
        }
        let Some(m) = self.idx.members.last().copied() else {
            return;
        };
        let k = self.idx.points.partition_point(|p| p.out <= m.out);
        let Some(before) = k.checked_sub(1) else {
            return;
        };
        let after_out = self.idx.points.get(k).map_or(self.out, |p| p.out);
        let p = &mut self.idx.points[before];
        let own_len = p.len;
        p.len = m.out - p.out;
        p.crc = self.member_seg_crc.clone().finalize();
        let _ = own_len;
        self.idx.points.insert(
            k,
            Point {
                out: m.out,
                len: after_out - m.out,
                bit: 8 * m.data,
                member: (self.idx.members.len() - 1) as u32,
                window: None,
                // Never decoded: a failed member's bytes are not served.
                crc: 0,
                ok: false,
            },
        );
        if k + 1 == self.idx.points.len() {
            // The split-off segment is the open one: its CRC no longer matters.
            self.seg_crc = crc32fast::Hasher::new();
        }
        self.member_point = true;
    }

    /// Decode more output into `obuf` (which the caller has emptied). `Ok(false)` at the
    /// end of the stream (or where it cannot go on; the reason is in `problems`).
    fn produce(&mut self) -> Result<bool> {
        if self.ostart == self.oend {
            self.ostart = 0;
            self.oend = 0;
        }
        loop {
            match self.phase {
                Phase::Done => return Ok(false),
                Phase::Header => self.header()?,
                Phase::Body => {
                    if self.body()? {
                        return Ok(true);
                    }
                }
                Phase::Trailer => self.trailer()?,
            }
        }
    }

    /// At a member's start: its header parsed and its decoding begun (a point if one is
    /// due), or the end of the stream found (zeros or garbage after the last member).
    fn header(&mut self) -> Result<()> {
        let at = self.pos();
        if at >= self.size {
            self.phase = Phase::Done;
            return Ok(());
        }
        let have = self.fill(MAX_HEADER)?;
        match gzip_header(&self.input[self.in_pos..self.in_pos + have]) {
            Ok(Some(h)) => {
                let first = self.idx.members.is_empty();
                self.idx.members.push(Member {
                    header: at,
                    data: at + h as u64,
                    end: 0,
                    out: self.out,
                    len: 0,
                    ok: false,
                });
                self.in_pos += h;
                self.inflater = Some(Inflater::new()?);
                self.member_crc = crc32fast::Hasher::new();
                self.member_point =
                    first || self.force_point || self.out - self.last_point_out() >= SPACING;
                if self.member_point {
                    self.point(8 * (at + h as u64), None);
                } else {
                    self.member_seg_crc = self.seg_crc.clone();
                }
                self.force_point = false;
                self.phase = Phase::Body;
            }
            Ok(None) if self.idx.members.is_empty() => {
                return Err(Error::Format("truncated gzip header".into()));
            }
            Err(e) if self.idx.members.is_empty() => {
                return Err(Error::Format(e));
            }
            _ => {
                // Past the last member: zeros (tape blocking) are fine,
                // anything else is ignored with a warning.
                let rest = self.size - at;
                if !self.zeros_to_end()? {
                    self.problems.push(format!(
                        "{rest} bytes of garbage after the end of the gzip stream (at offset {at}) are ignored"
                    ));
                }
                self.phase = Phase::Done;
            }
        }
        Ok(())
    }

    /// Inside a member: decode up to the next deflate block boundary into `obuf`, a point
    /// there if one is due. Whether there is output to hand over (or `obuf` is full).
    fn body(&mut self) -> Result<bool> {
        let have = self.fill(1)?;
        if have == 0 {
            self.member_fails(format!(
                "the gzip stream is truncated (at offset {}): the last member's bytes cannot be checked, they read as EIO",
                self.size
            ));
            return Ok(false);
        }
        if self.oend == self.obuf.len() {
            return Ok(true);
        }
        let Some(mut inflater) = self.inflater.take() else {
            return Err(Error::Format("no decoder for a gzip member".into()));
        };
        let input = &self.input[self.in_pos..];
        let step = inflater.step_to_block(input, &mut self.obuf[self.oend..]);
        let p = match step {
            Ok(p) => p,
            Err(e) => {
                let at = self.pos();
                self.member_fails(format!(
                    "bad deflate data in the gzip member at offset {} (near {at}): {e}; its bytes read as EIO",
                    self.idx.members.last().map_or(0, |m| m.header)
                ));
                return Ok(false);
            }
        };
        self.in_pos += p.consumed;
        self.output(p.produced);
        let boundary = inflater
            .boundary()
            .filter(|_| !p.ended && self.out - self.last_point_out() >= SPACING);
        let window = match boundary {
            Some(_) => Some(inflater.window()?),
            None => None,
        };
        self.inflater = Some(inflater);
        if p.ended {
            self.phase = Phase::Trailer;
        } else if let Some(bits) = boundary {
            let bit = 8 * self.pos() - u64::from(bits);
            self.point(bit, window);
        } else if p.consumed == 0 && p.produced == 0 && self.pos() >= self.size {
            self.member_fails(format!(
                "the gzip stream is truncated (at offset {}): the last member's bytes cannot be checked, they read as EIO",
                self.size
            ));
            return Ok(false);
        }
        if self.oend > self.ostart {
            return Ok(true);
        }
        Ok(false)
    }

    /// At a member's end: its trailer checked against the CRC-32 and size of its output
    /// (a member that fails is split off; a small one that passes loses its inner
    /// points).
    fn trailer(&mut self) -> Result<()> {
        let have = self.fill(8)?;
        if have < 8 {
            self.member_fails(
                "the gzip stream ends inside a member's trailer: its bytes cannot be checked, they read as EIO".into(),
            );
            return Ok(());
        }
        let t = &self.input[self.in_pos..self.in_pos + 8];
        let crc = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let isize = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
        self.in_pos += 8;
        let end = self.pos();
        let out = self.out;
        let actual = std::mem::take(&mut self.member_crc).finalize();
        let Some(m) = self.idx.members.last_mut() else {
            return Err(Error::Format("a trailer without a member".into()));
        };
        m.end = end;
        m.len = out - m.out;
        m.ok = crc == actual && isize == m.len as u32;
        let (header, m_out, m_len, ok) = (m.header, m.out, m.len, m.ok);
        if !ok {
            self.problems.push(format!(
                "the gzip member at offset {header} fails its check (CRC-32 {actual:08x}, trailer says {crc:08x}; size {m_len}, trailer says {isize}): its bytes read as EIO"
            ));
            self.isolate_member();
        } else if m_len <= WHOLE_MEMBER {
            self.merge_points_inside(m_out);
        }
        self.phase = Phase::Header;
        Ok(())
    }

    /// Drop the points inside the member whose output starts at `m_out` (a small member
    /// is decoded whole): their segments join the one before.
    fn merge_points_inside(&mut self, m_out: u64) {
        let first_inside = self.idx.points.partition_point(|p| p.out <= m_out);
        if first_inside >= self.idx.points.len() || first_inside == 0 {
            return;
        }
        // The current segment (the last point's) is still open: close it so every
        // segment has its CRC, then fold them into the one the member starts in.
        self.close_segment();
        let merged: Vec<Point> = self.idx.points.drain(first_inside..).collect();
        let Some(keep) = self.idx.points.last_mut() else {
            return;
        };
        let mut crc = crc32fast::Hasher::new_with_initial_len(keep.crc, keep.len);
        for p in &merged {
            crc.combine(&crc32fast::Hasher::new_with_initial_len(p.crc, p.len));
            keep.len += p.len;
        }
        // Reopen the joined segment so the output still to come counts in it.
        self.seg_crc = crc;
    }

    /// Whether every byte from the current position to the end of the blob is zero.
    fn zeros_to_end(&mut self) -> Result<bool> {
        loop {
            let have = self.fill(1)?;
            if have == 0 {
                return Ok(true);
            }
            if self.input[self.in_pos..].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            self.in_pos = self.input.len();
        }
    }

    /// The index, with each segment's trust settled.
    fn finish(mut self) -> GzIndex {
        self.close_segment();
        let mut idx = self.idx;
        idx.total = self.out;
        for p in &mut idx.points {
            let end = p.out + p.len;
            p.ok = idx
                .members
                .iter()
                .filter(|m| m.out < end.max(p.out + 1) && m.out + m.len.max(1) > p.out)
                .all(|m| m.ok);
        }
        idx.note = self.problems.join("; ");
        idx
    }
}

impl Produce for Indexer<'_> {
    fn produce(&mut self) -> Result<bool> {
        Indexer::produce(self)
    }

    fn unread(&self) -> &[u8] {
        &self.obuf[self.ostart..self.oend]
    }

    fn consume(&mut self, n: usize) {
        self.ostart += n;
    }
}

/// A window, deflate-compressed (fast): most are text and shrink to a third.
fn compress_window(w: &[u8]) -> Box<[u8]> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(w);
    e.finish().unwrap_or_default().into_boxed_slice()
}

/// The raw window of a point.
fn window_of(p: &Point) -> Result<Vec<u8>> {
    let Some((len, packed)) = &p.window else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    OneShot::new()?.decode(packed, &mut out, *len as usize)?;
    Ok(out)
}

// The cached index: a versioned, checksummed binary form.

const INDEX_MAGIC: &[u8; 8] = b"PKGFSTGZ";
const INDEX_VERSION: u32 = 2;

fn encode(idx: &GzIndex, entries: &[Entry]) -> Result<Vec<u8>> {
    let mut o = Vec::new();
    o.extend_from_slice(INDEX_MAGIC);
    o.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    o.extend_from_slice(&idx.total.to_le_bytes());
    o.extend_from_slice(&(idx.members.len() as u32).to_le_bytes());
    for m in &idx.members {
        for v in [m.header, m.data, m.end, m.out, m.len] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.push(u8::from(m.ok));
    }
    o.extend_from_slice(&(idx.points.len() as u32).to_le_bytes());
    for p in &idx.points {
        for v in [p.out, p.len, p.bit] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&p.member.to_le_bytes());
        o.extend_from_slice(&p.crc.to_le_bytes());
        o.push(u8::from(p.ok));
        let (raw, packed) = p
            .window
            .as_ref()
            .map_or((0, &[][..]), |(l, b)| (*l, &b[..]));
        o.extend_from_slice(&raw.to_le_bytes());
        o.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        o.extend_from_slice(packed);
    }
    o.extend_from_slice(&(idx.note.len() as u32).to_le_bytes());
    o.extend_from_slice(idx.note.as_bytes());
    o.extend_from_slice(&(idx.spans.len() as u32).to_le_bytes());
    for (a, b, d) in &idx.spans {
        o.extend_from_slice(&a.to_le_bytes());
        o.extend_from_slice(&b.to_le_bytes());
        let d = d.to_string();
        o.extend_from_slice(&(d.len() as u32).to_le_bytes());
        o.extend_from_slice(d.as_bytes());
    }
    let frame = super::floor::codec::encode_index(entries, 3)?;
    o.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    o.extend_from_slice(&frame);
    let crc = crc32fast::hash(&o);
    o.extend_from_slice(&crc.to_le_bytes());
    Ok(o)
}

/// Decode a cached index of a blob of `blob_size` bytes, checking everything a read
/// relies on: the checksum, segments that tile the stream in order, members and bit
/// positions inside the blob, windows no larger than deflate's.
fn decode(bytes: &[u8], blob_size: u64) -> Result<(GzIndex, Vec<Entry>)> {
    let bad = |m: &str| Error::Format(format!("cached tar.gz index: {m}"));
    let body = bytes
        .len()
        .checked_sub(4)
        .map(|n| &bytes[..n])
        .ok_or_else(|| bad("too short"))?;
    let stored = u32::from_le_bytes(
        bytes[body.len()..]
            .try_into()
            .map_err(|_| bad("too short"))?,
    );
    if crc32fast::hash(body) != stored {
        return Err(bad("checksum mismatch"));
    }
    let mut c = Cursor::new(body, "cached tar.gz index");
    if c.take(8)? != INDEX_MAGIC || c.u32()? != INDEX_VERSION {
        return Err(bad("not an index of this version"));
    }
    let total = c.u64()?;
    let n = c.u32()? as usize;
    if n > body.len() / 41 {
        return Err(bad("member count"));
    }
    let mut members = Vec::with_capacity(n);
    for _ in 0..n {
        let m = Member {
            header: c.u64()?,
            data: c.u64()?,
            end: c.u64()?,
            out: c.u64()?,
            len: c.u64()?,
            ok: c.u8()? != 0,
        };
        if m.header >= m.data || m.data > blob_size || m.end > blob_size {
            return Err(bad("member outside the archive"));
        }
        members.push(m);
    }
    let n = c.u32()? as usize;
    if n > body.len() / 41 {
        return Err(bad("point count"));
    }
    let mut points: Vec<Point> = Vec::with_capacity(n);
    let mut next_out = 0u64;
    for _ in 0..n {
        let (out, len, bit) = (c.u64()?, c.u64()?, c.u64()?);
        let (member, crc, ok) = (c.u32()?, c.u32()?, c.u8()? != 0);
        let (raw, plen) = (c.u32()?, c.u32()? as usize);
        let packed = c.take(plen)?;
        if out != next_out || bit / 8 >= blob_size.max(1) || member as usize >= members.len() {
            return Err(bad("points out of order"));
        }
        if raw as usize > WINDOW {
            return Err(bad("window larger than 32 KiB"));
        }
        next_out = out
            .checked_add(len)
            .ok_or_else(|| bad("length overflows"))?;
        points.push(Point {
            out,
            len,
            bit,
            member,
            window: (raw > 0).then(|| (raw, packed.into())),
            crc,
            ok,
        });
    }
    if next_out != total {
        return Err(bad("segments do not cover the stream"));
    }
    let nl = c.u32()? as usize;
    let note = String::from_utf8_lossy(c.take(nl)?).into_owned();
    let ns = c.u32()? as usize;
    if ns != 0 && ns != points.len() {
        return Err(bad("span count"));
    }
    let mut spans = Vec::with_capacity(ns);
    for _ in 0..ns {
        let (a, b) = (c.u64()?, c.u64()?);
        let dl = c.u32()? as usize;
        let d = std::str::from_utf8(c.take(dl)?).map_err(|_| bad("span digest"))?;
        if a > b || b > blob_size {
            return Err(bad("span outside the archive"));
        }
        spans.push((a, b, crate::io::digest::Digest::parse(d)?));
    }
    let fl = c.u32()? as usize;
    let frame = c.take(fl)?;
    let entries = super::floor::codec::decode_index(frame, total.max(1))?;
    Ok((
        GzIndex {
            total,
            members,
            points,
            note,
            spans,
        },
        entries,
    ))
}

/// Fuzzing entry point: decode a cached index from untrusted bytes.
pub fn fuzz_decode(bytes: &[u8]) {
    let _ = decode(bytes, 1 << 40);
}

/// Fuzzing entry point: index an archive made of untrusted bytes (no cache).
pub fn fuzz_pass(bytes: &[u8]) {
    let blob = crate::io::blob::Bytes::new("fuzz.tar.gz", bytes.to_vec());
    let cx = OpenContext::default();
    if let Ok((idx, entries)) = pass(&blob, &cx) {
        let pkg = TarGzPackage::new(idx, &entries);
        let _ = pkg.segment_at(0);
    }
}

/// An open gzip tar archive: its index, and the file bytes each segment holds (for the
/// delivery accounting).
#[derive(Debug)]
pub struct TarGzPackage {
    idx: GzIndex,
    file_bytes: Vec<u64>,
    /// Per span of a zTOC index: its compressed bytes matched their digest.
    verified: Vec<std::sync::atomic::AtomicBool>,
}

impl TarGzPackage {
    fn new(idx: GzIndex, entries: &[Entry]) -> Self {
        let mut file_bytes = vec![0u64; idx.points.len()];
        let pkg_points = &idx.points;
        for e in entries {
            let (EntryKind::File, Loc::Stream(start)) = (&e.kind, &e.data) else {
                continue;
            };
            let end = start.saturating_add(e.size).min(idx.total);
            let mut i = pkg_points.partition_point(|p| p.out + p.len <= *start);
            while let Some(p) = pkg_points.get(i) {
                if p.out >= end {
                    break;
                }
                file_bytes[i] += (p.out + p.len).min(end) - p.out.max(*start);
                i += 1;
            }
        }
        let verified = idx.spans.iter().map(|_| Default::default()).collect();
        TarGzPackage {
            idx,
            file_bytes,
            verified,
        }
    }

    /// Before segment `si` of a zTOC index is decoded: its compressed bytes against
    /// their digest (once; the bytes are kept by the blob's caches for the decode that
    /// follows). Bytes that fail are dropped from those caches.
    fn check_span(&self, blob: &dyn Blob, si: usize) -> Result<()> {
        use std::sync::atomic::Ordering::{Acquire, Release};
        let (Some((a, b, digest)), Some(done)) = (self.idx.spans.get(si), self.verified.get(si))
        else {
            return Ok(());
        };
        if done.load(Acquire) {
            return Ok(());
        }
        if blob.round_trips() && b - a > READ_CHUNK as u64 {
            // All of it at once, not a round trip per piece.
            blob.will_need(&[(*a, *b)]);
        }
        let mut h = digest.hasher();
        let mut buf = vec![0u8; READ_CHUNK.min((b - a) as usize)];
        let mut at = *a;
        while at < *b {
            let n = ((b - at) as usize).min(buf.len());
            blob.read_exact_at(&mut buf[..n], at)?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        let got = h.finish();
        if got != *digest {
            blob.forget();
            return Err(mismatch(
                &format!("span {si} (bytes {a}-{b}) of the layer"),
                digest,
                &got,
            ));
        }
        done.store(true, Release);
        Ok(())
    }

    /// A read of stream bytes `[from, to)` from a server, through a zTOC: the compressed
    /// spans it needs and those of the next [`FILE_AHEAD`] bytes of its file, asked for
    /// at once. Each span's check then reads what is on its way instead of going to the
    /// server a piece at a time (python3.11 crossed five spans of about 1.1 MB in ten
    /// round trips, one after the other).
    fn fetch_ahead(&self, r: &Reading<'_>, from: u64, to: u64) {
        if self.idx.spans.is_empty() || !r.blob.round_trips() {
            return;
        }
        let Loc::Stream(start) = r.loc else { return };
        let file_end = start + r.size;
        let to = file_end.min(to.max(from + FILE_AHEAD)).max(to);
        let (Some(first), Some(last)) = (self.segment_at(from), self.segment_at(to - 1)) else {
            return;
        };
        if let (Some(a), Some(b)) = (self.idx.spans.get(first), self.idx.spans.get(last)) {
            r.blob.will_need(&[(a.0, b.1)]);
        }
    }

    /// Whether a decoded segment's CRC-32 is right (a zTOC index has none: its spans
    /// were checked before decoding).
    fn crc_ok(&self, p: &Point, crc: u32) -> bool {
        !self.idx.spans.is_empty() || crc == p.crc
    }

    /// The segment holding stream offset `pos`.
    fn segment_at(&self, pos: u64) -> Option<usize> {
        (pos < self.idx.total).then(|| self.idx.points.partition_point(|p| p.out + p.len <= pos))
    }

    fn key(r: &Reading<'_>, si: usize, block: u64) -> BlockKey {
        BlockKey {
            archive: r.key,
            unit: si as u64,
            block,
        }
    }

    /// A segment of at most [`WHOLE_SEGMENT`] bytes, decoded whole, checked, cached.
    fn whole(&self, r: &Reading<'_>, si: usize) -> Result<Arc<Block>> {
        let key = Self::key(r, si, 0);
        r.io.block(key, |_| {
            let p = &self.idx.points[si];
            self.check_span(r.blob, si)?;
            let mut out = Block::empty(p.len as usize);
            let read = self.decode_whole(r.blob, si, &mut out)?;
            r.io.count_read(read);
            if !self.crc_ok(p, crc32fast::hash(&out)) {
                return Err(Error::Corrupt(format!(
                    "decoded data at stream offset {} fails its CRC-32 check",
                    p.out
                )));
            }
            r.io.count_decoded(out.len());
            let block = Arc::new(Block::new(out));
            r.io.cache().insert(key, block.clone());
            Ok(block)
        })
    }

    /// Decode segment `si` into `out`: whole members by libdeflate while the segment
    /// starts at a member and they end inside it, the rest streamed. Returns the
    /// compressed bytes read.
    fn decode_whole(&self, blob: &dyn Blob, si: usize, out: &mut Vec<u8>) -> Result<usize> {
        let p = &self.idx.points[si];
        let end = p.out + p.len;
        let mut m = p.member as usize;
        let mut read = 0usize;
        if p.window.is_none() {
            let mut one: Option<OneShot> = None;
            let mut input = Vec::new();
            while let Some(mm) = self.idx.members.get(m) {
                let whole =
                    mm.ok && mm.out >= p.out && mm.out + mm.len <= end && mm.end >= mm.data + 8;
                if !whole || p.out + out.len() as u64 != mm.out {
                    break;
                }
                let csize = (mm.end - 8 - mm.data) as usize;
                input.resize(csize, 0);
                blob.read_exact_at(&mut input, mm.data)?;
                read += csize;
                let d = match &mut one {
                    Some(d) => d,
                    None => one.insert(OneShot::new()?),
                };
                d.decode_append(&input, out, mm.len as usize)?;
                m += 1;
                if p.out + out.len() as u64 >= end {
                    return Ok(read);
                }
            }
        }
        let at = p.out + out.len() as u64;
        let mut s = if at == p.out {
            Stream::at_point(blob, &self.idx, si)?
        } else {
            Stream::at_member(&self.idx, m)?
        };
        read += s.fill(blob, &self.idx, out, (end - at) as usize)?;
        Ok(read)
    }

    /// Block `bi` of a segment larger than [`WHOLE_SEGMENT`], through a parked decoder.
    fn piece(&self, r: &Reading<'_>, si: usize, bi: u64) -> Result<Arc<Block>> {
        r.io.block(Self::key(r, si, bi), |parked| {
            let p = &self.idx.points[si];
            let blob = r.blob;
            let mut stream = match parked
                .take()
                .and_then(|b| b.downcast::<(u64, Stream)>().ok())
            {
                Some(b) if b.0 <= bi => *b,
                _ => {
                    r.io.stats
                        .streams_started
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.check_span(blob, si)?;
                    (0, Stream::at_point(blob, &self.idx, si)?)
                }
            };
            loop {
                let (at, s) = &mut stream;
                let start = *at * BLOCK_SIZE;
                let want = (p.len - start).min(BLOCK_SIZE) as usize;
                let mut out = Block::buffer(0);
                let read = s.fill(blob, &self.idx, &mut out, want)?;
                r.io.count_read(read);
                r.io.count_decoded(out.len());
                if start + want as u64 == p.len && !self.crc_ok(p, s.crc()) {
                    return Err(Error::Corrupt(format!(
                        "decoded data at stream offset {} fails its CRC-32 check",
                        p.out
                    )));
                }
                let block = Arc::new(Block::new(out));
                r.io.cache().insert(Self::key(r, si, *at), block.clone());
                *at += 1;
                if *at - 1 == bi {
                    if start + (want as u64) < p.len {
                        *parked = Some(Box::new(stream));
                    }
                    return Ok(block);
                }
            }
        })
    }
}

/// A decoder going through the stream from a point: member by member.
struct Stream {
    inflater: Inflater,
    /// The member being decoded.
    m: usize,
    /// Blob offset of the next input byte.
    at: u64,
    input: Vec<u8>,
    in_pos: usize,
    crc: crc32fast::Hasher,
}

impl Stream {
    /// At point `si`: a member's start, or a block boundary (primed with the bits of
    /// the byte before, given the window).
    fn at_point(blob: &dyn Blob, idx: &GzIndex, si: usize) -> Result<Stream> {
        let p = &idx.points[si];
        let (byte, bits) = (p.bit / 8, (p.bit % 8) as u32);
        let (at, prime) = if bits == 0 {
            (byte, (0, 0))
        } else {
            let mut b = [0u8; 1];
            blob.read_exact_at(&mut b, byte)?;
            (byte + 1, (8 - bits, u32::from(b[0]) >> bits))
        };
        let window = window_of(p)?;
        Ok(Stream {
            inflater: Inflater::resume(prime, &window)?,
            m: p.member as usize,
            at,
            input: Vec::new(),
            in_pos: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    /// At the start of member `m`.
    fn at_member(idx: &GzIndex, m: usize) -> Result<Stream> {
        let mm = idx
            .members
            .get(m)
            .ok_or_else(|| Error::Corrupt("stream offset past the last gzip member".into()))?;
        Ok(Stream {
            inflater: Inflater::new()?,
            m,
            at: mm.data,
            input: Vec::new(),
            in_pos: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    fn crc(&self) -> u32 {
        self.crc.clone().finalize()
    }

    /// Append exactly `want` bytes of output to `out`. Returns the compressed bytes read.
    fn fill(
        &mut self,
        blob: &dyn Blob,
        idx: &GzIndex,
        out: &mut Vec<u8>,
        want: usize,
    ) -> Result<usize> {
        let mut read = 0usize;
        let start = out.len();
        out.reserve(want);
        let target = start + want;
        while out.len() < target {
            if self.in_pos == self.input.len() {
                // Input of this member only: its data ends before its trailer.
                let mm = idx.members.get(self.m).ok_or_else(|| {
                    Error::Corrupt("compressed data ends before the index says".into())
                })?;
                let limit = if mm.end >= mm.data + 8 {
                    mm.end - 8
                } else {
                    blob.size()
                };
                let n = limit.saturating_sub(self.at).min(READ_CHUNK as u64) as usize;
                if n == 0 {
                    return Err(Error::Corrupt(
                        "compressed data ends before the index says".into(),
                    ));
                }
                self.input.resize(n, 0);
                blob.read_exact_at(&mut self.input, self.at)?;
                self.at += n as u64;
                self.in_pos = 0;
                read += n;
            }
            let have = out.len();
            let room = target - have;
            out.resize(target, 0);
            let p = self
                .inflater
                .step(&self.input[self.in_pos..], &mut out[have..have + room]);
            let p = match p {
                Ok(p) => p,
                Err(e) => {
                    out.truncate(have);
                    return Err(e);
                }
            };
            out.truncate(have + p.produced);
            self.crc.update(&out[have..]);
            self.in_pos += p.consumed;
            if p.ended {
                // On to the next member, past this one's trailer and the next header.
                self.m += 1;
                let next = idx.members.get(self.m);
                match next {
                    Some(mm) if out.len() < target => {
                        self.inflater = Inflater::new()?;
                        self.at = mm.data;
                        self.input.clear();
                        self.in_pos = 0;
                    }
                    _ if out.len() < target => {
                        return Err(Error::Corrupt(
                            "the gzip stream ends before the index says".into(),
                        ));
                    }
                    _ => {}
                }
            } else if p.consumed == 0 && p.produced == 0 {
                return Err(Error::Corrupt("the decoder makes no progress".into()));
            }
        }
        Ok(read)
    }
}

impl Package for TarGzPackage {
    fn format(&self) -> &'static str {
        "tar.gz"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        // A rescan of an unchanged archive: the cache has its index (or, without a
        // cache, the pass runs again, which a rescan then waits for).
        let cx = OpenContext {
            defer_over: None,
            progress: None,
            ..*cx
        };
        let (idx, entries, _) = index(&**blob, &cx)?;
        if idx.points.len() != self.idx.points.len() || idx.total != self.idx.total {
            return Err(Error::Corrupt("the archive's index changed".into()));
        }
        Ok(entries)
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        let Loc::Stream(start) = r.loc else {
            return Err(Error::Format(format!(
                "{:?} is no place in a tar.gz archive",
                r.loc
            )));
        };
        self.fetch_ahead(r, start + offset, start + end);
        gather(start + offset, start + end, span, |pos| {
            let si = self.segment_at(pos).ok_or_else(|| {
                Error::Corrupt(format!(
                    "offset {pos} is past the end of the tar stream ({} bytes)",
                    self.idx.total
                ))
            })?;
            let p = &self.idx.points[si];
            if !p.ok {
                return Err(Error::Corrupt(format!(
                    "bytes at stream offset {pos} cannot be trusted: {}",
                    self.idx.note
                )));
            }
            if p.len <= WHOLE_SEGMENT {
                Ok((p.out, self.whole(r, si)?))
            } else {
                let bi = (pos - p.out) / BLOCK_SIZE;
                Ok((p.out + bi * BLOCK_SIZE, self.piece(r, si, bi)?))
            }
        })
    }

    /// From the point before the file's data to the point after it.
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        let Loc::Stream(start) = r.loc else {
            return None;
        };
        let first = self.segment_at(*start)?;
        let last = self.segment_at((start + r.size).checked_sub(1)?)?;
        let from = self.idx.points[first].bit / 8;
        let to = self
            .idx
            .points
            .get(last + 1)
            .map_or(r.blob.size(), |p| p.bit.div_ceil(8));
        Some((from, to))
    }

    /// A segment holds several files and their tar headers: its bytes given are
    /// counted against the file bytes it holds (segments decoded in blocks are left to
    /// the cache's LRU).
    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        let Loc::Stream(data) = r.loc else {
            return;
        };
        let (start, end) = (data + start, data + end);
        let Some(mut si) = self.segment_at(start) else {
            return;
        };
        while let (Some(p), Some(&of)) = (self.idx.points.get(si), self.file_bytes.get(si)) {
            if p.out >= end {
                break;
            }
            if p.len <= WHOLE_SEGMENT {
                let given = (p.out + p.len).min(end) - p.out.max(start);
                r.io.cache()
                    .delivered_bytes(&Self::key(r, si, 0), given, of);
            }
            si += 1;
        }
    }

    /// Decode every segment, checking each against its CRC-32, and report what the
    /// index pass found.
    fn verify(&self, archive: &Archive, _cx: &OpenContext) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        if !self.idx.note.is_empty() {
            problems.push(self.idx.note.clone());
        }
        for (si, p) in self.idx.points.iter().enumerate() {
            if !p.ok {
                continue;
            }
            let mut out = Vec::new();
            if let Err(e) = self.check_span(&*archive.blob, si) {
                problems.push(format!("segment at stream offset {}: {e}", p.out));
                continue;
            }
            let r = if p.len <= WHOLE_SEGMENT {
                self.decode_whole(&*archive.blob, si, &mut out).map(drop)
            } else {
                Stream::at_point(&*archive.blob, &self.idx, si).and_then(|mut s| {
                    let mut left = p.len;
                    while left > 0 {
                        out.clear();
                        let n = left.min(BLOCK_SIZE);
                        s.fill(&*archive.blob, &self.idx, &mut out, n as usize)?;
                        left -= n;
                    }
                    out = Vec::new();
                    if !self.crc_ok(p, s.crc()) {
                        return Err(Error::Corrupt("CRC-32 mismatch".into()));
                    }
                    Ok(())
                })
            };
            let bad = match r {
                Err(e) => Some(e.to_string()),
                Ok(()) if p.len <= WHOLE_SEGMENT && !self.crc_ok(p, crc32fast::hash(&out)) => {
                    Some("CRC-32 mismatch".into())
                }
                Ok(()) => None,
            };
            if let Some(why) = bad {
                problems.push(format!("segment at stream offset {}: {why}", p.out));
            }
        }
        Ok(problems)
    }
}

/// Whether `path` looks like a tar.gz by name (messages only; formats are found by
/// content).
pub fn named_like(path: &Path) -> bool {
    let s = path.to_string_lossy();
    [".tar.gz", ".tgz", ".crate"].iter().any(|e| s.ends_with(e))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::format::floor::tar::{TarKind, TarWriter, WriteEntry};
    use crate::io::Io;
    use crate::io::blob::Bytes;

    /// Text-like bytes: compressible, with deflate blocks of some tens of KiB.
    fn text(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                b"abcdefghij klmnop\n"[(x >> 27) as usize % 18]
            })
            .collect()
    }

    /// A tar stream of `files` (path, bytes).
    fn tar(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut t = TarWriter::new(Vec::new());
        for (path, data) in files {
            t.header(&WriteEntry {
                path: path.as_bytes(),
                kind: TarKind::File,
                mode: 0o644,
                uid: 1000,
                gid: 1000,
                mtime: 1_700_000_000,
                size: data.len() as u64,
                link: b"",
            })
            .unwrap();
            t.data(data).unwrap();
            t.end_entry().unwrap();
        }
        t.finish().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Open `bytes` as a tar.gz (no cache) and read every file through the package.
    fn open(bytes: Vec<u8>) -> (Archive, Vec<Entry>) {
        let blob: Arc<dyn Blob> = Arc::new(Bytes::new("t.tar.gz", bytes));
        let probe = Probe::read(&*blob).unwrap();
        let o = TarGz
            .open(&blob, &probe, &OpenContext::default())
            .unwrap()
            .expect("a tar.gz");
        (Archive::new(blob, o.package, o.origin), o.entries)
    }

    fn read(a: &Archive, io: &Io, e: &Entry, offset: u64, len: u32) -> Result<Vec<u8>> {
        a.read(io, &e.data, e.size, offset, len, Span::Whole)
            .map(ReadData::into_vec)
    }

    /// The `TarGzPackage` of an archive opened by [`open`].
    fn package_of(a: &Archive) -> &TarGzPackage {
        a.package
            .as_any()
            .downcast_ref::<TarGzPackage>()
            .expect("a tar.gz package")
    }

    #[test]
    fn gzip_headers_with_every_optional_field_and_every_truncation() {
        let mut h = vec![0x1f, 0x8b, 8, 4 | 8 | 16 | 2, 0, 0, 0, 0, 0, 3];
        h.extend_from_slice(&3u16.to_le_bytes());
        h.extend_from_slice(b"xyz");
        h.extend_from_slice(b"name\0comment\0");
        h.extend_from_slice(&[0xaa, 0xbb]);
        assert_eq!(gzip_header(&h), Ok(Some(h.len())));
        for cut in 0..h.len() {
            assert_eq!(gzip_header(&h[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(gzip_header(b"PK\x03\x04").is_err());
        assert!(gzip_header(&[0x1f, 0x8b, 9, 0, 0, 0, 0, 0, 0, 3]).is_err());
        assert!(gzip_header(&[0x1f, 0x8b, 8, 0x20, 0, 0, 0, 0, 0, 3]).is_err());
        let mut endless = vec![0x1f, 0x8b, 8, 8, 0, 0, 0, 0, 0, 3];
        endless.resize(MAX_HEADER + 10, b'a');
        assert!(
            gzip_header(&endless).is_err(),
            "an unbounded name is refused"
        );
    }

    #[test]
    fn a_large_member_is_cut_into_segments_and_every_byte_reads_back() {
        let big = text(9 << 20, 7);
        let files = vec![
            ("a/small.txt", b"small file\n".to_vec()),
            ("a/big.bin", big.clone()),
            ("b/after.txt", text(50_000, 3)),
        ];
        let (a, entries) = open(gzip(&tar(&files)));
        let pkg = package_of(&a);
        assert!(pkg.idx.points.len() >= 8, "{} points", pkg.idx.points.len());
        assert!(pkg.idx.points.iter().all(|p| p.ok));
        assert!(pkg.idx.points[1..].iter().all(|p| p.window.is_some()));
        assert_eq!(entries.len(), 3);
        let io = Io::new(4 << 20);
        for ((_, data), e) in files.iter().zip(&entries) {
            assert!(read(&a, &io, e, 0, u32::MAX).unwrap() == *data);
        }
        // Random places: each costs at most a segment.
        let e = &entries[1];
        let mut x = 11u64;
        for _ in 0..50 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let off = (x >> 20) % (big.len() as u64 - 5000);
            let before = io
                .stats
                .decompressed_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            let got = read(&a, &io, e, off, 5000).unwrap();
            assert!(got == big[off as usize..off as usize + 5000], "at {off}");
            let cost = io
                .stats
                .decompressed_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
                - before;
            assert!(
                cost <= 2 * (SPACING + (1 << 20)),
                "{cost} bytes decoded for 5000"
            );
        }
        // Extents lie within the archive and cover the data's compressed bytes.
        let r = Reading {
            io: &io,
            blob: &*a.blob,
            key: a.key,
            loc: &e.data,
            size: e.size,
        };
        let (from, to) = pkg.extent(&r).unwrap();
        assert!(from < to && to <= a.blob.size());
    }

    #[test]
    fn concatenated_members_small_and_large_read_through_their_seams() {
        // `cat a.gz b.gz c.gz`: a tar split across three members, the middle one large
        // enough to hold points of its own.
        let files = vec![
            ("one", text(300_000, 1)),
            ("two", text(6 << 20, 2)),
            ("three", text(700_000, 3)),
        ];
        let t = tar(&files);
        let cuts = [0, 123_457, 5_000_011, t.len()];
        let gz: Vec<u8> = cuts.windows(2).flat_map(|w| gzip(&t[w[0]..w[1]])).collect();
        let (a, entries) = open(gz);
        let pkg = package_of(&a);
        assert_eq!(pkg.idx.members.len(), 3);
        assert!(pkg.idx.members.iter().all(|m| m.ok));
        let io = Io::new(64 << 20);
        for ((_, data), e) in files.iter().zip(&entries) {
            assert!(read(&a, &io, e, 0, u32::MAX).unwrap() == *data);
        }
        // Across the seam between members one and two.
        let e = &entries[1];
        let seam = 123_457 - 1024 - 512; // `two`'s data starts after two headers
        let got = read(&a, &io, e, seam as u64 - 10, 20).unwrap();
        assert!(got == files[1].1[seam - 10..seam + 10]);
    }

    #[test]
    fn the_cached_form_round_trips_and_refuses_damage() {
        let files = vec![("f", text(3 << 20, 5)), ("g", b"g".to_vec())];
        let bytes = gzip(&tar(&files));
        let size = bytes.len() as u64;
        let (a, entries) = open(bytes);
        let idx = &package_of(&a).idx;
        let enc = encode(idx, &entries).unwrap();
        let (back, back_entries) = decode(&enc, size).unwrap();
        assert_eq!(&back, idx);
        assert_eq!(back_entries, entries);
        for cut in (0..enc.len()).step_by(97) {
            assert!(decode(&enc[..cut], size).is_err());
        }
        let mut flipped = enc.clone();
        flipped[40] ^= 1;
        assert!(decode(&flipped, size).is_err());
        // A blob smaller than the index says: refused.
        assert!(decode(&enc, 100).is_err());
        // An index made from a zTOC keeps its spans and their digests.
        let mut z = idx.clone();
        z.spans = z
            .points
            .iter()
            .map(|p| {
                (
                    p.bit / 8,
                    size,
                    crate::io::digest::Digest::parse(&format!("sha256:{}", "ab".repeat(32)))
                        .unwrap(),
                )
            })
            .collect();
        let enc = encode(&z, &entries).unwrap();
        assert_eq!(decode(&enc, size).unwrap().0, z);
        assert!(decode(&enc, size - 1).is_err(), "a span past the blob");
    }

    #[test]
    fn a_cache_serves_the_second_open() {
        let dir = tempfile::tempdir().unwrap();
        let cache = crate::format::IndexCache::new(dir.path().join("idx"));
        let cx = OpenContext {
            index_cache: Some(&cache),
            ..OpenContext::default()
        };
        let bytes = gzip(&tar(&[("f", text(2 << 20, 9))]));
        let blob = Bytes::new("t.tar.gz", bytes);
        let (i1, e1, o1) = index(&blob, &cx).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("idx")).unwrap().count(),
            1
        );
        let (i2, e2, o2) = index(&blob, &cx).unwrap();
        assert_eq!((i1, e1), (i2, e2));
        assert_eq!((o1, o2), (IndexOrigin::Pass, IndexOrigin::Cache));
        // Deferring: a pass is needed (another version of the blob), and it is too big.
        let other = Bytes::new("u.tar.gz", gzip(&tar(&[("f", text(100_000, 1))])));
        let late = OpenContext {
            defer_over: Some(10),
            ..cx
        };
        assert!(matches!(index(&other, &late), Err(Error::Deferred)));
        assert!(
            index(&blob, &late).is_ok(),
            "cached: no pass, nothing deferred"
        );
    }

    #[test]
    fn a_bad_trailer_or_a_truncation_makes_that_member_eio_and_the_rest_serves() {
        let files = vec![("good", text(200_000, 1)), ("bad", text(200_000, 2))];
        let t = tar(&files);
        let cut = 1024 + 200_192; // after `good`'s header and data
        let mut first = gzip(&t[..cut]);
        let mut second = gzip(&t[cut..]);
        let n = second.len();
        second[n - 8] ^= 0xff; // its CRC
        first.extend_from_slice(&second);
        let (a, entries) = open(first.clone());
        let io = Io::new(64 << 20);
        assert!(read(&a, &io, &entries[0], 0, u32::MAX).unwrap() == files[0].1);
        let e = read(&a, &io, &entries[1], 0, 100).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("fails its check"), "{e}");

        // Truncated in the middle of the second member.
        let mut both = gzip(&t[..cut]);
        let second = gzip(&t[cut..]);
        both.extend_from_slice(&second[..second.len() / 2]);
        let (a, entries) = open(both);
        assert!(read(&a, &io, &entries[0], 0, u32::MAX).unwrap() == files[0].1);
        assert_eq!(
            read(&a, &io, &entries[1], 0, 10).unwrap_err().errno(),
            libc::EIO
        );

        // Garbage after the end: ignored (with a warning), zeros silently.
        for tail in [vec![0u8; 4096], b"garbage".to_vec()] {
            let mut g = gzip(&t);
            g.extend_from_slice(&tail);
            let (a, entries) = open(g);
            assert!(read(&a, &io, &entries[1], 0, u32::MAX).unwrap() == files[1].1);
            assert_eq!(package_of(&a).idx.note.is_empty(), tail[0] == 0);
        }

        // A stream broken before any tar header: not an archive to mount.
        let mut broken = gzip(&t);
        broken.truncate(30);
        let blob: Arc<dyn Blob> = Arc::new(Bytes::new("b.tar.gz", broken));
        let r = crate::format::open(blob, &OpenContext::default());
        assert!(matches!(r, Err(crate::format::OpenError::Bad(_))), "{r:?}");
    }

    #[test]
    fn lying_tar_sizes_list_the_entry_and_read_eio() {
        let mut t = tar(&[("f", b"0123456789".to_vec())]);
        // Claim 1 GiB of data in the header (octal, checksum fixed up).
        let size = format!("{:011o}\0", 1u64 << 30);
        t[124..136].copy_from_slice(size.as_bytes());
        let sum: u32 = t[..512]
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(b)
                }
            })
            .sum();
        t[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let (a, entries) = open(gzip(&t));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].size, 1 << 30);
        let io = Io::new(1 << 20);
        assert_eq!(read(&a, &io, &entries[0], 0, 10).unwrap(), b"0123456789");
        assert_eq!(
            read(&a, &io, &entries[0], 5000, 10).unwrap_err().errno(),
            libc::EIO
        );
    }

    #[test]
    fn a_segment_larger_than_a_whole_read_goes_block_by_block() {
        // One member of 20 MiB whose points are dropped: one segment, read through
        // parked decoders in 256 KiB blocks, memory bounded by the blocks.
        let big = text(20 << 20, 4);
        let (a, entries) = open(gzip(&tar(&[("big", big.clone())])));
        let mut idx = package_of(&a).idx.clone();
        let total = idx.total;
        idx.points.truncate(1);
        idx.points[0].len = total;
        let mut crc = crc32fast::Hasher::new();
        let t = tar(&[("big", big.clone())]);
        crc.update(&t[..total as usize]);
        idx.points[0].crc = crc.finalize();
        let blob = a.blob.clone();
        let a = Archive::new(
            blob,
            Box::new(TarGzPackage::new(idx, &entries)),
            IndexOrigin::Pass,
        );
        let io = Io::new(2 << 20);
        let e = &entries[0];
        assert!(read(&a, &io, e, 0, u32::MAX).unwrap() == big);
        for off in [15 << 20, 3 << 20, 19 << 20] {
            let got = read(&a, &io, e, off, 4096).unwrap();
            assert!(got == big[off as usize..off as usize + 4096]);
        }
        assert!(io.cache().bytes() <= 2 << 20);
    }

    #[test]
    fn a_bomb_indexes_in_bounded_memory_and_reads_right() {
        // 1 GiB of zeros in about a megabyte of gzip.
        let len = 1u64 << 30;
        let e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(9));
        let mut t = TarWriter::new(e);
        t.header(&WriteEntry {
            path: b"zeros",
            kind: TarKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            size: len,
            link: b"",
        })
        .unwrap();
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..1024 {
            t.data(&chunk).unwrap();
        }
        t.end_entry().unwrap();
        let gz = t.finish().unwrap().finish().unwrap();
        assert!(gz.len() < 2 << 20);
        let (a, entries) = open(gz);
        assert_eq!(entries[0].size, len);
        let io = Io::new(16 << 20);
        let got = read(&a, &io, &entries[0], len - 4096, 4096).unwrap();
        assert!(got.iter().all(|&b| b == 0) && got.len() == 4096);
        assert!(io.cache().bytes() <= 16 << 20);
    }
}
