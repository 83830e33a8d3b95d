//! Zstd streams of independent frames with a seek table (facebook/zstd
//! `contrib/seekable_format`), read frame by frame: the seek table's parser and writer,
//! frame decoding, a reader of the whole stream, and `SeekablePackage` (`format::seekable`), the read path
//! whose unit of caching is a frame. pkgfs packages and seekable tar.zst are such streams;
//! a zstd tarball's frames are read the same way.

use std::cell::RefCell;
use std::io::Read;
use std::sync::Arc;

use super::{EntryKind, Loc, Probe, Reading, SKIPPABLE_HEADER, le32};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::cache::Block;
use crate::io::{BlockKey, ReadData, Span, gather};

/// Magic number at the very end of a seekable zstd file.
pub const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// Skippable-frame magic of the seek table.
pub const SEEK_TABLE_MAGIC: u32 = 0x184D_2A5E;
/// Limits from the seekable format specification.
const MAX_FRAMES: u64 = 0x800_0000;
/// Largest decompressed frame accepted. The specification allows 1 GiB; pkgfs packs at
/// most 64 MiB per frame and refuses more than 256 MiB, so a hostile seek table cannot
/// make one read allocate a gigabyte.
pub const MAX_FRAME_SIZE: u64 = 256 << 20;
/// Magic of an ordinary zstd frame.
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
const FOOTER_LEN: usize = 9;

fn bad(msg: impl Into<String>) -> Error {
    Error::Format(msg.into())
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

/// The read path of a stream of frames: its seek table. The unit of caching is a frame.
#[derive(Debug)]
pub struct FrameReader {
    /// The seek table (with the file bytes of each frame counted).
    pub table: SeekTable,
}

impl FrameReader {
    fn frame(&self, r: &Reading<'_>, fi: usize) -> Result<Arc<Block>> {
        let key = BlockKey {
            archive: r.key,
            unit: fi as u64,
            block: 0,
        };
        r.io.block(key, |_| {
            let frame =
                self.table.frames.get(fi).ok_or_else(|| {
                    Error::Corrupt(format!("frame {fi} is not in the seek table"))
                })?;
            let mut data = Block::empty(frame.dsize as usize);
            decode_frame_into(r.blob, &self.table, fi, &mut data)?;
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

    /// Bytes of the decompressed stream, frame by frame through the cache; concurrent
    /// misses on one frame share one decompression.
    pub fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        let start = Self::start(r)?;
        gather(start + offset, start + end, span, |pos| {
            let fi = self.table.frame_at(pos).ok_or_else(|| {
                Error::Corrupt(format!("offset {pos} is past the end of the stream"))
            })?;
            Ok((self.table.frames[fi].doff, self.frame(r, fi)?))
        })
    }

    /// The frames holding the file.
    pub fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
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
    pub fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
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
                archive: r.key,
                unit: f as u64,
                block: 0,
            };
            r.io.cache().delivered_bytes(&key, given, u64::from(of));
            f += 1;
        }
    }
}
