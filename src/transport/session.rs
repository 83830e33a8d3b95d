//! Mounting and unmounting: the FUSE session, mount(2) and umount(2).
//!
//! As root pkgfs calls mount(2) itself, with the filesystem type `fuse.pkgfs` (what
//! fstab lines and `findmnt -t` use; `fuser`'s own mount records plain `fuse`), and
//! hands the `/dev/fuse` descriptor to a `fuser` session; otherwise `fuser` mounts
//! through `fusermount3`. Unmounting refuses anything that is not a FUSE mount (a typo
//! must not unmount a disk) and falls back to a lazy detach when the mount is busy. A
//! dead mount (its daemon was killed) is detached before mounting over it.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use log::{debug, warn};

use super::fuse::{Fuse, session_acl};
use super::ops::AccessRule;

/// The filesystem subtype (`fuse.pkgfs` where the mount helper records subtypes).
pub const SUBTYPE: &str = "pkgfs";

/// How a mount is made: the kernel-facing options of `pkgfs mount`.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Where.
    pub mountpoint: PathBuf,
    /// The name shown in /proc/mounts.
    pub fsname: String,
    /// Who may use it.
    pub access: AccessRule,
    /// `noexec`.
    pub noexec: bool,
    /// `noatime`.
    pub noatime: bool,
    /// Honour setuid bits (else `nosuid`).
    pub suid: bool,
    /// Honour device nodes (else `nodev`).
    pub dev: bool,
    /// FUSE worker threads on `/dev/fuse`.
    pub threads: usize,
    /// Mounted without `ro`, so that `create` and `rmdir` reach the filesystem (as
    /// signals: `pkgfs store`); every change is still refused by the filesystem.
    pub signals: bool,
}

/// Why a mount or an unmount failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The mountpoint is missing or not a directory.
    #[error("mountpoint {0} is not a directory (make one: mkdir -p {0})")]
    NotADirectory(PathBuf),
    /// Something live is mounted there already.
    #[error("{0} is already a FUSE mount (pkgfs umount it first)")]
    AlreadyMounted(PathBuf),
    /// Nothing is mounted there.
    #[error("{0} is not mounted")]
    NotMounted(PathBuf),
    /// A mount that is not FUSE: never unmounted by pkgfs.
    #[error("{path} is a {fstype} mount, not pkgfs (FUSE)")]
    NotFuse {
        /// The mountpoint.
        path: PathBuf,
        /// Its filesystem type.
        fstype: String,
    },
    /// mount(2) or the FUSE session failed.
    #[error("cannot mount at {path}: {source}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// umount(2) failed.
    #[error("cannot unmount {path}: {source}")]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `fusermount3` ran and failed.
    #[error("fusermount3 could not unmount {0}")]
    Fusermount(PathBuf),
    /// `fusermount3` could not be run.
    #[error("cannot run fusermount3 (package fuse3): {0}")]
    NoFusermount(std::io::Error),
}

fn fuser_config(o: &MountOptions, clone_fd: bool) -> fuser::Config {
    use fuser::MountOption as O;
    let mut config = fuser::Config::default();
    let mut opts = vec![
        if o.signals { O::RW } else { O::RO },
        if o.suid { O::Suid } else { O::NoSuid },
        if o.dev { O::Dev } else { O::NoDev },
        O::DefaultPermissions,
        O::FSName(o.fsname.clone()),
        O::Subtype(SUBTYPE.into()),
    ];
    if o.noexec {
        opts.push(O::NoExec);
    }
    if o.noatime {
        opts.push(O::NoAtime);
    }
    config.mount_options = opts;
    config.acl = session_acl(o.access.access);
    config.n_threads = Some(o.threads);
    config.clone_fd = clone_fd;
    config
}

/// Mount `fs` at the mountpoint and start serving it on `fuser`'s worker threads (the
/// INIT handshake is done when this returns). Also returns a second descriptor of the
/// session's `/dev/fuse` connection, for the io_uring queues.
pub fn start(
    fs: Fuse,
    o: &MountOptions,
) -> Result<(fuser::BackgroundSession, Option<OwnedFd>), SessionError> {
    let fail = |source| SessionError::Mount {
        path: o.mountpoint.clone(),
        source,
    };
    let config = fuser_config(o, true);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let session = fuser::Session::new(fs, &o.mountpoint, &config).map_err(fail)?;
        let dev = session.as_fd().try_clone_to_owned().ok();
        return Ok((session.spawn().map_err(fail)?, dev));
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(fail)?;
    let target = mount_path(&o.mountpoint);
    kernel_mount(&dev, &target, o).map_err(fail)?;
    let acl = config.acl;
    let dup = dev.try_clone().ok().map(OwnedFd::from);
    match fuser::Session::from_fd(fs, dev.into(), acl, config).and_then(|s| s.spawn()) {
        Ok(s) => Ok((s, dup)),
        Err(e) => {
            if let Ok(c) = CString::new(target.as_os_str().as_bytes()) {
                // SAFETY: a valid C string; detach what we just mounted.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
            Err(fail(e))
        }
    }
}

/// Serve `fs` on a connection a keeper mounted and hands over (`crate::keeper`): the
/// kernel sent INIT once, to the keeper, who kept its bytes (`init`). They are replayed
/// into a new `fuser` session through a socket pair, so `fuser` negotiates as it always
/// does and answers into the pair; then the real descriptor is put in the pair's place
/// (dup2) before any worker reads. Returns the session, not yet started, and `fuser`'s
/// INIT answer: the first server writes it to the kernel, a later one checks it equals
/// the first (the kernel keeps what it agreed to once).
///
/// `fuser`'s cloned descriptors are not used: a cloned descriptor is the server's own,
/// and when it closes the kernel fails the requests read through it instead of keeping
/// them for the next server.
pub fn adopt(
    fs: Fuse,
    dev: OwnedFd,
    init: &[u8],
    o: &MountOptions,
) -> Result<(fuser::Session<Fuse>, Vec<u8>), SessionError> {
    use std::os::unix::net::UnixDatagram;
    let fail = |source| SessionError::Mount {
        path: o.mountpoint.clone(),
        source,
    };
    let (ours, theirs) = seqpacket_pair().map_err(fail)?;
    let ours = UnixDatagram::from(ours);
    ours.send(init).map_err(fail)?;
    let config = fuser_config(o, false);
    let acl = config.acl;
    let session = fuser::Session::from_fd(fs, theirs, acl, config).map_err(fail)?;
    let mut reply = vec![0u8; 4096];
    ours.set_nonblocking(true).map_err(fail)?;
    let n = ours.recv(&mut reply).map_err(fail)?;
    reply.truncate(n);
    let slot = session.as_fd().as_raw_fd();
    // SAFETY: both descriptors are open; dup2 replaces the session's end of the pair
    // with the device, atomically, while no worker thread exists yet.
    if unsafe { libc::dup2(dev.as_raw_fd(), slot) } < 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    // SAFETY: as above; dup2 clears close-on-exec, set it again.
    unsafe { libc::fcntl(slot, libc::F_SETFD, libc::FD_CLOEXEC) };
    drop(dev);
    Ok((session, reply))
}

/// A connected pair of `SOCK_SEQPACKET` sockets (one message per read, as on
/// `/dev/fuse`), close-on-exec.
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: a valid two-element array for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two new descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// mount(2) of a FUSE filesystem of type `fuse.pkgfs` served through `dev`.
pub(super) fn kernel_mount(
    dev: &std::fs::File,
    target: &Path,
    o: &MountOptions,
) -> std::io::Result<()> {
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        // SAFETY: getuid/getgid cannot fail.
        unsafe { libc::getuid() },
        unsafe { libc::getgid() }
    );
    if o.access.needs_allow_other() {
        // allow_root is enforced by the session's rule on top of the kernel's allow_other.
        data.push_str(",allow_other");
    }
    let mut flags = if o.signals { 0 } else { libc::MS_RDONLY };
    if !o.suid {
        flags |= libc::MS_NOSUID;
    }
    if !o.dev {
        flags |= libc::MS_NODEV;
    }
    if o.noexec {
        flags |= libc::MS_NOEXEC;
    }
    if o.noatime {
        flags |= libc::MS_NOATIME;
    }
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| std::io::Error::other("argument contains a NUL byte"))
    };
    let source = cstr(o.fsname.as_bytes())?;
    let target = cstr(target.as_os_str().as_bytes())?;
    let fstype = cstr(format!("fuse.{SUBTYPE}").as_bytes())?;
    let data = cstr(data.as_bytes())?;
    // SAFETY: valid C strings; `data` is the FUSE option string the kernel parses.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast::<libc::c_void>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Buffered reads arrive as 128 KiB requests unless the mount's backing device allows
/// more readahead; raise it to 1 MiB (root only; best effort). Returns the mount's
/// device number.
pub fn raise_readahead(mountpoint: &Path) -> Option<u64> {
    let meta = std::fs::metadata(mountpoint).ok()?;
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Err(e) = std::fs::write(&path, "1024") {
        debug!("cannot raise readahead via {path}: {e}");
    }
    Some(dev)
}

/// Make `mountpoint` ready to be mounted on: it must be a directory, and if it is already
/// a FUSE mount, a dead one (its daemon was killed; requests fail with ENOTCONN) is
/// detached, while a live one is an error rather than a mount stacked on top of it.
/// `stat` of the mountpoint itself may be answered from the kernel's attribute cache,
/// so the probe looks up a fresh name.
pub fn prepare_mountpoint(mountpoint: &Path) -> Result<(), SessionError> {
    if let Some(t) = mounted_type(mountpoint)
        && is_fuse(&t)
    {
        let probe = mountpoint.join(format!(".pkgfs-probe-{}", std::process::id()));
        match std::fs::symlink_metadata(&probe) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                warn!("{} is a dead mount; detaching it", mountpoint.display());
                unmount(mountpoint, true)?;
            }
            _ => return Err(SessionError::AlreadyMounted(mountpoint.to_path_buf())),
        }
    }
    if !std::fs::metadata(mountpoint).is_ok_and(|m| m.is_dir()) {
        return Err(SessionError::NotADirectory(mountpoint.to_path_buf()));
    }
    Ok(())
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype.starts_with("fuse.")
}

/// The absolute path of `p` as /proc/mounts shows it, without touching `p` itself (a
/// dead mount cannot be stat'ed).
pub fn mount_path(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|c| c.join(name))
            .unwrap_or(abs.clone()),
        _ => abs,
    }
}

/// The device number of the mount at `p`, from /proc/self/mountinfo: what `stat`
/// gives, without asking the mount (whose server may be gone).
pub fn mount_device(p: &Path) -> Option<u64> {
    let want = mount_path(p);
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_device_in(&info, &want)
}

/// The device of the last mount at `want` in a mountinfo text.
fn mount_device_in(info: &str, want: &Path) -> Option<u64> {
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let (dev, dir) = (f.get(2)?, f.get(4)?);
        if Path::new(&unescape_mount_field(dir)) != want {
            return None;
        }
        let (major, minor) = dev.split_once(':')?;
        Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
    })
}

/// The filesystem type mounted at `p`, from /proc/self/mounts.
fn mounted_type(p: &Path) -> Option<String> {
    let want = mount_path(p);
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounted_type_in(&mounts, &want)
}

/// The type of the last mount at `want` in a /proc/mounts text.
fn mounted_type_in(mounts: &str, want: &Path) -> Option<String> {
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let (_, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (Path::new(&unescape_mount_field(dir)) == want).then(|| ty.to_string())
    })
}

/// /proc/mounts escapes space, tab, newline and backslash as octal (`\040`…).
fn unescape_mount_field(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// `pkgfs umount`: unmount a pkgfs mount; if it is busy, detach it lazily (the kernel
/// finishes when the last user leaves).
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), SessionError> {
    match mounted_type(mountpoint) {
        // fuser's own mount(2) records the type as plain "fuse"; refuse anything that is
        // not FUSE at all, so a typo cannot unmount a disk.
        Some(t) if is_fuse(&t) => {}
        Some(t) => {
            return Err(SessionError::NotFuse {
                path: mountpoint.to_path_buf(),
                fstype: t,
            });
        }
        None => return Err(SessionError::NotMounted(mountpoint.to_path_buf())),
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount(mountpoint, lazy);
    }
    let failed = |source| SessionError::Unmount {
        path: mountpoint.to_path_buf(),
        source,
    };
    let c = CString::new(mount_path(mountpoint).as_os_str().as_bytes())
        .map_err(|_| failed(std::io::Error::other("mountpoint contains NUL")))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) && !lazy {
        warn!("{} is busy; detaching it lazily", mountpoint.display());
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        return Err(failed(std::io::Error::last_os_error()));
    }
    Err(failed(err))
}

fn fusermount(mountpoint: &Path, lazy: bool) -> Result<(), SessionError> {
    let run = |lazy: bool| {
        Command::new("fusermount3")
            .arg(if lazy { "-uz" } else { "-u" })
            .arg(mountpoint)
            .status()
    };
    match run(lazy) {
        Ok(s) if s.success() => Ok(()),
        Ok(_) if !lazy => match run(true) {
            Ok(s) if s.success() => Ok(()),
            _ => Err(SessionError::Fusermount(mountpoint.to_path_buf())),
        },
        Ok(_) => Err(SessionError::Fusermount(mountpoint.to_path_buf())),
        Err(e) => Err(SessionError::NoFusermount(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_mount_at_a_path_gives_its_type_and_escapes_are_undone() {
        let mounts = "\
/dev/vda / ext4 rw 0 0
pkgs /mnt/a\\040b fuse.pkgfs ro 0 0
tmpfs /mnt/x tmpfs rw 0 0
pkgs /mnt/x fuse ro 0 0
";
        assert_eq!(
            mounted_type_in(mounts, Path::new("/mnt/a b")).as_deref(),
            Some("fuse.pkgfs")
        );
        assert_eq!(
            mounted_type_in(mounts, Path::new("/mnt/x")).as_deref(),
            Some("fuse"),
            "stacked: the top one"
        );
        assert_eq!(mounted_type_in(mounts, Path::new("/mnt/none")), None);
        let info = "\
36 1 0:33 / /mnt/a\\040b rw - fuse.pkgfs pkgs ro
37 1 0:34 / /mnt/x rw - tmpfs tmpfs rw
38 37 0:51 / /mnt/x rw - fuse pkgs ro
";
        assert_eq!(
            mount_device_in(info, Path::new("/mnt/a b")),
            Some(libc::makedev(0, 33))
        );
        assert_eq!(
            mount_device_in(info, Path::new("/mnt/x")),
            Some(libc::makedev(0, 51)),
            "stacked: the top one"
        );
        assert_eq!(mount_device_in(info, Path::new("/mnt/none")), None);
        assert!(is_fuse("fuse") && is_fuse("fuse.pkgfs") && !is_fuse("fuseblk2x"));
        assert!(!is_fuse("ext4"));
    }

    #[test]
    fn a_plain_directory_is_ready_and_a_file_or_a_missing_path_is_not() {
        let dir = tempfile::tempdir().unwrap();
        assert!(prepare_mountpoint(dir.path()).is_ok());
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            prepare_mountpoint(&file),
            Err(SessionError::NotADirectory(_))
        ));
        assert!(matches!(
            prepare_mountpoint(&dir.path().join("missing")),
            Err(SessionError::NotADirectory(_))
        ));
        assert!(matches!(
            unmount(dir.path(), false),
            Err(SessionError::NotMounted(_))
        ));
    }
}
