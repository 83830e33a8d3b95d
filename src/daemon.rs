//! Mounting and unmounting: the daemon's life cycle.
//!
//! `pkgfs mount` without `--foreground` starts a copy of itself in a new session with a
//! pipe on its standard output, and returns only when that child reports the mount ready
//! (or exits with the reason it could not mount), so scripts can use the mountpoint at
//! once. Warnings found while indexing reach the user's terminal; after that the
//! daemon's log goes to `--log-file` or nowhere.
//!
//! In the foreground the main thread blocks SIGINT/SIGTERM/SIGHUP before any worker
//! starts and waits for them with `sigwait`; on a signal it unmounts (lazily if busy) and
//! exits. An external `pkgfs umount` ends the session, which wakes the main thread too.

use std::collections::HashSet;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use log::{debug, error, info, warn};

use crate::archive::seekable::IndexCache;
use crate::cli::{Access, MountConfig};
use crate::fs::PkgFs;
use crate::fuse::{Fuse, Handler};
use crate::prefetch::{Hint, Prefetcher, WARM_WINDOWS, Warmer};
use crate::source::{self, LoadOptions, Packages};
use crate::status::{self, Activity, MountInfo};
use crate::uring::{AccessRule, RingStats};
use crate::view::Invalidation;
use crate::watch::Watcher;

/// Environment variable that marks the background child of `pkgfs mount`.
const READY_ENV: &str = "PKGFS_READY_PIPE";
/// The filesystem subtype (`fuse.pkgfs` where the mount helper records subtypes).
pub const SUBTYPE: &str = "pkgfs";

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// `pkgfs mount`: mount in the foreground, or start a background daemon and wait for it.
/// `args` is the `pkgfs mount …` command line (after any mount-helper translation); the
/// background daemon is started with it.
pub fn mount(cfg: &MountConfig, args: &[std::ffi::OsString]) -> Result<(), String> {
    clear_dead_mount(&cfg.mountpoint)?;
    if !source::is_dir(&cfg.mountpoint) {
        return Err(format!(
            "mountpoint {} is not a directory",
            cfg.mountpoint.display()
        ));
    }
    refuse_hidden_sources(cfg)?;
    if cfg.foreground || std::env::var_os(READY_ENV).is_some() {
        run_foreground(cfg)
    } else {
        spawn_background(args)
    }
}

/// A source at or under the mountpoint would be hidden by the mount: the daemon would
/// then reopen its archives and rescan its directory through itself.
fn refuse_hidden_sources(cfg: &MountConfig) -> Result<(), String> {
    let Ok(mp) = std::fs::canonicalize(&cfg.mountpoint) else {
        return Ok(());
    };
    for s in &cfg.sources {
        if let Ok(c) = std::fs::canonicalize(s)
            && c.starts_with(&mp)
        {
            return Err(format!(
                "source {} is {} the mountpoint {}: the mount would hide it",
                s.display(),
                if c == mp {
                    "the same directory as"
                } else {
                    "inside"
                },
                cfg.mountpoint.display()
            ));
        }
    }
    Ok(())
}

/// Start this same command line again as a daemon and wait for its "ready".
fn spawn_background(args: &[std::ffi::OsString]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(args.iter().skip(1))
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the terminal's
    // session so the shell's SIGINT/SIGHUP do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "ready" {
        return Ok(());
    }
    let status = child.wait().map_err(|e| format!("daemon: {e}"))?;
    Err(format!(
        "the daemon exited before the mount was ready ({status})"
    ))
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

fn run_foreground(cfg: &MountConfig) -> Result<(), String> {
    // Before any thread exists, so every thread inherits the mask and only sigwait sees
    // these signals.
    let set = block_signals();
    raise_fd_limit();
    tune_allocator();
    let opts = LoadOptions {
        threads: std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(MIN_INDEX_THREADS),
        owner: cfg.owner,
        cache_bytes: cfg.cache_bytes,
        index_cache: cfg.index_cache.clone().map(IndexCache::new),
        whiteouts: cfg.whiteouts,
    };
    let mut packages = Packages::new(cfg.sources.clone(), opts);
    let dirs = packages.source_dirs();
    // Watch before the first scan, so nothing installed during it is missed.
    let watcher = if cfg.watch && !dirs.is_empty() {
        Some(Watcher::new(&dirs).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let scan = packages
        .scan(&HashSet::new())
        .map_err(|e| e.to_string())?
        .ok_or("no packages")?;
    info!(
        "mounting {} archives ({} skipped) at {}",
        scan.report.layers.len(),
        scan.report.skipped.len(),
        cfg.mountpoint.display()
    );
    let activity = Arc::new(Mutex::new(Activity {
        skipped: skipped_list(&scan.report),
        ..Activity::default()
    }));
    let fs = Arc::new(PkgFs::with_layers(
        scan.tree,
        scan.layers,
        cfg.cache_bytes,
        watcher.is_some(),
    ));
    let mut config = fuser::Config::default();
    config.mount_options = mount_options(cfg);
    config.acl = match cfg.access {
        Access::Owner => fuser::SessionACL::Owner,
        Access::RootAndOwner => fuser::SessionACL::RootAndOwner,
        Access::All => fuser::SessionACL::All,
    };
    config.n_threads = Some(cfg.threads);
    config.clone_fd = true;
    let (hints_tx, hints) = mpsc::sync_channel(PREFETCH_QUEUE);
    let hints_tx = (cfg.prefetch_bytes > 0).then_some(hints_tx);
    let handler = Arc::new(Handler::new(fs.clone(), hints_tx));
    let rings = Arc::new(RingStats::default());
    let fuse = Fuse::new(handler.clone(), cfg.io_uring.then(|| rings.clone()));
    let (session, dev_fd) = spawn_session(fuse, cfg, config)
        .map_err(|e| format!("cannot mount at {}: {e}", cfg.mountpoint.display()))?;
    if rings.agreed.load(Ordering::Acquire) {
        start_rings(dev_fd, handler, cfg, &rings);
    }
    if cfg.prefetch_bytes > 0 {
        let notifier = session.notifier();
        let prefetcher = Prefetcher::new(fs.clone(), cfg.prefetch_bytes);
        let mut warmer = Warmer::new(fs.clone());
        let position = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let (wake, woken) = mpsc::sync_channel(1);
        let at = position.clone();
        std::thread::Builder::new()
            .name("pkgfs-warm".into())
            .spawn(move || warm_loop(&mut warmer, &at, &woken))
            .map_err(|e| format!("cannot start the read-ahead threads: {e}"))?;
        std::thread::Builder::new()
            .name("pkgfs-prefetch".into())
            .spawn(move || prefetch_loop(prefetcher, &hints, &notifier, &position, &wake))
            .map_err(|e| format!("cannot start the read-ahead threads: {e}"))?;
    }
    let dev = raise_readahead(&cfg.mountpoint);
    let info = MountInfo {
        mountpoint: mount_path(&cfg.mountpoint),
        sources: cfg.sources.clone(),
        watching: watcher.is_some(),
        whiteouts: cfg.whiteouts,
        started: SystemTime::now(),
        rings,
    };
    match dev {
        Some(dev) => {
            if let Err(e) = status::serve(dev, fs.clone(), info, activity.clone()) {
                warn!("no status channel: {e}");
            }
        }
        None => warn!("cannot stat the mountpoint: no status channel"),
    }
    if let Some(w) = watcher {
        let notifier = session.notifier();
        let fs = fs.clone();
        std::thread::Builder::new()
            .name("pkgfs-watch".into())
            .spawn(move || watch_loop(w, packages, &fs, &notifier, &activity))
            .map_err(|e| format!("cannot start the watcher: {e}"))?;
        info!("watching {} for packages", join_paths(&dirs));
    }
    info!("mounted at {}", cfg.mountpoint.display());
    if std::env::var_os(READY_ENV).is_some() {
        detach_output(cfg.log_file.as_deref());
    }

    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = session.join();
        let _ = done_tx.send(r);
        // SAFETY: signalling our own process to wake the sigwait below.
        unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
    });
    loop {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set; `sig` is a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        if sig == libc::SIGUSR1 {
            info!("unmounted; exiting");
            break;
        }
        info!("signal {sig}: unmounting {}", cfg.mountpoint.display());
        if let Err(e) = unmount(&cfg.mountpoint, false) {
            warn!("{e}");
        }
        // The session ends once the kernel lets go of the mount.
        let _ = done_rx.recv_timeout(Duration::from_secs(10));
        break;
    }
    Ok(())
}

/// Run the calling thread under `SCHED_BATCH`: same share of the CPU, but it never
/// preempts a thread that wakes up. Decoding ahead is throughput work; the reader, the
/// FUSE workers and the push thread each wake for a short burst, and on a machine with
/// few cores, waiting for the warmer's time slice to end was waiting on the reader's
/// critical path (docs/BENCHMARKS.md, "Scheduling the decoder"). Any thread may choose
/// it; a failure only costs that.
fn as_batch() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        debug!(
            "cannot run the warmer as SCHED_BATCH: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Start the FUSE-over-io_uring queues (INIT agreed to them). A failure leaves the
/// mount on `/dev/fuse`, which keeps working: logged, not fatal.
fn start_rings(
    dev: Option<OwnedFd>,
    handler: Arc<Handler>,
    cfg: &MountConfig,
    stats: &Arc<RingStats>,
) {
    let Some(dev) = dev else {
        warn!("no second /dev/fuse descriptor: not using io_uring");
        return;
    };
    // SAFETY: geteuid cannot fail.
    let owner = unsafe { libc::geteuid() };
    let rule = AccessRule {
        owner,
        root: cfg.access == Access::RootAndOwner,
        all: cfg.access == Access::All,
    };
    match crate::uring::start(dev, handler, rule, cfg.threads, stats.clone()) {
        Ok(()) => info!("serving requests through FUSE over io_uring"),
        Err(e) => warn!("cannot start the io_uring queues: {e}; using /dev/fuse"),
    }
}

/// Hints waiting for the read-ahead thread; more are dropped.
const PREFETCH_QUEUE: usize = 1024;

/// The directory read-ahead thread: runs until the session (and with it the sender of
/// hints) is gone. A panic is logged and the thread carries on with the next hint.
fn prefetch_loop(
    mut prefetcher: Prefetcher,
    hints: &mpsc::Receiver<Hint>,
    notifier: &fuser::Notifier,
    position: &(AtomicU64, AtomicU64),
    wake: &mpsc::SyncSender<()>,
) {
    let take = |prefetcher: &mut Prefetcher, hint: Hint| {
        prefetcher.hint(hint);
        // Tell the warmer where the walk has got to.
        if let Some((at, window)) = prefetcher.walk_position() {
            position.1.store(window, Relaxed);
            if position.0.swap(at, Relaxed) != at {
                let _ = wake.try_send(());
            }
        }
    };
    let mut store =
        |ino: u64, offset: u64, data: &[u8]| notifier.store(fuser::INodeNo(ino), offset, data);
    loop {
        // Take every miss into account before the next push: a reader's position steers
        // what is pushed next. Wait only when there is nothing to push.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut more = true;
            while more {
                match hints.try_recv() {
                    Ok(hint) => take(&mut prefetcher, hint),
                    Err(mpsc::TryRecvError::Empty) => more = prefetcher.step(&mut store),
                    Err(mpsc::TryRecvError::Disconnected) => return false,
                }
            }
            match hints.recv() {
                Ok(hint) => {
                    take(&mut prefetcher, hint);
                    true
                }
                Err(_) => false,
            }
        }));
        match r {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => error!("directory read-ahead panicked; carrying on"),
        }
    }
}

/// The warmer thread: decode ahead of the walk each time it moves, until the session
/// (and with it the prefetch thread) is gone.
fn warm_loop(warmer: &mut Warmer, position: &(AtomicU64, AtomicU64), woken: &mpsc::Receiver<()>) {
    as_batch();
    while woken.recv().is_ok() {
        let (at, window) = (position.0.load(Relaxed), position.1.load(Relaxed));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            warmer.warm(at, window.saturating_mul(WARM_WINDOWS), &|| {
                position.0.load(Relaxed) != at
            })
        }));
        match r {
            Ok(bytes) => log::trace!("walk at inode {at}: {bytes} bytes decoded ahead"),
            Err(_) => error!("decoding ahead of a walk panicked; carrying on"),
        }
    }
}

fn join_paths(p: &[PathBuf]) -> String {
    p.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn skipped_list(report: &source::LoadReport) -> Vec<(PathBuf, String)> {
    report
        .skipped
        .iter()
        .map(|(p, e)| (p.clone(), e.to_string()))
        .collect()
}

/// The live mount: wait for a batch of changes in the source directories, rescan, swap
/// in the new tree, and tell the kernel exactly which cached entries went stale.
fn watch_loop(
    mut watcher: Watcher,
    mut packages: Packages,
    fs: &PkgFs,
    notifier: &fuser::Notifier,
    activity: &Mutex<Activity>,
) {
    loop {
        let batch = match watcher.next_batch() {
            Ok(b) => b,
            Err(e) => {
                error!("watching the sources failed: {e}; the mount keeps its current packages");
                return;
            }
        };
        let started = Instant::now();
        // A bug in a rescan must not end live activation: the mount keeps its tree.
        let scanned =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| packages.scan(&batch.busy)));
        let scan = match scanned {
            Ok(Ok(Some(scan))) => scan,
            Ok(Ok(None)) => {
                debug!("{} events, no package changed", batch.events);
                continue;
            }
            Ok(Err(e)) => {
                warn!("rescan failed: {e}; the mount keeps its current packages");
                lock(activity).failed_scans += 1;
                continue;
            }
            Err(_) => {
                error!("rescan panicked; the mount keeps its current packages");
                lock(activity).failed_scans += 1;
                continue;
            }
        };
        for p in &scan.added {
            info!("activating package {}", p.display());
        }
        for p in &scan.replaced {
            info!("activating new version of package {}", p.display());
        }
        for p in &scan.removed {
            info!("deactivating package {}", p.display());
        }
        let summary = format!(
            "+{} -{} ~{}",
            scan.added.len(),
            scan.removed.len(),
            scan.replaced.len()
        );
        let skipped = skipped_list(&scan.report);
        let act = fs.activate(scan.tree, scan.layers);
        let sent = invalidate(notifier, &act.invalidations);
        info!(
            "generation {}: {} packages ({summary}), {sent} kernel cache entries invalidated, {} inodes of older generations still in use, {} ms",
            act.generation,
            fs.view().layers.len(),
            act.retired,
            started.elapsed().as_millis()
        );
        let mut a = lock(activity);
        a.activations += 1;
        a.last = Some((SystemTime::now(), summary));
        a.skipped = skipped;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Send the invalidations; returns how many the kernel had cached. ENOENT means the
/// kernel did not have the entry: nothing to do.
fn invalidate(notifier: &fuser::Notifier, list: &[Invalidation]) -> usize {
    use std::os::unix::ffi::OsStrExt as _;
    let mut sent = 0;
    for inv in list {
        let r = match inv {
            Invalidation::Delete { parent, name, old } => notifier.delete(
                fuser::INodeNo(*parent),
                fuser::INodeNo(*old),
                std::ffi::OsStr::from_bytes(name),
            ),
            Invalidation::Entry { parent, name } => {
                notifier.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::from_bytes(name))
            }
            Invalidation::Dir(ino) => notifier.inval_inode(fuser::INodeNo(*ino), 0, 0),
        };
        match r {
            Ok(()) => sent += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => debug!("invalidating {inv:?}: {e}"),
        }
    }
    sent
}

/// Mount and start serving. As root pkgfs calls mount(2) itself, with the filesystem
/// type `fuse.pkgfs` (what fstab lines and `findmnt -t` use; fuser's own mount records
/// plain `fuse`); otherwise fuser mounts through `fusermount3`.
/// Also returns a second descriptor of the session's `/dev/fuse` connection, for the
/// io_uring queues.
fn spawn_session(
    fs: Fuse,
    cfg: &MountConfig,
    config: fuser::Config,
) -> std::io::Result<(fuser::BackgroundSession, Option<OwnedFd>)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let session = fuser::Session::new(fs, &cfg.mountpoint, &config)?;
        let dev = session.as_fd().try_clone_to_owned().ok();
        return Ok((session.spawn()?, dev));
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    use std::os::fd::AsRawFd;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        // SAFETY: getuid/getgid cannot fail.
        unsafe { libc::getuid() },
        unsafe { libc::getgid() }
    );
    if cfg.access != Access::Owner {
        // allow_root is enforced by fuser on top of the kernel's allow_other.
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    if cfg.noexec {
        flags |= libc::MS_NOEXEC;
    }
    if cfg.noatime {
        flags |= libc::MS_NOATIME;
    }
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| std::io::Error::other("argument contains a NUL byte"))
    };
    let source = cstr(cfg.fsname.as_bytes())?;
    let target = cstr(mount_path(&cfg.mountpoint).as_os_str().as_bytes())?;
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
    let acl = config.acl;
    let dup = dev.try_clone().ok().map(OwnedFd::from);
    match fuser::Session::from_fd(fs, dev.into(), acl, config).and_then(|s| s.spawn()) {
        Ok(s) => Ok((s, dup)),
        Err(e) => {
            // SAFETY: a valid C string; detach what we just mounted.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            Err(e)
        }
    }
}

fn mount_options(cfg: &MountConfig) -> Vec<fuser::MountOption> {
    use fuser::MountOption as O;
    let mut o = vec![
        O::RO,
        O::NoSuid,
        O::NoDev,
        O::DefaultPermissions,
        O::FSName(cfg.fsname.clone()),
        O::Subtype(SUBTYPE.into()),
    ];
    if cfg.noexec {
        o.push(O::NoExec);
    }
    if cfg.noatime {
        o.push(O::NoAtime);
    }
    o
}

/// Set by [`quiet_until_ready`].
static QUIET_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Log only warnings until the mount is ready (they reach the user's terminal), then the
/// configured level (into the log file).
pub fn quiet_until_ready() {
    QUIET_START.store(true, std::sync::atomic::Ordering::Relaxed);
    LEVEL_AFTER_READY.store(
        log::max_level() as usize,
        std::sync::atomic::Ordering::Relaxed,
    );
    log::set_max_level(log::max_level().min(log::LevelFilter::Warn));
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

/// Buffered reads arrive as 128 KiB requests unless the mount's backing device allows
/// more readahead; raise it to 1 MiB (root only; best effort). Returns the mount's
/// device number.
fn raise_readahead(mountpoint: &Path) -> Option<u64> {
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

/// If `mountpoint` is already a FUSE mount: a dead one (its daemon was killed; requests
/// fail with ENOTCONN) is detached so the new mount can take its place; a live one is an
/// error rather than a mount stacked on top of it. `stat` of the mountpoint itself may be
/// answered from the kernel's attribute cache, so the probe looks up a fresh name.
fn clear_dead_mount(mountpoint: &Path) -> Result<(), String> {
    match mounted_type(mountpoint) {
        Some(t) if t == "fuse" || t.starts_with("fuse.") => {}
        _ => return Ok(()),
    }
    let probe = mountpoint.join(format!(".pkgfs-probe-{}", std::process::id()));
    match std::fs::symlink_metadata(&probe) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            warn!("{} is a dead mount; detaching it", mountpoint.display());
            unmount(mountpoint, true)
        }
        _ => Err(format!(
            "{} is already a FUSE mount (pkgfs umount it first)",
            mountpoint.display()
        )),
    }
}

/// The absolute path of `p` as /proc/mounts shows it, without touching `p` itself (a
/// dead mount cannot be stat'ed).
fn mount_path(p: &Path) -> PathBuf {
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

/// The filesystem type mounted at `p`, from /proc/self/mounts.
fn mounted_type(p: &Path) -> Option<String> {
    let want = mount_path(p);
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let (_, dir, ty) = (f.next()?, f.next()?, f.next()?);
        // /proc/mounts escapes spaces and similar as octal.
        let dir = dir
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\134", "\\");
        (Path::new(&dir) == want).then(|| ty.to_string())
    })
}

/// `pkgfs umount`: unmount a pkgfs mount; if it is busy, detach it lazily (the kernel
/// finishes when the last user leaves).
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), String> {
    match mounted_type(mountpoint) {
        // fuser's own mount(2) records the type as plain "fuse"; refuse anything that is
        // not FUSE at all, so a typo cannot unmount a disk.
        Some(t) if t == "fuse" || t.starts_with("fuse.") => {}
        Some(t) => {
            return Err(format!(
                "{} is a {t} mount, not pkgfs (FUSE)",
                mountpoint.display()
            ));
        }
        None => return Err(format!("{} is not mounted", mountpoint.display())),
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount(mountpoint, lazy);
    }
    let c = CString::new(mount_path(mountpoint).as_os_str().as_bytes())
        .map_err(|_| "mountpoint contains NUL".to_string())?;
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
        return Err(os_err("lazy unmount failed"));
    }
    Err(format!("cannot unmount {}: {err}", mountpoint.display()))
}

fn fusermount(mountpoint: &Path, lazy: bool) -> Result<(), String> {
    let run = |lazy: bool| {
        let mut c = Command::new("fusermount3");
        c.arg(if lazy { "-uz" } else { "-u" }).arg(mountpoint);
        c.status()
    };
    match run(lazy) {
        Ok(s) if s.success() => Ok(()),
        Ok(_) if !lazy => match run(true) {
            Ok(s) if s.success() => Ok(()),
            _ => Err(format!(
                "fusermount3 could not unmount {}",
                mountpoint.display()
            )),
        },
        Ok(_) => Err(format!(
            "fusermount3 could not unmount {}",
            mountpoint.display()
        )),
        Err(e) => Err(format!("cannot run fusermount3 (package fuse3): {e}")),
    }
}
