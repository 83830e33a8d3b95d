//! Remote sources against real servers the tests start on loopback and stop: nginx
//! (Debian's) serving directories with autoindex, moto's S3 server, and a small fault
//! proxy (`faultproxy.py`) in front of them for 5xx answers, resets and slow responses.
//! Every mounted tree is compared with the local mount of the same files; the bytes the
//! server sent are counted from its own log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    Mount, fixtures, listening_or_exited, pkgfs, require_tools, run, spawn_fault_proxy,
    start_listening, status_json, terminate, test_python, trees_match, wait_until,
};

/// nginx serving `root` on a free loopback port; stopped when dropped.
pub struct Nginx {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    root: PathBuf,
}

impl Nginx {
    pub fn start(root: &Path) -> Nginx {
        let mut n = Nginx {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: 0,
            root: root.to_path_buf(),
        };
        let (child, port) = start_listening("nginx", |port| n.spawn(port));
        n.child = Some(child);
        n.port = port;
        n
    }

    /// Again on its port (the mount's URLs name it), after [`Nginx::stop`].
    fn restart(&mut self) {
        let mut child = self.spawn(self.port);
        let up = listening_or_exited(&mut child, self.port, Duration::from_secs(30), "nginx");
        assert!(up, "nginx could not listen on port {} again", self.port);
        self.child = Some(child);
    }

    fn spawn(&self, port: u16) -> Child {
        let d = self.dir.path();
        fs::create_dir_all(d.join("logs")).unwrap();
        fs::create_dir_all(d.join("tmp")).unwrap();
        let conf = format!(
            "daemon off; pid {d}/nginx.pid; error_log {d}/logs/error.log;\n\
             events {{}}\n\
             http {{ log_format bytes '$request_method $uri $status $body_bytes_sent';\n\
               access_log {d}/logs/access.log bytes; client_body_temp_path {d}/tmp;\n\
               proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp;\n\
               scgi_temp_path {d}/tmp;\n\
               server {{ listen 127.0.0.1:{port}; root {root}; autoindex on; }} }}\n",
            d = d.display(),
            root = self.root.display()
        );
        fs::write(d.join("nginx.conf"), conf).unwrap();
        Command::new("nginx")
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-p")
            .arg(d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// SIGTERM: the master stops its workers and exits (SIGKILL would leave them).
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// The files (not index pages) nginx answered GETs for, with the body bytes sent.
    fn file_gets(&self) -> Vec<(String, u64)> {
        let log = fs::read_to_string(self.dir.path().join("logs/access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 4 && f[0] == "GET" && !f[1].ends_with('/'))
                    .then(|| (f[1].to_string(), f[3].parse::<u64>().unwrap()))
            })
            .collect()
    }

    /// Body bytes nginx sent for GETs of files (not index pages).
    fn file_bytes_sent(&self) -> u64 {
        let log = fs::read_to_string(self.dir.path().join("logs/access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 4 && f[0] == "GET" && !f[1].ends_with('/'))
                    .then(|| f[3].parse::<u64>().unwrap())
            })
            .sum()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `faultproxy.py` on a free port in front of `upstream`; its control file says what
/// faults to add. Stopped when dropped.
struct Proxy {
    child: Child,
    port: u16,
    control: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control.json");
        let (child, port) = spawn_fault_proxy(upstream, dir.path());
        Proxy {
            child,
            port,
            control,
            _dir: dir,
        }
    }

    fn set(&self, json: &str) {
        let tmp = self.control.with_extension("tmp");
        fs::write(&tmp, json).unwrap();
        fs::rename(&tmp, &self.control).unwrap();
    }

    /// Answers the proxy gave, by status.
    fn statuses(&self) -> Vec<String> {
        fs::read_to_string(self.control.with_extension("json.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').nth(2).unwrap_or("").to_string())
            .collect()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// A copy of fixture set `name` that nginx's workers (user nobody) can read.
fn served_copy(name: &str, www: &Path) -> PathBuf {
    let dst = www.join(name);
    fs::create_dir_all(&dst).unwrap();
    for e in fs::read_dir(fixtures().join(name)).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    readable(www);
    dst
}

pub fn readable(p: &Path) {
    run(Command::new("chmod").args(["-R", "a+rX"]).arg(p));
}

/// A web root nginx's workers can enter.
pub fn www() -> tempfile::TempDir {
    let www = tempfile::tempdir().unwrap();
    readable(www.path());
    www
}

/// `DIR/big.zip` written by `zip -0`: five members of 4 MiB of random bytes (stored),
/// f0.bin … f4.bin, so that reading one fetches little of the others.
pub fn big_zip(dir: &Path) -> PathBuf {
    let src = tempfile::tempdir().unwrap();
    let mut state = 0x9e3779b97f4a7c15u64;
    for i in 0..5 {
        let data: Vec<u8> = (0..4 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        fs::write(src.path().join(format!("f{i}.bin")), data).unwrap();
    }
    fs::create_dir_all(dir).unwrap();
    let out = dir.join("big.zip");
    run(Command::new("zip")
        .current_dir(src.path())
        .args(["-0", "-q", "-X"])
        .arg(&out)
        .args(["f0.bin", "f1.bin", "f2.bin", "f3.bin", "f4.bin"]));
    readable(dir);
    out
}

/// Drop what the kernel caches of `p`, so the next read reaches pkgfs.
fn forget_pages(p: &Path) {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p).unwrap();
    // SAFETY: a valid descriptor; advice only.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn remote_stat(mp: &Path, key: &str) -> u64 {
    status_json(mp)["remote"][key].as_u64().unwrap()
}

fn disk_stat(mp: &Path, key: &str) -> u64 {
    status_json(mp)["remote"]["disk_cache"][key]
        .as_u64()
        .unwrap()
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&d).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// A directory of packages over HTTP, listed from nginx's index page, equals the local
/// mount of the same files; every archive is a package row named by its URL; the bytes
/// pkgfs counts are the bytes nginx sent, and mounting fetched a small part of the
/// archives. A second mount sharing the disk cache fetches nothing it fetched before.
#[test]
fn http_directory_equals_the_local_mount() {
    if !require_tools(&["nginx"]) {
        return;
    }
    let www = www();
    let local = served_copy("basic", www.path());
    let nginx = Nginx::start(www.path());
    let remote = nginx.url("basic/");
    let cache = tempfile::tempdir().unwrap();
    let dc = [
        "--no-index-cache",
        "--disk-cache",
        cache.path().to_str().unwrap(),
    ];
    let l = Mount::new(&[&local], &["--no-index-cache"]);
    let m = Mount::new(&[Path::new(&remote)], &dc);
    let st = status_json(&m.path());
    let rows = st["packages"].as_array().unwrap();
    assert!(rows.len() >= 2, "{st}");
    for r in rows {
        assert!(r["path"].as_str().unwrap().starts_with(&remote), "{r}");
    }
    let at_mount = st["remote"]["bytes"].as_u64().unwrap();
    assert_eq!(
        at_mount,
        nginx.file_bytes_sent(),
        "counted as nginx sent them"
    );
    trees_match(&l.path(), &m.path(), &[]);
    let fetched = remote_stat(&m.path(), "bytes");
    assert_eq!(fetched, nginx.file_bytes_sent());
    assert_eq!(remote_stat(&m.path(), "errors"), 0);
    drop(m);

    // A second mount on the same disk cache reads what the first fetched from disk:
    // walking the whole tree again sends no byte of an archive.
    let before = nginx.file_bytes_sent();
    let m = Mount::new(&[Path::new(&remote)], &dc);
    trees_match(&l.path(), &m.path(), &[]);
    assert_eq!(
        nginx.file_bytes_sent(),
        before,
        "all from the disk cache: {}",
        status_json(&m.path())["remote"]
    );
    assert_eq!(remote_stat(&m.path(), "bytes"), 0);
    assert!(disk_stat(&m.path(), "hits") > 0);
    let text = pkgfs().arg("status").arg(m.path()).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("disk cache: ") && text.contains("hit rate"),
        "{text}"
    );
}

/// `--layout each` over HTTP: the mount lists the packages from the index page alone
/// (not one byte of an archive fetched); entering one package fetches that archive's
/// index and nothing of the others, and its tree equals the local mount's.
#[test]
fn layout_each_over_http_fetches_a_package_only_when_it_is_entered() {
    if !require_tools(&["nginx"]) {
        return;
    }
    let www = www();
    let local = served_copy("basic", www.path());
    let nginx = Nginx::start(www.path());
    let remote = nginx.url("basic/");
    let each = ["--layout", "each", "--no-index-cache", "--no-disk-cache"];
    let l = Mount::new(&[&local], &each);
    let m = Mount::new(&[Path::new(&remote)], &each);
    let layout = &status_json(&m.path())["layout"];
    let listed = layout["listed"].as_u64().unwrap();
    assert!(listed >= 2, "{layout}");
    assert_eq!(layout["indexed"], 0, "{layout}");
    let names: Vec<String> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len() as u64, listed);
    for n in &names {
        assert!(fs::metadata(m.path().join(n)).unwrap().is_dir());
    }
    assert_eq!(
        nginx.file_gets(),
        Vec::<(String, u64)>::new(),
        "listing and stat fetch no archive"
    );
    let one = &names[0];
    trees_match(&l.path().join(one), &m.path().join(one), &[]);
    let gets = nginx.file_gets();
    assert!(!gets.is_empty());
    for (uri, _) in &gets {
        assert!(
            uri.starts_with(&format!("/basic/{one}.")),
            "only {one}'s archive is fetched: {gets:?}"
        );
    }
    let layout = &status_json(&m.path())["layout"];
    assert_eq!(layout["indexed"], 1, "{layout}");
    trees_match(&l.path(), &m.path(), &[]);
    assert_eq!(
        status_json(&m.path())["layout"]["indexed"].as_u64(),
        Some(listed)
    );
}

/// With the server stopped mid-walk: bytes already fetched still serve (from the disk
/// cache, the page cache dropped), bytes never fetched fail with EIO within the bound;
/// started again, the same reads succeed by themselves.
#[test]
fn a_server_outage_fails_within_the_bound_and_recovers() {
    if !require_tools(&["nginx", "zip"]) {
        return;
    }
    let www = www();
    let zip = big_zip(&www.path().join("pkgs"));
    let mut nginx = Nginx::start(www.path());
    let cache = tempfile::tempdir().unwrap();
    let remote = nginx.url("pkgs/");
    let m = Mount::new(
        &[Path::new(&remote)],
        &[
            "--disk-cache",
            cache.path().to_str().unwrap(),
            "--remote-timeout",
            "4s",
            "--prefetch",
            "0",
        ],
    );
    let l = Mount::new(&[&zip], &["--prefetch", "0"]);
    let f0 = m.path().join("f0.bin");
    let f4 = m.path().join("f4.bin");
    assert_eq!(
        fs::read(&f0).unwrap(),
        fs::read(l.path().join("f0.bin")).unwrap()
    );
    nginx.stop();

    forget_pages(&f0);
    let requests = remote_stat(&m.path(), "requests");
    assert_eq!(
        fs::read(&f0).unwrap(),
        fs::read(l.path().join("f0.bin")).unwrap(),
        "fetched bytes serve while the server is down"
    );
    assert_eq!(
        remote_stat(&m.path(), "requests"),
        requests,
        "not one request"
    );
    assert_eq!(remote_stat(&m.path(), "errors"), 0);

    let t = Instant::now();
    let err = fs::read(&f4).map(|v| v.len()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(12),
        "bounded: {:?}",
        t.elapsed()
    );
    assert!(remote_stat(&m.path(), "errors") > 0);
    assert!(m.log_text().contains("f4.bin") || m.log_text().contains("big.zip"));
    // Still mounted, still serving.
    assert!(m.is_mounted());
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 5);

    nginx.restart();
    assert_eq!(
        fs::read(&f4).unwrap(),
        fs::read(l.path().join("f4.bin")).unwrap(),
        "reads recover when the server is back"
    );
}

/// Through a proxy answering every third request with 503 and resetting some
/// connections, the mount is still complete and equal to the local one (each failed
/// request retried); status counts the retries. Slow answers past the bound fail with
/// EIO in time; the same read succeeds once the server is quick again.
#[test]
fn errors_and_slow_answers_are_retried_or_bounded() {
    if !require_tools(&["nginx", "python3", "zip"]) {
        return;
    }
    let www = www();
    let local = served_copy("basic", www.path());
    let zip = big_zip(&www.path().join("big"));
    let nginx = Nginx::start(www.path());
    let proxy = Proxy::start(nginx.port);
    proxy.set(r#"{"fail_every": 3, "status": 503}"#);
    let l = Mount::new(&[&local], &["--no-index-cache"]);
    let m = Mount::new(
        &[Path::new(&proxy.url("basic/"))],
        &["--no-index-cache", "--no-disk-cache"],
    );
    trees_match(&l.path(), &m.path(), &[]);
    let injected = proxy.statuses().iter().filter(|s| *s == "503").count() as u64;
    assert!(injected > 0);
    assert!(
        remote_stat(&m.path(), "retries") >= injected,
        "every 503 retried"
    );
    assert_eq!(remote_stat(&m.path(), "errors"), 0);
    drop(m);

    // Resets instead.
    proxy.set(r#"{"reset_every": 4}"#);
    let m = Mount::new(
        &[Path::new(&proxy.url("basic/"))],
        &["--no-index-cache", "--no-disk-cache"],
    );
    trees_match(&l.path(), &m.path(), &[]);
    assert!(proxy.statuses().iter().any(|s| s == "reset"));
    drop(m);

    // Slow: every answer 3 s late, the bound 2 s.
    proxy.set("{}");
    let m = Mount::new(
        &[Path::new(&proxy.url("big/"))],
        &[
            "--no-disk-cache",
            "--remote-timeout",
            "2s",
            "--prefetch",
            "0",
        ],
    );
    proxy.set(r#"{"delay_ms": 3000}"#);
    let t = Instant::now();
    let err = fs::read(m.path().join("f2.bin"))
        .map(|v| v.len())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    proxy.set("{}");
    let lz = Mount::new(&[&zip], &[]);
    assert_eq!(
        fs::read(m.path().join("f2.bin")).unwrap(),
        fs::read(lz.path().join("f2.bin")).unwrap()
    );
}

/// An object replaced on the server while mounted: a read of the old version's bytes
/// not yet fetched fails (EIO), never mixing versions; the next poll activates the new
/// version as a replaced package; objects added and removed come and go too.
#[test]
fn objects_replaced_added_and_removed_are_activated_by_polling() {
    if !require_tools(&["nginx", "zip"]) {
        return;
    }
    let www = www();
    let dir = www.path().join("pkgs");
    let zip = big_zip(&dir);
    let nginx = Nginx::start(www.path());
    let m = Mount::new(
        &[Path::new(&nginx.url("pkgs/"))],
        &["--no-disk-cache", "--poll", "1s", "--prefetch", "0"],
    );
    // And a mount that does not poll: it keeps the version it listed.
    let fixed = Mount::new(
        &[Path::new(&nginx.url("pkgs/"))],
        &["--no-disk-cache", "--prefetch", "0"],
    );
    let f4 = m.path().join("f4.bin");
    let old_f0 = fs::read(m.path().join("f0.bin")).unwrap();
    assert_eq!(fs::read(fixed.path().join("f0.bin")).unwrap(), old_f0);
    // Replace big.zip by a different archive with the same member names (rename:
    // nginx's ETag changes with the mtime and size).
    let staged = tempfile::tempdir().unwrap();
    let src = staged.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..5 {
        fs::write(
            src.join(format!("f{i}.bin")),
            format!("version two of f{i}\n"),
        )
        .unwrap();
    }
    let tmp = dir.join(".big.zip.tmp");
    run(Command::new("zip")
        .current_dir(&src)
        .args(["-q", "-X"])
        .arg(&tmp)
        .args(["f0.bin", "f1.bin", "f2.bin", "f3.bin", "f4.bin"]));
    readable(&dir);
    fs::rename(&tmp, &zip).unwrap();
    // The old version's bytes not fetched yet are refused, never mixed with the new.
    let err = fs::read(fixed.path().join("f4.bin"))
        .map(|b| b.len())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        fixed.log_text().contains("changed on the server"),
        "{}",
        fixed.log_text()
    );
    wait_until(Duration::from_secs(20), "the new version is active", || {
        fs::read(&f4).is_ok_and(|b| b == b"version two of f4\n")
    });
    assert_ne!(fs::read(m.path().join("f0.bin")).unwrap(), old_f0);
    let st = status_json(&m.path());
    assert!(st["activations"].as_u64().unwrap() >= 1, "{st}");

    // Added and removed.
    let any = walk(&fixtures().join("basic"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "zip"))
        .unwrap();
    fs::copy(any, dir.join("added.zip")).unwrap();
    readable(&dir);
    wait_until(
        Duration::from_secs(20),
        "the added object is active",
        || {
            status_json(&m.path())["packages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["path"].as_str().unwrap().ends_with("/added.zip"))
        },
    );
    fs::remove_file(&zip).unwrap();
    wait_until(
        Duration::from_secs(20),
        "the removed object is gone",
        || !f4.exists(),
    );
}

/// One archive by URL mounts as the local file does; `pkgfs ls` reads it too.
#[test]
fn one_archive_by_url() {
    if !require_tools(&["nginx"]) {
        return;
    }
    let www = www();
    let local = served_copy("basic", www.path());
    let nginx = Nginx::start(www.path());
    let zip = walk(&local)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "zip"))
        .unwrap();
    let name = zip.file_name().unwrap().to_str().unwrap();
    let url = nginx.url(&format!("basic/{name}"));
    let m = Mount::new(&[Path::new(&url)], &["--no-index-cache", "--no-disk-cache"]);
    let l = Mount::new(&[&zip], &["--no-index-cache"]);
    trees_match(&l.path(), &m.path(), &[]);
    let out = pkgfs().args(["ls", &url]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A missing object is a clear error.
    let out = pkgfs()
        .args(["ls", &nginx.url("basic/no-such.zip")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such.zip"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// moto's S3 server on a free port; stopped when dropped.
pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Moto {
    pub fn start() -> Moto {
        let bin = test_python().with_file_name("moto_server");
        let (child, port) = start_listening("moto", |port| {
            Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        });
        Moto { child, port }
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Run boto3 `code` (with `s3` a client of this server).
    pub fn boto(&self, code: &str) {
        let mut c = Command::new(test_python());
        c.arg("-c")
            .arg(format!(
                "import boto3, sys\ns3 = boto3.client('s3')\n{code}\n"
            ))
            .envs(self.env());
        run(&mut c);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// A prefix of an S3 bucket (moto's server) equals the local mount of the same files;
/// objects outside the prefix, or in "subdirectories", are not layers; an object
/// replaced and one added are activated by polling.
#[test]
fn s3_prefix_equals_the_local_mount_and_polls() {
    if !require_tools(&["python3", "zip"]) {
        return;
    }
    let moto = Moto::start();
    let local = fixtures().join("basic");
    let mut files: Vec<PathBuf> = fs::read_dir(&local)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut code = String::from("s3.create_bucket(Bucket='pkgs')\n");
    for f in &files {
        code += &format!(
            "s3.upload_file({:?}, 'pkgs', 'repo/{}')\n",
            f.to_str().unwrap(),
            f.file_name().unwrap().to_str().unwrap()
        );
    }
    // Not layers: another prefix, a deeper key.
    code += &format!(
        "s3.upload_file({:?}, 'pkgs', 'other/x.zip')\ns3.upload_file({:?}, 'pkgs', 'repo/sub/y.zip')\n",
        files[0].to_str().unwrap(),
        files[0].to_str().unwrap()
    );
    moto.boto(&code);
    let env = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cache = tempfile::tempdir().unwrap();
    let m = Mount::with_env(
        &[Path::new("s3://pkgs/repo/")],
        &[
            "--no-index-cache",
            "--disk-cache",
            cache.path().to_str().unwrap(),
            "--poll",
            "1s",
        ],
        &env,
    );
    let l = Mount::new(&[&local], &["--no-index-cache"]);
    trees_match(&l.path(), &m.path(), &[]);
    let st = status_json(&m.path());
    let rows: Vec<String> = st["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    let local_rows = status_json(&l.path())["packages"].as_array().unwrap().len();
    assert_eq!(rows.len(), local_rows, "{rows:?}");
    assert!(
        rows.iter().all(|r| r.starts_with("s3://pkgs/repo/")),
        "{rows:?}"
    );
    assert!(st["remote"]["requests"].as_u64().unwrap() > 0);

    // An object added over the others: a zip providing a new file.
    let staged = tempfile::tempdir().unwrap();
    fs::write(staged.path().join("new-file.txt"), b"from s3\n").unwrap();
    run(Command::new("zip").current_dir(staged.path()).args([
        "-q",
        "-X",
        "zz.zip",
        "new-file.txt",
    ]));
    moto.boto(&format!(
        "s3.upload_file({:?}, 'pkgs', 'repo/zz.zip')",
        staged.path().join("zz.zip").to_str().unwrap()
    ));
    let new_file = m.path().join("new-file.txt");
    wait_until(
        Duration::from_secs(20),
        "the added object is active",
        || fs::read(&new_file).is_ok_and(|b| b == b"from s3\n"),
    );
    // Replaced: same key, new bytes.
    fs::write(staged.path().join("new-file.txt"), b"replaced\n").unwrap();
    run(Command::new("zip").current_dir(staged.path()).args([
        "-q",
        "-X",
        "zz2.zip",
        "new-file.txt",
    ]));
    moto.boto(&format!(
        "s3.upload_file({:?}, 'pkgs', 'repo/zz.zip')",
        staged.path().join("zz2.zip").to_str().unwrap()
    ));
    wait_until(
        Duration::from_secs(20),
        "the replaced object is active",
        || fs::read(&new_file).is_ok_and(|b| b == b"replaced\n"),
    );
    // Removed.
    moto.boto("s3.delete_object(Bucket='pkgs', Key='repo/zz.zip')");
    wait_until(
        Duration::from_secs(20),
        "the removed object is gone",
        || !new_file.exists(),
    );
    trees_match(&l.path(), &m.path(), &[]);
}

/// On S3 too: an object replaced under a mount that does not poll is refused for the
/// bytes not fetched yet (`If-Match`), never mixed; a bucket that does not exist fails
/// the mount with a message naming it.
#[test]
fn s3_object_replaced_is_never_mixed_and_a_missing_bucket_is_named() {
    if !require_tools(&["python3", "zip"]) {
        return;
    }
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let zip = big_zip(dir.path());
    let staged = dir.path().join("small");
    fs::create_dir(&staged).unwrap();
    fs::write(staged.join("f4.bin"), b"other\n").unwrap();
    run(Command::new("zip")
        .current_dir(&staged)
        .args(["-q", "-X", "small.zip", "f4.bin"]));
    moto.boto(&format!(
        "s3.create_bucket(Bucket='bkt')\ns3.upload_file({:?}, 'bkt', 'r/big.zip')",
        zip.to_str().unwrap()
    ));
    let env = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let m = Mount::with_env(
        &[Path::new("s3://bkt/r/")],
        &["--no-disk-cache", "--prefetch", "0"],
        &env,
    );
    let l = Mount::new(&[&zip], &["--prefetch", "0"]);
    assert_eq!(
        fs::read(m.path().join("f0.bin")).unwrap(),
        fs::read(l.path().join("f0.bin")).unwrap()
    );
    moto.boto(&format!(
        "s3.upload_file({:?}, 'bkt', 'r/big.zip')",
        staged.join("small.zip").to_str().unwrap()
    ));
    let err = fs::read(m.path().join("f4.bin"))
        .map(|b| b.len())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        m.log_text().contains("changed on the server"),
        "{}",
        m.log_text()
    );

    let mp = tempfile::tempdir().unwrap();
    let out = pkgfs()
        .args(["mount", "s3://no-such-bucket/x/"])
        .arg(mp.path())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3://no-such-bucket/x/"), "{err}");
}

/// Keys, region and endpoint from the AWS shared files of a profile (`AWS_PROFILE`, no
/// `AWS_*` key in the environment), as the AWS CLI takes them.
#[test]
fn s3_credentials_and_endpoint_from_a_profile() {
    if !require_tools(&["python3"]) {
        return;
    }
    let moto = Moto::start();
    let local = fixtures().join("basic");
    let mut code = String::from("s3.create_bucket(Bucket='prof')\n");
    for e in fs::read_dir(&local).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            code += &format!(
                "s3.upload_file({:?}, 'prof', {:?})\n",
                p.to_str().unwrap(),
                p.file_name().unwrap().to_str().unwrap()
            );
        }
    }
    moto.boto(&code);
    let home = tempfile::tempdir().unwrap();
    fs::create_dir(home.path().join(".aws")).unwrap();
    fs::write(
        home.path().join(".aws/credentials"),
        "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\
         [bench]\naws_access_key_id = test\naws_secret_access_key = test\n",
    )
    .unwrap();
    fs::write(
        home.path().join(".aws/config"),
        format!(
            "[profile bench]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{}\n",
            moto.port
        ),
    )
    .unwrap();
    let m = Mount::with_env(
        &[Path::new("s3://prof")],
        &["--no-index-cache", "--no-disk-cache"],
        &[
            ("HOME", home.path().to_str().unwrap()),
            ("AWS_PROFILE", "bench"),
        ],
    );
    let l = Mount::new(&[&local], &["--no-index-cache"]);
    trees_match(&l.path(), &m.path(), &[]);
}

/// A mount of a directory over HTTP survives `kill -9` of its server at four marks of a
/// read of every file (issue 35): every byte read equals the archive's, no read fails,
/// and the restarted servers take what their predecessors fetched from the disk cache
/// (nginx sends less than twice the archive, where five refetches could send six times).
#[test]
fn a_remote_mount_survives_server_kills_on_its_disk_cache() {
    if !require_tools(&["nginx", "unzip"]) {
        return;
    }
    let www = www();
    let arc = big_zip(&www.path().join("pkgs"));
    let nginx = Nginx::start(www.path());
    let cache = tempfile::tempdir().unwrap();
    let m = Mount::new(
        &[Path::new(&nginx.url("pkgs/"))],
        &[
            "--no-index-cache",
            "--disk-cache",
            cache.path().to_str().unwrap(),
            "--cache-size",
            "1M",
            "--restart-limit",
            "100/60s",
        ],
    );
    let mp = m.path();
    let names: Vec<String> = (0..5).map(|i| format!("f{i}.bin")).collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (mp, names, done) = (mp.clone(), names.clone(), done.clone());
        std::thread::spawn(move || {
            use std::io::Read;
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            for n in &names {
                let mut f = fs::File::open(mp.join(n)).unwrap();
                let mut data = Vec::new();
                loop {
                    let k = f.read(&mut buf).unwrap();
                    if k == 0 {
                        break;
                    }
                    data.extend_from_slice(&buf[..k]);
                    done.fetch_add(k as u64, std::sync::atomic::Ordering::Release);
                }
                got.push(data);
            }
            got
        })
    };
    let total = 5u64 << 22;
    let mut last = None;
    for mark in 1..=4u64 {
        let pid = crate::common::next_server(&mp, last);
        wait_until(Duration::from_secs(120), "the reader stalled", || {
            done.load(std::sync::atomic::Ordering::Acquire) >= total * mark / 5
                || reader.is_finished()
        });
        crate::common::kill9(pid);
        last = Some(pid);
    }
    wait_until(Duration::from_secs(120), "the reader hangs", || {
        reader.is_finished()
    });
    let got = reader.join().expect("no read failed");
    for (n, data) in names.iter().zip(&got) {
        let want = run(Command::new("unzip").arg("-p").arg(&arc).arg(n)).stdout;
        assert!(data == &want, "{n} differs from the archive's member");
    }
    assert_eq!(status_json(&mp)["keeper"]["restarts"], 4);
    let size = fs::metadata(&arc).unwrap().len();
    let sent: u64 = nginx
        .file_gets()
        .iter()
        .filter(|(p, _)| p.ends_with("big.zip"))
        .map(|(_, b)| b)
        .sum();
    assert!(
        sent < 2 * size,
        "nginx sent {sent} bytes of a {size}-byte archive"
    );
}

/// A read blocked on a slow server when its pkgfs server is killed (issue 35): with the
/// kernel's resend it completes, late, with the right bytes; on the path for kernels
/// without resend (`PKGFS_KEEPER_NO_RESEND`: each server on a cloned descriptor) it
/// fails at once instead of waiting forever, and the mount serves the next read.
#[test]
fn a_read_in_flight_at_a_kill_is_resent_or_on_older_kernels_fails_fast() {
    if !require_tools(&["nginx", "unzip"]) {
        return;
    }
    let www = www();
    let arc = big_zip(&www.path().join("pkgs"));
    let nginx = Nginx::start(www.path());
    let want = run(Command::new("unzip").arg("-p").arg(&arc).arg("f1.bin")).stdout;
    for no_resend in ["", "1"] {
        let proxy = Proxy::start(nginx.port);
        let m = Mount::with_env(
            &[Path::new(&proxy.url("pkgs/"))],
            &["--no-disk-cache", "--prefetch", "0"],
            &[("PKGFS_KEEPER_NO_RESEND", no_resend)],
        );
        let f1 = m.path().join("f1.bin");
        // Every request now waits at the proxy: a read of f1 is in flight in the server
        // when it is killed; the delay goes with the kill, so the next server is quick.
        proxy.set(r#"{"delay_ms": 20000}"#);
        let old = crate::common::next_server(&m.path(), None);
        let before = remote_stat(&m.path(), "requests");
        let reader = {
            let f1 = f1.clone();
            std::thread::spawn(move || fs::read(&f1))
        };
        // The read is in flight once the server has sent its request to the proxy.
        wait_until(
            Duration::from_secs(30),
            "the read never reached the server",
            || remote_stat(&m.path(), "requests") > before,
        );
        assert!(
            !reader.is_finished(),
            "the read did not wait on the slow server"
        );
        crate::common::kill9(old);
        proxy.set("{}");
        let t = Instant::now();
        wait_until(Duration::from_secs(30), "the reader hangs", || {
            reader.is_finished()
        });
        let took = t.elapsed();
        let got = reader.join().unwrap();
        match (&got, no_resend.is_empty()) {
            (Ok(data), _) => assert!(*data == want, "a read that completes has the right bytes"),
            // Without resend the request the dead server had read fails (the kernel may
            // also read the page again through the new server: then it succeeds).
            (Err(e), false) => {
                assert!(
                    took < Duration::from_secs(5),
                    "it failed at once: {took:?} ({e})"
                )
            }
            (Err(e), true) => panic!("the resent read failed: {e}"),
        }
        crate::common::next_server(&m.path(), Some(old));
        assert!(
            fs::read(&f1).unwrap() == want,
            "the mount serves the next read"
        );
        if !no_resend.is_empty() {
            // Said at mount, on the terminal.
            assert!(
                m.stderr.contains("cannot resend requests in flight"),
                "{}",
                m.stderr
            );
        }
    }
}

/// A file open in a remote package that a poll replaced, then `kill -9` of the server
/// (issue 35): the next server opens the old version again as the old server listed it
/// (no listing, its ETag), and the open file reads its old bytes from the disk cache,
/// though the server now has only the new version; a new open reads the new version.
/// Over HTTP and S3.
#[test]
fn a_file_open_in_a_replaced_remote_package_reads_its_old_bytes_across_a_restart() {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    if !require_tools(&["nginx", "python3", "zip", "unzip"]) {
        return;
    }
    let www = www();
    let pkgs = www.path().join("pkgs");
    let zip = big_zip(&pkgs);
    let want = run(Command::new("unzip").arg("-p").arg(&zip).arg("f4.bin")).stdout;
    let staged = tempfile::tempdir().unwrap();
    fs::write(staged.path().join("f4.bin"), b"version two\n").unwrap();
    run(Command::new("zip")
        .current_dir(staged.path())
        .args(["-q", "-X", "new.zip", "f4.bin"]));
    let new_zip = staged.path().join("new.zip");
    let nginx = Nginx::start(www.path());
    let moto = Moto::start();
    moto.boto(&format!(
        "s3.create_bucket(Bucket='bkt')\ns3.upload_file({:?}, 'bkt', 'r/big.zip')",
        zip.to_str().unwrap()
    ));
    let env = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let over_http = || {
        let tmp = pkgs.join(".big.zip.tmp");
        fs::copy(&new_zip, &tmp).unwrap();
        readable(&pkgs);
        fs::rename(&tmp, &zip).unwrap();
    };
    let over_s3 = || {
        moto.boto(&format!(
            "s3.upload_file({:?}, 'bkt', 'r/big.zip')",
            new_zip.to_str().unwrap()
        ))
    };
    let cases: [(String, &dyn Fn()); 2] = [
        (nginx.url("pkgs/"), &over_http),
        ("s3://bkt/r/".to_string(), &over_s3),
    ];
    for (src, replace) in cases {
        let cache = tempfile::tempdir().unwrap();
        let m = Mount::with_env(
            &[Path::new(&src)],
            &[
                "--disk-cache",
                cache.path().to_str().unwrap(),
                "--poll",
                "1s",
                "--prefetch",
                "0",
                "--restart-limit",
                "100/60s",
            ],
            &env,
        );
        let mp = m.path();
        let x = mp.join("f4.bin");
        let mut f = fs::File::open(&x).unwrap();
        let mut old = Vec::new();
        f.read_to_end(&mut old).unwrap();
        assert!(old == want, "{src}: f4.bin as the archive has it");
        replace();
        wait_until(
            Duration::from_secs(30),
            "the new version was never activated",
            || fs::read(&x).is_ok_and(|b| b == b"version two\n"),
        );
        let server = crate::common::next_server(&mp, None);
        crate::common::kill9(server);
        crate::common::next_server(&mp, Some(server));
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; advice only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        let mut again = vec![0u8; old.len()];
        f.read_exact_at(&mut again, 0)
            .unwrap_or_else(|e| panic!("{src}: the open file: {e}\n{}", m.log_text()));
        assert!(
            again == old,
            "{src}: the open file reads its own version on"
        );
        assert_eq!(fs::read(&x).unwrap(), b"version two\n", "{src}");
    }
}
