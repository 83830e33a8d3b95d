//! Seekable-zstd package archives: the seek table, the pkgfs index frame, and opening.
//!
//! A seekable zstd file (facebook/zstd `contrib/seekable_format`) is a run of independent
//! zstd frames followed by a skippable frame holding a *seek table* (each frame's
//! compressed and decompressed size) that ends with a 9-byte footer and the magic number
//! `0x8F92EAB1`. Any frame can be decoded alone, so a byte range of the decompressed
//! stream costs only the frames that cover it.
//!
//! pkgfs packages (`pkgfs pack`, docs/FORMAT.md) are a POSIX tar stream stored this way,
//! with one more skippable frame between the last data frame and the seek table: the
//! *pkgfs index*, which lists every entry with its metadata and the offset of its data in
//! the decompressed tar stream. Mounting reads the seek table and the index from the end
//! of the file and nothing else.
//!
//! Seekable tar.zst files written by other tools have no pkgfs index. They are indexed
//! once by scanning their tar headers (which decompresses the stream once), and the
//! result is kept in an index cache (see [`IndexCache`]) so later mounts cost the same as
//! for a packed archive.

use std::cell::RefCell;
use std::io::Read;
use std::sync::Arc;

use super::{
    Archive, Entry, EntryKind, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe,
    Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::cache::Block;
use crate::io::{BlockKey, ReadData, Span, gather};

/// Magic number at the very end of a seekable zstd file.
pub const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// Skippable-frame magic of the seek table.
pub const SEEK_TABLE_MAGIC: u32 = 0x184D_2A5E;
/// Skippable-frame magic of the pkgfs index (any of 0x184D2A50..5F is skippable).
pub const INDEX_FRAME_MAGIC: u32 = 0x184D_2A5B;
/// First bytes of the pkgfs index payload.
pub const INDEX_MAGIC: &[u8; 8] = b"PKGFSIDX";
/// Version of the index encoding: 1, or 2 when some entry is a device, FIFO or socket,
/// or has extended attributes (docs/FORMAT.md).
pub const INDEX_VERSION: u32 = 2;
/// Limits from the seekable format specification.
const MAX_FRAMES: u64 = 0x800_0000;
/// Largest decompressed frame accepted. The specification allows 1 GiB; pkgfs packs at
/// most 64 MiB per frame and refuses more than 256 MiB, so a hostile seek table cannot
/// make one read allocate a gigabyte.
pub const MAX_FRAME_SIZE: u64 = 256 << 20;
/// Largest index accepted, decompressed (about ten million entries).
const MAX_INDEX_SIZE: u64 = 1 << 30;
/// An index body may claim at most this many times its compressed size (real indexes
/// compress 5-20×): a tiny frame cannot claim a huge body.
const MAX_INDEX_RATIO: u64 = 256;
/// Magic of an ordinary zstd frame.
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
const FOOTER_LEN: usize = 9;
const SKIPPABLE_HEADER: usize = 8;

fn bad(msg: impl Into<String>) -> Error {
    Error::Format(msg.into())
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One frame of the seek table with its position in both streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Offset of the frame in the file.
    pub coff: u64,
    /// Compressed size.
    pub csize: u32,
    /// Offset of its data in the decompressed stream.
    pub doff: u64,
    /// Decompressed size.
    pub dsize: u32,
}

/// A parsed seek table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeekTable {
    /// The frames in order.
    pub frames: Vec<Frame>,
    /// Total decompressed size.
    pub total: u64,
    /// File offset where the data frames end.
    pub data_end: u64,
    /// File offset where the seek table's skippable frame starts.
    pub table_start: u64,
    /// Bytes of regular files' data in each frame (the rest is tar headers and padding),
    /// once counted ([`SeekTable::count_file_bytes`]; empty before): a frame whose file
    /// bytes the kernel has all been given can leave the block cache.
    pub file_bytes: Vec<u32>,
}

impl SeekTable {
    /// Count the bytes of regular files' data each frame holds, from the archive's
    /// `entries`.
    pub fn count_file_bytes(&mut self, entries: &[super::Entry]) {
        let mut counts = vec![0u32; self.frames.len()];
        for e in entries {
            let (EntryKind::File, Loc::Stream(offset)) = (&e.kind, &e.data) else {
                continue;
            };
            let end = offset.saturating_add(e.size).min(self.total);
            let Some(mut f) = self.frame_at(*offset) else {
                continue;
            };
            while let Some(frame) = self.frames.get(f) {
                if frame.doff >= end {
                    break;
                }
                let from = frame.doff.max(*offset);
                let to = (frame.doff + u64::from(frame.dsize)).min(end);
                counts[f] = counts[f].saturating_add((to - from) as u32);
                f += 1;
            }
        }
        self.file_bytes = counts;
    }

    /// Index of the frame holding decompressed offset `off`.
    pub fn frame_at(&self, off: u64) -> Option<usize> {
        if off >= self.total {
            return None;
        }
        Some(
            self.frames
                .partition_point(|f| f.doff + u64::from(f.dsize) <= off),
        )
    }
}

/// What the end of a file says about a seek table.
#[derive(Debug, PartialEq, Eq)]
pub enum TableProbe {
    /// No seekable footer: not a seekable zstd file.
    Absent,
    /// A footer whose seek-table frame is `len` bytes: read that much from the end.
    NeedTail(usize),
}

/// Look at the end of a file (`tail`, the last bytes of a file of `file_size` bytes) for
/// a seek table footer and say how many bytes of tail the whole table needs.
pub fn probe(tail: &[u8], file_size: u64) -> Result<TableProbe> {
    if tail.len() < FOOTER_LEN + SKIPPABLE_HEADER || le32(tail, tail.len() - 4) != SEEKABLE_MAGIC {
        return Ok(TableProbe::Absent);
    }
    let footer = &tail[tail.len() - FOOTER_LEN..];
    let n = u64::from(le32(footer, 0));
    let desc = footer[4];
    if desc & 0x7c != 0 {
        return Err(bad("seek table descriptor has reserved bits set"));
    }
    if n > MAX_FRAMES {
        return Err(bad(format!("seek table claims {n} frames")));
    }
    let entry = if desc & 0x80 != 0 { 12 } else { 8 };
    let len = n * entry + (FOOTER_LEN + SKIPPABLE_HEADER) as u64;
    if len > file_size {
        return Err(bad(format!(
            "seek table of {len} bytes is larger than the file ({file_size} bytes)"
        )));
    }
    Ok(TableProbe::NeedTail(len as usize))
}

/// Parse a complete seek-table frame, the last `frame.len()` bytes of a file of
/// `file_size` bytes.
pub fn parse_seek_table(frame: &[u8], file_size: u64) -> Result<SeekTable> {
    if frame.len() < SKIPPABLE_HEADER + FOOTER_LEN {
        return Err(bad("seek table truncated"));
    }
    if le32(frame, 0) != SEEK_TABLE_MAGIC {
        return Err(bad("seek table frame has the wrong magic number"));
    }
    if le32(frame, 4) as usize != frame.len() - SKIPPABLE_HEADER {
        return Err(bad("seek table frame size disagrees with its footer"));
    }
    let footer = &frame[frame.len() - FOOTER_LEN..];
    let n = le32(footer, 0) as usize;
    let entry = if footer[4] & 0x80 != 0 { 12 } else { 8 };
    let body = &frame[SKIPPABLE_HEADER..frame.len() - FOOTER_LEN];
    if body.len() != n * entry {
        return Err(bad("seek table length disagrees with its frame count"));
    }
    let mut frames = Vec::with_capacity(n);
    let (mut coff, mut doff) = (0u64, 0u64);
    for e in body.chunks_exact(entry) {
        let (csize, dsize) = (le32(e, 0), le32(e, 4));
        if u64::from(dsize) > MAX_FRAME_SIZE {
            return Err(bad(format!("a frame claims {dsize} decompressed bytes")));
        }
        frames.push(Frame {
            coff,
            csize,
            doff,
            dsize,
        });
        coff += u64::from(csize);
        doff += u64::from(dsize);
    }
    let table_start = file_size - frame.len() as u64;
    if coff > table_start {
        return Err(bad(format!(
            "seek table lists {coff} bytes of frames but the file has {table_start} before the table"
        )));
    }
    Ok(SeekTable {
        frames,
        total: doff,
        data_end: coff,
        table_start,
        file_bytes: Vec::new(),
    })
}

/// Encode a seek table frame (no checksums) for frames of the given sizes.
pub fn encode_seek_table(sizes: &[(u32, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(sizes.len() * 8 + SKIPPABLE_HEADER + FOOTER_LEN);
    out.extend_from_slice(&SEEK_TABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&((sizes.len() * 8 + FOOTER_LEN) as u32).to_le_bytes());
    for (c, d) in sizes {
        out.extend_from_slice(&c.to_le_bytes());
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
    out
}

/// Kinds in the index encoding (5 and up: version 2 only).
fn kind_code(k: EntryKind) -> u8 {
    match k {
        EntryKind::File => 0,
        EntryKind::Dir => 1,
        EntryKind::Symlink => 2,
        EntryKind::HardLink => 3,
        EntryKind::Special => 4,
        EntryKind::CharDev => 5,
        EntryKind::BlockDev => 6,
        EntryKind::Fifo => 7,
        EntryKind::Socket => 8,
    }
}

/// Whether an entry needs index version 2.
fn needs_v2(e: &Entry) -> bool {
    kind_code(e.kind) >= 5 || e.rdev != 0 || !e.xattrs.is_empty()
}

/// Encode a pkgfs index frame for `entries` (their `data` must be `Seekable` or `None`,
/// symlink and hard-link targets in `link`).
pub fn encode_index(entries: &[Entry], level: i32) -> std::io::Result<Vec<u8>> {
    // Version 1 whenever it can say everything: packages stay readable by older readers
    // (and byte for byte what they were).
    let version = if entries.iter().any(needs_v2) {
        2u32
    } else {
        1
    };
    let mut body = Vec::with_capacity(entries.len() * 64);
    body.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        body.push(kind_code(e.kind));
        body.extend_from_slice(&u32::from(e.perm).to_le_bytes());
        body.extend_from_slice(&e.uid.unwrap_or(0).to_le_bytes());
        body.extend_from_slice(&e.gid.unwrap_or(0).to_le_bytes());
        body.extend_from_slice(&e.mtime.to_le_bytes());
        body.extend_from_slice(&e.size.to_le_bytes());
        let off = match e.data {
            Loc::Stream(offset) => offset,
            _ => 0,
        };
        body.extend_from_slice(&off.to_le_bytes());
        body.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.path);
        body.extend_from_slice(&(e.link.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.link);
        if version >= 2 {
            body.extend_from_slice(&e.rdev.to_le_bytes());
            body.extend_from_slice(&(e.xattrs.len() as u32).to_le_bytes());
            for (name, value) in &e.xattrs {
                body.extend_from_slice(&(name.len() as u32).to_le_bytes());
                body.extend_from_slice(name);
                body.extend_from_slice(&(value.len() as u32).to_le_bytes());
                body.extend_from_slice(value);
            }
        }
    }
    let compressed = zstd::bulk::compress(&body, level)?;
    let mut payload = Vec::with_capacity(compressed.len() + 28);
    payload.extend_from_slice(INDEX_MAGIC);
    payload.extend_from_slice(&version.to_le_bytes());
    payload.extend_from_slice(&(body.len() as u64).to_le_bytes());
    payload.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    payload.extend_from_slice(&compressed);
    let mut frame = Vec::with_capacity(payload.len() + SKIPPABLE_HEADER);
    frame.extend_from_slice(&INDEX_FRAME_MAGIC.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// A little-endian cursor that fails instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(bad("index entry truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut x = [0u8; 8];
        x.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(x))
    }
}

/// Decode a pkgfs index frame (skippable header included). Every data range is checked
/// against `stream_size`, the decompressed size of the tar stream.
pub fn decode_index(frame: &[u8], stream_size: u64) -> Result<Vec<Entry>> {
    if frame.len() < SKIPPABLE_HEADER + 24 || le32(frame, 0) != INDEX_FRAME_MAGIC {
        return Err(bad("not a pkgfs index frame"));
    }
    if le32(frame, 4) as usize != frame.len() - SKIPPABLE_HEADER {
        return Err(bad("index frame size is wrong"));
    }
    let p = &frame[SKIPPABLE_HEADER..];
    if &p[0..8] != INDEX_MAGIC {
        return Err(bad("index frame lacks the pkgfs magic"));
    }
    let version = le32(p, 8);
    if !(1..=INDEX_VERSION).contains(&version) {
        return Err(Error::Unsupported(format!("pkgfs index version {version}")));
    }
    let mut c = Cursor(&p[12..]);
    let body_len = c.u64()?;
    let crc = c.u32()?;
    let ratio_cap = (c.0.len() as u64).saturating_mul(MAX_INDEX_RATIO) + (1 << 20);
    if body_len > MAX_INDEX_SIZE || body_len > ratio_cap {
        return Err(bad(format!(
            "index claims {body_len} bytes from {} compressed",
            c.0.len()
        )));
    }
    // Stream into a growing buffer: memory follows what really decompresses, never the
    // claimed size, and stops one byte past it.
    let mut body = Vec::new();
    zstd::stream::read::Decoder::new(c.0)
        .and_then(|d| d.take(body_len + 1).read_to_end(&mut body))
        .map_err(|e| Error::Corrupt(format!("index does not decompress: {e}")))?;
    if body.len() as u64 != body_len || crc32fast::hash(&body) != crc {
        return Err(Error::Corrupt("index checksum mismatch".into()));
    }
    let mut c = Cursor(&body);
    let n = c.u64()?;
    // Each entry takes at least 45 bytes: a count beyond that is a lie.
    if n > body.len() as u64 / 45 {
        return Err(bad(format!("index claims {n} entries")));
    }
    let mut entries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let kind = match c.u8()? {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            3 => EntryKind::HardLink,
            4 => EntryKind::Special,
            5 if version >= 2 => EntryKind::CharDev,
            6 if version >= 2 => EntryKind::BlockDev,
            7 if version >= 2 => EntryKind::Fifo,
            8 if version >= 2 => EntryKind::Socket,
            k => return Err(bad(format!("unknown entry kind {k}"))),
        };
        let perm = (c.u32()? & 0o7777) as u16;
        let uid = c.u32()?;
        let gid = c.u32()?;
        let mtime = c.u64()? as i64;
        let size = c.u64()?;
        let offset = c.u64()?;
        let plen = c.u32()? as usize;
        let path = c.take(plen)?.to_vec();
        let llen = c.u32()? as usize;
        let link = c.take(llen)?.to_vec();
        let (rdev, xattrs) = if version >= 2 {
            let rdev = c.u64()?;
            let n = c.u32()? as usize;
            if n > super::tar::MAX_XATTRS {
                return Err(bad(format!("{n} extended attributes")));
            }
            let mut xattrs = Vec::with_capacity(n);
            for _ in 0..n {
                let len = c.u32()? as usize;
                let name = c.take(len)?.to_vec();
                let len = c.u32()? as usize;
                xattrs.push((name, c.take(len)?.to_vec()));
            }
            (rdev, xattrs)
        } else {
            (0, Vec::new())
        };
        let data = match kind {
            EntryKind::File => {
                if offset.checked_add(size).is_none_or(|end| end > stream_size) {
                    return Err(bad(format!(
                        "entry {:?} points outside the stream",
                        String::from_utf8_lossy(&path)
                    )));
                }
                Loc::Stream(offset)
            }
            _ => Loc::None,
        };
        entries.push(Entry {
            path,
            kind,
            perm,
            mtime,
            uid: Some(uid),
            gid: Some(gid),
            size: match kind {
                EntryKind::File => size,
                EntryKind::Symlink => link.len() as u64,
                _ => 0,
            },
            data,
            link,
            rdev,
            xattrs,
        });
    }
    Ok(entries)
}

/// Read the seek table of `blob` given its probe; `Ok(None)` if it is not seekable zstd.
pub fn read_table(blob: &dyn Blob, probe: &Probe) -> Result<Option<SeekTable>> {
    let (size, tail) = (probe.size, &probe.tail);
    let len = match self::probe(tail, size)? {
        TableProbe::Absent => return Ok(None),
        TableProbe::NeedTail(len) => len,
    };
    let table = if len <= tail.len() {
        parse_seek_table(&tail[tail.len() - len..], size)?
    } else {
        let mut buf = vec![0u8; len];
        blob.read_exact_at(&mut buf, size - len as u64)?;
        parse_seek_table(&buf, size)?
    };
    Ok(Some(table))
}

/// Whether `head` (the first bytes of a file) is an ordinary zstd frame.
pub fn is_plain_zstd(head: &[u8]) -> bool {
    head.len() >= 4 && le32(head, 0) == ZSTD_MAGIC
}

/// Read the pkgfs index between the last data frame and the seek table, if present.
pub fn read_embedded_index(
    blob: &dyn Blob,
    table: &SeekTable,
    probe: &Probe,
) -> Result<Option<Vec<Entry>>> {
    let gap = table.table_start - table.data_end;
    if gap == 0 {
        return Ok(None);
    }
    if gap > MAX_INDEX_SIZE {
        return Err(bad(format!(
            "{gap} bytes between the frames and the seek table"
        )));
    }
    let tail_start = probe.tail_start();
    let frame = if table.data_end >= tail_start {
        let at = (table.data_end - tail_start) as usize;
        probe.tail[at..at + gap as usize].to_vec()
    } else {
        let mut buf = vec![0u8; gap as usize];
        blob.read_exact_at(&mut buf, table.data_end)?;
        buf
    };
    decode_index(&frame, table.total).map(Some)
}

/// Decode frame `i` of `table` from `blob`: the unit of caching for these archives.
pub fn decode_frame(blob: &dyn Blob, table: &SeekTable, i: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    decode_frame_into(blob, table, i, &mut out)?;
    Ok(out)
}

thread_local! {
    /// Each thread's decoder context and buffer of compressed bytes, reused from frame to
    /// frame (a context costs an allocation of ~100 KiB and its initialisation).
    static DECODER: RefCell<(Option<zstd::bulk::Decompressor<'static>>, Vec<u8>)> =
        const { RefCell::new((None, Vec::new())) };
}

/// [`decode_frame`] into `out` (emptied first; nothing is zeroed when it already has
/// room for the frame).
pub fn decode_frame_into(
    blob: &dyn Blob,
    table: &SeekTable,
    i: usize,
    out: &mut Vec<u8>,
) -> Result<()> {
    let f = table
        .frames
        .get(i)
        .ok_or_else(|| bad(format!("frame {i} is not in the seek table")))?;
    out.clear();
    out.reserve_exact(f.dsize as usize);
    DECODER.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (dctx, src) = &mut *guard;
        src.resize(f.csize as usize, 0);
        blob.read_exact_at(src, f.coff)?;
        let dctx = match dctx {
            Some(d) => d,
            None => dctx.insert(zstd::bulk::Decompressor::new()?),
        };
        // The decoder writes into the spare capacity (no zeroing) and sets the length; a
        // frame that holds more than the capacity fails here, one that holds more than
        // the seek table says below.
        let n = dctx
            .decompress_to_buffer(src.as_slice(), out)
            .map_err(|e| Error::Corrupt(format!("frame {i} does not decompress: {e}")))?;
        if n != f.dsize as usize {
            return Err(Error::Corrupt(format!(
                "frame {i} holds {n} bytes, the seek table says {}",
                f.dsize
            )));
        }
        Ok(())
    })
}

/// A reader of the whole decompressed stream, frame by frame (for scanning tar headers
/// of archives without a pkgfs index, and for `pkgfs check`).
pub struct StreamReader<'a> {
    blob: &'a dyn Blob,
    table: &'a SeekTable,
    next: usize,
    buf: Vec<u8>,
    pos: usize,
}

impl<'a> StreamReader<'a> {
    /// Read the stream of `table` in `blob` from the start.
    pub fn new(blob: &'a dyn Blob, table: &'a SeekTable) -> Self {
        StreamReader {
            blob,
            table,
            next: 0,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for StreamReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.next == self.table.frames.len() {
                return Ok(0);
            }
            self.buf =
                decode_frame(self.blob, self.table, self.next).map_err(std::io::Error::other)?;
            self.pos = 0;
            self.next += 1;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The seekable-zstd format: pkgfs packages, and seekable tar.zst written by other tools
/// (t2sz, pyzstd, zeekstd), whose index is made once by scanning their tar headers and
/// kept in the index cache.
pub struct SeekableZstd;

impl Format for SeekableZstd {
    fn name(&self) -> &'static str {
        "seekable-zstd"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        let Some(mut table) = read_table(&**blob, probe)? else {
            return Ok(None);
        };
        let (entries, origin) = entries_of(&**blob, &table, Some(probe), cx)?;
        table.count_file_bytes(&entries);
        Ok(Some(Opened {
            package: Box::new(SeekablePackage { table }),
            entries,
            origin,
            checked: super::Checked::Nothing,
        }))
    }
}

/// A hash of a seek table, which the index cache's key must match too.
fn table_hash(table: &SeekTable) -> String {
    let mut h = crc32fast::Hasher::new();
    for f in &table.frames {
        h.update(&f.csize.to_le_bytes());
        h.update(&f.dsize.to_le_bytes());
    }
    format!("{:08x}", h.finalize())
}

/// The entries of a seekable archive: its pkgfs index, else a cached index, else a scan
/// of its tar headers (stored in the cache for next time).
fn entries_of(
    blob: &dyn Blob,
    table: &SeekTable,
    probe: Option<&Probe>,
    cx: &OpenContext,
) -> Result<(Vec<Entry>, IndexOrigin)> {
    let read;
    let probe = match probe {
        Some(p) => p,
        None => {
            read = Probe::read(blob)?;
            &read
        }
    };
    if let Some(entries) = read_embedded_index(blob, table, probe)? {
        return Ok((entries, IndexOrigin::Archive));
    }
    let key = cx
        .index_cache
        .map(|c| (c, c.key("seekable-zstd", blob, &table_hash(table))));
    if let Some((c, k)) = &key
        && let Some(entries) = c.load(k).and_then(|b| decode_index(&b, table.total).ok())
    {
        log::debug!(
            "{}: index from cache {}",
            blob.name().display(),
            k.path().display()
        );
        return Ok((entries, IndexOrigin::Cache));
    }
    log::warn!(
        "{}: seekable archive without a pkgfs index: scanning its tar headers (once{})",
        blob.name().display(),
        if key.is_some() {
            "; the index is cached"
        } else {
            "; no index cache"
        }
    );
    let entries = scan(blob, table).map_err(|e| Error::Format(format!("tar stream: {e}")))?;
    for e in &entries {
        if let Loc::Stream(offset) = e.data
            && offset
                .checked_add(e.size)
                .is_none_or(|end| end > table.total)
        {
            return Err(Error::Format(
                "a tar entry runs past the end of the stream".into(),
            ));
        }
    }
    if let Some((c, k)) = &key {
        let stored = encode_index(&entries, 3)
            .map_err(Error::Io)
            .and_then(|b| c.store(k, &b));
        if let Err(e) = stored {
            log::warn!(
                "cannot store the index of {} in {}: {e}",
                blob.name().display(),
                k.path().display()
            );
        }
    }
    Ok((entries, IndexOrigin::Pass))
}

/// The entries of the tar stream of a seekable archive, by decoding it all.
fn scan(blob: &dyn Blob, table: &SeekTable) -> std::result::Result<Vec<Entry>, String> {
    super::tar::scan(StreamReader::new(blob, table))
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|t| t.into_entry(Loc::Stream))
        .collect()
}

/// An open seekable archive: its seek table. The unit of caching is a frame.
#[derive(Debug)]
pub struct SeekablePackage {
    /// The seek table (with the file bytes of each frame counted).
    pub table: SeekTable,
}

impl SeekablePackage {
    fn frame(&self, r: &Reading<'_>, fi: usize) -> Result<Arc<Block>> {
        let key = BlockKey {
            archive: r.archive.key,
            unit: fi as u64,
            block: 0,
        };
        r.io.block(key, |_| {
            let frame =
                self.table.frames.get(fi).ok_or_else(|| {
                    Error::Corrupt(format!("frame {fi} is not in the seek table"))
                })?;
            let mut data = Block::empty(frame.dsize as usize);
            decode_frame_into(&*r.archive.blob, &self.table, fi, &mut data)?;
            let data = Arc::new(Block::new(data));
            r.io.count_read(frame.csize as usize);
            r.io.count_decoded(data.len());
            r.io.cache().insert(key, data.clone());
            Ok(data)
        })
    }

    fn start(r: &Reading<'_>) -> Result<u64> {
        match r.loc {
            Loc::Stream(s) => Ok(*s),
            other => Err(Error::Format(format!(
                "{other:?} is no place in a seekable archive"
            ))),
        }
    }
}

impl Package for SeekablePackage {
    fn format(&self) -> &'static str {
        "seekable-zstd"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        entries_of(&**blob, &self.table, None, cx).map(|(e, _)| e)
    }

    /// Bytes of the decompressed stream, frame by frame through the cache; concurrent
    /// misses on one frame share one decompression.
    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        let start = Self::start(r)?;
        gather(start + offset, start + end, span, |pos| {
            let fi = self.table.frame_at(pos).ok_or_else(|| {
                Error::Corrupt(format!("offset {pos} is past the end of the stream"))
            })?;
            Ok((self.table.frames[fi].doff, self.frame(r, fi)?))
        })
    }

    /// The frames holding the file.
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        let start = Self::start(r).ok()?;
        let t = &self.table;
        let first = t.frames.get(t.frame_at(start)?)?;
        let last_byte = (start + r.size).checked_sub(1)?;
        let last = t.frames.get(t.frame_at(last_byte)?)?;
        Some((first.coff, last.coff + u64::from(last.csize)))
    }

    /// A frame holds several files and their tar headers, which are never delivered, so
    /// its bytes given are counted against the file bytes it holds
    /// ([`SeekTable::file_bytes`]).
    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        let Ok(data) = Self::start(r) else {
            return;
        };
        let t = &self.table;
        let (start, end) = (data + start, data + end);
        let Some(mut f) = t.frame_at(start) else {
            return;
        };
        while let (Some(frame), Some(&of)) = (t.frames.get(f), t.file_bytes.get(f)) {
            if frame.doff >= end {
                break;
            }
            let given = (frame.doff + u64::from(frame.dsize)).min(end) - frame.doff.max(start);
            let key = BlockKey {
                archive: r.archive.key,
                unit: f as u64,
                block: 0,
            };
            r.io.cache().delivered_bytes(&key, given, u64::from(of));
            f += 1;
        }
    }

    /// Decode every frame (verifying the zstd checksums), scan the tar stream, and
    /// compare it with the index the mount uses.
    fn verify(&self, archive: &Archive, cx: &OpenContext) -> Result<Vec<String>> {
        let index = self.entries(&archive.blob, cx)?;
        let scanned = scan(&*archive.blob, &self.table).map_err(Error::Corrupt)?;
        Ok(compare(&index, &scanned))
    }
}

/// The differences between an index and the entries of the tar stream it describes.
pub fn compare(index: &[Entry], scanned: &[Entry]) -> Vec<String> {
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
    for (i, s) in index.iter().zip(scanned) {
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
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind, size: u64, offset: u64) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            perm: 0o640,
            mtime: -5,
            uid: Some(1000),
            gid: Some(7),
            size,
            data: if kind == EntryKind::File {
                Loc::Stream(offset)
            } else {
                Loc::None
            },
            link: if kind == EntryKind::Symlink {
                b"target".to_vec()
            } else {
                Vec::new()
            },
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn seek_table_round_trip_and_lookup() {
        let t = encode_seek_table(&[(10, 100), (20, 50), (5, 1)]);
        let size = 35 + t.len() as u64;
        assert_eq!(probe(&t, size).unwrap(), TableProbe::NeedTail(t.len()));
        let s = parse_seek_table(&t, size).unwrap();
        assert_eq!(s.total, 151);
        assert_eq!(s.data_end, 35);
        assert_eq!(
            s.frames[1],
            Frame {
                coff: 10,
                csize: 20,
                doff: 100,
                dsize: 50
            }
        );
        assert_eq!(s.frame_at(0), Some(0));
        assert_eq!(s.frame_at(99), Some(0));
        assert_eq!(s.frame_at(100), Some(1));
        assert_eq!(s.frame_at(150), Some(2));
        assert_eq!(s.frame_at(151), None);
        // A table that claims more frame bytes than the file holds is refused.
        assert!(parse_seek_table(&t, 20 + t.len() as u64).is_err());
    }

    #[test]
    fn damaged_seek_tables_are_errors() {
        let t = encode_seek_table(&[(10, 100)]);
        let size = 10 + t.len() as u64;
        for cut in 0..t.len() {
            // Truncations either lose the footer (absent) or fail; never panic.
            let _ = probe(&t[cut..], size);
            let _ = parse_seek_table(&t[cut..], size);
        }
        let mut lying = t.clone();
        let n = lying.len();
        lying[n - 9..n - 5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(probe(&lying, size).is_err());
        assert_eq!(
            probe(b"not a seekable file", 100).unwrap(),
            TableProbe::Absent
        );
    }

    #[test]
    fn index_round_trip_and_bounds() {
        let entries = vec![
            entry("dir", EntryKind::Dir, 0, 0),
            entry("dir/f", EntryKind::File, 10, 512),
            entry("dir/l", EntryKind::Symlink, 6, 0),
        ];
        let frame = encode_index(&entries, 3).unwrap();
        assert_eq!(decode_index(&frame, 522).unwrap(), entries);
        let e = decode_index(&frame, 521).unwrap_err();
        assert!(e.to_string().contains("outside the stream"), "{e}");
        let mut bad_crc = frame.clone();
        let at = SKIPPABLE_HEADER + 20;
        bad_crc[at] ^= 1;
        assert!(decode_index(&bad_crc, 522).is_err());
        for cut in 0..frame.len() {
            assert!(decode_index(&frame[..cut], 522).is_err());
        }
    }

    #[test]
    fn version_2_carries_devices_and_extended_attributes_and_version_1_stays_as_it_was() {
        let plain = vec![entry("f", EntryKind::File, 10, 0)];
        let v1 = encode_index(&plain, 3).unwrap();
        assert_eq!(
            le32(&v1, SKIPPABLE_HEADER + 8),
            1,
            "nothing needs version 2"
        );
        let mut dev = entry("null", EntryKind::CharDev, 0, 0);
        dev.rdev = libc::makedev(1, 3);
        let mut f = entry("cap", EntryKind::File, 10, 0);
        f.xattrs = vec![
            (b"security.capability".to_vec(), vec![1, 0, 0, 2, 0, 32]),
            (b"user.x".to_vec(), b"with = and \n\0 inside".to_vec()),
        ];
        let all = vec![dev, f, entry("pipe", EntryKind::Fifo, 0, 0)];
        let v2 = encode_index(&all, 3).unwrap();
        assert_eq!(le32(&v2, SKIPPABLE_HEADER + 8), 2);
        assert_eq!(decode_index(&v2, 100).unwrap(), all);
        for cut in 0..v2.len() {
            assert!(decode_index(&v2[..cut], 100).is_err());
        }
    }

    #[test]
    fn fuzz_regressions_fail_cleanly() {
        // Found by `cargo fuzz run seekable_index`: an index frame claiming a 2 GiB body
        // made the decoder allocate it up front.
        let oom = include_bytes!("../../fuzz/regressions/seekable_index_oom.bin");
        assert!(decode_index(oom, 1 << 30).is_err());
    }
}
