//! Byte sources: positional reads of one immutable object.
//!
//! Every archive is read through a [`Blob`]: a local file ([`LocalFile`]), a range of
//! another blob ([`Slice`]: a layer inside an image archive), and whatever a source
//! brings (an object on a server). Formats only ever ask for exact byte ranges, so they
//! never know which it is.
//!
//! A blob stands for one version of an object. If the object changes under a mount, reads
//! fail ([`Error::Corrupt`]) rather than serve bytes of another version at the offsets of
//! the old index: a local file is checked after every read (size and modification time,
//! with `fstat` on the open descriptor), and a reopened one must be the same file (device
//! and inode).
//!
//! Local files share a descriptor budget: the soft `RLIMIT_NOFILE` less a reserve. Beyond
//! it, the least recently used files are closed and reopened by path on their next read,
//! so ten thousand packages fit under a limit of a thousand descriptors; a file only an
//! older generation of a live mount still uses is pinned open (its path may already name
//! another file, or none).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use lru::LruCache;

use crate::error::{Error, Result};
use crate::sync::lock;

/// Positional reads of one version of an immutable object.
pub trait Blob: Send + Sync + std::fmt::Debug {
    /// How the object is named in messages: a path, a URL, `image.tar:blobs/sha256/…`.
    fn name(&self) -> &Path;
    /// Its size in bytes.
    fn size(&self) -> u64;
    /// Read exactly `buf.len()` bytes at `offset`. A short object is
    /// [`Error::Format`]; an object that changed since this blob was made is
    /// [`Error::Corrupt`].
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Whether each read costs a round trip to a server: read-ahead advice is then
    /// wanted for reads in order too (a local file has the kernel's read-ahead).
    fn round_trips(&self) -> bool {
        false
    }
    /// How much of its end a format reads first (end records, seek tables, a small
    /// archive's whole index): a local file reads 16 KiB in one `pread` for the price of
    /// 4; an object on a server pays for every byte, and asks for less.
    fn first_tail(&self) -> u64 {
        16 * 1024
    }
    /// Several reads (buffer, offset) at once: an object on a server fetches them
    /// concurrently; a file reads them one after the other.
    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<()> {
        for (buf, offset) in reads.iter_mut() {
            self.read_exact_at(buf, *offset)?;
        }
        Ok(())
    }
    /// The ranges (start, end) will be read soon: start fetching them (read-ahead advice,
    /// never an error).
    fn will_need(&self, _ranges: &[(u64, u64)]) {}
    /// The ranges will be read in this order, soon (a start's record, `io::starts`):
    /// fetch them in that order, a few at a time, ahead of the reads. Advice, never an
    /// error; by default [`Blob::will_need`].
    fn fetch_in_order(&self, ranges: &[(u64, u64)]) {
        self.will_need(ranges);
    }
    /// Fetch the whole blob in the background, behind reads: nothing of it is fetched
    /// while a read waits for the source (a layer read lazily, fetched whole so that a
    /// program's later reads wait for no round trip, without slowing the ones it makes
    /// now). Advice, never an error; by default [`Blob::will_need`] of all of it.
    fn fetch_in_background(&self) {
        self.will_need(&[(0, self.size())]);
    }
    /// A string that names this version of the object: equal versions have equal bytes.
    /// Caches of indexes are keyed by it; a rescan that finds another version has a new
    /// package.
    fn version(&self) -> &str;
    /// Its modification time, seconds since the epoch (directories an archive implies
    /// take it).
    fn mtime(&self) -> i64;
    /// Keep any resource it holds (an open descriptor) for as long as it lives: it serves
    /// an older generation, and the object may be gone.
    fn pin(&self) {}
    /// A descriptor of its local file, if it is one (a keeper keeps the files of older
    /// generations for the next server: `crate::keeper`).
    fn duplicate_fd(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }
    /// The version of a store's object it is, if it is one (a keeper hands it to the
    /// next server, which opens that version again: `crate::keeper`).
    fn object(&self) -> Option<super::remote::ObjectVersion> {
        None
    }
    /// From now on fetch sparingly: sequential reads grow their fetches to
    /// `sequential` bytes at most, 0 for none (a layer read through a table of contents
    /// or a zTOC with `--no-background-fetch`, where bytes fetched unread are what the
    /// user chose to avoid; a table of contents reads ahead within each file instead).
    fn fetch_sparingly(&self, _sequential: u64) {}
    /// Its bytes proved wrong (they fail the digest they are named by): drop every copy
    /// kept of them (memory, disk cache), so that nothing serves them again and a later
    /// read asks the source afresh.
    fn forget(&self) {}
    /// Bytes fetched from a server for it so far (`None`: not a remote object).
    fn fetched(&self) -> Option<u64> {
        None
    }
    /// From now on keep fetched bytes (in memory, in the disk cache) only as far as
    /// `gate` vouches for them (`--verify`: checked against a seal before any cache
    /// holds them). Blobs that fetch nothing ignore it.
    fn set_keep_gate(&self, _gate: KeepGate) {}
}

/// Says how much of bytes fetched at an offset may be kept: the length of the prefix it
/// vouches for. The flag says whether it may wait (block on the network) to decide; a
/// gate that may not answers 0 when it cannot tell yet.
pub type KeepGate = Arc<dyn Fn(u64, &[u8], bool) -> usize + Send + Sync>;

/// Read exactly `buf.len()` bytes of `file` at `offset`, or fail with a clear error if the
/// file ends first (a truncated archive).
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

/// How many local files may keep a descriptor open: the soft `RLIMIT_NOFILE` less a
/// reserve for FUSE channels, logs and the index cache.
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

/// Descriptor slots [`reserve_descriptor_slots`] grows a process's table to (8 bytes
/// each in the kernel: 64 KiB), or the soft limit if that is lower.
pub const RESERVED_SLOTS: usize = 8192;

/// Grow this process's descriptor table to [`RESERVED_SLOTS`] now, while it has one
/// thread; returns the slots it holds after (`None` if no descriptor was open to copy).
///
/// Why: the kernel's table starts with 64 slots and is grown as descriptors pass its
/// size, and while other threads share it every growth waits for an RCU grace period
/// (`expand_fdtable` calls `synchronize_rcu`), 10–20 ms on a 2-vCPU guest. A mount of
/// 609 packages opens one descriptor each, with its listing's threads running: its
/// 65th descriptor waited 14–21 ms, a third of the cold mount (docs/design/cold-walks.md).
/// A table grown before any thread exists grows at once. Call it after the descriptor
/// limit is raised (the slot must be under the soft limit). Beyond the slots reserved,
/// a mount that opens more descriptors waits a grace period per doubling, as before.
pub fn reserve_descriptor_slots() -> Option<usize> {
    // SAFETY: getrlimit fills a local struct; fcntl(F_DUPFD_CLOEXEC) copies an open
    // descriptor to the lowest free one at or above the slot, which is then closed
    // (nothing else holds it: the process has one thread).
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        let soft = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur
        } else {
            1024
        };
        let slot = RESERVED_SLOTS.min(usize::try_from(soft).unwrap_or(RESERVED_SLOTS)) - 1;
        let slot = libc::c_int::try_from(slot).ok()?;
        let copy = (0..=2).find_map(|fd| {
            let c = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, slot);
            (c >= 0).then_some(c)
        })?;
        libc::close(copy);
    }
    descriptor_slots()
}

/// The descriptor slots this process's table holds now (`FDSize` in
/// `/proc/self/status`).
pub fn descriptor_slots() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The open local files that may be closed to save descriptors, least recently used
/// first, and how many may be open.
struct Descriptors {
    lru: Mutex<LruCache<u32, Weak<LocalFile>>>,
    limit: usize,
}

fn descriptors() -> &'static Descriptors {
    static D: OnceLock<Descriptors> = OnceLock::new();
    D.get_or_init(|| Descriptors {
        lru: Mutex::new(LruCache::unbounded()),
        limit: descriptor_budget(),
    })
}

/// Descriptors closed at once when an open finds none left: the budget is kept one
/// open at a time, so the threads that index and read in parallel (256 for remote
/// sources, and readers) may pass it together, beyond the reserve (a verified mount of
/// 100,000 archives under a limit of 20,000 skipped 440 with `EMFILE`).
const CLOSE_WHEN_OUT: usize = 512;

fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Close the [`CLOSE_WHEN_OUT`] least recently used local files (not `except`); they
/// reopen on their next read.
fn close_least_used(except: Option<u32>) {
    let closing: Vec<Arc<LocalFile>> = {
        let mut lru = lock(&descriptors().lru);
        let mut out = Vec::new();
        let mut kept = None;
        while out.len() < CLOSE_WHEN_OUT {
            match lru.pop_lru() {
                Some((k, w)) if Some(k) == except => kept = Some((k, w)),
                Some((_, w)) => out.extend(w.upgrade()),
                None => break,
            }
        }
        if let Some((k, w)) = kept {
            lru.put(k, w);
        }
        out
    };
    for f in closing {
        f.close();
    }
}

/// A local file, opened once and checked on every read.
#[derive(Debug)]
pub struct LocalFile {
    path: PathBuf,
    /// The open file, when open; reads are positional, so one handle serves every
    /// thread, and an `Arc` keeps it alive for readers while it is being closed.
    file: Mutex<Option<Arc<File>>>,
    /// Device and inode.
    id: (u64, u64),
    size: u64,
    /// Modification time (seconds, nanoseconds) when opened: a write changes it. Not the
    /// ctime: renaming or deleting a package changes its ctime but not its bytes, and
    /// must not break reads.
    mtime_ns: (i64, i64),
    version: String,
    /// Number in the descriptor budget's list.
    key: u32,
    /// Never closed to save descriptors.
    pinned: AtomicBool,
    /// Handle on itself, for the descriptor list.
    me: Weak<LocalFile>,
}

static NEXT_FILE: AtomicU32 = AtomicU32::new(0);

/// The version string of a local file: device, inode, size and modification time.
pub fn local_version(meta: &std::fs::Metadata) -> String {
    format!(
        "{:x}-{:x}-{:x}-{}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    )
}

impl LocalFile {
    /// Open `path`. Fails for anything but a regular file (or a link to one).
    pub fn open(path: &Path) -> Result<Arc<LocalFile>> {
        let file = match File::open(path) {
            Err(e) if out_of_descriptors(&e) => {
                close_least_used(None);
                File::open(path)?
            }
            r => r?,
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(Error::Format("not a regular file".into()));
        }
        let lf = Arc::new_cyclic(|me| LocalFile {
            path: path.to_path_buf(),
            file: Mutex::new(Some(Arc::new(file))),
            id: (meta.dev(), meta.ino()),
            size: meta.len(),
            mtime_ns: (meta.mtime(), meta.mtime_nsec()),
            version: local_version(&meta),
            key: NEXT_FILE.fetch_add(1, Ordering::Relaxed),
            pinned: AtomicBool::new(false),
            me: me.clone(),
        });
        lf.track(true);
        Ok(lf)
    }

    /// Note a use of the descriptor; if this one was just (re)opened, close the least
    /// recently used others beyond the budget.
    fn track(&self, opened: bool) {
        if self.pinned.load(Ordering::Relaxed) {
            return;
        }
        let d = descriptors();
        let mut lru = lock(&d.lru);
        lru.put(self.key, self.me.clone());
        while opened && lru.len() > d.limit {
            match lru.pop_lru() {
                Some((k, w)) if k != self.key => {
                    if let Some(f) = w.upgrade() {
                        f.close();
                    }
                }
                Some((k, w)) => {
                    // Itself, the only one left: keep it.
                    lru.put(k, w);
                    break;
                }
                None => break,
            }
        }
    }

    /// The open file, reopening it by path if it was closed.
    fn file(&self) -> Result<Arc<File>> {
        let mut evicted = false;
        loop {
            let got = {
                let mut slot = lock(&self.file);
                match slot.as_ref() {
                    Some(f) => Some((f.clone(), false)),
                    None => match File::open(&self.path) {
                        // Out of descriptors: close others (not holding this one's
                        // lock, which `track` of another thread may wait for) and
                        // try once more.
                        Err(e) if out_of_descriptors(&e) && !evicted => None,
                        Err(e) => return Err(e.into()),
                        Ok(f) => {
                            let meta = f.metadata()?;
                            if (meta.dev(), meta.ino()) != self.id {
                                return Err(Error::Corrupt(
                                    "the archive was replaced by another file while mounted".into(),
                                ));
                            }
                            self.unchanged_in(&meta)?;
                            let f = Arc::new(f);
                            *slot = Some(f.clone());
                            Some((f, true))
                        }
                    },
                }
            };
            match got {
                Some((f, opened)) => {
                    self.track(opened);
                    return Ok(f);
                }
                None => {
                    close_least_used(Some(self.key));
                    evicted = true;
                }
            }
        }
    }

    /// Whether the descriptor is open.
    pub fn is_open(&self) -> bool {
        lock(&self.file).is_some()
    }

    /// Close the descriptor (readers holding it keep it until they finish); the next
    /// read reopens it.
    pub fn close(&self) {
        *lock(&self.file) = None;
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

    /// Check that the file still has the size and modification time it was opened with.
    pub fn unchanged(&self) -> Result<()> {
        let meta = self.file()?.metadata()?;
        self.unchanged_in(&meta)
    }

    /// Device and inode.
    pub fn file_id(&self) -> (u64, u64) {
        self.id
    }
}

impl Blob for LocalFile {
    fn name(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let file = self.file()?;
        let r = read_exact_at(&file, buf, offset);
        // Bytes read from a file rewritten in place must not be served as the old ones:
        // checked after the read, on the same descriptor.
        let meta = file.metadata()?;
        self.unchanged_in(&meta)?;
        r
    }

    fn will_need(&self, ranges: &[(u64, u64)]) {
        if ranges.is_empty() {
            return;
        }
        let Ok(file) = self.file() else {
            return;
        };
        for &(start, end) in ranges {
            // SAFETY: posix_fadvise only reads its arguments; the descriptor is open (the
            // Arc keeps the file alive for the call).
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&*file),
                    start as libc::off_t,
                    end.saturating_sub(start) as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn mtime(&self) -> i64 {
        self.mtime_ns.0
    }

    fn duplicate_fd(&self) -> Option<std::os::fd::OwnedFd> {
        let f = self.file().ok()?;
        f.try_clone().ok().map(Into::into)
    }

    fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
        lock(&descriptors().lru).pop(&self.key);
        // Reopen now if it was closed, while the path may still name it (a read later
        // would find whatever is there then).
        let _ = self.file();
    }
}

/// A range of another blob: a layer blob inside an image archive.
#[derive(Debug)]
pub struct Slice {
    inner: Arc<dyn Blob>,
    offset: u64,
    len: u64,
    name: PathBuf,
    version: String,
}

impl Slice {
    /// Bytes `[offset, offset + len)` of `inner`, named `name` in messages. Fails if the
    /// range does not lie inside `inner`.
    pub fn new(inner: Arc<dyn Blob>, offset: u64, len: u64, name: PathBuf) -> Result<Slice> {
        if offset.checked_add(len).is_none_or(|e| e > inner.size()) {
            return Err(Error::Format(format!(
                "{}: {len} bytes at {offset} lie outside its {} bytes",
                name.display(),
                inner.size()
            )));
        }
        let version = format!("{}@{offset:x}+{len:x}", inner.version());
        Ok(Slice {
            inner,
            offset,
            len,
            name,
            version,
        })
    }
}

impl Slice {
    /// `ranges` of the slice as ranges of the blob it is a slice of.
    fn shifted(&self, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        ranges
            .iter()
            .map(|&(s, e)| (self.offset + s.min(self.len), self.offset + e.min(self.len)))
            .collect()
    }

    /// `len` bytes at `offset` lie inside the slice.
    fn check(&self, offset: u64, len: usize) -> Result<()> {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(Error::Format(format!(
                "unexpected end of {} at offset {}",
                self.name.display(),
                self.len
            )));
        }
        Ok(())
    }
}

impl Blob for Slice {
    fn name(&self) -> &Path {
        &self.name
    }

    fn size(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len())?;
        self.inner.read_exact_at(buf, self.offset + offset)
    }

    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.inner.will_need(&self.shifted(ranges));
    }

    fn fetch_in_order(&self, ranges: &[(u64, u64)]) {
        self.inner.fetch_in_order(&self.shifted(ranges));
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn mtime(&self) -> i64 {
        self.inner.mtime()
    }

    fn pin(&self) {
        self.inner.pin();
    }

    fn round_trips(&self) -> bool {
        self.inner.round_trips()
    }

    fn first_tail(&self) -> u64 {
        self.inner.first_tail()
    }

    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<()> {
        for (buf, offset) in reads.iter() {
            self.check(*offset, buf.len())?;
        }
        let mut shifted: Vec<(&mut [u8], u64)> = reads
            .iter_mut()
            .map(|(buf, offset)| (&mut **buf, *offset + self.offset))
            .collect();
        self.inner.read_many(&mut shifted)
    }

    fn forget(&self) {
        self.inner.forget();
    }

    fn fetch_sparingly(&self, sequential: u64) {
        self.inner.fetch_sparingly(sequential);
    }

    fn fetch_in_background(&self) {
        // All of a blob (a renamed one): its own background fetch; else the slice.
        if self.offset == 0 && self.len == self.inner.size() {
            self.inner.fetch_in_background();
        } else {
            self.will_need(&[(0, self.len)]);
        }
    }

    /// What the blob it is a slice of fetched (a slice of all of one: a renamed blob).
    fn fetched(&self) -> Option<u64> {
        self.inner.fetched()
    }
}

/// A blob held in memory (unit tests, and small objects a source fetched whole).
#[derive(Debug)]
pub struct Bytes {
    name: PathBuf,
    data: Vec<u8>,
    version: String,
}

impl Bytes {
    /// `data`, named `name`.
    pub fn new(name: impl Into<PathBuf>, data: Vec<u8>) -> Self {
        let version = format!("mem-{:08x}-{:x}", crc32fast::hash(&data), data.len());
        Bytes {
            name: name.into(),
            data,
            version,
        }
    }
}

impl Blob for Bytes {
    fn name(&self) -> &Path {
        &self.name
    }

    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|o| self.data.get(o..o.checked_add(buf.len())?))
            .ok_or_else(|| Error::Format(format!("unexpected end of data at offset {offset}")))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn mtime(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_table_is_grown_to_the_slots_reserved() {
        // SAFETY: getrlimit fills a local struct.
        let soft = unsafe {
            let mut lim: libc::rlimit = std::mem::zeroed();
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            usize::try_from(lim.rlim_cur).unwrap()
        };
        let want = RESERVED_SLOTS.min(soft);
        let slots = reserve_descriptor_slots().unwrap();
        assert!(slots >= want, "{slots} slots, {want} reserved");
        assert_eq!(descriptor_slots(), Some(slots));
        // Nothing is left open at the slot: the next descriptor is a low one.
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(std::os::fd::AsRawFd::as_raw_fd(&f) < 1000);
    }

    #[test]
    fn a_local_file_reads_exactly_and_refuses_to_serve_a_changed_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let f = LocalFile::open(&p).unwrap();
        assert_eq!(f.size(), 10);
        let mut buf = [0u8; 4];
        f.read_exact_at(&mut buf, 3).unwrap();
        assert_eq!(&buf, b"3456");
        let e = f.read_exact_at(&mut buf, 8).unwrap_err();
        assert!(e.to_string().contains("unexpected end"), "{e}");
        // Closed to save descriptors, reopened by path on the next read.
        f.close();
        assert!(!f.is_open());
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(f.is_open());
        // Rewritten in place: reads fail instead of serving the new bytes.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&p, b"abcdefghijk").unwrap();
        let e = f.read_exact_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("changed while mounted"), "{e}");
        // Replaced by another file and closed: the reopened file is refused.
        let g = LocalFile::open(&p).unwrap();
        g.close();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"abcdefghijk").unwrap();
        let e = g.read_exact_at(&mut buf, 0).unwrap_err();
        assert!(e.to_string().contains("replaced by another file"), "{e}");
        assert!(
            LocalFile::open(dir.path()).is_err(),
            "a directory is no blob"
        );
    }

    #[test]
    fn a_pinned_file_stays_open_after_its_path_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"pinned").unwrap();
        let f = LocalFile::open(&p).unwrap();
        f.close();
        f.pin();
        std::fs::remove_file(&p).unwrap();
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"pinned");
    }

    #[test]
    fn a_slice_reads_inside_its_range_only() {
        let inner: Arc<dyn Blob> = Arc::new(Bytes::new("outer", b"headerPAYLOADtrailer".to_vec()));
        let s = Slice::new(inner.clone(), 6, 7, "outer:payload".into()).unwrap();
        let mut buf = [0u8; 7];
        s.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"PAYLOAD");
        assert!(s.read_exact_at(&mut buf[..2], 6).is_err(), "past its end");
        assert_ne!(s.version(), inner.version());
        assert!(Slice::new(inner, 15, 6, "x".into()).is_err());
    }
}
