//! Shared helpers of the mount tests: fixtures, a mount guard that always unmounts, and
//! the bridge to the independent Python model (`mount-tests/model.py`).

#![allow(dead_code)]

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// How the kernel's requests reach the daemon in a test's mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `fuser`'s `/dev/fuse` loop (`--io-uring off`): what every kernel has.
    DevFuse,
    /// FUSE over io_uring (`--io-uring auto` with the kernel's `enable_uring` on).
    IoUring,
}

thread_local! {
    static TRANSPORT: Cell<Transport> = const { Cell::new(Transport::DevFuse) };
}

/// The transport of the calling test's mounts.
pub fn transport() -> Transport {
    TRANSPORT.with(Cell::get)
}

/// The `pkgfs mount` arguments that choose [`transport`]. FUSE over io_uring is used
/// only without a keeper (a ring dies with the process that set it up).
pub fn transport_args() -> &'static [&'static str] {
    match transport() {
        Transport::DevFuse => &["--io-uring", "off"],
        Transport::IoUring => &["--io-uring", "auto", "--no-keeper"],
    }
}

/// Tests that assert what the kernel's page cache holds take this shared; tests that
/// drop the page cache (`/proc/sys/vm/drop_caches`) take it exclusively, so a drop never
/// lands in the middle of another test's residency check.
static PAGE_CACHE: RwLock<()> = RwLock::new(());

/// Held while a test asserts on what the page cache holds: shares the page-cache lock
/// and keeps DAMON's reclaim paused ([`DamonPause`]).
pub struct PageCacheObserved {
    _lock: RwLockReadGuard<'static, ()>,
    _damon: DamonPause,
}

/// Hold while asserting on what the page cache holds.
pub fn page_cache_observed() -> PageCacheObserved {
    PageCacheObserved {
        _lock: PAGE_CACHE.read().unwrap_or_else(|p| p.into_inner()),
        _damon: DamonPause::new(),
    }
}

/// The machines these tests run on reclaim page cache behind the kernel's LRU: a DAMON
/// `pageout` scheme (kdamond, physical address space, unmapped file pages idle for a
/// while) pages out regions that include pages a push has just filled but nobody has
/// read yet. A test asserting that pushed pages are resident would then fail through no
/// fault of pkgfs. While any such test runs, every kdamond that is on is switched off;
/// the last one to finish switches them back on (also on panic). Nothing to do where
/// DAMON is absent.
pub struct DamonPause(());

/// How many tests hold a [`DamonPause`], and the kdamonds they switched off.
static DAMON: Mutex<(usize, Vec<PathBuf>)> = Mutex::new((0, Vec::new()));

impl DamonPause {
    fn new() -> Self {
        let mut d = DAMON.lock().unwrap_or_else(|p| p.into_inner());
        if d.0 == 0 {
            let states = std::fs::read_dir("/sys/kernel/mm/damon/admin/kdamonds")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("state"))
                .filter(|p| std::fs::read_to_string(p).is_ok_and(|s| s.trim() == "on"));
            for state in states {
                if std::fs::write(&state, "off").is_ok() {
                    d.1.push(state);
                }
            }
        }
        d.0 += 1;
        DamonPause(())
    }
}

impl Drop for DamonPause {
    fn drop(&mut self) {
        let mut d = DAMON.lock().unwrap_or_else(|p| p.into_inner());
        d.0 -= 1;
        if d.0 == 0 {
            for state in d.1.drain(..) {
                let _ = std::fs::write(&state, "on");
            }
        }
    }
}

/// Hold while dropping the page cache.
pub fn page_cache_dropped() -> RwLockWriteGuard<'static, ()> {
    PAGE_CACHE.write().unwrap_or_else(|p| p.into_inner())
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Run a test body with its mounts on `t`. For io_uring, the kernel's `enable_uring`
/// parameter is switched on for the duration and put back after (even on panic); such
/// tests run one at a time, so none puts it back under another. Returns without running
/// the body if FUSE is unusable ([`require_fuse`]) or the kernel has no FUSE over io_uring
/// (and not under CI).
pub fn with_transport(t: Transport, body: fn()) {
    if !require_fuse() {
        return;
    }
    static URING: Mutex<()> = Mutex::new(());
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(v) = &self.0 {
                let _ = std::fs::write(ENABLE_URING, v);
            }
        }
    }
    let _lock;
    let _restore;
    if t == Transport::IoUring {
        _lock = URING.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(before) = std::fs::read_to_string(ENABLE_URING) else {
            assert!(
                !strict(),
                "this kernel has no FUSE over io_uring ({ENABLE_URING})"
            );
            eprintln!("skipping: no FUSE over io_uring in this kernel");
            return;
        };
        std::fs::write(ENABLE_URING, "Y").expect("switch on FUSE over io_uring");
        _restore = Restore(Some(before.trim().to_string()));
    }
    TRANSPORT.with(|c| c.set(t));
    body();
}

/// Declare mount tests that run once on each transport: `NAME::dev_fuse` and
/// `NAME::io_uring`.
#[macro_export]
macro_rules! on_both_transports {
    ($($(#[doc = $doc:literal])* fn $name:ident() $body:block)*) => {
        $(
            $(#[doc = $doc])*
            mod $name {
                #[allow(unused_imports)]
                use super::*;
                fn body() $body
                #[test]
                fn dev_fuse() {
                    $crate::common::with_transport($crate::common::Transport::DevFuse, body)
                }
                #[test]
                fn io_uring() {
                    $crate::common::with_transport($crate::common::Transport::IoUring, body)
                }
            }
        )*
    };
}

/// Whether a test may skip for something missing: not under CI, nor when run by
/// `mount-tests/run.sh` (the README's test command), which installs what the tests need:
/// there a missing tool or FUSE fails the test.
pub fn strict() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("PKGFS_TEST_STRICT").is_some()
}

/// Whether FUSE mounts can run here ([`require_fuse`]) and every tool in `tools` is on
/// the PATH. `mount-tests/run.sh` installs them; run through it or under CI, a missing
/// one fails the test instead of skipping it.
pub fn require_tools(tools: &[&str]) -> bool {
    if !require_fuse() {
        return false;
    }
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !strict(),
        "these tools are missing (mount-tests/run.sh installs them): {missing:?}"
    );
    eprintln!("skipping: missing tools {missing:?}");
    false
}

/// The pkgfs binary under test.
pub fn pkgfs() -> Command {
    watchdog();
    let mut c = Command::new(env!("CARGO_BIN_EXE_pkgfs"));
    c.env("TZ", "UTC");
    c
}

/// Minutes the mount tests may run in all before the watchdog ends them
/// (`PKGFS_TEST_WATCHDOG_MINUTES`): the whole suite takes about ten here.
const WATCHDOG_MINUTES: u64 = 30;

/// A hung test must fail with its output, not run into the time limit of whoever runs
/// the suite (CI kills the run and keeps nothing): from the first `pkgfs` command on, a
/// thread ends the test process after [`WATCHDOG_MINUTES`], naming its mounts still
/// present. The test harness has already printed which tests ran for over 60 seconds.
fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let minutes = std::env::var("PKGFS_TEST_WATCHDOG_MINUTES")
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(WATCHDOG_MINUTES);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(minutes * 60));
            let mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("fuse"))
                .map(str::to_string)
                .collect();
            eprintln!(
                "watchdog: the mount tests ran for {minutes} minutes, something hangs (see the tests \
                 'running for over 60 seconds' above); FUSE mounts now: {mounts:#?}"
            );
            // Leave nothing mounted: the guards of the hung tests will never run.
            for line in &mounts {
                if let Some(mp) = line.split(' ').nth(1) {
                    let _ = Command::new("umount").args(["-l", mp]).status();
                }
            }
            std::process::exit(124);
        });
    });
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether FUSE mounts can run here. Under CI they must: a CI run whose mount tests
/// silently skipped would prove nothing.
pub fn require_fuse() -> bool {
    let ok = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok()
        // SAFETY: geteuid cannot fail.
        && unsafe { libc::geteuid() } == 0;
    if !ok {
        assert!(
            !strict(),
            "/dev/fuse is not usable as root: mount tests cannot run"
        );
        eprintln!("skipping: /dev/fuse unusable or not root");
    }
    ok
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The fixture catalogue made by real tools (`mount-tests/make_fixtures.py`), built once per
/// target directory and reused.
pub fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixtures");
        run_ok(
            Command::new("python3")
                .arg(repo().join("mount-tests/make_fixtures.py"))
                .arg(&dir)
                .env("TZ", "UTC"),
        );
        dir
    })
}

/// The large fixtures (a member over 4 GiB), built on first use.
pub fn large_fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = fixtures().to_path_buf();
        run_ok(
            Command::new("python3")
                .arg(repo().join("mount-tests/make_fixtures.py"))
                .arg(&dir)
                .arg("--large")
                .env("TZ", "UTC"),
        );
        dir
    })
}

/// A live mount that is always unmounted when dropped, even if the test panics.
pub struct Mount {
    dir: tempfile::TempDir,
    /// The foreground daemon, when mounted with [`Mount::foreground`].
    pub child: Option<Child>,
    /// What `pkgfs mount` printed on stderr (warnings about skipped archives…).
    pub stderr: String,
    /// The daemon's log file.
    pub log: PathBuf,
}

impl Mount {
    /// `pkgfs mount SOURCES… MP` as a user runs it (background daemon).
    pub fn new(sources: &[&Path], extra: &[&str]) -> Mount {
        Mount::with_env(sources, extra, &[])
    }

    /// [`Mount::new`] with these variables in the daemon's environment.
    pub fn with_env(sources: &[&Path], extra: &[&str], env: &[(&str, &str)]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let mp = dir.path().join("mnt");
        std::fs::create_dir(&mp).expect("mkdir");
        let log = dir.path().join("pkgfs.log");
        let out = run_ok(
            pkgfs()
                .arg("mount")
                .args(sources)
                .arg(&mp)
                .arg("--log-file")
                .arg(&log)
                .args(transport_args())
                .args(extra)
                .envs(env.iter().copied()),
        );
        let m = Mount {
            dir,
            child: None,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            log,
        };
        m.expect_transport();
        m
    }

    /// `pkgfs mount -f`, waiting until the mount answers.
    pub fn foreground(sources: &[&Path], extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let mp = dir.path().join("mnt");
        std::fs::create_dir(&mp).expect("mkdir");
        let log = dir.path().join("pkgfs.log");
        let stderr = std::fs::File::create(&log).expect("log");
        let child = pkgfs()
            .arg("mount")
            .arg("-f")
            .args(sources)
            .arg(&mp)
            .args(transport_args())
            .args(extra)
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn pkgfs");
        let m = Mount {
            dir,
            child: Some(child),
            stderr: String::new(),
            log,
        };
        wait_until(Duration::from_secs(20), "mount did not appear", || {
            m.is_mounted()
        });
        m.expect_transport();
        m
    }

    /// Check, through `pkgfs status`, that requests take the test's transport.
    pub fn expect_transport(&self) {
        expect_transport(&self.path());
    }

    /// The process serving the mount (under a keeper, not the one `pkgfs mount -f` is).
    pub fn server_pid(&self) -> u32 {
        next_server(&self.path(), None)
    }

    /// The mountpoint.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// Whether the mountpoint is in /proc/mounts.
    pub fn is_mounted(&self) -> bool {
        is_mountpoint(&self.path())
    }

    /// The daemon log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmount with `pkgfs umount` and wait for a foreground daemon to exit.
    pub fn unmount(&mut self) {
        if self.is_mounted() {
            let out = pkgfs()
                .arg("umount")
                .arg(self.path())
                .output()
                .expect("umount");
            if !out.status.success() {
                let _ = Command::new("umount").arg("-l").arg(self.path()).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            let start = Instant::now();
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if start.elapsed() > Duration::from_secs(10) => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
        if self.is_mounted() {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// Poll `done` every 10 ms until it holds; panics naming `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The skipped archives of a `pkgfs status --json` report, one `"PATH" "REASON"` each.
pub fn skipped_rows(st: &serde_json::Value) -> Vec<String> {
    st["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r["path"], r["reason"]))
        .collect()
}

/// `pkgfs status --json` of the mount at `mp`.
pub fn status_json(mp: &Path) -> serde_json::Value {
    let out = pkgfs()
        .arg("status")
        .arg("--json")
        .arg(mp)
        .output()
        .expect("pkgfs status");
    assert!(
        out.status.success(),
        "pkgfs status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// Check, through `pkgfs status`, that the mount at `mp` serves requests through the
/// calling test's [`transport`].
pub fn expect_transport(mp: &Path) {
    let want = match transport() {
        Transport::DevFuse => "/dev/fuse",
        Transport::IoUring => "io_uring",
    };
    // The status channel comes up just after the mount does, and the rings once their
    // threads have registered.
    let start = Instant::now();
    loop {
        let out = pkgfs()
            .arg("status")
            .arg(mp)
            .output()
            .expect("pkgfs status");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains(&format!("transport: {want};")) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "requests should take {want}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Compare a mount with the independent model of `model.py`; panics with its report.
pub fn expect_matches(mount: &Path, sources: &[&Path], extra: &[&str]) {
    let out = Command::new("python3")
        .arg(repo().join("mount-tests/model.py"))
        .arg("compare")
        .args(extra)
        .arg(mount)
        .args(sources)
        .env("TZ", "UTC")
        .output()
        .expect("run model.py");
    assert!(
        out.status.success(),
        "mounted tree differs from the model:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run a command and return its output, panicking if it fails.
pub fn run(cmd: &mut Command) -> Output {
    run_ok(cmd)
}

/// A Python with the test requirements (`mount-tests/requirements.txt`: `pyzstd`, moto's
/// S3 server and boto3, from PyPI), in a virtual environment made once under the target
/// directory, so a fresh machine needs nothing installed by hand.
pub fn test_python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("venv-tests");
        let py = venv.join("bin/python3");
        let ok = Command::new(&py)
            .args(["-c", "import pyzstd, moto.server, boto3, cryptography"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv));
            run_ok(
                Command::new(&py)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "-r",
                    ])
                    .arg(repo().join("mount-tests/requirements.txt")),
            );
        }
        py
    })
    .clone()
}

/// Real wheels from the package index (pinned in `mount-tests/wheels.txt`), downloaded
/// once under the target directory with `pip download`, as a project's dependencies
/// would be (by the pip of the tests' virtual environment, which `venv` always has).
pub fn real_wheels() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join("wheels");
        let list = repo().join("mount-tests/wheels.txt");
        let pins = std::fs::read(&list).expect("read mount-tests/wheels.txt");
        // The set carries a copy of the list it was downloaded for: a changed pin fetches
        // the set again.
        if std::fs::read(dir.join("wheels.txt")).ok().as_ref() != Some(&pins) {
            // Into a fresh directory first, so an interrupted download is never taken
            // for the set.
            let part = tmp.join("wheels.part");
            let _ = std::fs::remove_dir_all(&part);
            run_ok(
                Command::new(test_python())
                    .args([
                        "-m",
                        "pip",
                        "download",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--only-binary=:all:",
                        "--no-deps",
                        "--dest",
                    ])
                    .arg(&part)
                    .arg("-r")
                    .arg(&list),
            );
            std::fs::write(part.join("wheels.txt"), &pins).expect("record the pins");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&part, &dir).expect("move the downloaded wheels into place");
        }
        dir
    })
    .clone()
}

/// Compare two trees with `mount-tests/treecmp.py`; panics with its report.
pub fn trees_match(expected: &Path, actual: &Path, extra: &[&str]) {
    let out = Command::new("python3")
        .arg(repo().join("mount-tests/treecmp.py"))
        .arg(expected)
        .arg(actual)
        .args(extra)
        .output()
        .expect("run treecmp.py");
    assert!(
        out.status.success(),
        "{} differs from {}:\n{}{}",
        actual.display(),
        expected.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Held by tests that install `/sbin/mount.fuse.pkgfs` (a link, or the Debian package):
/// one at a time.
pub fn helper_lock() -> std::sync::MutexGuard<'static, ()> {
    static HELPER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HELPER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `mp` is in /proc/mounts.
pub fn is_mountpoint(mp: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(mp.to_str().unwrap_or("")))
}

/// Detaches a mountpoint when dropped, for tests that run the daemon themselves.
pub struct UmountGuard<'a>(pub &'a Path);

impl Drop for UmountGuard<'_> {
    fn drop(&mut self) {
        // Usually already unmounted by the test itself: then this is a quiet no-op.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.0)
            .stderr(Stdio::null())
            .status();
    }
}

/// Kills and reaps a child process when dropped (a daemon a failing test must not leave
/// behind).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free TCP port on loopback. Racy (the port is free when this returns, not
/// necessarily when a server binds it): prefer a server that binds port 0 and reports
/// the port it got ([`reported_port`]), or [`start_listening`] for one that cannot.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start a server that cannot bind port 0 and say which port it got (nginx, moto):
/// `spawn` starts it on the port it is given; if it exits before it listens (the port
/// was taken between the choice and its bind), it is started again on another, at most
/// five times. Panics naming `what` if none listens within 30 s.
pub fn start_listening(what: &str, mut spawn: impl FnMut(u16) -> Child) -> (Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = spawn(port);
        if listening_or_exited(&mut child, port, Duration::from_secs(30), what) {
            return (child, port);
        }
    }
    panic!("{what}: exited before listening on five free ports in a row");
}

/// Wait until `child` listens on `port` (true) or exits (false: the port was taken, or
/// it could not start); panics naming `what` after `limit`.
pub fn listening_or_exited(child: &mut Child, port: u16, limit: Duration, what: &str) -> bool {
    let addr = format!("127.0.0.1:{port}");
    let mut up = false;
    wait_until(limit, &format!("{what} on port {port}"), || {
        up = std::net::TcpStream::connect(&addr).is_ok();
        up || matches!(child.try_wait(), Ok(Some(_)))
    });
    up
}

/// The port a server that bound port 0 reports in the file `log` it writes: the digits
/// after the first `marker` in it (`PORT 41234`, `listening on 127.0.0.1:41234`) past
/// byte `from`. Waits at most 30 s for the line, then panics naming `what`.
pub fn reported_port(log: &Path, from: usize, marker: &str, what: &str) -> u16 {
    let mut port = None;
    wait_until(
        Duration::from_secs(30),
        &format!(
            "{what}: no \"{marker}\" line in {} within 30 s",
            log.display()
        ),
        || {
            let text = std::fs::read(log).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
            port = text.find(marker).and_then(|at| {
                let digits: String = text[at + marker.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().ok()
            });
            port.is_some()
        },
    );
    port.unwrap_or_else(|| panic!("{what}: no port"))
}

/// `faultproxy.py` in front of `upstream` on a port of the system's choice (returned),
/// its control file `DIR/control.json` (and its logs beside it), its output `DIR/stdout`.
pub fn spawn_fault_proxy(upstream: u16, dir: &Path) -> (Child, u16) {
    let out = dir.join("stdout");
    let child = Command::new("python3")
        .arg(repo().join("mount-tests/faultproxy.py"))
        .arg("0")
        .arg(upstream.to_string())
        .arg(dir.join("control.json"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let port = reported_port(&out, 0, "PORT ", "the fault proxy");
    (child, port)
}

/// SIGTERM, then wait (SIGKILL after 10 s).
pub fn terminate(c: &mut Child) {
    // SAFETY: signalling a child we spawned and have not reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// The server's pid (`pkgfs status`'s `server_pid`), if its status channel answers for
/// this mountpoint (device numbers are reused: for a moment the server of a mount that
/// has just gone may still answer on the status channel of a new one with its number).
pub fn server_pid(mp: &Path) -> Option<u32> {
    let out = pkgfs().arg("status").arg("--json").arg(mp).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let here = fs_canonical(mp);
    (v["mountpoint"].as_str().map(PathBuf::from) == Some(here))
        .then(|| v["server_pid"].as_u64().map(|p| p as u32))
        .flatten()
}

/// `mp` with its parent canonicalised (as /proc/mounts and `pkgfs status` name it).
fn fs_canonical(mp: &Path) -> PathBuf {
    match (mp.parent(), mp.file_name()) {
        (Some(p), Some(n)) => p.canonicalize().map_or(mp.to_path_buf(), |p| p.join(n)),
        _ => mp.to_path_buf(),
    }
}

/// Whether process `pid` has ended: gone, or a zombie nobody reaped yet whose threads
/// have all exited (a thread group's leader shows as a zombie while its other threads
/// still exit, holding the descriptors they share).
pub fn process_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => {
            let zombie = s
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
            zombie && threads <= 1
        }
    }
}

/// Wait for a server other than `old` to answer, and return its pid.
pub fn next_server(mp: &Path, old: Option<u32>) -> u32 {
    let mut pid = None;
    wait_until(Duration::from_secs(30), "no new server answers", || {
        pid = server_pid(mp).filter(|p| Some(*p) != old);
        pid.is_some()
    });
    pid.unwrap()
}

/// SIGKILL to `pid` (a server, to test that its keeper replaces it).
pub fn kill9(pid: u32) {
    // SAFETY: signalling a process by pid.
    assert_eq!(
        unsafe { libc::kill(pid as i32, libc::SIGKILL) },
        0,
        "kill {pid}"
    );
}
