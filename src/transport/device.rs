//! The raw `/dev/fuse` descriptor, for what happens outside a `fuser` session: the
//! keeper's side of a mount that outlives its server (`crate::keeper`).
//!
//! A FUSE connection lives as long as some process holds its descriptor, and the kernel
//! sends INIT once per connection. So the keeper mounts, reads the INIT request and keeps
//! its bytes ([`read_init`]); every server it starts replays those bytes into its own
//! `fuser` session ([`super::session::adopt`]). When a server dies, the requests it had
//! read and not answered stay in the kernel's processing queue; [`notify_resend`] puts
//! them back on the pending queue for the next server (`FUSE_NOTIFY_RESEND`, Linux 6.9).
//! A keeper that has given up restarting answers every request with `EIO` itself
//! ([`answer_eio`]), so readers fail fast instead of hanging.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::session::{MountOptions, SessionError};

/// `FUSE_NOTIFY_RESEND` (include/uapi/linux/fuse.h, protocol 7.40).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// Requests that are never answered.
const FUSE_FORGET: u32 = 2;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
/// `fuse_in_header`: len u32, opcode u32, unique u64, nodeid u64, uid, gid, pid u32,
/// total_extlen u16, padding u16.
const IN_HEADER: usize = 40;
/// A request buffer as large as the biggest request the kernel sends (a write of
/// max_write plus headers; pkgfs is read-only, but a buffer too small makes read fail).
const BUF: usize = 16 * 1024 * 1024 + 4096;

/// Mount at `o.mountpoint` and return the connection's descriptor: as root, open
/// `/dev/fuse` and mount(2) it; otherwise through `fusermount3`, which mounts on the
/// user's behalf and passes the descriptor back.
pub fn mount(o: &MountOptions) -> Result<File, SessionError> {
    let fail = |source| SessionError::Mount {
        path: o.mountpoint.clone(),
        source,
    };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount(o).map_err(fail);
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(fail)?;
    super::session::kernel_mount(&dev, &super::session::mount_path(&o.mountpoint), o)
        .map_err(fail)?;
    Ok(dev)
}

/// `fusermount3 -o OPTIONS -- MOUNTPOINT` with `_FUSE_COMMFD` naming our end of a
/// socket pair: it opens `/dev/fuse`, mounts (setuid root), and sends the descriptor
/// back (`SCM_RIGHTS`, libfuse's protocol).
fn fusermount(o: &MountOptions) -> std::io::Result<File> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let mut opts = vec![
        if o.signals { "rw" } else { "ro" }.to_string(),
        if o.suid { "suid" } else { "nosuid" }.to_string(),
        if o.dev { "dev" } else { "nodev" }.to_string(),
        "default_permissions".to_string(),
        format!("fsname={}", o.fsname.replace(',', "\\,")),
        format!("subtype={}", super::session::SUBTYPE),
    ];
    if o.noexec {
        opts.push("noexec".into());
    }
    if o.noatime {
        opts.push("noatime".into());
    }
    if o.access.needs_allow_other() {
        opts.push("allow_other".into());
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(super::session::mount_path(&o.mountpoint))
        .env("_FUSE_COMMFD", fd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: only fcntl between fork and exec: fusermount3 inherits its end.
    unsafe {
        cmd.pre_exec(move || {
            libc::fcntl(fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!(std::os::fd::RawFd);
    let received = {
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        nix::sys::socket::recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .ok()
        .and_then(|m| {
            m.cmsgs().ok()?.find_map(|c| match c {
                nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
                _ => None,
            })
        })
    };
    let out = child.wait_with_output()?;
    match received {
        // SAFETY: the kernel installed this descriptor in our table for us.
        Some(raw) if raw >= 0 => Ok(File::from(unsafe { OwnedFd::from_raw_fd(raw) })),
        _ => Err(std::io::Error::other(format!(
            "fusermount3: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The INIT request the kernel sends first on a new connection, as bytes.
pub fn read_init(dev: &File) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; BUF];
    let n = loop {
        match (&*dev).read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    buf.truncate(n);
    match header(&buf) {
        Some((FUSE_INIT, _)) => Ok(buf),
        Some((op, _)) => Err(std::io::Error::other(format!(
            "the kernel's first request is opcode {op}, not INIT"
        ))),
        None => Err(std::io::Error::other("a short first request")),
    }
}

/// The opcode and unique number of a request.
fn header(req: &[u8]) -> Option<(u32, u64)> {
    let op = u32::from_ne_bytes(req.get(4..8)?.try_into().ok()?);
    let unique = u64::from_ne_bytes(req.get(8..16)?.try_into().ok()?);
    (req.len() >= IN_HEADER).then_some((op, unique))
}

/// `FUSE_INIT_EXT`: the INIT request has a second flags word.
const FUSE_INIT_EXT: u32 = 1 << 30;
/// `FUSE_HAS_RESEND` (1 << 39), bit 7 of the second flags word (protocol 7.40).
const FUSE_HAS_RESEND_HIGH: u32 = 1 << 7;

/// Whether the kernel that sent this INIT takes `FUSE_NOTIFY_RESEND` (it says so in
/// INIT's flags: `FUSE_HAS_RESEND`, Linux 6.9). `fuse_init_in`: major, minor,
/// max_readahead, flags, flags2 (u32 each).
pub fn kernel_resends(init: &[u8]) -> bool {
    let word = |i: usize| {
        init.get(IN_HEADER + 4 * i..IN_HEADER + 4 * i + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let (Some(major), Some(minor), Some(flags)) = (word(0), word(1), word(3)) else {
        return false;
    };
    major == 7
        && minor >= 40
        && flags & FUSE_INIT_EXT != 0
        && word(4).is_some_and(|f| f & FUSE_HAS_RESEND_HIGH != 0)
}

/// A descriptor of the same connection with a processing queue of its own
/// (`FUSE_DEV_IOC_CLONE`): when it closes, the kernel fails the requests read through
/// it (`ECONNABORTED`) while the connection lives on through `dev`. A keeper on a
/// kernel that cannot resend gives each server one, so a dying server's requests fail
/// instead of waiting forever.
pub fn clone_device(dev: &File) -> std::io::Result<File> {
    /// `_IOR(229, 0, uint32_t)`.
    const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
    let new = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let mut fd = dev.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 (the descriptor to clone) from a valid pointer.
    if unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(new)
}

/// The unique number of a request (INIT's, to check a reply belongs to it).
pub fn unique_of(req: &[u8]) -> Option<u64> {
    header(req).map(|(_, u)| u)
}

/// `fuse_out_header` with no payload: an error reply, or a notification (unique 0, the
/// notify code in `error`).
fn out_header(error: i32, unique: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&16u32.to_ne_bytes());
    b[4..8].copy_from_slice(&error.to_ne_bytes());
    b[8..16].copy_from_slice(&unique.to_ne_bytes());
    b
}

/// Ask the kernel to send again every request a server had read and not answered.
/// Fails on kernels before 6.9 (`EINVAL`): those requests are then never answered.
pub fn notify_resend(dev: BorrowedFd<'_>) -> std::io::Result<()> {
    write_all(dev, &out_header(FUSE_NOTIFY_RESEND, 0))
}

/// Write one reply or notification (the kernel takes it whole or not at all).
pub fn write_all(dev: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: a valid descriptor and buffer.
    let n = unsafe { libc::write(dev.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the connection has ended (unmounted or aborted): the device polls as an
/// error then. Waits up to `wait` (zero: just look).
pub fn ended(dev: BorrowedFd<'_>, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: dev.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

/// Answer every request with `EIO` until `stop` is set or the connection ends (the
/// keeper after too many restarts). Requests that take no answer (FORGET, INTERRUPT)
/// are dropped. Returns how many were refused.
pub fn answer_eio(dev: &File, stop: &AtomicBool) -> u64 {
    let mut buf = vec![0u8; BUF];
    let mut refused = 0;
    while !stop.load(Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd: dev.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 200) };
        if n <= 0 {
            continue;
        }
        if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            break;
        }
        let len = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => break,
            Err(_) => continue,
        };
        let Some((op, unique)) = header(&buf[..len]) else {
            continue;
        };
        match op {
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
            FUSE_DESTROY => {
                let _ = (&*dev).write_all(&out_header(0, unique));
                break;
            }
            _ => {
                if write_all(dev.as_fd(), &out_header(-libc::EIO, unique)).is_ok() {
                    refused += 1;
                }
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_from_the_wire_layout() {
        let mut req = vec![0u8; IN_HEADER];
        req[0..4].copy_from_slice(&(IN_HEADER as u32).to_ne_bytes());
        req[4..8].copy_from_slice(&FUSE_INIT.to_ne_bytes());
        req[8..16].copy_from_slice(&77u64.to_ne_bytes());
        assert_eq!(header(&req), Some((FUSE_INIT, 77)));
        assert_eq!(unique_of(&req[..20]), None, "shorter than a header");
        // An INIT of protocol 7.45 with FUSE_INIT_EXT and FUSE_HAS_RESEND, and without.
        let mut init = req.clone();
        for w in [7u32, 45, 1 << 17, FUSE_INIT_EXT, FUSE_HAS_RESEND_HIGH] {
            init.extend_from_slice(&w.to_ne_bytes());
        }
        assert!(kernel_resends(&init));
        let n = init.len();
        init[n - 4..].copy_from_slice(&0u32.to_ne_bytes());
        assert!(!kernel_resends(&init));
        assert!(!kernel_resends(&req), "no body");
        let h = out_header(-libc::EIO, 77);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().unwrap()), 16);
        assert_eq!(i32::from_ne_bytes(h[4..8].try_into().unwrap()), -libc::EIO);
        assert_eq!(u64::from_ne_bytes(h[8..16].try_into().unwrap()), 77);
    }
}
