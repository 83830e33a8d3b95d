//! Mount tests of layouts (`--layout each|npm|cargo`, `--strip-components`), against
//! what the real tools write: `npm ci` from a pinned lockfile (node then serves express
//! from the mount, `npm ls` finds nothing wrong), cargo building a crate offline from a
//! mount of its registry cache, and GNU tar's and unzip's extraction of each archive
//! into a directory of its own. Fixtures are made once by
//! `mount-tests/layouts/make_layout_fixtures.sh` (npm registry and crates.io, pinned).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

use crate::common::{
    Mount, UmountGuard, is_mountpoint, pkgfs, repo, require_tools, run, skipped_rows, status_json,
    transport_args, trees_match, wait_until,
};

/// The layout fixtures (see the script's header for what is where), built once per
/// target directory and rebuilt when the script or its pins change.
fn layout_fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("layout-fixtures");
        run(Command::new("bash")
            .arg(repo().join("mount-tests/layouts/make_layout_fixtures.sh"))
            .arg(&dir)
            .env("TZ", "UTC"));
        dir
    })
}

/// A mount at a mountpoint of the test's choosing (a project's `node_modules`, cargo's
/// `registry/src/INDEX`), where [`Mount`] makes its own: unmounted when dropped.
struct MountAt {
    mp: PathBuf,
    log: PathBuf,
    stderr: String,
}

impl MountAt {
    fn new(sources: &[&Path], mp: &Path, extra: &[&str]) -> MountAt {
        let out = mount_at(sources, mp, extra);
        assert!(
            out.status.success(),
            "pkgfs mount {extra:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(is_mountpoint(mp), "{} is not mounted", mp.display());
        MountAt {
            mp: mp.to_path_buf(),
            log: log_of(mp),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// What the mount printed and what its daemon logged.
    fn messages(&self) -> String {
        format!(
            "{}{}",
            self.stderr,
            fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

impl Drop for MountAt {
    fn drop(&mut self) {
        let _guard = UmountGuard(&self.mp);
        let _ = pkgfs().arg("umount").arg(&self.mp).output();
    }
}

/// The daemon log of a mount at `mp`: beside the mountpoint, never inside it.
fn log_of(mp: &Path) -> PathBuf {
    let name = mp.to_string_lossy().replace('/', "_");
    mp.parent().unwrap().join(format!("pkgfs-log{name}.log"))
}

/// `pkgfs mount SOURCES… MP EXTRA…` (background daemon), whatever its outcome.
fn mount_at(sources: &[&Path], mp: &Path, extra: &[&str]) -> Output {
    pkgfs()
        .arg("mount")
        .args(sources)
        .arg(mp)
        .arg("--log-file")
        .arg(log_of(mp))
        .args(transport_args())
        .args(extra)
        .output()
        .expect("run pkgfs mount")
}

/// `npm` as the fixtures ran it: no user configuration of this machine.
fn npm(dir: &Path, tmp: &Path) -> Command {
    let rc = tmp.join("npmrc");
    fs::write(&rc, "").unwrap();
    let mut c = Command::new("npm");
    c.current_dir(dir)
        .arg("--userconfig")
        .arg(&rc)
        .arg("--cache")
        .arg(tmp.join("npm-cache"))
        .args(["--no-update-notifier", "--offline"]);
    c
}

/// The lockfile's `packages`, less the root: path → entry.
fn lock_packages(lockfile: &Path) -> BTreeMap<String, serde_json::Value> {
    let lock: serde_json::Value = serde_json::from_slice(&fs::read(lockfile).unwrap()).unwrap();
    lock["packages"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The tarball file name `npm pack` gives NAME@VERSION (`@s/n` → `s-n-VERSION.tgz`).
fn tarball_name(name: &str, version: &str) -> String {
    format!("{}-{version}.tgz", name.replace('@', "").replace('/', "-"))
}

/// The `version` of the `package.json` at `dir`.
fn version_of(dir: &Path) -> String {
    let p = dir.join("package.json");
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .unwrap();
    v["version"].as_str().unwrap().to_string()
}

/// A copy of `from` (a directory of archives) in `to`, by hard links.
fn link_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::hard_link(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Run a shell script with `args` as `$1`, `$2`…; it must succeed.
fn sh(script: &str, args: &[&Path]) {
    run(Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args));
}

/// `pkgfs status --json`'s `layout`: (kind, listed, indexed, failed).
fn layout_status(mp: &Path) -> (String, u64, u64, u64) {
    let s = status_json(mp);
    let l = &s["layout"];
    let n = |k: &str| {
        l[k].as_u64()
            .unwrap_or_else(|| panic!("status has no layout.{k}: {s}"))
    };
    (
        l["kind"].as_str().unwrap_or_default().to_string(),
        n("listed"),
        n("indexed"),
        n("failed"),
    )
}

/// Kills a child process when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One `GET path` over HTTP/1.0 to 127.0.0.1:port: the whole answer.
fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    answer
}

const SERVER_JS: &str = r#"
const express = require("express");
const semver = require("semver");
const parser = require("@babel/parser");
const mime = require("mime");
const app = express();
app.get("/hello", (req, res) => {
  const ast = parser.parse("const answer = 6 * 7;");
  res.type("text/plain").send(
    `hello ${semver.inc("1.2.3", "minor")} ${ast.program.body[0].declarations[0].id.name} ${mime.getType("x.json")}`);
});
const server = app.listen(0, "127.0.0.1", () => console.log(`port ${server.address().port}`));
"#;

/// With the lockfile, the mount is the `node_modules` that `npm ci` writes (its hidden
/// lockfile and the install times aside): nested `node_modules`, nested `.bin` links as
/// npm makes them, contents, sizes, modes as npm sets them (0666 in a tarball is written
/// 0644, under npm's umask of 022), and owners as npm gives them (as root, root's,
/// whatever the tarball recorded: array-flatten's files say 501:20).
#[test]
fn npm_lockfile_mount_is_what_npm_ci_writes() {
    if !require_tools(&["npm", "node", "python3"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let nm = dir.path().join("node_modules");
    fs::create_dir(&nm).unwrap();
    let lockfile = fx.join("npm/project/package-lock.json");
    let _m = MountAt::new(
        &[&fx.join("npm/tarballs")],
        &nm,
        &["--layout", "npm", "--lockfile", lockfile.to_str().unwrap()],
    );
    trees_match(
        &fx.join("npm/ci/node_modules"),
        &nm,
        &["--no-mtime", "--exclude", ".package-lock.json"],
    );
    // ee-first's tarball stores 0666; npm writes 0644.
    let tarball = run(Command::new("tar")
        .arg("-tvzf")
        .arg(fx.join("npm/tarballs/ee-first-1.1.1.tgz")));
    assert!(
        String::from_utf8_lossy(&tarball.stdout).contains("-rw-rw-rw-"),
        "the fixture's ee-first has 0666 files"
    );
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(
        mode(&fx.join("npm/ci/node_modules/ee-first/index.js")),
        0o644
    );
    assert_eq!(mode(&nm.join("ee-first/index.js")), 0o644);
}

/// The lockfile mount at a project's `node_modules`: every package at the version and
/// place the lockfile says, `.bin` links as npm makes them (nested ones too) to
/// executable files that run; node serves a request with express from it and `npm ls`
/// finds nothing missing or invalid.
#[test]
fn npm_lockfile_mount_serves_express_runs_bins_and_satisfies_npm_ls() {
    if !require_tools(&["npm", "node", "python3"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    let nm = proj.join("node_modules");
    fs::create_dir_all(&nm).unwrap();
    for f in ["package.json", "package-lock.json"] {
        fs::copy(fx.join("npm/project").join(f), proj.join(f)).unwrap();
    }
    fs::write(proj.join("server.js"), SERVER_JS).unwrap();
    let lockfile = proj.join("package-lock.json");
    let m = MountAt::new(
        &[&fx.join("npm/tarballs")],
        &nm,
        &["--layout", "npm", "--lockfile", lockfile.to_str().unwrap()],
    );

    let packages = lock_packages(&lockfile);
    for (path, entry) in &packages {
        let rel = path.strip_prefix("node_modules/").unwrap();
        assert_eq!(
            version_of(&nm.join(rel)),
            entry["version"].as_str().unwrap(),
            "{path}"
        );
    }
    assert!(
        packages.contains_key("node_modules/send/node_modules/mime"),
        "the fixture nests mime under send"
    );
    assert_eq!(version_of(&nm.join("mime")), "3.0.0");
    assert_eq!(version_of(&nm.join("send/node_modules/mime")), "1.6.0");
    let links = [
        (".bin/semver", "../semver/bin/semver.js"),
        (".bin/mime", "../mime/cli.js"),
        (".bin/parser", "../@babel/parser/bin/babel-parser.js"),
        ("send/node_modules/.bin/mime", "../mime/cli.js"),
    ];
    for (link, target) in links {
        assert_eq!(
            fs::read_link(nm.join(link)).unwrap(),
            Path::new(target),
            "{link}"
        );
        assert_eq!(
            fs::metadata(nm.join(link)).unwrap().mode() & 0o777,
            0o755,
            "{link}'s target is executable"
        );
    }
    let bins: BTreeSet<String> = fs::read_dir(nm.join(".bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        bins,
        ["mime", "parser", "semver"].map(String::from).into(),
        "the links of .bin are npm's"
    );
    assert!(!nm.join(".package-lock.json").exists());
    assert!(
        !m.messages().contains("WARN"),
        "a clean lockfile mounts without a warning:\n{}",
        m.messages()
    );

    // The bins run, through their links.
    let out = run(Command::new(nm.join(".bin/semver"))
        .args(["-i", "minor", "1.2.3"])
        .current_dir(&proj));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1.3.0");
    let out = run(Command::new(nm.join("send/node_modules/.bin/mime"))
        .arg("x.html")
        .current_dir(&proj));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "text/html");

    // node serves one request with express from the mount.
    let mut server = KillOnDrop(
        Command::new("node")
            .arg("server.js")
            .current_dir(&proj)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start node"),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("port ")
        .unwrap_or_else(|| panic!("node printed {line:?}"))
        .parse()
        .unwrap();
    let answer = http_get(port, "/hello");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("X-Powered-By: Express"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\nhello 1.3.0 answer application/json"),
        "{answer}"
    );
    drop(server);

    // npm itself finds the tree whole: every dependency there, at a valid version.
    let out = npm(&proj, dir.path())
        .args(["ls", "--all"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "npm ls: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in ["missing", "invalid", "extraneous", "UNMET"] {
        assert!(!text.contains(bad), "npm ls reports {bad}:\n{text}");
    }
    assert!(text.contains("express@4.21.2"), "{text}");
    assert!(text.contains("mime@1.6.0"), "{text}");
    assert!(
        fs::read_dir(&nm).unwrap().count() > 70,
        "npm ls left the mount as it was"
    );
}

/// Without a lockfile, a directory of tarballs (one version of each name) mounted at a
/// project's `node_modules` is required by name, each package at its `package.json`'s
/// name (scoped ones under `@scope/`), with npm's `.bin` links; a bin that is 0644 in
/// its tarball (`npm pack` keeps it so) is executable, as npm makes it. Of two versions
/// of one name, the first in byte order of the file names is placed and the other
/// refused with both named.
#[test]
fn npm_without_lockfile_places_packages_by_name_with_bin_links() {
    if !require_tools(&["npm", "node"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    let nm = proj.join("node_modules");
    fs::create_dir_all(&nm).unwrap();
    let m = MountAt::new(&[&fx.join("npm/flat")], &nm, &["--layout", "npm"]);

    // Every package at its name, at the version the tarball holds.
    let lockfile = fx.join("npm/project/package-lock.json");
    let mut names = vec!["@pkgfs-test/hello".to_string()];
    for (path, entry) in lock_packages(&lockfile) {
        let Some(name) = path.strip_prefix("node_modules/") else {
            continue;
        };
        if name.contains("/node_modules/") {
            continue;
        }
        assert_eq!(
            version_of(&nm.join(name)),
            entry["version"].as_str().unwrap(),
            "{name}"
        );
        names.push(name.to_string());
    }
    assert_eq!(names.len(), 76, "75 hoisted packages and ours");
    let top: BTreeSet<String> = fs::read_dir(&nm)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut want: BTreeSet<String> = names
        .iter()
        .map(|n| n.split('/').next().unwrap().to_string())
        .collect();
    want.insert(".bin".into());
    assert_eq!(
        top, want,
        "the root holds the packages and .bin, nothing else"
    );

    // node resolves each of them by name from the project as it does in the project npm
    // ci installed (a few have no main entry point: the same error there), and loads them.
    let script = |names: &[String]| {
        format!(
            r#"const path = require("path");
for (const n of {}) {{
  try {{
    const r = require.resolve(n);
    require(n);
    console.log(n, path.relative(path.join(process.cwd(), "node_modules"), r));
  }} catch (e) {{ console.log(n, e.code); }}
}}"#,
            serde_json::to_string(names).unwrap()
        )
    };
    let resolve = |names: &[String], cwd: &Path| {
        let out = run(Command::new("node")
            .arg("-e")
            .arg(script(names))
            .current_dir(cwd));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let here = resolve(&names[1..], &proj);
    assert_eq!(here, resolve(&names[1..], &fx.join("npm/ci")));
    assert!(
        here.lines().filter(|l| l.ends_with(".js")).count() > 60,
        "{here}"
    );
    assert!(here.contains("express express/index.js\n"), "{here}");
    let out = run(Command::new("node")
        .arg("-p")
        .arg("require('@pkgfs-test/hello')")
        .current_dir(&proj));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pkgfs");

    // .bin: npm's links, to executable files; ours was 0644 in its tarball.
    let links = [
        ("semver", "../semver/bin/semver.js"),
        ("mime", "../mime/cli.js"),
        ("parser", "../@babel/parser/bin/babel-parser.js"),
        ("pkgfs-hello", "../@pkgfs-test/hello/bin/hello.js"),
    ];
    let bins: BTreeSet<String> = fs::read_dir(nm.join(".bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(bins, links.map(|(l, _)| l.to_string()).into());
    for (link, target) in links {
        let p = nm.join(".bin").join(link);
        assert_eq!(fs::read_link(&p).unwrap(), Path::new(target), "{link}");
        assert_eq!(
            fs::metadata(&p).unwrap().mode() & 0o777,
            0o755,
            "{link} → {target} is executable"
        );
    }
    let tarball = run(Command::new("tar")
        .arg("-tvzf")
        .arg(fx.join("npm/flat/pkgfs-test-hello-1.0.0.tgz")));
    assert!(
        String::from_utf8_lossy(&tarball.stdout).contains("-rw-r--r-- 0/0             104"),
        "the fixture's bin is 0644 in its tarball"
    );
    assert_eq!(
        fs::metadata(nm.join("@pkgfs-test/hello/index.js"))
            .unwrap()
            .mode()
            & 0o777,
        0o644
    );
    let out = run(Command::new(nm.join(".bin/pkgfs-hello")).current_dir(&proj));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from pkgfs 1.2.3"
    );
    assert!(!m.messages().contains("WARN"), "{}", m.messages());
    drop(m);

    // All the tarballs, two versions of three names among them: the first of each name
    // in byte order (mime-1.6.0.tgz before mime-3.0.0.tgz) is placed.
    let m = Mount::new(&[&fx.join("npm/tarballs")], &["--layout", "npm"]);
    assert_eq!(version_of(&m.path().join("mime")), "1.6.0");
    assert_eq!(version_of(&m.path().join("express")), "4.21.2");
    let said = format!("{}{}", m.stderr, m.log_text());
    assert!(
        said.contains("mime-3.0.0.tgz") && said.contains("mime-1.6.0.tgz"),
        "both tarballs of mime are named:\n{said}"
    );
}

/// A copy of the tarballs with `name`'s repacked (GNU tar, one file altered): its
/// integrity no longer matches the lockfile's.
fn tamper(tarballs: &Path, name: &str, tmp: &Path) {
    let t = tarballs.join(name);
    let work = tmp.join("tamper");
    fs::create_dir_all(&work).unwrap();
    sh(
        r#"tar -C "$2" -xzf "$1" && echo '// altered' >> "$2/package/index.js" && rm "$1" &&
           tar -C "$2" --owner=0 --group=0 -czf "$1" package"#,
        &[&t, &work],
    );
}

/// Hostile and broken inputs with a lockfile: a tarball whose bytes changed is refused,
/// named with the digest the lockfile wants, the rest mounted unaffected; a lockfile
/// package that no source holds fails the mount, naming it, unless `--allow-missing`
/// (then the rest is mounted, unaffected); lockfile paths outside `node_modules/` are refused
/// naming the lockfile, the rest mounted.
#[test]
fn npm_lockfile_refuses_tampered_missing_and_escaping_packages() {
    if !require_tools(&["npm", "node", "tar"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let lockfile = fx.join("npm/project/package-lock.json");
    let packages = lock_packages(&lockfile);
    let lock_arg = ["--layout", "npm", "--lockfile", lockfile.to_str().unwrap()];

    // Integrity mismatch: depd refused, named with the digest the lockfile wants, and
    // nothing else affected: the mount goes on without it (it is not "missing").
    let tarballs = tmp.join("tampered");
    link_dir(&fx.join("npm/tarballs"), &tarballs);
    tamper(&tarballs, "depd-2.0.0.tgz", tmp);
    let mp = tmp.join("m1");
    fs::create_dir(&mp).unwrap();
    let m = MountAt::new(&[&tarballs], &mp, &lock_arg);
    let said = m.messages();
    let want = packages["node_modules/depd"]["integrity"].as_str().unwrap();
    for part in ["depd-2.0.0.tgz", "integrity", want] {
        assert!(said.contains(part), "the refusal names {part}:\n{said}");
    }
    assert!(
        !mp.join("depd").exists(),
        "a tampered package is not mounted"
    );
    for (path, entry) in &packages {
        if path == "node_modules/depd" {
            continue;
        }
        let rel = path.strip_prefix("node_modules/").unwrap();
        assert_eq!(
            version_of(&mp.join(rel)),
            entry["version"].as_str().unwrap(),
            "{path} is unaffected"
        );
    }
    drop(m);
    let mut args = lock_arg.to_vec();
    args.push("--allow-missing");

    // Missing: ms@2.1.3 (nested under send) has no tarball.
    let partial = tmp.join("partial");
    link_dir(&fx.join("npm/tarballs"), &partial);
    let gone = tarball_name(
        "ms",
        packages["node_modules/send/node_modules/ms"]["version"]
            .as_str()
            .unwrap(),
    );
    fs::remove_file(partial.join(&gone)).unwrap();
    let mp = tmp.join("m2");
    fs::create_dir(&mp).unwrap();
    let out = mount_at(&[&partial], &mp, &lock_arg);
    let _guard = UmountGuard(&mp);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a missing package fails the mount");
    assert!(!is_mountpoint(&mp));
    let ms = packages["node_modules/send/node_modules/ms"]["version"]
        .as_str()
        .unwrap();
    let named = format!("ms@{ms} (node_modules/send/node_modules/ms)");
    assert!(
        err.contains(&named) && err.contains("--allow-missing"),
        "the missing package is named ({named}):\n{err}"
    );
    let m = MountAt::new(&[&partial], &mp, &args);
    assert!(
        m.messages().contains(&named),
        "the missing package is named ({named}):\n{}",
        m.messages()
    );
    assert!(!mp.join("send/node_modules/ms").exists());
    assert_eq!(version_of(&mp.join("send/node_modules/mime")), "1.6.0");
    assert_eq!(version_of(&mp.join("ms")), "2.0.0");
    assert_eq!(version_of(&mp.join("express")), "4.21.2");
    drop(m);

    // Lockfile paths that leave node_modules, or have a component that is not a name.
    let mut lock: serde_json::Value =
        serde_json::from_slice(&fs::read(&lockfile).unwrap()).unwrap();
    let depd = lock["packages"]["node_modules/depd"].clone();
    for bad in [
        "../escaped",
        "node_modules/../../escaped",
        "node_modules/express/../../escaped",
        "/tmp/escaped",
    ] {
        lock["packages"][bad] = depd.clone();
    }
    let evil = tmp.join("evil-lock.json");
    fs::write(&evil, serde_json::to_vec_pretty(&lock).unwrap()).unwrap();
    let mp = tmp.join("m3");
    fs::create_dir(&mp).unwrap();
    let m = MountAt::new(
        &[&fx.join("npm/tarballs")],
        &mp,
        &["--layout", "npm", "--lockfile", evil.to_str().unwrap()],
    );
    assert!(
        m.messages().contains("evil-lock.json"),
        "the refusal names the lockfile:\n{}",
        m.messages()
    );
    for path in packages.keys() {
        assert!(
            mp.join(path.strip_prefix("node_modules/").unwrap())
                .is_dir(),
            "{path}"
        );
    }
    let found = run(Command::new("find").arg(tmp).args(["-name", "escaped"]));
    assert!(
        found.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&found.stdout)
    );
    assert!(!Path::new("/tmp/escaped").exists());
    assert_eq!(
        fs::read_dir(&mp).unwrap().count(),
        fs::read_dir(fx.join("npm/ci/node_modules"))
            .unwrap()
            .count()
            - 1,
        "the root holds what npm ci's does, less .package-lock.json"
    );
}

/// Hostile tarballs without a lockfile, each refused with a warning naming it, the rest
/// mounted: a package.json named `../../etc`, a scoped name without a slash, a second
/// tarball of one name and version.
#[test]
fn npm_refuses_hostile_names_and_duplicate_versions() {
    if !require_tools(&["npm", "node", "tar"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let src = tmp.join("src");
    link_dir(&fx.join("npm/flat"), &src);
    for (file, name) in [
        ("zz-etc.tgz", "../../etc"),
        ("zz-scope.tgz", "@evil"),
        ("zz-dot.tgz", ".hidden"),
    ] {
        let work = tmp.join(file);
        fs::create_dir_all(work.join("package")).unwrap();
        fs::write(
            work.join("package/package.json"),
            format!(r#"{{"name": "{name}", "version": "1.0.0", "bin": "x.js"}}"#),
        )
        .unwrap();
        fs::write(work.join("package/x.js"), "module.exports = 'escaped';\n").unwrap();
        sh(
            r#"tar -C "$1" --owner=0 --group=0 -czf "$2" package"#,
            &[&work, &src.join(file)],
        );
    }
    fs::copy(
        src.join("semver-7.6.3.tgz"),
        src.join("zz-semver-again.tgz"),
    )
    .unwrap();
    let m = Mount::new(&[&src], &["--layout", "npm"]);
    let said = format!("{}{}", m.stderr, m.log_text());
    for file in [
        "zz-etc.tgz",
        "zz-scope.tgz",
        "zz-dot.tgz",
        "zz-semver-again.tgz",
    ] {
        assert!(said.contains(file), "{file} is named:\n{said}");
    }
    let top: BTreeSet<String> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for bad in ["etc", "@evil", ".hidden", "evil", ".."] {
        assert!(!top.contains(bad), "{bad} in {top:?}");
    }
    let flat = sorted_names(&fx.join("npm/flat"));
    let lock = lock_packages(&fx.join("npm/project/package-lock.json"));
    let mut want: BTreeSet<String> = lock
        .keys()
        .filter_map(|p| p.strip_prefix("node_modules/"))
        .filter(|p| !p.contains("/node_modules/"))
        .map(|p| p.split('/').next().unwrap().to_string())
        .collect();
    want.extend(["@pkgfs-test".to_string(), ".bin".to_string()]);
    assert_eq!(flat.len(), 76);
    assert_eq!(top, want, "npm/flat's packages and .bin, nothing else");
    assert_eq!(version_of(&m.path().join("semver")), "7.6.3");
    let found = run(Command::new("find").arg(tmp).args(["-name", "etc"]));
    assert!(found.stdout.is_empty());
    let bins: BTreeSet<String> = fs::read_dir(m.path().join(".bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        bins,
        ["mime", "parser", "pkgfs-hello", "semver"]
            .map(String::from)
            .into()
    );
}

/// cargo builds a crate offline from a mount of its registry cache at
/// `registry/src/INDEX`: every crate as cargo unpacks it, with `.cargo-ok`; nothing is
/// written under the mount.
#[test]
fn cargo_builds_offline_from_a_mount_of_the_registry_cache() {
    if !require_tools(&["cargo", "python3"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let home = tmp.join("cargo-home");
    sh(
        r#"cp -a "$1" "$2" && cp -a "$3" "$4""#,
        &[
            &fx.join("cargo/home"),
            &home,
            &fx.join("cargo/crate"),
            &tmp.join("crate"),
        ],
    );
    let index = fs::read_to_string(fx.join("cargo/index.txt")).unwrap();
    let index = index.trim();
    assert!(index.starts_with("index.crates.io-"), "{index}");
    let cache = home.join("registry/cache").join(index);
    let src = home.join("registry/src").join(index);
    assert_eq!(
        fs::read_dir(&src).unwrap().count(),
        0,
        "registry/src is empty"
    );
    let m = MountAt::new(&[&cache], &src, &["--layout", "cargo"]);

    let (kind, listed, indexed, _) = layout_status(&src);
    assert_eq!((kind.as_str(), indexed), ("cargo", 0));
    let crates: Vec<String> = fs::read_dir(&cache)
        .unwrap()
        .map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".crate").unwrap().to_string()
        })
        .collect();
    assert_eq!(listed as usize, crates.len());

    // Each crate as cargo itself unpacked it (cargo fetch, kept by the fixtures); mtimes
    // aside: cargo writes files its .crate records at time 1 with another time.
    let mut extra = vec!["--no-mtime"];
    let oks: Vec<String> = crates.iter().map(|c| format!("{c}/.cargo-ok")).collect();
    for ok in &oks {
        extra.extend(["--ignore", ok.as_str()]);
    }
    let listing_before = listing(&src, &oks);
    trees_match(&fx.join("cargo/unpacked"), &src, &extra);
    for c in &crates {
        assert_eq!(
            fs::read_to_string(src.join(c).join(".cargo-ok")).unwrap(),
            r#"{"v":1}"#,
            "{c}"
        );
    }

    let target = tmp.join("target");
    let out = run(Command::new("cargo")
        .args(["build", "--offline", "--locked"])
        .current_dir(tmp.join("crate"))
        .env("CARGO_HOME", &home)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Compiling regex v1.11.1"), "{err}");
    assert!(
        !err.contains("Unpacking") && !err.contains("Downloading"),
        "{err}"
    );
    let out = run(&mut Command::new(target.join("debug/pkgfs-layout-fixture")));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"major":"1","minor":"3","name":"pkgfs"}"#
    );
    // The build read from the mount and wrote nothing there.
    assert!(is_mountpoint(&src));
    assert_eq!(listing(&src, &oks), listing_before);
    drop(m);
    assert_eq!(
        fs::read_dir(&src).unwrap().count(),
        0,
        "nothing was written under the mountpoint"
    );
}

/// Every path under `root` with its type, size, mode and mtime (`skip` left out).
fn listing(root: &Path, skip: &[String]) -> Vec<String> {
    let out = run(Command::new("find")
        .arg(".")
        .args(["-printf", "%p %y %s %m %T@\n"])
        .current_dir(root));
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !skip.iter().any(|s| l.starts_with(&format!("./{s} "))))
        .map(String::from)
        .collect();
    v.sort();
    assert!(v.len() > 500, "{} paths", v.len());
    v
}

/// The names `each` gives the fixture's archives.
const EACH: [&str; 6] = [
    "express-4.21.2",
    "itoa-1.0.14",
    "memchr-2.8.3",
    "qs-6.13.0",
    "ryu-1.0.23",
    "semver-7.6.3",
];

crate::on_both_transports! {
    /// `--layout each`: every archive (gzip tarballs with and without a top directory, a
    /// tar.zst, a tar, an npm .tgz, a .crate, a zip) in a directory named after its file,
    /// equal to GNU tar's (or unzip's) extraction there; with `--strip-components 1`,
    /// equal to `tar --strip-components 1`.
    fn each_layout_equals_extracting_each_archive_into_its_own_directory() {
        if !require_tools(&["tar", "unzip", "python3"]) {
            return;
        }
        let fx = layout_fixtures();
        let src = fx.join("each/src");
        let m = Mount::new(&[&src], &["--layout", "each"]);
        trees_match(&fx.join("each/expected"), &m.path(), &["--no-dir-mtime"]);
        let top: Vec<String> = sorted_names(&m.path());
        assert_eq!(top, EACH);
        // A package directory: 0755, the archive file's time.
        for e in fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let dirname = EACH.iter().find(|n| name.starts_with(*n)).unwrap();
            let d = fs::metadata(m.path().join(dirname)).unwrap();
            assert!(d.is_dir());
            assert_eq!(d.mode() & 0o7777, 0o755, "{dirname}");
            assert_eq!(d.mtime(), e.metadata().unwrap().mtime(), "{dirname}");
        }
        assert!(m.stderr.is_empty(), "{}", m.stderr);
        drop(m);

        let m = Mount::new(
            &[&fx.join("each/top")],
            &["--layout", "each", "--strip-components", "1"],
        );
        trees_match(&fx.join("each/expected-strip1"), &m.path(), &["--no-dir-mtime"]);
        assert!(m.path().join("express-4.21.2/lib/express.js").is_file());
        assert!(m.path().join("memchr-2.8.3/src/lib.rs").is_file());
    }
}

fn sorted_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// `pkgfs ls --layout each` lists the package directories and, under them, exactly the
/// paths of the reference extraction; `pkgfs cat` reads a file through the layout.
#[test]
fn each_layout_offline_tools_list_and_read_the_package_directories() {
    if !require_tools(&["tar", "unzip"]) {
        return;
    }
    let fx = layout_fixtures();
    let src = fx.join("each/src");
    let out = run(pkgfs().args(["ls", "--layout", "each"]).arg(&src));
    let text = String::from_utf8_lossy(&out.stdout);
    let paths: BTreeSet<String> = text
        .lines()
        .map(|l| {
            let before_tab = l.split('\t').next().unwrap();
            before_tab.rsplit(' ').next().unwrap().to_string()
        })
        .collect();
    let tops: Vec<&String> = paths.iter().filter(|p| !p.contains('/')).collect();
    assert_eq!(tops, EACH.iter().collect::<Vec<_>>(), "{text}");
    let want = run(Command::new("find")
        .arg(".")
        .arg("-mindepth")
        .arg("1")
        .current_dir(fx.join("each/expected")));
    let want: BTreeSet<String> = String::from_utf8_lossy(&want.stdout)
        .lines()
        .map(|l| l.strip_prefix("./").unwrap().to_string())
        .collect();
    assert_eq!(paths, want);
    let out = run(pkgfs()
        .args(["cat", "--layout", "each"])
        .arg(&src)
        .arg("qs-6.13.0/package.json"));
    assert_eq!(
        out.stdout,
        fs::read(fx.join("each/expected/qs-6.13.0/package.json")).unwrap()
    );
    let out = run(pkgfs().args(["check", "--layout", "each"]).arg(&src));
    assert!(out.status.success());
}

/// Lazy indexing: the root and `stat` of a package directory need no index; the first
/// look inside indexes that package alone, once, however many readers come at once; a
/// garbage archive reads as an empty directory and counts as failed.
#[test]
fn each_layout_indexes_a_package_when_first_looked_into_once() {
    if !require_tools(&["tar"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    link_dir(&fx.join("each/src"), &src);
    let garbage: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(src.join("bad.tar.gz"), garbage).unwrap();
    let m = Mount::new(&[&src], &["--layout", "each"]);
    let mp = m.path();
    assert_eq!(layout_status(&mp), ("each".into(), 7, 0, 0));

    // The root's listing and every package directory's stat: still nothing indexed.
    let mut names = sorted_names(&mp);
    names.retain(|n| n != "bad");
    assert_eq!(names, EACH);
    for n in EACH.iter().chain(&["bad"]) {
        let md = fs::metadata(mp.join(n)).unwrap();
        assert!(md.is_dir() && md.mode() & 0o777 == 0o755, "{n}");
    }
    assert_eq!(layout_status(&mp), ("each".into(), 7, 0, 0));

    // One package listed: that one indexed.
    let inside = sorted_names(&mp.join("semver-7.6.3"));
    assert!(inside.contains(&"package.json".to_string()), "{inside:?}");
    assert_eq!(layout_status(&mp), ("each".into(), 7, 1, 0));
    let _ = sorted_names(&mp.join("semver-7.6.3/bin"));
    assert_eq!(layout_status(&mp).2, 1, "a package is indexed once");

    // Eight first readers of one package at once: indexed once, all see it whole.
    let barrier = Arc::new(Barrier::new(8));
    let path = mp.join("express-4.21.2/package/lib");
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (barrier, path) = (barrier.clone(), path.clone());
            std::thread::spawn(move || {
                barrier.wait();
                sorted_names(&path)
            })
        })
        .collect();
    let seen: Vec<Vec<String>> = readers.into_iter().map(|t| t.join().unwrap()).collect();
    let want = sorted_names(&fx.join("each/expected/express-4.21.2/package/lib"));
    for s in &seen {
        assert_eq!(s, &want);
    }
    assert_eq!(layout_status(&mp), ("each".into(), 7, 2, 0));

    // Garbage: an empty directory, failed once, named in the log.
    assert_eq!(fs::read_dir(mp.join("bad")).unwrap().count(), 0);
    wait_until(
        Duration::from_secs(5),
        "bad.tar.gz counted as failed",
        || layout_status(&mp).3 == 1,
    );
    // docs/SEMANTICS.md "Lazy indexing": indexed counts the packages tried, failures
    // included.
    let (_, _, indexed, _) = layout_status(&mp);
    assert_eq!(
        indexed, 3,
        "a failed package is counted indexed (tried) and failed"
    );
    assert!(
        format!("{}{}", m.stderr, m.log_text()).contains("bad.tar.gz"),
        "the failed package is named:\n{}",
        m.log_text()
    );
    assert_eq!(fs::read_dir(mp.join("bad")).unwrap().count(), 0);
    assert_eq!(layout_status(&mp).3, 1, "a failed package is tried once");
    // The rest is unaffected.
    trees_match(
        &fx.join("each/expected/qs-6.13.0"),
        &mp.join("qs-6.13.0"),
        &["--no-dir-mtime"],
    );
    assert_eq!(layout_status(&mp), ("each".into(), 7, indexed + 1, 1));
}

/// `each` over awkward names: `a.zip` and `a.tar.gz` both want `a/`: the first in name
/// order (`a.tar.gz`) takes it, the other is skipped naming it; hidden files (a bare
/// extension `.zip`, `.tar.gz`) and a non-archive (`README.txt`) are no packages; each
/// package's `--strip-components 1` drops its top directory and the entries above it.
#[test]
fn each_layout_refuses_colliding_names_and_leaves_out_non_archives() {
    if !require_tools(&["tar", "zip"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, stage) = (dir.path().join("src"), dir.path().join("stage"));
    fs::create_dir_all(stage.join("top")).unwrap();
    fs::create_dir(&src).unwrap();
    fs::write(stage.join("top/from-zip.txt"), b"zip\n").unwrap();
    fs::write(stage.join("loose.txt"), b"above the top\n").unwrap();
    let zip = |out: &str, files: &[&str]| {
        run(Command::new("zip")
            .current_dir(&stage)
            .args(["-q", "-X"])
            .arg(src.join(out))
            .args(files));
    };
    zip("a.zip", &["top/from-zip.txt", "loose.txt"]);
    zip("b.zip", &["top/from-zip.txt"]);
    zip(".zip", &["top/from-zip.txt"]);
    fs::write(stage.join("top/from-tgz.txt"), b"tgz\n").unwrap();
    for out in ["a.tar.gz", ".tar.gz"] {
        run(Command::new("tar")
            .current_dir(&stage)
            .arg("czf")
            .arg(src.join(out))
            .arg("top/from-tgz.txt"));
    }
    fs::write(src.join("README.txt"), b"not a package\n").unwrap();
    let m = Mount::new(&[&src], &["--layout", "each", "--strip-components", "1"]);
    let mp = m.path();
    assert_eq!(sorted_names(&mp), ["a", "b"]);
    assert_eq!(sorted_names(&mp.join("a")), ["from-tgz.txt"]);
    assert_eq!(fs::read(mp.join("a/from-tgz.txt")).unwrap(), b"tgz\n");
    assert_eq!(sorted_names(&mp.join("b")), ["from-zip.txt"]);
    let st = status_json(&mp);
    let skipped: Vec<String> = skipped_rows(&st);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("a.zip")
            && skipped[0].contains("is taken by")
            && skipped[0].contains("a.tar.gz"),
        "{skipped:?}"
    );
    assert_eq!(layout_status(&mp), ("each".into(), 2, 2, 0));
}

/// `--strip-components` with `merge`: applied before merging, so `pkg-1.0/lib/x` and
/// `pkg-2.0/lib/x` meet at `lib/x` and the later archive wins; an entry with no more
/// components than stripped is left out.
#[test]
fn merge_strips_components_before_merging() {
    if !require_tools(&["zip"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, stage) = (dir.path().join("src"), dir.path().join("stage"));
    fs::create_dir(&src).unwrap();
    for (n, v) in [("1", "one\n"), ("2", "two\n")] {
        let d = stage.join(format!("pkg-{n}.0/lib"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("x"), v).unwrap();
        fs::write(d.join(format!("only-{n}")), v).unwrap();
        fs::write(stage.join(format!("top-{n}.txt")), v).unwrap();
        run(Command::new("zip")
            .current_dir(&stage)
            .args(["-q", "-X", "-r"])
            .arg(src.join(format!("p{n}.zip")))
            .arg(format!("pkg-{n}.0"))
            .arg(format!("top-{n}.txt")));
    }
    let m = Mount::new(&[&src], &["--strip-components", "1"]);
    let mp = m.path();
    assert_eq!(sorted_names(&mp), ["lib"]);
    assert_eq!(sorted_names(&mp.join("lib")), ["only-1", "only-2", "x"]);
    assert_eq!(fs::read(mp.join("lib/x")).unwrap(), b"two\n");
    assert_eq!(fs::read(mp.join("lib/only-1")).unwrap(), b"one\n");
}

/// A layout over a remote store: `each` over the same archives served by nginx equals
/// the reference extraction, as over the local directory.
#[test]
fn each_layout_over_an_http_store_equals_extracting_each_archive() {
    if !require_tools(&["tar", "nginx"]) {
        return;
    }
    let fx = layout_fixtures();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("www/src");
    fs::create_dir_all(&store).unwrap();
    for e in fs::read_dir(fx.join("each/src")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), store.join(e.file_name())).unwrap();
    }
    // Open to nginx's workers (a temporary directory is 0700).
    run(Command::new("chmod").arg("-R").arg("a+rX").arg(dir.path()));
    let nginx = crate::remote::Nginx::start(&dir.path().join("www"));
    let url = nginx.url("src/");
    let m = Mount::new(&[Path::new(&url)], &["--layout", "each", "--no-disk-cache"]);
    assert_eq!(sorted_names(&m.path()), EACH);
    trees_match(&fx.join("each/expected"), &m.path(), &["--no-dir-mtime"]);
    assert_eq!(layout_status(&m.path()).0, "each");
}

/// npm lockfile entries npm itself treats apart, on synthetic packages: a bundled
/// package (`inBundle`) comes inside its parent's tarball, with no tarball of its own;
/// an alias (`node_modules/nick` of package `real`) is installed under the alias; an
/// optional package for another OS or CPU is skipped, not missing, and one for this
/// machine placed; a workspace link and the workspace directory are not mounted; a
/// tarball the lockfile does not name is left out. The bin of the parent is linked and
/// executable.
#[test]
fn npm_lockfile_bundled_aliased_optional_workspace_and_unnamed_packages() {
    if !require_tools(&["python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, lock) = (dir.path().join("src"), dir.path().join("package-lock.json"));
    fs::create_dir(&src).unwrap();
    let code = r##"
import base64, hashlib, io, json, sys, tarfile
src, lock = sys.argv[1], sys.argv[2]
def tgz(name, files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, (data, mode) in sorted(files.items()):
            i = tarfile.TarInfo("package/" + path)
            i.size, i.mode, i.mtime = len(data), mode, 1700000000
            t.addfile(i, io.BytesIO(data))
    b = buf.getvalue()
    open(f"{src}/{name}", "wb").write(b)
    return "sha512-" + base64.b64encode(hashlib.sha512(b).digest()).decode()
pj = lambda **k: (json.dumps(k).encode(), 0o644)
a = tgz("a-1.0.0.tgz", {
    "package.json": pj(name="a", version="1.0.0", bin={"a-cli": "cli.js"},
                       bundleDependencies=["b"]),
    "cli.js": (b"#!/usr/bin/env node\n", 0o644),
    "node_modules/b/package.json": pj(name="b", version="2.0.0", bin={"b-cli": "bin/b.js"}),
    "node_modules/b/index.js": (b"module.exports = 2\n", 0o644),
    "node_modules/b/bin/b.js": (b"#!/usr/bin/env node\n", 0o644),
})
real = tgz("real-3.0.0.tgz", {"package.json": pj(name="real", version="3.0.0")})
x64 = tgz("x64only-1.0.0.tgz", {"package.json": pj(name="x64only", version="1.0.0")})
tgz("extra-9.9.9.tgz", {"package.json": pj(name="extra", version="9.9.9")})
json.dump({"name": "proj", "version": "1.0.0", "lockfileVersion": 3, "packages": {
    "": {"name": "proj", "version": "1.0.0", "workspaces": ["packages/ws"]},
    "node_modules/a": {"version": "1.0.0", "integrity": a, "bundleDependencies": ["b"],
                       "bin": {"a-cli": "cli.js"}},
    "node_modules/a/node_modules/b": {"version": "2.0.0", "inBundle": True,
                                      "bin": {"b-cli": "bin/b.js"}},
    "node_modules/nick": {"name": "real", "version": "3.0.0", "integrity": real},
    "node_modules/winonly": {"version": "1.0.0", "optional": True, "os": ["win32"]},
    "node_modules/armonly": {"version": "1.0.0", "optional": True, "cpu": ["arm64"]},
    "node_modules/x64only": {"version": "1.0.0", "optional": True, "cpu": ["x64"],
                             "os": ["linux"], "integrity": x64},
    "node_modules/ws": {"resolved": "packages/ws", "link": True},
    "packages/ws": {"name": "ws", "version": "0.0.1"},
}}, open(lock, "w"))
"##;
    run(Command::new("python3")
        .arg("-c")
        .arg(code)
        .arg(&src)
        .arg(&lock));
    let m = Mount::new(
        &[&src],
        &[
            "--layout",
            "npm",
            "--lockfile",
            lock.to_str().unwrap(),
            "--log-level",
            "info",
        ],
    );
    let mp = m.path();
    // Optional packages for another os or cpu are left out (not "in no source"); one
    // for this machine's is placed. (The tests run on x86_64: registry.rs says so.)
    assert_eq!(sorted_names(&mp), [".bin", "a", "nick", "x64only"]);
    let st = status_json(&mp);
    assert!(!st["packages"].to_string().contains("extra-9.9.9"), "{st}");
    assert_eq!(
        fs::read(mp.join("a/node_modules/b/index.js")).unwrap(),
        b"module.exports = 2\n"
    );
    assert_eq!(version_of(&mp.join("a/node_modules/b")), "2.0.0");
    let nick: serde_json::Value =
        serde_json::from_slice(&fs::read(mp.join("nick/package.json")).unwrap()).unwrap();
    assert_eq!(nick["name"], "real");
    assert_eq!(
        fs::read_link(mp.join(".bin/a-cli")).unwrap(),
        Path::new("../a/cli.js")
    );
    assert_eq!(
        fs::metadata(mp.join("a/cli.js")).unwrap().mode() & 0o111,
        0o111
    );
    // The bundled package's bin too, from the node_modules it sits in.
    assert_eq!(
        fs::read_link(mp.join("a/node_modules/.bin/b-cli")).unwrap(),
        Path::new("../b/bin/b.js")
    );
    assert_eq!(
        fs::metadata(mp.join("a/node_modules/b/bin/b.js"))
            .unwrap()
            .mode()
            & 0o111,
        0o111
    );
    // Said before the daemon starts (standard error) or by it (its log).
    let said = || format!("{}{}", m.stderr, m.log_text());
    wait_until(
        Duration::from_secs(5),
        "the tarball the lockfile does not name is named",
        || said().contains("extra@9.9.9 is not in the lockfile"),
    );
    assert!(!said().contains("in no source"), "{}", said());
    // The workspace directory is the project's, not a hostile lockfile path.
    assert!(!said().contains("refusing \"packages/ws\""), "{}", said());
}

/// Decoding ahead of a walk crosses packages (issue 37): a `tar` of one package's
/// directory indexes that package alone; a `tar` of the whole mount indexes packages
/// ahead of itself (status: `indexed_ahead`), reads every file as GNU tar's extraction
/// of each package into its own directory has it, and leaves nothing unindexed.
#[test]
fn each_layout_walks_index_packages_ahead_only_when_heading_for_them() {
    if !require_tools(&["tar"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, ext, build) = (
        dir.path().join("src"),
        dir.path().join("ext"),
        dir.path().join("build"),
    );
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // Half random, half text: gzip has something to do.
                if i % 2 == 0 {
                    state as u8
                } else {
                    b'a' + (i % 23) as u8
                }
            })
            .collect()
    };
    let packages: Vec<String> = (0..24).map(|i| format!("pkg{i:02}")).collect();
    for p in &packages {
        let root = build.join(p);
        fs::create_dir_all(root.join("sub")).unwrap();
        for j in 0..12 {
            fs::write(root.join(format!("f{j:02}.dat")), bytes(8192 + j * 2048)).unwrap();
        }
        for j in 0..4 {
            fs::write(root.join(format!("sub/s{j}.txt")), bytes(3000 + j)).unwrap();
        }
        fs::create_dir_all(&src).unwrap();
        let arc = src.join(format!("{p}.tar.gz"));
        run(Command::new("tar")
            .arg("czf")
            .arg(&arc)
            .arg("-C")
            .arg(&root)
            .arg("."));
        fs::create_dir_all(ext.join(p)).unwrap();
        run(Command::new("tar")
            .arg("xzf")
            .arg(&arc)
            .arg("-C")
            .arg(ext.join(p)));
    }
    let m = Mount::new(&[&src], &["--layout", "each"]);
    let mp = m.path();
    let ahead = || {
        status_json(&mp)["layout"]["indexed_ahead"]
            .as_u64()
            .unwrap()
    };
    let tar_all = |at: &Path| {
        let out = run(Command::new("sh")
            .arg("-c")
            .arg("tar cf - . | wc -c")
            .current_dir(at));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };

    // One package's directory, read whole: that package alone.
    assert!(tar_all(&mp.join("pkg03")) > 0);
    assert_eq!(layout_status(&mp), ("each".into(), 24, 1, 0));
    assert_eq!(ahead(), 0, "a walk of one package heads for no other");

    // The whole mount: the walk goes from package to package, and the packages ahead of
    // it are indexed before it gets there.
    assert_eq!(tar_all(&mp), tar_all(&ext));
    assert_eq!(layout_status(&mp), ("each".into(), 24, 24, 0));
    assert!(ahead() >= 1, "{}", status_json(&mp));
    eprintln!("{} packages indexed ahead of the walk", ahead());
    trees_match(&ext, &mp, &["--no-dir-mtime"]);
}
