//! Watching source directories for packages coming and going (inotify).
//!
//! [`Watcher::next_batch`] blocks until something happened in a watched directory and
//! then waits for the directory to be quiet for [`QUIET`] (at most [`MAX_DELAY`] after
//! the first event), so a package manager installing 200 packages causes one rescan, not
//! 200. It does not interpret events beyond that: the caller rescans the directories and
//! compares (file names alone cannot tell a replaced package from an unchanged one).
//!
//! Which events count:
//! - a file renamed in or out, deleted, or closed after writing (`IN_MOVED_TO`,
//!   `IN_MOVED_FROM`, `IN_DELETE`, `IN_CLOSE_WRITE`), and links created (`IN_CREATE`);
//! - a file being written (`IN_MODIFY` without its `IN_CLOSE_WRITE` yet) is reported as
//!   *busy*: the rescan leaves it out until it is closed, so a half-copied archive is
//!   never indexed (install by rename to be atomic; see docs/SEMANTICS.md);
//! - hidden names (starting with `.`, e.g. a package manager's temporary file) never
//!   count, as they are never mounted;
//! - a queue overflow or the directory itself moving or vanishing forces a rescan;
//! - a [`Waker`] (an eventfd beside the inotify descriptor) forces one too: the
//!   background indexer wakes the watcher when a package it indexed is ready.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::{debug, warn};

/// How long a directory must be quiet before a rescan.
pub const QUIET: Duration = Duration::from_millis(100);
/// The longest a rescan waits after the first event, however busy the directory is.
pub const MAX_DELAY: Duration = Duration::from_millis(500);

const MASK: u32 = libc::IN_CLOSE_WRITE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// A set of changes to act on.
#[derive(Debug, Default)]
pub struct Batch {
    /// Events in the batch.
    pub events: usize,
    /// Files still being written: leave them out of the rescan.
    pub busy: HashSet<PathBuf>,
}

/// Makes [`Watcher::next_batch`] return, from any thread.
#[derive(Clone, Debug)]
pub struct Waker(std::sync::Arc<OwnedFd>);

impl Waker {
    /// Wake the watcher (it rescans once, however many wakes came meanwhile).
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to an eventfd we own; a full counter (never reached)
        // would only fail the write.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// An inotify instance watching some directories.
pub struct Watcher {
    fd: OwnedFd,
    wake: std::sync::Arc<OwnedFd>,
    dirs: HashMap<i32, PathBuf>,
    /// Files written to but not closed yet.
    writing: HashSet<PathBuf>,
    /// Rescan this often without events (remote sources are polled), and when next.
    poll: Option<(Duration, Instant)>,
}

impl Watcher {
    /// Watch `dirs` (non-recursively: packages live directly in a source directory).
    pub fn new(dirs: &[PathBuf]) -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall; the result is checked.
        let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if ev < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ev` is a fresh descriptor we own.
        let wake = std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(ev) });
        let mut w = Watcher {
            fd,
            wake,
            dirs: HashMap::new(),
            writing: HashSet::new(),
            poll: None,
        };
        for d in dirs {
            w.add(d)?;
        }
        Ok(w)
    }

    fn add(&mut self, dir: &Path) -> io::Result<()> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        // SAFETY: valid descriptor and C string.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot watch {}: {e}", dir.display()),
            ));
        }
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// Also end a batch every `interval` without events (a poll of remote sources).
    pub fn with_poll(mut self, interval: Duration) -> Self {
        self.poll = Some((interval, Instant::now() + interval));
        self
    }

    /// A waker of this watcher.
    pub fn waker(&self) -> Waker {
        Waker(self.wake.clone())
    }

    /// Wait up to `timeout` for inotify or the waker to become readable.
    fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut pfd = [self.fd.as_raw_fd(), self.wake.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        loop {
            // SAFETY: two valid pollfds.
            let r = unsafe { libc::poll(pfd.as_mut_ptr(), 2, ms) };
            if r >= 0 {
                return Ok(r > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Read and digest the pending events; returns how many mattered (a wake counts
    /// as one).
    fn drain(&mut self) -> io::Result<usize> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut count = [0u8; 8];
        // SAFETY: reading 8 bytes into a buffer we own from our eventfd.
        let woken = unsafe { libc::read(self.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        let mut relevant = usize::from(woken == 8);
        loop {
            // SAFETY: reading into a buffer we own, of the length given.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(relevant),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let n = n as usize;
            let mut off = 0;
            const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
            while off + HEAD <= n {
                let field = |i: usize| {
                    let at = off + i * 4;
                    u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
                };
                let (wd, mask, len) = (field(0) as i32, field(1), field(3) as usize);
                let name_end = (off + HEAD + len).min(n);
                let raw = &buf[off + HEAD..name_end];
                let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                off += HEAD + len;
                relevant += usize::from(self.digest(wd, mask, name));
            }
        }
    }

    /// Note one event; whether it calls for a rescan.
    fn digest(&mut self, wd: i32, mask: u32, name: &[u8]) -> bool {
        if mask & libc::IN_Q_OVERFLOW != 0 {
            warn!("inotify queue overflowed; rescanning every source");
            return true;
        }
        let Some(dir) = self.dirs.get(&wd) else {
            return false;
        };
        if mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
            warn!(
                "source directory {} was moved or deleted: it is no longer watched (remount to watch it again)",
                dir.display()
            );
            return true;
        }
        if mask & libc::IN_IGNORED != 0 || name.is_empty() || name[0] == b'.' {
            return false;
        }
        let path = dir.join(OsStr::from_bytes(name));
        debug!("inotify {mask:#x} {}", path.display());
        if mask & libc::IN_MODIFY != 0 {
            self.writing.insert(path);
            return true;
        }
        if mask & (libc::IN_CLOSE_WRITE | libc::IN_DELETE | libc::IN_MOVED_FROM) != 0 {
            self.writing.remove(&path);
        }
        true
    }

    /// Block until a rescan is due: an event, then quiet for [`QUIET`] (or [`MAX_DELAY`]
    /// since the first event).
    pub fn next_batch(&mut self) -> io::Result<Batch> {
        let mut events = 0;
        while events == 0 {
            let until_poll = self
                .poll
                .map(|(_, at)| at.saturating_duration_since(Instant::now()));
            let woken = self.wait(until_poll)?;
            if let Some((every, at)) = self.poll.as_mut()
                && !woken
            {
                if Instant::now() < *at {
                    continue; // poll(2) rounds down to milliseconds
                }
                *at = Instant::now() + *every;
                debug!("polling the sources");
                return Ok(Batch {
                    events: 0,
                    busy: self.writing.clone(),
                });
            }
            events += self.drain()?;
        }
        let first = Instant::now();
        loop {
            let left = MAX_DELAY.saturating_sub(first.elapsed());
            if left.is_zero() || !self.wait(Some(QUIET.min(left)))? {
                break;
            }
            events += self.drain()?;
        }
        // A file that vanished while being written is not busy any more.
        self.writing.retain(|p| p.exists());
        Ok(Batch {
            events,
            busy: self.writing.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_batched_and_writes_in_progress_are_busy() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(&[dir.path().to_path_buf()]).unwrap();
        // A burst of installs by rename, and hidden temporary files that do not count.
        for i in 0..50 {
            let tmp = dir.path().join(format!(".tmp{i}"));
            std::fs::write(&tmp, b"x").unwrap();
            std::fs::rename(&tmp, dir.path().join(format!("p{i}.zip"))).unwrap();
        }
        let b = w.next_batch().unwrap();
        assert_eq!(b.events, 50, "one event per rename, none for hidden files");
        assert!(b.busy.is_empty());
        // A file open for writing is busy until closed.
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path().join("slow.zip")).unwrap();
        f.write_all(b"partial").unwrap();
        let b = w.next_batch().unwrap();
        assert!(b.busy.contains(&dir.path().join("slow.zip")), "{b:?}");
        drop(f);
        let b = w.next_batch().unwrap();
        assert!(b.busy.is_empty(), "{b:?}");
        // Wakes from another thread before the watcher looks are one event, however
        // many came.
        let waker = w.waker();
        std::thread::spawn(move || {
            waker.wake();
            waker.wake();
        })
        .join()
        .unwrap();
        let b = w.next_batch().unwrap();
        assert_eq!(b.events, 1);
    }

    #[test]
    fn a_polling_watcher_ends_a_batch_every_interval() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(&[dir.path().to_path_buf()])
            .unwrap()
            .with_poll(Duration::from_millis(50));
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(w.next_batch().unwrap().events, 0);
        }
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        // Events still end a batch at once.
        std::fs::write(dir.path().join("p.zip"), b"x").unwrap();
        assert!(w.next_batch().unwrap().events > 0);
    }
}
