//! The keeper: the small process that holds a mount's `/dev/fuse` descriptor, so the
//! mount outlives the process that serves it (a crash, `kill -9`, an upgrade).
//!
//! A FUSE connection lives as long as some process holds its descriptor. The keeper is
//! the process that mounted; it does no indexing, no network, no decoding. It starts the
//! server (this same binary, the same command line, [`wire::SERVER_FD_ENV`] set), and
//! when the server has loaded its sources it mounts, reads the kernel's INIT and hands
//! the server the descriptor and the INIT bytes ([`wire`]). When the server dies, for
//! any reason, the keeper starts another; the new one replays INIT into its own session
//! (`transport::session::adopt`), and once it serves, the keeper asks the kernel to send
//! again what the dead one had read and not answered
//! (`transport::device::notify_resend`). Readers see a pause, not an error. On a kernel
//! without resend each server gets a cloned descriptor, whose release fails what the
//! dead server had read instead of leaving it waiting.
//!
//! **Inode numbers.** The kernel keeps the node IDs the old server gave out (open files,
//! a shell's cwd, a container's root). A new server answers for them: the first
//! generation numbers the merged tree itself, grafts take ranges fixed by their
//! directory's number (`tree::view`), and after an activation (whose numbers depend on
//! history) the server hands the keeper the new generation's numbering table before the
//! kernel sees it (`Changed`, a memfd), which the next server takes. The keeper keeps the
//! digest of the last tree (`fs::numbering_digest`); a `pkgfs store`'s new server first
//! grows the names its predecessors grew (`Grew`, `Grow`); a new server whose tree still
//! differs (a source changed under `--no-watch`) is refused. See
//! docs/ARCHITECTURE.md, "A mount that outlives its server".
//!
//! **Giving up.** [`RestartLimit::count`] deaths within its window, or a new server
//! refused: the keeper answers every request with `EIO` itself
//! (`transport::device::answer_eio`), so readers fail fast instead of hanging, until
//! `pkgfs reload` tries again or the mount is unmounted.
//!
//! **Reload.** `pkgfs reload MOUNTPOINT` connects to the keeper's socket (abstract
//! `pkgfs-keeper-<st_dev>`), the keeper starts the installed binary beside the old
//! server; when the new one serves, the old one is stopped and the kernel resends what
//! it had in flight. A new server that refuses (another handover format, other sources)
//! exits and the old one keeps serving; the client hears why.

pub mod wire;

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use log::{info, warn};

use crate::transport::device;
use crate::transport::session::{self, MountOptions};
use wire::{KeeperReport, ToKeeper, ToServer, WIRE};

/// Set (non-empty), the keeper acts as on a kernel without `FUSE_NOTIFY_RESEND`: each
/// server gets a cloned descriptor (tests of that path run on kernels that have it).
pub const NO_RESEND_ENV: &str = "PKGFS_KEEPER_NO_RESEND";

/// How many server deaths within a window make the keeper give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartLimit {
    /// Deaths that make it give up.
    pub count: u32,
    /// Within this window.
    pub window: Duration,
}

impl Default for RestartLimit {
    fn default() -> Self {
        RestartLimit {
            count: 3,
            window: Duration::from_secs(60),
        }
    }
}

impl std::fmt::Display for RestartLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}s", self.count, self.window.as_secs())
    }
}

/// What a keeper needs.
pub struct KeeperConfig {
    /// The server's executable: the installed path, read again at every start (an
    /// upgrade replaces it; `pkgfs reload` starts the new one).
    pub exe: PathBuf,
    /// The server's arguments (the `pkgfs mount …` command line, without argv[0]).
    pub args: Vec<OsString>,
    /// Environment for the server, beyond the keeper's own.
    pub env: Vec<(OsString, OsString)>,
    /// How to mount.
    pub mount: MountOptions,
    /// When to give up.
    pub limit: RestartLimit,
    /// Called once the first server serves (the daemon tells `pkgfs mount` and lets go
    /// of the terminal).
    pub on_ready: Box<dyn FnOnce() + Send>,
}

/// Why the keeper failed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The first server failed before serving; it said why (on the same terminal).
    #[error("the server failed ({0})")]
    FirstServer(String),
    /// The first server was refused, or mounting failed.
    #[error("{0}")]
    Mount(String),
    /// A process, thread or socket could not be made.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// What reaches the keeper's loop.
enum Event {
    /// Server `id` said something (with these descriptors beside it).
    Said(u64, ToKeeper, Vec<OwnedFd>),
    /// Server `id`'s socket reached its end: everything it said has been heard.
    Closed(u64),
    /// Server `id` ended.
    Gone(u64, ExitStatus),
    /// `pkgfs reload`.
    Reload(UnixStream),
    /// SIGINT, SIGTERM or SIGHUP: unmount.
    Signal(i32),
    /// The connection ended while the keeper answered requests itself.
    Ended,
}

/// A server process.
struct Server {
    id: u64,
    pid: u32,
    sock: OwnedFd,
    /// It said it panicked.
    panic: Option<String>,
    /// It was refused the connection, and why.
    refused: Option<String>,
    /// How it ended, once reaped.
    exited: Option<ExitStatus>,
    /// It was handed the connection (only then do its announcements count).
    taken: bool,
    /// It was asked to grow the names earlier servers grew.
    grew: bool,
    /// Its socket reached its end (all it said was heard): its end is handled once both
    /// this and `exited` are in, so a last `Changed` is never lost to the race.
    closed: bool,
}

/// A reload under way: the new server, the client to tell, and the old server once it
/// is being stopped.
struct Reload {
    client: UnixStream,
    /// The old server, once the new one serves and it is being stopped.
    retiring: Option<u64>,
    /// The old server is gone (what it had read was sent again).
    retired: bool,
    /// The new server is fully up (its status answers).
    ready: bool,
}

/// The keeper's state.
struct Keeper {
    cfg: KeeperConfig,
    on_ready: Option<Box<dyn FnOnce() + Send>>,
    tx: mpsc::Sender<Event>,
    next_id: u64,
    dev: Option<File>,
    init: Vec<u8>,
    /// The kernel resends what a dead server had read (`FUSE_NOTIFY_RESEND`); without
    /// it each server gets a cloned descriptor, whose end fails those requests.
    resend: bool,
    reply: Option<Vec<u8>>,
    digest: Option<String>,
    /// The last generation a server announced: its next fresh inode number and its
    /// numbering table (a memfd), handed to the next server.
    journal: Option<(u64, OwnedFd)>,
    /// What lookups grew the tree by (`pkgfs store`), in order.
    grown: Vec<(Vec<u8>, Vec<u8>)>,
    /// The pull secrets servers were given (`pkgfs store --cri-image-proxy`), the newest
    /// per repository, oldest first, at most [`wire::SECRETS_HELD`]: handed to each next
    /// server before it grows the tree again. In memory only, never read here.
    secrets: Vec<wire::HeldSecret>,
    /// The inodes of older generations the kernel holds, with their archives.
    retired: (Vec<wire::RetiredEntry>, Vec<OwnedFd>),
    current: Option<Server>,
    pending: Option<Server>,
    retiring: Vec<Server>,
    reload: Option<Reload>,
    /// When servers died (the window of the restart limit).
    deaths: Vec<Instant>,
    /// Since when readers wait (a server died or was being replaced).
    down_since: Option<Instant>,
    report: KeeperReport,
    /// Answering `EIO` (gave up): the flag stops the thread.
    refusing: Option<(Arc<AtomicBool>, std::thread::JoinHandle<u64>)>,
    listener_bound: bool,
    unmounting: bool,
}

/// Run a keeper: start the first server, mount when it is ready, keep the mount served
/// until it is unmounted or a signal asks to unmount it. Blocks SIGINT, SIGTERM and
/// SIGHUP in the calling thread (call before any other thread starts).
pub fn run(cfg: KeeperConfig) -> Result<(), KeeperError> {
    let set = block_signals();
    let (tx, rx) = mpsc::channel();
    let sig_tx = tx.clone();
    spawn_thread("pkgfs-keeper-sig", move || {
        loop {
            let mut sig = 0;
            // SAFETY: `set` is an initialised signal set; `sig` a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0
                && sig_tx.send(Event::Signal(sig)).is_err()
            {
                return;
            }
        }
    })?;
    let limit = cfg.limit;
    let mut k = Keeper {
        on_ready: None,
        tx,
        next_id: 0,
        dev: None,
        init: Vec::new(),
        resend: false,
        reply: None,
        digest: None,
        journal: None,
        grown: Vec::new(),
        secrets: Vec::new(),
        retired: (Vec::new(), Vec::new()),
        current: None,
        pending: None,
        retiring: Vec::new(),
        reload: None,
        deaths: Vec::new(),
        down_since: None,
        report: KeeperReport {
            keeper_pid: std::process::id(),
            restart_limit: limit.to_string(),
            ..KeeperReport::default()
        },
        refusing: None,
        listener_bound: false,
        unmounting: false,
        cfg,
    };
    k.on_ready = Some(std::mem::replace(&mut k.cfg.on_ready, Box::new(|| {})));
    let first = k.start_server()?;
    k.current = Some(first);
    for ev in rx.iter() {
        if let Some(end) = k.handle(ev)? {
            return end;
        }
    }
    Ok(())
}

type Step = Result<Option<Result<(), KeeperError>>, KeeperError>;

impl Keeper {
    fn handle(&mut self, ev: Event) -> Step {
        match ev {
            Event::Said(id, msg, fds) => self.said(id, msg, fds),
            Event::Gone(id, status) => {
                let Some(s) = self.server_any(id) else {
                    return Ok(None);
                };
                s.exited = Some(status);
                if s.closed {
                    self.gone(id, status)
                } else {
                    Ok(None)
                }
            }
            Event::Closed(id) => {
                let Some(s) = self.server_any(id) else {
                    return Ok(None);
                };
                s.closed = true;
                match s.exited {
                    Some(status) => self.gone(id, status),
                    None => Ok(None),
                }
            }
            Event::Reload(client) => {
                self.reload(client);
                Ok(None)
            }
            Event::Signal(sig) => {
                info!(
                    "signal {sig}: unmounting {}",
                    self.cfg.mount.mountpoint.display()
                );
                self.unmount()
            }
            Event::Ended => {
                let ended = self
                    .dev
                    .as_ref()
                    .is_some_and(|d| device::ended(d.as_fd(), Duration::ZERO));
                if ended && self.current.is_none() {
                    info!("unmounted; exiting");
                    return Ok(Some(Ok(())));
                }
                Ok(None)
            }
        }
    }

    /// Start a server process on a new socket pair; its reader and waiter threads
    /// report to the loop.
    fn start_server(&mut self) -> Result<Server, KeeperError> {
        let start = |what, source| KeeperError::Start { what, source };
        let (ours, theirs) = wire::pair().map_err(|e| start("the keeper socket", e))?;
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(&self.cfg.exe);
        cmd.args(&self.cfg.args)
            .env(wire::SERVER_FD_ENV, fd.to_string())
            .envs(self.cfg.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let keeper = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls between fork and exec: the server dies
        // with its keeper, and inherits its end of the pair (close-on-exec cleared).
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != keeper {
                    libc::_exit(1);
                }
                cloexec_from(3);
                libc::fcntl(fd, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| start("the server", e))?;
        drop(theirs);
        let id = self.next_id;
        self.next_id += 1;
        let pid = child.id();
        let tx = self.tx.clone();
        spawn_thread("pkgfs-keeper-wait", move || {
            if let Ok(status) = child.wait() {
                let _ = tx.send(Event::Gone(id, status));
            }
        })?;
        let tx = self.tx.clone();
        let read = ours
            .try_clone()
            .map_err(|e| start("the keeper socket", e))?;
        spawn_thread("pkgfs-keeper-read", move || {
            while let Ok((msg, fds)) = wire::recv::<ToKeeper>(read.as_fd()) {
                if tx.send(Event::Said(id, msg, fds)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::Closed(id));
        })?;
        info!("started server {pid}");
        Ok(Server {
            id,
            pid,
            sock: ours,
            panic: None,
            refused: None,
            exited: None,
            taken: false,
            grew: false,
            closed: false,
        })
    }

    /// Any server by id, the retiring included.
    fn server_any(&mut self, id: u64) -> Option<&mut Server> {
        let retiring = self.retiring.iter_mut();
        [self.current.as_mut(), self.pending.as_mut()]
            .into_iter()
            .flatten()
            .chain(retiring)
            .find(|s| s.id == id)
    }

    fn server_mut(&mut self, id: u64) -> Option<&mut Server> {
        [self.current.as_mut(), self.pending.as_mut()]
            .into_iter()
            .flatten()
            .find(|s| s.id == id)
    }

    fn said(&mut self, id: u64, msg: ToKeeper, mut fds: Vec<OwnedFd>) -> Step {
        match msg {
            ToKeeper::Hello {
                wire,
                digest,
                secrets,
            } => self.hello(id, wire, digest, secrets),
            ToKeeper::Secret { held } => {
                if self.server_mut(id).is_some_and(|s| s.taken) {
                    wire::hold(&mut self.secrets, held);
                }
                Ok(None)
            }
            ToKeeper::Serving { reply } => {
                self.serving(id, reply);
                Ok(None)
            }
            ToKeeper::Ready => {
                self.ready(id);
                Ok(None)
            }
            ToKeeper::Changed { digest, next_ino } => {
                if !self.server_mut(id).is_some_and(|s| s.taken) {
                    return Ok(None);
                }
                match fds.pop() {
                    Some(table) => {
                        self.digest = Some(digest);
                        self.journal = Some((next_ino, table));
                    }
                    None => warn!("a new generation came without its numbering table"),
                }
                Ok(None)
            }
            ToKeeper::Retired { entries } => {
                if self.server_mut(id).is_some_and(|s| s.taken) {
                    self.retired = (entries, fds);
                }
                Ok(None)
            }
            ToKeeper::Grew { dir, name } => {
                if self.server_mut(id).is_some_and(|s| s.taken) {
                    self.grown.push((dir, name));
                }
                Ok(None)
            }
            ToKeeper::Panicked { message } => {
                if let Some(s) = self.server_mut(id) {
                    s.panic = Some(message);
                }
                Ok(None)
            }
        }
    }

    /// A server loaded its sources and asks for the connection; `secrets`: it takes
    /// pull secrets.
    fn hello(&mut self, id: u64, wire: u32, digest: String, secrets: bool) -> Step {
        let Some(sock) = self.server_mut(id).map(|s| s.sock.try_clone()) else {
            return Ok(None);
        };
        let Ok(sock) = sock else { return Ok(None) };
        // The secrets first: growing the tree again reads the private images.
        if secrets && !self.secrets.is_empty() && self.server_mut(id).is_some_and(|s| !s.grew) {
            info!(
                "handing {} pull secrets to the new server",
                self.secrets.len()
            );
            for msg in wire::secrets_messages(self.secrets.clone()) {
                if let Err(e) = wire::send(sock.as_fd(), &msg, &[]) {
                    warn!("cannot hand pull secrets over: {e}");
                }
            }
        }
        let replay = !self.grown.is_empty()
            && self.digest.as_ref().is_some_and(|d| *d != digest)
            && self.server_mut(id).is_some_and(|s| !s.grew);
        if replay {
            // A store: grow what earlier servers grew, then compare again.
            if let Some(s) = self.server_mut(id) {
                s.grew = true;
            }
            let msg = ToServer::Grow {
                names: self.grown.clone(),
            };
            let _ = wire::send(sock.as_fd(), &msg, &[]);
            return Ok(None);
        }
        if let Some(why) = self.refusal(wire, &digest) {
            warn!("server refused: {why}");
            let _ = wire::send(sock.as_fd(), &ToServer::Refuse { why: why.clone() }, &[]);
            if self.dev.is_none() {
                return Ok(Some(Err(KeeperError::Mount(why))));
            }
            if let Some(s) = self.server_mut(id) {
                s.refused = Some(why);
            }
            return Ok(None);
        }
        if self.dev.is_none() {
            match self.mount() {
                Ok(()) => self.digest = Some(digest),
                Err(why) => {
                    let _ = wire::send(sock.as_fd(), &ToServer::Refuse { why: why.clone() }, &[]);
                    return Ok(Some(Err(KeeperError::Mount(why))));
                }
            }
        }
        if let Some(s) = self.server_mut(id) {
            s.taken = true;
        }
        let Some(dev) = &self.dev else {
            return Ok(None);
        };
        let take = ToServer::Take {
            init: self.init.clone(),
            reply: self.reply.clone(),
            report: self.report.clone(),
            numbering: self.journal.as_ref().map(|(next, _)| *next),
            retired: self.retired.0.clone(),
            secrets: true,
        };
        let clone = if self.resend {
            None
        } else {
            match device::clone_device(dev) {
                Ok(c) => Some(c),
                Err(e) => {
                    warn!("cannot clone the connection's descriptor ({e}): sharing it");
                    None
                }
            }
        };
        let mut fds = vec![clone.as_ref().map_or(dev.as_fd(), |c| c.as_fd())];
        if let Some((_, table)) = &self.journal {
            info!("the new server numbers the tree by the last generation's table");
            fds.push(table.as_fd());
        }
        fds.extend(self.retired.1.iter().map(|f| f.as_fd()));
        if let Err(e) = wire::send(sock.as_fd(), &take, &fds) {
            warn!("cannot hand the connection over: {e}");
        }
        Ok(None)
    }

    /// Why a server must not take over, if it must not.
    fn refusal(&self, wire: u32, digest: &str) -> Option<String> {
        if wire != WIRE {
            return Some(format!(
                "the new server speaks handover format {wire}, this keeper {WIRE}: \
                 unmount and mount again to change it"
            ));
        }
        match &self.digest {
            Some(d) if d != digest => Some(if self.journal.is_some() {
                "the new server's tree is not the one the old server served last (the \
                 sources changed since its last activation, or the tree grew by lookups, \
                 which a new server does not repeat): the kernel's inode numbers would \
                 mean other entries"
                    .into()
            } else {
                "the sources are not what they were at mount (an archive changed or \
                 went): a new server would give the kernel's inode numbers another \
                 meaning"
                    .into()
            }),
            _ => None,
        }
    }

    /// Mount, and read the kernel's INIT.
    fn mount(&mut self) -> Result<(), String> {
        let dev = device::mount(&self.cfg.mount).map_err(|e| e.to_string())?;
        match device::read_init(&dev) {
            Ok(init) => {
                self.resend = device::kernel_resends(&init)
                    && std::env::var_os(NO_RESEND_ENV).is_none_or(|v| v.is_empty());
                if !self.resend {
                    warn!(
                        "the kernel cannot resend requests in flight (FUSE_NOTIFY_RESEND, \
                         Linux 6.9): each server gets a descriptor of its own, and the \
                         requests a dying server had read fail (ECONNABORTED)"
                    );
                }
                self.init = init;
                self.dev = Some(dev);
                Ok(())
            }
            Err(e) => {
                let _ = session::unmount(&self.cfg.mount.mountpoint, true);
                Err(format!("reading the kernel's INIT: {e}"))
            }
        }
    }

    /// A server's session reads requests. The first one's answer to INIT goes to the
    /// kernel now (through the descriptor INIT came on: a cloned one would not find it).
    fn serving(&mut self, id: u64, reply: Vec<u8>) {
        if self.reply.is_none() {
            if let Some(dev) = &self.dev
                && let Err(e) = device::write_all(dev.as_fd(), &reply)
            {
                warn!("cannot answer the kernel's INIT: {e}");
            }
            self.reply = Some(reply);
        }
        if self.pending.as_ref().is_some_and(|p| p.id == id) {
            // A reload: stop the old server; once it is gone the kernel resends what it
            // had read.
            let new = self.pending.take();
            if let Some(old) = std::mem::replace(&mut self.current, new) {
                stop(&old);
                if let Some(r) = &mut self.reload {
                    r.retiring = Some(old.id);
                }
                self.retiring.push(old);
            }
            self.down_since = Some(Instant::now());
            return;
        }
        if self.down_since.is_some() {
            self.resend();
        }
    }

    /// Ask the kernel to resend what a dead server had read, and note the pause.
    fn resend(&mut self) {
        if let Some(dev) = self.dev.as_ref().filter(|_| self.resend)
            && let Err(e) = device::notify_resend(dev.as_fd())
        {
            warn!(
                "the kernel cannot resend requests in flight ({e}; Linux 6.9 or later \
                 can): the readers that waited on them stay blocked"
            );
        }
        if let Some(t) = self.down_since.take() {
            let ms = t.elapsed().as_millis() as u64;
            self.report.last_pause_ms = Some(ms);
            self.report.pauses_ms.push(ms);
            let over = self
                .report
                .pauses_ms
                .len()
                .saturating_sub(wire::PAUSES_KEPT);
            self.report.pauses_ms.drain(..over);
            info!("serving again after {ms} ms");
            self.send_report();
        }
    }

    /// A reload is done when the old server is gone and the new one fully up: tell
    /// the client, and the new server what its status shows.
    fn finish_reload(&mut self) {
        if let Some(r) = self.reload.take_if(|r| r.retired && r.ready) {
            self.send_report();
            tell(r.client, "ok: the new server serves");
        }
    }

    /// Tell the current server what `pkgfs status` shows of the keeper.
    fn send_report(&self) {
        if let Some(s) = &self.current {
            let msg = ToServer::Report {
                report: self.report.clone(),
            };
            let _ = wire::send(s.sock.as_fd(), &msg, &[]);
        }
    }

    /// A server is fully up (status answers): the first tells `pkgfs mount`.
    fn ready(&mut self, id: u64) {
        if self.current.as_ref().is_none_or(|s| s.id != id) {
            return;
        }
        if let Some(r) = &mut self.reload {
            r.ready = true;
            self.finish_reload();
        } else {
            self.send_report();
        }
        if let Some(f) = self.on_ready.take() {
            f();
        }
        if !self.listener_bound {
            self.listener_bound = true;
            if let Err(e) = self.listen() {
                warn!("no reload channel: {e}");
            }
        }
    }

    /// Bind `pkgfs-keeper-<st_dev>` for `pkgfs reload`.
    fn listen(&self) -> std::io::Result<()> {
        let dev = session::mount_device(&self.cfg.mount.mountpoint)
            .ok_or_else(|| std::io::Error::other("the mount is not in the mount table"))?;
        let address = address(dev)?;
        let here = session::mount_path(&self.cfg.mount.mountpoint);
        let tx = self.tx.clone();
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        spawn_thread("pkgfs-keeper-reload", move || {
            // Device numbers are reused: the keeper of a mount that has just gone may
            // hold this name for the moment it takes to exit.
            let start = Instant::now();
            let listener = loop {
                match UnixListener::bind_addr(&address) {
                    Ok(l) => break l,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AddrInUse
                            && start.elapsed() < Duration::from_secs(10) =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        warn!("no reload channel: {e}");
                        return;
                    }
                }
            };
            for conn in listener.incoming().flatten() {
                match wire::peer_uid(&conn) {
                    Some(uid) if uid == me || uid == 0 => {}
                    _ => continue,
                }
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                if BufReader::new(&conn)
                    .take(4096)
                    .read_line(&mut line)
                    .is_err()
                {
                    continue;
                }
                match line.trim_end_matches('\n').strip_prefix("reload ") {
                    Some(mp) if std::path::Path::new(mp) == here => {}
                    _ => {
                        tell(
                            conn,
                            &format!("error: this keeper serves {}", here.display()),
                        );
                        continue;
                    }
                }
                if tx.send(Event::Reload(conn)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// A server ended.
    fn gone(&mut self, id: u64, status: ExitStatus) -> Step {
        let (panic, refused) = [self.current.as_ref(), self.pending.as_ref()]
            .into_iter()
            .flatten()
            .find(|s| s.id == id)
            .map_or((None, None), |s| (s.panic.clone(), s.refused.clone()));
        let cause = match &refused {
            Some(why) => format!("refused: {why}"),
            None => cause(status, panic),
        };
        if let Some(i) = self.retiring.iter().position(|s| s.id == id) {
            self.retiring.remove(i);
            self.resend();
            if let Some(r) = self.reload.as_mut().filter(|r| r.retiring == Some(id)) {
                r.retired = true;
                self.report.reloads += 1;
                self.report.restarts += 1;
                self.report.last_cause = Some("reload".into());
                self.finish_reload();
            }
            return Ok(None);
        }
        if self.pending.as_ref().is_some_and(|p| p.id == id) {
            self.pending = None;
            if let Some(r) = self.reload.take() {
                tell(
                    r.client,
                    &format!(
                        "error: the new server did not take over ({cause}); the old one serves"
                    ),
                );
            }
            return Ok(None);
        }
        if self.current.as_ref().is_none_or(|c| c.id != id) {
            return Ok(None);
        }
        let was = self.current.take();
        let Some(dev) = &self.dev else {
            // The first server ended before the mount: it said why.
            return Ok(Some(Err(KeeperError::FirstServer(cause))));
        };
        if self.unmounting || device::ended(dev.as_fd(), Duration::ZERO) {
            info!("unmounted; exiting");
            return Ok(Some(Ok(())));
        }
        warn!("server {} ended ({cause})", was.map_or(0, |s| s.pid));
        self.report.last_cause = Some(cause);
        self.down_since.get_or_insert_with(Instant::now);
        if let Some(why) = refused {
            // Another server would be refused the same way.
            self.give_up(&why);
            return Ok(None);
        }
        self.restart()
    }

    /// Start a new server after a death, unless the limit says give up.
    fn restart(&mut self) -> Step {
        let now = Instant::now();
        let window = self.cfg.limit.window;
        self.deaths.retain(|t| now.duration_since(*t) < window);
        self.deaths.push(now);
        if self.deaths.len() as u32 >= self.cfg.limit.count {
            self.give_up(&format!(
                "{} servers died within {:?} (--restart-limit {})",
                self.deaths.len(),
                window,
                self.cfg.limit
            ));
            return Ok(None);
        }
        self.report.restarts += 1;
        let s = self.start_server()?;
        self.current = Some(s);
        Ok(None)
    }

    /// Answer every request with EIO from now on (until a reload or the unmount).
    fn give_up(&mut self, why: &str) {
        let Some(dev) = self.dev.as_ref().and_then(|d| d.try_clone().ok()) else {
            return;
        };
        warn!(
            "giving up restarting: {why}; every request fails with EIO until `pkgfs reload \
             {}` or an unmount",
            self.cfg.mount.mountpoint.display()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let _ = device::notify_resend(dev.as_fd());
        let tx = self.tx.clone();
        match std::thread::Builder::new()
            .name("pkgfs-keeper-eio".into())
            .spawn(move || {
                let n = device::answer_eio(&dev, &flag);
                let _ = tx.send(Event::Ended);
                n
            }) {
            Ok(h) => self.refusing = Some((stop, h)),
            Err(e) => warn!("cannot start answering EIO: {e}"),
        }
        self.down_since = None;
    }

    /// `pkgfs reload`: start the installed binary beside the current server.
    fn reload(&mut self, client: UnixStream) {
        if self.reload.is_some() || self.pending.is_some() {
            tell(client, "error: a reload is already under way");
            return;
        }
        if let Some((stop, h)) = self.refusing.take() {
            stop.store(true, Ordering::Release);
            let refused = h.join().unwrap_or(0);
            info!("reload: trying servers again ({refused} requests were refused)");
            self.deaths.clear();
            self.down_since = Some(Instant::now());
            match self.start_server() {
                Ok(s) => {
                    self.current = Some(s);
                    self.report.restarts += 1;
                    self.report.reloads += 1;
                    self.report.last_cause = Some("reload after giving up".into());
                    tell(client, "ok: a new server is starting");
                }
                Err(e) => tell(client, &format!("error: {e}")),
            }
            return;
        }
        match self.start_server() {
            Ok(s) => {
                self.pending = Some(s);
                self.reload = Some(Reload {
                    client,
                    retiring: None,
                    retired: false,
                    ready: false,
                });
            }
            Err(e) => tell(client, &format!("error: {e}")),
        }
    }

    /// Unmount (a signal asked); the servers end when the connection does, and the
    /// keeper when the current one has.
    fn unmount(&mut self) -> Step {
        self.unmounting = true;
        if let Err(e) = session::unmount(&self.cfg.mount.mountpoint, false) {
            warn!("{e}");
        }
        if let Some((stop, _)) = &self.refusing {
            stop.store(true, Ordering::Release);
        }
        if self.current.is_none() {
            // Nobody to wait for (gave up, or between servers).
            return Ok(Some(Ok(())));
        }
        // A server that does not notice within a bound is stopped.
        let pids: Vec<u32> = [self.current.as_ref(), self.pending.as_ref()]
            .into_iter()
            .flatten()
            .map(|s| s.pid)
            .collect();
        spawn_thread("pkgfs-keeper-stop", move || {
            std::thread::sleep(Duration::from_secs(5));
            for pid in pids {
                // SAFETY: signalling our own child (PR_SET_PDEATHSIG keeps it ours).
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        })?;
        Ok(None)
    }
}

/// Mark every descriptor from `first` up close-on-exec: a process that outlives the
/// one that started it must not keep that one's pipes open (a test harness waiting for
/// its output's end would wait as long as the mount lives). Async-signal-safe.
pub fn cloexec_from(first: u32) {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets flags; on a kernel
    // without it the call fails and nothing changes.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// Stop a server that is being replaced.
fn stop(s: &Server) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.pid as libc::pid_t, libc::SIGKILL) };
}

/// Write one line to a reload client and close it.
fn tell(mut client: UnixStream, line: &str) {
    let _ = writeln!(client, "{line}");
}

/// How a server ended, in words.
fn cause(status: ExitStatus, panic: Option<String>) -> String {
    let how = match (status.code(), status.signal()) {
        (_, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
        (Some(code), _) => format!("exited with status {code}"),
        _ => "ended".into(),
    };
    match panic {
        Some(p) => format!("{how} after a panic: {p}"),
        None => how,
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// The socket address of the keeper of the mount with device number `dev`.
fn address(dev: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pkgfs-keeper-{dev}").as_bytes())
}

/// `pkgfs reload MOUNTPOINT`: ask its keeper to replace its server, and say how it went.
pub fn ask_reload(mountpoint: &std::path::Path) -> Result<String, String> {
    // From the mount table, not stat: after the keeper gave up, stat may fail with EIO.
    let dev = session::mount_device(mountpoint)
        .ok_or_else(|| format!("{} is not a mountpoint", mountpoint.display()))?;
    let addr = address(dev).map_err(|e| e.to_string())?;
    let mut conn = UnixStream::connect_addr(&addr).map_err(|_| {
        format!(
            "{} has no keeper (not a pkgfs mount, or mounted with --no-keeper or by an \
             older pkgfs)",
            mountpoint.display()
        )
    })?;
    let here = session::mount_path(mountpoint);
    conn.write_all(format!("reload {}\n", here.display()).as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let answer = answer.trim().to_string();
    match answer.strip_prefix("ok: ") {
        Some(ok) => Ok(ok.to_string()),
        None => Err(answer
            .strip_prefix("error: ")
            .unwrap_or(if answer.is_empty() {
                "the keeper closed the connection"
            } else {
                &answer
            })
            .to_string()),
    }
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), KeeperError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|source| KeeperError::Start {
            what: "a keeper thread",
            source,
        })
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(s, libc::SIG_DFL);
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_name_the_signal_the_status_and_the_panic() {
        assert_eq!(
            cause(ExitStatus::from_raw(libc::SIGKILL), None),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            cause(ExitStatus::from_raw(3 << 8), None),
            "exited with status 3"
        );
        assert_eq!(
            cause(ExitStatus::from_raw(101 << 8), Some("boom".into())),
            "exited with status 101 after a panic: boom"
        );
        assert_eq!(RestartLimit::default().to_string(), "3/60s");
    }
}
