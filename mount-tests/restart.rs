//! A mount outlives its server (issue 35): the keeper holds the connection, a server
//! killed with SIGKILL is replaced and the kernel resends what it had read, `pkgfs
//! reload` replaces a server on purpose, and a keeper that gives up answers EIO at once.
//!
//! The reference for every read is an independent extraction by `tar xzf` of the
//! archive `tar czf` made; the mounted tree is read whole by `tar` (a stream compared
//! byte for byte, hashed) while servers are killed at marks in that stream's progress,
//! not at times (a loaded machine moves times, not marks).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::common::{
    Mount, UmountGuard, kill9, next_server, pkgfs, require_fuse, run, server_pid, status_json,
    strict, wait_until,
};

/// A tree of 20 directories × 20 files (random bytes in four sizes, two modes, distinct
/// mtimes), a symlink per directory and one 8 MiB file, packed by `tar czf`, and its
/// extraction by `tar xzf`. Returns (archive, extraction).
fn tarball(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for d in 0..20 {
        let sub = src.join(format!("d{d:02}/sub"));
        fs::create_dir_all(&sub).unwrap();
        for f in 0..20 {
            let size = [100, 3000, 40_000, 200_000][(next() % 4) as usize];
            let data: Vec<u8> = (0..size).map(|_| next() as u8).collect();
            let p = if f % 3 == 0 {
                sub.join(format!("f{f:02}.bin"))
            } else {
                src.join(format!("d{d:02}/f{f:02}.bin"))
            };
            fs::write(&p, &data).unwrap();
            let mode = if f % 2 == 0 { 0o755 } else { 0o644 };
            fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
            run(Command::new("touch")
                .arg("-d")
                .arg(format!("@{}", 1_600_000_000 + d * 100 + f))
                .arg(&p));
        }
        std::os::unix::fs::symlink("../d00/f01.bin", src.join(format!("d{d:02}/link"))).unwrap();
    }
    let big: Vec<u8> = (0..8 << 20).map(|_| next() as u8).collect();
    fs::write(src.join("d00/big.bin"), big).unwrap();
    let arc = dir.join("pkg.tar.gz");
    run(Command::new("tar")
        .arg("czf")
        .arg(&arc)
        .arg("-C")
        .arg(&src)
        .arg("."));
    let ext = dir.join("ext");
    fs::create_dir(&ext).unwrap();
    run(Command::new("tar").arg("xzf").arg(&arc).arg("-C").arg(&ext));
    (arc, ext)
}

/// `tar` of every top-level name under `root`, in name order with numeric owners: the
/// same tree gives the same bytes (the root itself is left out: its mtime is the
/// mount's, not the archive's).
fn tar_of(root: &Path, names: &[String]) -> Command {
    let mut c = Command::new("tar");
    c.arg("--sort=name")
        .arg("--numeric-owner")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg("-")
        .args(names);
    c
}

fn top_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The reference: hash and length of the tar stream of the extraction.
fn reference(ext: &Path) -> (String, u64) {
    let out = run(&mut tar_of(ext, &top_names(ext)));
    (sha(&out.stdout), out.stdout.len() as u64)
}

/// `DIR/bin/pkgfs`, a copy of the binary under test installed as a package installs it,
/// mounting `arc` at `DIR/mnt` (log in `DIR/log`). Returns the binary and the mountpoint.
fn mount_with_installed_copy(dir: &Path, arc: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    mount_with_installed(Path::new(env!("CARGO_BIN_EXE_pkgfs")), dir, arc, extra)
}

/// [`mount_with_installed_copy`] of the binary `from`.
fn mount_with_installed(from: &Path, dir: &Path, arc: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    fs::create_dir(dir.join("bin")).unwrap();
    let exe = dir.join("bin/pkgfs");
    fs::copy(from, &exe).unwrap();
    let mp = dir.join("mnt");
    fs::create_dir(&mp).unwrap();
    run(Command::new(&exe)
        .arg("mount")
        .arg(arc)
        .arg(&mp)
        .arg("--log-file")
        .arg(dir.join("log"))
        .args(extra));
    (exe, mp)
}

/// Put `from` at `exe` as an upgrade does: a new file renamed over the old one (whose
/// running copies keep the old inode).
fn install_over(exe: &Path, from: &Path) {
    let tmp = exe.with_extension("new");
    fs::copy(from, &tmp).unwrap();
    fs::rename(&tmp, exe).unwrap();
}

/// A `tar` read of the whole mount, consumed on a thread that counts and hashes.
struct ReadAll {
    pid: u32,
    done: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<(String, u64, std::process::Output)>,
}

impl ReadAll {
    fn start(mp: &Path, names: &[String]) -> ReadAll {
        let mut child = tar_of(mp, names)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let done = Arc::new(AtomicU64::new(0));
        let counter = done.clone();
        let thread = std::thread::spawn(move || {
            let mut out = child.stdout.take().unwrap();
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 16 << 10];
            let mut n = 0u64;
            loop {
                let got = out.read(&mut buf).unwrap();
                if got == 0 {
                    break;
                }
                h.update(&buf[..got]);
                n += got as u64;
                counter.store(n, Ordering::Release);
            }
            let status = child.wait_with_output().unwrap();
            (format!("{:x}", h.finalize()), n, status)
        });
        ReadAll { pid, done, thread }
    }

    /// Wait up to `limit` for `cond`; a reader that hangs is killed (a task waiting on
    /// FUSE dies of SIGKILL), so a failing test leaves no process behind.
    fn wait(&self, limit: Duration, what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            if t.elapsed() > limit {
                kill9(self.pid);
                panic!("{what}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait until `at` bytes have been read (or the reader ended).
    fn reach(&self, at: u64) {
        self.wait(Duration::from_secs(120), "the reader stalled", || {
            self.done.load(Ordering::Acquire) >= at || self.thread.is_finished()
        });
    }

    /// The stream's hash and length; panics if tar failed or said anything.
    fn finish(self) -> (String, u64) {
        self.wait(Duration::from_secs(120), "the reader hangs", || {
            self.thread.is_finished()
        });
        let (hash, n, out) = self.thread.join().unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "the reader saw an error: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        (hash, n)
    }
}

/// `kill -9` of the server at four marks of a read-all: the stream equals the
/// extraction's, the reader saw no error, and the status counts the restarts.
#[test]
fn kill_9_of_the_server_during_a_read_all_loses_no_byte_and_fails_no_reader() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let (want, len) = reference(&ext);
    // A small block cache: most reads decode again, so the servers are busy when killed.
    let m = Mount::new(
        &[&arc],
        &["--restart-limit", "100/60s", "--cache-size", "1M"],
    );
    let mp = m.path();
    let reader = ReadAll::start(&mp, &top_names(&ext));
    let mut last = None;
    for mark in [1, 2, 3, 4] {
        let pid = next_server(&mp, last);
        reader.reach(len * mark / 5);
        kill9(pid);
        last = Some(pid);
    }
    let (got, n) = reader.finish();
    assert_eq!((got, n), (want, len), "the stream read across four kills");
    let st = status_json(&mp);
    assert_eq!(st["keeper"]["restarts"], 4, "{st}");
    assert_eq!(
        st["keeper"]["last_cause"], "killed by signal 9 (SIGKILL)",
        "{st}"
    );
    assert!(st["keeper"]["last_pause_ms"].as_u64().is_some(), "{st}");
    let pauses = st["keeper"]["pauses_ms"].as_array().unwrap();
    assert_eq!(pauses.len(), 4, "a pause for each restart: {st}");
    assert_eq!(pauses.last(), Some(&st["keeper"]["last_pause_ms"]));
    assert_ne!(st["server_pid"], st["keeper_pid"]);
    let log = m.log_text();
    assert_eq!(log.matches("serving again after").count(), 4, "{log}");
}

/// `find` across kills lists what the extraction has (names, types, sizes, modes,
/// mtimes, symlink targets).
#[test]
fn kill_9_during_a_walk_lists_the_same_tree() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let listing = |root: &Path| {
        let out = run(Command::new("find")
            .arg(".")
            .arg("-mindepth")
            .arg("1")
            .arg("-printf")
            .arg("%P %y %s %m %T@ %l\n")
            .current_dir(root));
        let mut lines: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(normalise)
            .collect();
        lines.sort();
        lines
    };
    let want = listing(&ext);
    let m = Mount::new(&[&arc], &["--restart-limit", "100/60s"]);
    let mp = m.path();
    // The walk reads names line by line; the server dies after every 100.
    let mut find = Command::new("find")
        .arg(".")
        .arg("-mindepth")
        .arg("1")
        .arg("-printf")
        .arg("%P %y %s %m %T@ %l\n")
        .current_dir(&mp)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    let mut last = Some(next_server(&mp, None));
    for line in BufReader::new(find.stdout.take().unwrap()).lines() {
        got.push(line.unwrap());
        if got.len() % 100 == 0 {
            kill9(last.unwrap());
            last = Some(next_server(&mp, last));
        }
    }
    assert!(find.wait().unwrap().success());
    let mut got: Vec<String> = got.iter().map(|l| normalise(l)).collect();
    got.sort();
    let differ: Vec<_> = want
        .iter()
        .zip(&got)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        got.len() == want.len() && differ.is_empty(),
        "{} lines against {}; first differences: {differ:?}",
        got.len(),
        want.len()
    );
    assert!(status_json(&mp)["keeper"]["restarts"].as_u64().unwrap() >= 4);
}

/// A `find -printf` line without a directory's size (the extraction's directories
/// have their disk's block size, the mount's 0).
fn normalise(line: &str) -> String {
    let mut f: Vec<&str> = line.split(' ').collect();
    if f.get(1) == Some(&"d") {
        f[2] = "-";
    }
    f.join(" ")
}

/// A process with a file open and its cwd inside the mount keeps reading across two
/// kills: the new servers answer for the kernel's node IDs and handles.
#[test]
fn an_open_file_and_a_cwd_inside_the_mount_survive_kills() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let m = Mount::new(&[&arc], &["--restart-limit", "100/60s"]);
    let mp = m.path();
    let script = r#"
import hashlib, os, sys
f = open(os.path.join(sys.argv[1], "d00/big.bin"), "rb")
first = f.read(4096)
os.chdir(os.path.join(sys.argv[1], "d04"))
print("ready", flush=True)
sys.stdin.readline()
rest = f.read()
names = ",".join(sorted(os.listdir(".")))
rel = open("sub/f03.bin", "rb").read()
st = os.stat(".")
print(hashlib.sha256(first + rest).hexdigest(), names, hashlib.sha256(rel).hexdigest(), oct(st.st_mode), flush=True)
"#;
    let mut py = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&mp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let mut last = None;
    for _ in 0..2 {
        let pid = next_server(&mp, last);
        kill9(pid);
        last = Some(pid);
    }
    py.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(py.wait().unwrap().success());
    let names = top_names(&ext.join("d04")).join(",");
    let mode = fs::metadata(ext.join("d04")).unwrap().permissions();
    let want = format!(
        "{} {} {} {:#o}",
        sha(&fs::read(ext.join("d00/big.bin")).unwrap()),
        names,
        sha(&fs::read(ext.join("d04/sub/f03.bin")).unwrap()),
        std::os::unix::fs::PermissionsExt::mode(&mode)
    );
    assert_eq!(line.trim(), want);
}

/// A server that cannot start (its source directory is gone): the keeper stops after
/// the limit and every request fails with EIO at once; `pkgfs reload`, once the source
/// is back, serves again.
#[test]
fn a_server_that_cannot_start_makes_reads_fail_fast_until_a_reload() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    fs::rename(&arc, pkgs.join("pkg.tar.gz")).unwrap();
    let m = Mount::new(&[&pkgs], &["--no-watch", "--restart-limit", "2/60s"]);
    let mp = m.path();
    let away = dir.path().join("away");
    fs::rename(&pkgs, &away).unwrap();
    kill9(next_server(&mp, None));
    wait_until(Duration::from_secs(30), "the keeper never gave up", || {
        m.log_text().contains("giving up restarting")
    });
    let log = m.log_text();
    assert!(log.contains("2 servers died within"), "{log}");
    // Fails, and fast: nobody serves, the keeper refuses.
    let t = Instant::now();
    let e = fs::read(mp.join("d07/f02.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    fs::rename(&away, &pkgs).unwrap();
    let out = run(pkgfs().arg("reload").arg(&mp));
    assert!(out.status.success());
    next_server(&mp, None);
    assert_eq!(
        fs::read(mp.join("d07/f02.bin")).unwrap(),
        fs::read(ext.join("d07/f02.bin")).unwrap()
    );
    let st = status_json(&mp);
    assert_eq!(st["keeper"]["reloads"], 1, "{st}");
}

/// Sources that changed under `--no-watch` would give the kernel's inode numbers
/// another meaning: `pkgfs reload` is refused and the old server keeps serving the old
/// bytes; a new server after a kill is refused too, and reads fail with EIO.
#[test]
fn a_server_whose_sources_changed_is_refused_and_the_old_one_serves() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    fs::copy(&arc, pkgs.join("pkg.tar.gz")).unwrap();
    let m = Mount::new(&[&pkgs], &["--no-watch"]);
    let mp = m.path();
    let old = next_server(&mp, None);
    // Another archive in its place (a new file renamed over it, as package managers do).
    fs::write(ext.join("d01/f01.bin"), b"changed").unwrap();
    run(Command::new("tar")
        .arg("czf")
        .arg(pkgs.join(".new.tar.gz"))
        .arg("-C")
        .arg(&ext)
        .arg("."));
    fs::rename(pkgs.join(".new.tar.gz"), pkgs.join("pkg.tar.gz")).unwrap();

    let out = pkgfs().arg("reload").arg(&mp).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not what they were at mount"), "{err}");
    assert_eq!(server_pid(&mp), Some(old), "the old server still serves");
    assert_ne!(fs::read(mp.join("d01/f01.bin")).unwrap(), b"changed");

    kill9(old);
    wait_until(Duration::from_secs(30), "the keeper never gave up", || {
        m.log_text().contains("giving up restarting")
    });
    let e = fs::read(mp.join("d02/f02.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

/// `pkgfs reload` during a read-all, from a binary replaced the way a package upgrade
/// replaces it (a new file renamed over the old): the stream is whole, the new server
/// runs the new file, the keeper still the old one.
#[test]
fn reload_during_a_read_all_starts_the_installed_binary() {
    if !require_fuse() {
        return;
    }
    reload_during_a_read_all(Path::new(env!("CARGO_BIN_EXE_pkgfs")));
}

/// The same from the previous release's binary (built by mount-tests/previous-release.sh,
/// which mount-tests/run.sh runs first): its keeper hands the mount to this build's
/// server, and this build's `pkgfs reload` speaks to its keeper.
#[test]
fn reload_from_the_previous_release_to_this_one() {
    if !require_fuse() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let listed = fs::read_to_string(root.join("mount-tests/previous-release")).unwrap();
    let commit = listed.lines().next().unwrap().trim();
    let prev = root.join(format!("target/prev-release/pkgfs-{commit}"));
    if !prev.exists() {
        assert!(
            !strict(),
            "{} is missing: run mount-tests/previous-release.sh (run.sh does)",
            prev.display()
        );
        eprintln!("skipping: no build of the previous release");
        return;
    }
    let version = run(Command::new(&prev).arg("--version")).stdout;
    assert!(!version.is_empty());
    reload_during_a_read_all(&prev);
}

/// Mount with an installed copy of `old`, read the whole tree, install this build over
/// it halfway and `pkgfs reload`.
fn reload_during_a_read_all(old: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let (want, len) = reference(&ext);
    let (exe, mp) = mount_with_installed(old, dir.path(), &arc, &["--cache-size", "1M"]);
    let _guard = UmountGuard(&mp);
    let old = next_server(&mp, None);
    let reader = ReadAll::start(&mp, &top_names(&ext));
    reader.reach(len / 2);
    install_over(&exe, Path::new(env!("CARGO_BIN_EXE_pkgfs")));
    let out = run(Command::new(&exe).arg("reload").arg(&mp));
    assert!(out.status.success());
    let (got, n) = reader.finish();
    assert_eq!((got, n), (want, len), "the stream read across the reload");

    let st = status_json(&mp);
    let new = st["server_pid"].as_u64().unwrap();
    assert_ne!(new, old as u64);
    assert_eq!(st["keeper"]["reloads"], 1, "{st}");
    assert_eq!(st["keeper"]["last_cause"], "reload", "{st}");
    let exe_of = |pid: u64| fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        !exe_of(new).to_string_lossy().ends_with("(deleted)"),
        "the new server runs the installed file"
    );
    let keeper = st["keeper_pid"].as_u64().unwrap();
    assert!(
        exe_of(keeper).to_string_lossy().ends_with("(deleted)"),
        "the keeper runs what it was started from"
    );
    run(Command::new(&exe).arg("umount").arg(&mp));
    wait_until(
        Duration::from_secs(10),
        "keeper or server outlived the mount",
        || {
            !Path::new(&format!("/proc/{keeper}")).exists()
                && !Path::new(&format!("/proc/{new}")).exists()
        },
    );
}

/// The keeper stays small (it holds a descriptor and waits); a mount that asked for
/// io_uring serves /dev/fuse under it and survives a kill; a SIGTERM to the keeper
/// unmounts; `--no-keeper` mounts have none.
#[test]
fn the_keeper_is_small_and_a_signal_to_it_unmounts() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, _) = tarball(dir.path());
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    run(pkgfs()
        .arg("mount")
        .arg(&arc)
        .arg(&mp)
        .args(["--io-uring", "auto"]));
    let _guard = UmountGuard(&mp);
    let st = status_json(&mp);
    assert_eq!(st["transport"], "/dev/fuse", "no io_uring under a keeper");
    let keeper = st["keeper_pid"].as_u64().unwrap();
    let field = |name: &str| -> u64 {
        fs::read_to_string(format!("/proc/{keeper}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    // Its own memory (anonymous); the rest is the binary's pages, shared with the server
    // (how many of those it maps depends on what the server has brought into the page
    // cache: each fault maps the cached pages around it, so that part moves with the
    // binary's size and the run: 16.6 MB was seen once).
    let (rss, anon) = (field("VmRSS:"), field("RssAnon:"));
    eprintln!("keeper RSS {rss} kB, {anon} kB of its own");
    assert!(anon < 4 * 1024, "keeper's own memory {anon} kB");
    assert!(rss < 24 * 1024, "keeper RSS {rss} kB");
    // Asked for io_uring, served on /dev/fuse: a kill costs a pause, not the mount.
    let old = st["server_pid"].as_u64().unwrap() as u32;
    kill9(old);
    assert_eq!(
        fs::read(mp.join("d03/f05.bin")).unwrap().len() as u64,
        fs::metadata(mp.join("d03/f05.bin")).unwrap().len()
    );
    next_server(&mp, Some(old));
    let st = status_json(&mp);
    assert_eq!(st["keeper"]["restarts"], 1, "{st}");
    assert_eq!(st["transport"], "/dev/fuse");
    // SAFETY: signalling the keeper.
    unsafe { libc::kill(keeper as i32, libc::SIGTERM) };
    wait_until(
        Duration::from_secs(10),
        "SIGTERM to the keeper did not unmount",
        || !crate::common::is_mountpoint(&mp) && !Path::new(&format!("/proc/{keeper}")).exists(),
    );

    let m = Mount::new(&[&arc], &["--no-keeper"]);
    let st = status_json(&m.path());
    assert!(st["keeper_pid"].is_null(), "{st}");
    assert_eq!(st["server_pid"], st["pid"]);
}

/// `pkgfs mount` leaves a daemon that is detached from its caller: the keeper leads a
/// session of its own, and neither it nor its server holds a descriptor the caller
/// passed (here a pipe's write end at descriptor 777): once the caller closes its end,
/// the pipe's reader sees the end of it, with the mount still up. (The keeper is this
/// command forked, not run again: what it inherits, it must close itself.)
#[test]
fn the_background_daemon_is_detached_and_holds_none_of_its_callers_descriptors() {
    use std::os::unix::process::CommandExt as _;
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let mut fds = [0; 2];
    // SAFETY: a new pipe, both ends close-on-exec (other tests' commands must not
    // inherit them); only the mount command gets the write end, as descriptor 777.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (reader, writer) = (fds[0], fds[1]);
    let mut cmd = pkgfs();
    cmd.arg("mount").arg(&arc).arg(&mp);
    // SAFETY: dup2 in the child between fork and exec (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || match libc::dup2(writer, 777) {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _guard = UmountGuard(&mp);
    // SAFETY: our own descriptor.
    unsafe { libc::close(writer) };
    let mut pfd = libc::pollfd {
        fd: reader,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    let ready = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    assert!(
        ready == 1 && pfd.revents & libc::POLLHUP != 0,
        "the pipe's write end is still held after its caller closed it (poll: {ready}, {:#x})",
        pfd.revents
    );
    // SAFETY: our own descriptor.
    unsafe { libc::close(reader) };
    let st = status_json(&mp);
    let keeper = st["keeper_pid"].as_u64().unwrap();
    let stat = fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
    // After the command name: state, parent, process group, session.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!(
        fields[2], keeper,
        "the keeper leads its own session: {stat}"
    );
    assert_ne!(fields[0], u64::from(std::process::id()), "{stat}");
    let name = top_names(&ext).into_iter().next().unwrap();
    assert!(mp.join(&name).exists(), "{name} is not served");
}

/// A live mount across kills around an activation: a package added while a read-all
/// runs is activated (its entries take fresh inode numbers); the server is killed at
/// once, and again later. The new servers number the tree as the activated one did (the
/// keeper hands them its table): a file of the new package opened before the kills
/// reads on, the read-all's stream is whole, and the log says the table was taken.
#[test]
fn kill_9_right_after_a_live_activation_keeps_its_numbers() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let (want, len) = reference(&ext);
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    fs::rename(&arc, pkgs.join("a.tar.gz")).unwrap();
    let m = Mount::new(
        &[&pkgs],
        &["--restart-limit", "100/60s", "--cache-size", "1M"],
    );
    let mp = m.path();
    let reader = ReadAll::start(&mp, &top_names(&ext));
    reader.reach(len / 4);

    // Package b: a directory of its own, installed by rename as package managers do.
    let bsrc = dir.path().join("bsrc/extra");
    fs::create_dir_all(&bsrc).unwrap();
    let big: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(bsrc.join("big.bin"), &big).unwrap();
    run(Command::new("tar")
        .arg("czf")
        .arg(pkgs.join(".b.tmp"))
        .arg("-C")
        .arg(dir.path().join("bsrc"))
        .arg("extra"));
    let old = next_server(&mp, None);
    fs::rename(pkgs.join(".b.tmp"), pkgs.join("b.tar.gz")).unwrap();
    wait_until(Duration::from_secs(30), "b was never activated", || {
        mp.join("extra/big.bin").exists()
    });
    let mut f = fs::File::open(mp.join("extra/big.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    kill9(old);
    let second = next_server(&mp, Some(old));
    reader.reach(len * 3 / 4);
    kill9(second);
    next_server(&mp, Some(second));

    let (got, n) = reader.finish();
    assert_eq!(
        (got, n),
        (want, len),
        "the stream read across the activation and kills"
    );
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    head.extend(rest);
    assert!(
        head == big,
        "the open file of the activated package reads on"
    );
    let log = m.log_text();
    assert_eq!(
        log.matches("numbers the tree by the last generation's table")
            .count(),
        2,
        "{log}"
    );
    let st = status_json(&mp);
    assert_eq!(st["keeper"]["restarts"], 2, "{st}");
}

/// An installed binary that speaks another handover format (here a stand-in script that
/// says `Hello` with format 2 on the keeper's socket, as a future pkgfs would): `pkgfs
/// reload` fails saying so, and the old server keeps serving; the real binary put back,
/// the reload goes through.
#[test]
fn a_new_binary_of_another_handover_format_is_refused_and_the_old_server_serves() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (arc, ext) = tarball(dir.path());
    let (exe, mp) = mount_with_installed_copy(dir.path(), &arc, &[]);
    let _guard = UmountGuard(&mp);
    let old = next_server(&mp, None);

    let future = r#"#!/usr/bin/env python3
import json, os, socket
s = socket.socket(fileno=int(os.environ["PKGFS_KEEPER_FD"]))
s.send(json.dumps({"Hello": {"wire": 2, "digest": "-"}}).encode())
print(s.recv(65536).decode(), flush=True)
raise SystemExit(1)
"#;
    let script = dir.path().join("future-pkgfs");
    fs::write(&script, future).unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    install_over(&exe, &script);
    let out = pkgfs().arg("reload").arg(&mp).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("handover format 2"), "{err}");
    assert_eq!(server_pid(&mp), Some(old), "the old server still serves");
    assert_eq!(
        fs::read(mp.join("d06/f04.bin")).unwrap(),
        fs::read(ext.join("d06/f04.bin")).unwrap()
    );

    install_over(&exe, Path::new(env!("CARGO_BIN_EXE_pkgfs")));
    run(pkgfs().arg("reload").arg(&mp));
    assert_ne!(next_server(&mp, Some(old)), old);
    let st = status_json(&mp);
    assert_eq!(st["keeper"]["reloads"], 1, "{st}");
}

/// A file open in a package that a live activation replaced, then a restart: the new
/// server still serves the old version to the open file (the keeper kept the old
/// archive's descriptor and where the inode lies in it), while a new open reads the new
/// version. Merged, with a directory per package (`--layout each`), as cargo places
/// crates, and as npm places tarballs (at the package's name; at a lockfile's places).
#[test]
fn a_file_open_in_a_replaced_package_reads_its_old_bytes_across_a_restart() {
    if !require_fuse() {
        return;
    }
    // (layout, the archive's name, where its files are in the mount)
    for (layout, name, inside) in [
        ("merge", "a.zip", ""),
        ("each", "a.zip", "a/"),
        // cargo drops the crate's top directory: found again under the layout's rules.
        ("cargo", "foo-1.0.0.crate", "foo-1.0.0/"),
        // npm places the package at its name (package.json's), without its `package/`.
        ("npm", "foo-1.0.0.tgz", "foo/"),
        // ... or wherever a lockfile installs it (here at two places).
        ("npm-lock", "foo-1.0.0.tgz", "bar/node_modules/foo/"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let pkgs = dir.path().join("pkgs");
        fs::create_dir(&pkgs).unwrap();
        let top = match layout {
            "cargo" => "foo-1.0.0",
            "npm" | "npm-lock" => "package",
            _ => "",
        };
        let version = |tag: u8, out: &Path| -> Vec<u8> {
            let src = dir.path().join(format!("src{tag}"));
            fs::create_dir_all(src.join(top).join("lib")).unwrap();
            let data: Vec<u8> = (0..4u32 << 20)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ tag)
                .collect();
            fs::write(src.join(top).join("lib/x.bin"), &data).unwrap();
            if top.is_empty() {
                run(Command::new("zip")
                    .current_dir(&src)
                    .args(["-0", "-q", "-X", "-r"])
                    .arg(out)
                    .arg("lib"));
            } else {
                if top == "package" {
                    fs::write(
                        src.join("package/package.json"),
                        r#"{"name": "foo", "version": "1.0.0"}"#,
                    )
                    .unwrap();
                }
                run(Command::new("tar")
                    .arg("czf")
                    .arg(out)
                    .arg("-C")
                    .arg(&src)
                    .arg(top));
            }
            data
        };
        let lock = dir.path().join("package-lock.json");
        fs::write(
            &lock,
            r#"{"name": "p", "lockfileVersion": 3, "packages": {
                "": {"name": "p"}, "node_modules/foo": {"version": "1.0.0"},
                "node_modules/bar/node_modules/foo": {"version": "1.0.0"}}}"#,
        )
        .unwrap();
        let mut args = vec!["--restart-limit", "100/60s", "--prefetch", "0", "--layout"];
        args.push(layout.trim_end_matches("-lock"));
        if layout == "npm-lock" {
            args.extend(["--lockfile", lock.to_str().unwrap()]);
        }
        let old = version(1, &pkgs.join(name));
        // No directory read-ahead: nothing pushes the file into the page cache.
        let m = Mount::new(&[&pkgs], &args);
        let mp = m.path();
        let x = mp.join(format!("{inside}lib/x.bin"));
        let mut f = fs::File::open(&x).unwrap_or_else(|e| panic!("{layout}: {e}"));
        let mut head = vec![0u8; 4096];
        f.read_exact(&mut head).unwrap();

        let new = version(2, &pkgs.join(".new.tmp"));
        fs::rename(pkgs.join(".new.tmp"), pkgs.join(name)).unwrap();
        wait_until(
            Duration::from_secs(30),
            "the new version was never activated",
            || fs::read(&x).is_ok_and(|d| d == new),
        );
        let server = next_server(&mp, None);
        kill9(server);
        next_server(&mp, Some(server));

        // What the kernel cached of the open file is dropped: the rest is asked of the
        // new server.
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; advice only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        let mut rest = Vec::new();
        f.read_to_end(&mut rest)
            .unwrap_or_else(|e| panic!("{layout}: the open file: {e}"));
        head.extend(rest);
        assert!(
            head == old,
            "{layout}: the open file reads its own version on"
        );
        assert!(fs::read(&x).unwrap() == new, "{layout}");
    }
}
