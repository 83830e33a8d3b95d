//! ZIP archives (also .jar, .whl, .apk…): the index ([`index`]) and the read path.
//!
//! - **Stored** members are served by positional reads straight from the archive: no
//!   copy into the cache, and the kernel's page cache of the archive does the rest. A
//!   stored member up to [`VERIFY_MAX`] bytes is read whole once, the first time, to
//!   check its CRC; later reads go straight to the file.
//! - **Compressed** members (deflate, zstd) are decoded in blocks of
//!   [`BLOCK_SIZE`] decompressed bytes, kept in the shared block cache. Decoding a
//!   member is a stream, so a decoder that has produced block *k* is parked in the
//!   member's fill slot and resumed for block *k+1*: a sequential read never restarts
//!   from the member's start. Fills are serialised per member, so concurrent misses on
//!   one block share one decompression. A deflate member that fits in one block (most
//!   files of a package) is decoded in one call by libdeflate instead, 1.6–1.7× faster
//!   than streaming through zlib (docs/BENCHMARKS.md); only larger members need a stream
//!   that can park and resume.
//! - **Checkpoints** bound random access into large deflate members: every
//!   [`CHECKPOINT_EVERY`] bytes of output a copy of the decoder is kept, and a miss
//!   resumes the nearest one at or before it.
//! - Every compressed byte read is bounded by the member's compressed size, every output
//!   buffer by the block size, and the output length is checked against the declared size
//!   (a stream that says more or less than the directory is corrupt): a lying header
//!   cannot make pkgfs allocate more than one block. The CRC is checked when a stream
//!   reaches its end; the block that completes it is only served if it matches.
//!
//! A member is a [`Loc::Record`]: its central-directory record, with what the read path
//! learns of it lazily (where its data starts, from its local header; whether its CRC was
//! checked), kept with the archive so it outlives generations of a live mount.

pub mod index;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use self::index::{IndexError, LFH_LEN, ZipData};
use super::{Entry, Format, Loc, OpenContext, Opened, Package, Probe, Reading};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::cache::Block;
use crate::io::inflate::{Checkpoint, Inflater, OneShot};
use crate::io::{BLOCK_SIZE, BlockKey, Io, ReadData, Span, gather};

/// Stored (no compression).
pub const METHOD_STORED: u16 = 0;
/// Deflate.
pub const METHOD_DEFLATE: u16 = 8;
/// Zstandard (APPNOTE 4.4.5, method 93).
pub const METHOD_ZSTD: u16 = 93;

/// Stored members up to this size are CRC-checked on first read.
pub const VERIFY_MAX: u64 = 1024 * 1024;
/// Compressed input is read in chunks of this size.
const INPUT_CHUNK: usize = 128 * 1024;
/// A deflate member keeps a checkpoint of its decoder every this many decompressed bytes
/// (a multiple of [`BLOCK_SIZE`]), so a random read decodes at most this much.
pub const CHECKPOINT_EVERY: u64 = 16 * BLOCK_SIZE;
/// Bytes of local extra field assumed for a member whose local header has not been
/// read: `zip` writes 28 (timestamps and owner), most writers none or fewer.
const LOCAL_EXTRA_GUESS: u64 = 64;

/// The ZIP format.
pub struct Zip;

impl Format for Zip {
    fn name(&self) -> &'static str {
        "zip"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        _cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        match index::read_index_from(&**blob, probe.size, probe.tail.clone()) {
            Ok(idx) => Ok(Some(Opened {
                package: Box::new(ZipPackage::new(idx.records)),
                entries: idx.entries,
                origin: super::IndexOrigin::Archive,
                checked: super::Checked::Nothing,
            })),
            Err(IndexError::NotZip) => Ok(None),
            Err(IndexError::Bad(e)) => Err(e),
        }
    }
}

/// A member's record and what is learnt of it.
#[derive(Debug)]
struct Record {
    zip: ZipData,
    /// Where the member's data starts (0: not read yet).
    data_start: AtomicU64,
    /// Its CRC has been checked (stored members).
    verified: AtomicBool,
}

/// An open ZIP archive: the records of its members.
#[derive(Debug)]
pub struct ZipPackage {
    records: Vec<Record>,
}

impl ZipPackage {
    fn new(records: Vec<ZipData>) -> Self {
        ZipPackage {
            records: records
                .into_iter()
                .map(|zip| Record {
                    zip,
                    data_start: AtomicU64::new(0),
                    verified: AtomicBool::new(false),
                })
                .collect(),
        }
    }

    /// The stored external attributes of the member at `loc`.
    pub fn external_attributes(&self, loc: &Loc) -> Option<u32> {
        let Loc::Record(n) = loc else { return None };
        self.records.get(*n as usize).map(|r| r.zip.external)
    }

    fn member<'a>(&'a self, r: &'a Reading<'a>) -> Result<Member<'a>> {
        let Loc::Record(n) = r.loc else {
            return Err(Error::Format(format!("{:?} is no ZIP member", r.loc)));
        };
        let rec = self
            .records
            .get(*n as usize)
            .ok_or_else(|| Error::Format(format!("no ZIP record {n}")))?;
        Ok(Member {
            io: r.io,
            blob: r.blob,
            archive: r.key,
            n: *n,
            rec,
            zip: rec.zip,
            size: r.size,
        })
    }
}

impl Package for ZipPackage {
    fn format(&self) -> &'static str {
        "zip"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, _cx: &OpenContext) -> Result<Vec<Entry>> {
        match index::read_index(&**blob) {
            Ok(idx) if idx.records.len() == self.records.len() => Ok(idx.entries),
            Ok(_) => Err(Error::Corrupt("the central directory changed".into())),
            Err(IndexError::NotZip) => {
                Err(Error::Corrupt("the archive is no longer a ZIP file".into()))
            }
            Err(IndexError::Bad(e)) => Err(e),
        }
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        let m = self.member(r)?;
        if m.zip.encrypted {
            return Err(Error::Unsupported("encrypted member".into()));
        }
        match m.zip.method {
            METHOD_STORED => read_stored(&m, offset, end).map(|v| ReadData::Owned(Block::new(v))),
            METHOD_DEFLATE | METHOD_ZSTD => gather(offset, end, span, |pos| {
                let bi = pos / BLOCK_SIZE;
                Ok((bi * BLOCK_SIZE, block(&m, bi)?))
            }),
            other => Err(Error::Unsupported(format!(
                "compression method {other} ({})",
                method_name(other)
            ))),
        }
    }

    /// From the local header to the end of the data; before the local header has been
    /// read, its extra field is guessed at `LOCAL_EXTRA_GUESS` bytes.
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        let m = self.member(r).ok()?;
        let z = m.zip;
        let known = m.rec.data_start.load(Ordering::Relaxed);
        let data = if known != 0 {
            known
        } else {
            z.header_offset + LFH_LEN as u64 + u64::from(z.name_len) + LOCAL_EXTRA_GUESS
        };
        Some((z.header_offset, data.saturating_add(z.compressed_size)))
    }

    /// Page by page per block (stored members are not cached).
    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        let Ok(m) = self.member(r) else {
            return;
        };
        let mut at = start;
        while at < end {
            let block = at / BLOCK_SIZE;
            let base = block * BLOCK_SIZE;
            let next = (base + BLOCK_SIZE).min(end);
            r.io.cache()
                .delivered(&m.key(block), (at - base) as usize, (next - base) as usize);
            at = next;
        }
    }

    fn crc32(&self, loc: &Loc) -> Option<u32> {
        match loc {
            Loc::Record(n) => self.records.get(*n as usize).map(|r| r.zip.crc32),
            _ => None,
        }
    }
}

/// A member as the read path sees it.
struct Member<'a> {
    io: &'a Io,
    blob: &'a dyn Blob,
    archive: u32,
    n: u32,
    rec: &'a Record,
    zip: ZipData,
    size: u64,
}

impl Member<'_> {
    fn key(&self, block: u64) -> BlockKey {
        BlockKey {
            archive: self.archive,
            unit: u64::from(self.n),
            block,
        }
    }

    /// Read `buf.len()` bytes of the archive at `at`, counted.
    fn read_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.blob.read_exact_at(buf, at)?;
        self.io.count_read(buf.len());
        Ok(())
    }
}

/// Where the member's data starts, from its local header (read once, then remembered),
/// checked to lie inside the archive.
fn data_start(m: &Member<'_>) -> Result<u64> {
    let known = m.rec.data_start.load(Ordering::Relaxed);
    if known != 0 {
        return Ok(known);
    }
    let mut lfh = vec![0u8; LFH_LEN + usize::from(m.zip.name_len)];
    m.read_at(&mut lfh, m.zip.header_offset)?;
    learn_data_start(m, &lfh)
}

/// Where the member's data starts, given its local header and name (`lfh`), checked and
/// remembered.
fn learn_data_start(m: &Member<'_>, lfh: &[u8]) -> Result<u64> {
    let start =
        m.zip.header_offset + index::local_data_offset(lfh, m.zip.name_len, m.zip.name_crc)?;
    if start
        .checked_add(m.zip.compressed_size)
        .is_none_or(|e| e > m.blob.size())
    {
        return Err(Error::Format(format!(
            "member data ({} bytes at {start}) runs past the end of the archive ({} bytes)",
            m.zip.compressed_size,
            m.blob.size()
        )));
    }
    m.rec.data_start.store(start, Ordering::Relaxed);
    Ok(start)
}

fn read_stored(m: &Member<'_>, offset: u64, end: u64) -> Result<Vec<u8>> {
    if m.zip.compressed_size != m.size {
        return Err(Error::Corrupt(format!(
            "stored member has compressed size {} but size {}",
            m.zip.compressed_size, m.size
        )));
    }
    let start = data_start(m)?;
    if m.size <= VERIFY_MAX && !m.rec.verified.load(Ordering::Relaxed) {
        let mut all = vec![0u8; m.size as usize];
        m.read_at(&mut all, start)?;
        check_crc(crc32fast::hash(&all), m)?;
        m.rec.verified.store(true, Ordering::Relaxed);
        all.truncate(end as usize);
        all.drain(..offset as usize);
        return Ok(all);
    }
    let mut buf = vec![0u8; (end - offset) as usize];
    m.read_at(&mut buf, start + offset)?;
    Ok(buf)
}

/// A deflate member of at most one block, decoded in one call. The same checks as a
/// stream's: the input is the compressed size (at most two blocks, checked by the
/// caller), the output is bounded by the declared size, the stream must end exactly
/// there, and the CRC must match.
fn inflate_whole(m: &Member<'_>) -> Result<Vec<u8>> {
    thread_local! {
        static DECODER: std::cell::RefCell<(Option<OneShot>, Vec<u8>)> =
            const { std::cell::RefCell::new((None, Vec::new())) };
    }
    let (csize, size) = (m.zip.compressed_size as usize, m.size);
    let known = m.rec.data_start.load(Ordering::Relaxed);
    let mut out = Block::empty(size as usize);
    DECODER.with_borrow_mut(|(decoder, input)| {
        let decoder = match decoder {
            Some(d) => d,
            None => decoder.insert(OneShot::new()?),
        };
        // A member read for the first time: its local header comes in the same read as
        // its data (one read and one check of the file instead of two each), with room
        // for an extra field of up to LOCAL_EXTRA_GUESS bytes.
        let lead = LFH_LEN + usize::from(m.zip.name_len);
        let (from, want) = match known {
            0 => (
                m.zip.header_offset,
                lead + LOCAL_EXTRA_GUESS as usize + csize,
            ),
            at => (at, csize),
        };
        let left = m.blob.size().saturating_sub(from);
        input.resize(want.min(usize::try_from(left).unwrap_or(usize::MAX)), 0);
        m.read_at(input, from)?;
        let skip = match known {
            0 => {
                let head = input.get(..lead).ok_or_else(|| {
                    Error::Format("local header runs past the end of the archive".into())
                })?;
                let skip = (learn_data_start(m, head)? - m.zip.header_offset) as usize;
                let have = input.len();
                if skip + csize > have {
                    // A longer extra field than guessed: read the rest of the data.
                    input.resize(skip + csize, 0);
                    m.read_at(&mut input[have..], from + have as u64)?;
                }
                skip
            }
            _ => 0,
        };
        decoder.decode(&input[skip..skip + csize], &mut out, size as usize)
    })?;
    check_crc(crc32fast::hash(&out), m)?;
    m.io.count_decoded(size as usize);
    Ok(out)
}

/// Decoded block `bi` of the member, from the cache or by decoding.
fn block(m: &Member<'_>, bi: u64) -> Result<Arc<Block>> {
    m.io.block(m.key(bi), |parked| {
        // One call needs the whole input in memory: only for a sane compressed size (a
        // lying directory is left to the stream, which reads in bounded chunks).
        if bi == 0
            && m.zip.method == METHOD_DEFLATE
            && m.size <= BLOCK_SIZE
            && m.zip.compressed_size <= 2 * BLOCK_SIZE
        {
            let data = Arc::new(Block::new(inflate_whole(m)?));
            m.io.cache().insert(m.key(0), data.clone());
            return Ok(data);
        }
        let target = bi * BLOCK_SIZE;
        let mut parked_stream = parked
            .take()
            .and_then(|b: Box<dyn Any + Send>| b.downcast::<Stream>().ok());
        let parked_at = parked_stream
            .as_ref()
            .map(|s| s.out_pos)
            .filter(|&p| p <= target);
        let resumed = match parked_at {
            Some(p) if target - p < CHECKPOINT_EVERY => None,
            _ => resume_checkpoint(m, target, parked_at)?,
        };
        let mut stream = match (resumed, parked_stream.take()) {
            (Some(s), _) => s,
            (None, Some(s)) if s.out_pos <= target => *s,
            _ => {
                m.io.stats.streams_started.fetch_add(1, Ordering::Relaxed);
                Stream::new(m.zip.method, data_start(m)?)?
            }
        };
        loop {
            let at = stream.out_pos / BLOCK_SIZE;
            let data = stream.next_block(m)?;
            m.io.count_decoded(data.len());
            let data = Arc::new(Block::new(data));
            m.io.cache().insert(m.key(at), data.clone());
            if stream.out_pos % CHECKPOINT_EVERY == 0 && stream.out_pos < m.size {
                let pos = stream.out_pos;
                m.io.save_checkpoint((m.archive, u64::from(m.n)), pos, || stream.checkpoint());
            }
            if at == bi {
                if stream.out_pos < m.size {
                    *parked = Some(Box::new(stream));
                }
                return Ok(data);
            }
        }
    })
}

/// A decoder for the member resumed from its last checkpoint at or before `target`, if
/// there is one past `better_than` (the parked decoder's position).
fn resume_checkpoint(
    m: &Member<'_>,
    target: u64,
    better_than: Option<u64>,
) -> Result<Option<Stream>> {
    if m.zip.method != METHOD_DEFLATE || m.size <= CHECKPOINT_EVERY {
        return Ok(None);
    }
    let start = data_start(m)?;
    let cp =
        m.io.resume_checkpoint((m.archive, u64::from(m.n)), target, better_than)?;
    Ok(cp.map(|cp| Stream::resume(cp, start)))
}

fn check_crc(actual: u32, m: &Member<'_>) -> Result<()> {
    if actual != m.zip.crc32 {
        return Err(Error::Corrupt(format!(
            "CRC-32 mismatch: data has {actual:08x}, directory says {:08x}",
            m.zip.crc32
        )));
    }
    Ok(())
}

/// A human name for a ZIP compression method, for error messages.
pub fn method_name(method: u16) -> &'static str {
    match method {
        0 => "stored",
        8 => "deflate",
        9 => "deflate64",
        12 => "bzip2",
        14 => "lzma",
        93 => "zstd",
        95 => "xz",
        98 => "ppmd",
        99 => "AES-encrypted",
        _ => "unknown",
    }
}

enum Codec {
    Deflate(Inflater),
    Zstd(zstd::stream::raw::Decoder<'static>),
}

/// Outcome of one decoder step.
struct Step {
    consumed: usize,
    produced: usize,
    ended: bool,
}

impl Codec {
    fn step(&mut self, input: &[u8], output: &mut [u8], input_done: bool) -> Result<Step> {
        match self {
            Codec::Deflate(d) => {
                let p = d.step(input, output)?;
                Ok(Step {
                    consumed: p.consumed,
                    produced: p.produced,
                    ended: p.ended,
                })
            }
            Codec::Zstd(z) => {
                use zstd::stream::raw::Operation;
                let mut inb = zstd::stream::raw::InBuffer::around(input);
                let mut outb = zstd::stream::raw::OutBuffer::around(output);
                let remaining = z
                    .run(&mut inb, &mut outb)
                    .map_err(|e| Error::Corrupt(format!("bad zstd stream: {e}")))?;
                let consumed = inb.pos();
                Ok(Step {
                    consumed,
                    produced: outb.pos(),
                    ended: remaining == 0 && consumed == input.len() && input_done,
                })
            }
        }
    }
}

/// A member's decoder, positioned after the last block it produced.
struct Stream {
    codec: Codec,
    data_start: u64,
    in_pos: u64,
    input: Vec<u8>,
    in_start: usize,
    out_pos: u64,
    crc: crc32fast::Hasher,
    ended: bool,
}

impl Stream {
    fn new(method: u16, data_start: u64) -> Result<Stream> {
        let codec = match method {
            METHOD_DEFLATE => Codec::Deflate(Inflater::new()?),
            METHOD_ZSTD => Codec::Zstd(
                zstd::stream::raw::Decoder::new()
                    .map_err(|e| Error::Io(std::io::Error::other(e)))?,
            ),
            other => return Err(Error::Unsupported(format!("compression method {other}"))),
        };
        Ok(Stream {
            codec,
            data_start,
            in_pos: 0,
            input: Vec::new(),
            in_start: 0,
            out_pos: 0,
            crc: crc32fast::Hasher::new(),
            ended: false,
        })
    }

    /// Refill the input buffer if it is empty; returns the bytes read.
    fn refill(&mut self, m: &Member<'_>) -> Result<usize> {
        if self.in_start < self.input.len() || self.in_pos >= m.zip.compressed_size {
            return Ok(0);
        }
        let n = (m.zip.compressed_size - self.in_pos).min(INPUT_CHUNK as u64) as usize;
        self.input.resize(n, 0);
        m.read_at(&mut self.input, self.data_start + self.in_pos)?;
        self.in_pos += n as u64;
        self.in_start = 0;
        Ok(n)
    }

    /// A copy of this decoder's position (deflate only): the decoder state, where its
    /// input resumes, its output position and the CRC so far.
    fn checkpoint(&mut self) -> Option<Checkpoint> {
        let Codec::Deflate(d) = &mut self.codec else {
            return None;
        };
        let inflater = d.try_clone().ok()?;
        Some(Checkpoint {
            inflater,
            in_pos: self.in_pos - (self.input.len() - self.in_start) as u64,
            out_pos: self.out_pos,
            crc: self.crc.clone(),
        })
    }

    /// A decoder resumed from (a copy of) a checkpoint.
    fn resume(cp: Checkpoint, data_start: u64) -> Stream {
        Stream {
            codec: Codec::Deflate(cp.inflater),
            data_start,
            in_pos: cp.in_pos,
            input: Vec::new(),
            in_start: 0,
            out_pos: cp.out_pos,
            crc: cp.crc,
            ended: false,
        }
    }

    fn input_done(&self, m: &Member<'_>) -> bool {
        self.in_pos >= m.zip.compressed_size && self.in_start == self.input.len()
    }

    /// Decode the next block.
    fn next_block(&mut self, m: &Member<'_>) -> Result<Vec<u8>> {
        let want = (m.size - self.out_pos).min(BLOCK_SIZE) as usize;
        let mut out = Block::buffer(want);
        let mut produced = 0;
        while produced < want {
            self.refill(m)?;
            let done = self.in_pos >= m.zip.compressed_size;
            let step = self
                .codec
                .step(&self.input[self.in_start..], &mut out[produced..], done)?;
            self.in_start += step.consumed;
            produced += step.produced;
            if step.ended {
                self.ended = true;
                if produced < want {
                    return Err(Error::Corrupt(format!(
                        "stream ends after {} bytes, directory says {}",
                        self.out_pos + produced as u64,
                        m.size
                    )));
                }
            }
            if step.consumed == 0 && step.produced == 0 && !step.ended {
                return Err(Error::Corrupt(if self.input_done(m) {
                    "compressed data ends early (truncated member)".to_string()
                } else {
                    "decoder makes no progress".to_string()
                }));
            }
        }
        self.crc.update(&out);
        self.out_pos += want as u64;
        if self.out_pos == m.size {
            self.finish(m)?;
        }
        Ok(out)
    }

    /// At the declared end: the stream must end here too, and the CRC must match.
    fn finish(&mut self, m: &Member<'_>) -> Result<()> {
        let mut scratch = [0u8; 1];
        while !self.ended {
            self.refill(m)?;
            let done = self.in_pos >= m.zip.compressed_size;
            let step = self
                .codec
                .step(&self.input[self.in_start..], &mut scratch, done)?;
            self.in_start += step.consumed;
            if step.produced > 0 {
                return Err(Error::Corrupt(format!(
                    "stream holds more than the {} bytes the directory says",
                    m.size
                )));
            }
            if step.ended {
                break;
            }
            if step.consumed == 0 {
                return Err(Error::Corrupt(
                    "stream does not end where the directory says".into(),
                ));
            }
        }
        let crc = std::mem::take(&mut self.crc).finalize();
        check_crc(crc, m)
    }
}
