//! The mount daemon: start-up wiring and signals.
//!
//! `pkgfs mount` without `--foreground` starts a copy of itself in a new session with a
//! pipe on its standard output, and returns only when that child reports the mount ready
//! (or exits with the reason it could not mount), so scripts can use the mountpoint at
//! once. Warnings found while indexing reach the user's terminal; after that the
//! daemon's log goes to `--log-file` or nowhere.
//!
//! [`run_foreground`] puts the parts together and owns the threads they run on:
//! the packages ([`Packages`]) become a [`PkgFs`], served by a [`Handler`] through
//! `fuser`'s workers ([`session::start`]) and, when the kernel agrees, the io_uring
//! queues ([`uring::start`]); the read-ahead loops ([`crate::fs::prefetch::start`]), the
//! status channel ([`status::serve`]) and live activation ([`Live`]) each get a thread.
//! The main thread blocks SIGINT/SIGTERM/SIGHUP before any other thread starts and
//! waits for them with `sigwait`; on a signal it unmounts (lazily if busy) and exits. An external
//! `pkgfs umount` ends the session, which wakes the main thread too.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use log::{debug, info, warn};

use crate::config::MountConfig;
use crate::format::IndexCache;
use crate::fs::prefetch::{self, HINT_QUEUE};
use crate::fs::{KernelCache, PkgFs};
use crate::io::registry::keychain::Keychain;
use crate::io::remote::ObjectVersion;
use crate::keeper::wire::{self, KeeperReport, ToKeeper, ToServer};
use crate::source::chores::Chores;
use crate::source::live::Activity;
use crate::source::live::{Activator, Live, skipped_list};
use crate::source::store::{LayerStore, StoreOptions};
use crate::source::watch::Watcher;
use crate::source::{LoadOptions, Packages};
use crate::status::{self, MountInfo};
use crate::transport::fuse::{Fuse, KernelNotifier};
use crate::transport::ops::{AccessRule, Handler};
use crate::transport::session::{self, MountOptions, SessionError};
use crate::transport::uring::{self, RingStats};
use std::os::fd::{AsFd, OwnedFd};

/// Environment variable that marks the background child of `pkgfs mount`.
const READY_ENV: &str = "PKGFS_READY_PIPE";

/// Why `pkgfs mount` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// Mounting (or clearing the mountpoint) failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A source lies under the mountpoint: the mount would hide it.
    #[error(
        "source {path} is {} the mountpoint {mountpoint}: the mount would hide it",
        if *.same { "the same directory as" } else { "inside" }
    )]
    HiddenSource {
        /// The source.
        path: PathBuf,
        /// The mountpoint.
        mountpoint: PathBuf,
        /// The source is the mountpoint itself.
        same: bool,
    },
    /// The sources could not be read (not a bad archive: those are skipped).
    #[error(transparent)]
    Sources(#[from] crate::error::Error),
    /// A thread or process of the daemon could not be started.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A source that is a local path cannot be used.
    #[error("source {path}: {why}")]
    BadSource {
        /// The source as given.
        path: PathBuf,
        /// What is wrong and what to do.
        why: String,
    },
    /// FUSE cannot be used here (`/dev/fuse` or `fusermount3`).
    #[error("{0}")]
    NoFuse(String),
    /// The background daemon ended before reporting the mount ready.
    #[error("the daemon exited before the mount was ready ({0})")]
    Exited(std::process::ExitStatus),
    /// The background daemon failed and said why on the terminal (one line): nothing more
    /// to print, only the exit status.
    #[error("the daemon failed")]
    Reported,
    /// The keeper failed (mounting, or starting its server).
    #[error(transparent)]
    Keeper(#[from] crate::keeper::KeeperError),
    /// A server could not talk to its keeper.
    #[error(transparent)]
    Wire(#[from] crate::keeper::wire::WireError),
    /// This server may not take over the mount (it exits; the mount stays with its
    /// keeper).
    #[error("not taking over the mount: {0}")]
    Refused(String),
    /// `pkgfs reload` did not replace the server.
    #[error("reload of {mountpoint}: {why}")]
    Reload {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// What the keeper said.
        why: String,
    },
}

/// `pkgfs mount`: mount in the foreground, or start a background daemon and wait for it.
/// `args` is the `pkgfs mount …` command line (after any mount-helper translation); the
/// background daemon is started with it.
pub fn mount(cfg: &MountConfig, args: &[std::ffi::OsString]) -> Result<(), DaemonError> {
    if let Some(sock) = keeper_socket() {
        // A server started by a keeper: the mountpoint is (or is about to be) the
        // keeper's mount, served by nobody until this process serves it, so nothing
        // here may touch it before then.
        return run_foreground(cfg, Some(sock));
    }
    check_sources(cfg)?;
    session::prepare_mountpoint(&cfg.mountpoint)?;
    refuse_hidden_sources(cfg)?;
    check_fuse()?;
    if cfg.foreground || std::env::var_os(READY_ENV).is_some() {
        if use_keeper(cfg) {
            run_keeper(cfg, args)
        } else {
            run_foreground(cfg, None)
        }
    } else {
        spawn_background(cfg, args)
    }
}

/// `pkgfs reload`: ask the mount's keeper to replace its server.
pub fn reload(mountpoint: &Path) -> Result<(), DaemonError> {
    let said = crate::keeper::ask_reload(mountpoint).map_err(|why| DaemonError::Reload {
        mountpoint: mountpoint.to_path_buf(),
        why,
    })?;
    info!("{}: {said}", mountpoint.display());
    Ok(())
}

/// The keeper's socket, if this process is a server a keeper started.
fn keeper_socket() -> Option<OwnedFd> {
    use std::os::fd::FromRawFd;
    let fd: i32 = std::env::var(crate::keeper::wire::SERVER_FD_ENV)
        .ok()?
        .parse()
        .ok()?;
    // SAFETY: is it open? F_GETFD only reads the descriptor's flags.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the keeper passed this descriptor to us alone; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: as above; close-on-exec again, so nothing this process starts inherits it.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(sock)
}

/// Whether a keeper holds this mount's connection: unless `--no-keeper`.
fn use_keeper(cfg: &MountConfig) -> bool {
    cfg.keeper
}

/// Be the keeper of this mount: start servers, hold the connection (`crate::keeper`).
fn run_keeper(cfg: &MountConfig, args: &[std::ffi::OsString]) -> Result<(), DaemonError> {
    let exe = std::env::current_exe().map_err(|source| DaemonError::Start {
        what: "the keeper (own executable)",
        source,
    })?;
    let background = std::env::var_os(READY_ENV).is_some();
    let log = cfg.log_file.clone();
    let kc = crate::keeper::KeeperConfig {
        exe,
        args: args.iter().skip(1).cloned().collect(),
        env: Vec::new(),
        mount: mount_options(cfg),
        limit: cfg.restart_limit,
        on_ready: Box::new(move || {
            if background {
                detach_output(log.as_deref());
            }
        }),
    };
    match crate::keeper::run(kc) {
        Ok(()) => Ok(()),
        // The first server said why, on the same terminal.
        Err(crate::keeper::KeeperError::FirstServer(_)) => Err(DaemonError::Reported),
        Err(e) => Err(e.into()),
    }
}

/// `pkgfs umount`.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), DaemonError> {
    Ok(session::unmount(mountpoint, lazy)?)
}

/// Local sources that do not exist or cannot be read, found before any daemon starts
/// (images and remote stores are checked when they are opened).
fn check_sources(cfg: &MountConfig) -> Result<(), DaemonError> {
    use std::io::ErrorKind;
    for s in &cfg.sources {
        let remote = s
            .to_str()
            .and_then(crate::source::remote::RemoteRef::parse)
            .is_some();
        if remote || crate::source::image::ImageRef::parse(s.as_os_str()).is_some() {
            continue;
        }
        let readable = std::fs::metadata(s).and_then(|m| {
            if m.is_dir() {
                std::fs::read_dir(s).map(drop)
            } else {
                std::fs::File::open(s).map(drop)
            }
        });
        let why = match readable {
            Ok(()) => continue,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                "no such file or directory (give archives, directories of archives, image \
                 references or URLs)"
                    .to_string()
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                "permission denied (it must be readable by the user who mounts)".to_string()
            }
            Err(e) => e.to_string(),
        };
        return Err(DaemonError::BadSource {
            path: s.clone(),
            why,
        });
    }
    Ok(())
}

/// What FUSE needs here: `/dev/fuse` that can be opened, and for a user who is not root,
/// the `fusermount3` helper that mounts on their behalf.
fn check_fuse() -> Result<(), DaemonError> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(DaemonError::NoFuse(format!(
            "cannot open /dev/fuse: {e} (load the module: modprobe fuse; in a container, \
             pass the device: --device /dev/fuse)"
        )));
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    if !root && !on_path("fusermount3") {
        return Err(DaemonError::NoFuse(
            "fusermount3 is not on PATH: a user who is not root mounts through it \
             (install the fuse3 package)"
                .into(),
        ));
    }
    Ok(())
}

/// A source at or under the mountpoint would be hidden by the mount: the daemon would
/// then reopen its archives and rescan its directory through itself.
fn refuse_hidden_sources(cfg: &MountConfig) -> Result<(), DaemonError> {
    let Ok(mp) = std::fs::canonicalize(&cfg.mountpoint) else {
        return Ok(());
    };
    for s in &cfg.sources {
        if let Ok(c) = std::fs::canonicalize(s)
            && c.starts_with(&mp)
        {
            return Err(DaemonError::HiddenSource {
                path: s.clone(),
                mountpoint: cfg.mountpoint.clone(),
                same: c == mp,
            });
        }
    }
    Ok(())
}

/// Start the daemon in the background and wait for its "ready": this process forked
/// when it has one thread (the command line is parsed and checked already; running the
/// binary again cost a warm 1.5-2 ms of a 45 ms mount), else this command line run
/// again.
fn spawn_background(cfg: &MountConfig, args: &[std::ffi::OsString]) -> Result<(), DaemonError> {
    let one_thread = std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1);
    if one_thread {
        fork_background(cfg, args)
    } else {
        exec_background(args)
    }
}

/// [`spawn_background`] by `fork`: the child returns from here as the daemon, with what
/// the daemon's `main` would return.
fn fork_background(cfg: &MountConfig, args: &[std::ffi::OsString]) -> Result<(), DaemonError> {
    use std::os::fd::AsRawFd;
    let start = |what, source| DaemonError::Start { what, source };
    let (ready, tell) = std::io::pipe().map_err(|e| start("the daemon (its pipe)", e))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| start("the daemon (/dev/null)", e))?;
    // SAFETY: this process has one thread (the caller checked), so the child may run
    // anything the parent could.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(start("the daemon", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // The daemon: its own session (the shell's SIGINT and SIGHUP do not reach it),
        // standard input from /dev/null, standard output the pipe its "ready" goes
        // down, and no other descriptor of its caller's (it must not hold their pipes
        // for the life of the mount). These three are closed by the range below.
        let (tell_fd, null_fd) = (tell.as_raw_fd(), null.as_raw_fd());
        std::mem::forget((ready, tell, null));
        // SAFETY: descriptors of this process only; nothing else refers to those closed.
        unsafe {
            libc::setsid();
            libc::dup2(null_fd, 0);
            libc::dup2(tell_fd, 1);
            libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0);
            // One thread: nothing reads the environment meanwhile. The keeper's servers
            // inherit it.
            std::env::set_var(READY_ENV, "1");
        }
        return if use_keeper(cfg) {
            run_keeper(cfg, args)
        } else {
            run_foreground(cfg, None)
        };
    }
    drop(tell);
    drop(null);
    let mut line = String::new();
    let _ = BufReader::new(ready).read_line(&mut line);
    if line.trim() == "ready" {
        return Ok(());
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(start("the daemon", std::io::Error::last_os_error()));
    }
    // A daemon that exited with an error said why on the terminal (its stderr is ours).
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 0 {
        return Err(DaemonError::Reported);
    }
    use std::os::unix::process::ExitStatusExt as _;
    Err(DaemonError::Exited(std::process::ExitStatus::from_raw(
        status,
    )))
}

/// [`spawn_background`] by running this same command line again.
fn exec_background(args: &[std::ffi::OsString]) -> Result<(), DaemonError> {
    let start = |what, source| DaemonError::Start { what, source };
    let exe = std::env::current_exe().map_err(|e| start("the daemon (own executable)", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(args.iter().skip(1))
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: setsid and close_range are async-signal-safe; setsid detaches the daemon
    // from the terminal's session so the shell's SIGINT/SIGHUP do not reach it, and no
    // descriptor but stdio outlives the exec (the daemon must not hold its caller's
    // pipes for the life of the mount).
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            crate::keeper::cloexec_from(3);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| start("the daemon", e))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "ready" {
        return Ok(());
    }
    let status = child.wait().map_err(|e| start("the daemon", e))?;
    // A daemon that exited with an error said why on the terminal (its stderr is ours).
    if status.code().is_some_and(|c| c != 0) {
        return Err(DaemonError::Reported);
    }
    Err(DaemonError::Exited(status))
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            // A shell starts background jobs with SIGINT ignored, and an ignored signal is
            // discarded even while blocked: restore the default so sigwait receives it.
            libc::signal(s, libc::SIG_DFL);
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Threads that open and index archives at least: reading indexes from a cold disk waits
/// more than it computes, so more reads in flight than cores shorten a mount (609 ZIP
/// packages 0.21 → 0.19 s, 10,000 packages 1.84 → 1.55 s on 2 cores, same peak memory).
const MIN_INDEX_THREADS: usize = 8;

/// Spawn a named thread of the daemon.
fn spawn(
    name: &str,
    what: &'static str,
    f: impl FnOnce() + Send + 'static,
) -> Result<(), DaemonError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|source| DaemonError::Start { what, source })
}

/// Mount and serve until unmounted or signalled.
///
/// The start-up order, each stage a function below, and why it comes where it does:
/// 1. [`prepare_process`]: SIGINT/SIGTERM/SIGHUP blocked before any thread exists (every
///    thread inherits the mask, so only the final `sigwait` sees them), and the
///    descriptor table grown while no other thread shares it (later growths wait an RCU
///    grace period each: [`crate::io::blob::reserve_descriptor_slots`]); the descriptor
///    limit raised and the allocator tuned before archives are opened.
/// 2. [`watch_sources`]: the watcher exists before the first scan, so a package
///    installed while the scan runs is not missed.
/// 3. [`first_scan`]: the tree, before anything is mounted (a scan that fails leaves no
///    mount behind).
/// 4. [`serve`]: the FUSE session (INIT is done when it returns), then the io_uring
///    queues (only if INIT agreed to them), then the read-ahead threads (they push
///    through the session's notifier).
/// 5. The status channel, once the mount exists (it is named by the mount's device),
///    bound before ready so a status asked right after the mount is answered.
/// 6. [`go_live`]: the watcher's thread last, since activations need the notifier and
///    the activity the status channel shows.
/// 7. Ready: only now is `pkgfs mount` told (output detached), so a script that uses
///    the mountpoint at once finds everything up.
/// 8. [`wait_for_end`]: `sigwait` until a signal or the session's end.
///
/// `keeper`: this process is a server a keeper started ([`crate::keeper`]); stage 4
/// then takes the keeper's connection instead of mounting, and a signal ends the
/// process without unmounting (the keeper holds the mount and starts another server).
pub fn run_foreground(cfg: &MountConfig, keeper: Option<OwnedFd>) -> Result<(), DaemonError> {
    let signals = prepare_process();
    let sources = all_sources(cfg);
    let mut packages = Packages::new(sources.clone(), load_options(cfg));
    let watcher = watch_sources(cfg, &packages)?;
    let under_keeper = keeper.is_some();
    // A store's pull secrets (its CRI proxy's) cross to and from its keeper.
    let keychain = if cfg.store {
        Some(packages.registries()?.keychain().clone())
    } else {
        None
    };
    let (fs, activity, store, mut cri) = if let Some(chain) = &keychain {
        let (fs, store) = open_store(cfg, &packages)?;
        // Under a keeper, the server this one replaces may still answer on the proxy's
        // socket until this one has taken over: the proxy starts after that. A socket
        // another process serves fails the start now, before the keeper mounts.
        let cri = if under_keeper {
            if let Some(c) = &cfg.cri_proxy {
                refuse_a_strangers_socket(&c.listen)?;
            }
            None
        } else {
            start_cri_proxy(cfg, chain, None)?
        };
        (fs, Arc::default(), Some(store), cri)
    } else {
        let (fs, activity) = first_scan(cfg, &mut packages, watcher.is_some())?;
        (fs, activity, None, None)
    };
    let (session, kernel, rings, kept) = serve(cfg, &fs, keeper, keychain.as_ref())?;
    if let Some(chain) = keychain.as_ref().filter(|_| under_keeper) {
        // A server that follows another waits for it to let go of the socket (the
        // keeper stops it once this one serves); the first takes it or fails now.
        let wait = kept
            .as_ref()
            .is_some_and(|k| k.follows)
            .then_some(CRI_SOCKET_WAIT);
        cri = start_cri_proxy(cfg, chain, wait)?;
    }
    let _cri = cri;
    if let Some(k) = kept.clone() {
        let (g, r) = (k.clone(), k.clone());
        fs.on_retire(Box::new(move |list| r.retired(list)));
        fs.on_change(Box::new(move |view, next_ino| k.changed(view, next_ino)));
        fs.on_grow(Box::new(move |dir, name| {
            let msg = ToKeeper::Grew {
                dir: dir.to_vec(),
                name: name.to_vec(),
            };
            let _ = g.say(&msg);
        }));
    }
    let info = MountInfo {
        mountpoint: session::mount_path(&cfg.mountpoint),
        sources,
        watching: watcher.is_some(),
        whiteouts: cfg.merge.whiteouts,
        layout: cfg.merge.layout.kind,
        started: SystemTime::now(),
        rings,
        remote: packages.remote_made(),
        store,
        seals: cfg
            .merge
            .verify
            .is_some()
            .then(|| packages.seals() as Arc<dyn crate::source::verify::SealState>),
        keeper: kept.as_ref().map(|k| k.report.clone()),
    };
    match session::raise_readahead(&cfg.mountpoint) {
        Some(dev) => {
            if let Err(e) = status::serve(dev, fs.clone(), info, activity.clone()) {
                warn!("no status channel: {e}");
            }
        }
        None => warn!("cannot stat the mountpoint: no status channel"),
    }
    let chores = Arc::new(Chores::default());
    let first_chores = packages.take_chores();
    if let Some(w) = watcher {
        go_live(w, packages, fs, kernel, activity, chores.clone())?;
    }
    info!("mounted at {}", cfg.mountpoint.display());
    chores.run(first_chores);
    if let Some(k) = &kept {
        k.say(&ToKeeper::Ready)?;
    }
    if std::env::var_os(READY_ENV).is_some() {
        detach_output(cfg.log_file.as_deref());
    }
    if !kept.as_ref().is_some_and(|k| k.follows) {
        // Into the log (after the quiet start), once a mount: not again by each server
        // a keeper starts.
        if let Some(advice) = crate::transport::host::HostSettings::read().advice() {
            info!("host: {advice}");
        }
    }
    wait_for_end(cfg, session, &signals, kept.is_some())
}

/// The sources of a mount: the command line's, then the layout's bytecode directory
/// (python), made if missing; without it, the mount serves no bytecode.
fn all_sources(cfg: &MountConfig) -> Vec<PathBuf> {
    let mut sources = cfg.sources.clone();
    if let Some(dir) = &cfg.merge.layout.bytecode {
        match std::fs::create_dir_all(dir) {
            Ok(()) => sources.push(dir.clone()),
            Err(e) => warn!("no bytecode: cannot make {}: {e}", dir.display()),
        }
    }
    sources
}

/// Stage 1: the signal mask and the descriptor table's size (both before any thread),
/// the descriptor limit, the allocator.
fn prepare_process() -> libc::sigset_t {
    let set = block_signals();
    raise_fd_limit();
    let slots = crate::io::blob::reserve_descriptor_slots();
    debug!("descriptor table: {slots:?} slots");
    tune_allocator();
    set
}

/// How a mount's packages are loaded.
fn load_options(cfg: &MountConfig) -> LoadOptions {
    let mut opts = cfg.merge.load_options(
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(MIN_INDEX_THREADS),
        cfg.owner,
        cfg.cache_bytes,
        cfg.index_cache.clone(),
        cfg.remote.clone(),
    );
    opts.keep_tree = cfg.kept_tree;
    opts
}

/// How a new server loads the archives of the inodes of older generations the kernel
/// still holds: each alone, placed by the mount's layout (npm without its lockfile: the
/// package at its name, its modes as npm writes them), or merged for an inode outside
/// the packages' own directories of `each` and `cargo`; the mount's strip applied; not
/// checked against a seal (the old server checked them).
fn restore_options(cfg: &MountConfig) -> (LoadOptions, LoadOptions) {
    use crate::layout::Kind;
    let kind = cfg.merge.layout.kind;
    let folded = restore_options_as(
        cfg,
        match kind {
            Kind::Merge | Kind::Npm | Kind::Python => kind,
            Kind::Each | Kind::Cargo => Kind::Merge,
        },
    );
    let own = restore_options_as(cfg, kind);
    (folded, own)
}

/// [`restore_options`] under layout `kind`.
fn restore_options_as(cfg: &MountConfig, kind: crate::layout::Kind) -> LoadOptions {
    let mut merge = cfg.merge.clone();
    merge.layout.kind = kind;
    merge.layout.lockfile = None;
    merge.verify = None;
    let mut opts = merge.load_options(
        MIN_INDEX_THREADS,
        cfg.owner,
        cfg.cache_bytes,
        cfg.index_cache.clone(),
        cfg.remote.clone(),
    );
    // Each archive alone, by a link named after a descriptor: nothing to keep.
    opts.keep_tree = false;
    opts
}

/// Serve the inodes of older generations an earlier server served (a file open in a
/// package an activation removed; its file may be gone): each archive is opened again,
/// a local one through the descriptor the keeper kept (`/proc/self/fd/N`, by a link
/// named as the archive so its format is known), a store's object as the version the
/// old server listed (its disk cache serves what it fetched; the rest is asked for with
/// that version's ETag, so a version gone from the server fails as it did for the old
/// server). Each is loaded alone and each inode found there by its path. What cannot be
/// found is logged and fails as an unknown inode.
fn restore_retired(
    fs: &PkgFs,
    entries: &[wire::RetiredEntry],
    archives: Vec<OwnedFd>,
    (merged, own): &(LoadOptions, LoadOptions),
) {
    use std::os::fd::AsRawFd;
    let options = |e: &wire::RetiredEntry| if e.in_graft { own } else { merged };
    let Ok(dir) = tempfile::tempdir() else {
        warn!("no directory for the archives of older generations: not serving them");
        return;
    };
    for (i, fd) in archives.iter().enumerate() {
        let mine: Vec<&wire::RetiredEntry> =
            entries.iter().filter(|e| e.archive as usize == i).collect();
        let Some(first) = mine.first() else { continue };
        let name = Path::new(&first.name)
            .file_name()
            .map_or_else(|| std::ffi::OsString::from("archive"), |n| n.to_os_string());
        let link = dir.path().join(i.to_string()).join(name);
        let made = std::fs::create_dir_all(dir.path().join(i.to_string())).and_then(|()| {
            std::os::unix::fs::symlink(format!("/proc/self/fd/{}", fd.as_raw_fd()), &link)
        });
        if let Err(e) = made {
            warn!("{}: cannot link it: {e}", first.name);
            continue;
        }
        let alone = crate::source::load(std::slice::from_ref(&link), options(first));
        adopt_in(fs, alone, &mine);
    }
    // The descriptors opened through the links are the archives' own now.
    drop(archives);
    let mut objects: Vec<(&ObjectVersion, Vec<&wire::RetiredEntry>)> = Vec::new();
    for e in entries {
        let Some(v) = &e.object else { continue };
        match objects.iter_mut().find(|(o, _)| *o == v) {
            Some((_, mine)) => mine.push(e),
            None => objects.push((v, vec![e])),
        }
    }
    for (v, mine) in objects {
        adopt_in(fs, crate::source::load_object(v, options(mine[0])), &mine);
    }
}

/// Serve each of `entries` (inodes of one archive of an older generation) from `alone`,
/// that archive loaded again by itself.
fn adopt_in(
    fs: &PkgFs,
    alone: Result<(PkgFs, crate::source::LoadReport), crate::error::Error>,
    entries: &[&wire::RetiredEntry],
) {
    let Some(first) = entries.first() else { return };
    let alone = match alone {
        Ok((alone, _)) => alone,
        Err(e) => {
            warn!("{}: cannot open it again: {e}", first.name);
            return;
        }
    };
    // A package with a directory of its own: the one directory at the root; a package
    // the layout folded in at a place (npm's NAME): that place.
    let v = alone.view();
    let prefix: Vec<u8> = if first.in_graft {
        let root = v.tree.node(crate::tree::ROOT_INO);
        match root.and_then(|r| v.tree.children(r).next()) {
            Some((_, n)) => v.tree.name(n).to_vec(),
            None => Vec::new(),
        }
    } else {
        v.layers
            .iter()
            .find_map(|l| l.places.first().cloned())
            .unwrap_or_default()
    };
    for e in entries {
        let path = match (prefix.is_empty(), e.path.is_empty()) {
            (true, _) => e.path.clone(),
            (false, true) => prefix.clone(),
            (false, false) => [&prefix[..], b"/", &e.path[..]].concat(),
        };
        match alone.resolve(&path).and_then(|ino| alone.served(ino)) {
            Some((_, view, local)) => {
                // Kept open for as long as they serve (a local archive's link goes
                // with the caller).
                for l in &view.layers {
                    l.archive.blob.pin();
                }
                fs.adopt_retired(e.ino, view, local);
            }
            None => warn!(
                "{}: {} not found again",
                first.name,
                String::from_utf8_lossy(&e.path)
            ),
        }
    }
}

/// Stage 2: the watcher of the source directories (and the poll), if the mount is live.
fn watch_sources(cfg: &MountConfig, packages: &Packages) -> Result<Option<Watcher>, DaemonError> {
    let dirs = if cfg.watch {
        packages.source_dirs()
    } else {
        Vec::new()
    };
    if dirs.is_empty() && cfg.poll.is_none() {
        return Ok(None);
    }
    let w = Watcher::new(&dirs).map_err(|source| DaemonError::Start {
        what: "watching the sources",
        source,
    })?;
    if !dirs.is_empty() {
        info!("watching {} for packages", join_paths(&dirs));
    }
    Ok(Some(match cfg.poll {
        Some(every) => {
            info!("listing the sources again every {every:?}");
            w.with_poll(every)
        }
        None => w,
    }))
}

/// Stage 3: the first scan, as a filesystem, and the activity the status shows.
fn first_scan(
    cfg: &MountConfig,
    packages: &mut Packages,
    live: bool,
) -> Result<(Arc<PkgFs>, Arc<Mutex<Activity>>), DaemonError> {
    let scan = packages
        .scan(&HashSet::new())?
        .ok_or_else(|| crate::error::Error::Format("no packages".into()))?;
    info!(
        "mounting {} archives ({} skipped) at {}",
        scan.report.layers.len(),
        scan.report.skipped.len(),
        cfg.mountpoint.display()
    );
    let activity = Arc::new(Mutex::new(Activity {
        skipped: skipped_list(&scan.report),
        images: scan.report.images.iter().map(|i| i.summary()).collect(),
        ..Activity::default()
    }));
    let fs = Arc::new(PkgFs::with_grafts(
        scan.tree,
        scan.layers,
        scan.grafts,
        cfg.cache_bytes,
        live,
    ));
    if let Some(digest) = scan.numbering {
        // The scan computed it (a kept tree's): the keeper's check need not again.
        let _ = fs.view().digest.set(digest);
    }
    Ok((fs, activity))
}

/// Stage 3 of `pkgfs store`: an empty tree that grows as containers/storage looks up
/// images and layers (`source::store`), on the registry clients of `packages`.
fn open_store(cfg: &MountConfig, packages: &Packages) -> Result<StoreServed, DaemonError> {
    let registries = packages.registries()?;
    let store = Arc::new(LayerStore::new(
        StoreOptions {
            owner: cfg.owner,
            index_cache: cfg.index_cache.clone().map(IndexCache::new),
            platform: cfg.merge.platform.clone(),
        },
        Box::new(move || Ok(registries.clone())),
    ));
    info!(
        "serving an additional layer store at {}",
        cfg.mountpoint.display()
    );
    let fs = Arc::new(PkgFs::growing(
        store.empty_tree(),
        cfg.cache_bytes,
        store.clone(),
    ));
    Ok((fs, store))
}

/// A server under a keeper: fail if a process other than a server of the same keeper
/// (the one this server replaces, a sibling) answers on the CRI proxy's socket `listen`.
fn refuse_a_strangers_socket(listen: &Path) -> Result<(), DaemonError> {
    let Ok(conn) = std::os::unix::net::UnixStream::connect(listen) else {
        return Ok(());
    };
    let keeper = std::os::unix::process::parent_id();
    let parent = wire::peer(&conn).and_then(|c| {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.pid)).ok()?;
        // `PID (COMM) STATE PPID …`: COMM may hold spaces and parentheses.
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(1)?.parse::<u32>().ok()
    });
    if parent == Some(keeper) {
        return Ok(());
    }
    Err(DaemonError::Start {
        what: "the CRI image-service proxy",
        source: std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("another process serves {}", listen.display()),
        ),
    })
}

/// How long a store's server that replaces another waits for it to let go of the CRI
/// proxy's socket (it ends once the new server serves the mount).
const CRI_SOCKET_WAIT: Duration = Duration::from_secs(60);

/// `pkgfs store --cri-image-proxy`: the CRI image service on its socket, feeding
/// `keychain` (the store's registries'); served until the returned proxy is dropped. `wait`:
/// how long a live process answering on the socket is waited for to let go (none:
/// refused at once).
fn start_cri_proxy(
    cfg: &MountConfig,
    keychain: &Arc<Keychain>,
    wait: Option<Duration>,
) -> Result<Option<crate::snapshot::cri::CriProxy>, DaemonError> {
    let Some(c) = &cfg.cri_proxy else {
        return Ok(None);
    };
    crate::snapshot::cri::CriProxy::start(&c.listen, &c.upstream, keychain.clone(), wait)
        .map(Some)
        .map_err(|source| DaemonError::Start {
            what: "the CRI image-service proxy",
            source,
        })
}

/// A store's filesystem and what its status shows.
type StoreServed = (Arc<PkgFs>, Arc<dyn crate::source::store::StoreState>);

/// What serving a mount starts: the session, the kernel's caches through its notifier,
/// the rings' state, and the keeper if one holds the connection.
type Serving = (
    fuser::BackgroundSession,
    Arc<dyn KernelCache>,
    Arc<RingStats>,
    Option<Kept>,
);

/// A server's line to its keeper, and what the keeper last said of itself.
#[derive(Clone)]
struct Kept {
    sock: Arc<OwnedFd>,
    report: Arc<Mutex<KeeperReport>>,
    /// Another server served the mount before this one (a restart or a reload).
    follows: bool,
}

impl Kept {
    fn say(&self, msg: &ToKeeper) -> Result<(), DaemonError> {
        Ok(wire::send(self.sock.as_fd(), msg, &[])?)
    }

    /// Tell the keeper which inodes of older generations the kernel still holds, with
    /// descriptors of their archives (a next server serves them from those).
    fn retired(&self, list: &[crate::fs::Retired]) {
        let mut index: HashMap<u32, u32> = HashMap::new();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut entries = Vec::new();
        for (ino, view, local) in list {
            let Some(node) = view.tree.node(*local) else {
                continue;
            };
            let Some(layer) = view.layers.get(node.archive as usize) else {
                continue;
            };
            let a = &layer.archive;
            // A local file goes by descriptor, a store's object by its version.
            let object = a.blob.object();
            let archive = match index.get(&a.key) {
                Some(&i) => i,
                None if object.is_some() => wire::NO_ARCHIVE,
                // SCM_RIGHTS carries at most 253 descriptors a message.
                None if fds.len() >= 200 => continue,
                None => {
                    let Some(fd) = a.blob.duplicate_fd() else {
                        continue;
                    };
                    fds.push(fd);
                    let i = (fds.len() - 1) as u32;
                    index.insert(a.key, i);
                    i
                }
            };
            entries.push(wire::RetiredEntry {
                ino: *ino,
                archive,
                object,
                name: a
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: if view.graft_range().is_some() {
                    view.tree.path_of(*local)
                } else {
                    within_place(view.tree.path_of(*local), &layer.places)
                },
                in_graft: view.graft_range().is_some(),
            });
        }
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        if let Err(e) = wire::send(self.sock.as_fd(), &ToKeeper::Retired { entries }, &borrowed) {
            warn!("cannot tell the keeper of the inodes of older generations: {e}");
        }
    }

    /// Tell the keeper of a new generation before the kernel sees it: its digest and
    /// numbering table, for a next server to number it the same way.
    fn changed(&self, view: &crate::tree::view::View, next_ino: u64) {
        let msg = ToKeeper::Changed {
            digest: crate::fs::numbering_digest(view),
            next_ino,
        };
        match wire::table_memfd(&view.numbering_table()) {
            Ok(table) => {
                if let Err(e) = wire::send(self.sock.as_fd(), &msg, &[table.as_fd()]) {
                    warn!("cannot tell the keeper of the new generation: {e}");
                }
            }
            Err(e) => warn!("cannot write the numbering table for the keeper: {e}"),
        }
    }

    /// Keep the report up to date with what the keeper sends (`pkgfs-keeper` thread).
    fn listen(&self) -> Result<(), DaemonError> {
        let (sock, report) = (self.sock.clone(), self.report.clone());
        spawn("pkgfs-keeper", "the keeper's listener", move || {
            while let Ok((msg, _)) = wire::recv::<ToServer>(sock.as_fd()) {
                if let ToServer::Report { report: r } = msg {
                    *crate::sync::lock(&report) = r;
                }
            }
        })
    }
}

/// `path` (in a generation's tree) within the place a layout folded its package in:
/// what follows the longest of `places` it lies in (itself, if in none).
fn within_place(path: Vec<u8>, places: &[Vec<u8>]) -> Vec<u8> {
    let at = places
        .iter()
        .filter(|p| {
            path.starts_with(p) && (path.len() == p.len() || path.get(p.len()) == Some(&b'/'))
        })
        .max_by_key(|p| p.len());
    match at {
        Some(p) => path.get(p.len() + 1..).unwrap_or_default().to_vec(),
        None => path,
    }
}

/// The kernel-facing options of this mount.
fn mount_options(cfg: &MountConfig) -> MountOptions {
    MountOptions {
        mountpoint: cfg.mountpoint.clone(),
        fsname: cfg.fsname.clone(),
        access: AccessRule::for_this_process(cfg.access),
        noexec: cfg.noexec,
        noatime: cfg.noatime,
        suid: cfg.suid,
        dev: cfg.dev,
        threads: cfg.threads,
        signals: cfg.store,
    }
}

/// Stage 4: the session (fuser's workers; INIT done), the io_uring queues if INIT agreed
/// to them, the read-ahead threads. Under a keeper the session takes the keeper's
/// connection ([`take_over`]) and io_uring is not used (a ring belongs to the process
/// that set it up: a new server could not take it over).
fn serve(
    cfg: &MountConfig,
    fs: &Arc<PkgFs>,
    keeper: Option<OwnedFd>,
    keychain: Option<&Arc<Keychain>>,
) -> Result<Serving, DaemonError> {
    let (hints_tx, hints) = mpsc::sync_channel(HINT_QUEUE);
    let hints_tx = (cfg.prefetch_bytes > 0).then_some(hints_tx);
    fs.entries.set_enabled(cfg.plain_entries);
    let handler = Arc::new(Handler::new(fs.clone(), hints_tx));
    let rings = Arc::new(RingStats::default());
    let options = mount_options(cfg);
    let access = options.access;
    // Ask for io_uring only if rings can be made: once INIT agrees, the kernel holds
    // every request back until each CPU's queue has an entry.
    let uring = (cfg.io_uring && keeper.is_none() && uring::usable()).then(|| rings.clone());
    let fuse = Fuse::new(handler.clone(), uring);
    let (session, dev_fd, kept) = match keeper {
        None => {
            let (session, dev) = session::start(fuse, &options)?;
            (session, dev, None)
        }
        Some(sock) => {
            let (session, kept) =
                take_over(fuse, &options, sock, fs, &restore_options(cfg), keychain)?;
            (session, None, Some(kept))
        }
    };
    if rings.agreed.load(std::sync::atomic::Ordering::Acquire) {
        match dev_fd {
            // INIT agreed: without rings the kernel would hold every request back.
            None => {
                return Err(DaemonError::Start {
                    what: "FUSE over io_uring (no second /dev/fuse descriptor)",
                    source: std::io::Error::other("the descriptor could not be duplicated"),
                });
            }
            Some(dev) => match uring::start(dev, handler, access, cfg.threads, rings.clone()) {
                Ok(uring::Started::Rings) => info!("serving requests through FUSE over io_uring"),
                Ok(uring::Started::FellBack) => {}
                // The kernel holds requests back for rings that will never come: end the
                // mount rather than leave it hanging.
                Err(source) => {
                    return Err(DaemonError::Start {
                        what: "FUSE over io_uring, and could not turn it off",
                        source,
                    });
                }
            },
        }
    }
    let kernel: Arc<dyn KernelCache> = Arc::new(KernelNotifier(session.notifier()));
    fs.entries.set_kernel(kernel.clone());
    if cfg.prefetch_bytes > 0 {
        prefetch::start(fs.clone(), cfg.prefetch_bytes, hints, kernel.clone()).map_err(
            |source| DaemonError::Start {
                what: "the read-ahead threads",
                source,
            },
        )?;
    }
    Ok((session, kernel, rings, kept))
}

/// Set once a server has its keeper's socket: a panic tells the keeper (the cause it
/// shows if the server dies of it).
static PANIC_LINE: std::sync::OnceLock<Arc<OwnedFd>> = std::sync::OnceLock::new();

/// Take the keeper's connection: say what this server's numbering is, receive the
/// descriptor and the kernel's INIT, replay it into a session (the first server also
/// answers the kernel; a later one checks it would have answered the same), serve.
fn take_over(
    fuse: Fuse,
    options: &MountOptions,
    sock: OwnedFd,
    fs: &PkgFs,
    restore: &(LoadOptions, LoadOptions),
    keychain: Option<&Arc<Keychain>>,
) -> Result<(fuser::BackgroundSession, Kept), DaemonError> {
    let sock = Arc::new(sock);
    if PANIC_LINE.set(sock.clone()).is_ok() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |p| {
            if let Some(s) = PANIC_LINE.get() {
                let message = p.to_string();
                let _ = wire::send(s.as_fd(), &ToKeeper::Panicked { message }, &[]);
            }
            prev(p);
        }));
    }
    let hello = ToKeeper::Hello {
        wire: wire::WIRE,
        digest: fs.numbering_digest(),
        secrets: keychain.is_some(),
    };
    wire::send(sock.as_fd(), &hello, &[])?;
    let (init, reply, report, numbering, retired, secrets, mut fds) = loop {
        let (msg, fds) = wire::recv::<ToServer>(sock.as_fd())?;
        match msg {
            ToServer::Refuse { why } => return Err(DaemonError::Refused(why)),
            ToServer::Take {
                init,
                reply,
                report,
                numbering,
                retired,
                secrets,
            } => break (init, reply, report, numbering, retired, secrets, fds),
            ToServer::Report { .. } => continue,
            ToServer::Secrets { held } => {
                // Before the tree grows again: the private images need them.
                if let Some(k) = keychain {
                    let kept = held
                        .iter()
                        .filter_map(|h| Some((h, h.secret()?)))
                        .filter(|(h, s)| k.put_if_absent(&h.of.0, &h.of.1, s.clone()))
                        .count();
                    info!("{kept} pull secrets handed over by the keeper");
                }
                continue;
            }
            ToServer::Grow { names } => {
                // A store's tree grew under earlier servers: grow the same names.
                for (dir, name) in &names {
                    if let Err(e) = fs.replay_growth(dir, name) {
                        warn!("growing {} again: {e}", String::from_utf8_lossy(name));
                    }
                }
                let hello = ToKeeper::Hello {
                    wire: wire::WIRE,
                    digest: fs.numbering_digest(),
                    secrets: keychain.is_some(),
                };
                wire::send(sock.as_fd(), &hello, &[])?;
                continue;
            }
        }
    };
    if fds.is_empty() {
        return Err(DaemonError::Refused("the keeper sent no descriptor".into()));
    }
    let dev = fds.remove(0);
    if let Some(next_ino) = numbering {
        // The tree changed under an earlier server: number it as that one did.
        let table = fds
            .first()
            .ok_or_else(|| DaemonError::Refused("the keeper sent no numbering table".into()))
            .and_then(|t| {
                wire::read_table(t).map_err(|e| {
                    DaemonError::Refused(format!("cannot read the numbering table: {e}"))
                })
            })?;
        fs.adopt_numbering(table, next_ino)
            .map_err(|e| DaemonError::Refused(format!("the numbering table: {e}")))?;
        info!("numbered as the last server numbered its generation");
    }
    if !retired.is_empty() {
        let archives = fds.split_off(usize::from(numbering.is_some()).min(fds.len()));
        restore_retired(fs, &retired, archives, restore);
    }
    let (session, ours) = session::adopt(fuse, dev, &init, options)?;
    // The first server's answer goes to the kernel through the keeper (`Serving`); a
    // later one's must equal it.
    if reply.as_ref().is_some_and(|first| *first != ours) {
        return Err(DaemonError::Refused(
            "this server answers the kernel's INIT otherwise than the first did (another \
             version's capabilities), and the kernel keeps the first answer"
                .into(),
        ));
    }
    let session = session.spawn().map_err(|source| {
        DaemonError::Session(session::SessionError::Mount {
            path: options.mountpoint.clone(),
            source,
        })
    })?;
    let kept = Kept {
        sock,
        report: Arc::new(Mutex::new(report)),
        follows: reply.is_some(),
    };
    if let Some(k) = keychain.filter(|_| secrets) {
        // Each secret given from now on goes to the keeper too, for the next server.
        let line = kept.clone();
        k.observe(Box::new(move |host, repo, secret| {
            let held = wire::HeldSecret::of(host, repo, secret);
            if held.size() > wire::SECRETS_PER_MESSAGE {
                warn!("a pull secret for {host}/{repo} is too large to hand to the keeper");
                return;
            }
            if let Err(e) = line.say(&ToKeeper::Secret { held }) {
                warn!("cannot hand a pull secret for {host}/{repo} to the keeper: {e}");
            }
        }));
    }
    kept.listen()?;
    kept.say(&ToKeeper::Serving { reply: ours })?;
    info!("serving the keeper's connection");
    Ok((session, kept))
}

/// Stage 6: live activation on the `pkgfs-watch` thread, archives needing a long pass
/// on `pkgfs-index`.
fn go_live(
    watcher: Watcher,
    mut packages: Packages,
    fs: Arc<PkgFs>,
    kernel: Arc<dyn KernelCache>,
    activity: Arc<Mutex<Activity>>,
    chores: Arc<Chores>,
) -> Result<(), DaemonError> {
    packages.index_in_background(watcher.waker())?;
    let activator = Activator::new(packages, fs, kernel, activity).with_chores(chores);
    Live::new(watcher, activator)
        .spawn()
        .map_err(|source| DaemonError::Start {
            what: "the watcher",
            source,
        })
}

/// Stage 8: wait for a signal (then unmount) or for the session to end (an external
/// unmount).
fn wait_for_end(
    cfg: &MountConfig,
    session: fuser::BackgroundSession,
    set: &libc::sigset_t,
    kept: bool,
) -> Result<(), DaemonError> {
    let (done_tx, done_rx) = mpsc::channel();
    spawn("pkgfs-session", "the session thread", move || {
        let r = session.join();
        let _ = done_tx.send(r);
        // SAFETY: signalling our own process to wake the sigwait below.
        unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
    })?;
    loop {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set; `sig` is a valid out pointer.
        if unsafe { libc::sigwait(set, &mut sig) } != 0 {
            continue;
        }
        if sig == libc::SIGUSR1 {
            info!("unmounted; exiting");
            break;
        }
        if kept {
            info!("signal {sig}: exiting; the keeper holds the mount");
            break;
        }
        info!("signal {sig}: unmounting {}", cfg.mountpoint.display());
        if let Err(e) = session::unmount(&cfg.mountpoint, false) {
            warn!("{e}");
        }
        // The session ends once the kernel lets go of the mount.
        let _ = done_rx.recv_timeout(Duration::from_secs(10));
        break;
    }
    crate::source::keep_starts();
    Ok(())
}

fn join_paths(p: &[PathBuf]) -> String {
    p.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Set by [`quiet_until_ready`].
static QUIET_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Log only warnings (with `quiet`, only errors) until the mount is ready (they reach
/// the user's terminal), then the configured level (into the log file).
pub fn quiet_until_ready(quiet: bool) {
    QUIET_START.store(true, std::sync::atomic::Ordering::Relaxed);
    LEVEL_AFTER_READY.store(
        log::max_level() as usize,
        std::sync::atomic::Ordering::Relaxed,
    );
    let terminal = if quiet {
        log::LevelFilter::Error
    } else {
        log::LevelFilter::Warn
    };
    log::set_max_level(log::max_level().min(terminal));
}

static LEVEL_AFTER_READY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Tell the readiness pipe we are mounted, then point stdout and stderr at the log.
fn detach_output(log_file: Option<&Path>) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    if QUIET_START.load(std::sync::atomic::Ordering::Relaxed) {
        let level = match LEVEL_AFTER_READY.load(std::sync::atomic::Ordering::Relaxed) {
            0 => log::LevelFilter::Off,
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            _ => log::LevelFilter::Trace,
        };
        log::set_max_level(level);
    }
    let log = log_file.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|e| warn!("cannot open log file {}: {e}", p.display()))
            .ok()
    });
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .ok();
    use std::os::fd::AsRawFd;
    // SAFETY: dup2 onto the standard descriptors of our own process.
    unsafe {
        if let Some(n) = &null {
            libc::dup2(n.as_raw_fd(), 1);
        }
        match (&log, &null) {
            (Some(l), _) => libc::dup2(l.as_raw_fd(), 2),
            (None, Some(n)) => libc::dup2(n.as_raw_fd(), 2),
            _ => 0,
        };
    }
}

/// Cached blocks are 256 KiB buffers allocated and freed by every worker thread. glibc's
/// default raises its mmap threshold after the first such buffer is freed, after which
/// they come from per-thread heaps that fragment and never shrink: the daemon's resident
/// memory then grows to about twice the cache budget. A fixed threshold keeps blocks in
/// their own mappings, returned to the system when evicted.
fn tune_allocator() {
    // SAFETY: mallopt only sets allocator parameters; called before any worker starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Each archive stays open for the life of the mount: raise the soft descriptor limit to
/// the hard one so thousands of packages fit.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::within_place;

    #[test]
    fn a_path_within_the_longest_place_it_lies_in() {
        let places = vec![b"foo".to_vec(), b"bar/node_modules/foo".to_vec()];
        let within = |p: &str| within_place(p.as_bytes().to_vec(), &places);
        assert_eq!(within("foo/lib/x.js"), b"lib/x.js");
        assert_eq!(within("bar/node_modules/foo/lib/x.js"), b"lib/x.js");
        assert_eq!(within("foo"), b"");
        // A name that only begins like a place is not in it.
        assert_eq!(within("foobar/x"), b"foobar/x");
        assert_eq!(within_place(b"a/b".to_vec(), &[]), b"a/b");
    }
}
