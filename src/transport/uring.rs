//! FUSE over io_uring: the second transport, used when the kernel offers it.
//!
//! With `/dev/fuse`, every request costs a `read(2)` by a worker that the kernel must
//! wake, and a `writev(2)` for the reply. With FUSE over io_uring (Linux 6.14+, module
//! parameter `fuse.enable_uring`), the daemon hands the kernel ring entries, a header and
//! a payload buffer each, per CPU queue; the kernel copies a request straight into an
//! entry and completes it, and the reply goes back in place with the command that also
//! fetches the next request (`COMMIT_AND_FETCH`). A request made on CPU *n* goes to queue
//! *n*, so the server thread that answers it is woken where the caller runs.
//!
//! Only requests travel this way. `fuser` still does INIT on `/dev/fuse` (and asks for
//! `FUSE_OVER_IO_URING` there), and its workers keep reading `/dev/fuse` for FORGET and
//! INTERRUPT, which the kernel never puts on a ring; the read-ahead's pushes
//! (NOTIFY_STORE) are writes to `/dev/fuse` as before. The kernel switches to the rings
//! once every queue has an entry; until then (or if registering fails) requests keep
//! coming through `/dev/fuse`, so a failure here costs speed, never service.
//!
//! What each request does is [`Handler`]'s and [`super::ops`]'s (the operation table and
//! the access rule), shared with the `fuser` adapter; this module only decodes the
//! requests and encodes the replies (the layouts of `linux/fuse.h`, protocol 7.42).

use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use log::{debug, error, warn};

use super::ops::{AccessRule, Handler, MAX_WRITE, Op, TTL, Xattr};
use crate::error::Error;
use crate::fs::{Attr, BLKSIZE, DirEntry};

// The request header an entry receives: `struct fuse_uring_req_header`.
const IN_OUT: usize = 0; // struct fuse_in_header / fuse_out_header
const OP_IN: usize = 128; // the operation's fixed-size argument
const ENT_IN_OUT: usize = 256; // struct fuse_uring_ent_in_out
const HEADER_LEN: usize = 288;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// Whether the rings are in use and what they served, for `pkgfs status`.
#[derive(Debug, Default)]
pub struct RingStats {
    /// INIT agreed to FUSE over io_uring.
    pub agreed: AtomicBool,
    /// Queues the kernel has (one per possible CPU).
    pub cpus: AtomicU64,
    /// Queues with at least one registered entry (the kernel switches once all have).
    pub queues: AtomicU64,
    /// Requests answered through a ring.
    pub requests: AtomicU64,
}

impl RingStats {
    /// Which transport carries requests: `io_uring` once every queue has an entry.
    pub fn transport(&self) -> &'static str {
        let cpus = self.cpus.load(Relaxed);
        if self.agreed.load(Relaxed) && cpus > 0 && self.queues.load(Relaxed) >= cpus {
            "io_uring"
        } else {
            "/dev/fuse"
        }
    }
}

/// The environment variable that makes queue *n*'s threads fail before they register
/// (a fault for the tests: a queue that cannot be set up must not hang the mount).
pub const FAULT_QUEUE_ENV: &str = "PKGFS_FAULT_RING_QUEUE";

/// How long [`start`] waits for every queue to report its registration.
const SETUP_WAIT: Duration = Duration::from_secs(10);

/// How long a registration refused with `EAGAIN` (the kernel has not yet taken INIT's
/// reply) is tried again.
const EAGAIN_RETRY: Duration = Duration::from_secs(5);

/// What [`start`] achieved.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// Every queue has an entry: the kernel hands requests to the rings.
    Rings,
    /// Some queue could not be set up; io_uring was turned off for the connection and
    /// requests keep coming through `/dev/fuse`.
    FellBack,
}

/// Whether this process can set up a ring of the kind the queues use (io_uring may be
/// off: `kernel.io_uring_disabled`, a seccomp filter, a container's profile). Asked
/// before INIT: once INIT agrees to FUSE over io_uring, the kernel holds every request
/// back until each CPU's queue has an entry, so a daemon that cannot make rings must not
/// ask for them.
pub fn usable() -> bool {
    match IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2) {
        Ok(_) => true,
        Err(e) => {
            debug!("cannot set up an io_uring ({e}): not asking for FUSE over io_uring");
            false
        }
    }
}

/// Start the ring threads: `threads` in all (at least one per queue), spread over the
/// queues, one per possible CPU; each thread has its own ring and one entry. `dev` is a
/// descriptor of the mount's `/dev/fuse` connection, after INIT agreed to FUSE over
/// io_uring.
///
/// Waits until every queue has reported. Once INIT agreed, the kernel holds every request
/// back until each queue has an entry, so a queue that cannot be set up would hang the
/// mount: then io_uring is turned off for the connection ([`turn_off`]) and
/// [`Started::FellBack`] returned. An error means neither worked: the mount cannot serve.
pub fn start(
    dev: OwnedFd,
    handler: Arc<Handler>,
    rule: AccessRule,
    threads: usize,
    stats: Arc<RingStats>,
) -> std::io::Result<Started> {
    // The kernel has a queue per possible CPU and switches only when all have entries.
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u16;
    stats.cpus.store(u64::from(cpus), Relaxed);
    let faulty: Option<u16> = std::env::var(FAULT_QUEUE_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let dev = Arc::new(dev);
    let per_queue = threads.div_ceil(usize::from(cpus)).max(1);
    let (tx, rx) = mpsc::channel();
    let mut failed: Vec<(u16, String)> = Vec::new();
    let mut expected = 0usize;
    for qid in 0..cpus {
        let registered = Arc::new(AtomicBool::new(false));
        for slot in 0..per_queue {
            let q = Queue {
                dev: dev.clone(),
                qid,
                registered: registered.clone(),
                handler: handler.clone(),
                rule,
                stats: stats.clone(),
                fault: faulty == Some(qid),
            };
            let report = tx.clone();
            match std::thread::Builder::new()
                .name(format!("pkgfs-ring{qid}.{slot}"))
                .spawn(move || q.run(report))
            {
                Ok(_) => expected += 1,
                Err(e) => failed.push((qid, format!("cannot start a thread: {e}"))),
            }
        }
    }
    drop(tx);
    let mut ok = vec![false; usize::from(cpus)];
    let deadline = Instant::now() + SETUP_WAIT;
    for _ in 0..expected {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((qid, Ok(()))) => ok[usize::from(qid)] = true,
            Ok((qid, Err(why))) => failed.push((qid, why)),
            Err(_) => break,
        }
    }
    let missing: Vec<u16> = (0..cpus).filter(|&q| !ok[usize::from(q)]).collect();
    if missing.is_empty() {
        return Ok(Started::Rings);
    }
    for (qid, why) in &failed {
        warn!("io_uring queue {qid}: {why}");
    }
    warn!("io_uring queues {missing:?} have no entry: turning io_uring off, using /dev/fuse");
    turn_off(&dev)?;
    Ok(Started::FellBack)
}

/// Turn FUSE over io_uring off for the connection. The kernel does so when a
/// registration fails (and wakes the requests it held back), so register an entry for a
/// queue that does not exist.
fn turn_off(dev: &OwnedFd) -> std::io::Result<()> {
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let fd = types::Fd(dev.as_raw_fd());
    let sqe = opcode::UringCmd80::new(fd, CMD_REGISTER)
        .cmd(cmd_req(0, u16::MAX))
        .build();
    let deadline = Instant::now() + EAGAIN_RETRY;
    loop {
        // SAFETY: the SQE points at no memory (the kernel refuses the queue id first).
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| std::io::Error::other("submission queue full"))?;
        submit_and_wait(&mut ring)?;
        let res = ring.completion().next().map_or(0, |c| c.result());
        match -res {
            // Refused, as it must be: io_uring is off.
            libc::EINVAL => return Ok(()),
            // Already off, or the connection is gone: nothing waits for the rings.
            libc::EOPNOTSUPP | libc::ENOTCONN | libc::ECONNABORTED => return Ok(()),
            libc::EAGAIN | libc::EINTR if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                return Err(std::io::Error::other(format!(
                    "the kernel did not turn io_uring off (result {res})"
                )));
            }
        }
    }
}

fn submit_and_wait(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> std::io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// The payload buffer of an entry must hold the largest request or reply the kernel
/// allows: `max(8 KiB, max_write, max_pages × page size)`, or registering fails. pkgfs
/// sets max_write to [`MAX_WRITE`] (1 MiB) and the read-ahead to at most 1 MiB, from
/// which fuser derives max_pages: 1 MiB covers all three.
const PAYLOAD_LEN: usize = MAX_WRITE as usize;

struct Queue {
    dev: Arc<OwnedFd>,
    qid: u16,
    /// Whether some thread of this queue has registered an entry.
    registered: Arc<AtomicBool>,
    handler: Arc<Handler>,
    rule: AccessRule,
    stats: Arc<RingStats>,
    /// Fail before registering ([`FAULT_QUEUE_ENV`]).
    fault: bool,
}

/// A registered entry. Fields drop in order: the ring (whose entry the kernel may write
/// into) before the buffers it points at.
struct Entry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    header: Buf,
    payload: Buf,
    /// The iovec the registration points at.
    _iov: Box<[libc::iovec; 2]>,
    /// The registration, to send again if it was interrupted.
    register: squeue::Entry128,
    /// A completion that came with the registration (a request, when this entry made
    /// the rings ready).
    ready: Option<cqueue::Entry>,
}

/// A queue thread's report to [`start`]: its queue and whether its entry registered.
type Report = mpsc::Sender<(u16, Result<(), String>)>;

/// A page-aligned buffer the kernel writes requests into (hence raw: it is written
/// behind Rust's back, but only while this thread is inside `io_uring_enter`). Mapped
/// anonymously, so a payload buffer costs memory only as far as requests and replies
/// have used it: a machine with many CPUs has many queues.
struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    fn new(len: usize) -> std::io::Result<Buf> {
        let len = len.max(1);
        // SAFETY: a fresh private anonymous mapping; no address hint.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Buf {
            ptr: ptr.cast(),
            len,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live mapping of `len` bytes, owned by `self`; the kernel
        // writes it only during `io_uring_enter`, when no slice from here is alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: mapped in `Buf::new` with this length.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The command area of the SQE (`struct fuse_uring_cmd_req`, in the 80 bytes of a
/// 128-byte SQE).
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

impl Queue {
    fn run(self, report: Report) {
        let name = format!("io_uring queue {}", self.qid);
        match self.serve(report) {
            Ok(()) => debug!("{name}: connection closed"),
            Err(e) => warn!("{name}: {e}; requests on this CPU use /dev/fuse"),
        }
    }

    /// Run on the queue's CPU, as libfuse's ring threads do: the kernel puts a request
    /// made on CPU *n* in queue *n*, and the caller sleeps on that CPU until the reply,
    /// so the thread that answers belongs there; unpinned, the scheduler often woke it
    /// on the other core, behind the decoder (docs/BENCHMARKS.md, "FUSE over io_uring":
    /// the cold walk 5% faster pinned). If the CPU is not ours to use (offline, or outside
    /// the daemon's cpuset), the thread runs wherever it may.
    fn pin(&self) {
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET indexes within it (checked).
        let r = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if usize::from(self.qid) >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
                return;
            }
            libc::CPU_SET(usize::from(self.qid), &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if r != 0 {
            debug!(
                "io_uring queue {}: not pinned to its CPU: {}",
                self.qid,
                std::io::Error::last_os_error()
            );
        }
    }

    /// Register this thread's entry, say how that went on `report`, then serve.
    fn serve(&self, report: Report) -> std::io::Result<()> {
        let mut report = Some(report);
        let mut say = |r: Result<(), String>| {
            if let Some(tx) = report.take() {
                let _ = tx.send((self.qid, r));
            }
        };
        let entry = self.register();
        if let Err(e) = &entry {
            say(Err(e.to_string()));
        }
        let mut entry = entry?;
        say(Ok(()));
        self.serve_registered(&mut entry)
    }

    /// Set up the ring and the buffers and register the entry; `EAGAIN` (INIT's reply not
    /// yet taken by the kernel) is tried again for [`EAGAIN_RETRY`]. Returns the first
    /// completion if one came at once (a request, when this entry made the rings ready).
    fn register(&self) -> std::io::Result<Entry> {
        if self.fault {
            return Err(std::io::Error::other(format!(
                "failing before registering ({FAULT_QUEUE_ENV})"
            )));
        }
        self.pin();
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
            IoUring::builder().setup_cqsize(4).build(2)?;
        let header = Buf::new(HEADER_LEN)?;
        let payload = Buf::new(PAYLOAD_LEN)?;
        // Boxed: a registration sent again must find its iovec where it was.
        let iov = Box::new([
            libc::iovec {
                iov_base: header.ptr.cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.ptr.cast(),
                iov_len: PAYLOAD_LEN,
            },
        ]);
        let fd = types::Fd(self.dev.as_raw_fd());
        let register = {
            let sqe = opcode::UringCmd80::new(fd, CMD_REGISTER)
                .cmd(cmd_req(0, self.qid))
                .addr(Some(iov.as_ptr() as u64))
                .build();
            // The iovec count lives in the SQE's `len`, which the builder does not set.
            // SAFETY: `Entry128` is a `repr(C)` pair of plain integer structs, 128 bytes,
            // valid for any bit pattern; `len` is the u32 at offset 24 of the SQE.
            let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
            raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
            unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
        };
        let deadline = Instant::now() + EAGAIN_RETRY;
        loop {
            // SAFETY: the iovec and both buffers outlive the ring (the caller drops the
            // ring first), and the SQE points at nothing else.
            unsafe { ring.submission().push(&register) }
                .map_err(|_| std::io::Error::other("submission queue full"))?;
            loop {
                match ring.submit() {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => {
                        r?;
                        break;
                    }
                }
            }
            // A refused registration completes at once; an accepted entry waits for its
            // first request.
            let ready = ring.completion().next();
            match ready.as_ref().map(|c| c.result()) {
                Some(r) if r == -libc::EAGAIN && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Some(r) if r < 0 => {
                    return Err(std::io::Error::other(format!(
                        "registering a ring entry failed: {}",
                        std::io::Error::from_raw_os_error(-r)
                    )));
                }
                _ => {
                    if !self.registered.swap(true, Relaxed) {
                        self.stats.queues.fetch_add(1, Relaxed);
                    }
                    return Ok(Entry {
                        ring,
                        header,
                        payload,
                        _iov: iov,
                        register,
                        ready,
                    });
                }
            }
        }
    }

    /// Answer requests on a registered entry until the connection closes.
    fn serve_registered(&self, entry: &mut Entry) -> std::io::Result<()> {
        let fd = types::Fd(self.dev.as_raw_fd());
        let Entry {
            ring,
            header,
            payload,
            register,
            ready,
            ..
        } = entry;
        let mut ready = ready.take();
        // What was last submitted, to send again if it was interrupted.
        let mut last = register.clone();
        loop {
            let cqe = match ready.take() {
                Some(c) => c,
                None => loop {
                    match ring.submit_and_wait(1) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        // A registered entry must never be abandoned: a request the
                        // kernel gives it would wait forever. Keep trying.
                        Err(e) => {
                            error!("io_uring queue {}: {e}; retrying", self.qid);
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            continue;
                        }
                    }
                    if let Some(c) = ring.completion().next() {
                        break c;
                    }
                },
            };
            let res = cqe.result();
            if res < 0 {
                match -res {
                    // Interrupted before the kernel took it: send it again.
                    libc::EINTR | libc::EAGAIN => {
                        // SAFETY: the registration's iovec was copied by the kernel when
                        // it first took it; the buffers live as long as the ring.
                        unsafe { ring.submission().push(&last) }
                            .map_err(|_| std::io::Error::other("submission queue full"))?;
                        continue;
                    }
                    // The connection is gone (unmounted or aborted).
                    libc::ENOTCONN | libc::ENODEV | libc::ECONNABORTED | libc::ECANCELED => {
                        return Ok(());
                    }
                    e => {
                        return Err(std::io::Error::other(format!(
                            "ring entry failed: {}",
                            std::io::Error::from_raw_os_error(e)
                        )));
                    }
                }
            }
            let commit_id = self.answer(header.bytes(), payload.bytes());
            self.stats.requests.fetch_add(1, Relaxed);
            let commit = opcode::UringCmd80::new(fd, CMD_COMMIT_AND_FETCH)
                .cmd(cmd_req(commit_id, self.qid))
                .build();
            // SAFETY: as above; a commit SQE points at no memory.
            unsafe { ring.submission().push(&commit) }
                .map_err(|_| std::io::Error::other("submission queue full"))?;
            last = commit;
        }
    }

    /// Decode the request in `header`/`payload`, serve it, and write the reply in
    /// place. Returns the commit id the reply goes back with.
    fn answer(&self, header: &mut [u8], payload: &mut [u8]) -> u64 {
        let opcode = u32_at(header, IN_OUT + 4);
        let unique = u64_at(header, IN_OUT + 8);
        let nodeid = u64_at(header, IN_OUT + 16);
        let uid = u32_at(header, IN_OUT + 24);
        let commit_id = u64_at(header, ENT_IN_OUT + 8);
        let in_len = (u32_at(header, ENT_IN_OUT + 16) as usize).min(payload.len());
        let r = match Op::from_opcode(opcode) {
            // Unknown to this protocol version: declined, as the table declines.
            None => Err(Error::Declined),
            Some(op) => self.rule.check(uid, op).and_then(|()| {
                let op_in: [u8; 128] = header[OP_IN..OP_IN + 128].try_into().unwrap_or([0; 128]);
                // The handlers catch their own panics; this catches the encoding's, so
                // that every request is answered (an unanswered one hangs its reader).
                catch_unwind(AssertUnwindSafe(|| {
                    self.dispatch(op, nodeid, &op_in, payload, in_len)
                }))
                .unwrap_or_else(|_| {
                    error!("{op:?}: reply encoding panicked; replying EIO");
                    Err(Error::Internal(format!("{op:?} reply encoding panicked")))
                })
            }),
        };
        let (error, len) = match r {
            Ok(n) => (0i32, n),
            Err(e) => (-e.errno(), 0),
        };
        header[IN_OUT..IN_OUT + 4].copy_from_slice(&((16 + len) as u32).to_ne_bytes());
        header[IN_OUT + 4..IN_OUT + 8].copy_from_slice(&error.to_ne_bytes());
        header[IN_OUT + 8..IN_OUT + 16].copy_from_slice(&unique.to_ne_bytes());
        header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
        commit_id
    }

    /// Serve one request; the reply's payload is written to `payload`, its length
    /// returned.
    fn dispatch(
        &self,
        op: Op,
        nodeid: u64,
        op_in: &[u8; 128],
        payload: &mut [u8],
        in_len: usize,
    ) -> Result<usize, Error> {
        let h = &self.handler;
        match op {
            Op::Lookup => {
                // The name, NUL-terminated, is the payload (arg 0 is empty for LOOKUP).
                let name = &payload[..in_len];
                let name = name.strip_suffix(&[0]).unwrap_or(name);
                let a = h.lookup(nodeid, name)?;
                Ok(put(payload, 0, &entry_out(&a)))
            }
            Op::Getattr => {
                let a = h.getattr(nodeid)?;
                let mut out = [0u8; 104];
                out[0..8].copy_from_slice(&TTL.as_secs().to_ne_bytes());
                out[8..12].copy_from_slice(&TTL.subsec_nanos().to_ne_bytes());
                out[16..104].copy_from_slice(&fuse_attr(&a));
                Ok(put(payload, 0, &out))
            }
            Op::Readlink => {
                // At most PATH_MAX bytes (fs::MAX_LINK): always fits the payload.
                let t = h.readlink(nodeid)?;
                Ok(put(payload, 0, &t))
            }
            Op::Read => {
                let offset = u64_at(op_in, 8);
                let size = u32_at(op_in, 16);
                let mut r = Err(Error::Internal("READ not answered".into()));
                h.read(nodeid, offset, size, |data| {
                    r = match data {
                        Ok(d) if d.len() <= payload.len() => Ok(put(payload, 0, d)),
                        Ok(d) => Err(Error::Internal(format!(
                            "read of {} bytes exceeds the ring buffer",
                            d.len()
                        ))),
                        Err(e) => Err(e),
                    };
                });
                r
            }
            Op::Readdir | Op::Readdirplus => {
                let plus = op == Op::Readdirplus;
                let offset = u64_at(op_in, 8);
                let size = (u32_at(op_in, 16) as usize).min(payload.len());
                let mut used = 0usize;
                let offered = h.readdir(nodeid, offset, plus, |e| {
                    match dirent(&mut payload[used..size], e, plus) {
                        Some(n) => {
                            used += n;
                            false
                        }
                        None => true,
                    }
                })?;
                if plus {
                    // Before the reply is committed, as on `/dev/fuse`.
                    h.listed(nodeid, offset, offered);
                }
                Ok(used)
            }
            Op::Statfs => {
                let s = h.statfs()?;
                let mut out = [0u8; 80];
                out[0..8].copy_from_slice(&s.blocks.to_ne_bytes());
                out[24..32].copy_from_slice(&s.files.to_ne_bytes());
                out[40..44].copy_from_slice(&s.bsize.to_ne_bytes());
                out[44..48].copy_from_slice(&s.namelen.to_ne_bytes());
                out[48..52].copy_from_slice(&s.bsize.to_ne_bytes());
                Ok(put(payload, 0, &out))
            }
            Op::Getxattr | Op::Listxattr => {
                // `struct fuse_getxattr_in` (size, padding); GETXATTR's name, NUL-ended,
                // is the payload.
                let size = u32_at(op_in, 0);
                let r = if op == Op::Getxattr {
                    let name = &payload[..in_len];
                    let name = name.strip_suffix(&[0]).unwrap_or(name);
                    h.getxattr(nodeid, name, size)?
                } else {
                    h.listxattr(nodeid, size)?
                };
                match r {
                    // `struct fuse_getxattr_out`.
                    Xattr::Size(n) => Ok(put(payload, 0, &u64::from(n).to_ne_bytes())),
                    Xattr::Data(v) if v.len() <= payload.len() => Ok(put(payload, 0, &v)),
                    Xattr::Data(_) => Err(Error::Range),
                }
            }
            Op::Create | Op::Mknod | Op::Rmdir => {
                // The name, NUL-terminated, is the payload (CREATE's and MKNOD's
                // `fuse_create_in`/`fuse_mknod_in` in `op_in`; RMDIR's arg 0 is empty).
                let name = &payload[..in_len];
                let name = name.strip_suffix(&[0]).unwrap_or(name);
                Err(if op == Op::Rmdir {
                    h.rmdir(nodeid, name)
                } else {
                    h.create(op, nodeid, name)
                })
            }
            Op::Destroy => Ok(0),
            // INIT, FORGET and INTERRUPT never come on a ring; everything else is the
            // table's refusal.
            op => Err(h.refuse(op)),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Copy `bytes` to `buf[at..]`; returns the end.
fn put(buf: &mut [u8], at: usize, bytes: &[u8]) -> usize {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
    at + bytes.len()
}

fn mode(a: &Attr) -> u32 {
    a.kind.mode_bits() | u32::from(a.perm)
}

/// `struct fuse_attr`, as `fuser` fills it (times in whole seconds).
fn fuse_attr(a: &Attr) -> [u8; 88] {
    let mut o = [0u8; 88];
    let t = a.mtime as u64;
    for (at, v) in [
        (0, a.ino),
        (8, a.size),
        (16, a.blocks),
        (24, t),
        (32, t),
        (40, t),
    ] {
        o[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    // atimensec, mtimensec, ctimensec (60..) stay 0; then mode, nlink, uid, gid, rdev,
    // blksize, flags.
    for (at, v) in [
        (60, mode(a)),
        (64, a.nlink),
        (68, a.uid),
        (72, a.gid),
        (76, a.rdev),
        (80, BLKSIZE),
    ] {
        o[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    o
}

/// `struct fuse_entry_out` for an entry (inode 0: a negative entry the kernel caches).
fn entry_out(a: &Attr) -> [u8; 128] {
    let mut o = [0u8; 128];
    o[0..8].copy_from_slice(&a.ino.to_ne_bytes());
    // generation (8..16) is 0
    o[16..24].copy_from_slice(&TTL.as_secs().to_ne_bytes());
    o[24..32].copy_from_slice(&TTL.as_secs().to_ne_bytes());
    o[32..36].copy_from_slice(&TTL.subsec_nanos().to_ne_bytes());
    o[36..40].copy_from_slice(&TTL.subsec_nanos().to_ne_bytes());
    o[40..128].copy_from_slice(&fuse_attr(a));
    o
}

/// Append one `fuse_dirent` (or `fuse_direntplus`) to `buf`; `None` if it does not fit.
fn dirent(buf: &mut [u8], e: &DirEntry<'_>, plus: bool) -> Option<usize> {
    let head = if plus { 128 } else { 0 };
    let len = (head + 24 + e.name.len()).next_multiple_of(8);
    if len > buf.len() {
        return None;
    }
    let buf = &mut buf[..len];
    if plus {
        if e.plain {
            // Node ID 0: listed, not instantiated.
            buf[..128].fill(0);
        } else {
            buf[..128].copy_from_slice(&entry_out(&e.attr));
        }
    }
    let d = &mut buf[head..];
    d[0..8].copy_from_slice(&e.attr.ino.to_ne_bytes());
    d[8..16].copy_from_slice(&e.next_offset.to_ne_bytes());
    d[16..20].copy_from_slice(&(e.name.len() as u32).to_ne_bytes());
    d[20..24].copy_from_slice(&(mode(&e.attr) >> 12).to_ne_bytes());
    d[24..24 + e.name.len()].copy_from_slice(e.name);
    d[24 + e.name.len()..].fill(0);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Kind;

    fn attr(kind: Kind) -> Attr {
        Attr {
            ino: 42,
            kind,
            perm: 0o755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            size: 12345,
            blocks: 25,
            mtime: 1_700_000_000,
            rdev: 0,
        }
    }

    #[test]
    fn attributes_sit_where_linux_fuse_h_puts_them() {
        let o = entry_out(&attr(Kind::Dir));
        assert_eq!(u64_at(&o, 0), 42, "nodeid");
        assert_eq!(u64_at(&o, 16), TTL.as_secs(), "entry_valid");
        let a = &o[40..];
        assert_eq!(u64_at(a, 0), 42, "ino");
        assert_eq!(u64_at(a, 8), 12345, "size");
        assert_eq!(u64_at(a, 16), 25, "blocks");
        assert_eq!(u64_at(a, 32), 1_700_000_000, "mtime");
        assert_eq!(u32_at(a, 60), libc::S_IFDIR | 0o755, "mode");
        assert_eq!(
            (u32_at(a, 64), u32_at(a, 68), u32_at(a, 72)),
            (2, 1000, 100)
        );
        assert_eq!(u32_at(a, 80), BLKSIZE, "blksize");
        // A negative entry is node 0, still cached for the TTL.
        let n = entry_out(&super::super::ops::NEGATIVE);
        assert_eq!((u64_at(&n, 0), u64_at(&n, 16)), (0, TTL.as_secs()));
    }

    #[test]
    fn directory_entries_are_padded_to_8_bytes_and_refused_when_full() {
        let a = attr(Kind::Symlink);
        let e = DirEntry {
            ino: 42,
            next_offset: 7,
            attr: a,
            name: b"abc",
            plain: false,
        };
        let mut buf = [0xffu8; 256];
        assert_eq!(dirent(&mut buf, &e, false), Some(32)); // 24 + 3, padded
        assert_eq!(u64_at(&buf, 8), 7, "off");
        assert_eq!(u32_at(&buf, 16), 3, "namelen");
        assert_eq!(u32_at(&buf, 20), libc::S_IFLNK >> 12, "type");
        assert_eq!(&buf[24..32], b"abc\0\0\0\0\0");
        assert_eq!(dirent(&mut buf, &e, true), Some(160)); // 128 + 24 + 3, padded
        assert_eq!(u64_at(&buf, 128 + 8), 7);
        assert_eq!(u64_at(&buf, 0), 42, "node ID");
        assert_eq!(dirent(&mut buf[..159], &e, true), None);
        // A plain entry: node ID 0 (the kernel instantiates nothing), d_ino the entry's.
        let plain = DirEntry { plain: true, ..e };
        assert_eq!(dirent(&mut buf, &plain, true), Some(160));
        assert_eq!((u64_at(&buf, 0), u64_at(&buf, 128)), (0, 42));
    }

    #[test]
    fn the_rings_carry_requests_only_once_every_queue_has_an_entry() {
        let s = RingStats::default();
        assert_eq!(s.transport(), "/dev/fuse");
        s.cpus.store(2, Relaxed);
        s.queues.store(2, Relaxed);
        assert_eq!(s.transport(), "/dev/fuse", "INIT did not agree");
        s.agreed.store(true, Relaxed);
        assert_eq!(s.transport(), "io_uring");
        s.queues.store(1, Relaxed);
        assert_eq!(s.transport(), "/dev/fuse", "one queue short");
    }
}
