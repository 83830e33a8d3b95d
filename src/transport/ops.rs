//! The operation layer: what pkgfs does with each FUSE request, whichever transport
//! brought it.
//!
//! Both transports ([`super::fuse`] over `/dev/fuse`, [`super::uring`] over io_uring) are
//! codecs: they decode a request, call [`Handler`], and encode its answer. Everything
//! that is decided about a request is decided here, once, in the crate's own
//! [`Error`] (whose [`Error::errno`] is the one errno table):
//! - [`Op`] names every operation of the protocol and [`Op::disposition`] is the one
//!   table of which are served, which are refused because the mount is read-only
//!   (`EROFS`) and which are declined (`ENOSYS`: for most of them the kernel then stops
//!   sending them, which is how a mount of immutable archives keeps every cache);
//! - [`AccessRule`] is who may use the mount (`allow_other`, `allow_root`);
//! - [`Handler`] serves the operations: negative lookups the kernel caches, read-ahead
//!   hints, telling the read path what the kernel now holds, and panics turned into
//!   [`Error::Internal`] (a request fails, the worker thread lives on).

use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use log::{debug, error};

use crate::error::Error;
use crate::fs::prefetch::Hint;
use crate::fs::{Attr, DirEntry, PkgFs, StatFs};
use crate::tree::Kind;

/// How long the kernel may cache entries and attributes. The tree is immutable for the
/// life of the mount (a changed file gets a new inode), so this is as long as the kernel
/// will usefully keep anything.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest WRITE the kernel may send (none ever comes: the mount is read-only). It
/// also sizes the payload buffers of the io_uring queues: reads stay as large as the
/// read-ahead asks (max_pages), and 1 MiB covers both.
pub const MAX_WRITE: u32 = 1 << 20;

/// Fault injection for the tests: a lookup of this name panics inside the handler, to
/// prove that a panic becomes EIO and the mount keeps working.
pub const PANIC_ENV: &str = "PKGFS_FAULT_PANIC_ON_LOOKUP";

/// The attributes of a negative entry: inode 0 tells the kernel to cache the miss for
/// the entry timeout, so a build system probing include paths costs one request a name.
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
    rdev: 0,
};

/// The operations of the FUSE protocol (`enum fuse_opcode` of `linux/fuse.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Symlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Statfs,
    Release,
    Fsync,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Flush,
    Init,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Getlk,
    Setlk,
    Setlkw,
    Access,
    Create,
    Interrupt,
    Bmap,
    Destroy,
    Ioctl,
    Poll,
    NotifyReply,
    BatchForget,
    Fallocate,
    Readdirplus,
    Rename2,
    Lseek,
    CopyFileRange,
    SetupMapping,
    RemoveMapping,
    Syncfs,
    Tmpfile,
    Statx,
}

/// What pkgfs does with an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// A [`Handler`] method serves it (or the transport itself: INIT, FORGET, DESTROY,
    /// INTERRUPT).
    Served,
    /// It would change the tree: refused with [`Error::ReadOnly`]. The mount is `ro`, so
    /// the kernel refuses most of these before they arrive; this keeps the promise if
    /// one does.
    ReadOnly,
    /// Not implemented: [`Error::Declined`] (`ENOSYS`). For OPEN and OPENDIR this makes
    /// the kernel stop sending OPEN/RELEASE and keep page and directory caches
    /// (`FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`); for FLUSH, FSYNC, GETXATTR, ACCESS… it makes
    /// the kernel stop asking.
    Declined,
    /// IOCTL: no ioctl exists ([`Error::NoIoctl`], `ENOTTY`, answered quietly: every
    /// `open()` by Python sends one, an isatty check).
    NoIoctl,
}

impl Disposition {
    /// The error a refused operation fails with; `None` if it is served.
    pub fn error(self) -> Option<Error> {
        match self {
            Disposition::Served => None,
            Disposition::ReadOnly => Some(Error::ReadOnly),
            Disposition::Declined => Some(Error::Declined),
            Disposition::NoIoctl => Some(Error::NoIoctl),
        }
    }
}

impl Op {
    /// Every operation, for tests and tables.
    pub const ALL: [Op; 50] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Symlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Statfs,
        Op::Release,
        Op::Fsync,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Flush,
        Op::Init,
        Op::Opendir,
        Op::Readdir,
        Op::Releasedir,
        Op::Fsyncdir,
        Op::Getlk,
        Op::Setlk,
        Op::Setlkw,
        Op::Access,
        Op::Create,
        Op::Interrupt,
        Op::Bmap,
        Op::Destroy,
        Op::Ioctl,
        Op::Poll,
        Op::NotifyReply,
        Op::BatchForget,
        Op::Fallocate,
        Op::Readdirplus,
        Op::Rename2,
        Op::Lseek,
        Op::CopyFileRange,
        Op::SetupMapping,
        Op::RemoveMapping,
        Op::Syncfs,
        Op::Tmpfile,
        Op::Statx,
    ];

    /// The operation with protocol number `opcode`.
    pub fn from_opcode(opcode: u32) -> Option<Op> {
        Some(match opcode {
            1 => Op::Lookup,
            2 => Op::Forget,
            3 => Op::Getattr,
            4 => Op::Setattr,
            5 => Op::Readlink,
            6 => Op::Symlink,
            8 => Op::Mknod,
            9 => Op::Mkdir,
            10 => Op::Unlink,
            11 => Op::Rmdir,
            12 => Op::Rename,
            13 => Op::Link,
            14 => Op::Open,
            15 => Op::Read,
            16 => Op::Write,
            17 => Op::Statfs,
            18 => Op::Release,
            20 => Op::Fsync,
            21 => Op::Setxattr,
            22 => Op::Getxattr,
            23 => Op::Listxattr,
            24 => Op::Removexattr,
            25 => Op::Flush,
            26 => Op::Init,
            27 => Op::Opendir,
            28 => Op::Readdir,
            29 => Op::Releasedir,
            30 => Op::Fsyncdir,
            31 => Op::Getlk,
            32 => Op::Setlk,
            33 => Op::Setlkw,
            34 => Op::Access,
            35 => Op::Create,
            36 => Op::Interrupt,
            37 => Op::Bmap,
            38 => Op::Destroy,
            39 => Op::Ioctl,
            40 => Op::Poll,
            41 => Op::NotifyReply,
            42 => Op::BatchForget,
            43 => Op::Fallocate,
            44 => Op::Readdirplus,
            45 => Op::Rename2,
            46 => Op::Lseek,
            47 => Op::CopyFileRange,
            48 => Op::SetupMapping,
            49 => Op::RemoveMapping,
            50 => Op::Syncfs,
            51 => Op::Tmpfile,
            52 => Op::Statx,
            _ => return None,
        })
    }

    /// The one table of what pkgfs does with each operation.
    pub fn disposition(self) -> Disposition {
        use Disposition::*;
        match self {
            Op::Lookup
            | Op::Forget
            | Op::BatchForget
            | Op::Getattr
            | Op::Readlink
            | Op::Read
            | Op::Readdir
            | Op::Readdirplus
            | Op::Statfs
            | Op::Getxattr
            | Op::Listxattr
            | Op::Init
            | Op::Destroy
            | Op::Interrupt => Served,
            Op::Setattr
            | Op::Symlink
            | Op::Mknod
            | Op::Mkdir
            | Op::Unlink
            | Op::Rmdir
            | Op::Rename
            | Op::Rename2
            | Op::Link
            | Op::Write
            | Op::Create
            | Op::Tmpfile
            | Op::Setxattr
            | Op::Removexattr
            | Op::Fallocate
            | Op::CopyFileRange => ReadOnly,
            Op::Ioctl => NoIoctl,
            // OPEN and OPENDIR: the kernel keeps every cache; RELEASE(DIR) never come
            // then. The rest: nothing to do, and the kernel stops asking. ACCESS: the
            // mount uses default_permissions, the kernel checks modes itself.
            Op::Open
            | Op::Opendir
            | Op::Release
            | Op::Releasedir
            | Op::Flush
            | Op::Fsync
            | Op::Fsyncdir
            | Op::Access
            | Op::Getlk
            | Op::Setlk
            | Op::Setlkw
            | Op::Bmap
            | Op::Poll
            | Op::NotifyReply
            | Op::Lseek
            | Op::SetupMapping
            | Op::RemoveMapping
            | Op::Syncfs
            | Op::Statx => Declined,
        }
    }

    /// Whether the kernel sends this operation with the caller's credentials. The others
    /// (READ and READDIR of something already open, RELEASE, FSYNC, the write-type
    /// operations on an open file, DESTROY) carry no caller a rule could judge, and
    /// `fuser` lets them through.
    fn has_caller(self) -> bool {
        !matches!(
            self,
            Op::Destroy
                | Op::Read
                | Op::Readdir
                | Op::Readdirplus
                | Op::Write
                | Op::Fsync
                | Op::Fsyncdir
                | Op::Release
                | Op::Releasedir
        )
    }
}

/// Who may use a mount besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only the mounting user (FUSE's default).
    Owner,
    /// The mounting user and root (`allow_root`).
    RootAndOwner,
    /// Everyone (`allow_other`).
    All,
}

/// Who may use the mount: the rule `fuser` enforces on `/dev/fuse`, applied by the
/// io_uring transport to its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessRule {
    /// The mounting user.
    pub owner: u32,
    /// Who else.
    pub access: Access,
}

impl AccessRule {
    /// The rule for a mount by the calling process's user.
    pub fn for_this_process(access: Access) -> Self {
        // SAFETY: geteuid cannot fail.
        let owner = unsafe { libc::geteuid() };
        AccessRule { owner, access }
    }

    /// Whether the kernel must let others than the owner in at all (the mount option
    /// `allow_other`; `allow_root` is enforced by this rule on top of it).
    pub fn needs_allow_other(&self) -> bool {
        self.access != Access::Owner
    }

    /// Whether `uid` may send `op`: the owner always; root with `allow_root`; anyone
    /// with `allow_other`; and anyone for operations that carry no caller.
    pub fn allows(&self, uid: u32, op: Op) -> bool {
        uid == self.owner
            || match self.access {
                Access::All => true,
                Access::RootAndOwner => uid == 0,
                Access::Owner => false,
            }
            || !op.has_caller()
    }

    /// [`AccessRule::allows`] as a result.
    pub fn check(&self, uid: u32, op: Op) -> Result<(), Error> {
        if self.allows(uid, op) {
            Ok(())
        } else {
            Err(Error::Denied)
        }
    }
}

/// What pkgfs does with each request, whichever transport brought it. Every call runs
/// under `catch_unwind` and answers an [`Error`], never a panic.
pub struct Handler {
    fs: Arc<PkgFs>,
    panic_on: Option<Vec<u8>>,
    hints: Option<SyncSender<Hint>>,
}

impl Handler {
    /// Wrap a filesystem. Reads at offset 0 and directory listings are sent to `hints`
    /// (if any) without waiting: when the channel is full, the hint is dropped. A lookup
    /// of the name in [`PANIC_ENV`], if set, panics (fault injection for the tests).
    pub fn new(fs: Arc<PkgFs>, hints: Option<SyncSender<Hint>>) -> Self {
        let panic_on = std::env::var_os(PANIC_ENV).map(|v| v.as_bytes().to_vec());
        Handler {
            fs,
            panic_on,
            hints,
        }
    }

    /// The filesystem served.
    pub fn fs(&self) -> &Arc<PkgFs> {
        &self.fs
    }

    /// The error an operation that is not served fails with ([`Op::disposition`]).
    pub fn refuse(&self, op: Op) -> Error {
        op.disposition()
            .error()
            .unwrap_or_else(|| Error::Internal(format!("{op:?} reached the refusal path")))
    }

    /// LOOKUP. A missing name is an entry too: [`NEGATIVE`], which the kernel caches.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, Error> {
        let r = guarded(Op::Lookup, || {
            if self.panic_on.as_deref() == Some(name) {
                panic!("fault injected by {PANIC_ENV}");
            }
            self.fs.lookup(parent, name)
        });
        match r {
            // A tree that grows on lookup may have the name later: not cached.
            Err(Error::NotFound) if !self.fs.grows() => Ok(NEGATIVE),
            r => r,
        }
    }

    /// CREATE and MKNOD: refused, except where the tree grows ([`PkgFs::grows`]), which
    /// hears of it as a signal and answers `ENOENT` (containers/storage's `use` file
    /// of an additional layer store: "notification-aware" stores answer so).
    pub fn create(&self, op: Op, parent: u64, name: &[u8]) -> Error {
        if !self.fs.grows() {
            return self.refuse(op);
        }
        match guarded(op, || self.fs.created(parent, name)) {
            Ok(()) => Error::NotFound,
            Err(e) => e,
        }
    }

    /// RMDIR: refused, except where the tree grows, as for [`Handler::create`] (the
    /// release of a layer of an additional layer store).
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Error {
        if !self.fs.grows() {
            return self.refuse(Op::Rmdir);
        }
        match guarded(Op::Rmdir, || self.fs.removed(parent, name)) {
            Ok(()) => Error::NotFound,
            Err(e) => e,
        }
    }

    /// FORGET and BATCH_FORGET.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        log::trace!("forget {ino} {nlookup}");
        let _ = guarded(Op::Forget, || {
            self.fs.forget(ino, nlookup);
            Ok(())
        });
    }

    /// GETATTR.
    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        guarded(Op::Getattr, || self.fs.getattr(ino))
    }

    /// READLINK.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Error> {
        guarded(Op::Readlink, || self.fs.readlink(ino))
    }

    /// READ: `reply` gets the bytes (or the error) and sends them; what happens before
    /// and after sending is the same for both transports.
    pub fn read(&self, ino: u64, offset: u64, size: u32, reply: impl FnOnce(Result<&[u8], Error>)) {
        // Before decoding: the read-ahead thread starts on the files after this one
        // while this one is decoded and travels (it never pushes the missed file).
        if offset == 0 {
            self.hint(Hint::Missed(ino));
        }
        match guarded(Op::Read, || self.fs.read_shared(ino, offset, size)) {
            Ok(data) => {
                reply(Ok(&data));
                // The page cache keeps what a READ returns (no direct I/O): the block
                // cache need not.
                let _ = guarded(Op::Read, || {
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
    ) -> Result<usize, Error> {
        let mut offered = 0usize;
        let op = if plus { Op::Readdirplus } else { Op::Readdir };
        guarded(op, || {
            self.fs.readdir(ino, offset, plus, |e| {
                offered += 1;
                add(&e)
            })
        })?;
        Ok(offered)
    }

    /// After a READDIRPLUS batch was filled, before it is sent. An empty batch past
    /// offset 0 is the end of a listing: the kernel asks for it only once it has taken in
    /// every earlier batch, so it holds the entries' inodes and data can be pushed to
    /// them. (Sent before the reply, the hint is queued by the time the reader's
    /// `getdents` returns.)
    /// A listing that handed out its files plain gives nothing to push to (the kernel
    /// holds none of them): no hint, and no wakeup of the read-ahead thread.
    pub fn listed(&self, ino: u64, offset: u64, offered: usize) {
        if offset > 0 && offered == 0 && !self.fs.entries.listed_plain(ino) {
            self.hint(Hint::Listed(ino));
        }
    }

    /// Send a hint to the read-ahead thread, if there is one, without waiting (a full
    /// queue drops it).
    fn hint(&self, hint: Hint) {
        if let Some(tx) = &self.hints
            && tx.try_send(hint).is_ok()
        {
            self.fs
                .stats
                .hints
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// STATFS.
    pub fn statfs(&self) -> Result<StatFs, Error> {
        guarded(Op::Statfs, || Ok(self.fs.statfs()))
    }

    /// GETXATTR: with `size` 0 the value's length, else the value if it fits. A mount
    /// without extended attributes declines (`ENOSYS`: the kernel stops asking).
    pub fn getxattr(&self, ino: u64, name: &[u8], size: u32) -> Result<Xattr, Error> {
        guarded(Op::Getxattr, || {
            if !self.fs.xattrs_served() {
                return Err(Error::Declined);
            }
            sized(self.fs.getxattr(ino, name)?, size)
        })
    }

    /// LISTXATTR: the names, each followed by a NUL, sized as GETXATTR's value is.
    pub fn listxattr(&self, ino: u64, size: u32) -> Result<Xattr, Error> {
        guarded(Op::Listxattr, || {
            if !self.fs.xattrs_served() {
                return Err(Error::Declined);
            }
            sized(self.fs.listxattr(ino)?, size)
        })
    }
}

/// The answer to GETXATTR or LISTXATTR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// The length (the caller asked with size 0).
    Size(u32),
    /// The bytes.
    Data(Vec<u8>),
}

/// `value` for a caller with a buffer of `size` bytes (0: it asks for the length).
fn sized(value: Vec<u8>, size: u32) -> Result<Xattr, Error> {
    let len = u32::try_from(value.len()).map_err(|_| Error::Range)?;
    match size {
        0 => Ok(Xattr::Size(len)),
        s if s < len => Err(Error::Range),
        _ => Ok(Xattr::Data(value)),
    }
}

/// Run a handler body, turning panics into [`Error::Internal`]. Data errors are logged
/// at debug level here (the read path has already warned once per file).
pub fn guarded<T>(op: Op, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if e.is_data_error() {
                debug!("{op:?}: {e}");
            }
            Err(e)
        }
        Err(_) => {
            error!("{op:?}: handler panicked; replying EIO");
            Err(Error::Internal(format!("{op:?} panicked")))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::tree::ROOT_INO;

    /// A filesystem over a real ZIP (written by the `zip` crate), and its handler.
    fn handler(hints: Option<SyncSender<Hint>>) -> (tempfile::TempDir, Handler) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.zip");
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let opts = ::zip::write::SimpleFileOptions::default()
            .compression_method(::zip::CompressionMethod::Deflated);
        for name in ["d/a", "d/b", "top"] {
            w.start_file(name, opts).unwrap();
            w.write_all(format!("contents of {name}\n").as_bytes())
                .unwrap();
        }
        w.add_symlink("link", "d/a", opts).unwrap();
        w.finish().unwrap();
        let opts = crate::source::LoadOptions {
            threads: 1,
            owner: crate::tree::Ownership::defaults(0, 0),
            cache_bytes: 1 << 20,
            index_cache: None,
            whiteouts: false,
            platform: None,
            remote: Default::default(),
            registry: Default::default(),
            progress: None,
            layout: Default::default(),
            verify: None,
            keep_tree: false,
        };
        let (fs, _) = crate::source::load(&[path], &opts).unwrap();
        (dir, Handler::new(Arc::new(fs), hints))
    }

    #[test]
    fn every_operation_has_one_disposition_and_errors_come_from_the_errno_table() {
        for op in Op::ALL {
            let d = op.disposition();
            match d.error() {
                None => assert_eq!(d, Disposition::Served, "{op:?}"),
                Some(e) => assert_eq!(
                    e.errno(),
                    match d {
                        Disposition::ReadOnly => libc::EROFS,
                        Disposition::Declined => libc::ENOSYS,
                        Disposition::NoIoctl => libc::ENOTTY,
                        Disposition::Served => unreachable!(),
                    },
                    "{op:?}"
                ),
            }
        }
        // Opcode numbers round-trip, and unknown ones are not guessed at.
        let numbered: Vec<Op> = (0..64).filter_map(Op::from_opcode).collect();
        assert_eq!(numbered.len(), Op::ALL.len());
        assert!(Op::ALL.iter().all(|op| numbered.contains(op)));
        assert_eq!(Op::from_opcode(7), None, "7 is unused in linux/fuse.h");
        assert_eq!(Op::from_opcode(4096), None);
        // What each class means for the kernel.
        assert_eq!(Op::Mkdir.disposition(), Disposition::ReadOnly);
        assert_eq!(Op::Write.disposition(), Disposition::ReadOnly);
        assert_eq!(Op::Open.disposition(), Disposition::Declined);
        assert_eq!(Op::Flush.disposition(), Disposition::Declined);
        assert_eq!(Op::Ioctl.disposition(), Disposition::NoIoctl);
        assert_eq!(Op::Readdirplus.disposition(), Disposition::Served);
    }

    #[test]
    fn refusals_are_the_table_s_errors() {
        let (_d, h) = handler(None);
        assert_eq!(h.refuse(Op::Unlink).errno(), libc::EROFS);
        assert_eq!(h.refuse(Op::Flush).errno(), libc::ENOSYS);
        assert_eq!(h.refuse(Op::Ioctl).errno(), libc::ENOTTY);
        // A served operation sent down the refusal path is a bug, still an errno.
        assert_eq!(h.refuse(Op::Read).errno(), libc::EIO);
    }

    #[test]
    fn others_get_only_what_fuser_allows_them() {
        let owner_only = AccessRule {
            owner: 1000,
            access: Access::Owner,
        };
        assert!(owner_only.allows(1000, Op::Lookup));
        assert!(!owner_only.allows(0, Op::Lookup));
        assert!(!owner_only.allows(2000, Op::Getattr));
        assert!(
            owner_only.allows(2000, Op::Read),
            "sent without a caller's uid"
        );
        assert_eq!(
            owner_only.check(2000, Op::Lookup).unwrap_err().errno(),
            libc::EACCES
        );
        assert!(!owner_only.needs_allow_other());
        let root_too = AccessRule {
            access: Access::RootAndOwner,
            ..owner_only
        };
        assert!(root_too.allows(0, Op::Lookup) && !root_too.allows(2000, Op::Lookup));
        assert!(root_too.needs_allow_other());
        let all = AccessRule {
            access: Access::All,
            ..owner_only
        };
        assert!(all.allows(2000, Op::Lookup));
    }

    #[test]
    fn lookups_answer_entries_and_cacheable_misses() {
        let (_d, h) = handler(None);
        let d = h.lookup(ROOT_INO, b"d").unwrap();
        assert_eq!(d.kind, Kind::Dir);
        let a = h.lookup(d.ino, b"a").unwrap();
        assert_eq!((a.kind, a.size), (Kind::File, 16));
        assert_eq!(h.getattr(a.ino).unwrap(), a);
        // A missing name is a negative entry, not an error.
        assert_eq!(h.lookup(d.ino, b"missing").unwrap(), NEGATIVE);
        // A file is not a directory.
        assert_eq!(h.lookup(a.ino, b"x").unwrap_err().errno(), libc::ENOTDIR);
        let link = h.lookup(ROOT_INO, b"link").unwrap();
        assert_eq!(h.readlink(link.ino).unwrap(), b"d/a");
        assert_eq!(h.readlink(a.ino).unwrap_err().errno(), libc::EINVAL);
        assert!(h.statfs().unwrap().files >= 5);
    }

    #[test]
    fn reads_hint_the_read_ahead_and_listings_end_with_a_hint() {
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let (_d, h) = handler(Some(tx));
        let d = h.lookup(ROOT_INO, b"d").unwrap();
        let b = h.lookup(d.ino, b"b").unwrap();
        let mut got = Vec::new();
        h.read(b.ino, 0, 4096, |r| got = r.unwrap().to_vec());
        assert_eq!(got, b"contents of d/b\n");
        assert_eq!(rx.try_recv(), Ok(Hint::Missed(b.ino)));
        // A read further into the file is no miss.
        h.read(b.ino, 3, 4096, |r| got = r.unwrap().to_vec());
        assert_eq!(got, b"tents of d/b\n");
        assert!(rx.try_recv().is_err());
        // A listing: two dots and two files, taken one at a time; the empty batch at
        // its end is the hint.
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let mut next = None;
            let offered = h
                .readdir(d.ino, offset, true, |e| {
                    if next.is_some() {
                        return true;
                    }
                    names.push(e.name.to_vec());
                    next = Some(e.next_offset);
                    false
                })
                .unwrap();
            h.listed(d.ino, offset, offered);
            match next {
                Some(n) => offset = n,
                None => break,
            }
        }
        assert_eq!(names, [&b"."[..], b"..", b"a", b"b"]);
        assert_eq!(rx.try_recv(), Ok(Hint::Listed(d.ino)));
        // A directory read as a file.
        let mut err = None;
        h.read(d.ino, 0, 10, |r| err = r.err());
        assert_eq!(err.map(|e| e.errno()), Some(libc::EISDIR));
    }

    #[test]
    fn a_panic_becomes_an_internal_error_and_the_handler_lives_on() {
        let r: Result<(), Error> = guarded(Op::Lookup, || panic!("injected"));
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Internal(_)));
        assert_eq!(e.errno(), libc::EIO);
        let mut h = handler(None);
        h.1.panic_on = Some(b"boom".to_vec());
        assert_eq!(
            h.1.lookup(ROOT_INO, b"boom").unwrap_err().errno(),
            libc::EIO
        );
        assert!(h.1.lookup(ROOT_INO, b"top").is_ok());
    }

    #[test]
    fn extended_attributes_are_sized_as_the_caller_asks_and_declined_when_absent() {
        let (_d, zip) = handler(None);
        assert!(matches!(
            zip.getxattr(ROOT_INO, b"user.a", 0),
            Err(Error::Declined)
        ));
        assert!(matches!(zip.listxattr(ROOT_INO, 0), Err(Error::Declined)));
        let mut e = crate::format::Entry {
            path: b"f".to_vec(),
            kind: crate::format::EntryKind::File,
            perm: 0o644,
            mtime: 0,
            uid: None,
            gid: None,
            size: 0,
            data: crate::format::Loc::None,
            link: Vec::new(),
            rdev: 0,
            xattrs: vec![(b"user.a".to_vec(), b"value".to_vec())],
        };
        let mut b = crate::tree::TreeBuilder::new(crate::tree::Ownership::defaults(0, 0));
        b.add_layer(0, 0, std::slice::from_mut(&mut e));
        let h = Handler::new(Arc::new(PkgFs::new(b.finish(), Vec::new(), 0)), None);
        let f = h.fs.resolve(b"f").unwrap();
        assert_eq!(h.getxattr(f, b"user.a", 0).unwrap(), Xattr::Size(5));
        assert_eq!(
            h.getxattr(f, b"user.a", 64).unwrap(),
            Xattr::Data(b"value".to_vec())
        );
        assert_eq!(
            h.getxattr(f, b"user.a", 4).unwrap_err().errno(),
            libc::ERANGE
        );
        assert_eq!(
            h.getxattr(f, b"user.b", 64).unwrap_err().errno(),
            libc::ENODATA
        );
        assert_eq!(h.listxattr(f, 0).unwrap(), Xattr::Size(7));
        assert_eq!(h.listxattr(ROOT_INO, 64).unwrap(), Xattr::Data(Vec::new()));
        assert_eq!(
            h.getxattr(999_999, b"user.a", 0).unwrap_err().errno(),
            libc::ENOENT
        );
    }
}
