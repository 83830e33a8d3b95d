//! Live activation: packages added, removed, replaced and renamed under a running mount,
//! while readers run; the status channel; mounting through mount(8) and fstab.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Mount, expect_matches, pkgfs, require_fuse, run};

/// Write a ZIP package (deflate) with the zip crate, atomically: to a hidden temporary
/// name, then renamed into place, as package managers install.
fn install(path: &Path, files: &[(&str, &[u8])]) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    write_zip(&tmp, files);
    fs::rename(&tmp, path).unwrap();
}

fn write_zip(path: &Path, files: &[(&str, &[u8])]) {
    let mut w = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .last_modified_time(zip::DateTime::from_date_and_time(2024, 5, 6, 7, 8, 10).unwrap());
    for (name, data) in files {
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap();
}

/// Poll `cond` until it holds; panics after `limit`. Returns how long it took.
fn within(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read(p: &Path) -> Option<Vec<u8>> {
    fs::read(p).ok()
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Descriptors of the daemon open on files under `dir`.
fn fds_on(pid: u32, dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.starts_with(dir))
        .collect()
}

const SECOND: Duration = Duration::from_secs(1);

/// Install a one-file package `barrier-NAME.zip` and wait until its file shows: every
/// change made in `pkgs` before it has then been seen by a rescan (changes are taken in
/// order, and a rescan looks at the whole directory).
fn barrier(pkgs: &Path, mp: &Path, name: &str) {
    let file = format!("barrier/{name}");
    install(
        &pkgs.join(format!("barrier-{name}.zip")),
        &[(&file as &str, name.as_bytes())],
    );
    within(Duration::from_secs(5), &format!("barrier {name}"), || {
        mp.join(&file).exists()
    });
}

#[test]
fn packages_added_removed_replaced_and_renamed_show_within_a_second() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(
        &pkgs.join("a.zip"),
        &[("lib/a.py", b"A1"), ("share/common", b"from a")],
    );
    install(
        &pkgs.join("b.zip"),
        &[("lib/b.py", b"B1"), ("share/common", b"from b")],
    );
    let m = Mount::new(&[&pkgs], &[]);
    let mp = m.path();
    assert_eq!(
        read(&mp.join("share/common")).unwrap(),
        b"from b",
        "later name wins"
    );
    // Warm the kernel caches, including a negative entry for what is not there yet.
    assert!(read(&mp.join("lib/c.py")).is_none());
    let _ = fs::read_dir(mp.join("lib")).unwrap().count();

    // Added by rename (the usual atomic install).
    install(&pkgs.join("c.zip"), &[("lib/c.py", b"C1")]);
    let t = within(SECOND, "added package", || {
        read(&mp.join("lib/c.py")).is_some()
    });
    eprintln!("added: visible after {t:?}");
    assert_eq!(read(&mp.join("lib/c.py")).unwrap(), b"C1");

    // Removing the winner uncovers the next package.
    fs::remove_file(pkgs.join("b.zip")).unwrap();
    within(SECOND, "removed package", || {
        read(&mp.join("lib/b.py")).is_none()
    });
    assert_eq!(read(&mp.join("share/common")).unwrap(), b"from a");

    // Replaced by a new version: new contents, and what the old one had is gone.
    install(
        &pkgs.join("a.zip"),
        &[("lib/a.py", b"A2, longer"), ("share/common", b"a2")],
    );
    within(SECOND, "replaced package", || {
        read(&mp.join("lib/a.py")).as_deref() == Some(&b"A2, longer"[..])
    });
    assert_eq!(fs::metadata(mp.join("lib/a.py")).unwrap().len(), 10);

    // Renamed: same contents, and precedence follows the new name ("0-c" before "a").
    install(&pkgs.join("z.zip"), &[("share/common", b"z")]);
    within(SECOND, "z wins", || {
        read(&mp.join("share/common")).as_deref() == Some(b"z")
    });
    fs::rename(pkgs.join("z.zip"), pkgs.join("0-z.zip")).unwrap();
    within(SECOND, "renamed package loses", || {
        read(&mp.join("share/common")).as_deref() == Some(b"a2")
    });

    // Written in place, slowly: nothing half-written is ever mounted or warned about,
    // and it appears once closed.
    let tmp = dir.path().join("slow.zip");
    write_zip(&tmp, &[("slow/data", &[7u8; 100_000])]);
    let bytes = fs::read(&tmp).unwrap();
    let mut f = fs::File::create(pkgs.join("slow.zip")).unwrap();
    f.write_all(&bytes[..bytes.len() / 2]).unwrap();
    f.flush().unwrap();
    barrier(&pkgs, &mp, "half-written");
    assert!(!mp.join("slow").exists());
    f.write_all(&bytes[bytes.len() / 2..]).unwrap();
    drop(f);
    within(SECOND, "package written in place", || {
        mp.join("slow/data").exists()
    });
    assert!(!m.log_text().contains("skipping"), "{}", m.log_text());

    // A bad archive dropped in is skipped with a warning naming it; nothing else changes.
    fs::write(pkgs.join("broken.zip"), b"PK\x03\x04 this is not a zip").unwrap();
    within(Duration::from_secs(2), "warning about broken.zip", || {
        m.log_text().contains("broken.zip")
    });
    assert_eq!(read(&mp.join("lib/a.py")).unwrap(), b"A2, longer");

    // The final tree is exactly what a fresh look at the directory gives.
    fs::remove_file(pkgs.join("broken.zip")).unwrap();
    barrier(&pkgs, &mp, "broken-removed");
    expect_matches(&mp, &[&pkgs], &[]);
    let log = m.log_text();
    for needle in [
        "activating package",
        "deactivating package",
        "activating new version of package",
        "skipping",
    ] {
        assert!(log.contains(needle), "log lacks {needle:?}:\n{log}");
    }
}

#[test]
fn open_files_keep_their_bytes_and_descriptors_are_released() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("base.zip"), &[("base/file", b"base")]);
    let m = Mount::foreground(&[&pkgs], &[]);
    let mp = m.path();
    let pid = m.server_pid();
    let baseline = open_fds(pid);

    let v1: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let v2: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 253) as u8).collect();
    install(
        &pkgs.join("app.zip"),
        &[("app/big.bin", &v1), ("app/small", b"one")],
    );
    within(SECOND, "v1", || mp.join("app/big.bin").exists());
    let mut f1 = fs::File::open(mp.join("app/big.bin")).unwrap();
    let mut head = vec![0u8; 1_000_000];
    f1.read_exact(&mut head).unwrap();
    assert_eq!(head, v1[..1_000_000]);

    // Replace: the open file keeps reading version 1; a new open gets version 2.
    install(
        &pkgs.join("app.zip"),
        &[("app/big.bin", &v2), ("app/small", b"two")],
    );
    within(SECOND, "v2", || {
        read(&mp.join("app/small")).as_deref() == Some(b"two")
    });
    assert_eq!(read(&mp.join("app/big.bin")).unwrap(), v2);
    let mut f2 = fs::File::open(mp.join("app/big.bin")).unwrap();
    // Remove the package altogether: both open files still read their own version.
    fs::remove_file(pkgs.join("app.zip")).unwrap();
    within(SECOND, "removal", || !mp.join("app").exists());
    let mut rest = Vec::new();
    f1.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, v1[1_000_000..], "the open file kept its bytes");
    let mut all2 = Vec::new();
    f2.read_to_end(&mut all2).unwrap();
    assert_eq!(all2, v2);
    // The daemon still holds the two removed archives open, for those readers.
    assert_eq!(fds_on(pid, &pkgs).len(), 3, "base, app v1 and app v2");

    // Closing them releases the old generations and their descriptors.
    drop(f1);
    drop(f2);
    let fd_list = || {
        fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .collect::<Vec<_>>()
    };
    // The kernel sends the RELEASE of a closed file (and the FORGET of its inode) when
    // it gets to it, not at close: the count is awaited, with room for a loaded machine.
    let start = Instant::now();
    while open_fds(pid) != baseline {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "descriptors: {} now, {baseline} at the start: {:?}",
            open_fds(pid),
            fd_list()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fds_on(pid, &pkgs), [pkgs.join("base.zip")]);
    assert_eq!(read(&mp.join("base/file")).unwrap(), b"base");
}

#[test]
fn readers_never_see_errors_or_partial_packages_while_packages_churn() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    let stable: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("stable/f{i:02}"), vec![i as u8; 1000 + i * 3000]))
        .collect();
    let as_refs = |v: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> { v.to_vec() };
    let files: Vec<(&str, &[u8])> = stable
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    install(&pkgs.join("stable.zip"), &files);
    let version = |v: u8| -> Vec<(String, Vec<u8>)> {
        (0..10)
            .map(|i| (format!("moving/m{i}"), vec![v; 20_000 + i * 100]))
            .collect()
    };
    let put = |name: &str, content: &[(String, Vec<u8>)]| {
        let f: Vec<(&str, &[u8])> = content
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        install(&pkgs.join(name), &f);
    };
    put("moving.zip", &version(1));
    let m = Mount::new(&[&pkgs], &[]);
    let mp = m.path();
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for t in 0..4 {
        let (mp, stop, checks) = (mp.clone(), stop.clone(), checks.clone());
        let stable = as_refs(&stable);
        readers.push(std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // The stable package never flickers.
                let (name, data) = &stable[(n + t) % stable.len()];
                match fs::read(mp.join(name)) {
                    Ok(d) => assert_eq!(&d, data, "{name}"),
                    Err(e) => panic!("reading {name}: {e}"),
                }
                // The replaced package is always whole: one version in every file of a
                // listing, never a mix, never an error, never a partial listing.
                let listing: Vec<_> = fs::read_dir(mp.join("moving"))
                    .unwrap_or_else(|e| panic!("listing moving/: {e}"))
                    .map(|e| e.unwrap().file_name())
                    .collect();
                assert_eq!(listing.len(), 10, "partial package: {listing:?}");
                let f = mp.join(format!("moving/m{}", n % 10));
                let d = fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                assert!(
                    d.len() == 20_000 + (n % 10) * 100 && d.iter().all(|&b| b == d[0]),
                    "torn read of {}",
                    f.display()
                );
                n += 1;
                checks.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // 30 activations, each seen before the next: replace the moving package, add and
    // remove others, while the readers read.
    for round in 0..30u8 {
        put("moving.zip", &version(round + 2));
        let extra = pkgs.join(format!("extra{}.zip", round % 3));
        if extra.exists() {
            fs::remove_file(&extra).unwrap();
        } else {
            install(&extra, &[(&format!("extra/{round}") as &str, b"x")]);
        }
        within(Duration::from_secs(5), "the new version", || {
            read(&mp.join("moving/m0")).is_some_and(|d| d.first() == Some(&(round + 2)))
        });
    }
    // Every reader reads the final state too.
    let before = checks.load(Ordering::Relaxed);
    within(Duration::from_secs(5), "readers on the final state", || {
        checks.load(Ordering::Relaxed) >= before + 40
    });
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader failed");
    }
    assert!(checks.load(Ordering::Relaxed) > 100, "readers barely ran");
    assert_eq!(read(&mp.join("moving/m3")).unwrap(), vec![31u8; 20_300]);
    expect_matches(&mp, &[&pkgs], &[]);
}

#[test]
fn a_burst_of_200_installs_is_batched() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("base.zip"), &[("base", b"b")]);
    let m = Mount::new(&[&pkgs], &[]);
    // Write the packages first, then install them all by rename, as a package manager
    // does after downloading.
    let staging = dir.path().join("staging");
    fs::create_dir(&staging).unwrap();
    for i in 0..200 {
        let data = format!("package {i}");
        write_zip(
            &staging.join(format!("p{i:03}.zip")),
            &[(&format!("pkg{i:03}/data") as &str, data.as_bytes())],
        );
    }
    let start = Instant::now();
    for i in 0..200 {
        let name = format!("p{i:03}.zip");
        fs::rename(staging.join(&name), pkgs.join(&name)).unwrap();
    }
    within(Duration::from_secs(3), "200 packages", || {
        mp_count(&m.path()) == 201
    });
    eprintln!("200 packages visible after {:?}", start.elapsed());
    let activations = crate::common::status_json(&m.path())["activations"]
        .as_u64()
        .unwrap();
    assert!(
        (1..=4).contains(&activations),
        "{activations} activations for one burst"
    );
    assert_eq!(read(&m.path().join("pkg123/data")).unwrap(), b"package 123");
}

fn mp_count(mp: &Path) -> usize {
    fs::read_dir(mp).map_or(0, |d| d.count())
}

#[test]
fn no_watch_mounts_a_fixed_set() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("a.zip"), &[("a", b"a")]);
    let m = Mount::new(&[&pkgs], &["--no-watch"]);
    // No watcher at all: the daemon holds no inotify descriptor, so nothing that happens
    // in the directory can reach the tree.
    let status = crate::common::status_json(&m.path());
    assert_eq!(status["watching"], false);
    let pid = status["pid"].as_u64().unwrap();
    let inotify = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains("inotify"))
        .count();
    assert_eq!(inotify, 0, "a fixed mount watches nothing");
    install(&pkgs.join("b.zip"), &[("b", b"b")]);
    fs::remove_file(pkgs.join("a.zip")).unwrap();
    assert!(!m.path().join("b").exists());
    // The removed package's file is gone from disk, but the fixed mount still has it open.
    assert_eq!(read(&m.path().join("a")).unwrap(), b"a");
    let st = run(pkgfs().arg("status").arg(m.path()));
    assert!(String::from_utf8_lossy(&st.stdout).contains("fixed set"));
}

/// Sets a module parameter for the life of the guard and puts the old value back, even
/// on panic.
struct Param(PathBuf, String);

impl Param {
    fn set(path: &Path, value: &str) -> Param {
        let old = fs::read_to_string(path).unwrap().trim().to_string();
        fs::write(path, value).unwrap();
        Param(path.to_path_buf(), old)
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, &self.1);
    }
}

#[test]
fn status_reports_the_host_settings_a_round_trip_depends_on() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    install(&dir.path().join("a.zip"), &[("x", b"x")]);
    let wake = Path::new("/sys/module/fuse/parameters/wake_here");
    let poll = fs::read_to_string("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    if !wake.exists() {
        // A kernel without the parameter: the report says nothing is known of it.
        let m = Mount::new(&[dir.path()], &[]);
        let status = crate::common::status_json(&m.path());
        assert_eq!(
            status["host"]["guest_halt_poll_ns"].as_u64(),
            poll,
            "{status}"
        );
        assert!(status["host"]["fuse_wake_here"].is_null(), "{status}");
        return;
    }
    for value in ["Y", "N"] {
        let set = Param::set(wake, value);
        let mut m = Mount::new(&[dir.path()], &[]);
        let on = value == "Y";
        // The report reads the setting afresh: flip it under the running mount.
        for now in [on, !on] {
            let _flip = (now != on).then(|| Param::set(wake, if now { "Y" } else { "N" }));
            let status = crate::common::status_json(&m.path());
            assert_eq!(
                status["host"]["fuse_wake_here"].as_bool(),
                Some(now),
                "{status}"
            );
            assert_eq!(
                status["host"]["guest_halt_poll_ns"].as_u64(),
                poll,
                "{status}"
            );
            let text = String::from_utf8(run(pkgfs().arg("status").arg(m.path())).stdout).unwrap();
            let host = &text[text.find("\nhost: ").expect(&text)..];
            let host = host.split("\nrequests:").next().unwrap();
            let state = if now { "on" } else { "off" };
            assert!(host.contains(&format!("fuse.wake_here {state}")), "{host}");
            // The advice comes only while it is off and the guest does not poll.
            let advised = !now && poll.unwrap_or(0) == 0;
            assert_eq!(host.contains("advice: "), advised, "{host}");
            assert_eq!(host.contains("echo Y >"), advised, "{host}");
        }
        // The log names it once, at mount, as the setting was then (the daemon writes
        // it before it waits for the end, so after unmounting the log is complete).
        m.unmount();
        drop(set);
        let log = m.log_text();
        let advised = !on && poll.unwrap_or(0) == 0;
        assert_eq!(
            log.matches("host: each FUSE round trip wakes an idle CPU")
                .count(),
            usize::from(advised),
            "{log}"
        );
    }
}

#[test]
fn status_reports_packages_conflicts_cache_and_requests() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("a.zip"), &[("x", b"from a"), ("only-a", b"1")]);
    install(&pkgs.join("b.zip"), &[("x", &[b'b'; 300_000]), ("y", b"2")]);
    fs::write(pkgs.join("c.zip"), b"PK\x03\x04 broken").unwrap();
    let m = Mount::new(&[&pkgs], &[]);
    assert_eq!(read(&m.path().join("x")).unwrap().len(), 300_000);
    let text = String::from_utf8(run(pkgfs().arg("status").arg(m.path())).stdout).unwrap();
    eprintln!("{text}");
    assert!(text.contains("2 active, 1 skipped"), "{text}");
    let line = |pkg: &str| {
        text.lines()
            .find(|l| l.ends_with(pkg))
            .unwrap_or_else(|| panic!("no line for {pkg}:\n{text}"))
            .split_whitespace()
            .take(3)
            .map(|w| w.parse::<u64>().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(line("a.zip"), [2, 0, 1], "entries, wins, loses");
    assert_eq!(line("b.zip"), [2, 1, 0]);
    assert!(text.contains("skipped") && text.contains("c.zip"), "{text}");
    // The summary first, the table last; --packages asks the daemon for every package
    // (a request of its own on the channel), which for two is the same table.
    assert!(
        text.find("errors: ").unwrap() < text.find("a.zip").unwrap(),
        "{text}"
    );
    let all = String::from_utf8(run(pkgfs().args(["status", "--packages"]).arg(m.path())).stdout)
        .unwrap();
    let table = |t: &str| t[t.find("    entries").unwrap()..].to_string();
    assert_eq!(table(&all), table(&text));
    let both = pkgfs()
        .args(["status", "--packages", "--json"])
        .arg(m.path())
        .output()
        .unwrap();
    assert_eq!(
        both.status.code(),
        Some(2),
        "--json lists every package already"
    );
    let json = run(pkgfs().arg("status").arg("--json").arg(m.path())).stdout;
    let out = Command::new("python3")
        .args([
            "-c",
            "import json,sys; s=json.load(sys.stdin); \
             print(len(s['packages']), s['packages'][1]['conflicts_won'], \
             s['read_bytes'] >= 300000, s['bytes_decompressed'] >= 300000, \
             s['requests']['read'] > 0, s['cache']['misses'] > 0, s['errors'], \
             s['watching'], len(s['skipped']))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(&json)?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "2 1 True True True True 0 True 1",
        "{}",
        String::from_utf8_lossy(&json)
    );
    // Not a pkgfs mount: a clear error.
    let bad = pkgfs().arg("status").arg(dir.path()).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no pkgfs daemon"));
}

/// Installs `/sbin/mount.fuse.pkgfs` (a link to the binary under test) for the life of
/// the guard, as `just install` does.
struct HelperLink(
    PathBuf,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

impl HelperLink {
    fn new() -> HelperLink {
        let lock = crate::common::helper_lock();
        let link = PathBuf::from("/sbin/mount.fuse.pkgfs");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pkgfs"), &link).unwrap();
        HelperLink(link, lock)
    }
}

impl Drop for HelperLink {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn mounted(mp: &Path) -> bool {
    fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == mp.to_str())
}

#[test]
fn mount_and_umount_through_fstab_as_an_admin_does() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    let more = dir.path().join("more.zip");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("a.zip"), &[("etc/a.conf", b"a")]);
    write_zip(&more, &[("etc/more.conf", b"more")]);
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let _link = HelperLink::new();
    let _guard = crate::common::UmountGuard(&mp);
    // The documented fstab line (docs/examples/fstab), pointed at this test's
    // directories, in a private fstab (mount -T).
    let example = fs::read_to_string(crate::common::repo().join("docs/examples/fstab")).unwrap();
    let line = example
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap()
        .replace("/var/lib/pkgs", pkgs.to_str().unwrap())
        .replace("/opt/extra/tools.zip", more.to_str().unwrap())
        .replace("/srv/pkgs", mp.to_str().unwrap())
        .replace(
            "/var/log/pkgfs.log",
            dir.path().join("fstab.log").to_str().unwrap(),
        );
    let fstab = dir.path().join("fstab");
    fs::write(&fstab, format!("{line}\n")).unwrap();
    run(Command::new("mount").arg("-T").arg(&fstab).arg(&mp));
    assert!(mounted(&mp));
    assert_eq!(read(&mp.join("etc/a.conf")).unwrap(), b"a");
    assert_eq!(read(&mp.join("etc/more.conf")).unwrap(), b"more");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == mp.to_str())
        .unwrap();
    assert!(
        line.contains("fuse.pkgfs") && line.contains("ro,"),
        "{line}"
    );
    assert!(line.contains("allow_other"), "{line}");
    // The mount is live: a package installed now shows up.
    install(&pkgs.join("b.zip"), &[("etc/b.conf", b"b")]);
    within(SECOND, "package installed after boot", || {
        mp.join("etc/b.conf").exists()
    });
    let st = String::from_utf8(run(pkgfs().arg("status").arg(&mp)).stdout).unwrap();
    assert!(st.contains("3 active"), "{st}");
    // umount(8), and the daemon goes away with the mount.
    run(Command::new("umount").arg(&mp));
    assert!(!mounted(&mp));
    let gone = within(Duration::from_secs(5), "daemon exit", || {
        pkgfs()
            .arg("status")
            .arg(&mp)
            .output()
            .is_ok_and(|o| !o.status.success())
    });
    eprintln!("daemon gone {gone:?} after umount");
    // The example systemd mount unit, run the way systemd runs it (mount -t TYPE -o
    // OPTIONS WHAT WHERE), with What= and Where= pointed at this test's directories.
    let unit =
        fs::read_to_string(crate::common::repo().join("docs/examples/srv-pkgs.mount")).unwrap();
    let key = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("unit has no {k}="))
            .to_string()
    };
    assert_eq!(key("Type"), "fuse.pkgfs");
    let log = dir.path().join("unit.log");
    let options = key("Options").replace(
        "log_file=/var/log/pkgfs-srv-pkgs.log",
        &format!("log_file={}", log.display()),
    );
    run(Command::new("mount")
        .args(["-t", &key("Type"), "-o", &options])
        .arg(&pkgs)
        .arg(&mp));
    assert_eq!(read(&mp.join("etc/b.conf")).unwrap(), b"b");
    fs::remove_file(pkgs.join("b.zip")).unwrap();
    within(SECOND, "package removed", || {
        !mp.join("etc/b.conf").exists()
    });
    within(SECOND, "activation logged", || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("deactivating package"))
    });
    // systemd itself accepts the unit, where systemd-analyze is available.
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(crate::common::repo().join("docs/examples/srv-pkgs.mount"))
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("systemd-analyze not available ({e}): unit not verified"),
    }
    run(Command::new("umount").arg(&mp));
    assert!(!mounted(&mp));
}

/// Live activation with `--layout each`: a package dropped in appears in its own
/// directory (indexed when entered), a replaced one is a new directory with the new
/// bytes while a file open in the old one keeps reading its own, a removed one goes.
#[test]
fn layout_each_keeps_live_activation() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    install(&pkgs.join("base-1.0.zip"), &[("lib/base", b"base")]);
    let m = Mount::foreground(&[&pkgs], &["--layout", "each"]);
    let mp = m.path();
    assert_eq!(read(&mp.join("base-1.0/lib/base")).unwrap(), b"base");

    let v1: Vec<u8> = (0..2_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    install(
        &pkgs.join("app.zip"),
        &[("big.bin", &v1), ("small", b"one")],
    );
    within(SECOND, "app appears", || mp.join("app").is_dir());
    let listed = |mp: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(mp)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed(&mp), ["app", "base-1.0"]);
    let app_ino = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(mp.join("app")).unwrap().ino()
    };
    let mut f1 = fs::File::open(mp.join("app/big.bin")).unwrap();
    let mut head = vec![0u8; 500_000];
    f1.read_exact(&mut head).unwrap();
    assert_eq!(head, v1[..500_000]);

    install(&pkgs.join("app.zip"), &[("small", b"two")]);
    within(SECOND, "app replaced", || {
        read(&mp.join("app/small")).as_deref() == Some(b"two")
    });
    assert!(
        !mp.join("app/big.bin").exists(),
        "the new version has no big.bin"
    );
    {
        use std::os::unix::fs::MetadataExt;
        assert_ne!(fs::metadata(mp.join("app")).unwrap().ino(), app_ino);
    }
    let mut rest = Vec::new();
    f1.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, v1[500_000..], "the open file kept its bytes");

    fs::remove_file(pkgs.join("app.zip")).unwrap();
    within(SECOND, "app removed", || !mp.join("app").exists());
    assert_eq!(listed(&mp), ["base-1.0"]);
    let st = crate::common::status_json(&mp);
    assert_eq!(st["layout"]["kind"], "each", "{st}");
    assert_eq!(st["layout"]["listed"], 1, "{st}");
}

/// Plain directory entries (issue 37): a names-only walk (`find -printf '%P %y'`) of a
/// cold mount gets most files and symlinks listed plain (no LOOKUP, no inode made), with the
/// same names and types as `unzip`'s extraction and each entry's `d_ino` its `st_ino`;
/// stat-ing the tree afterwards (treecmp: content, mode, size, mtime, symlink targets)
/// equals the extraction and makes listings full; a package replaced afterwards shows
/// its new names and bytes.
#[test]
fn plain_entries_list_walks_as_the_extraction_and_follow_activations() {
    if !crate::common::require_tools(&["zip", "unzip", "find", "python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, pkgs) = (dir.path().join("src"), dir.path().join("pkgs"));
    fs::create_dir_all(&pkgs).unwrap();
    // Everything under `root` that `find`'s `tests` select, at one even second.
    let touch = |root: &Path, tests: &[&str]| {
        run(Command::new("find").arg(root).args(tests).args([
            "-exec",
            "touch",
            "-h",
            "-d",
            "@1700000000",
            "{}",
            "+",
        ]));
    };
    let make = |name: &str, tag: &str| {
        let root = src.join(name).join(tag);
        let _ = fs::remove_dir_all(&root);
        for d in 0..3 {
            let sub = root.join(format!("{name}/d{d}/deeper"));
            fs::create_dir_all(&sub).unwrap();
            for f in 0..12 {
                fs::write(
                    root.join(format!("{name}/d{d}/f{f}-{tag}.txt")),
                    format!("{name} {d} {f} {tag}\n").repeat(f + 1),
                )
                .unwrap();
            }
            fs::write(sub.join("leaf"), format!("leaf {tag}")).unwrap();
            std::os::unix::fs::symlink("../f0-x.txt", sub.join("up")).unwrap();
        }
        // One time, an even second: ZIP's DOS time and its extended timestamp agree.
        touch(&root, &[]);
        let tmp = pkgs.join(format!(".{name}.zip.tmp"));
        run(Command::new("zip")
            .current_dir(&root)
            .args(["-q", "-r", "-y", "-X"])
            .arg(&tmp)
            .arg(name));
        fs::rename(&tmp, pkgs.join(format!("{name}.zip"))).unwrap();
    };
    for p in ["p0", "p1", "p2", "p3"] {
        make(p, "x");
    }
    let extract = |to: &Path| {
        let _ = fs::remove_dir_all(to);
        fs::create_dir_all(to).unwrap();
        let mut zips: Vec<PathBuf> = fs::read_dir(&pkgs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "zip"))
            .collect();
        zips.sort();
        for z in zips {
            run(Command::new("unzip")
                .args(["-q", "-o"])
                .arg(&z)
                .arg("-d")
                .arg(to));
        }
        // unzip leaves symlinks at the time it made them; the archive says 1700000000.
        touch(to, &["-type", "l"]);
    };
    let names = |root: &Path| {
        let out =
            run(Command::new("find")
                .arg(root)
                .args(["-mindepth", "1", "-printf", "%P %y\n"]));
        let mut v: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    let ext = dir.path().join("ext");
    extract(&ext);
    let m = Mount::new(&[&pkgs], &["--prefetch", "0"]);
    let mp = m.path();
    let requests = || crate::common::status_json(&mp)["requests"].clone();

    assert_eq!(names(&mp), names(&ext), "a names-only walk");
    let r = requests();
    let files = names(&ext).iter().filter(|l| !l.ends_with(" d")).count() as u64;
    // Listings go plain after a run of quiet ones (`fs::entries::QUIET_LISTINGS`):
    // most of this walk's files.
    assert!(r["plain_entries"].as_u64().unwrap() * 2 >= files, "{r}");
    assert_eq!(r["lookup"], 0, "a names-only walk looks nothing up: {r}");

    // One stat of a file the walk listed plain (in the last package: the first
    // listings go full): listings go full, and the kernel is told to drop what it keeps
    // of every listing handed out plain, on a thread. A walk that stats then gets full
    // listings, not the plain ones back from the kernel's cache (a LOOKUP a file).
    fs::symlink_metadata(mp.join("p3/d2/f0-x.txt")).unwrap();
    within(
        Duration::from_secs(10),
        "the plain listings are dropped",
        || {
            let r = requests();
            r["plain_relist_queued"].as_u64() > Some(0)
                && r["plain_relisted"] == r["plain_relist_queued"]
        },
    );
    let before = requests()["lookup"].as_u64().unwrap();

    // Every entry's d_ino is the inode stat gives (plain entries included).
    let out = run(Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys\n\
         n = 0\n\
         for d, _, _ in os.walk(sys.argv[1]):\n\
         \x20   for e in os.scandir(d):\n\
         \x20       st = os.lstat(e.path)\n\
         \x20       assert e.inode() == st.st_ino, (e.path, e.inode(), st.st_ino)\n\
         \x20       n += 1\n\
         print(n)\n",
        )
        .arg(&mp));
    let seen: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(seen, names(&ext).len());
    let r = requests();
    assert!(r["plain_switches"].as_u64().unwrap() >= 1);
    assert_eq!(
        r["lookup"].as_u64().unwrap(),
        before,
        "the stat walk after the switch looked nothing up: {r}"
    );
    crate::common::trees_match(&ext, &mp, &["--no-dir-mtime"]);

    // A package replaced: its new names and bytes, listed and stat'ed.
    make("p2", "y");
    extract(&ext);
    within(Duration::from_secs(10), "the new p2 is listed", || {
        names(&mp) == names(&ext)
    });
    crate::common::trees_match(&ext, &mp, &["--no-dir-mtime"]);
}
