//! `pkgfs snapshotter` under a real containerd: a private containerd (its own root,
//! state and sockets under a short /tmp path, CRI and tasks off) with pkgfs as a proxy
//! snapshot plugin imports the Debian image fixture (`oci-archive.tar` of
//! `mount-tests/images/make_images.sh`, as `mount-tests/images.rs` builds it) into pkgfs
//! and into containerd's own overlayfs snapshotter; a container's root in each (an
//! Active snapshot on the image), mounted as the snapshotter's Mounts say, must give the
//! same tree (`treecmp.py`: bytes, modes, owners, times, xattrs, devices, links).
//! Then `ctr snapshots` ls/info/usage/label/mounts through pkgfs, a restart of the
//! snapshotter (records kept, containerd reconnects), and `ctr images rm --sync`,
//! which must leave pkgfs's snapshots directory empty and nothing mounted.
//!
//! Every external command and every wait is bounded ([`bounded`], [`wait_for`]); the
//! [`Rig`] guard unmounts what the test mounted, and stops containerd and the
//! snapshotter, even when an assertion fails.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{pkgfs, require_tools, trees_match};
use crate::images::{images, runs_its_programs};
use crate::registry::{Auth, Registry, manifest_and_config, manifest_and_config_as, soci_fixtures};

/// containerd's namespace for the test's images.
const NS: &str = "pkgfs-test";
/// The image's name once imported.
const IMAGE: &str = "pkgfs/debian:latest";
/// Bound on one `ctr` command.
const CTR_LIMIT: Duration = Duration::from_secs(60);

/// Run `cmd` (stdin closed, output to files under `dir`) for at most `limit`; on expiry
/// kill its process group and fail with what it printed. Returns its output whatever its
/// exit status.
fn bounded(dir: &Path, cmd: &mut Command, limit: Duration) -> Output {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let (out, err) = (
        dir.join(format!("cmd{n}.out")),
        dir.join(format!("cmd{n}.err")),
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > limit {
            // SAFETY: signalling the process group of a child we spawned.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| std::fs::read(p).unwrap_or_default();
    let Some(status) = status else {
        panic!(
            "{cmd:?} did not finish within {limit:?}; killed.\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&read(&out)),
            String::from_utf8_lossy(&read(&err))
        );
    };
    Output {
        status,
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// [`bounded`], failing unless the command succeeds; its standard output.
fn ok(dir: &Path, cmd: &mut Command, limit: Duration) -> String {
    let out = bounded(dir, cmd, limit);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Try `attempt` every 50 ms for at most `limit`, until it is `Ok`; fail naming `what`
/// and what the last attempt said.
fn wait_for(limit: Duration, what: &str, mut attempt: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match attempt() {
            Ok(()) => return,
            Err(last) => assert!(start.elapsed() < limit, "{what} (waited {limit:?})\n{last}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether something accepts connections on the Unix socket `path`.
fn answers(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// The Debian image fixture as an OCI archive (`images.rs` builds the fixtures once).
fn oci_archive() -> PathBuf {
    images().join("oci-archive.tar")
}

/// A process the rig started and stops: SIGTERM, then SIGKILL after 10 s.
struct Daemon {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf) -> Daemon {
        let f = std::fs::File::create(&log).expect("log file");
        // SAFETY: prctl is async-signal-safe. The daemon dies with the test's thread even
        // if the test process is killed before its guards run.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log file"))
            .stderr(f)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Daemon {
            name,
            child: Some(child),
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stop it; its exit status (None if it had to be killed).
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: signalling a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} ignored SIGTERM for 10 s: killed", self.name);
        // SAFETY: as above, the whole group.
        unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
        let _ = c.wait();
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Everything the test starts, torn down in order when dropped: mounts under the
/// scratch directory (deepest first), containerd, the snapshotter, then the directory.
struct Rig {
    containerd: Option<Daemon>,
    snapshotter: Option<Daemon>,
    /// /tmp/pkgfs-snap.XXXXXX: sockets, roots, logs, mountpoints.
    dir: tempfile::TempDir,
    /// Arguments the snapshotter gets beyond its root and socket.
    snap_args: Vec<String>,
    /// A `pkgfs store` the rig mounted (unmounted last).
    store: Option<PathBuf>,
    /// TOML appended to containerd's configuration.
    containerd_extra: String,
}

impl Rig {
    /// A rig in a fresh /tmp/pkgfs-snap.XXXXXX (short: sockets' paths are bounded).
    fn new() -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("pkgfs-snap.")
            .tempdir_in("/tmp")
            .expect("scratch under /tmp");
        Rig {
            containerd: None,
            snapshotter: None,
            dir,
            snap_args: Vec::new(),
            store: None,
            containerd_extra: String::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn sock(&self) -> PathBuf {
        self.path().join("c.sock")
    }

    fn snap_sock(&self) -> PathBuf {
        self.path().join("s.sock")
    }

    fn snap_root(&self) -> PathBuf {
        self.path().join("snap")
    }

    /// `pkgfs snapshotter` on the rig's root and socket, as `log` (a fresh file).
    fn snapshotter_cmd(&self) -> Command {
        let mut c = pkgfs();
        c.arg("snapshotter")
            .arg("--root")
            .arg(self.snap_root())
            .arg("--address")
            .arg(self.snap_sock())
            .args(&self.snap_args)
            .env("RUST_LOG", "info,pkgfs::snapshot=debug");
        c
    }

    /// Mount a `pkgfs store` at `ROOT/store` (no background fetch, no disk cache, its
    /// index cache and log in the rig; `extra` adds to its command) for the
    /// snapshotter to take layers from; its mountpoint.
    fn start_store(&mut self, extra: impl FnOnce(&mut Command)) -> PathBuf {
        let (store, mut c) = self.store_cmd(extra);
        ok(self.path(), &mut c, Duration::from_secs(30));
        self.store = Some(store.clone());
        self.snap_args = vec!["--store".into(), store.display().to_string()];
        store
    }

    /// The command [`Rig::start_store`] runs, and its mountpoint (made if missing).
    fn store_cmd(&self, extra: impl FnOnce(&mut Command)) -> (PathBuf, Command) {
        let store = self.path().join("store");
        if !store.exists() {
            std::fs::create_dir(&store).expect("store mountpoint");
        }
        let mut c = pkgfs();
        c.arg("store")
            .arg(&store)
            .args([
                "--tls-verify=false",
                "--no-background-fetch",
                "--no-disk-cache",
            ])
            .arg("--index-cache")
            .arg(self.path().join("index"))
            .arg("--log-file")
            .arg(self.path().join("store.log"));
        extra(&mut c);
        (store, c)
    }

    /// Start the snapshotter and wait until it answers.
    fn start_snapshotter(&mut self, log: &str) {
        let d = Daemon::spawn(
            "pkgfs snapshotter",
            &mut self.snapshotter_cmd(),
            self.path().join(log),
        );
        self.snapshotter = Some(d);
        let sock = self.snap_sock();
        let s = self.snapshotter.as_mut().expect("just set");
        let start = Instant::now();
        while !answers(&sock) {
            assert!(s.running(), "the snapshotter exited:\n{}", s.log_text());
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the snapshotter does not answer on {}:\n{}",
                sock.display(),
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// containerd with pkgfs as a proxy plugin, as `mount-tests/images/containerd.sh`
    /// configures one, and wait until it answers. With `tasks`, containers can run
    /// (`ctr run`: runc through containerd's shim), else tasks are off.
    fn start_containerd(&mut self, tasks: bool) {
        self.start_containerd_with(tasks, None)
    }

    /// [`Rig::start_containerd`], with its CRI plugin on and configured by `cri` (TOML
    /// appended to the configuration) when given.
    fn start_containerd_with(&mut self, tasks: bool, cri: Option<&str>) {
        let d = self.path();
        let cri_plugin = match cri {
            Some(_) => "",
            None => r#""io.containerd.grpc.v1.cri", "#,
        };
        let task_plugins = match tasks {
            true => "",
            false => {
                r#""io.containerd.runtime.v1.linux", "io.containerd.runtime.v2.task",
  "io.containerd.service.v1.tasks-service", "io.containerd.grpc.v1.tasks",
  "io.containerd.monitor.v1.cgroups", "#
            }
        };
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [{cri_plugin}"io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.restart", "io.containerd.internal.v1.tracing",
  {task_plugins}"io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[proxy_plugins.pkgfs]
  type = "snapshot"
  address = "{d}/s.sock"
{extra}{cri}"#,
            d = d.display(),
            extra = self.containerd_extra,
            cri = cri.unwrap_or("")
        );
        std::fs::write(d.join("config.toml"), config).expect("config");
        // containerd's own temporary mounts (layer unpacking) go under the rig too, so
        // that teardown finds any it leaves.
        let tmp = d.join("tmp");
        std::fs::create_dir(&tmp).expect("tmp");
        let daemon = Daemon::spawn(
            "containerd",
            Command::new("containerd")
                .arg("--config")
                .arg(d.join("config.toml"))
                .env("TMPDIR", &tmp),
            d.join("containerd.log"),
        );
        self.containerd = Some(daemon);
        let sock = self.sock();
        let c = self.containerd.as_mut().expect("just set");
        let start = Instant::now();
        while !answers(&sock) {
            assert!(c.running(), "containerd exited:\n{}", c.log_text());
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd does not answer:\n{}",
                c.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `ctr -a SOCK -n pkgfs-test ARGS…`.
    fn ctr(&self, args: &[&str]) -> Command {
        self.ctr_in(NS, args)
    }

    /// `ctr -a SOCK -n NAMESPACE ARGS…`.
    fn ctr_in(&self, namespace: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("-a")
            .arg(self.sock())
            .args(["-n", namespace])
            .args(args);
        c
    }

    /// `ctr snapshots mounts` of `key` in `snapshotter` (namespace `ns`) at `mp`: the
    /// mount command containerd would run.
    fn snapshot_mounts(&self, ns: &str, snapshotter: &str, mp: &Path, key: &str) -> String {
        let mp = mp.to_str().expect("UTF-8 path");
        let args = ["snapshots", "--snapshotter", snapshotter, "mounts", mp, key];
        ok(self.path(), &mut self.ctr_in(ns, &args), CTR_LIMIT)
    }

    /// Wait (30 s at most) until containerd, after a restart of the snapshotter, lists
    /// pkgfs's snapshots in namespace `ns` again (`count` of them, if given); the rows.
    fn listed_again(&self, ns: &str, count: Option<usize>) -> BTreeMap<String, (String, String)> {
        let mut rows = BTreeMap::new();
        wait_for(
            Duration::from_secs(30),
            "containerd lists pkgfs's snapshots again after a restart",
            || {
                let out = bounded(
                    self.path(),
                    &mut self.ctr_in(ns, &["snapshots", "--snapshotter", "pkgfs", "ls"]),
                    CTR_LIMIT,
                );
                rows = snapshot_rows(&String::from_utf8_lossy(&out.stdout));
                match out.status.success() && count.is_none_or(|n| rows.len() == n) {
                    true => Ok(()),
                    false => Err(format!(
                        "{rows:?}\n{}",
                        String::from_utf8_lossy(&out.stderr)
                    )),
                }
            },
        );
        rows
    }

    /// [`Rig::ctr`], bounded, must succeed; its standard output.
    fn ctr_ok(&self, args: &[&str]) -> String {
        ok(self.path(), &mut self.ctr(args), CTR_LIMIT)
    }

    /// Mount points under the rig, deepest first; the rig's store is not among them
    /// while the rig holds it.
    fn mounts_inside(&self) -> Vec<String> {
        let prefix = format!("{}/", self.path().display());
        let store = self.store.as_ref().map(|s| s.display().to_string());
        let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&prefix) && Some(*m) != store.as_deref())
            .map(String::from)
            .collect();
        v.sort_by_key(|m| std::cmp::Reverse(m.len()));
        v
    }

    fn unmount_all(&self) {
        for m in self.mounts_inside() {
            let _ = bounded(
                self.path(),
                Command::new("umount").arg("-l").arg(&m),
                Duration::from_secs(10),
            );
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.unmount_all();
        if let Some(mut c) = self.containerd.take() {
            c.stop();
        }
        // containerd may have mounted for an unpack in flight when it stopped.
        self.unmount_all();
        if let Some(mut s) = self.snapshotter.take() {
            s.stop();
        }
        if let Some(store) = self.store.take() {
            let _ = bounded(
                self.path(),
                pkgfs().arg("umount").arg(&store),
                Duration::from_secs(20),
            );
            self.unmount_all();
        }
        if std::thread::panicking() {
            let keep = self.path().to_path_buf();
            eprintln!("logs of the failed run:");
            for log in [
                "containerd.log",
                "snap.log",
                "snap2.log",
                "snap3.log",
                "store.log",
            ] {
                if let Ok(text) = std::fs::read_to_string(keep.join(log)) {
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    eprintln!("--- {log} (last 40 lines)");
                    tail.iter().rev().for_each(|l| eprintln!("{l}"));
                }
            }
        }
    }
}

/// `ctr snapshots --snapshotter S ls` as (key → (parent, kind)).
fn ls(rig: &Rig, snapshotter: &str) -> BTreeMap<String, (String, String)> {
    snapshot_rows(&rig.ctr_ok(&["snapshots", "--snapshotter", snapshotter, "ls"]))
}

/// The mountpoint of the image imported into `snapshotter`.
fn mountpoint(rig: &Rig, snapshotter: &str) -> PathBuf {
    rig.path().join(format!("m-{snapshotter}"))
}

/// After a lazy pull of `image` into namespace `ns`: containerd's content store holds
/// none of its `layers` (the manifest and config only), and `pkgfs status` of the
/// snapshotter says every layer is read lazily from `store`, for `image`.
fn assert_pulled_lazily(
    rig: &Rig,
    ns: &str,
    tag: &str,
    layers: &[(String, u64)],
    store: &Path,
    image: &str,
) {
    let content = ok(
        rig.path(),
        &mut rig.ctr_in(ns, &["content", "ls", "-q"]),
        CTR_LIMIT,
    );
    for (digest, _) in layers {
        assert!(!content.contains(digest.as_str()), "{tag}: {content}");
    }
    let st: serde_json::Value = serde_json::from_str(&ok(
        rig.path(),
        pkgfs().arg("status").arg("--json").arg(rig.snap_sock()),
        CTR_LIMIT,
    ))
    .unwrap();
    assert_eq!(st["lazy"], layers.len(), "{tag}: {st}");
    assert_eq!(st["unpacked"], 0, "{tag}: {st}");
    assert_eq!(st["store"], store.to_str().unwrap(), "{st}");
    for row in st["snapshots"].as_array().unwrap() {
        assert_eq!(row["how"], "lazy", "{row}");
        assert_eq!(row["reference"], image, "{row}");
    }
}

/// `ctr snapshots ls` as (key → (parent, kind)).
fn snapshot_rows(text: &str) -> BTreeMap<String, (String, String)> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [key, parent, kind] => {
                    Some((key.to_string(), (parent.to_string(), kind.to_string())))
                }
                [key, kind] => Some((key.to_string(), (String::new(), kind.to_string()))),
                _ => None,
            }
        })
        .collect()
}

/// `ctr snapshots usage -b KEY` as (bytes, inodes).
fn usage_of(rig: &Rig, snapshotter: &str, key: &str) -> (u64, u64) {
    let out = rig.ctr_ok(&[
        "snapshots",
        "--snapshotter",
        snapshotter,
        "usage",
        "-b",
        key,
    ]);
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no usage row: {out}"))
        .split_whitespace()
        .collect();
    (row[1].parse().unwrap(), row[2].parse().unwrap())
}

#[test]
fn containerd_imports_and_mounts_images_through_pkgfs_as_through_overlayfs() {
    if !require_tools(&["containerd", "ctr", "python3"]) {
        return;
    }
    let started = Instant::now();
    let archive = oci_archive();
    let mut rig = Rig::new();
    let fixture_ready = Instant::now();
    rig.start_snapshotter("snap.log");
    rig.start_containerd(false);

    // Import into both snapshotters.
    let archive = archive.to_str().expect("UTF-8 path");
    for snapshotter in ["pkgfs", "overlayfs"] {
        rig.ctr_ok(&[
            "images",
            "import",
            "--base-name",
            "pkgfs/debian",
            "--snapshotter",
            snapshotter,
            archive,
        ]);
    }
    let images = rig.ctr_ok(&["images", "ls", "-q"]);
    assert!(images.lines().any(|l| l == IMAGE), "{images}");
    // `pkgfs status SOCKET`: an import asks for no layer by name: each unpacked.
    let st = ok(
        rig.path(),
        pkgfs().arg("status").arg(rig.snap_sock()),
        CTR_LIMIT,
    );
    assert!(
        st.contains("0 layers read lazily, 3 unpacked")
            && st.matches("asked for no layer by name").count() == 3,
        "{st}"
    );

    // The snapshots as containerd lists them: the image's three layers, committed, with
    // the same chain (keys, parents, kinds) in both snapshotters.
    let rows = ls(&rig, "pkgfs");
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.values().all(|(_, kind)| kind == "Committed"),
        "{rows:?}"
    );
    assert_eq!(rows, ls(&rig, "overlayfs"));
    // The chain, top first: the top layer is nobody's parent.
    let top = rows
        .keys()
        .find(|k| !rows.values().any(|(parent, _)| parent == *k))
        .unwrap_or_else(|| panic!("no top layer in {rows:?}"))
        .clone();
    let mut chain = vec![top.clone()];
    while let Some((parent, _)) = rows
        .get(chain.last().unwrap())
        .filter(|(p, _)| !p.is_empty())
    {
        chain.push(parent.clone());
    }
    assert_eq!(chain.len(), 3, "{rows:?}");

    // A container's root in each snapshotter: an Active snapshot on the image's top
    // layer, made by `ctr containers create` (which keeps it from containerd's garbage
    // collector; `ctr images mount` would always use the default snapshotter, and a
    // bare `ctr snapshots view` may be collected under the test), mounted as the
    // snapshotter's Mounts say. The two trees must be equal.
    let snaps_dir = rig.snap_root().join("snapshots");
    let layer_id = |path: &str| -> u64 {
        path.strip_prefix(&format!("{}/", snaps_dir.display()))
            .and_then(|rest| {
                rest.strip_suffix("/fs")
                    .or_else(|| rest.strip_suffix("/work"))
            })
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("{path} is not a directory of pkgfs's snapshots"))
    };
    let mut pkgfs_options = Vec::new();
    for snapshotter in ["pkgfs", "overlayfs"] {
        let mp = mountpoint(&rig, snapshotter);
        std::fs::create_dir(&mp).unwrap();
        let container = format!("c-{snapshotter}");
        rig.ctr_ok(&[
            "containers",
            "create",
            "--snapshotter",
            snapshotter,
            "--snapshotter-label",
            "containerd.io/snapshot/pkgfs.created-with=ctr",
            IMAGE,
            &container,
        ]);
        let m = rig.snapshot_mounts(NS, snapshotter, &mp, &container);
        // One overlay mount: index=off where the kernel has the option (as overlayfs
        // says it), workdir, upperdir, lowerdir.
        let line = m.trim();
        assert_eq!(line.lines().count(), 1, "{m}");
        let prefix = format!("mount -t overlay overlay {} -o ", mp.display());
        let options: Vec<String> = line
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{m}"))
            .split(',')
            .map(String::from)
            .collect();
        let index: &[&str] = match Path::new("/sys/module/overlay/parameters/index").exists() {
            true => &["index=off"],
            false => &[],
        };
        let names: Vec<&str> = options
            .iter()
            .map(|o| o.split_once('=').map_or(o.as_str(), |(k, _)| k))
            .collect();
        let want = [index, &["workdir", "upperdir", "lowerdir"][..]].concat();
        let want: Vec<&str> = want
            .iter()
            .map(|o| o.split('=').next().unwrap_or(o))
            .collect();
        assert_eq!(names, want, "{m}");
        if let [.., first] = index {
            assert_eq!(options[0], *first, "{m}");
        }
        if snapshotter == "pkgfs" {
            pkgfs_options = options;
        }
        ok(
            rig.path(),
            Command::new("mount").args(line.split_whitespace().skip(1)),
            Duration::from_secs(20),
        );
    }
    // Directories in which an unpack applied a whiteout keep the time of that unpack
    // (containerd's applier, not the snapshotter, sets them), and the two imports ran
    // seconds apart: directory times are left out, everything else must be equal.
    trees_match(
        &mountpoint(&rig, "overlayfs"),
        &mountpoint(&rig, "pkgfs"),
        &["--no-dir-mtime"],
    );
    assert!(
        mountpoint(&rig, "pkgfs")
            .join("usr/local/bin/pkgfs-selftest")
            .is_file()
    );
    // pkgfs's options name its own directories: the container's work and fs, then the
    // layers' fs top first. Layers are unpacked bottom first, so ids grow up the chain.
    let value = |name: &str| -> String {
        pkgfs_options
            .iter()
            .find_map(|o| o.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {pkgfs_options:?}"))
            .to_string()
    };
    let upper = layer_id(&value("upperdir"));
    assert_eq!(layer_id(&value("workdir")), upper, "{pkgfs_options:?}");
    assert!(value("workdir").ends_with("/work") && value("upperdir").ends_with("/fs"));
    let lower: Vec<u64> = value("lowerdir").split(':').map(layer_id).collect();
    assert_eq!(lower.len(), 3, "{pkgfs_options:?}");
    assert!(lower[0] < upper, "{pkgfs_options:?}");
    assert!(lower.windows(2).all(|w| w[0] > w[1]), "{pkgfs_options:?}");
    let rows = ls(&rig, "pkgfs");
    assert_eq!(
        rows["c-pkgfs"],
        (top.clone(), "Active".to_string()),
        "{rows:?}"
    );

    // Usage of an Active snapshot is measured when asked: it grows with what the
    // container writes, by what overlayfs's grows.
    let before = usage_of(&rig, "pkgfs", "c-pkgfs");
    assert_eq!(before, usage_of(&rig, "overlayfs", "c-overlayfs"));
    for snapshotter in ["pkgfs", "overlayfs"] {
        let dir = mountpoint(&rig, snapshotter).join("srv/new");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("data"), vec![7u8; 300_000]).unwrap();
    }
    let after = usage_of(&rig, "pkgfs", "c-pkgfs");
    assert!(
        after.1 > before.1 && after.0 >= before.0 + 300_000,
        "{before:?} → {after:?}"
    );
    assert_eq!(after, usage_of(&rig, "overlayfs", "c-overlayfs"));

    // info: kind, parent and labels through Stat.
    let info: serde_json::Value =
        serde_json::from_str(&rig.ctr_ok(&["snapshots", "--snapshotter", "pkgfs", "info", &top]))
            .unwrap();
    assert_eq!(info["Kind"], "Committed", "{info}");
    assert_eq!(info["Parent"], chain[1].as_str(), "{info}");

    // usage: measured at Commit, as containerd's overlayfs measures it: what `du` says
    // of the layer's directory (allocated blocks, hard links once) and its inodes. The
    // two snapshotters' copies of a layer hold the same inodes, but ext4 may allocate a
    // large file in more extents in one than in the other (an extent block more): their
    // sizes agree to within a few blocks.
    for (key, id) in chain.iter().zip(&lower) {
        let ours = usage_of(&rig, "pkgfs", key);
        assert!(ours.1 > 0, "{key}: {ours:?}");
        let dir = snaps_dir.join(id.to_string()).join("fs");
        let du = ok(
            rig.path(),
            Command::new("du").args(["-s", "-B1"]).arg(&dir),
            Duration::from_secs(60),
        );
        let du: i64 = du.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(
            ours.0 as i64,
            du,
            "usage of {key} against du of {}",
            dir.display()
        );
        let theirs = usage_of(&rig, "overlayfs", key);
        assert_eq!(ours.1, theirs.1, "inodes of {key}");
        assert!(
            (ours.0 as i64 - theirs.0 as i64).abs() <= 16 * 4096,
            "usage of {key}: {ours:?} against overlayfs's {theirs:?}"
        );
    }

    // label: containerd passes labels under containerd.io/snapshot/ on to the backend.
    let label = "containerd.io/snapshot/pkgfs.test";
    rig.ctr_ok(&[
        "snapshots",
        "--snapshotter",
        "pkgfs",
        "label",
        &top,
        &format!("{label}=yes"),
    ]);
    let info: serde_json::Value =
        serde_json::from_str(&rig.ctr_ok(&["snapshots", "--snapshotter", "pkgfs", "info", &top]))
            .unwrap();
    assert_eq!(info["Labels"][label], "yes", "{info}");

    // Unmount and remove the containers, and with them their snapshots.
    for snapshotter in ["pkgfs", "overlayfs"] {
        ok(
            rig.path(),
            Command::new("umount").arg(mountpoint(&rig, snapshotter)),
            Duration::from_secs(20),
        );
        rig.ctr_ok(&["containers", "rm", &format!("c-{snapshotter}")]);
    }
    assert!(rig.mounts_inside().is_empty(), "{:?}", rig.mounts_inside());
    assert_eq!(
        ls(&rig, "pkgfs").len(),
        3,
        "the containers' snapshots are gone"
    );
    // containerd forgets a snapshot at once, and has the snapshotter remove it at its
    // next garbage collection (rate-limited: seconds later).
    let in_snapshots_dir = || -> Vec<String> {
        std::fs::read_dir(&snaps_dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_for(
        Duration::from_secs(30),
        "the container's snapshot leaves pkgfs's snapshots directory",
        || match in_snapshots_dir() {
            left if left.len() == 3 => Ok(()),
            left => Err(format!("{left:?}")),
        },
    );

    // A second server on the same socket is refused while the first answers.
    let second = bounded(
        rig.path(),
        &mut rig.snapshotter_cmd(),
        Duration::from_secs(20),
    );
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("another server"), "{said}");
    assert!(answers(&rig.snap_sock()), "the first still serves");

    // Stop: SIGTERM, exit 0, socket removed; the records are in the database, the label
    // among them (read with the library while no server holds it).
    let status = rig.snapshotter.as_mut().unwrap().stop();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(!rig.snap_sock().exists(), "the socket is removed on exit");
    {
        let store = pkgfs::snapshot::meta::Store::open(&rig.snap_root().join("metadata.redb"))
            .expect("the database, no server holding it");
        let all = store.list().unwrap();
        assert_eq!(all.len(), 3, "{all:?}");
        let top_record = all
            .iter()
            .find(|i| i.name.ends_with(&format!("/{top}")))
            .unwrap_or_else(|| panic!("{top} in {all:?}"));
        assert_eq!(
            top_record.labels.get(label).map(String::as_str),
            Some("yes")
        );
        assert!(
            all.iter()
                .all(|i| i.kind == pkgfs::snapshot::Kind::Committed)
        );
    }

    // A stale socket file (nobody listening) is replaced on restart; containerd
    // reconnects by itself and lists the committed layers again.
    drop(std::os::unix::net::UnixListener::bind(rig.snap_sock()).unwrap());
    assert!(rig.snap_sock().exists());
    rig.start_snapshotter("snap2.log");
    let after = rig.listed_again(NS, Some(3));
    for key in &chain {
        assert_eq!(after[key].1, "Committed");
    }

    // Remove the image: containerd's garbage collector removes every snapshot, and
    // pkgfs's snapshots directory is left empty.
    rig.ctr_ok(&["images", "rm", "--sync", IMAGE]);
    wait_for(
        Duration::from_secs(30),
        "pkgfs's snapshots directory empties after `ctr images rm --sync`",
        || match in_snapshots_dir() {
            left if left.is_empty() => Ok(()),
            left => Err(format!("left: {left:?}")),
        },
    );
    assert!(ls(&rig, "pkgfs").is_empty());
    assert!(ls(&rig, "overlayfs").is_empty());
    assert!(rig.mounts_inside().is_empty(), "{:?}", rig.mounts_inside());

    let status = rig.snapshotter.as_mut().unwrap().stop();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    // Nothing went wrong on the way that containerd would not have shown: no warning or
    // error in either server's log (the answers containerd expects, such as NotFound, are
    // logged at debug level).
    for log in ["snap.log", "snap2.log"] {
        let text = std::fs::read_to_string(rig.path().join(log)).unwrap();
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(bad.is_empty(), "{log}:\n{}", bad.join("\n"));
        eprintln!(
            "{log}: {} lines, {} at debug level",
            text.lines().count(),
            text.lines().filter(|l| l.contains(" DEBUG ")).count()
        );
    }
    eprintln!(
        "snapshotter test: {:.1} s (fixture {:.1} s)",
        started.elapsed().as_secs_f64(),
        (fixture_ready - started).as_secs_f64()
    );
}

/// The fs directories of a container's overlay mount as `ctr snapshots mounts` prints
/// it: (upperdir, lowerdirs top first).
fn overlay_dirs(mount_line: &str) -> (String, Vec<String>) {
    let options = mount_line
        .split_whitespace()
        .last()
        .unwrap_or_else(|| panic!("{mount_line}"));
    let value = |name: &str| {
        options
            .split(',')
            .find_map(|o| o.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {mount_line}"))
            .to_string()
    };
    let lower = value("lowerdir").split(':').map(String::from).collect();
    (value("upperdir"), lower)
}

/// Whether `path` is a mount point of this mount namespace.
fn mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(path))
}

/// containerd pulls through pkgfs lazily: `pkgfs snapshotter --store` over a `pkgfs
/// store`, images in docker-registry on loopback as eStargz, zstd:chunked and plain gzip,
/// each pulled by `ctr-remote images rpull` (which labels each layer with its image and
/// digest) into a namespace of its own. Each layer is committed as a remote snapshot
/// bind-mounted from the store, containerd downloads no layer, and the registry sends
/// under 10 % of the layer bytes for the two kinds with a table of contents (plain gzip
/// takes one pass). A container's root equals the same image pulled into containerd's
/// own overlayfs snapshotter and runs its programs (chroot: no runtime here). The
/// snapshotter stopped, the container still reads; a layer's mount undone (as a reboot
/// undoes it) is made again at the next start. `ctr images rm --sync` leaves nothing.
#[test]
fn containerd_pulls_lazily_through_the_layer_store() {
    if !require_tools(&[
        "containerd",
        "ctr",
        "ctr-remote",
        "docker-registry",
        "skopeo",
        "python3",
        "chroot",
    ]) {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let kinds = [
        ("oci-estargz:latest", "esgz", true),
        ("oci-zstd-chunked:latest", "zc", true),
        ("oci-gzip:latest", "gz", false),
    ];
    for (from, tag, _) in kinds {
        reg.push(from, &format!("pkgfs/debian:{tag}"), None);
    }
    // SOCI-indexed gzip: the image index with its SOCI index, as `soci convert` makes it.
    ok(
        Path::new("/tmp"),
        Command::new("skopeo")
            .args(["copy", "--quiet", "--all", "--dest-tls-verify=false"])
            .arg(format!(
                "oci:{}",
                soci_fixtures().join("oci-gzip-soci").display()
            ))
            .arg(format!("docker://{}/pkgfs/debian:soci", reg.host())),
        Duration::from_secs(120),
    );
    let kinds = [kinds[0], kinds[1], ("", "soci", true), kinds[2]];
    let mut rig = Rig::new();
    let store = rig.start_store(|_| {});
    rig.start_snapshotter("snap.log");
    rig.start_containerd(true);

    let mut layer_count = 0;
    for (_, tag, has_toc) in kinds {
        let ns = format!("lazy-{tag}");
        let name = format!("pkgfs/debian:{tag}");
        let image = format!("{}/{name}", reg.host());
        let (mut manifest, _) = manifest_and_config(&reg, &name);
        if let Some(list) = manifest["manifests"].as_array() {
            // An index (SOCI's): the image's manifest is the one not annotated as a
            // SOCI index of another.
            let digest = list
                .iter()
                .find(|d| d["annotations"]["com.amazon.soci.image-manifest-digest"].is_null())
                .and_then(|d| d["digest"].as_str())
                .unwrap_or_else(|| panic!("{manifest}"))
                .to_string();
            manifest = manifest_and_config(&reg, &format!("pkgfs/debian@{digest}")).0;
        }
        let layers: Vec<(String, u64)> = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["digest"].as_str().unwrap().to_string(),
                    l["size"].as_u64().unwrap(),
                )
            })
            .collect();
        let layer_bytes: u64 = layers.iter().map(|l| l.1).sum();
        layer_count += layers.len();
        if !has_toc {
            plain_pulls_are_unpacked_and_say_why(&rig, &image, layers.len());
        }
        let before = reg.blob_gets().1;
        ok(
            rig.path(),
            Command::new("ctr-remote").arg("-a").arg(rig.sock()).args([
                "-n",
                &ns,
                "images",
                "rpull",
                "--plain-http",
                "--snapshotter",
                "pkgfs",
                &image,
            ]),
            CTR_LIMIT,
        );
        let fetched = reg.blob_gets().1 - before;
        eprintln!("{tag}: the pull fetched {fetched} of {layer_bytes} layer bytes");
        if has_toc {
            assert!(
                fetched * 10 < layer_bytes,
                "{tag}: {fetched} of {layer_bytes} bytes"
            );
        }
        // containerd holds no layer; `pkgfs status SOCKET` says each is read lazily,
        // and from where.
        assert_pulled_lazily(&rig, &ns, tag, &layers, &store, &image);
        // Every layer a committed remote snapshot, named by its digest, using no disk.
        let rows = snapshot_rows(&ok(
            rig.path(),
            &mut rig.ctr_in(&ns, &["snapshots", "--snapshotter", "pkgfs", "ls"]),
            CTR_LIMIT,
        ));
        assert_eq!(rows.len(), layers.len(), "{tag}: {rows:?}");
        let mut digests = Vec::new();
        for key in rows.keys() {
            let info: serde_json::Value = serde_json::from_str(&ok(
                rig.path(),
                &mut rig.ctr_in(&ns, &["snapshots", "--snapshotter", "pkgfs", "info", key]),
                CTR_LIMIT,
            ))
            .unwrap();
            assert_eq!(info["Kind"], "Committed", "{info}");
            assert_eq!(
                info["Labels"]["containerd.io/snapshot/remote/pkgfs.reference"],
                image.as_str(),
                "{info}"
            );
            digests.push(
                info["Labels"]["containerd.io/snapshot/remote/pkgfs.digest"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{info}"))
                    .to_string(),
            );
        }
        digests.sort();
        let mut want: Vec<String> = layers.iter().map(|l| l.0.clone()).collect();
        want.sort();
        assert_eq!(digests, want, "{tag}");

        // A container's root on it, mounted as pkgfs says; the same image pulled into
        // containerd's overlayfs snapshotter (which downloads and unpacks it).
        let mut roots = Vec::new();
        let mut pkgfs_lower = Vec::new();
        for snapshotter in ["pkgfs", "overlayfs"] {
            if snapshotter == "overlayfs" {
                ok(
                    rig.path(),
                    &mut rig.ctr_in(
                        &ns,
                        &[
                            "images",
                            "pull",
                            "--plain-http",
                            "--snapshotter",
                            "overlayfs",
                            &image,
                        ],
                    ),
                    CTR_LIMIT,
                );
            }
            let container = format!("c-{snapshotter}");
            ok(
                rig.path(),
                &mut rig.ctr_in(
                    &ns,
                    &[
                        "containers",
                        "create",
                        "--snapshotter",
                        snapshotter,
                        &image,
                        &container,
                    ],
                ),
                CTR_LIMIT,
            );
            let mp = rig.path().join(format!("m-{tag}-{snapshotter}"));
            std::fs::create_dir(&mp).unwrap();
            let line = rig.snapshot_mounts(&ns, snapshotter, &mp, &container);
            ok(
                rig.path(),
                Command::new("mount").args(line.split_whitespace().skip(1)),
                Duration::from_secs(20),
            );
            if snapshotter == "pkgfs" {
                // Every lower layer is the store's, bind-mounted.
                let (_, lower) = overlay_dirs(line.trim());
                assert_eq!(lower.len(), layers.len(), "{line}");
                assert!(lower.iter().all(|l| mounted(l)), "{line}");
                pkgfs_lower = lower;
            }
            roots.push(mp);
        }
        runs_its_programs(&roots[0]);
        // And as a container: `ctr run` (runc through containerd's shim) on a root of
        // its own from pkgfs.
        let out = ok(
            rig.path(),
            &mut rig.ctr_in(
                &ns,
                &[
                    "run",
                    "--rm",
                    "--snapshotter",
                    "pkgfs",
                    &image,
                    &format!("run-{tag}"),
                    "/usr/local/bin/pkgfs-selftest",
                ],
            ),
            CTR_LIMIT,
        );
        assert_eq!(
            out,
            std::fs::read_to_string(images().join("reference.selftest")).unwrap(),
            "{tag}"
        );
        // containerd's unpack of an eStargz layer keeps the format's own entries, which
        // pkgfs (as stargz-snapshotter) does not show (docs/SEMANTICS.md).
        let mut flags = vec!["--no-dir-mtime"];
        if tag == "esgz" {
            for own in [
                "stargz.index.json",
                ".prefetch.landmark",
                ".no.prefetch.landmark",
            ] {
                flags.extend(["--exclude", own]);
            }
        }
        trees_match(&roots[1], &roots[0], &flags);
        if tag == "esgz" {
            restarts_keep_lazy_layers(&mut rig, &ns, &roots[0], &pkgfs_lower);
        }
        // Containers and images removed: every layer unmounted, the snapshots directory
        // empty (layers of the same chain would otherwise be shared by the next image).
        for (snapshotter, mp) in ["pkgfs", "overlayfs"].iter().zip(&roots) {
            ok(
                rig.path(),
                Command::new("umount").arg(mp),
                Duration::from_secs(20),
            );
            ok(
                rig.path(),
                &mut rig.ctr_in(&ns, &["containers", "rm", &format!("c-{snapshotter}")]),
                CTR_LIMIT,
            );
        }
        ok(
            rig.path(),
            &mut rig.ctr_in(&ns, &["images", "rm", "--sync", &image]),
            CTR_LIMIT,
        );
        emptied(&rig);
    }

    // The logs said, per layer, that it was read lazily; nothing went wrong.
    let logs: Vec<String> = ["snap.log", "snap2.log"]
        .iter()
        .map(|l| std::fs::read_to_string(rig.path().join(l)).unwrap())
        .collect();
    let lazy: usize = logs
        .iter()
        .map(|t| t.lines().filter(|l| l.contains(": read lazily")).count())
        .sum();
    assert_eq!(lazy, layer_count, "{logs:?}");
    for text in &logs {
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}

/// Stop the snapshotter: the container at `root` reads on. Undo the mount of one of its
/// `layers` (as a reboot undoes them all) and start the snapshotter again: the layer is
/// mounted again, and said to be; containerd (in namespace `ns`) reconnects.
fn restarts_keep_lazy_layers(rig: &mut Rig, ns: &str, root: &Path, layers: &[String]) {
    let status = rig.snapshotter.as_mut().unwrap().stop();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let bash = std::fs::read(images().join("reference/rootfs/usr/bin/bash")).unwrap();
    assert_eq!(std::fs::read(root.join("usr/bin/bash")).unwrap(), bash);
    let undone = layers.last().unwrap();
    ok(
        rig.path(),
        Command::new("umount").arg("-l").arg(undone),
        Duration::from_secs(20),
    );
    assert!(!mounted(undone));
    rig.start_snapshotter("snap2.log");
    assert!(mounted(undone), "{undone} is not mounted again");
    assert!(
        std::fs::read_dir(undone).unwrap().next().is_some(),
        "{undone} is empty"
    );
    let log = rig.snapshotter.as_ref().unwrap().log_text();
    assert_eq!(log.matches("mounted again").count(), 1, "{log}");
    assert_eq!(std::fs::read(root.join("usr/bin/bash")).unwrap(), bash);
    // containerd dials again after a back-off: until it has, its garbage collector
    // cannot reach the snapshotter.
    rig.listed_again(ns, None);
}

/// Wait until pkgfs's snapshots directory is empty and nothing is mounted in the rig
/// (after `ctr images rm --sync`: containerd's collector removes the snapshots).
fn emptied(rig: &Rig) {
    let snaps_dir = rig.snap_root().join("snapshots");
    wait_for(
        Duration::from_secs(30),
        "pkgfs's snapshots directory empties after `ctr images rm --sync`",
        || {
            let left: Vec<_> = std::fs::read_dir(&snaps_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            match (left.is_empty(), rig.mounts_inside()) {
                (true, m) if m.is_empty() => Ok(()),
                (_, m) => Err(format!("left: {left:?}, mounted: {m:?}")),
            }
        },
    );
}

/// A plain `ctr images pull` (no labels naming the image) of `image` through pkgfs:
/// the pull works, containerd unpacks each of its `layers`, and `pkgfs status` says
/// why each was not read lazily. Removed after.
fn plain_pulls_are_unpacked_and_say_why(rig: &Rig, image: &str, layers: usize) {
    let ns = "plain";
    ok(
        rig.path(),
        &mut rig.ctr_in(
            ns,
            &[
                "images",
                "pull",
                "--plain-http",
                "--snapshotter",
                "pkgfs",
                image,
            ],
        ),
        CTR_LIMIT,
    );
    let st: serde_json::Value = serde_json::from_str(&ok(
        rig.path(),
        pkgfs().arg("status").arg("--json").arg(rig.snap_sock()),
        CTR_LIMIT,
    ))
    .unwrap();
    assert_eq!(st["unpacked"], layers, "{st}");
    assert_eq!(st["lazy"], 0, "{st}");
    for row in st["snapshots"].as_array().unwrap() {
        assert_eq!(row["how"], "unpacked", "{row}");
        let why = row["why"].as_str().unwrap_or_default();
        assert!(why.contains("asked for no layer by name"), "{row}");
    }
    ok(
        rig.path(),
        &mut rig.ctr_in(ns, &["images", "rm", "--sync", image]),
        CTR_LIMIT,
    );
    emptied(rig);
}

/// A client built from the Go module proxy by `mount-tests/SCRIPT` into
/// `target/NAME` (once: the script keeps a stamp); its binary.
fn go_tool(script: &str, name: &str, limit: Duration) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = ok(
        Path::new("/tmp"),
        Command::new("bash")
            .arg(repo.join("mount-tests").join(script))
            .arg(images().with_file_name(name)),
        limit,
    );
    PathBuf::from(out.trim())
}

/// nerdctl (`nerdctl/make_nerdctl.sh`: containerd/nerdctl built from the Go module
/// proxy), built once under the target directory.
fn nerdctl() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        go_tool(
            "nerdctl/make_nerdctl.sh",
            "nerdctl",
            Duration::from_secs(1500),
        )
    })
}

/// nerdctl sends the labels that name an image's layers only to snapshotters it knows
/// by name (`stargz`, `soci`, `nydus`, `overlaybd`, `cvmfs-snapshotter`), and pulls
/// into the one of that exact name. So pkgfs's snapshotter is configured in containerd
/// a second time, as the proxy plugin `stargz` (docs/design/snapshotter.md): `nerdctl
/// --snapshotter stargz pull` of an eStargz and a zstd:chunked image then downloads
/// under 10 % of the layer bytes, containerd's content store holds no layer, `pkgfs
/// status` says every layer is read lazily, and a container runs on it (`ctr run`).
/// A plain pull under another name is unpacked, as for `ctr`.
#[test]
fn nerdctl_pulls_lazily_through_pkgfs_named_as_a_snapshotter_it_knows() {
    if !require_tools(&["containerd", "ctr", "docker-registry", "skopeo", "go"]) {
        return;
    }
    let nerdctl = nerdctl();
    let reg = Registry::start(Auth::Anonymous);
    let tags = [
        ("oci-estargz:latest", "esgz"),
        ("oci-zstd-chunked:latest", "zc"),
    ];
    for (from, tag) in tags {
        reg.push(from, &format!("pkgfs/debian:{tag}"), None);
    }
    let mut rig = Rig::new();
    let store = rig.start_store(|_| {});
    rig.start_snapshotter("snap.log");
    rig.containerd_extra = format!(
        "[proxy_plugins.stargz]\n  type = \"snapshot\"\n  address = \"{}\"\n",
        rig.snap_sock().display()
    );
    rig.start_containerd(true);
    let data_root = rig.path().join("nerdctl");
    for (_, tag) in tags {
        let ns = format!("nerdctl-{tag}");
        let name = format!("pkgfs/debian:{tag}");
        let image = format!("{}/{name}", reg.host());
        let (manifest, _) = manifest_and_config(&reg, &name);
        let layers: Vec<(String, u64)> = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let digest = l["digest"].as_str().unwrap().to_string();
                (digest, l["size"].as_u64().unwrap())
            })
            .collect();
        let layer_bytes: u64 = layers.iter().map(|l| l.1).sum();
        let before = reg.blob_gets().1;
        ok(
            rig.path(),
            Command::new(nerdctl)
                .arg("--address")
                .arg(rig.sock())
                .arg("--data-root")
                .arg(&data_root)
                .args([
                    "--namespace",
                    &ns,
                    "--snapshotter",
                    "stargz",
                    "--insecure-registry",
                    "pull",
                    "--quiet",
                    &image,
                ]),
            CTR_LIMIT,
        );
        let fetched = reg.blob_gets().1 - before;
        eprintln!("nerdctl {tag}: the pull fetched {fetched} of {layer_bytes} layer bytes");
        assert!(
            fetched * 10 < layer_bytes,
            "{tag}: {fetched} of {layer_bytes} bytes"
        );
        assert_pulled_lazily(&rig, &ns, tag, &layers, &store, &image);
        // A container on it, through the same plugin name.
        let out = ok(
            rig.path(),
            &mut rig.ctr_in(
                &ns,
                &[
                    "run",
                    "--rm",
                    "--snapshotter",
                    "stargz",
                    &image,
                    &format!("run-{tag}"),
                    "/usr/local/bin/pkgfs-selftest",
                ],
            ),
            CTR_LIMIT,
        );
        assert_eq!(
            out,
            std::fs::read_to_string(images().join("reference.selftest")).unwrap(),
            "{tag}"
        );
        ok(
            rig.path(),
            &mut rig.ctr_in(&ns, &["images", "rm", "--sync", &image]),
            CTR_LIMIT,
        );
        emptied(&rig);
    }
    // Under a name nerdctl does not know, the same pull sends no labels naming the
    // layers: containerd downloads and unpacks them, and the snapshotter says why.
    let image = format!("{}/pkgfs/debian:esgz", reg.host());
    let before = reg.blob_gets().1;
    ok(
        rig.path(),
        Command::new(nerdctl)
            .arg("--address")
            .arg(rig.sock())
            .arg("--data-root")
            .arg(&data_root)
            .args([
                "--namespace",
                "nerdctl-plain",
                "--snapshotter",
                "pkgfs",
                "--insecure-registry",
                "pull",
                "--quiet",
                &image,
            ]),
        CTR_LIMIT,
    );
    let st: serde_json::Value = serde_json::from_str(&ok(
        rig.path(),
        pkgfs().arg("status").arg("--json").arg(rig.snap_sock()),
        CTR_LIMIT,
    ))
    .unwrap();
    assert_eq!(st["lazy"], 0, "{st}");
    assert!(st["unpacked"].as_u64().unwrap() > 0, "{st}");
    assert!(reg.blob_gets().1 - before > 0, "the layers were downloaded");
    ok(
        rig.path(),
        &mut rig.ctr_in("nerdctl-plain", &["images", "rm", "--sync", &image]),
        CTR_LIMIT,
    );
}

/// crictl (`cri/make_crictl.sh`: kubernetes-sigs/cri-tools built from the Go module
/// proxy), built once under the target directory.
fn crictl() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| go_tool("cri/make_crictl.sh", "crictl", Duration::from_secs(900)))
}

/// kubelet's image pull secrets reach the store (`pkgfs store --cri-image-proxy`):
/// containerd with its CRI plugin on and pkgfs as the CRI's snapshotter, a registry
/// that wants a token for a user and password, and crictl (which speaks the CRI image
/// service as kubelet does, and sends `--creds` as kubelet sends a pull secret) pulling
/// through the store's proxy. Without credentials the pull is refused; with them every
/// layer is read lazily by the store, which was given no credentials of its own. An
/// image pulled with credentials through containerd's own socket (the proxy passed
/// by) is pulled too, but the store cannot read it and containerd unpacks it, as
/// `pkgfs status` says. The proxy passes the image service only, and its socket is the
/// owner's alone.
#[test]
fn kubelets_pull_secrets_reach_the_store_through_the_cri_proxy() {
    use std::os::unix::fs::PermissionsExt;
    if !require_tools(&["containerd", "ctr", "docker-registry", "skopeo", "go"]) {
        return;
    }
    let crictl = crictl();
    let (user, pass) = ("kube", "s3cret-pull");
    let reg = Registry::start(Auth::Token(user, pass, 300));
    let creds = format!("{user}:{pass}");
    reg.push("oci-estargz:latest", "private/debian:esgz", Some(&creds));
    // Another repository, other layers (chain IDs name content: the same layers would
    // be found committed already).
    reg.push("oci-zstd-chunked:latest", "other/debian:zc", Some(&creds));
    let host = reg.host();
    let mut rig = Rig::new();
    let proxy = rig.path().join("cri.sock");
    let (dir, sock) = (rig.path().to_path_buf(), rig.sock());
    rig.start_store(|c| {
        c.arg("--cri-image-proxy")
            .arg(&proxy)
            .arg("--cri-upstream")
            .arg(&sock)
            // No credentials of its own: nothing in the environment either.
            .env("REGISTRY_AUTH_FILE", dir.join("no-auth.json"))
            .env("HOME", &dir);
    });
    assert_eq!(
        std::fs::metadata(&proxy).unwrap().permissions().mode() & 0o777,
        0o600,
        "the proxy's socket"
    );
    rig.start_snapshotter("snap.log");
    let d = rig.path().display().to_string();
    let cri = format!(
        r#"[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "pkgfs"
    disable_snapshot_annotations = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{host}"]
    endpoint = ["http://{host}"]
"#
    );
    rig.start_containerd_with(true, Some(&cri));
    let endpoint = format!("unix://{}", proxy.display());
    let direct = format!("unix://{}", rig.sock().display());
    let cri_call = |endpoint: &str, args: &[&str]| -> Output {
        bounded(
            rig.path(),
            Command::new(crictl)
                .args(["--image-endpoint", endpoint, "--runtime-endpoint", endpoint])
                .args(["--timeout", "60s"])
                .args(args),
            CTR_LIMIT,
        )
    };
    let image = format!("{host}/private/debian:esgz");

    // No credentials: the registry refuses containerd, and the pull fails.
    let out = cri_call(&endpoint, &["pull", &image]);
    assert!(!out.status.success(), "a pull without credentials worked");
    // With them: pulled, every layer read lazily by the store.
    let before = reg.blob_gets().1;
    let out = cri_call(&endpoint, &["pull", "--creds", &creds, &image]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fetched = reg.blob_gets().1 - before;
    let (manifest, _) = manifest_and_config_as(&reg, "private/debian:esgz", &creds);
    let layers: Vec<&serde_json::Value> = manifest["layers"].as_array().unwrap().iter().collect();
    let layer_bytes: u64 = layers.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert!(
        fetched * 10 < layer_bytes,
        "{fetched} of {layer_bytes} bytes"
    );
    let status = || -> serde_json::Value {
        serde_json::from_str(&ok(
            rig.path(),
            pkgfs().arg("status").arg("--json").arg(rig.snap_sock()),
            CTR_LIMIT,
        ))
        .unwrap()
    };
    let st = status();
    assert_eq!(st["lazy"], layers.len(), "{st}");
    assert_eq!(st["unpacked"], 0, "{st}");
    // The image service answers through the proxy: the image is listed, and inspected.
    let out = cri_call(&endpoint, &["images", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("private/debian"),
        "{out:?}"
    );
    let store_log = std::fs::read_to_string(rig.path().join("store.log")).unwrap();
    assert!(
        store_log.contains(&format!("credentials kept for {host}/private/debian")),
        "{store_log}"
    );
    assert!(
        !store_log.contains(pass),
        "the store's log shows the password"
    );

    // Pulled past the proxy: containerd has the credentials, the store has none for
    // that repository, so containerd unpacks, and status says why.
    let other = format!("{host}/other/debian:zc");
    let out = cri_call(&direct, &["pull", "--creds", &creds, &other]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (other_manifest, _) = manifest_and_config_as(&reg, "other/debian:zc", &creds);
    let st = status();
    assert_eq!(st["lazy"], layers.len(), "{st}");
    assert_eq!(
        st["unpacked"],
        other_manifest["layers"].as_array().unwrap().len(),
        "{st}"
    );
    for row in st["snapshots"].as_array().unwrap() {
        if row["how"] == "unpacked" {
            let why = row["why"].as_str().unwrap_or_default();
            assert!(
                why.contains("cannot serve layer") && why.contains(&other),
                "{row}"
            );
        }
    }
    let store_log = std::fs::read_to_string(rig.path().join("store.log")).unwrap();
    assert!(
        store_log.contains(&format!("{host}/other/debian: access denied")),
        "{store_log}"
    );

    // The store's server dies: its keeper starts the next and hands it the pull secret
    // before it grows the tree again (the private image's lookups), and every file of
    // the store reads through it from the registry (no disk cache).
    let store = rig.store.clone().expect("the store");
    let old = crate::common::server_pid(&store).expect("the store's server answers");
    crate::common::kill9(old);
    let new = crate::common::next_server(&store, Some(old));
    let (files, bytes) = read_every_file(&store);
    assert!(files > 1000, "{files} files, {bytes} bytes in the store");
    let store_log = std::fs::read_to_string(rig.path().join("store.log")).unwrap();
    assert!(
        store_log.contains("handing 1 pull secrets to the new server"),
        "server {new}: {store_log}"
    );
    assert!(
        !store_log.contains(pass),
        "the store's log shows the password"
    );

    // Not the image service: refused, containerd's runtime is not reachable this way.
    let out = cri_call(&endpoint, &["ps"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image service only"), "{err}");

    // Removed through the proxy: nothing of the image left in the snapshotter.
    for img in [&image, &other] {
        let out = cri_call(&endpoint, &["rmi", img]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ok(
        rig.path(),
        &mut rig.ctr_in("k8s.io", &["content", "prune", "references"]),
        CTR_LIMIT,
    );
    wait_for(Duration::from_secs(30), "every snapshot removed", || {
        let st = status();
        match st["snapshots"].as_array().map_or(0, |a| a.len()) {
            0 => Ok(()),
            n => Err(format!("{n} left: {st}")),
        }
    });
}

/// Read every regular file under `dir` to its end: how many, and their bytes.
fn read_every_file(dir: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let n = std::io::copy(
                    &mut std::fs::File::open(e.path()).unwrap(),
                    &mut std::io::sink(),
                )
                .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
                files += 1;
                bytes += n;
            }
        }
    }
    (files, bytes)
}

/// The process at the other end of a connection to the unix socket `path`.
fn socket_peer_pid(path: &Path) -> i32 {
    let s = std::os::unix::net::UnixStream::connect(path).expect("the socket answers");
    pkgfs::keeper::wire::peer(&s).expect("SO_PEERCRED").pid
}

/// `pkgfs reload` of a store that serves the CRI proxy: the new server waits for the
/// old one to let go of the proxy's socket (the keeper stops it once the new one
/// serves), then answers on it, mode 0600; the old one, ending, leaves the new socket.
/// A socket another process serves fails the store's start, before anything is
/// mounted.
#[test]
fn a_store_with_the_cri_proxy_reloads_and_the_new_server_takes_its_socket() {
    use std::os::unix::fs::PermissionsExt;
    let mut rig = Rig::new();
    let proxy = rig.path().join("cri.sock");
    let upstream = rig.sock();
    let with_proxy = |c: &mut Command| {
        c.arg("--cri-image-proxy")
            .arg(&proxy)
            .arg("--cri-upstream")
            .arg(&upstream);
    };
    let stranger = std::os::unix::net::UnixListener::bind(&proxy).unwrap();
    let (mp, mut c) = rig.store_cmd(with_proxy);
    let out = bounded(rig.path(), &mut c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started beside another process's socket"
    );
    assert!(err.contains("another process serves"), "{err}");
    assert!(!crate::common::is_mountpoint(&mp), "mounted all the same");
    drop(stranger);
    let store = rig.start_store(with_proxy);
    let old = crate::common::status_json(&store)["server_pid"]
        .as_i64()
        .unwrap();
    assert_eq!(i64::from(socket_peer_pid(&proxy)), old);
    let out = bounded(
        rig.path(),
        pkgfs().arg("reload").arg(&store),
        Duration::from_secs(90),
    );
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let log = || std::fs::read_to_string(rig.path().join("store.log")).unwrap_or_default();
    assert!(out.status.success(), "{said}\n{}", log());
    let new = crate::common::status_json(&store)["server_pid"]
        .as_i64()
        .unwrap();
    assert_ne!(new, old, "{said}");
    assert_eq!(
        i64::from(socket_peer_pid(&proxy)),
        new,
        "the proxy's socket is not the new server's\n{}",
        log()
    );
    assert_eq!(
        std::fs::metadata(&proxy).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
