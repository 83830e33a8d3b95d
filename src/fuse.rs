//! The FUSE adapter: the only module that knows the `fuser` crate.
//!
//! It translates requests into [`PkgFs`] calls and results into replies, and it tells the
//! kernel to cache everything, because the archives never change under a mount:
//! - entries and attributes live for [`TTL`]; failed lookups are answered as a cached
//!   negative entry (inode 0) so build systems probing include paths cost one request;
//! - `open` and `opendir` answer `ENOSYS`, which makes the kernel skip OPEN/RELEASE
//!   entirely and keep page and directory caches (`FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`);
//! - READDIRPLUS, parallel directory operations and symlink caching are requested;
//! - a read at offset 0 (the kernel had none of the file) and a directory listing are
//!   passed on as hints to the directory read-ahead thread (`prefetch`), which the
//!   daemon runs.
//!
//! Every handler runs under `catch_unwind`: a panic becomes `EIO` for that request and the
//! worker thread lives on (a dead worker would hang every later access).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use log::{debug, error};

use crate::error::Error;
use crate::fs::{Attr, BLKSIZE, DirEntry, PkgFs, StatFs};
use crate::prefetch::Hint;
use crate::tree::Kind;
use crate::uring::RingStats;

/// How long the kernel may cache entries and attributes. The tree is immutable for the
/// life of the mount, so this is as long as the kernel will usefully keep anything.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Fault injection for the tests: a lookup of this name panics inside the handler, to
/// prove that a panic becomes EIO and the mount keeps working.
pub const PANIC_ENV: &str = "PKGFS_FAULT_PANIC_ON_LOOKUP";

/// What pkgfs does with each request, whichever transport brought it: `fuser`'s
/// `/dev/fuse` loop ([`Fuse`]) or the io_uring queues ([`crate::uring`]). Every call
/// runs under `catch_unwind` and answers an errno, never a panic.
pub struct Handler {
    fs: Arc<PkgFs>,
    panic_on: Option<Vec<u8>>,
    hints: Option<SyncSender<Hint>>,
}

impl Handler {
    /// Wrap a filesystem. Reads at offset 0 and directory listings are sent to `hints`
    /// (if any) without waiting: when the channel is full, the hint is dropped.
    pub fn new(fs: Arc<PkgFs>, hints: Option<SyncSender<Hint>>) -> Self {
        let panic_on = std::env::var_os(PANIC_ENV).map(|v| v.as_bytes().to_vec());
        Handler {
            fs,
            panic_on,
            hints,
        }
    }

    /// LOOKUP. A missing name is an entry too: [`NEGATIVE`], which the kernel caches.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, Errno> {
        let r = guarded("lookup", || {
            if self.panic_on.as_deref() == Some(name) {
                panic!("fault injected by {PANIC_ENV}");
            }
            self.fs.lookup(parent, name)
        });
        match r {
            Err(e) if e == Errno::ENOENT => Ok(NEGATIVE),
            r => r,
        }
    }

    /// FORGET and BATCH_FORGET.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        log::trace!("forget {ino} {nlookup}");
        let _ = catch_unwind(AssertUnwindSafe(|| self.fs.forget(ino, nlookup)));
    }

    /// GETATTR.
    pub fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        guarded("getattr", || self.fs.getattr(ino))
    }

    /// READLINK.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        guarded("readlink", || self.fs.readlink(ino))
    }

    /// READ: `reply` gets the bytes (or the error) and sends them; what happens before
    /// and after sending is the same for both transports.
    pub fn read(&self, ino: u64, offset: u64, size: u32, reply: impl FnOnce(Result<&[u8], Errno>)) {
        // Before decoding: the read-ahead thread starts on the files after this one
        // while this one is decoded and travels (it never pushes the missed file).
        if offset == 0
            && let Some(tx) = &self.hints
        {
            let _ = tx.try_send(Hint::Missed(ino));
        }
        match guarded("read", || self.fs.read_shared(ino, offset, size)) {
            Ok(data) => {
                reply(Ok(&data));
                // The page cache keeps what a READ returns (no direct I/O): the block
                // cache need not.
                let _ = guarded("read", || {
                    self.fs.delivered(ino, offset, data.len() as u64);
                    Ok(())
                });
            }
            Err(e) => reply(Err(e)),
        }
    }

    /// READDIR and READDIRPLUS: `add` takes entries until it answers "full". Returns
    /// how many it was offered, for [`Handler::listed`].
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntry<'_>) -> bool,
    ) -> Result<usize, Errno> {
        let mut offered = 0usize;
        let op = if plus { "readdirplus" } else { "readdir" };
        guarded(op, || {
            self.fs.readdir(ino, offset, plus, |e| {
                offered += 1;
                add(&e)
            })
        })?;
        Ok(offered)
    }

    /// After a READDIRPLUS reply was sent. An empty batch past offset 0 is the end of
    /// a listing: the reader has taken in every earlier batch, so the kernel holds the
    /// entries' inodes and data can be pushed to them.
    pub fn listed(&self, ino: u64, offset: u64, offered: usize) {
        if offset > 0
            && offered == 0
            && let Some(tx) = &self.hints
        {
            let _ = tx.try_send(Hint::Listed(ino));
        }
    }

    /// STATFS.
    pub fn statfs(&self) -> Result<StatFs, Errno> {
        guarded("statfs", || Ok(self.fs.statfs()))
    }
}

/// The FUSE filesystem: a [`Handler`] behind the `fuser` trait.
pub struct Fuse {
    h: Arc<Handler>,
    /// Ask the kernel for FUSE over io_uring; `agreed` records whether it did.
    uring: Option<Arc<RingStats>>,
}

impl Fuse {
    /// Serve `h` through fuser. With `uring`, INIT asks for FUSE over io_uring and
    /// records in it whether the kernel agreed (the caller then starts the queues).
    pub fn new(h: Arc<Handler>, uring: Option<Arc<RingStats>>) -> Self {
        Fuse { h, uring }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// Run a handler body, turning errors into errno values and panics into `EIO`.
fn guarded<T>(op: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Errno> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if e.is_data_error() {
                debug!("{op}: {e}");
            }
            Err(errno(&e))
        }
        Err(_) => {
            error!("{op}: handler panicked; replying EIO");
            Err(Errno::EIO)
        }
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn to_system_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    let t = to_system_time(a.mtime);
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// The attributes of a negative entry: inode 0 tells the kernel to cache the miss.
pub const NEGATIVE: Attr = Attr {
    ino: 0,
    kind: Kind::File,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    size: 0,
    blocks: 0,
    mtime: 0,
};

const GEN: Generation = Generation(0);

/// The largest WRITE the kernel may send (none ever comes: the mount is read-only).
pub const MAX_WRITE: u32 = 1 << 20;

impl Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_NO_OPEN_SUPPORT,
            InitFlags::FUSE_NO_OPENDIR_SUPPORT,
        ] {
            if let Err(missing) = config.add_capabilities(cap) {
                debug!("kernel lacks capability {missing:?}");
            }
        }
        if let Some(rings) = &self.uring {
            let ok = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            if !ok {
                debug!("kernel does not offer FUSE over io_uring");
            }
            rings.agreed.store(ok, Ordering::Release);
        }
        // Nothing is ever written; the default (16 MiB) would only size the buffers the
        // io_uring queues register. Reads stay as large as read-ahead asks (max_pages).
        let _ = config.set_max_write(MAX_WRITE);
        // Let the kernel read ahead as far as it will: members are immutable.
        let mut readahead = 1024 * 1024;
        while let Err(nearest) = config.set_max_readahead(readahead) {
            if nearest >= readahead {
                break;
            }
            readahead = nearest;
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.h.lookup(parent.0, name.as_bytes()) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), GEN),
            Err(e) => reply.error(e),
        }
    }

    // BATCH_FORGET arrives here too (fuser's default `batch_forget` calls `forget`).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.h.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.h.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.h.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // ENOSYS: the kernel stops sending OPEN/RELEASE and keeps the page cache.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // ENOSYS: no OPENDIR/RELEASEDIR, and the kernel caches directory listings.
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.h.read(ino.0, offset, size, |r| match r {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(e),
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.h.readdir(ino.0, offset, false, |e| {
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                file_type(e.attr.kind),
                OsStr::from_bytes(e.name),
            )
        });
        match r {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.h.readdir(ino.0, offset, true, |e| {
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                OsStr::from_bytes(e.name),
                &TTL,
                &file_attr(&e.attr),
                GEN,
            )
        });
        match r {
            Ok(offered) => {
                reply.ok();
                self.h.listed(ino.0, offset, offered);
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.h.statfs() {
            Ok(s) => reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(e),
        }
    }

    // No ioctl is supported. Answered here, quietly: fuser's default logs a warning for
    // each, and every `open()` by Python (an isatty check) sends one.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // No extended attributes; ENOSYS makes the kernel stop asking.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to flush; ENOSYS makes the kernel stop sending FLUSH on every close.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The mount uses default_permissions: the kernel checks modes itself.
        reply.error(Errno::ENOSYS);
    }

    // Write-type operations. The mount is read-only (`ro`), so the kernel refuses most of
    // these before they arrive; answering EROFS here too keeps the promise if it does not.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
}
