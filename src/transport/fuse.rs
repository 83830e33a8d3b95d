//! The `/dev/fuse` transport: the `fuser` crate's session loop as a codec over the
//! operation layer ([`Handler`]).
//!
//! Everything a request means is decided in [`super::ops`]; this module turns `fuser`'s
//! calls into [`Handler`] calls and their results into replies, and sets up the kernel
//! at INIT: everything is cached because the archives never change under a mount
//! (entries and attributes for [`TTL`], OPEN and OPENDIR declined so the kernel keeps
//! page and directory caches), READDIRPLUS, parallel directory operations and symlink
//! caching are requested, and FUSE over io_uring is asked for when the mount wants it.
//! It also gives the read-ahead and live activation their way to the kernel's caches
//! ([`KernelNotifier`], over `fuser`'s `Notifier`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use log::debug;

use super::ops::{Access, Handler, MAX_WRITE, Op, TTL, Xattr};
use super::uring::RingStats;
use crate::error::Error;
use crate::fs::{Attr, BLKSIZE, KernelCache};
use crate::tree::Kind;
use crate::tree::view::Invalidation;

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

    /// The errno an operation that is not served fails with, from the table.
    fn refusal(&self, op: Op) -> Errno {
        errno(&self.h.refuse(op))
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn xattr_reply(reply: ReplyXattr, r: Result<Xattr, Error>) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(v)) => reply.data(&v),
        Err(e) => reply.error(errno(&e)),
    }
}

/// `fuser`'s session rule for an [`Access`] (the same rule [`super::ops::AccessRule`]
/// applies on the rings).
pub fn session_acl(access: Access) -> fuser::SessionACL {
    match access {
        Access::Owner => fuser::SessionACL::Owner,
        Access::RootAndOwner => fuser::SessionACL::RootAndOwner,
        Access::All => fuser::SessionACL::All,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
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
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

const GEN: Generation = Generation(0);

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
            Err(e) => reply.error(errno(&e)),
        }
    }

    // BATCH_FORGET arrives here too (fuser's default `batch_forget` calls `forget`).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.h.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.h.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.h.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(self.refusal(Op::Open));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(self.refusal(Op::Opendir));
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
            Err(e) => reply.error(errno(&e)),
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
            Err(e) => reply.error(errno(&e)),
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
            let mut attr = file_attr(&e.attr);
            if e.plain {
                // Node ID 0: listed, not instantiated (the directory entry keeps
                // `e.ino`: vendor/fuser/PKGFS.md).
                attr.ino = INodeNo(0);
            }
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                OsStr::from_bytes(e.name),
                &TTL,
                &attr,
                GEN,
            )
        });
        match r {
            Ok(offered) => {
                self.h.listed(ino.0, offset, offered);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.h.statfs() {
            Ok(s) => reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(errno(&e)),
        }
    }

    // Answered here, quietly: fuser's default logs a warning for each ioctl.
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
        reply.error(self.refusal(Op::Ioctl));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, self.h.getxattr(ino.0, name.as_bytes(), size));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, self.h.listxattr(ino.0, size));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refusal(Op::Flush));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refusal(Op::Fsync));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refusal(Op::Fsyncdir));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.error(self.refusal(Op::Access));
    }

    // Write-type operations: refused (`Disposition::ReadOnly`).

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
        reply.error(self.refusal(Op::Setattr));
    }

    fn mknod(
        &self,
        _req: &Request,
        p: INodeNo,
        n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno(&self.h.create(Op::Mknod, p.0, n.as_bytes())));
    }

    fn mkdir(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(self.refusal(Op::Mkdir));
    }

    fn unlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refusal(Op::Unlink));
    }

    fn rmdir(&self, _req: &Request, p: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        reply.error(errno(&self.h.rmdir(p.0, n.as_bytes())));
    }

    fn symlink(&self, _req: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(self.refusal(Op::Symlink));
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
        reply.error(self.refusal(Op::Rename));
    }

    fn link(&self, _req: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(self.refusal(Op::Link));
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
        reply.error(self.refusal(Op::Write));
    }

    fn create(
        &self,
        _req: &Request,
        p: INodeNo,
        n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(errno(&self.h.create(Op::Create, p.0, n.as_bytes())));
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
        reply.error(self.refusal(Op::Setxattr));
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refusal(Op::Removexattr));
    }
}

/// The kernel's caches through `fuser`'s notifier: `FUSE_NOTIFY_STORE` for read-ahead
/// pushes, `NOTIFY_DELETE`, `NOTIFY_INVAL_ENTRY` and `NOTIFY_INVAL_INODE` for live
/// activation. Both are writes to `/dev/fuse`, whichever transport carries requests.
pub struct KernelNotifier(pub fuser::Notifier);

impl KernelCache for KernelNotifier {
    fn store(&self, ino: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.store(INodeNo(ino), offset, data)
    }

    fn invalidate(&self, inv: &Invalidation) -> std::io::Result<()> {
        match inv {
            Invalidation::Delete { parent, name, old } => {
                self.0
                    .delete(INodeNo(*parent), INodeNo(*old), OsStr::from_bytes(name))
            }
            Invalidation::Entry { parent, name } => self
                .0
                .inval_entry(INodeNo(*parent), OsStr::from_bytes(name)),
            Invalidation::Dir(ino) => self.0.inval_inode(INodeNo(*ino), 0, 0),
        }
    }
}
