//! A persistent cache of byte ranges of remote objects, on local disk.
//!
//! Remote reads ([`super::remote::RemoteBlob`]) look here before they fetch and store
//! what they fetched, so a second mount (or the same one after a restart, or another
//! mount on the machine sharing the directory) reads the indexes and the files it read
//! before from local disk, and keeps serving them while the server is down.
//!
//! Layout: `DIR/v1/HH/KEY/START-LEN`, one file per fetched range. KEY is the SHA-256
//! of the object's version (its URL, ETag, size and modification time), so a replaced
//! object never meets the ranges of the old one: those age out. Each file is the bytes
//! followed by a trailer (magic, length, CRC-32 of the bytes).
//!
//! - **Crash-safe.** A range is written to a hidden temporary file and renamed into
//!   place; the first time a process uses a file it checks the length and the CRC, so a
//!   file torn by a crash (renamed before its blocks reached the disk) is dropped and
//!   fetched again, never served.
//! - **Shared.** Files are immutable once named, and the same name always holds the
//!   same bytes, so mounts share the directory without locks: a range another mount
//!   stored is found by listing the object's directory again on a miss; a file another
//!   mount evicted is a miss.
//! - **A byte budget, LRU.** A file's mtime is its last use (set when a process first
//!   uses it, and when it is stored). When the bytes on disk pass the budget, the
//!   oldest files go until 90% of it is left. The bytes already on disk are counted by
//!   a thread of their own when the cache is opened, so a mount does not wait for a
//!   walk of a large cache; until that count is in, nothing is evicted.
//! - **Not a lock on the read path.** Listing an object's directory and checking a file
//!   happen outside the cache's lock, so the index threads of a mount read from disk in
//!   parallel.
//! - **Not a write on the read path.** A fetched range is handed to a writer thread
//!   ([`DiskCache::store_later`]; up to [`PENDING_BYTES`] waiting, beyond that the
//!   caller writes) and served from that queue until it is on disk: creating a file is
//!   a filesystem's slow operation (0.5 ms and more on ext4 after many deletions), and a
//!   remote mount of 609 archives creates over a thousand.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::Result;

/// Trailer: magic, length (u64 LE), CRC-32 of the bytes (u32 LE), 4 zero bytes.
const MAGIC: &[u8; 8] = b"pkgfsRC1";
const TRAILER: u64 = 24;
/// Open files kept per process.
const OPEN_FILES: usize = 128;
/// Temporary files older than this are left by a crash: removed when evicting.
const STALE_TMP: Duration = Duration::from_secs(3600);
/// Bytes waiting for the writer at most: past that, a range is written by its caller.
pub const PENDING_BYTES: u64 = 64 << 20;
/// The writer thread ends after this long with nothing to write (a new one starts when
/// there is).
const WRITER_IDLE: Duration = Duration::from_secs(2);

/// Ranges waiting to be written.
#[derive(Debug, Default)]
struct Pending {
    /// (key, start, bytes), oldest first; the front is being written.
    queue: std::collections::VecDeque<(String, u64, bytes::Bytes)>,
    /// The bytes in `queue`.
    bytes: u64,
    /// Whether a writer thread is running.
    writer: bool,
}

/// Counters for `pkgfs status`.
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Reads served from disk.
    pub hits: AtomicU64,
    /// Reads that were not (fully) on disk.
    pub misses: AtomicU64,
    /// Bytes served from disk.
    pub bytes_read: AtomicU64,
    /// Bytes stored.
    pub bytes_stored: AtomicU64,
    /// Files dropped because their length or CRC was wrong.
    pub torn: AtomicU64,
    /// Files evicted to keep the budget.
    pub evicted: AtomicU64,
}

/// One stored range.
#[derive(Debug, Clone)]
struct Extent {
    start: u64,
    len: u64,
}

impl Extent {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

#[derive(Debug, Default)]
struct State {
    /// The ranges known per object key, sorted by start.
    objects: HashMap<String, Vec<Extent>>,
    /// Files this process checked (and touched), open.
    open: Option<lru::LruCache<PathBuf, Arc<File>>>,
    /// Bytes on disk, as last counted plus what this process stored since.
    total: u64,
    /// Whether the count of what was on disk at open is in `total` yet.
    counted: bool,
    /// Files this process stored before that count was in (the walk may or may not
    /// have seen them).
    uncounted: Vec<(PathBuf, u64)>,
}

/// The cache directory, its budget and what this process knows of it.
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    budget: u64,
    state: Mutex<State>,
    /// Signalled when the count at open is in.
    counted: Condvar,
    tmp_counter: AtomicU64,
    /// Ranges handed to [`DiskCache::store_later`] and not written yet.
    pending: Mutex<Pending>,
    /// Signalled when a range is queued, and when the queue is empty.
    pending_changed: Condvar,
    /// Held by the writer while it writes a queued range, and by [`DiskCache::forget`]:
    /// a range is never written after its object was forgotten.
    writing: Mutex<()>,
    /// Counters.
    pub stats: DiskStats,
}

/// The caches this process opened, for [`flush_all`].
static OPENED: Mutex<Vec<std::sync::Weak<DiskCache>>> = Mutex::new(Vec::new());

/// Write what every disk cache of this process still holds for its writer: before the
/// process exits.
pub fn flush_all() {
    let opened: Vec<Arc<DiskCache>> = crate::sync::lock(&OPENED)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    for c in opened {
        c.flush();
    }
}

impl DiskCache {
    /// `$XDG_CACHE_HOME/pkgfs/remote`, or `~/.cache/pkgfs/remote`.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("pkgfs").join("remote"))
    }

    /// The cache in `dir` (made if missing) with a budget of `budget` bytes. A thread
    /// (`pkgfs-dcount`) counts the bytes already there, and evicts if they pass the
    /// budget; [`DiskCache::size`] waits for that count.
    pub fn open(dir: &Path, budget: u64) -> Result<Arc<DiskCache>> {
        let root = dir.join("v1");
        fs::create_dir_all(&root)?;
        let cache = Arc::new(DiskCache {
            root,
            budget,
            state: Mutex::new(State {
                objects: HashMap::new(),
                open: Some(lru::LruCache::new(
                    std::num::NonZeroUsize::new(OPEN_FILES).unwrap_or(std::num::NonZeroUsize::MIN),
                )),
                total: 0,
                counted: false,
                uncounted: Vec::new(),
            }),
            counted: Condvar::new(),
            tmp_counter: AtomicU64::new(0),
            pending: Mutex::default(),
            pending_changed: Condvar::new(),
            writing: Mutex::new(()),
            stats: DiskStats::default(),
        });
        let weak = Arc::downgrade(&cache);
        {
            let mut opened = crate::sync::lock(&OPENED);
            opened.retain(|w| w.strong_count() > 0);
            opened.push(weak.clone());
        }
        let root = cache.root.clone();
        std::thread::Builder::new()
            .name("pkgfs-dcount".into())
            .spawn(move || {
                let found = walk(&root);
                let Some(cache) = weak.upgrade() else { return };
                let over = {
                    let mut st = cache.lock();
                    // What was found, and what this process stored meanwhile that the
                    // walk did not see.
                    let seen: std::collections::HashSet<&Path> =
                        found.iter().map(|f| f.path.as_path()).collect();
                    let missed: u64 = st
                        .uncounted
                        .iter()
                        .filter(|(p, _)| !seen.contains(p.as_path()))
                        .map(|(_, n)| n)
                        .sum();
                    // A temporary file is a store under way (its range is counted by
                    // its process once renamed) or a stale one `evict` removes: neither
                    // is a range on disk.
                    let ranges: u64 = found.iter().filter(|f| !f.tmp).map(|f| f.size).sum();
                    st.total = ranges + missed;
                    st.total > cache.budget
                };
                if over {
                    cache.evict();
                }
                let mut st = cache.lock();
                st.uncounted = Vec::new();
                st.counted = true;
                drop(st);
                cache.counted.notify_all();
            })?;
        Ok(cache)
    }

    /// The directory given at open.
    pub fn dir(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }

    /// The budget, bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes on disk (as this process last counted, plus what it stored since).
    pub fn size(&self) -> u64 {
        self.wait_counted().total
    }

    /// The state, once the count at open is in.
    fn wait_counted(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.lock();
        while !st.counted {
            st = crate::sync::wait(&self.counted, st);
        }
        st
    }

    /// The key of an object version.
    pub fn key(version: &str) -> String {
        let d = Sha256::digest(version.as_bytes());
        d.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    fn object_dir(&self, key: &str) -> PathBuf {
        self.root.join(&key[..2]).join(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The parts of `[start, end)` the known ranges of `key` do not hold, in order
    /// (without reading anything).
    pub fn holes(&self, key: &str, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.known(key, false);
        let st = self.lock();
        let ext = st.objects.get(key).map_or(&[][..], |v| &v[..]);
        let mut out = Vec::new();
        let mut pos = start;
        while pos < end {
            let upto = ext.partition_point(|e| e.start <= pos);
            match ext[..upto]
                .iter()
                .filter(|e| e.end() > pos)
                .map(Extent::end)
                .max()
            {
                Some(covered) => pos = covered,
                None => {
                    let next = ext[upto..].first().map_or(end, |e| e.start.min(end));
                    out.push((pos, next));
                    pos = next;
                }
            }
        }
        drop(st);
        // Less what waits for the writer.
        let p = crate::sync::lock(&self.pending);
        for (_, s, b) in p.queue.iter().filter(|(k, _, _)| k == key) {
            let (s, e) = (*s, s + b.len() as u64);
            out = out
                .into_iter()
                .flat_map(|(a, z)| {
                    [(a, z.min(s)), (a.max(e), z)]
                        .into_iter()
                        .filter(|(x, y)| x < y)
                })
                .collect();
        }
        out
    }

    /// The length of the range of `key` that starts at 0, if one is kept (a small object
    /// fetched whole: its size, when nothing else says it).
    pub fn head_len(&self, key: &str) -> Option<u64> {
        self.known(key, false);
        self.lock()
            .objects
            .get(key)?
            .iter()
            .filter(|e| e.start == 0)
            .map(|e| e.len)
            .max()
    }

    /// Fill `buf` from the ranges of `key` at `offset`; false (and `buf` unspecified) if
    /// they do not hold all of it.
    pub fn read(&self, key: &str, buf: &mut [u8], offset: u64) -> bool {
        let end = offset + buf.len() as u64;
        if self.read_pending(key, buf, offset) {
            self.stats.hits.fetch_add(1, Relaxed);
            self.stats.bytes_read.fetch_add(buf.len() as u64, Relaxed);
            return true;
        }
        for relist in [false, true] {
            self.known(key, relist);
            let plan = {
                let st = self.lock();
                let Some(ext) = st.objects.get(key) else {
                    continue;
                };
                cover(ext, offset, end)
            };
            let Some(pieces) = plan else { continue };
            match self.read_pieces(key, &pieces, buf, offset) {
                Ok(()) => {
                    self.stats.hits.fetch_add(1, Relaxed);
                    self.stats.bytes_read.fetch_add(buf.len() as u64, Relaxed);
                    return true;
                }
                Err(bad) => {
                    // Gone (evicted by another mount) or torn: forget it and look again.
                    let mut st = self.lock();
                    if let Some(ext) = st.objects.get_mut(key) {
                        ext.retain(|e| e.start != bad.start || e.len != bad.len);
                    }
                }
            }
        }
        self.stats.misses.fetch_add(1, Relaxed);
        false
    }

    /// Make sure the extents of `key` are known, listing its directory (outside the
    /// lock) if they are not or if `relist`.
    fn known(&self, key: &str, relist: bool) {
        if !relist && self.lock().objects.contains_key(key) {
            return;
        }
        let listed = list_object(&self.object_dir(key));
        let mut st = self.lock();
        match st.objects.get_mut(key) {
            // Listed meanwhile by another thread: keep the union (this process may
            // have stored a range after that listing, or after this one).
            Some(have) if !relist => {
                for e in listed {
                    if !have.iter().any(|h| h.start == e.start && h.len == e.len) {
                        let at = have.partition_point(|h| (h.start, h.len) < (e.start, e.len));
                        have.insert(at, e);
                    }
                }
            }
            _ => {
                st.objects.insert(key.to_string(), listed);
            }
        }
    }

    /// Copy the pieces; on failure, the extent that failed.
    fn read_pieces(
        &self,
        key: &str,
        pieces: &[Extent],
        buf: &mut [u8],
        offset: u64,
    ) -> std::result::Result<(), Extent> {
        let dir = self.object_dir(key);
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        for e in pieces {
            let file = self.file(&dir, e).ok_or_else(|| e.clone())?;
            let upto = e.end().min(end);
            let dst = &mut buf[(pos - offset) as usize..(upto - offset) as usize];
            file.read_exact_at(dst, pos - e.start)
                .map_err(|_| e.clone())?;
            pos = upto;
        }
        Ok(())
    }

    /// The open file of an extent, checked (length, CRC) and touched on first use.
    fn file(&self, dir: &Path, e: &Extent) -> Option<Arc<File>> {
        let path = dir.join(format!("{}-{}", e.start, e.len));
        if let Some(f) = self
            .lock()
            .open
            .as_mut()
            .and_then(|o| o.get(&path).cloned())
        {
            return Some(f);
        }
        let f = File::open(&path).ok()?;
        if !intact(&f, e.len) {
            self.stats.torn.fetch_add(1, Relaxed);
            log::warn!("disk cache: {} is torn or damaged; dropped", path.display());
            let _ = fs::remove_file(&path);
            return None;
        }
        let _ = f.set_modified(SystemTime::now());
        let f = Arc::new(f);
        if let Some(o) = self.lock().open.as_mut() {
            o.put(path, f.clone());
        }
        Some(f)
    }

    /// Fill `buf` from a range still waiting for the writer, if one holds all of it.
    fn read_pending(&self, key: &str, buf: &mut [u8], offset: u64) -> bool {
        let end = offset + buf.len() as u64;
        let p = crate::sync::lock(&self.pending);
        let found = p
            .queue
            .iter()
            .rev()
            .find(|(k, s, b)| k == key && *s <= offset && s + b.len() as u64 >= end);
        match found {
            Some((_, s, b)) => {
                let at = (offset - s) as usize;
                buf.copy_from_slice(&b[at..at + buf.len()]);
                true
            }
            None => false,
        }
    }

    /// Keep `bytes`, the range of `key` at `start`, written by a thread of the cache's
    /// own (served from memory until then); by the caller if [`PENDING_BYTES`] already
    /// wait, or if no thread can be started. Errors are logged.
    pub fn store_later(self: &Arc<Self>, key: &str, start: u64, bytes: bytes::Bytes) {
        let len = bytes.len() as u64;
        let mut p = crate::sync::lock(&self.pending);
        if p.bytes + len > PENDING_BYTES {
            drop(p);
            self.store_logged(key, start, &bytes);
            return;
        }
        p.queue.push_back((key.to_string(), start, bytes));
        p.bytes += len;
        if !p.writer {
            let me = self.clone();
            let started = std::thread::Builder::new()
                .name("pkgfs-dwrite".into())
                .spawn(move || me.write_pending());
            match started {
                Ok(_) => p.writer = true,
                Err(e) => {
                    log::debug!("disk cache: no writer thread ({e}); writing in place");
                    let (k, s, b) = p.queue.pop_back().unwrap_or_default();
                    p.bytes -= len;
                    drop(p);
                    self.store_logged(&k, s, &b);
                    return;
                }
            }
        }
        self.pending_changed.notify_all();
    }

    fn store_logged(&self, key: &str, start: u64, bytes: &[u8]) {
        if let Err(e) = self.store(key, start, bytes) {
            log::warn!("disk cache: keeping {} bytes at {start}: {e}", bytes.len());
        }
    }

    /// The writer thread: write queued ranges, oldest first, until idle.
    fn write_pending(&self) {
        loop {
            let mut p = crate::sync::lock(&self.pending);
            while p.queue.is_empty() {
                self.pending_changed.notify_all();
                let (g, timed_out) =
                    crate::sync::wait_timeout(&self.pending_changed, p, WRITER_IDLE);
                p = g;
                if timed_out && p.queue.is_empty() {
                    p.writer = false;
                    return;
                }
            }
            drop(p);
            let _w = crate::sync::lock(&self.writing);
            // The front again: `forget` may have dropped it meanwhile.
            let front = crate::sync::lock(&self.pending).queue.front().cloned();
            let Some((key, start, bytes)) = front else {
                continue;
            };
            self.store_logged(&key, start, &bytes);
            let mut p = crate::sync::lock(&self.pending);
            p.queue.pop_front();
            p.bytes -= bytes.len() as u64;
        }
    }

    /// Wait until every range handed to [`DiskCache::store_later`] is written.
    pub fn flush(&self) {
        let mut p = crate::sync::lock(&self.pending);
        while !p.queue.is_empty() {
            p = crate::sync::wait(&self.pending_changed, p);
        }
    }

    /// Keep `bytes`, the range of `key` at `start`.
    pub fn store(&self, key: &str, start: u64, bytes: &[u8]) -> Result<()> {
        let dir = self.object_dir(key);
        fs::create_dir_all(&dir)?;
        let len = bytes.len() as u64;
        let tmp = dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Relaxed)
        ));
        let path = dir.join(format!("{start}-{len}"));
        // Counted before it is named: the count at open either sees the file or finds
        // it in `uncounted`, never both.
        {
            let mut st = self.lock();
            st.total += len + TRAILER;
            if !st.counted {
                st.uncounted.push((path.clone(), len + TRAILER));
            }
        }
        let written = (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            let mut t = Vec::with_capacity(TRAILER as usize);
            t.extend_from_slice(MAGIC);
            t.extend_from_slice(&len.to_le_bytes());
            t.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
            t.extend_from_slice(&[0; 4]);
            f.write_all(&t)?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            let mut st = self.lock();
            st.total = st.total.saturating_sub(len + TRAILER);
            st.uncounted.retain(|(p, _)| *p != path);
            return Err(e.into());
        }
        self.stats.bytes_stored.fetch_add(len, Relaxed);
        let over = {
            let mut st = self.lock();
            if let Some(ext) = st.objects.get_mut(key) {
                let at = ext.partition_point(|e| e.start < start);
                ext.insert(at, Extent { start, len });
            }
            st.counted && st.total > self.budget
        };
        if over {
            self.evict();
        }
        Ok(())
    }

    /// Drop every range of `key`: its bytes proved wrong (a layer that fails its digest),
    /// so no later read, in this process or another, may find them.
    pub fn forget(&self, key: &str) {
        let _w = crate::sync::lock(&self.writing);
        {
            let mut p = crate::sync::lock(&self.pending);
            let before = p.bytes;
            p.queue.retain(|(k, _, _)| k != key);
            p.bytes = p.queue.iter().map(|(_, _, b)| b.len() as u64).sum();
            if p.bytes != before && p.queue.is_empty() {
                self.pending_changed.notify_all();
            }
        }
        let dir = self.object_dir(key);
        let mut freed = 0;
        for e in list_object(&dir) {
            let f = dir.join(format!("{}-{}", e.start, e.len));
            if let Ok(m) = fs::metadata(&f)
                && fs::remove_file(&f).is_ok()
            {
                freed += m.len();
            }
        }
        let _ = fs::remove_dir(&dir);
        let mut st = self.lock();
        st.objects.remove(key);
        st.total = st.total.saturating_sub(freed);
        if let Some(o) = st.open.as_mut() {
            o.clear();
        }
    }

    /// Remove the least recently used files until 90% of the budget is left.
    pub fn evict(&self) {
        let mut files = walk(&self.root);
        let now = SystemTime::now();
        files.retain(|f| {
            if f.tmp {
                if now.duration_since(f.mtime).unwrap_or_default() > STALE_TMP {
                    let _ = fs::remove_file(&f.path);
                }
                return false;
            }
            true
        });
        files.sort_by_key(|f| f.mtime);
        let mut total: u64 = files.iter().map(|f| f.size).sum();
        let target = self.budget / 10 * 9;
        let mut evicted = 0;
        for f in &files {
            if total <= target {
                break;
            }
            if fs::remove_file(&f.path).is_ok() {
                total = total.saturating_sub(f.size);
                evicted += 1;
                if let Some(d) = f.path.parent() {
                    let _ = fs::remove_dir(d); // only if now empty
                }
            }
        }
        self.stats.evicted.fetch_add(evicted, Relaxed);
        let mut st = self.lock();
        st.total = total;
        st.objects.clear();
        if let Some(o) = st.open.as_mut() {
            o.clear();
        }
    }
}

/// The extents of `dir` (names `START-LEN`), sorted.
fn list_object(dir: &Path) -> Vec<Extent> {
    let mut out: Vec<Extent> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let (s, l) = name.to_str()?.split_once('-')?;
            Some(Extent {
                start: s.parse().ok()?,
                len: l.parse().ok()?,
            })
        })
        .collect();
    out.sort_by_key(|e| (e.start, e.len));
    out
}

/// Extents covering `[offset, end)` in order, if the known ones do.
fn cover(ext: &[Extent], offset: u64, end: u64) -> Option<Vec<Extent>> {
    let mut out = Vec::new();
    let mut pos = offset;
    while pos < end {
        // Of the extents starting at or before pos, the one reaching furthest.
        let upto = ext.partition_point(|e| e.start <= pos);
        let best = ext[..upto]
            .iter()
            .filter(|e| e.end() > pos)
            .max_by_key(|e| e.end())?;
        out.push(best.clone());
        pos = best.end();
    }
    Some(out)
}

/// Whether the file holds `len` bytes and a trailer that matches them.
fn intact(f: &File, len: u64) -> bool {
    let Ok(meta) = f.metadata() else { return false };
    if meta.len() != len + TRAILER {
        return false;
    }
    let mut t = [0u8; TRAILER as usize];
    if f.read_exact_at(&mut t, len).is_err() || &t[..8] != MAGIC {
        return false;
    }
    if t[8..16] != len.to_le_bytes() {
        return false;
    }
    let want = u32::from_le_bytes([t[16], t[17], t[18], t[19]]);
    let mut h = crc32fast::Hasher::new();
    // Most files are small (an index, a tail): a small buffer, not a fresh mapping each.
    let mut buf = vec![0u8; len.min(64 << 10) as usize];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        if f.read_exact_at(&mut buf[..n], pos).is_err() {
            return false;
        }
        h.update(&buf[..n]);
        pos += n as u64;
    }
    h.finalize() == want
}

struct Found {
    path: PathBuf,
    size: u64,
    mtime: SystemTime,
    tmp: bool,
}

/// Every file under `root` (`HH/KEY/NAME`).
fn walk(root: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    let entries = |d: &Path| fs::read_dir(d).into_iter().flatten().flatten();
    for hh in entries(root) {
        for obj in entries(&hh.path()) {
            for f in entries(&obj.path()) {
                let Ok(m) = f.metadata() else { continue };
                if !m.is_file() {
                    continue;
                }
                out.push(Found {
                    tmp: f.file_name().as_encoded_bytes().starts_with(b".tmp-"),
                    path: f.path(),
                    size: m.len(),
                    mtime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn ranges_are_served_whole_or_across_extents_and_shared() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 1 << 30).unwrap();
        assert_eq!(c.size(), 0, "counted at open");
        let k = DiskCache::key("http://h/a.zip etag 3 0");
        let obj = bytes(40_000, 7);
        let mut buf = vec![0; 100];
        assert!(!c.read(&k, &mut buf, 0), "empty");
        c.store(&k, 0, &obj[..8192]).unwrap();
        c.store(&k, 8192, &obj[8192..20_000]).unwrap();
        assert!(c.read(&k, &mut buf, 10));
        assert_eq!(buf, obj[10..110]);
        let mut span = vec![0; 10_000];
        assert!(c.read(&k, &mut span, 5000), "across two extents");
        assert_eq!(span, obj[5000..15_000]);
        assert!(!c.read(&k, &mut span, 15_000), "past what is stored");
        assert_eq!(c.holes(&k, 100, 30_000), [(20_000, 30_000)]);
        assert_eq!(c.holes(&k, 0, 20_000), []);
        c.store(&k, 25_000, &obj[25_000..26_000]).unwrap();
        assert_eq!(
            c.holes(&k, 19_000, 40_000),
            [(20_000, 25_000), (26_000, 40_000)]
        );
        // Another process (another DiskCache on the directory) sees the ranges, and
        // this one sees what the other stores after it listed.
        let other = DiskCache::open(d.path(), 1 << 30).unwrap();
        assert!(other.read(&k, &mut buf, 19_000));
        assert_eq!(buf, obj[19_000..19_100]);
        other.store(&k, 20_000, &obj[20_000..]).unwrap();
        assert!(c.read(&k, &mut span, 25_000));
        assert_eq!(span, obj[25_000..35_000]);
        assert_eq!(c.size(), 21_000 + 3 * TRAILER, "what this one counted");
        assert_eq!(
            DiskCache::open(d.path(), 1 << 30).unwrap().size(),
            41_000 + 4 * TRAILER
        );
        // A different version of the object is a different key.
        let k2 = DiskCache::key("http://h/a.zip etag2 3 0");
        assert!(!c.read(&k2, &mut buf, 0));
    }

    #[test]
    fn ranges_stored_later_are_served_at_once_and_written_by_the_flush() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 1 << 30).unwrap();
        let k = DiskCache::key("http://h/later.zip etag 3 0");
        let obj = bytes(30_000, 3);
        // Held by the writer until the test lets it write: served from the queue.
        let hold = crate::sync::lock(&c.writing);
        c.store_later(&k, 0, bytes::Bytes::from(obj[..10_000].to_vec()));
        c.store_later(&k, 10_000, bytes::Bytes::from(obj[10_000..].to_vec()));
        let mut buf = vec![0; 5000];
        assert!(c.read(&k, &mut buf, 12_000), "served before it is written");
        assert_eq!(c.holes(&k, 0, 40_000), [(30_000, 40_000)]);
        assert_eq!(buf, obj[12_000..17_000]);
        let other = DiskCache::open(d.path(), 1 << 30).unwrap();
        assert!(!other.read(&k, &mut buf, 12_000), "not on disk yet");
        drop(hold);
        flush_all();
        assert!(crate::sync::lock(&c.pending).queue.is_empty());
        assert!(other.read(&k, &mut buf, 12_000), "on disk after the flush");
        assert_eq!(buf, obj[12_000..17_000]);
        assert_eq!(c.stats.bytes_stored.load(Relaxed), 30_000);
    }

    #[test]
    fn a_forgotten_object_is_not_written_later() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 1 << 30).unwrap();
        let (bad, good) = (DiskCache::key("bad"), DiskCache::key("good"));
        let hold = crate::sync::lock(&c.writing);
        for i in 0..4u64 {
            c.store_later(&bad, i * 100, bytes::Bytes::from(bytes(100, 1)));
        }
        c.store_later(&good, 0, bytes::Bytes::from(bytes(100, 2)));
        // `forget` waits for the write under way, then drops what waits.
        let forgetting = {
            let c = c.clone();
            let bad = bad.clone();
            std::thread::spawn(move || c.forget(&bad))
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(hold);
        forgetting.join().unwrap();
        c.flush();
        let other = DiskCache::open(d.path(), 1 << 30).unwrap();
        let mut buf = vec![0; 100];
        for i in 0..4u64 {
            assert!(!other.read(&bad, &mut buf, i * 100), "range {i} written");
        }
        assert!(other.read(&good, &mut buf, 0));
        assert_eq!(buf, bytes(100, 2));
    }

    #[test]
    fn what_is_stored_while_counting_is_counted_once() {
        let d = tempfile::tempdir().unwrap();
        let first = DiskCache::open(d.path(), 1 << 30).unwrap();
        for i in 0..300 {
            first
                .store(&DiskCache::key(&format!("o{i}")), 0, &bytes(100, 1))
                .unwrap();
        }
        // A store under way in another process (or cut short): its temporary file is
        // not a range and is not counted, whenever the count comes across it.
        let tmp_dir = first.object_dir(&DiskCache::key("o0"));
        fs::write(tmp_dir.join(".tmp-1-1"), bytes(1000, 3)).unwrap();
        // Stores race the count of the 300 files at open, whichever way it goes.
        let c = DiskCache::open(d.path(), 1 << 30).unwrap();
        for i in 0..5 {
            c.store(&DiskCache::key("new"), i * 1000, &bytes(1000, 2))
                .unwrap();
        }
        assert_eq!(c.size(), 300 * (100 + TRAILER) + 5 * (1000 + TRAILER));
    }

    #[test]
    fn torn_and_damaged_files_are_never_served() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 1 << 30).unwrap();
        let k = DiskCache::key("v");
        let obj = bytes(10_000, 1);
        c.store(&k, 0, &obj[..4096]).unwrap();
        c.store(&k, 4096, &obj[4096..]).unwrap();
        let dir = c.object_dir(&k);
        // A crash after the rename, before the data reached the disk: short file.
        let f = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("0-4096"))
            .unwrap();
        f.set_len(1000).unwrap();
        // And a flipped byte in the other.
        let p = dir.join(format!("4096-{}", 10_000 - 4096));
        let mut b = fs::read(&p).unwrap();
        b[17] ^= 1;
        fs::write(&p, b).unwrap();
        let fresh = DiskCache::open(d.path(), 1 << 30).unwrap();
        let mut buf = vec![0; 100];
        assert!(!fresh.read(&k, &mut buf, 0));
        assert!(!fresh.read(&k, &mut buf, 5000));
        assert_eq!(fresh.stats.torn.load(Relaxed), 2);
        assert!(!dir.join("0-4096").exists(), "dropped");
        // Stored again, it serves.
        fresh.store(&k, 0, &obj[..4096]).unwrap();
        assert!(fresh.read(&k, &mut buf, 0));
        assert_eq!(buf, obj[..100]);
        // A temporary file (a write cut short) is never an extent.
        fs::write(dir.join(".tmp-1-1"), b"junk").unwrap();
        assert_eq!(list_object(&dir).len(), 1);
    }

    #[test]
    fn the_budget_evicts_the_least_recently_used() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path(), 100_000).unwrap();
        let chunk = bytes(20_000, 3);
        let keys: Vec<String> = (0..4).map(|i| DiskCache::key(&format!("o{i}"))).collect();
        for (i, k) in keys.iter().enumerate() {
            c.store(k, 0, &chunk).unwrap();
            // Distinct mtimes, oldest first.
            let p = c.object_dir(k).join("0-20000");
            let f = File::options().write(true).open(&p).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + i as u64))
                .unwrap();
        }
        // Using o0 makes it the newest (first use by a process touches it).
        let mut buf = vec![0; 10];
        let fresh = DiskCache::open(d.path(), 100_000).unwrap();
        assert_eq!(fresh.size(), 4 * (20_000 + TRAILER), "counted at open");
        assert!(fresh.read(&keys[0], &mut buf, 0));
        // A fifth file passes the budget: the oldest (o1) goes, down to 90 000 bytes.
        fresh.store(&DiskCache::key("o4"), 0, &chunk).unwrap();
        assert!(fresh.size() <= 90_000, "{}", fresh.size());
        let mut buf = vec![0; 10];
        assert!(fresh.read(&keys[0], &mut buf, 0), "recently used stays");
        assert!(!fresh.read(&keys[1], &mut buf, 0), "oldest went");
        assert!(fresh.read(&keys[2], &mut buf, 0));
        assert!(fresh.read(&keys[3], &mut buf, 0));
        assert_eq!(fresh.stats.evicted.load(Relaxed), 1);
        // The first process's view: it finds the evicted ones missing, no error.
        assert!(!c.read(&keys[1], &mut buf, 0));
        // Opened with a smaller budget, the cache is brought under it by the count at
        // open, before anything is stored.
        let small = DiskCache::open(d.path(), 50_000).unwrap();
        assert!(small.size() <= 45_000, "{}", small.size());
        assert_eq!(small.stats.evicted.load(Relaxed), 2);
        // Used last: o4 (stored), then o0, o2, o3 (read above): o4 and o0 went.
        assert!(small.read(&keys[3], &mut buf, 0), "the newest stays");
        assert!(small.read(&keys[2], &mut buf, 0));
        assert!(!small.read(&keys[0], &mut buf, 0));
    }
}
