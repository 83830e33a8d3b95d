//! The read path: member bytes from archives, through the block cache.
//!
//! - **Stored** members are served by positional reads straight from the archive file:
//!   no copy into the cache, and the kernel's page cache of the archive does the rest.
//!   A stored member up to [`VERIFY_MAX`] bytes is read whole once, the first time, to
//!   check its CRC; later reads go straight to the file.
//! - **Compressed** members (deflate, zstd) are decoded in blocks of [`BLOCK_SIZE`]
//!   decompressed bytes, kept in the shared byte-budgeted [`BlockCache`]. Decoding a
//!   member is a stream, so a decoder that has produced block *k* is parked and resumed
//!   for block *k+1*: a sequential read never restarts from the member's start. Fills
//!   are serialised per member, so concurrent misses on one block share one decompression.
//!   A deflate member that fits in one block (most files of a package) is decoded in one
//!   call by libdeflate instead, 1.6–1.7× faster than streaming through zlib
//!   (docs/BENCHMARKS.md); only larger members need a stream that can park and resume.
//! - Every compressed byte read is bounded by the member's compressed size, every output
//!   buffer by the block size, and the output length is checked against the declared size
//!   (a stream that says more or less than the directory is corrupt): a lying header
//!   cannot make pkgfs allocate more than one block. The CRC is checked when a stream
//!   reaches its end; the block that completes it is only served if it matches.

pub mod cache;

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lru::LruCache;

use crate::error::{Error, Result};
use crate::format::inflate::{Inflater, OneShot};
use crate::format::seekable::{self, SeekTable};
use crate::format::zip::{self, METHOD_DEFLATE, METHOD_STORED, METHOD_ZSTD};
use crate::format::{Archive, ZipData, read_exact_at};
use crate::read::cache::{Block, BlockCache};
use crate::tree::view::MemberState;
use crate::tree::{Member, MemberData};

/// Decompressed bytes per cache block.
pub const BLOCK_SIZE: u64 = 256 * 1024;
/// Stored members up to this size are CRC-checked on first read.
pub const VERIFY_MAX: u64 = 1024 * 1024;
/// Compressed input is read in chunks of this size.
const INPUT_CHUNK: usize = 128 * 1024;
/// A deflate member keeps a checkpoint of its decoder every this many decompressed bytes
/// (a multiple of [`BLOCK_SIZE`]), so a random read decodes at most this much.
pub const CHECKPOINT_EVERY: u64 = 16 * BLOCK_SIZE;
/// Most checkpoints kept in all (each holds a decoder: its 32 KiB window and state,
/// about 45 KiB); the least recently used member's are dropped first.
const MAX_CHECKPOINTS: usize = 512;
/// How many members or frames may have a fill slot (a ZIP member's holds its parked
/// decoder: a window and an input buffer).
const PARKED_STREAMS: usize = 64;

/// Bytes of local extra field assumed for a ZIP member whose local header has not been
/// read: `zip` writes 28 (timestamps and owner), most writers none or fewer.
const LOCAL_EXTRA_GUESS: u64 = 64;
/// Extents of an archive this close together are read ahead as one (reading through the
/// gap costs less than another request).
const ADVISE_GAP: u64 = 64 * 1024;

/// Counters of the read path.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Bytes read from archive files (compressed or stored data and headers).
    pub archive_bytes: AtomicU64,
    /// Bytes produced by decompression.
    pub decompressed_bytes: AtomicU64,
    /// Decoders started from a member's beginning.
    pub streams_started: AtomicU64,
    /// Blocks produced by decompression.
    pub blocks_decoded: AtomicU64,
    /// Deflate decoders resumed from a checkpoint instead of the member's start.
    pub checkpoint_resumes: AtomicU64,
}

/// A fill slot: whoever holds its lock is filling the blocks of one member or frame;
/// for ZIP members it also parks the member's decoder between reads.
type Slot = Arc<Mutex<Option<Stream>>>;

/// Identifies a cached block. Archives are named by [`Archive::key`], unique in the
/// process, so generations of a live mount share the cache without ever confusing a
/// removed package's blocks with another's.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum BlockKey {
    /// Block `n` of the decompressed data of the ZIP member whose local header is at
    /// `header` in archive `archive`.
    Member {
        /// [`Archive::key`].
        archive: u32,
        /// Offset of the member's local header.
        header: u64,
        /// Block number.
        block: u64,
    },
    /// Frame `f` of seekable archive `a` (by [`Archive::key`]).
    Frame(u32, u32),
}

/// Reads member data, for every generation of a mount.
pub struct Reader {
    cache: BlockCache<BlockKey>,
    slots: Mutex<LruCache<BlockKey, Slot>>,
    /// Decoder checkpoints of deflate members (by archive key and header offset), in
    /// output order, with their total count.
    checkpoints: Mutex<(Checkpoints, usize)>,
    /// Activity counters.
    pub stats: ReadStats,
    /// Archives with an open descriptor that may be closed to save descriptors, least
    /// recently used first.
    open_files: Mutex<LruCache<u32, Weak<Archive>>>,
    /// How many archives may be open at once.
    fd_limit: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reader {
    /// A reader with a block cache of `cache_bytes`.
    pub fn new(cache_bytes: u64) -> Self {
        let cap =
            std::num::NonZeroUsize::new(PARKED_STREAMS).unwrap_or(std::num::NonZeroUsize::MIN);
        Reader {
            cache: BlockCache::new(cache_bytes),
            slots: Mutex::new(LruCache::new(cap)),
            checkpoints: Mutex::new((LruCache::unbounded(), 0)),
            stats: ReadStats::default(),
            open_files: Mutex::new(LruCache::unbounded()),
            fd_limit: crate::format::descriptor_budget(),
        }
    }

    /// Start tracking the descriptors of `archives` (those already open count against the
    /// budget).
    pub fn adopt<'a>(&self, archives: impl Iterator<Item = &'a Arc<Archive>>) {
        let mut lru = lock(&self.open_files);
        for a in archives {
            if a.is_open() && !lru.contains(&a.key) {
                lru.put(a.key, Arc::downgrade(a));
            }
        }
    }

    /// Never close `archive` to save descriptors: it is only used by an older generation
    /// of a live mount, and its file may already be deleted or replaced.
    pub fn pin(&self, archive: &Archive) {
        lock(&self.open_files).pop(&archive.key);
    }

    /// The open file of `a`, reopened if it was closed; keeps at most `fd_limit` archives
    /// open, closing the least recently used.
    fn file(&self, a: &Arc<Archive>) -> Result<Arc<File>> {
        let was_open = a.is_open();
        let f = a.file()?;
        let mut lru = lock(&self.open_files);
        if was_open && !lru.contains(&a.key) {
            // Pinned (or not tracked): leave it alone.
            return Ok(f);
        }
        lru.put(a.key, Arc::downgrade(a));
        while !was_open && lru.len() > self.fd_limit {
            match lru.pop_lru() {
                Some((old, w)) if old != a.key => {
                    if let Some(old) = w.upgrade() {
                        old.close();
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        Ok(f)
    }

    /// The bytes of `archive` that reading member `m` whole reads: a hint for read-ahead,
    /// not a bound (before its local header has been read, a ZIP member's extra field is
    /// guessed at `LOCAL_EXTRA_GUESS` bytes). `None` for data kept in the index.
    pub fn extent(archive: &Archive, state: &MemberState, m: &Member) -> Option<(u64, u64)> {
        let (start, end) = match &m.data {
            MemberData::Zip(z) => {
                let known = state.data_start.load(Ordering::Relaxed);
                let data = if known != 0 {
                    known
                } else {
                    z.header_offset
                        + zip::LFH_LEN as u64
                        + u64::from(z.name_len)
                        + LOCAL_EXTRA_GUESS
                };
                (z.header_offset, data.saturating_add(z.compressed_size))
            }
            MemberData::Seekable(start) => {
                let table = archive.table.as_ref()?;
                let first = table.frames.get(table.frame_at(*start)?)?;
                let last_byte = (start + m.size).checked_sub(1)?;
                let last = table.frames.get(table.frame_at(last_byte)?)?;
                (first.coff, last.coff + u64::from(last.csize))
            }
            MemberData::Inline(_) => return None,
        };
        (start < end).then_some((start, end.min(archive.size)))
    }

    /// Ask the kernel to start reading `extents` of `archive` (byte ranges, in any
    /// order) into its page cache, without waiting for them. The read-ahead thread knows
    /// which members it will decode next, but their order in the walk need not be their
    /// order in the archive (`zip -r` stores a directory's files in `readdir` order), and
    /// the kernel's own read-ahead follows only sequential reads: unadvised, each member
    /// of a cold archive costs a small disk read of its own. Sorted and merged (gaps up to
    /// `ADVISE_GAP` are read through), they become a few large ones.
    ///
    /// Extents already in ascending order are left to the kernel's sequential
    /// read-ahead, which reads them in larger requests than advice would.
    pub fn will_need(&self, archive: &Arc<Archive>, extents: Vec<(u64, u64)>) {
        let advice = advice(extents);
        if advice.is_empty() {
            return;
        }
        let Ok(file) = self.file(archive) else {
            return;
        };
        for (start, end) in advice {
            // SAFETY: posix_fadvise only reads its arguments; the descriptor is open (the
            // Arc keeps the file alive for the call).
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&*file),
                    start as libc::off_t,
                    (end - start) as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }

    /// The block cache (for statistics).
    pub fn cache(&self) -> &BlockCache<BlockKey> {
        &self.cache
    }

    /// The kernel has been given bytes `[start, end)` of member `m` of `archive` and keeps
    /// them: count them towards the cached blocks they came from, which leave the cache
    /// once the kernel has had all they hold (see [`BlockCache::delivered`]). A ZIP
    /// member's block is followed page by page; a frame of a package holds several files
    /// and their tar headers, which are never delivered, so its bytes given are counted
    /// against the file bytes it holds ([`SeekTable::file_bytes`]). Stored members are
    /// not cached.
    pub fn delivered(&self, archive: &Archive, m: &Member, start: u64, end: u64) {
        let end = end.min(m.size);
        if start >= end {
            return;
        }
        match &m.data {
            MemberData::Zip(zip) => {
                let mut at = start;
                while at < end {
                    let block = at / BLOCK_SIZE;
                    let base = block * BLOCK_SIZE;
                    let next = (base + BLOCK_SIZE).min(end);
                    self.cache.delivered(
                        &BlockKey::Member {
                            archive: archive.key,
                            header: zip.header_offset,
                            block,
                        },
                        (at - base) as usize,
                        (next - base) as usize,
                    );
                    at = next;
                }
            }
            MemberData::Seekable(data) => {
                let Some(table) = &archive.table else {
                    return;
                };
                let (start, end) = (data + start, data + end);
                let Some(mut f) = table.frame_at(start) else {
                    return;
                };
                while let (Some(frame), Some(&of)) = (table.frames.get(f), table.file_bytes.get(f))
                {
                    if frame.doff >= end {
                        break;
                    }
                    let given =
                        (frame.doff + u64::from(frame.dsize)).min(end) - frame.doff.max(start);
                    self.cache.delivered_bytes(
                        &BlockKey::Frame(archive.key, f as u32),
                        given,
                        u64::from(of),
                    );
                    f += 1;
                }
            }
            MemberData::Inline(_) => {}
        }
    }

    /// Read up to `len` bytes at `offset` of member `m` of `archive`, whose lazily learnt
    /// state is `state`. Returns fewer bytes only at the end of the member.
    pub fn read(
        &self,
        archive: &Arc<Archive>,
        state: &MemberState,
        m: &Member,
        offset: u64,
        len: u32,
    ) -> Result<ReadData> {
        self.read_span(archive, state, m, offset, len, Span::Whole)
    }

    /// Read up to `len` bytes at `offset` like [`Reader::read`], or with
    /// [`Span::Piece`] only as far as the decoded block holding `offset` goes (at least
    /// one byte unless at the end): the bytes are then shared with the cache, never
    /// copied together. Read-ahead goes through a large file piece by piece this way.
    pub fn read_span(
        &self,
        archive: &Arc<Archive>,
        state: &MemberState,
        m: &Member,
        offset: u64,
        len: u32,
        span: Span,
    ) -> Result<ReadData> {
        if offset >= m.size {
            return Ok(ReadData::Owned(Block::new(Vec::new())));
        }
        let end = m.size.min(offset.saturating_add(u64::from(len)));
        match &m.data {
            MemberData::Zip(zip) => {
                let zm = ZipMember {
                    archive,
                    state,
                    zip: *zip,
                    size: m.size,
                };
                self.read_zip(&zm, offset, end, span)
            }
            MemberData::Seekable(start) => {
                self.read_seekable(archive, start + offset, start + end, span)
            }
            MemberData::Inline(bytes) => Ok(ReadData::Owned(Block::new(
                bytes
                    .get(offset as usize..end as usize)
                    .ok_or_else(|| Error::Format("inline data shorter than its size".into()))?
                    .to_vec(),
            ))),
        }
    }

    fn read_zip(&self, m: &ZipMember<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        if m.zip.encrypted {
            return Err(Error::Unsupported("encrypted member".into()));
        }
        match m.zip.method {
            METHOD_STORED => self
                .read_stored(m, offset, end)
                .map(|v| ReadData::Owned(Block::new(v))),
            METHOD_DEFLATE | METHOD_ZSTD => self.read_compressed(m, offset, end, span),
            other => Err(Error::Unsupported(format!(
                "compression method {other} ({})",
                method_name(other)
            ))),
        }
    }

    /// Bytes `[start, end)` of a seekable archive's decompressed stream, frame by frame
    /// through the cache; concurrent misses on one frame share one decompression.
    fn read_seekable(
        &self,
        a: &Arc<Archive>,
        start: u64,
        end: u64,
        span: Span,
    ) -> Result<ReadData> {
        let table = a.table.as_ref().ok_or_else(|| {
            Error::Format("seekable member in an archive without a seek table".into())
        })?;
        gather(start, end, span, |pos| {
            let fi = table.frame_at(pos).ok_or_else(|| {
                Error::Corrupt(format!("offset {pos} is past the end of the stream"))
            })?;
            Ok((table.frames[fi].doff, self.frame(a, table, fi)?))
        })
    }

    fn frame(&self, a: &Arc<Archive>, table: &SeekTable, fi: usize) -> Result<Arc<Block>> {
        let key = BlockKey::Frame(a.key, fi as u32);
        if let Some(b) = self.cache.get(&key) {
            return Ok(b);
        }
        let slot: Slot = lock(&self.slots).get_or_insert(key, Slot::default).clone();
        let _fill = lock(&slot);
        if self.cache.contains(&key)
            && let Some(b) = self.cache.get(&key)
        {
            return Ok(b);
        }
        let dsize = table.frames.get(fi).map_or(0, |f| f.dsize as usize);
        let mut data = Block::empty(dsize);
        let decoded = seekable::decode_frame_into(&*self.file(a)?, table, fi, &mut data);
        a.unchanged()?;
        decoded?;
        let data = Arc::new(Block::new(data));
        self.count_archive_bytes(table.frames[fi].csize as usize);
        self.stats.blocks_decoded.fetch_add(1, Ordering::Relaxed);
        self.stats
            .decompressed_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.cache.insert(key, data.clone());
        Ok(data)
    }

    /// Where the member's data starts, from its local header (read once, then
    /// remembered), checked to lie inside the archive.
    fn data_start(&self, m: &ZipMember<'_>) -> Result<u64> {
        let known = m.state.data_start.load(Ordering::Relaxed);
        if known != 0 {
            return Ok(known);
        }
        let mut lfh = vec![0u8; zip::LFH_LEN + usize::from(m.zip.name_len)];
        let r = read_exact_at(&*self.file(m.archive)?, &mut lfh, m.zip.header_offset);
        m.archive.unchanged()?;
        r?;
        self.count_archive_bytes(lfh.len());
        self.learn_data_start(m, &lfh)
    }

    /// Where the member's data starts, given its local header and name (`lfh`), checked
    /// and remembered.
    fn learn_data_start(&self, m: &ZipMember<'_>, lfh: &[u8]) -> Result<u64> {
        let start =
            m.zip.header_offset + zip::local_data_offset(lfh, m.zip.name_len, m.zip.name_crc)?;
        if start
            .checked_add(m.zip.compressed_size)
            .is_none_or(|e| e > m.archive.size)
        {
            return Err(Error::Format(format!(
                "member data ({} bytes at {start}) runs past the end of the archive ({} bytes)",
                m.zip.compressed_size, m.archive.size
            )));
        }
        m.state.data_start.store(start, Ordering::Relaxed);
        Ok(start)
    }

    /// A decoder for the member resumed from its last checkpoint at or before `target`,
    /// if there is one past `better_than` (the parked decoder's position).
    fn resume_checkpoint(
        &self,
        m: &ZipMember<'_>,
        target: u64,
        better_than: Option<u64>,
    ) -> Result<Option<Stream>> {
        if m.zip.method != METHOD_DEFLATE || m.size <= CHECKPOINT_EVERY {
            return Ok(None);
        }
        let data_start = self.data_start(m)?;
        let mut guard = lock(&self.checkpoints);
        let Some(list) = guard.0.get_mut(&(m.archive.key, m.zip.header_offset)) else {
            return Ok(None);
        };
        let i = list.partition_point(|c| c.out_pos <= target);
        let Some(cp) = i.checked_sub(1).and_then(|i| list.get_mut(i)) else {
            return Ok(None);
        };
        if better_than.is_some_and(|p| p >= cp.out_pos) {
            return Ok(None);
        }
        self.stats
            .checkpoint_resumes
            .fetch_add(1, Ordering::Relaxed);
        Stream::resume(cp, data_start).map(Some)
    }

    /// Keep a checkpoint of `stream` (once per position), within [`MAX_CHECKPOINTS`].
    fn save_checkpoint(&self, m: &ZipMember<'_>, stream: &mut Stream) {
        let key = (m.archive.key, m.zip.header_offset);
        let mut guard = lock(&self.checkpoints);
        let (lru, total) = &mut *guard;
        let list = lru.get_or_insert_mut(key, Vec::new);
        let i = list.partition_point(|c| c.out_pos < stream.out_pos);
        if list.get(i).is_some_and(|c| c.out_pos == stream.out_pos) {
            return;
        }
        let Some(cp) = stream.checkpoint() else {
            return;
        };
        list.insert(i, cp);
        *total += 1;
        while *total > MAX_CHECKPOINTS {
            match lru.pop_lru() {
                Some((k, v)) if k == key => {
                    // Only this member is left: thin it instead.
                    let mut v = v;
                    let dropped = v.len() / 2;
                    *total -= dropped;
                    v = v.into_iter().step_by(2).collect();
                    lru.put(k, v);
                    if dropped == 0 {
                        break;
                    }
                }
                Some((_, v)) => *total -= v.len(),
                None => break,
            }
        }
    }

    fn count_archive_bytes(&self, n: usize) {
        self.stats
            .archive_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    fn read_stored(&self, m: &ZipMember<'_>, offset: u64, end: u64) -> Result<Vec<u8>> {
        if m.zip.compressed_size != m.size {
            return Err(Error::Corrupt(format!(
                "stored member has compressed size {} but size {}",
                m.zip.compressed_size, m.size
            )));
        }
        let start = self.data_start(m)?;
        let file = self.file(m.archive)?;
        let read = |buf: &mut [u8], at: u64| {
            let r = read_exact_at(&file, buf, at);
            m.archive.unchanged()?;
            self.count_archive_bytes(buf.len());
            r
        };
        if m.size <= VERIFY_MAX && !m.state.verified.load(Ordering::Relaxed) {
            let mut all = vec![0u8; m.size as usize];
            read(&mut all, start)?;
            check_crc(crc32fast::hash(&all), m)?;
            m.state.verified.store(true, Ordering::Relaxed);
            all.truncate(end as usize);
            all.drain(..offset as usize);
            return Ok(all);
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        read(&mut buf, start + offset)?;
        Ok(buf)
    }

    fn read_compressed(
        &self,
        m: &ZipMember<'_>,
        offset: u64,
        end: u64,
        span: Span,
    ) -> Result<ReadData> {
        gather(offset, end, span, |pos| {
            let bi = pos / BLOCK_SIZE;
            Ok((bi * BLOCK_SIZE, self.block(m, bi)?))
        })
    }

    /// A deflate member of at most one block, decoded in one call. The same checks as a
    /// stream's: the input is the compressed size (at most two blocks, checked by the
    /// caller), the output is bounded by the declared size, the stream must end exactly
    /// there, and the CRC must match.
    fn inflate_whole(&self, m: &ZipMember<'_>) -> Result<Vec<u8>> {
        thread_local! {
            static DECODER: std::cell::RefCell<(Option<OneShot>, Vec<u8>)> =
                const { std::cell::RefCell::new((None, Vec::new())) };
        }
        let (csize, size) = (m.zip.compressed_size as usize, m.size);
        let known = m.state.data_start.load(Ordering::Relaxed);
        let file = self.file(m.archive)?;
        let mut out = Block::empty(size as usize);
        DECODER.with_borrow_mut(|(decoder, input)| {
            let decoder = match decoder {
                Some(d) => d,
                None => decoder.insert(OneShot::new()?),
            };
            // A member read for the first time: its local header comes in the same read as
            // its data (one read and one check of the file instead of two each), with
            // room for an extra field of up to LOCAL_EXTRA_GUESS bytes.
            let lead = zip::LFH_LEN + usize::from(m.zip.name_len);
            let (from, want) = match known {
                0 => (
                    m.zip.header_offset,
                    lead + LOCAL_EXTRA_GUESS as usize + csize,
                ),
                at => (at, csize),
            };
            let left = m.archive.size.saturating_sub(from);
            input.resize(want.min(usize::try_from(left).unwrap_or(usize::MAX)), 0);
            let read = read_exact_at(&file, input, from);
            m.archive.unchanged()?;
            read?;
            self.count_archive_bytes(input.len());
            let skip = match known {
                0 => {
                    let head = input.get(..lead).ok_or_else(|| {
                        Error::Format("local header runs past the end of the archive".into())
                    })?;
                    let skip = (self.learn_data_start(m, head)? - m.zip.header_offset) as usize;
                    let have = input.len();
                    if skip + csize > have {
                        // A longer extra field than guessed: read the rest of the data.
                        input.resize(skip + csize, 0);
                        let read = read_exact_at(&file, &mut input[have..], from + have as u64);
                        m.archive.unchanged()?;
                        read?;
                        self.count_archive_bytes(skip + csize - have);
                    }
                    skip
                }
                _ => 0,
            };
            decoder.decode(&input[skip..skip + csize], &mut out, size as usize)
        })?;
        check_crc(crc32fast::hash(&out), m)?;
        self.stats.blocks_decoded.fetch_add(1, Ordering::Relaxed);
        self.stats
            .decompressed_bytes
            .fetch_add(size, Ordering::Relaxed);
        Ok(out)
    }

    /// Decoded block `bi` of the member, from the cache or by decoding.
    fn block(&self, m: &ZipMember<'_>, bi: u64) -> Result<Arc<Block>> {
        let key_of = |block| BlockKey::Member {
            archive: m.archive.key,
            header: m.zip.header_offset,
            block,
        };
        let key = key_of(bi);
        if let Some(b) = self.cache.get(&key) {
            return Ok(b);
        }
        // One slot per member (keyed by its block 0): fills of a member are serialised
        // and its decoder is parked there.
        let slot: Slot = lock(&self.slots)
            .get_or_insert(key_of(0), Slot::default)
            .clone();
        let mut parked = lock(&slot);
        // Another thread may have produced the block while we waited for the member.
        if self.cache.contains(&key)
            && let Some(b) = self.cache.get(&key)
        {
            return Ok(b);
        }
        // One call needs the whole input in memory: only for a sane compressed size (a
        // lying directory is left to the stream, which reads in bounded chunks).
        if bi == 0
            && m.zip.method == METHOD_DEFLATE
            && m.size <= BLOCK_SIZE
            && m.zip.compressed_size <= 2 * BLOCK_SIZE
        {
            let data = Arc::new(Block::new(self.inflate_whole(m)?));
            self.cache.insert(key, data.clone());
            return Ok(data);
        }
        let target = bi * BLOCK_SIZE;
        let parked_at = parked.as_ref().map(|s| s.out_pos).filter(|&p| p <= target);
        let resumed = match parked_at {
            Some(p) if target - p < CHECKPOINT_EVERY => None,
            _ => self.resume_checkpoint(m, target, parked_at)?,
        };
        let mut stream = match (resumed, parked.take()) {
            (Some(s), _) => s,
            (None, Some(s)) if s.out_pos <= target => s,
            _ => {
                self.stats.streams_started.fetch_add(1, Ordering::Relaxed);
                Stream::new(m.zip.method, self.data_start(m)?)?
            }
        };
        loop {
            let at = stream.out_pos / BLOCK_SIZE;
            let decoded = stream.next_block(&*self.file(m.archive)?, m);
            m.archive.unchanged()?;
            let (data, read) = decoded?;
            self.count_archive_bytes(read);
            self.stats.blocks_decoded.fetch_add(1, Ordering::Relaxed);
            self.stats
                .decompressed_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            let data = Arc::new(Block::new(data));
            self.cache.insert(key_of(at), data.clone());
            if stream.out_pos % CHECKPOINT_EVERY == 0 && stream.out_pos < m.size {
                self.save_checkpoint(m, &mut stream);
            }
            if at == bi {
                if stream.out_pos < m.size {
                    *parked = Some(stream);
                }
                return Ok(data);
            }
        }
    }
}

/// A ZIP member as the ZIP read path sees it.
struct ZipMember<'a> {
    archive: &'a Arc<Archive>,
    state: &'a MemberState,
    zip: ZipData,
    size: u64,
}

/// Bytes read: owned, or a range of a cached block shared without a copy (a read that
/// falls inside one block, the common case for small files and kernel-sized requests).
#[derive(Debug, Clone)]
pub enum ReadData {
    /// Bytes of their own (in a pooled buffer: a read across blocks of a large file
    /// allocates none once the pool has one of its size).
    Owned(Block),
    /// `block[start..end]`.
    Shared {
        /// The cached block.
        block: Arc<Block>,
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
}

impl std::ops::Deref for ReadData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadData::Owned(b) => b,
            ReadData::Shared { block, start, end } => &block[*start..*end],
        }
    }
}

impl ReadData {
    /// The bytes as a vector of their own.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            ReadData::Owned(b) => b.into_vec(),
            shared => shared.to_vec(),
        }
    }
}

/// How much of a range a read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// All of it (up to the end of the member).
    Whole,
    /// As much as the block holding its start has.
    Piece,
}

/// Bytes `[start, end)` out of a sequence of cached blocks: `block_at(pos)` returns the
/// block holding `pos` and the offset where that block starts. Within one block, the
/// block itself is handed out; across blocks, the bytes are copied together, unless
/// `span` asks only for the first block's part.
fn gather(
    start: u64,
    end: u64,
    span: Span,
    mut block_at: impl FnMut(u64) -> Result<(u64, Arc<Block>)>,
) -> Result<ReadData> {
    if start >= end {
        return Ok(ReadData::Owned(Block::new(Vec::new())));
    }
    let (first_start, first) = block_at(start)?;
    let within = (start - first_start) as usize;
    let end = match span {
        Span::Whole => end,
        Span::Piece => end.min(first_start + first.len() as u64),
    };
    if end <= start {
        return Err(Error::Corrupt(
            "decoded data is shorter than its index says".into(),
        ));
    }
    if (within as u64).saturating_add(end - start) <= first.len() as u64 {
        return Ok(ReadData::Shared {
            start: within,
            end: within + (end - start) as usize,
            block: first,
        });
    }
    let mut out = Block::empty((end - start) as usize);
    let mut pos = start;
    let mut next = Some((first_start, first));
    while pos < end {
        let (block_start, block) = match next.take() {
            Some(b) => b,
            None => block_at(pos)?,
        };
        let within = (pos - block_start) as usize;
        let take = (block.len().saturating_sub(within) as u64).min(end - pos) as usize;
        if take == 0 {
            return Err(Error::Corrupt(
                "decoded data is shorter than its index says".into(),
            ));
        }
        out.extend_from_slice(&block[within..within + take]);
        pos += take as u64;
    }
    Ok(ReadData::Owned(Block::new(out)))
}

/// What to ask the kernel to read ahead of the extents (byte ranges) of one archive, given
/// in the order they will be read: nothing if that order is ascending (the kernel's own
/// read-ahead follows it), else the extents sorted, with those that overlap or lie at most
/// [`ADVISE_GAP`] apart merged.
fn advice(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    if v.windows(2).all(|w| w[0].0 <= w[1].0) {
        return Vec::new();
    }
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (start, end) in v {
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(ADVISE_GAP) => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

fn check_crc(actual: u32, m: &ZipMember) -> Result<()> {
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

/// Checkpoints by member (archive key, local header offset), in output order.
type Checkpoints = LruCache<(u32, u64), Vec<Checkpoint>>;

/// A saved decoder position inside a deflate member.
struct Checkpoint {
    inflater: Inflater,
    in_pos: u64,
    out_pos: u64,
    crc: crc32fast::Hasher,
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
    fn refill(&mut self, file: &File, m: &ZipMember) -> Result<usize> {
        if self.in_start < self.input.len() || self.in_pos >= m.zip.compressed_size {
            return Ok(0);
        }
        let n = (m.zip.compressed_size - self.in_pos).min(INPUT_CHUNK as u64) as usize;
        self.input.resize(n, 0);
        read_exact_at(file, &mut self.input, self.data_start + self.in_pos)?;
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

    /// A decoder resumed from a checkpoint (which stays as it is).
    fn resume(cp: &mut Checkpoint, data_start: u64) -> Result<Stream> {
        Ok(Stream {
            codec: Codec::Deflate(cp.inflater.try_clone()?),
            data_start,
            in_pos: cp.in_pos,
            input: Vec::new(),
            in_start: 0,
            out_pos: cp.out_pos,
            crc: cp.crc.clone(),
            ended: false,
        })
    }

    fn input_done(&self, m: &ZipMember) -> bool {
        self.in_pos >= m.zip.compressed_size && self.in_start == self.input.len()
    }

    /// Decode the next block; returns it with the number of archive bytes read.
    fn next_block(&mut self, file: &File, m: &ZipMember) -> Result<(Vec<u8>, usize)> {
        let want = (m.size - self.out_pos).min(BLOCK_SIZE) as usize;
        let mut out = Block::buffer(want);
        let mut produced = 0;
        let mut read = 0;
        while produced < want {
            read += self.refill(file, m)?;
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
            read += self.finish(file, m)?;
        }
        Ok((out, read))
    }

    /// At the declared end: the stream must end here too, and the CRC must match.
    fn finish(&mut self, file: &File, m: &ZipMember) -> Result<usize> {
        let mut read = 0;
        let mut scratch = [0u8; 1];
        while !self.ended {
            read += self.refill(file, m)?;
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
        check_crc(crc, m)?;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::format;
    use crate::fs::PkgFs;
    use crate::tree::{Ownership, TreeBuilder};

    const OWNER: Ownership = Ownership::defaults(0, 0);

    /// Write a ZIP with the `zip` crate and mount it as a `PkgFs` (no FUSE).
    fn build(
        files: &[(&str, ::zip::CompressionMethod, &[u8])],
        cache: u64,
    ) -> (tempfile::TempDir, PkgFs) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.zip");
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (name, method, data) in files {
            let opts = ::zip::write::SimpleFileOptions::default()
                .compression_method(*method)
                .large_file(data.len() > u32::MAX as usize);
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
        (dir, open(&path, cache))
    }

    fn open(path: &std::path::Path, cache: u64) -> PkgFs {
        let idx = format::open(path, None).unwrap_or_else(|_| panic!("open {}", path.display()));
        let mut b = TreeBuilder::new(OWNER);
        b.add_layer(0, 0, &idx.entries);
        PkgFs::new(b.finish(), vec![idx.archive], cache)
    }

    fn data(n: usize) -> Vec<u8> {
        // Compressible but not trivially: a slow-changing pseudo-random text.
        let mut x = 1u32;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                b"abcdefgh\n"[(x >> 28) as usize % 9]
            })
            .collect()
    }

    #[test]
    fn random_reads_deep_in_a_deflate_member_resume_from_checkpoints() {
        let big = data(40 << 20);
        // A cache of 1 MiB: blocks do not stay, so every read below must decode.
        let (_d, fs) = build(
            &[("big", ::zip::CompressionMethod::Deflated, &big)],
            1 << 20,
        );
        let ino = fs.resolve(b"big").unwrap();
        let s = &fs.reader().stats;
        // The first read near the end decodes everything before it once, leaving
        // checkpoints on the way.
        let end = big.len() as u64 - 4096;
        assert_eq!(fs.read(ino, end, 4096).unwrap(), &big[end as usize..]);
        assert_eq!(s.streams_started.load(Relaxed), 1);
        // Then reads at random places cost at most one checkpoint interval each.
        let mut x = 7u64;
        let mut early = 0;
        for _ in 0..40 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let off = (x >> 11) % (big.len() as u64 - 4096);
            let before = s.decompressed_bytes.load(Relaxed);
            let got = fs.read(ino, off, 4096).unwrap();
            assert_eq!(got, &big[off as usize..off as usize + 4096], "at {off}");
            // Before the first checkpoint, the member's start is the nearest point.
            early += u64::from(off < CHECKPOINT_EVERY);
            let cost = s.decompressed_bytes.load(Relaxed) - before;
            assert!(
                cost <= CHECKPOINT_EVERY + 2 * BLOCK_SIZE,
                "read at {off} decoded {cost} bytes"
            );
        }
        assert!(
            s.streams_started.load(Relaxed) <= 1 + early,
            "from the start only before the first checkpoint"
        );
        assert!(s.checkpoint_resumes.load(Relaxed) >= 20);
        // And a full sequential read through checkpoints still checks the CRC.
        assert_eq!(read_all(&fs, ino, 1 << 20), big);
    }

    fn read_all(fs: &PkgFs, ino: u64, chunk: u32) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let c = fs.read(ino, out.len() as u64, chunk).unwrap();
            if c.is_empty() {
                return out;
            }
            out.extend(c);
        }
    }

    #[test]
    fn sequential_reads_decode_each_block_once() {
        use ::zip::CompressionMethod::{Deflated, Zstd};
        let big = data(3 * BLOCK_SIZE as usize + 1234);
        for method in [Deflated, Zstd] {
            let (_d, fs) = build(&[("big", method, &big)], 64 << 20);
            let ino = fs.resolve(b"big").unwrap();
            assert_eq!(read_all(&fs, ino, 128 * 1024), big, "{method:?}");
            let s = &fs.reader().stats;
            assert_eq!(
                s.streams_started.load(Relaxed),
                1,
                "never restarted ({method:?})"
            );
            assert_eq!(s.blocks_decoded.load(Relaxed), 4);
            assert_eq!(s.decompressed_bytes.load(Relaxed), big.len() as u64);
            // A second pass is served from the cache.
            assert_eq!(read_all(&fs, ino, 100_000), big);
            assert_eq!(s.blocks_decoded.load(Relaxed), 4);
        }
    }

    #[test]
    fn blocks_the_kernel_holds_leave_the_cache() {
        use ::zip::CompressionMethod::{Deflated, Stored};
        // Twice the grace of decoded blocks, and a stored member (never cached).
        let big = data(2 * crate::read::cache::RELEASE_GRACE as usize + 1000);
        let small = data(5000);
        let (_d, fs) = build(&[("big", Deflated, &big), ("s", Stored, &small)], 1 << 30);
        let ino = fs.resolve(b"big").unwrap();
        assert_eq!(read_all(&fs, ino, 128 * 1024), big);
        let cache = fs.reader().cache();
        assert_eq!(cache.bytes(), big.len() as u64, "every block cached");
        // Pages given to the kernel as it asks for them: 128 KiB reads straddle no block
        // but fill each one in two; a block given in part stays.
        let blocks = big.len() as u64 / BLOCK_SIZE;
        fs.delivered(ino, 0, (blocks * BLOCK_SIZE) - 4096);
        fs.delivered(ino, blocks * BLOCK_SIZE - 4096, 4096 + 100);
        let released = cache.stats.released.load(Relaxed);
        assert!(released > 0 && released < blocks, "{released} of {blocks}");
        assert!(
            cache.bytes() <= crate::read::cache::RELEASE_GRACE + 2 * BLOCK_SIZE,
            "only the grace stays: {}",
            cache.bytes()
        );
        assert_eq!(
            cache.bytes() % BLOCK_SIZE,
            1000,
            "the last block, given in part, stays"
        );
        // What is still cached is served without decoding; what went is decoded again,
        // correctly.
        let decoded = fs.reader().stats.blocks_decoded.load(Relaxed);
        assert_eq!(read_all(&fs, ino, 128 * 1024), big);
        assert!(fs.reader().stats.blocks_decoded.load(Relaxed) > decoded);
        // Members not cached, and inodes that are not files, are ignored.
        fs.delivered(fs.resolve(b"s").unwrap(), 0, 5000);
        fs.delivered(1, 0, 4096);
        fs.delivered(999_999, 0, 4096);
    }

    #[test]
    fn concurrent_misses_share_one_decompression() {
        let big = data(2 * BLOCK_SIZE as usize);
        let (_d, fs) = build(
            &[("big", ::zip::CompressionMethod::Deflated, &big)],
            64 << 20,
        );
        let ino = fs.resolve(b"big").unwrap();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(fs.read(ino, 1000, 10).unwrap(), &big[1000..1010]));
            }
        });
        assert_eq!(fs.reader().stats.blocks_decoded.load(Relaxed), 1);
    }

    #[test]
    fn a_tiny_cache_still_reads_correctly() {
        let big = data(5 * BLOCK_SIZE as usize);
        let (_d, fs) = build(&[("big", ::zip::CompressionMethod::Deflated, &big)], 1000);
        let ino = fs.resolve(b"big").unwrap();
        assert_eq!(read_all(&fs, ino, 70_000), big);
        assert_eq!(
            fs.reader().cache().bytes(),
            0,
            "blocks larger than the budget are not kept"
        );
        // Backwards: restarts, still right.
        assert_eq!(fs.read(ino, 10, 20).unwrap(), &big[10..30]);
    }

    #[test]
    fn stored_members_are_read_in_place_and_crc_checked() {
        let small = data(5000);
        let large = data(VERIFY_MAX as usize + 10);
        let (dir, fs) = build(
            &[
                ("small", ::zip::CompressionMethod::Stored, &small),
                ("large", ::zip::CompressionMethod::Stored, &large),
            ],
            1 << 20,
        );
        let ino = fs.resolve(b"large").unwrap();
        assert_eq!(fs.read(ino, 7, 100).unwrap(), &large[7..107]);
        assert_eq!(fs.reader().stats.decompressed_bytes.load(Relaxed), 0);
        assert_eq!(
            fs.reader().cache().bytes(),
            0,
            "stored data is not copied into the cache"
        );
        let ino = fs.resolve(b"small").unwrap();
        assert_eq!(fs.read(ino, 0, 10).unwrap(), &small[..10]);

        // Flip one byte of the small member's data: its first read fails with EIO.
        let path = dir.path().join("t.zip");
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(100)
            .position(|w| w == &small[1000..1100])
            .unwrap();
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let fs = open(&path, 1 << 20);
        let ino = fs.resolve(b"small").unwrap();
        let e = fs.read(ino, 0, 10).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("CRC"), "{e}");
    }

    /// Patch the central directory record of the first member: `f` edits its fields.
    fn patch_cd(path: &std::path::Path, f: impl Fn(&mut [u8])) {
        let mut bytes = std::fs::read(path).unwrap();
        let at = bytes.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
        f(&mut bytes[at..at + 46]);
        std::fs::write(path, &bytes).unwrap();
    }

    #[test]
    fn lying_sizes_and_crcs_are_corruption_not_allocation() {
        let body = data(400_000);
        type Edit = fn(&mut [u8]);
        let cases: [(&str, Edit); 3] = [
            // Declared size far larger than the stream: the stream ends early.
            ("size too large", |r| {
                r[24..28].copy_from_slice(&u32::MAX.to_le_bytes())
            }),
            // Declared size smaller than the stream: more data than declared.
            ("size too small", |r| {
                r[24..28].copy_from_slice(&1000u32.to_le_bytes())
            }),
            ("bad crc", |r| r[16] ^= 1),
        ];
        for (what, edit) in cases {
            let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
            let path = dir.path().join("t.zip");
            patch_cd(&path, edit);
            let fs = open(&path, 1 << 20);
            let ino = fs.resolve(b"f").unwrap();
            let mut err = None;
            let mut off = 0;
            while off < fs.getattr(ino).unwrap().size {
                match fs.read(ino, off, 1 << 20) {
                    Ok(c) if c.is_empty() => break,
                    Ok(c) => off += c.len() as u64,
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            let e = err.unwrap_or_else(|| panic!("{what}: no error"));
            assert_eq!(e.errno(), libc::EIO, "{what}");
        }
    }

    /// Members of one block are decoded in one call (libdeflate), not streamed: the same
    /// lies are caught, with the same errors.
    #[test]
    fn one_call_deflate_members_are_checked_like_streams() {
        let body = data(100_000);
        let (_dir, fs) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
        let ino = fs.resolve(b"f").unwrap();
        assert!(fs.read(ino, 0, 1 << 20).unwrap() == body);
        assert!(fs.read(ino, 99_000, 5_000).unwrap() == body[99_000..]);
        type Edit = fn(&mut [u8]);
        let cases: [(&str, Edit, &str); 4] = [
            (
                "size too large",
                |r| r[24..28].copy_from_slice(&200_000u32.to_le_bytes()),
                "ends after 100000",
            ),
            (
                "size too small",
                |r| r[24..28].copy_from_slice(&1000u32.to_le_bytes()),
                "more than the 1000",
            ),
            ("bad crc", |r| r[16] ^= 1, "CRC-32"),
            (
                "input cut short",
                |r| r[20..24].copy_from_slice(&100u32.to_le_bytes()),
                "bad deflate",
            ),
        ];
        for (what, edit, says) in cases {
            let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
            let path = dir.path().join("t.zip");
            patch_cd(&path, edit);
            let fs = open(&path, 1 << 20);
            let e = fs.read(fs.resolve(b"f").unwrap(), 0, 1 << 20).unwrap_err();
            assert_eq!(e.errno(), libc::EIO, "{what}");
            assert!(e.to_string().contains(says), "{what}: {e}");
        }
    }

    #[test]
    fn read_ahead_advice_is_nothing_in_order_and_merged_out_of_order() {
        assert_eq!(advice(vec![]), vec![]);
        assert_eq!(advice(vec![(0, 10), (10, 20), (500_000, 600_000)]), vec![]);
        let gap = ADVISE_GAP;
        assert_eq!(
            advice(vec![
                (1_000_000, 1_000_100),
                (0, 100),
                (100 + gap, 200 + gap),
                (50, 80),
                (100 + 3 * gap, 101 + 3 * gap),
            ]),
            vec![
                (0, 200 + gap),
                (100 + 3 * gap, 101 + 3 * gap),
                (1_000_000, 1_000_100)
            ]
        );
    }

    /// The archive bytes of a file's member, as `Reader::extent` sees them now.
    fn extent_of(fs: &PkgFs, ino: u64) -> (u64, u64) {
        let (v, local) = fs.find(ino).unwrap();
        let n = v.tree.node(local).unwrap();
        let m = v.tree.member(n).unwrap();
        let state = v.member_state(v.tree.member_index(n).unwrap()).unwrap();
        Reader::extent(&v.layers[m.archive as usize].archive, state, m).unwrap()
    }

    #[test]
    fn extents_cover_the_data_and_local_headers_are_read_with_it() {
        // Members whose local extra field is shorter and longer than the guess made
        // before the local header is read (the second needs a read of its own).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.zip");
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let bodies: Vec<Vec<u8>> = (0..3).map(|i| data(20_000 + i * 7_000)).collect();
        for (i, extra) in [0usize, 40, 300].into_iter().enumerate() {
            let mut opts = ::zip::write::FullFileOptions::default()
                .compression_method(::zip::CompressionMethod::Deflated);
            if extra > 0 {
                opts.add_extra_field(0x7777, vec![7u8; extra], false)
                    .unwrap();
            }
            w.start_file(format!("f{i}"), opts).unwrap();
            w.write_all(&bodies[i]).unwrap();
        }
        w.finish().unwrap();
        let fs = open(&path, 1 << 20);
        let zip = std::fs::read(&path).unwrap();
        for (i, body) in bodies.iter().enumerate() {
            let ino = fs.resolve(format!("f{i}").as_bytes()).unwrap();
            let guess = extent_of(&fs, ino);
            assert!(fs.read(ino, 0, 1 << 20).unwrap() == *body, "f{i}");
            let (start, end) = extent_of(&fs, ino);
            assert_eq!(start, guess.0);
            assert_eq!(&zip[start as usize..start as usize + 4], b"PK\x03\x04");
            // The data ends where the next local header or the central directory starts.
            assert!(
                matches!(&zip[end as usize..end as usize + 2], b"PK"),
                "f{i}"
            );
            // The first two fit the guess; the third's data ends past it.
            assert_eq!(guess.1 >= end, i < 2, "f{i}: {guess:?} against {end}");
            assert!(fs.read(ino, 1000, 10).unwrap() == body[1000..1010]);
        }
        // A package's extent is the frames holding the file.
        let big = data(300_000);
        let (_d, fs) = packed(
            &[("a", &big[..1000]), ("b", &big), ("c", &big[..10])],
            65_536,
        );
        let (v, _) = fs.find(1).unwrap();
        let table = v.layers[0].archive.table.clone().unwrap();
        let (start, end) = extent_of(&fs, fs.resolve(b"b").unwrap());
        let frames: Vec<_> = table
            .frames
            .iter()
            .filter(|f| f.coff >= start && f.coff + u64::from(f.csize) <= end)
            .collect();
        let covered: u64 = frames.iter().map(|f| u64::from(f.dsize)).sum();
        assert!(
            (300_000..300_000 + 2 * 65_536).contains(&covered),
            "{covered}"
        );
    }

    #[test]
    fn unsupported_and_truncated_members_fail_cleanly() {
        let body = data(100_000);
        let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
        let path = dir.path().join("t.zip");
        patch_cd(&path, |r| r[10] = 12); // claim bzip2
        let fs = open(&path, 1 << 20);
        let e = fs.read(fs.resolve(b"f").unwrap(), 0, 10).unwrap_err();
        assert!(e.to_string().contains("bzip2"), "{e}");

        // Compressed size cut short: the stream runs out of input.
        let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
        let path = dir.path().join("t.zip");
        patch_cd(&path, |r| r[20..24].copy_from_slice(&100u32.to_le_bytes()));
        let fs = open(&path, 1 << 20);
        let e = fs.read(fs.resolve(b"f").unwrap(), 0, 200_000).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
    }

    fn packed(files: &[(&str, &[u8])], frame_size: usize) -> (tempfile::TempDir, PkgFs) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for (name, data) in files {
            let p = src.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, data).unwrap();
        }
        let out = dir.path().join("p.tar.zst");
        crate::tools::pack::pack(&crate::tools::pack::PackConfig {
            dir: src,
            output: out.clone(),
            level: 3,
            threads: 2,
            frame_size,
            mtime_clamp: None,
            owner: None,
            follow: crate::tools::pack::Follow::Never,
        })
        .unwrap();
        let fs = open(&out, 64 << 20);
        (dir, fs)
    }

    #[test]
    fn frames_the_kernel_holds_leave_the_cache() {
        // 48 files of about 300 KB, three to a frame of 1 MiB: 14 MB, beyond the grace.
        let files: Vec<(String, Vec<u8>)> = (0..48)
            .map(|i| (format!("d/f{i:02}"), data(300_000 + i * 7)))
            .collect();
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let (_d, fs) = packed(&refs, 1 << 20);
        let v = fs.view();
        let table = v.layers[0].archive.table.as_ref().unwrap();
        let total: usize = files.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(table.file_bytes.len(), table.frames.len());
        assert_eq!(
            table.file_bytes.iter().map(|&b| b as usize).sum::<usize>(),
            total,
            "every file byte is in one frame"
        );
        assert!(
            table
                .file_bytes
                .iter()
                .zip(&table.frames)
                .all(|(&b, f)| b < f.dsize)
        );
        let inos: Vec<u64> = files
            .iter()
            .map(|(n, d)| {
                let ino = fs.resolve(n.as_bytes()).unwrap();
                assert!(fs.read(ino, 0, d.len() as u32).unwrap() == *d);
                ino
            })
            .collect();
        let cache = fs.reader().cache();
        let cached = cache.bytes();
        assert!(cached as usize > total);
        // Half of every file given: no frame is whole.
        for ((_, d), &ino) in files.iter().zip(&inos) {
            fs.delivered(ino, 0, d.len() as u64 / 2);
        }
        assert_eq!(cache.stats.released.load(Relaxed), 0);
        assert_eq!(cache.bytes(), cached);
        // The other halves: every frame is, and all but the grace leave.
        for ((_, d), &ino) in files.iter().zip(&inos) {
            let half = d.len() as u64 / 2;
            fs.delivered(ino, half, d.len() as u64 - half);
        }
        assert!(cache.stats.released.load(Relaxed) > 0);
        assert!(
            cache.bytes() <= crate::read::cache::RELEASE_GRACE + (2 << 20),
            "{} bytes still cached",
            cache.bytes()
        );
        // Dropped frames are decoded again when asked for.
        for ((_, d), &ino) in files.iter().zip(&inos) {
            assert!(fs.read(ino, 0, d.len() as u32).unwrap() == *d);
        }
    }

    #[test]
    fn seekable_random_reads_decode_only_the_frames_they_need() {
        let big = data(40 * 65536 + 77);
        let (_d, fs) = packed(&[("big.bin", &big), ("small.txt", b"small")], 65536);
        let ino = fs.resolve(b"big.bin").unwrap();
        let s = &fs.reader().stats;
        let mut expected_frames = 0;
        for off in [1_000_000u64, 5, 2_000_000, 65536 * 7 - 10, 2_500_000] {
            let before = s.blocks_decoded.load(Relaxed);
            let got = fs.read(ino, off, 4096).unwrap();
            assert_eq!(got, &big[off as usize..off as usize + 4096]);
            let used = s.blocks_decoded.load(Relaxed) - before;
            assert!(
                (1..=2).contains(&used),
                "a 4 KiB read decoded {used} frames"
            );
            expected_frames += used;
        }
        assert!(s.decompressed_bytes.load(Relaxed) <= expected_frames * 65536);
        // A small file sits in one frame: one decode, then cached.
        let small = fs.resolve(b"small.txt").unwrap();
        let before = s.blocks_decoded.load(Relaxed);
        assert_eq!(fs.read(small, 0, 100).unwrap(), b"small");
        assert_eq!(fs.read(small, 0, 100).unwrap(), b"small");
        assert!(s.blocks_decoded.load(Relaxed) - before <= 1);
    }

    #[test]
    fn corrupt_seekable_archives_fail_cleanly() {
        let big = data(10 * 65536);
        let (dir, _) = packed(&[("big.bin", &big)], 65536);
        let path = dir.path().join("p.tar.zst");
        let good = std::fs::read(&path).unwrap();

        // A damaged frame: reads that need it fail with EIO, the others still work.
        let mut bytes = good.clone();
        bytes[200] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let fs = open(&path, 1 << 20);
        let ino = fs.resolve(b"big.bin").unwrap();
        assert_eq!(fs.read(ino, 0, 100).unwrap_err().errno(), libc::EIO);
        assert_eq!(
            fs.read(ino, 9 * 65536, 100).unwrap(),
            &big[9 * 65536..9 * 65536 + 100]
        );

        // Truncated, or a seek table that disagrees with the file: the archive is refused.
        for cut in [good.len() - 3, good.len() / 2, 100] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(format::open(&path, None).is_err(), "cut at {cut}");
        }
        let mut bytes = good.clone();
        let n = bytes.len();
        bytes[n - 17..n - 13].copy_from_slice(&u32::MAX.to_le_bytes()); // last frame's csize
        std::fs::write(&path, &bytes).unwrap();
        assert!(format::open(&path, None).is_err());
    }

    #[test]
    fn check_compares_the_index_with_the_tar_stream() {
        let (dir, fs) = packed(&[("a.txt", b"aaa"), ("b/c.txt", b"ccc")], 65536);
        let path = dir.path().join("p.tar.zst");
        let idx = format::open(&path, None).ok().unwrap();
        let view = fs.view();
        let a = &view.layers[0].archive;
        assert!(format::verify_seekable(a, &idx.entries).unwrap().is_empty());
        let mut lying = idx.entries.clone();
        let f = lying.iter_mut().find(|e| e.path == b"a.txt").unwrap();
        f.data = format::DataRef::Seekable { offset: 0 };
        let problems = format::verify_seekable(a, &lying).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn overlapping_entries_are_refused() {
        // Point the second entry's local header offset at the first entry's header: the
        // overlapping-zip-bomb trick. Its read fails; the first entry still reads.
        let (dir, _) = build(
            &[
                ("first", ::zip::CompressionMethod::Deflated, &data(1000)),
                ("other", ::zip::CompressionMethod::Deflated, &data(2000)),
            ],
            1 << 20,
        );
        let path = dir.path().join("t.zip");
        let mut bytes = std::fs::read(&path).unwrap();
        let cds: Vec<usize> = bytes
            .windows(4)
            .enumerate()
            .filter(|(_, w)| *w == b"PK\x01\x02")
            .map(|(i, _)| i)
            .collect();
        let first_offset = bytes[cds[0] + 42..cds[0] + 46].to_vec();
        bytes[cds[1] + 42..cds[1] + 46].copy_from_slice(&first_offset);
        std::fs::write(&path, &bytes).unwrap();
        let fs = open(&path, 1 << 20);
        let e = fs.read(fs.resolve(b"other").unwrap(), 0, 10).unwrap_err();
        assert!(e.to_string().contains("overlapping"), "{e}");
        assert_eq!(
            fs.read(fs.resolve(b"first").unwrap(), 0, 10).unwrap(),
            &data(1000)[..10]
        );
    }
}
