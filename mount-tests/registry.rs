//! Images straight from a registry (`docker://`): Debian's `docker-registry`
//! (distribution 2.8) started by each test on loopback, anonymous, with htpasswd over TLS
//! (a CA and a server certificate made by `openssl`), or behind a bearer token server
//! (`registry/token_server.py`, as Docker Hub and GHCR work); the image fixtures
//! (`images.rs`: umoci, skopeo, stargz-snapshotter) pushed to it by `skopeo copy`, each
//! mount compared with umoci's unpack of the same image. Bytes the registry sent are
//! counted from its own access log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    Mount, page_cache_dropped, pkgfs, repo, reported_port, require_fuse, require_tools, run,
    spawn_fault_proxy, status_json, terminate, test_python, trees_match, wait_until,
};
use crate::images::{images, in_runc, runs_its_programs};
use crate::remote::Moto;

/// How a test registry lets clients in.
pub(crate) enum Auth {
    Anonymous,
    /// htpasswd (bcrypt) with this user and password, over TLS.
    Basic(&'static str, &'static str),
    /// Tokens from `token_server.py` for this user and password; tokens live this long.
    Token(&'static str, &'static str, u64),
}

/// A registry on a loopback port of the system's choice (it binds port 0 and its log
/// says which it got), with its data, log and certificates in a temporary directory;
/// stopped (and its token server) when dropped.
pub(crate) struct Registry {
    child: Option<Child>,
    token: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    tls: bool,
}

impl Registry {
    pub(crate) fn start(auth: Auth) -> Registry {
        Registry::start_with(auth, None)
    }

    /// With `s3`, blobs are kept in a bucket of that moto server, reached at the port
    /// given with it (moto's, or a proxy's in front of it), and blob GETs are redirected
    /// (307) to signed URLs of it, as registries backed by S3 or a CDN do.
    fn start_with(auth: Auth, s3: Option<(&Moto, u16)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut extra = String::new();
        let mut tls = false;
        let mut token = None;
        match auth {
            Auth::Anonymous => {}
            Auth::Basic(user, pass) => {
                let out = run(Command::new("htpasswd").args(["-Bbn", user, pass]));
                fs::write(d.join("htpasswd"), out.stdout).unwrap();
                make_certificates(d);
                extra = format!(
                    "auth:\n  htpasswd:\n    realm: pkgfs-tests\n    path: {}\n",
                    d.join("htpasswd").display()
                );
                tls = true;
            }
            Auth::Token(user, pass, life) => {
                self_signed(d, "token", "/CN=pkgfs-token-issuer");
                let log = fs::File::create(d.join("token.log")).unwrap();
                token = Some(
                    Command::new(test_python())
                        .arg(repo().join("mount-tests/registry/token_server.py"))
                        .arg("0")
                        .arg(d.join("token.key"))
                        .arg(d.join("token.crt"))
                        .arg("pkgfs-token-issuer")
                        .arg(format!("{user}:{pass}"))
                        .arg(life.to_string())
                        .stdout(log)
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap(),
                );
                let tport = reported_port(&d.join("token.log"), 0, "PORT ", "the token server");
                extra = format!(
                    "auth:\n  token:\n    realm: http://127.0.0.1:{tport}/token\n    \
                     service: pkgfs-registry\n    issuer: pkgfs-token-issuer\n    \
                     rootcertbundle: {}\n",
                    d.join("token.crt").display()
                );
            }
        }
        let tls_conf = if tls {
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                d.join("server.crt").display(),
                d.join("server.key").display()
            )
        } else {
            String::new()
        };
        let storage = match s3 {
            None => format!(
                "storage:\n  filesystem:\n    rootdirectory: {}\n",
                d.join("data").display()
            ),
            Some((moto, endpoint)) => {
                moto.boto("s3.create_bucket(Bucket='registry')");
                format!(
                    "storage:\n  s3:\n    accesskey: test\n    secretkey: test\n    \
                     region: us-east-1\n    regionendpoint: http://127.0.0.1:{}\n    \
                     bucket: registry\n    secure: false\n    v4auth: true\n  \
                     redirect:\n    disable: false\n",
                    endpoint
                )
            }
        };
        let config = |port: u16| {
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                 {storage}http:\n  addr: 127.0.0.1:{port}\n{tls_conf}{extra}"
            )
        };
        fs::write(d.join("config.yml"), config(0)).unwrap();
        let mut r = Registry {
            child: None,
            token,
            dir,
            port: 0,
            tls,
        };
        r.restart();
        // A restart takes the same port (mounts name it): from now on the config says it.
        fs::write(r.dir.path().join("config.yml"), config(r.port)).unwrap();
        r
    }

    /// Start the registry on the port of its config (0 the first time: then
    /// [`Registry::port`] is the one it reports). A port given back by [`Registry::stop`]
    /// may have been taken by another test's server in between: "address already in
    /// use" is tried again, for at most 10 s.
    fn restart(&mut self) {
        let path = self.dir.path().join("registry.log");
        let start = Instant::now();
        loop {
            let log = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            let from = log.metadata().unwrap().len() as usize;
            let mut child = Command::new("docker-registry")
                // The AWS SDK of distribution 2.8 cannot load a CA bundle into its
                // transport (a panic at start): S3 storage here is plain HTTP anyway.
                .env_remove("AWS_CA_BUNDLE")
                .arg("serve")
                .arg(self.dir.path().join("config.yml"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let since = || String::from_utf8_lossy(&fs::read(&path).unwrap()[from..]).into_owned();
            let mut exited = false;
            wait_until(
                Duration::from_secs(30),
                "the registry neither listens nor exits within 30 s",
                || {
                    exited = child.try_wait().unwrap().is_some();
                    exited || since().contains("listening on 127.0.0.1:")
                },
            );
            if !exited {
                self.child = Some(child);
                break;
            }
            let text = since();
            assert!(
                text.contains("address already in use")
                    && start.elapsed() < Duration::from_secs(10),
                "the registry exited at start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let port = reported_port(&path, 0, "listening on 127.0.0.1:", "the registry");
        // The log holds every start's line: the port is the first one's, and each
        // restart binds that same one.
        assert!(
            self.port == 0 || self.port == port,
            "{} then {port}",
            self.port
        );
        self.port = port;
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }

    pub(crate) fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn reference(&self, name: &str) -> String {
        format!("docker://{}/{name}", self.host())
    }

    /// The CA (and client-side certificate directory) of a TLS registry.
    fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    /// `skopeo copy` of the fixture layout `from` (`oci-gzip:latest`…) to `to`
    /// (`REPO:TAG`), layers as they are (no recompression).
    pub(crate) fn push(&self, from: &str, to: &str, creds: Option<&str>) {
        let mut c = Command::new("skopeo");
        c.args(["copy", "--quiet", "--preserve-digests"]);
        if self.tls {
            c.arg("--dest-cert-dir").arg(self.cert_dir());
        } else {
            c.arg("--dest-tls-verify=false");
        }
        if let Some(creds) = creds {
            c.args(["--dest-creds", creds]);
        }
        c.arg(format!("oci:{}/{from}", images().display()))
            .arg(self.reference(to));
        run(&mut c);
    }

    /// The registry's access log: (method, path, status, body bytes) per request. The
    /// log must be there and every access line must parse (a counter that read nothing
    /// would make every bound hold): else this panics, with the line.
    fn requests(&self) -> Vec<(String, String, u16, u64)> {
        let path = self.dir.path().join("registry.log");
        let log = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the registry's log {}: {e}", path.display()));
        log.lines()
            // The registry's own messages (logrus: `time="…" level=…`), and what Go
            // prints when it stops.
            .filter(|l| !l.starts_with("time=") && !l.trim().is_empty())
            .map(|l| {
                // 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 206 4096 "" "agent"
                let parse = || -> Option<(String, String, u16, u64)> {
                    let (_, rest) = l.split_once("\"")?;
                    let (request, rest) = rest.split_once('"')?;
                    let mut r = request.split(' ');
                    let (method, path) = (r.next()?, r.next()?);
                    let mut n = rest.split_whitespace();
                    let status = n.next()?.parse().ok()?;
                    let bytes = match n.next()? {
                        "-" => 0,
                        b => b.parse().ok()?,
                    };
                    Some((method.to_string(), path.to_string(), status, bytes))
                };
                parse().unwrap_or_else(|| panic!("an access log line that does not parse: {l}"))
            })
            .collect()
    }

    /// Body bytes of blob GETs so far, and how many GETs there were.
    fn blob_bytes(&self) -> u64 {
        self.blob_gets().1
    }

    /// Blob GETs so far: their count and body bytes.
    pub(crate) fn blob_gets(&self) -> (usize, u64) {
        let gets: Vec<_> = self
            .requests()
            .into_iter()
            .filter(|(m, p, ..)| m == "GET" && p.contains("/blobs/"))
            .collect();
        (gets.len(), gets.iter().map(|r| r.3).sum())
    }

    /// Wait until the registry has answered every request the mount at `mp` sent:
    /// its access log holds as many requests past `before` (a count of
    /// [`Registry::requests`] taken before the mount) as the mount sent that reached it
    /// (`remote.requests` less `remote.retries`: the HTTPS probe of `--tls-verify=false`
    /// never does), the same at two polls in a row (the registry logs a request once
    /// answered). At most 20 s.
    fn answered_all(&self, before: usize, mp: &Path) {
        let mut last = None;
        let start = Instant::now();
        loop {
            let remote = &status_json(mp)["remote"];
            let sent = remote["requests"].as_u64().unwrap() - remote["retries"].as_u64().unwrap();
            let logged = &self.requests()[before..];
            if logged.len() as u64 == sent && last == Some(sent) {
                return;
            }
            last = (logged.len() as u64 == sent).then_some(sent);
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the mount sent {sent} requests; after 20 s the registry has logged {}: \
                 {logged:?}",
                logged.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The token server's log lines (`TOKEN user scope status`); panics if its log is
    /// missing or holds a line of another form.
    fn tokens(&self) -> Vec<String> {
        let path = self.dir.path().join("token.log");
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the token server's log {}: {e}", path.display()))
            .lines()
            .filter(|l| !l.starts_with("PORT "))
            .inspect(|l| assert!(l.starts_with("TOKEN "), "a token log line: {l}"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if let Some(mut t) = self.token.take() {
            terminate(&mut t);
        }
    }
}

/// `registry/hostile_registry.py` serving the OCI layout `layout` with its faults, on a
/// port of the system's choice; its request log kept; killed when dropped.
struct Hostile {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Hostile {
    fn start(layout: &Path) -> Hostile {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.log");
        let child = Command::new(test_python())
            .arg(repo().join("mount-tests/registry/hostile_registry.py"))
            .arg("0")
            .arg(layout)
            .stdout(fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut h = Hostile {
            child,
            port: 0,
            log,
            _dir: dir,
        };
        h.port = reported_port(&h.log, 0, "PORT ", "the hostile registry");
        h
    }

    /// Its requests so far: (method, path, status, range); panics on a line of another
    /// form.
    fn requests(&self) -> Vec<(String, String, String, String)> {
        fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("the hostile registry's log: {e}"))
            .lines()
            .filter(|l| !l.starts_with("PORT "))
            .map(|l| match l.split(' ').collect::<Vec<_>>()[..] {
                [m, p, s, r] => (m.into(), p.into(), s.into(), r.into()),
                _ => panic!("a hostile registry log line that does not parse: {l}"),
            })
            .collect()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A key and a self-signed certificate for `subject`, by `openssl`: `dir/NAME.key`,
/// `dir/NAME.crt`.
fn self_signed(dir: &Path, name: &str, subject: &str) {
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", subject, "-keyout"])
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt"))));
}

/// A CA, and a certificate for 127.0.0.1 signed by it (`server.crt`, `server.key`);
/// the CA as `certs.d/ca.crt`, as podman's certificate directories hold it.
fn make_certificates(d: &Path) {
    let ssl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(d));
    };
    self_signed(d, "ca", "/CN=pkgfs test CA");
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    fs::write(
        d.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
         extendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    ssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
    fs::create_dir(d.join("certs.d")).unwrap();
    fs::copy(d.join("ca.crt"), d.join("certs.d/ca.crt")).unwrap();
}

fn tools() -> bool {
    require_fuse() && require_tools(&["docker-registry", "skopeo", "htpasswd", "openssl", "runc"])
}

/// `pkgfs mount` that is expected to fail: its standard error.
fn mount_fails(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = pkgfs()
        .arg("mount")
        .args(args)
        .arg(dir.path())
        .args((!args.contains(&"--disk-cache")).then_some("--no-disk-cache"))
        .arg("--no-index-cache")
        .output()
        .unwrap();
    if out.status.success() {
        let _ = pkgfs().arg("umount").arg(dir.path()).output();
        panic!("mounted: {args:?}");
    }
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The digest of the manifest skopeo sees for `reference`.
fn manifest_digest(r: &Registry, name: &str) -> String {
    let out = run(Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(r.reference(name)));
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(&out.stdout))
}

/// Every copy of the image pushed to a registry mounts equal to umoci's unpack, each
/// layer read its own way (a pass for gzip and zstd, the table of contents for
/// zstd:chunked and eStargz); by tag and by digest; the image runs in a chroot; status
/// names the manifest skopeo sees and what each layer fetched.
#[test]
fn images_in_a_registry_mount_equal_to_the_reference() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let reference = images().join("reference/rootfs");
    let copies = [
        ("oci-gzip:latest", "tar.gz", "digest"),
        ("oci-zstd:latest", "tar.zst", "digest"),
        ("oci-zstd-chunked:latest", "zstd:chunked", "toc"),
        ("oci-estargz:latest", "estargz", "toc"),
        ("oci-zstd-chunked-ctr:latest", "zstd:chunked", "toc"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (from, format, checked)) in copies.into_iter().enumerate() {
        let name = format!("pkgfs/debian:v{i}");
        reg.push(from, &name, None);
        let cache = dir.path().join(format!("cache{i}"));
        let m = Mount::new(
            &[Path::new(&reg.reference(&name))],
            &[
                "--tls-verify=false",
                "--no-index-cache",
                "--disk-cache",
                cache.to_str().unwrap(),
            ],
        );
        trees_match(&reference, &m.path(), &[]);
        let st = status_json(&m.path());
        let img = &st["images"][0];
        assert_eq!(img["reference"], reg.reference(&name), "{st}");
        assert_eq!(img["manifest"], manifest_digest(&reg, &name), "{st}");
        for p in st["packages"].as_array().unwrap() {
            assert_eq!(p["format"], format, "{from}: {p}");
            assert_eq!(p["checked"], checked, "{from}: {p}");
            assert!(p["fetched_bytes"].as_u64().unwrap() > 0, "{p}");
        }
        // Each layer's first and last bytes in one request: distribution serves
        // multipart/byteranges.
        assert!(
            st["remote"]["multi_range_requests"].as_u64().unwrap() >= 1,
            "{}",
            st["remote"]
        );
        if from.starts_with("oci-zstd-chunked:") {
            // The image's own programs: a script and dpkg in a chroot, the script under
            // runc (a mount with -o suid,dev, as a runtime wants its root).
            runs_its_programs(&m.path());
            let root = Mount::new(
                &[Path::new(&reg.reference(&name))],
                &[
                    "--tls-verify=false",
                    "-o",
                    "suid,dev",
                    "--disk-cache",
                    cache.to_str().unwrap(),
                ],
            );
            assert_eq!(
                in_runc(&root.path(), &["/usr/local/bin/pkgfs-selftest"]),
                fs::read_to_string(images().join("reference.selftest")).unwrap()
            );
            drop(root);
            // The same image pinned by its digest.
            let digest = manifest_digest(&reg, &name);
            let pinned = reg.reference(&format!("pkgfs/debian@{digest}"));
            let m2 = Mount::new(
                &[Path::new(&pinned)],
                &[
                    "--tls-verify=false",
                    "--no-index-cache",
                    "--disk-cache",
                    cache.to_str().unwrap(),
                ],
            );
            assert_eq!(
                fs::read(m2.path().join("usr/bin/bash")).unwrap(),
                fs::read(reference.join("usr/bin/bash")).unwrap()
            );
        }
    }
    // Missing things are named.
    let err = mount_fails(&["--tls-verify=false", &reg.reference("pkgfs/nothing:v0")]);
    assert!(err.contains("no such repository"), "{err}");
    let err = mount_fails(&["--tls-verify=false", &reg.reference("pkgfs/debian:v99")]);
    assert!(
        err.contains("no image tagged v99 (tags: v0, v1, v2, v3, v4)"),
        "{err}"
    );
    let other = format!("sha256:{}", "0".repeat(64));
    let err = mount_fails(&[
        "--tls-verify=false",
        &reg.reference(&format!("pkgfs/debian@{other}")),
    ]);
    assert!(err.contains(&format!("no manifest {other}")), "{err}");
    // Without --tls-verify=false a registry without TLS is refused, and why is said.
    let err = mount_fails(&[&reg.reference("pkgfs/debian:v0")]);
    assert!(err.contains("--tls-verify=false"), "{err}");
}

/// A mount of `name` from `reg` that fetches only what is read (no background fetch,
/// no directory read-ahead), with the disk cache `cache` and no index cache.
fn lazy_mount(reg: &Registry, name: &str, cache: &Path) -> Mount {
    Mount::new(
        &[Path::new(&reg.reference(name))],
        &[
            "--tls-verify=false",
            "--no-index-cache",
            "--prefetch",
            "0",
            "--no-background-fetch",
            "--disk-cache",
            cache.to_str().unwrap(),
        ],
    )
}

/// Files read one after another from a table-of-contents layer with
/// `--no-background-fetch` fetch their own chunks, not the files after them in the
/// layer: the bytes sent past the tables are at most the files' sizes (compressed, they
/// are smaller) plus 4 KiB of alignment each, counted once the registry has answered
/// every request the mount sent. Writes are `EROFS`.
#[test]
fn lazy_table_of_contents_reads_stay_within_their_files() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let reference = images().join("reference/rootfs");
    reg.push("oci-zstd-chunked:latest", "pkgfs/chunked:lazy", None);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let requests_before = reg.requests().len();
    let m = lazy_mount(&reg, "pkgfs/chunked:lazy", &cache);
    let at_mount = reg.blob_bytes();
    let (mut files, mut bytes) = (0u64, 0u64);
    for d in [
        "usr/share/debconf",
        "usr/share/perl5/Debconf/Element/Dialog",
    ] {
        let mut names: Vec<_> = fs::read_dir(reference.join(d))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            let want = fs::read(reference.join(d).join(&n)).unwrap();
            assert_eq!(
                fs::read(m.path().join(d).join(&n)).unwrap(),
                want,
                "{d}/{n:?}"
            );
            files += 1;
            bytes += want.len() as u64;
        }
    }
    assert!(files >= 10, "{files} files");
    // The fetches the reads started (read-ahead within each file) have been answered.
    reg.answered_all(requests_before, &m.path());
    let sent = reg.blob_bytes() - at_mount;
    assert!(
        sent > 0 && sent <= bytes + 4096 * files,
        "{files} files of {bytes} bytes read; the registry sent {sent} bytes"
    );
    // Read-only: writes are EROFS.
    let e = fs::File::create(m.path().join("usr/new-file")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = fs::OpenOptions::new()
        .append(true)
        .open(m.path().join("usr/bin/bash"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
}

/// A layer with a table of contents costs its table and the chunks read: one file of
/// the image fetches a small part of its layers. A layer two tags share is fetched
/// once: a second mount of another tag with the same disk cache asks the registry for
/// its manifest only, and reads every file from the cache; with the registry stopped,
/// a new mount (another process: nothing in memory) pinned by digest reads the cached
/// files from the disk cache alone, others fail with EIO within the bound, and after a
/// restart they read again; pinned by digest, a warm mount sends no request at all.
#[test]
fn registry_reads_fetch_what_is_read_once() {
    if !tools() {
        return;
    }
    let mut reg = Registry::start(Auth::Anonymous);
    let reference = images().join("reference/rootfs");
    reg.push("oci-zstd-chunked:latest", "pkgfs/chunked:a", None);
    reg.push("oci-zstd-chunked:latest", "pkgfs/chunked-too:b", None);
    reg.push("oci-estargz:latest", "pkgfs/estargz:a", None);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let opts = |extra: &'static [&'static str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--tls-verify=false",
            "--no-index-cache",
            "--prefetch",
            "0",
            "--no-background-fetch",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(["--disk-cache".to_string(), cache.display().to_string()]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    for name in ["pkgfs/chunked:a", "pkgfs/estargz:a"] {
        let before = reg.blob_bytes();
        let o = opts(&[]);
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let m = Mount::new(&[Path::new(&reg.reference(name))], &o);
        assert_eq!(
            fs::read(m.path().join("usr/bin/bash")).unwrap(),
            fs::read(reference.join("usr/bin/bash")).unwrap()
        );
        let st = status_json(&m.path());
        let total: u64 = st["images"][0]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["size"].as_u64().unwrap())
            .sum();
        let sent = reg.blob_bytes() - before;
        assert!(
            sent > 0 && sent * 10 < total,
            "{name}: the registry sent {sent} of {total} bytes of layers for one file"
        );
    }
    // Another tag of the same layers: the manifest is asked for, no blob.
    let blob_gets = |reg: &Registry| reg.blob_gets().0;
    let before = blob_gets(&reg);
    assert!(before > 0, "no blob GET in the registry's log");
    let o = opts(&["--remote-timeout", "3s"]);
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let m = Mount::new(&[Path::new(&reg.reference("pkgfs/chunked-too:b"))], &o);
    assert_eq!(
        fs::read(m.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    assert_eq!(blob_gets(&reg), before, "a shared layer is fetched again");
    // An outage: what is cached reads, the rest fails in time, then recovers. The
    // cached file is read by a new mount (a new daemon: no extent in memory, the
    // kernel's page cache dropped), pinned by digest (a tag would need the registry):
    // only the disk cache can serve it.
    let digest = manifest_digest(&reg, "pkgfs/chunked-too:b");
    reg.stop();
    {
        let _dropping = page_cache_dropped();
        fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache");
    }
    let pinned = reg.reference(&format!("pkgfs/chunked-too@{digest}"));
    let cold = Mount::new(&[Path::new(&pinned)], &o);
    assert_eq!(
        fs::read(cold.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    let st = status_json(&cold.path());
    assert!(
        st["remote"]["disk_cache"]["hits"].as_u64().unwrap() > 0 && st["remote"]["bytes"] == 0,
        "bash did not come from the disk cache: {}",
        st["remote"]
    );
    drop(cold);
    let t = Instant::now();
    let e = fs::read(m.path().join("usr/bin/perl")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    reg.restart();
    assert_eq!(
        fs::read(m.path().join("usr/bin/perl")).unwrap(),
        fs::read(reference.join("usr/bin/perl")).unwrap()
    );
    drop(m);
    // Everything, from the cache filled above plus what is missing.
    let m = Mount::new(&[Path::new(&reg.reference("pkgfs/chunked-too:b"))], &o);
    trees_match(&reference, &m.path(), &[]);
    drop(m);
    // Pinned by digest, every manifest and blob in the disk cache: no request at all,
    // the registry may as well be gone.
    reg.stop();
    let m = Mount::new(
        &[Path::new(
            &reg.reference(&format!("pkgfs/chunked-too@{digest}")),
        )],
        &o,
    );
    trees_match(&reference, &m.path(), &[]);
    let st = status_json(&m.path());
    assert_eq!(st["remote"]["requests"], 0, "{}", st["remote"]);
}

/// htpasswd over TLS: the CA from --cert-dir (or trust skipped with
/// --tls-verify=false), credentials from --creds or an auth file as `podman login`
/// writes it; a wrong password, no credentials and an unknown CA each fail the mount
/// saying which.
#[test]
fn basic_auth_over_tls_with_the_credentials_users_have() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Basic("alice", "s3cret"));
    reg.push("oci-gzip:latest", "team/debian:1", Some("alice:s3cret"));
    let reference = images().join("reference/rootfs");
    let src = reg.reference("team/debian:1");
    let certs = reg.cert_dir().display().to_string();
    let m = Mount::new(
        &[Path::new(&src)],
        &[
            "--cert-dir",
            &certs,
            "--creds",
            "alice:s3cret",
            "--no-disk-cache",
        ],
    );
    trees_match(&reference, &m.path(), &[]);
    drop(m);
    // An auth file as podman login writes it, by $REGISTRY_AUTH_FILE.
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.json");
    use base64::Engine as _;
    fs::write(
        &auth,
        format!(
            "{{\"auths\": {{\"{}\": {{\"auth\": \"{}\"}}}}}}",
            reg.host(),
            base64::engine::general_purpose::STANDARD.encode("alice:s3cret")
        ),
    )
    .unwrap();
    let m = Mount::with_env(
        &[Path::new(&src)],
        &["--cert-dir", &certs, "--no-disk-cache"],
        &[("REGISTRY_AUTH_FILE", auth.to_str().unwrap())],
    );
    assert_eq!(
        fs::read(m.path().join("etc/os-release")).unwrap(),
        fs::read(reference.join("etc/os-release")).unwrap()
    );
    drop(m);
    // --tls-verify=false: the certificate is not checked.
    let m = Mount::new(
        &[Path::new(&src)],
        &[
            "--tls-verify=false",
            "--authfile",
            auth.to_str().unwrap(),
            "--no-disk-cache",
        ],
    );
    assert!(m.path().join("usr/bin/bash").exists());
    drop(m);
    let err = mount_fails(&["--cert-dir", &certs, "--creds", "alice:wrong", &src]);
    assert!(err.contains("wrong user name or password"), "{err}");
    let err = mount_fails(&["--cert-dir", &certs, "--authfile", "/nonexistent", &src]);
    assert!(err.contains("asks for a user name and password"), "{err}");
    let err = mount_fails(&["--creds", "alice:s3cret", &src]);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// Behind a bearer token server: a token for the repository's pull scope is asked for
/// with the credentials, kept while it lives (not one per request), and renewed before
/// it expires (the registry never refuses it); a wrong password is the token server's
/// refusal, named.
#[test]
fn bearer_tokens_as_docker_hub_hands_them_out() {
    if !tools() {
        return;
    }
    // Tokens live 15 s (renewed 10 s early): one is kept 5 s.
    let reg = Registry::start(Auth::Token("bob", "hunter2", 15));
    reg.push("oci-estargz:latest", "bob/debian:1", Some("bob:hunter2"));
    let reference = images().join("reference/rootfs");
    let src = reg.reference("bob/debian:1");
    let pushed = reg.tokens().len();
    let t = Instant::now();
    let m = Mount::new(
        &[Path::new(&src)],
        &[
            "--tls-verify=false",
            "--creds",
            "bob:hunter2",
            "--no-disk-cache",
            "--prefetch",
            "0",
            "--no-background-fetch",
        ],
    );
    assert_eq!(
        fs::read(m.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    let asked: Vec<String> = reg.tokens()[pushed..].to_vec();
    // Kept, not one per request: at most one token per 5 s of mount and read (and one
    // more for requests that raced for the first).
    let most = 2 + t.elapsed().as_secs() as usize / 5;
    assert!(
        !asked.is_empty()
            && asked.len() <= most
            && asked
                .iter()
                .all(|l| l == "TOKEN bob repository:bob/debian:pull 200"),
        "{} requests sent, tokens asked (at most {most}): {asked:?}",
        status_json(&m.path())["remote"]["requests"]
    );
    // Renewed once kept 5 s: files read one after another (each a request: no disk
    // cache, no read-ahead into other files) until the token server sees a new ask,
    // within 20 s.
    let files: Vec<PathBuf> = fs::read_dir(reference.join("usr/bin"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.is_symlink())
        .collect();
    let mut next = files.iter();
    let seen = reg.tokens().len();
    // Renewed before it expires (not after the registry refused it: no new 401).
    let refusals = |reg: &Registry| reg.requests().iter().filter(|r| r.2 == 401).count();
    let refused = refusals(&reg);
    wait_until(Duration::from_secs(20), "the token was not renewed", || {
        let f = next
            .next()
            .expect("more files in usr/bin than reads in 20 s");
        let name = f.strip_prefix(&reference).unwrap();
        assert_eq!(fs::read(m.path().join(name)).unwrap(), fs::read(f).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        reg.tokens().len() > seen
    });
    assert!(
        reg.tokens()[seen..]
            .iter()
            .all(|l| l == "TOKEN bob repository:bob/debian:pull 200"),
        "{:?}",
        reg.tokens()
    );
    assert_eq!(
        refusals(&reg),
        refused,
        "the token was renewed only once the registry refused it"
    );
    drop(m);
    let err = mount_fails(&["--tls-verify=false", "--creds", "bob:nope", &src]);
    assert!(err.contains("token server refused user \"bob\""), "{err}");
    let err = mount_fails(&["--tls-verify=false", "--authfile", "/nonexistent", &src]);
    assert!(err.contains("access denied"), "{err}");
}

/// A registry that keeps its blobs in S3 (moto) answers blob GETs with a 307 to a signed
/// URL: the redirect is followed without the registry's credentials, remembered per
/// blob (later ranges go straight to the storage), and the image equals the reference.
#[test]
fn blobs_redirected_to_storage_are_fetched_there() {
    if !tools() {
        return;
    }
    let moto = Moto::start();
    let reg = Registry::start_with(Auth::Anonymous, Some((&moto, moto.port)));
    reg.push("oci-zstd-chunked:latest", "pkgfs/s3:1", None);
    let reference = images().join("reference/rootfs");
    let before = reg.requests().len();
    let m = Mount::new(
        &[Path::new(&reg.reference("pkgfs/s3:1"))],
        &["--tls-verify=false", "--no-disk-cache", "--no-index-cache"],
    );
    trees_match(&reference, &m.path(), &[]);
    let st = status_json(&m.path());
    let asked = &reg.requests()[before..];
    let redirected: Vec<&String> = asked
        .iter()
        .filter(|(m, p, s, _)| m == "GET" && p.contains("/blobs/") && *s == 307)
        .map(|r| &r.1)
        .collect();
    let served = asked
        .iter()
        .filter(|(m, p, s, _)| m == "GET" && p.contains("/blobs/") && *s / 100 == 2)
        .count();
    assert_eq!(
        served, 0,
        "the registry served blob bytes itself: {asked:?}"
    );
    let mut blobs = redirected.clone();
    blobs.sort();
    blobs.dedup();
    // One redirect per blob (config and three layers), give or take concurrent first
    // reads; every other range went to the storage directly.
    let fetches = st["remote"]["fetches"].as_u64().unwrap();
    assert!(
        blobs.len() == 4
            && redirected.len() <= blobs.len() + 4
            && fetches > 2 * redirected.len() as u64,
        "{} redirects for {} blobs, {fetches} fetches",
        redirected.len(),
        blobs.len()
    );
}

/// `faultproxy.py` in front of `upstream` on a port of the system's choice, with its
/// control file and logs in a temporary directory; stopped when dropped.
struct FaultProxy {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl FaultProxy {
    fn start(upstream: u16) -> FaultProxy {
        let dir = tempfile::tempdir().unwrap();
        let (child, port) = spawn_fault_proxy(upstream, dir.path());
        FaultProxy { child, port, dir }
    }

    fn control(&self, json: &str) {
        fs::write(self.dir.path().join("control.json"), json).unwrap();
    }

    /// Lines of one of its logs (`log`: `METHOD PATH STATUS BYTES`; `auth`: `METHOD
    /// PATH SCHEME`); panics if it is missing.
    fn lines(&self, which: &str) -> Vec<String> {
        let path = self.dir.path().join(format!("control.json.{which}"));
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the fault proxy's {which} log: {e}"))
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// A registry that asks for credentials (htpasswd over TLS) and keeps its blobs in S3
/// behind a proxy: the 307s to storage are followed without the registry's
/// `Authorization` (the storage sees none), and a storage that refuses a signed URL
/// (403: one not valid yet, the first two times each blob is asked; one expired, signed
/// over 3 s before, as S3 refuses one past its `X-Amz-Expires`) sends the read back to
/// the registry for a fresh one: the image mounts equal to the reference, no read
/// failing.
#[test]
fn authenticated_redirects_drop_credentials_and_ask_again_when_refused() {
    if !tools() {
        return;
    }
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.port);
    let reg = Registry::start_with(Auth::Basic("carol", "s3cret"), Some((&moto, proxy.port)));
    reg.push("oci-zstd-chunked:latest", "team/s3:1", Some("carol:s3cret"));
    proxy.control(r#"{"refuse_first": 2, "expire_s": 3, "refuse_status": 403}"#);
    let certs = reg.cert_dir().display().to_string();
    let before = reg.requests().len();
    let m = Mount::new(
        &[Path::new(&reg.reference("team/s3:1"))],
        &[
            "--cert-dir",
            &certs,
            "--creds",
            "carol:s3cret",
            "--no-disk-cache",
            "--no-index-cache",
            "--no-background-fetch",
        ],
    );
    // Not a wait for an event: the storage expires a URL by the clock, and the
    // locations the mount was sent to must be past 3 s old when the reads begin.
    std::thread::sleep(Duration::from_millis(3200));
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
    let st = status_json(&m.path());
    assert_eq!(
        st["remote"]["errors"],
        0,
        "{}\n{}\n{}",
        st["remote"],
        m.log_text(),
        proxy.lines("log").join("\n")
    );
    // The storage saw the mount's reads (signed URLs, no Authorization) and the
    // registry's own S3 calls (AWS4-HMAC-SHA256), never the user's credentials.
    let auth = proxy.lines("auth");
    assert!(
        auth.iter()
            .any(|l| l.starts_with("GET ") && l.ends_with(" -")),
        "no read of a signed URL reached the storage: {auth:?}"
    );
    let leaked: Vec<&String> = auth.iter().filter(|l| l.ends_with(" Basic")).collect();
    assert!(
        leaked.is_empty(),
        "the registry's credentials went to storage: {leaked:?}"
    );
    // Refused reads were asked again of the registry: two refusals (not valid yet) and
    // three redirects per blob at least, and some expired location refused on top.
    let refused = proxy
        .lines("log")
        .iter()
        .filter(|l| l.contains(" 403 "))
        .count();
    let asked = &reg.requests()[before..];
    let redirects: Vec<&String> = asked
        .iter()
        .filter(|(m, p, s, _)| m == "GET" && p.contains("/blobs/") && *s == 307)
        .map(|r| &r.1)
        .collect();
    let mut blobs = redirects.clone();
    blobs.sort();
    blobs.dedup();
    assert!(
        refused > 2 * blobs.len() && redirects.len() >= 3 * blobs.len() && blobs.len() == 4,
        "{refused} refusals by the storage, {} redirects for {} blobs\n{}",
        redirects.len(),
        blobs.len(),
        proxy.lines("log").join("\n")
    );
}

/// A server that answers a request for several ranges with the whole blob (a proxy
/// in front of the registry drops the Range header of such requests): each of those
/// ranges is then asked alone, no multi-range request counts as one, and files read
/// right.
#[test]
fn a_server_that_ignores_multi_range_requests_gets_one_range_each() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    reg.push("oci-gzip:latest", "pkgfs/single:1", None);
    let proxy = FaultProxy::start(reg.port);
    proxy.control(r#"{"single_range": true}"#);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let m = Mount::new(
        &[Path::new(&format!(
            "docker://127.0.0.1:{}/pkgfs/single:1",
            proxy.port
        ))],
        &[
            "--tls-verify=false",
            "--no-index-cache",
            "--disk-cache",
            cache.to_str().unwrap(),
        ],
    );
    let reference = images().join("reference/rootfs");
    assert_eq!(
        fs::read(m.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    let st = status_json(&m.path());
    assert_eq!(st["remote"]["multi_range_requests"], 0, "{}", st["remote"]);
    // `PATH RANGE STATUS`: each request for several ranges (the layers' heads and
    // tails, sent at once) got the whole blob; each of its ranges was then asked alone
    // and answered 206.
    let ranges = proxy.lines("ranges");
    let multi: Vec<&String> = ranges.iter().filter(|l| l.contains(',')).collect();
    assert!(
        !multi.is_empty(),
        "the mount never asked for several ranges at once: {ranges:?}"
    );
    for l in multi {
        let [path, spec, status] = l.split(' ').collect::<Vec<_>>()[..] else {
            panic!("{l}")
        };
        assert_eq!(status, "200", "{ranges:?}");
        for one in spec.trim_start_matches("bytes=").split(',') {
            let alone = format!("{path} bytes={one} 206");
            assert!(
                ranges.contains(&alone),
                "no fallback to {alone}: {ranges:?}"
            );
        }
    }
}

/// A registry that lies, stalls or floods: each fault fails the mount in bounded time
/// with a message that says what was wrong; 429 with `Retry-After` is waited out; a
/// layer whose bytes are not its digest's is never served and not kept in the disk
/// cache (the next try fetches it again), so the right bytes from elsewhere are not
/// shadowed by them. A server that answers every range with the whole blob (200) is
/// read up to each range's end: the image mounts equal to the reference.
#[test]
fn hostile_registries_are_refused_in_bounded_time() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hostile = Hostile::start(&images().join("oci-gzip"));
    let port = hostile.port;
    let src = |fault: &str| format!("docker://127.0.0.1:{port}/{fault}/img:latest");
    let cache = dir.path().join("disk-cache");
    let cache = cache.to_str().unwrap();
    let attempt = |fault: &str, extra: &[&str]| -> (String, Duration) {
        let t = Instant::now();
        let mut args = vec!["--tls-verify=false", "--remote-timeout", "4s"];
        args.extend_from_slice(extra);
        let s = src(fault);
        args.push(&s);
        let err = mount_fails(&args);
        (err, t.elapsed())
    };
    let digest = {
        use sha2::Digest as _;
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(images().join("oci-gzip/index.json")).unwrap())
                .unwrap();
        let d = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let hex = d.strip_prefix("sha256:").unwrap().to_string();
        let bytes = fs::read(images().join("oci-gzip/blobs/sha256").join(hex)).unwrap();
        assert_eq!(format!("sha256:{:x}", sha2::Sha256::digest(&bytes)), d);
        d
    };
    let last_layer = {
        let top: serde_json::Value = serde_json::from_slice(
            &fs::read(images().join("oci-gzip/blobs/sha256").join(&digest[7..])).unwrap(),
        )
        .unwrap();
        top["layers"].as_array().unwrap().last().unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let gets_of = |repo: &str, blob: &str| {
        let path = format!("/v2/{repo}/img/blobs/{blob}");
        hostile
            .requests()
            .iter()
            .filter(|(m, p, ..)| m == "GET" && *p == path)
            .count()
    };
    for (fault, want) in [
        ("liar", "the registry says its digest is sha256:1111"),
        ("huge", "more than the 4 MiB pkgfs reads"),
        ("endless", "more than 4194304 bytes"),
        ("silent", "no answer within 4 s"),
        ("loop", "more than 5 redirects"),
        ("tokenless", "no answer within 4 s"),
        ("closed", "asks to wait 3600 s"),
        ("tampered", "digest"),
    ] {
        let (err, took) = attempt(fault, &["--disk-cache", cache]);
        assert!(err.contains(want), "{fault}: {err}");
        assert!(took < Duration::from_secs(15), "{fault}: {took:?}");
    }
    // Pinned by digest, other bytes: refused.
    let pinned = format!("docker://127.0.0.1:{port}/swapped/img@{digest}");
    let err = mount_fails(&["--tls-verify=false", &pinned]);
    assert!(err.contains("digest"), "{err}");
    // The tampered layer again: refused again (its bytes were dropped from the disk
    // cache, fetched again, checked again).
    let fetched = gets_of("tampered", &last_layer);
    assert!(fetched >= 1, "the tampered layer was never fetched");
    let (err, _) = attempt("tampered", &["--disk-cache", cache]);
    assert!(err.contains("digest"), "{err}");
    assert!(
        gets_of("tampered", &last_layer) > fetched,
        "the tampered layer was not fetched again: its bytes were kept"
    );
    // 429 twice with Retry-After: 1, then the image: mounted, equal to the reference.
    let m = Mount::new(
        &[Path::new(&src("busy"))],
        &["--tls-verify=false", "--no-disk-cache", "--no-index-cache"],
    );
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
    let st = status_json(&m.path());
    assert!(st["remote"]["retries"].as_u64().unwrap() >= 2, "{st}");
    drop(m);
    // And the good one, after all that, from the same server and the same disk cache,
    // where the tampered bytes of its last layer (same digest) would be had they been
    // kept: it fetches that layer.
    let m = Mount::new(
        &[Path::new(&src("good"))],
        &[
            "--tls-verify=false",
            "--disk-cache",
            cache,
            "--no-index-cache",
        ],
    );
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
    assert!(
        gets_of("good", &last_layer) >= 1,
        "{:?}",
        hostile.requests()
    );
    drop(m);
    // A server without ranges: every blob whole, each read cut at its range's end.
    let before = hostile.requests().len();
    let m = Mount::new(
        &[Path::new(&src("rangeless"))],
        &["--tls-verify=false", "--no-disk-cache", "--no-index-cache"],
    );
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
    let asked = &hostile.requests()[before..];
    assert!(
        asked
            .iter()
            .any(|r| r.1.contains("/blobs/") && r.3.starts_with("bytes=") && r.2 == "200"),
        "no range asked of the rangeless server: {asked:?}"
    );
}

/// A multi-platform index pushed with `skopeo copy --all`: this machine's image by
/// default, another with `--platform`, a missing one named with those there are; the
/// offline tools (`ls`, `cat`) take `docker://` with the same options.
#[test]
fn a_multi_platform_index_in_a_registry() {
    if !tools() {
        return;
    }
    let host = match std::env::consts::ARCH {
        "x86_64" => "linux/amd64",
        "aarch64" => "linux/arm64/v8",
        other => panic!(
            "multiarch.py's index has images for linux/amd64 and linux/arm64/v8 (and \
             others): none for this machine's {other}, whose image this test mounts"
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("multi");
    run(Command::new("python3")
        .arg(repo().join("mount-tests/images/multiarch.py"))
        .arg(&layout));
    let reg = Registry::start(Auth::Anonymous);
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--all", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:latest", layout.display()))
        .arg(reg.reference("multi/img:latest")));
    let src = reg.reference("multi/img:latest");
    let m = Mount::new(
        &[Path::new(&src)],
        &["--tls-verify=false", "--no-disk-cache"],
    );
    assert_eq!(
        fs::read_to_string(m.path().join("platform")).unwrap(),
        format!("{host}\n")
    );
    drop(m);
    let m = Mount::new(
        &[Path::new(&src)],
        &[
            "--tls-verify=false",
            "--no-disk-cache",
            "--platform",
            "linux/s390x",
        ],
    );
    assert_eq!(
        fs::read_to_string(m.path().join("platform")).unwrap(),
        "linux/s390x\n"
    );
    drop(m);
    let out = pkgfs()
        .args([
            "ls",
            "--tls-verify=false",
            "--platform",
            "linux/riscv64",
            &src,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no image for linux/riscv64") && err.contains("linux/arm64"),
        "{err}"
    );
    let out = run(pkgfs().args(["cat", "--tls-verify=false", &src, "platform"]));
    assert_eq!(out.stdout, format!("{host}\n").as_bytes());
}

/// With `--poll`, a tag is looked up again at each poll: a new image pushed to it is
/// activated as one change (its manifest in status, its layers mounted), and a poll
/// while the registry is down keeps the image mounted.
#[test]
fn a_polled_tag_follows_pushes() {
    if !tools() {
        return;
    }
    let mut reg = Registry::start(Auth::Anonymous);
    reg.push("oci-gzip:latest", "pkgfs/moving:stable", None);
    let first = manifest_digest(&reg, "pkgfs/moving:stable");
    let src = reg.reference("pkgfs/moving:stable");
    let m = Mount::new(
        &[Path::new(&src)],
        &[
            "--tls-verify=false",
            "--no-disk-cache",
            "--poll",
            "1s",
            "--remote-timeout",
            "3s",
        ],
    );
    assert_eq!(status_json(&m.path())["images"][0]["manifest"], first);
    let failed = |m: &Mount| status_json(&m.path())["failed_scans"].as_u64().unwrap();
    assert_eq!(failed(&m), 0);
    reg.stop();
    // A poll has run into the outage (and failed: counted), within 20 s.
    wait_until(
        Duration::from_secs(20),
        "no poll failed during the outage",
        || failed(&m) >= 1,
    );
    assert!(
        m.path().join("usr/bin/bash").exists(),
        "an outage unmounted the image"
    );
    assert_eq!(status_json(&m.path())["images"][0]["manifest"], first);
    reg.restart();
    reg.push("oci-zstd-chunked:latest", "pkgfs/moving:stable", None);
    let second = manifest_digest(&reg, "pkgfs/moving:stable");
    assert_ne!(first, second);
    wait_until(Duration::from_secs(20), "the new image is active", || {
        status_json(&m.path())["images"][0]["manifest"] == second.as_str()
    });
    let st = status_json(&m.path());
    for p in st["packages"].as_array().unwrap() {
        assert_eq!(p["format"], "zstd:chunked", "{p}");
    }
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
}

/// The SOCI fixtures (`registry/make_soci.sh`: AWS's `soci` built from the Go module
/// proxy, the umoci image converted by `soci convert` to a SOCI-enabled image), built
/// once under the target directory.
pub(crate) fn soci_fixtures() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let images = images();
        let dir = images.with_file_name("soci-fixtures");
        run(Command::new("bash")
            .arg(repo().join("mount-tests/registry/make_soci.sh"))
            .arg(&dir)
            .arg(images));
        dir
    })
}

/// A SOCI-enabled image (SOCI index manifest v2, made by AWS's `soci convert`) pushed
/// with skopeo: its gzip layers are indexed from their zTOCs, no pass: the mount
/// fetches the zTOCs and little else, one file costs the spans it lies in, and the
/// whole tree equals umoci's unpack; status says `ztoc` for each layer. From a
/// registry that tampers with a layer, the files of the span it touched read `EIO`
/// (the span fails its zTOC digest), the rest reads.
#[test]
fn soci_indexes_spare_gzip_layers_their_pass() {
    if !tools() {
        return;
    }
    let layout = soci_fixtures().join("oci-gzip-soci");
    let reg = Registry::start(Auth::Anonymous);
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--all", "--dest-tls-verify=false"])
        .arg(format!("oci:{}", layout.display()))
        .arg(reg.reference("pkgfs/soci:v2")));
    let reference = images().join("reference/rootfs");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let m = lazy_mount(&reg, "pkgfs/soci:v2", &cache);
    let st = status_json(&m.path());
    let layers: Vec<u64> = st["images"][0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .collect();
    let total: u64 = layers.iter().sum();
    for p in st["packages"].as_array().unwrap() {
        assert_eq!(
            (&p["format"], &p["index"], &p["checked"]),
            (&"tar.gz".into(), &"ztoc".into(), &"ztoc".into()),
            "{p}"
        );
    }
    let first = &st["packages"][0];
    assert!(
        first["fetched_bytes"].as_u64().unwrap() * 10 < layers[0],
        "layer 1 fetched at mount: {first}"
    );
    let at_mount = reg.blob_bytes();
    assert!(
        at_mount > 0 && at_mount * 5 < total,
        "{at_mount} bytes sent at mount of {total} bytes of layers"
    );
    assert_eq!(
        fs::read(m.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    let one = reg.blob_bytes() - at_mount;
    assert!(one > 0 && one * 10 < total, "{one} bytes sent for bash");
    trees_match(&reference, &m.path(), &[]);
    drop(m);
    // With an index cache: the index made from each zTOC is kept, and the next mount
    // reads it (the spans are still checked against the zTOC's digests).
    let index = dir.path().join("index-cache");
    for round in ["first", "second"] {
        let m = Mount::new(
            &[Path::new(&reg.reference("pkgfs/soci:v2"))],
            &[
                "--tls-verify=false",
                "--index-cache",
                index.to_str().unwrap(),
                "--disk-cache",
                cache.to_str().unwrap(),
            ],
        );
        for p in status_json(&m.path())["packages"].as_array().unwrap() {
            let want = if round == "first" { "ztoc" } else { "cache" };
            assert_eq!(
                (&p["index"], &p["checked"]),
                (&want.into(), &"ztoc".into()),
                "{p}"
            );
        }
        assert_eq!(
            fs::read(m.path().join("usr/bin/perl")).unwrap(),
            fs::read(reference.join("usr/bin/perl")).unwrap()
        );
    }

    // A registry that flips a byte of the last layer (its only span).
    let hostile = Hostile::start(&layout);
    let port = hostile.port;
    let m = Mount::new(
        &[Path::new(&format!(
            "docker://127.0.0.1:{port}/tampered/img:latest"
        ))],
        &["--tls-verify=false", "--no-index-cache", "--no-disk-cache"],
    );
    let e = fs::read(m.path().join("etc/default/pkgfs")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert!(m.log_text().contains("span 0"), "{}", m.log_text());
    assert_eq!(
        fs::read(m.path().join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    drop(m);
    // A SOCI index that cannot be used (not there, not a SOCI index, zTOCs that are
    // not their digests' bytes): reported, and the layers take a pass instead.
    for (fault, said) in [
        ("soci-missing", "cannot be used"),
        ("soci-foreign", "the SOCI index is not valid"),
        ("soci-ztoc", "zTOC"),
    ] {
        let m = Mount::new(
            &[Path::new(&format!(
                "docker://127.0.0.1:{port}/{fault}/img:latest"
            ))],
            &["--tls-verify=false", "--no-index-cache", "--no-disk-cache"],
        );
        every_layer_passed_and_digest_checked(&m.path(), fault);
        let said_where = format!("{}{}", m.stderr, m.log_text());
        assert!(said_where.contains(said), "{fault}: {said_where}");
        trees_match(&reference, &m.path(), &[]);
    }
}

/// By default a layer read lazily is fetched whole in the background once mounted: the
/// registry sends every byte of it without anything being read, and with the registry
/// stopped after that the whole tree still reads, equal to umoci's unpack.
#[test]
fn lazily_read_layers_are_fetched_whole_in_the_background() {
    if !tools() {
        return;
    }
    let mut reg = Registry::start(Auth::Anonymous);
    reg.push("oci-estargz:latest", "pkgfs/bg:1", None);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let m = Mount::new(
        &[Path::new(&reg.reference("pkgfs/bg:1"))],
        &[
            "--tls-verify=false",
            "--no-index-cache",
            "--disk-cache",
            cache.to_str().unwrap(),
        ],
    );
    let total: u64 = status_json(&m.path())["images"][0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    wait_until(Duration::from_secs(30), "the layers are fetched", || {
        status_json(&m.path())["remote"]["bytes"].as_u64().unwrap() >= total
    });
    let st = status_json(&m.path());
    assert!(
        st["remote"]["prefetches"].as_u64().unwrap() > 0,
        "{}",
        st["remote"]
    );
    reg.stop();
    trees_match(&images().join("reference/rootfs"), &m.path(), &[]);
}

/// `pkgfs store` at a temporary mountpoint (background daemon), unmounted when dropped.
struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    fn start(extra: &[&str]) -> Store {
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("store");
        fs::create_dir(&mp).unwrap();
        run(pkgfs()
            .arg("store")
            .arg(&mp)
            .arg("--log-file")
            .arg(dir.path().join("pkgfs.log"))
            .args(extra));
        Store { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The directory of `reference` (as containers/storage names it).
    fn layer_dir(&self, reference: &str, digest: &str) -> PathBuf {
        use base64::Engine as _;
        let enc = base64::engine::general_purpose::STANDARD.encode(reference);
        self.path().join(enc).join(digest)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = pkgfs().arg("umount").arg(self.path()).output();
        if crate::common::is_mountpoint(&self.path()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// podman with storage of its own in a temporary directory, taking layers from `store`;
/// its mounts undone and its storage removed when dropped.
struct Podman {
    dir: tempfile::TempDir,
    store: PathBuf,
}

impl Podman {
    fn new(store: &Path) -> Podman {
        Podman {
            dir: tempfile::tempdir().unwrap(),
            store: store.to_path_buf(),
        }
    }

    fn cmd(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("run"))
            .args(["--storage-driver", "overlay", "--events-backend", "none"])
            .arg("--storage-opt")
            .arg(format!(
                "overlay.additionallayerstore={}:ref",
                self.store.display()
            ))
            .env("TMPDIR", d);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = run(self.cmd().args(args));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd().args(["image", "unmount", "--all"]).output();
        // Whatever podman left mounted under its storage (overlays over the store).
        let root = self.dir.path().to_str().unwrap().to_string();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&root))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

/// The manifest and config skopeo sees for `name`.
pub(crate) fn manifest_and_config(
    reg: &Registry,
    name: &str,
) -> (serde_json::Value, serde_json::Value) {
    manifest_and_config_with(reg, name, None)
}

/// [`manifest_and_config`] from a registry that wants `creds` (`USER:PASS`).
pub(crate) fn manifest_and_config_as(
    reg: &Registry,
    name: &str,
    creds: &str,
) -> (serde_json::Value, serde_json::Value) {
    manifest_and_config_with(reg, name, Some(creds))
}

fn manifest_and_config_with(
    reg: &Registry,
    name: &str,
    creds: Option<&str>,
) -> (serde_json::Value, serde_json::Value) {
    let get = |extra: &[&str]| -> serde_json::Value {
        let out = run(Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .args(creds.map(|c| ["--creds", c]).iter().flatten())
            .args(extra)
            .arg(reg.reference(name)));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    (get(&[]), get(&["--config"]))
}

/// podman pulls through `pkgfs store` (containers/storage's additional layer store):
/// the layers come from the store, not the registry, `podman image mount` shows the
/// image equal to umoci's unpack (overlayfs over the store's overlay-native diffs:
/// whiteouts, opaque directories), for a gzip image (indexed by a pass) and a
/// zstd:chunked one (its table); `use` and `rmdir` are counted; `info` and `blob` say
/// what containers/storage reads; names that are not references are not there.
#[test]
fn podman_pulls_through_the_layer_store() {
    if !tools() || !require_tools(&["podman", "getfattr"]) {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("disk-cache");
    let store = Store::start(&[
        "--tls-verify=false",
        "--disk-cache",
        cache.to_str().unwrap(),
        "--index-cache",
        tmp.path().join("index").to_str().unwrap(),
    ]);
    let reference = images().join("reference/rootfs");
    for (from, tag) in [("oci-gzip:latest", "gz"), ("oci-zstd-chunked:latest", "zc")] {
        let name = format!("pkgfs/debian:{tag}");
        reg.push(from, &name, None);
        let podman = Podman::new(&store.path());
        let fetched_before = |st: serde_json::Value| st["remote"]["bytes"].as_u64().unwrap();
        let before = (reg.blob_bytes(), fetched_before(status_json(&store.path())));
        let pulled = format!("{}/{name}", reg.host());
        podman.run(&[
            "pull",
            "--quiet",
            "--tls-verify=false",
            &format!("docker://{pulled}"),
        ]);
        let rootfs = podman.run(&["image", "mount", &pulled]);
        // Directory mtimes aside: overlayfs shows a directory with the attributes of the
        // uppermost layer that has it, and a layer that implies a directory without
        // listing it (layer 3's /etc, /usr) has one of its own there (containers/storage's
        // own unpacking makes it at the time of the pull; pkgfs gives it mtime 0), where
        // umoci's single-tree unpack keeps the lower layer's.
        trees_match(&reference, Path::new(&rootfs), &["--no-dir-mtime"]);
        if tag == "zc" {
            // The image's programs on that root: in a chroot, and under runc (`podman
            // run` itself fails on this machine setting rlimits, with or without pkgfs).
            runs_its_programs(Path::new(&rootfs));
            assert_eq!(
                in_runc(Path::new(&rootfs), &["/usr/local/bin/pkgfs-selftest"]),
                fs::read_to_string(images().join("reference.selftest")).unwrap()
            );
        }
        // The layers came from the store: of the blob bytes the registry sent, podman
        // had the config, pkgfs the rest (and the framing of multipart replies, which
        // the registry's log counts).
        let st = status_json(&store.path());
        let fetched = st["remote"]["bytes"].as_u64().unwrap() - before.1;
        let (manifest, config) = manifest_and_config(&reg, &name);
        let layers = manifest["layers"].as_array().unwrap();
        let sent = reg.blob_bytes() - before.0;
        let config_size = manifest["config"]["size"].as_u64().unwrap();
        assert!(
            fetched > 0 && sent > 0 && sent <= fetched + config_size + 64 * 1024,
            "{from}: the registry sent {sent} bytes of blobs, pkgfs fetched {fetched}"
        );
        let digests: Vec<&str> = layers
            .iter()
            .map(|l| l["digest"].as_str().unwrap())
            .collect();
        // The store's rows of the pulled image's layers.
        let rows_of = |st: &serde_json::Value| -> Vec<serde_json::Value> {
            st["store"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["reference"] == pulled.as_str())
                .filter(|r| digests.contains(&r["digest"].as_str().unwrap()))
                .cloned()
                .collect()
        };
        let rows = rows_of(&st);
        assert_eq!(rows.len(), layers.len(), "{st}");
        for r in &rows {
            assert!(r["uses"].as_u64().unwrap() >= 1, "{r}");
            assert_eq!(r["indexed"], true, "{r}");
        }
        // What containers/storage reads of each layer.
        for (i, l) in layers.iter().enumerate() {
            let digest = l["digest"].as_str().unwrap();
            let dir = store.layer_dir(&pulled, digest);
            let info: serde_json::Value =
                serde_json::from_slice(&fs::read(dir.join("info")).unwrap()).unwrap();
            assert_eq!(info["compressed-diff-digest"], digest);
            assert_eq!(info["compressed-size"], l["size"]);
            assert_eq!(info["diff-digest"], config["rootfs"]["diff_ids"][i]);
            assert_eq!(
                info["compression"],
                if tag == "gz" { 2 } else { 4 },
                "{info}"
            );
        }
        if tag == "zc" {
            // Also by the digest of each table of contents, as podman 5.1 asks.
            for l in layers {
                // skopeo 1.9 writes the annotation's older name.
                let toc = l["annotations"]["io.containers.zstd-chunked.manifest-checksum"]
                    .as_str()
                    .unwrap();
                let dir = store.layer_dir(&pulled, toc);
                let info: serde_json::Value =
                    serde_json::from_slice(&fs::read(dir.join("info")).unwrap()).unwrap();
                assert_eq!(info["toc-digest"], toc, "{info}");
                assert!(dir.join("diff/etc").is_dir());
            }
        }
        // The last layer (small) whole through `blob`: the registry's bytes.
        let last = layers.last().unwrap()["digest"].as_str().unwrap();
        let bytes = fs::read(store.layer_dir(&pulled, last).join("blob")).unwrap();
        use sha2::Digest as _;
        assert_eq!(format!("sha256:{:x}", sha2::Sha256::digest(&bytes)), last);
        if tag == "gz" {
            // Directories a layer lists keep their tar mtime in its diff.
            let first = layers[0]["digest"].as_str().unwrap();
            let l1 = store.layer_dir(&pulled, first);
            let blob = images().join("oci-gzip/blobs/sha256").join(&first[7..]);
            for d in ["usr/bin", "etc", "var/lib"] {
                let out = run(Command::new("python3")
                    .arg("-c")
                    .arg(
                        "import sys, tarfile\n\
                     for m in tarfile.open(sys.argv[1]):\n\
                     \x20   if m.name.strip('./') == sys.argv[2]: print(m.mtime)",
                    )
                    .arg(&blob)
                    .arg(d));
                let want: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
                use std::os::unix::fs::MetadataExt;
                assert_eq!(
                    fs::metadata(l1.join("diff").join(d)).unwrap().mtime(),
                    want,
                    "{d}"
                );
            }
            // Overlay-native diffs: layer 2 removes files (whiteouts as 0/0 character
            // devices), layer 3 makes /etc/default opaque.
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let l2 = store.layer_dir(&pulled, layers[1]["digest"].as_str().unwrap());
            let whiteouts = walk(&l2.join("diff"))
                .into_iter()
                .filter(|(_, m)| m.file_type().is_char_device() && m.rdev() == 0)
                .count();
            assert!(whiteouts > 100, "{whiteouts} whiteouts in layer 2");
            let l3 = store.layer_dir(&pulled, layers[2]["digest"].as_str().unwrap());
            let out = run(Command::new("getfattr")
                .args(["--only-values", "-n", "trusted.overlay.opaque"])
                .arg(l3.join("diff/etc/default")));
            assert_eq!(out.stdout, b"y");
            // A `use` file is a signal, never a file.
            let err = fs::File::create(l3.join("use")).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        }
        // Released when podman removes the image.
        podman.run(&["image", "unmount", &pulled]);
        podman.run(&["rmi", &pulled]);
        let st = status_json(&store.path());
        let rows = rows_of(&st);
        assert_eq!(rows.len(), layers.len(), "{st}");
        for r in rows {
            assert!(r["released"].as_u64().unwrap() >= 1, "{r}");
        }
    }
    // The store's names: what was looked up.
    let pulled = format!("{}/pkgfs/debian:gz", reg.host());
    let (manifest, _) = manifest_and_config(&reg, "pkgfs/debian:gz");
    let first = manifest["layers"][0]["digest"].as_str().unwrap();
    assert!(store.layer_dir(&pulled, first).join("info").exists());
    // Names that are not references, and digests the image does not list, are not
    // there (ENOENT); a reference that does not resolve is EIO.
    let errno = |p: PathBuf| {
        fs::metadata(&p)
            .map(|_| 0)
            .unwrap_or_else(|e| e.raw_os_error().unwrap())
    };
    assert_eq!(errno(store.path().join("not-base64!")), libc::ENOENT);
    assert_eq!(
        errno(store.layer_dir(&pulled, &format!("sha256:{}", "0".repeat(64)))),
        libc::ENOENT
    );
    assert_eq!(
        errno(store.layer_dir(&format!("{}/pkgfs/nothing:v1", reg.host()), first)),
        libc::EIO
    );
    // Read-only but for containers/storage's signals: a write anywhere is EROFS.
    let l1 = store.layer_dir(&pulled, first);
    for p in [l1.join("new-file"), l1.join("diff/new-file")] {
        let e = fs::File::create(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{}: {e}", p.display());
    }
    let e = fs::create_dir(l1.join("diff/new-dir")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "mkdir: {e}");
}

/// Every layer kind through `pkgfs store`, without podman (what containers/storage
/// looks up, looked up directly): uncompressed, gzip, zstd, zstd:chunked, eStargz and
/// SOCI-indexed gzip layers each have their `info` (compression 0, 2 or 4 by media type, sizes and
/// digests from the manifest and config) and a `diff/` whose files are the layer's.
#[test]
fn every_layer_kind_through_the_store() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let store = Store::start(&["--tls-verify=false", "--no-disk-cache", "--no-index-cache"]);
    let reference = images().join("reference/rootfs");
    // Uncompressed: the gzip image's layers decompressed (`registry/uncompressed.py`).
    let tmp = tempfile::tempdir().unwrap();
    let tar = tmp.path().join("oci-tar");
    run(Command::new("python3")
        .arg(repo().join("mount-tests/registry/uncompressed.py"))
        .arg(images().join("oci-gzip"))
        .arg(&tar));
    run(Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:latest", tar.display()))
        .arg(reg.reference("pkgfs/kinds:tar")));
    for (from, tag) in [
        ("oci-gzip:latest", "gz"),
        ("oci-zstd:latest", "zst"),
        ("oci-zstd-chunked:latest", "zc"),
        ("oci-estargz:latest", "esgz"),
    ] {
        reg.push(from, &format!("pkgfs/kinds:{tag}"), None);
    }
    // SOCI-indexed gzip: the image index with its SOCI index, as `soci convert` makes it.
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--all", "--dest-tls-verify=false"])
        .arg(format!(
            "oci:{}",
            soci_fixtures().join("oci-gzip-soci").display()
        ))
        .arg(reg.reference("pkgfs/kinds:soci")));
    for (tag, compression) in [
        ("tar", 0),
        ("gz", 2),
        ("zst", 4),
        ("zc", 4),
        ("esgz", 2),
        ("soci", 2),
    ] {
        let name = format!("pkgfs/kinds:{tag}");
        let (mut manifest, config) = manifest_and_config(&reg, &name);
        if manifest.get("manifests").is_some() {
            // An index (SOCI): the image's manifest, as skopeo picks it.
            let digest = manifest["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["annotations"]["com.amazon.soci.image-manifest-digest"].is_null())
                .unwrap()["digest"]
                .as_str()
                .unwrap()
                .to_string();
            let out = run(Command::new("skopeo")
                .args(["inspect", "--raw", "--tls-verify=false"])
                .arg(reg.reference(&format!("pkgfs/kinds@{digest}"))));
            manifest = serde_json::from_slice(&out.stdout).unwrap();
        }
        let layers = manifest["layers"].as_array().unwrap();
        assert!(!layers.is_empty(), "{manifest}");
        let pulled = format!("{}/{name}", reg.host());
        for (i, l) in layers.iter().enumerate() {
            let digest = l["digest"].as_str().unwrap();
            let dir = store.layer_dir(&pulled, digest);
            let info: serde_json::Value =
                serde_json::from_slice(&fs::read(dir.join("info")).unwrap()).unwrap();
            assert_eq!(info["compressed-diff-digest"], digest, "{tag}: {info}");
            assert_eq!(info["compressed-size"], l["size"], "{tag}: {info}");
            assert_eq!(
                info["diff-digest"], config["rootfs"]["diff_ids"][i],
                "{tag}: {info}"
            );
            assert_eq!(
                info["compression"], compression,
                "{tag} ({}): {info}",
                l["mediaType"]
            );
            assert!(
                fs::read_dir(dir.join("diff")).unwrap().next().is_some(),
                "{tag}: layer {} has an empty diff",
                i + 1
            );
        }
        // The first layer's files are the image's (later layers leave bash alone).
        let first = store.layer_dir(&pulled, layers[0]["digest"].as_str().unwrap());
        assert_eq!(
            fs::read(first.join("diff/usr/bin/bash")).unwrap(),
            fs::read(reference.join("usr/bin/bash")).unwrap(),
            "{tag}"
        );
    }
}

/// Every path under `dir` with its metadata (symlinks not followed).
fn walk(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                todo.push(e.path());
            }
            out.push((e.path(), m));
        }
    }
    out
}

/// SOCI index manifest v1, as `soci create` and `soci push` leave it in distribution 2.8
/// (no referrers API: a referrers fallback tag `sha256-HEX` lists the index): the
/// registry serves the storage soci's push wrote (`make_soci.sh`). By tag, every layer
/// is indexed from its zTOC, found through the fallback tag, and the tree equals umoci's
/// unpack; pinned by digest, the referrer is not taken (it is not part of the image)
/// and the layers take a pass.
#[test]
fn soci_v1_indexes_are_found_among_referrers() {
    if !tools() {
        return;
    }
    let data = soci_fixtures().join("registry-v1");
    let mut reg = Registry::start(Auth::Anonymous);
    reg.stop();
    run(Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(reg.dir.path().join("data")));
    reg.restart();
    let tags = fs::read_dir(
        reg.dir
            .path()
            .join("data/docker/registry/v2/repositories/pkgfs/soci1/_manifests/tags"),
    )
    .unwrap()
    .map(|e| e.unwrap().file_name().into_string().unwrap())
    .collect::<Vec<_>>();
    assert!(
        tags.iter().any(|t| t.starts_with("sha256-")),
        "soci push left no fallback tag: {tags:?}"
    );
    let reference = images().join("reference/rootfs");
    let dir = tempfile::tempdir().unwrap();
    let m = Mount::new(
        &[Path::new(&reg.reference("pkgfs/soci1:latest"))],
        &[
            "--tls-verify=false",
            "--no-index-cache",
            "--disk-cache",
            dir.path().join("c1").to_str().unwrap(),
        ],
    );
    for p in status_json(&m.path())["packages"].as_array().unwrap() {
        assert_eq!(
            (&p["index"], &p["checked"]),
            (&"ztoc".into(), &"ztoc".into()),
            "{p}"
        );
    }
    trees_match(&reference, &m.path(), &[]);
    drop(m);
    let digest = manifest_digest(&reg, "pkgfs/soci1:latest");
    let pinned = Mount::new(
        &[Path::new(&reg.reference(&format!("pkgfs/soci1@{digest}")))],
        &[
            "--tls-verify=false",
            "--no-index-cache",
            "--disk-cache",
            dir.path().join("c2").to_str().unwrap(),
        ],
    );
    every_layer_passed_and_digest_checked(&pinned.path(), "pinned");
}

/// Every layer of the mount at `mp` was indexed by a pass over its bytes, its digest
/// checked (no SOCI index used); there is at least one. `what` names the case.
fn every_layer_passed_and_digest_checked(mp: &Path, what: &str) {
    let st = status_json(mp);
    let packages = st["packages"].as_array().unwrap();
    assert!(!packages.is_empty(), "{what}: {st}");
    for p in packages {
        assert_eq!(
            (&p["index"], &p["checked"]),
            (&"pass".into(), &"digest".into()),
            "{what}: {p}"
        );
    }
}

/// A program of a `docker://` image runs in a chroot of the mount while its server is
/// killed (issue 35): each run, page cache and dentries dropped first, loses its server
/// after its first line of output, and still prints what the image's reference unpack
/// prints. The restarted servers read the layers' indexes and bytes from the disk cache.
#[test]
fn a_program_in_a_docker_image_runs_on_across_server_kills() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    reg.push("oci-gzip:latest", "pkgfs/debian:restart", None);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = Mount::new(
        &[Path::new(&reg.reference("pkgfs/debian:restart"))],
        &[
            "--tls-verify=false",
            "--index-cache",
            dir.path().join("index").to_str().unwrap(),
            "--disk-cache",
            cache.to_str().unwrap(),
            "--restart-limit",
            "100/60s",
        ],
    );
    let want = fs::read_to_string(images().join("reference.selftest")).unwrap();
    let mut last = None;
    for round in 0..3 {
        let pid = crate::common::next_server(&m.path(), last);
        let _dropped = page_cache_dropped();
        fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        let mut child = Command::new("chroot")
            .arg(m.path())
            .arg("/usr/local/bin/pkgfs-selftest")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut got = String::new();
        std::io::BufRead::read_line(&mut out, &mut got).unwrap();
        crate::common::kill9(pid);
        last = Some(pid);
        std::io::Read::read_to_string(&mut out, &mut got).unwrap();
        assert!(child.wait().unwrap().success(), "round {round}: {got}");
        assert_eq!(got, want, "round {round}");
    }
    let st = status_json(&m.path());
    assert_eq!(st["keeper"]["restarts"], 3, "{st}");
}

/// `pkgfs store` across server kills (issue 35): what lookups grew under the dead server
/// is grown again by the next, in order, so the kernel's inode numbers keep their
/// meaning: paths stat to the same inodes, a layer file opened before the kills reads
/// on, and a layer looked up after them appears.
#[test]
fn a_layer_store_keeps_what_it_grew_across_server_kills() {
    if !tools() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let reg = Registry::start(Auth::Anonymous);
    reg.push("oci-gzip:latest", "pkgfs/st:1", None);
    let cache = tempfile::tempdir().unwrap();
    let store = Store::start(&[
        "--tls-verify=false",
        "--disk-cache",
        cache.path().to_str().unwrap(),
        "--restart-limit",
        "100/60s",
    ]);
    let name = "pkgfs/st:1";
    let (manifest, _) = manifest_and_config(&reg, name);
    let layers: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    assert!(layers.len() >= 2, "{manifest}");
    let pulled = format!("{}/{name}", reg.host());
    let first = store.layer_dir(&pulled, &layers[0]);
    let bash = first.join("diff/usr/bin/bash");
    let inos = |paths: &[&Path]| -> Vec<u64> {
        paths
            .iter()
            .map(|p| {
                fs::symlink_metadata(p)
                    .unwrap_or_else(|e| {
                        panic!(
                            "{}: {e}\n{}",
                            p.display(),
                            fs::read_to_string(store.dir.path().join("pkgfs.log"))
                                .unwrap_or_default()
                        )
                    })
                    .ino()
            })
            .collect()
    };
    let usr = first.join("diff/usr");
    let before = inos(&[&first, &usr, &bash]);
    let mut f = fs::File::open(&bash).unwrap();
    let mut head = vec![0u8; 4096];
    std::io::Read::read_exact(&mut f, &mut head).unwrap();
    let mut last = None;
    for _ in 0..2 {
        let pid = crate::common::next_server(&store.path(), last);
        crate::common::kill9(pid);
        last = Some(pid);
    }
    crate::common::next_server(&store.path(), last);
    assert_eq!(
        inos(&[&first, &usr, &bash]),
        before,
        "the same inodes after the kills"
    );
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut rest).unwrap();
    head.extend(rest);
    let reference = images().join("reference/rootfs/usr/bin/bash");
    assert!(
        head == fs::read(reference).unwrap(),
        "the open layer file reads on"
    );
    let second = store.layer_dir(&pulled, &layers[1]);
    assert!(
        fs::read(second.join("info")).is_ok(),
        "a layer looked up after the kills"
    );
    let st = status_json(&store.path());
    assert_eq!(st["keeper"]["restarts"], 2, "{st}");
}

/// A start recorded and fetched ahead of the next (`--start-window`): a mount of an
/// eStargz image reads some files and stops, which keeps the record of what it read in
/// the index cache; with the disk cache emptied, the next mount of the image fetches
/// those ranges before anything is read, in as many requests as the record's pieces,
/// and the same files then read without a request. A file the record does not hold
/// still goes to the registry. `--start-window 0` records nothing.
#[test]
fn a_start_is_recorded_and_fetched_ahead_of_the_next() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    let reference = images().join("reference/rootfs");
    reg.push("oci-estargz:latest", "pkgfs/estargz:start", None);
    let dir = tempfile::tempdir().unwrap();
    let (cache, index) = (dir.path().join("disk-cache"), dir.path().join("index"));
    let mount = |index: &Path, window: &str| {
        Mount::new(
            &[Path::new(&reg.reference("pkgfs/estargz:start"))],
            &[
                "--tls-verify=false",
                "--prefetch",
                "0",
                "--no-background-fetch",
                "--start-window",
                window,
                "--index-cache",
                index.to_str().unwrap(),
                "--disk-cache",
                cache.to_str().unwrap(),
            ],
        )
    };
    let started = [
        "usr/bin/bash",
        "usr/share/debconf/confmodule",
        "etc/debian_version",
    ];
    let records = |index: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(index)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        v.retain(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("start-")
        });
        v
    };
    let mut m = mount(&index, "30s");
    for f in started {
        assert_eq!(
            fs::read(m.path().join(f)).unwrap(),
            fs::read(reference.join(f)).unwrap()
        );
    }
    assert!(records(&index).is_empty(), "kept once the window ends");
    m.unmount();
    // Stopped within its window: the start so far is kept, by the daemon as it exits.
    let start = Instant::now();
    while records(&index).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no record in {}: {}",
            index.display(),
            m.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kept = records(&index);
    // The pieces the next mount fetches (a record is `START END` lines after its key).
    let pieces: u64 = kept
        .iter()
        .flat_map(|p| {
            let text = fs::read_to_string(p).unwrap();
            let body = text.split_once("pkgfs-start 1\n").unwrap().1.to_string();
            body.lines()
                .map(|l| {
                    let (s, e) = l.split_once(' ').unwrap();
                    let (s, e): (u64, u64) = (s.parse().unwrap(), e.parse().unwrap());
                    (e - s).div_ceil(256 << 10)
                })
                .collect::<Vec<_>>()
        })
        .sum();
    assert!(pieces >= started.len() as u64, "{pieces} pieces");

    fs::remove_dir_all(&cache).unwrap();
    let before = reg.requests().len();
    let m = mount(&index, "30s");
    // Fetched ahead, nothing read yet: the record's pieces, each a prefetch.
    let start = Instant::now();
    while status_json(&m.path())["remote"]["prefetches"]
        .as_u64()
        .unwrap()
        < pieces
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{}",
            status_json(&m.path())["remote"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    reg.answered_all(before, &m.path());
    let (gets, _) = reg.blob_gets();
    for f in started {
        assert_eq!(
            fs::read(m.path().join(f)).unwrap(),
            fs::read(reference.join(f)).unwrap()
        );
    }
    assert_eq!(
        reg.blob_gets().0,
        gets,
        "a read of the start went to the registry"
    );
    // Not in the record: fetched when read.
    let other = "usr/share/perl5/Debconf/Element/Dialog/Boolean.pm";
    assert_eq!(
        fs::read(m.path().join(other)).unwrap(),
        fs::read(reference.join(other)).unwrap()
    );
    assert!(reg.blob_gets().0 > gets);
    drop(m);

    // No window, no record (looked for once the daemon has exited).
    let none = dir.path().join("index-none");
    let mut m = mount(&none, "0");
    fs::read(m.path().join("usr/bin/bash")).unwrap();
    let mp = m.path().to_path_buf();
    m.unmount();
    let start = Instant::now();
    while serving(&mp) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the daemon stays"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(records(&none).is_empty());
    assert!(
        !records(&index).is_empty(),
        "the first mount's records are there"
    );
}

/// Whether a process runs with `mp` on its command line (a daemon of that mount).
fn serving(mp: &Path) -> bool {
    let want = mp.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc").unwrap().any(|e| {
        let p = e.unwrap().path();
        fs::read(p.join("cmdline")).is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == want))
    })
}

/// `pkgfs store` opens every layer of an image as soon as the image resolves (its
/// table of contents fetched), in parallel, before anyone looks into a `diff`: a pull
/// that prepares the layers one after another finds each open already. Looking in then
/// indexes from what was opened, and reads the layer's files.
#[test]
fn a_store_opens_every_layer_of_an_image_when_it_resolves() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    reg.push("oci-estargz:latest", "pkgfs/ahead:1", None);
    let store = Store::start(&["--tls-verify=false", "--no-disk-cache", "--no-index-cache"]);
    let pulled = format!("{}/pkgfs/ahead:1", reg.host());
    let (manifest, _) = manifest_and_config(&reg, "pkgfs/ahead:1");
    let digests: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    assert!(digests.len() >= 2);
    // Only the image's directory is looked up.
    assert!(
        store
            .layer_dir(&pulled, &digests[0])
            .parent()
            .unwrap()
            .is_dir()
    );
    let rows = || -> Vec<serde_json::Value> {
        status_json(&store.path())["store"]
            .as_array()
            .unwrap()
            .clone()
    };
    let start = Instant::now();
    loop {
        let r = rows();
        let opened = digests.iter().all(|d| {
            r.iter()
                .any(|l| l["digest"] == d.as_str() && l["fetched_bytes"].as_u64() > Some(0))
        });
        if opened {
            assert!(
                r.iter().all(|l| l["indexed"] == false),
                "nothing looked into: {r:?}"
            );
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let reference = images().join("reference/rootfs");
    let top = store
        .layer_dir(&pulled, digests.last().unwrap())
        .join("diff");
    let base = store.layer_dir(&pulled, &digests[0]).join("diff");
    assert!(fs::read_dir(&top).unwrap().count() > 0);
    assert_eq!(
        fs::read(base.join("usr/bin/bash")).unwrap(),
        fs::read(reference.join("usr/bin/bash")).unwrap()
    );
    assert!(rows().iter().filter(|l| l["indexed"] == true).count() >= 2);
}

/// A registry that speaks plain HTTP (`--tls-verify=false`) is remembered in the disk
/// cache's directory: the first mount tries HTTPS first (a failed request), the next
/// mount of the same registry goes straight to HTTP.
#[test]
fn a_plain_http_registry_is_remembered_across_mounts() {
    if !tools() {
        return;
    }
    let reg = Registry::start(Auth::Anonymous);
    reg.push("oci-estargz:latest", "pkgfs/plain:1", None);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("disk-cache");
    let mount = || {
        Mount::new(
            &[Path::new(&reg.reference("pkgfs/plain:1"))],
            &[
                "--tls-verify=false",
                "--no-index-cache",
                "--disk-cache",
                cache.to_str().unwrap(),
            ],
        )
    };
    let failed = |m: &Mount| {
        status_json(&m.path())["remote"]["retries"]
            .as_u64()
            .unwrap()
    };
    let m = mount();
    assert_eq!(failed(&m), 1, "{}", status_json(&m.path())["remote"]);
    drop(m);
    let hint = cache.join("plain-http").join(reg.host());
    assert!(hint.exists(), "{}", hint.display());
    let m = mount();
    assert_eq!(failed(&m), 0, "{}", status_json(&m.path())["remote"]);
    assert!(fs::read(m.path().join("usr/bin/bash")).is_ok());
    drop(m);

    // Remembered wrongly (the host speaks TLS now): HTTPS asked, the hint dropped.
    let tls = Registry::start(Auth::Basic("alice", "s3cret"));
    tls.push("oci-gzip:latest", "team/plain:1", Some("alice:s3cret"));
    let hint = cache.join("plain-http").join(tls.host());
    fs::write(&hint, b"").unwrap();
    let m = Mount::new(
        &[Path::new(&tls.reference("team/plain:1"))],
        &[
            "--tls-verify=false",
            "--creds",
            "alice:s3cret",
            "--no-index-cache",
            "--disk-cache",
            cache.to_str().unwrap(),
        ],
    );
    assert!(fs::read(m.path().join("usr/bin/bash")).is_ok());
    assert!(!hint.exists());
}
