//! Mount tests: real FUSE mounts of archives written by real tools, compared with an
//! independent model (Python's `zipfile`, `unzip`) byte for byte and attribute by
//! attribute. Every mount is made through the `pkgfs` binary, as a user would, and is
//! unmounted by a guard even when a test fails.

mod common;
mod faults;
mod images;
mod live;
mod pack;
mod packaging;
mod prefetch;
mod registry;
mod remote;
mod restart;
mod snapshotter;
mod targz;
mod verify;

use std::collections::HashMap;
use std::fs;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{Mount, expect_matches, fixtures, large_fixtures, pkgfs, require_fuse, run};

fn set(name: &str) -> PathBuf {
    fixtures().join(name)
}

on_both_transports! {
    fn basic_archives_from_zip_and_python_match_the_model() {
        let src = set("basic");
        let m = Mount::new(&[&src], &[]);
        expect_matches(&m.path(), &[&src], &[]);
        expect_matches(&m.path(), &[&src], &["--unzip-check"]);
        // README.txt in the package directory is not an archive: ignored, not mounted.
        assert!(src.join("README.txt").exists());
        assert!(!m.log_text().contains("README.txt") || !m.path().join("README.txt").exists());
    }
}

on_both_transports! {
    fn empty_archive_and_zip64_with_70000_entries() {
        for name in ["empty", "zip64-many"] {
            let src = set(name);
            let m = Mount::new(&[&src], &[]);
            expect_matches(&m.path(), &[&src], &[]);
        }
    }
}

on_both_transports! {
    fn merge_conflicts_follow_the_documented_rule() {
        let src = set("conflicts");
        let m = Mount::new(&[&src], &[]);
        expect_matches(&m.path(), &[&src], &[]);
        assert!(
            m.stderr.contains("path conflicts"),
            "conflicts are logged once at mount: {}",
            m.stderr
        );
        // `pkgfs check` lists each conflict.
        let out = pkgfs().arg("check").arg(&src).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines().filter(|l| l.starts_with("conflict: ")).count() >= 3,
            "{text}"
        );
    }
}

#[test]
fn sources_given_as_files_layer_in_command_line_order() {
    if !require_fuse() {
        return;
    }
    let dir = set("conflicts");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.reverse(); // opposite of the directory order: the first archive now wins
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let m = Mount::new(&refs, &[]);
    expect_matches(&m.path(), &refs, &[]);
}

on_both_transports! {
    fn corrupt_members_read_as_eio_and_bad_archives_are_skipped() {
        let src = set("corrupt");
        let m = Mount::new(&[&src], &[]);
        expect_matches(&m.path(), &[&src], &[]);
        for bad in ["truncated.zip", "garbage.zip"] {
            assert!(
                m.stderr.contains(bad),
                "a skipped archive is named in a warning: {bad}\n{}",
                m.stderr
            );
        }
        // The daemon logged why reads failed, naming the archive.
        let log = m.log_text();
        assert!(
            log.contains("badcrc.zip") && log.contains("CRC"),
            "log:\n{log}"
        );
        // `pkgfs check` finds the same problems and fails.
        let out = pkgfs().arg("check").arg(&src).output().unwrap();
        assert!(!out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("truncated.zip") && text.contains("CRC"),
            "{text}"
        );
    }
}

/// A second mount of the same packages loads the tree the first one kept: the tree
/// and every byte are the model's again, bad archives and hostile entries are still
/// named, and no package's index is read until a file of it is.
#[test]
fn a_kept_tree_serves_what_the_fold_served() {
    if !require_fuse() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for name in ["basic", "conflicts", "corrupt", "unsafe"] {
        let src = set(name);
        let cache = tmp.path().join(name);
        let args = ["--index-cache", cache.to_str().unwrap()];
        let indexes = |m: &Mount| -> Vec<String> {
            common::status_json(&m.path())["packages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["index"].as_str().unwrap().to_string())
                .collect()
        };
        let first = Mount::new(&[&src], &args);
        let folded = indexes(&first);
        assert!(
            !folded.is_empty() && !folded.iter().any(|i| i == "kept"),
            "{name}: {folded:?}"
        );
        drop(first);
        let m = Mount::new(&[&src], &args);
        assert_eq!(indexes(&m), vec!["kept"; folded.len()], "{name}");
        expect_matches(&m.path(), &[&src], &[]);
        match name {
            "corrupt" => {
                for bad in ["truncated.zip", "garbage.zip"] {
                    assert!(m.stderr.contains(bad), "{bad}: {}", m.stderr);
                }
                let log = m.log_text();
                assert!(log.contains("badcrc.zip") && log.contains("CRC"), "{log}");
            }
            "unsafe" => assert!(m.stderr.contains("skipping entry"), "{}", m.stderr),
            "conflicts" => assert!(m.stderr.contains("path conflicts"), "{}", m.stderr),
            _ => {}
        }
        // Folded again with --no-kept-tree: the same tree.
        drop(m);
        let again = Mount::new(&[&src], &[&args[..], &["--no-kept-tree"]].concat());
        assert_eq!(indexes(&again), folded, "{name}");
        expect_matches(&again.path(), &[&src], &[]);
    }
}

on_both_transports! {
    fn hostile_paths_never_escape_the_mount() {
        let src = set("unsafe");
        let m = Mount::new(&[&src], &[]);
        expect_matches(&m.path(), &[&src], &[]);
        let top = m.path().parent().unwrap().to_path_buf();
        for name in ["escape.txt", "escape2.txt", "abs", "drive.txt", "nul"] {
            assert!(
                !top.join(name).exists(),
                "{name} appeared outside the mount"
            );
            assert!(
                !m.path().join(name).exists(),
                "{name} must be skipped, not confined"
            );
        }
        assert!(m.stderr.contains("skipping entry"), "{}", m.stderr);
    }
}

#[test]
fn a_member_over_4_gib_reads_back_whole() {
    if !require_fuse() {
        return;
    }
    let src = large_fixtures().join("large");
    let m = Mount::new(&[&src], &[]);
    // The model hashes every byte of the 4 GiB member through the mount and through
    // Python's zipfile.
    expect_matches(&m.path(), &[&src], &[]);
    // A read near the end decodes forward without error.
    let f = fs::File::open(m.path().join("zeros.bin")).unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len > 4 << 30);
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, len - 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

/// Extract every layer of `src` with Info-ZIP `unzip`, later layers overwriting.
fn unzip_layers(src: &Path, out: &Path) {
    let mut layers: Vec<PathBuf> = fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "zip" || e == "jar"))
        .collect();
    layers.sort();
    for l in layers {
        run(Command::new("unzip")
            .arg("-o")
            .arg("-q")
            .arg(&l)
            .arg("-d")
            .arg(out));
    }
}

on_both_transports! {
    fn concurrent_random_reads_return_the_right_bytes() {
        let src = set("basic");
        let m = Mount::new(&[&src], &["--threads", "4", "--cache-size", "2M"]);
        let ref_dir = tempfile::tempdir().unwrap();
        unzip_layers(&src, ref_dir.path());
        let mut files = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for e in fs::read_dir(ref_dir.path().join(&rel)).unwrap() {
                let e = e.unwrap();
                let t = e.file_type().unwrap();
                let r = rel.join(e.file_name());
                if t.is_dir() {
                    stack.push(r);
                } else if t.is_file() {
                    files.push(r);
                }
            }
        }
        assert!(files.len() > 20);
        let expected: Arc<HashMap<PathBuf, Vec<u8>>> = Arc::new(
            files
                .iter()
                .map(|f| (f.clone(), fs::read(ref_dir.path().join(f)).unwrap()))
                .collect(),
        );
        let files = Arc::new(files);
        let mp = m.path();
        let threads: Vec<_> = (0..12u64)
            .map(|t| {
                let (files, expected, mp) = (files.clone(), expected.clone(), mp.clone());
                std::thread::spawn(move || {
                    let mut rng = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut checked = 0u64;
                    for _ in 0..400 {
                        let f = &files[(next() % files.len() as u64) as usize];
                        let want = &expected[f];
                        let file = fs::File::open(mp.join(f)).unwrap();
                        let off = if want.is_empty() {
                            0
                        } else {
                            next() % want.len() as u64
                        };
                        let len = (next() % 300_000) as usize;
                        let mut buf = vec![0u8; len];
                        let mut got = 0;
                        while got < len {
                            let n = file.read_at(&mut buf[got..], off + got as u64).unwrap();
                            if n == 0 {
                                break;
                            }
                            got += n;
                        }
                        let end = (off as usize + len).min(want.len());
                        assert_eq!(
                            &buf[..got],
                            &want[off as usize..end],
                            "{f:?} at {off}+{len}"
                        );
                        checked += got as u64;
                    }
                    checked
                })
            })
            .collect();
        let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(total > 10 << 20, "read {total} bytes");
    }
}

on_both_transports! {
    fn zstd_members_written_by_the_zip_crate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zstd.zip");
        let mut contents = Vec::new();
        {
            let mut w = zip::ZipWriter::new(fs::File::create(&path).unwrap());
            let zstd = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Zstd)
                .unix_permissions(0o640);
            for (i, size) in [0usize, 1, 1000, 262_144, 262_145, 3_000_000]
                .into_iter()
                .enumerate()
            {
                let data: Vec<u8> = (0..size).map(|j| ((j * 7 + i) % 251) as u8).collect();
                let name = format!("z/{i}.bin");
                w.start_file(&name, zstd).unwrap();
                std::io::Write::write_all(&mut w, &data).unwrap();
                contents.push((name, data));
            }
            w.finish().unwrap();
        }
        let m = Mount::new(&[&path], &[]);
        for (name, data) in &contents {
            let p = m.path().join(name);
            assert_eq!(&fs::read(&p).unwrap(), data, "{name}");
            assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        }
        // Backwards seeks inside a multi-block member restart cleanly.
        let mut f = fs::File::open(m.path().join("z/5.bin")).unwrap();
        let mut buf = [0u8; 100];
        for off in [2_900_000u64, 10, 1_000_000, 262_100] {
            f.seek(SeekFrom::Start(off)).unwrap();
            f.read_exact(&mut buf).unwrap();
            assert_eq!(&buf[..], &contents[5].1[off as usize..off as usize + 100]);
        }
    }
}

on_both_transports! {
    fn every_write_is_refused_with_erofs() {
        let src = set("basic");
        let m = Mount::new(&[&src], &[]);
        let mp = m.path();
        let a_file = walk_first_file(&mp);
        let erofs = |r: std::io::Result<()>, what: &str| {
            let e = r.expect_err(what);
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
        };
        erofs(fs::write(mp.join("new.txt"), b"x"), "create");
        erofs(fs::create_dir(mp.join("newdir")), "mkdir");
        erofs(fs::remove_file(&a_file), "unlink");
        erofs(fs::rename(&a_file, mp.join("moved")), "rename");
        erofs(
            fs::OpenOptions::new().write(true).open(&a_file).map(|_| ()),
            "open for writing",
        );
        erofs(
            fs::set_permissions(&a_file, std::os::unix::fs::PermissionsExt::from_mode(0o777)),
            "chmod",
        );
        erofs(std::os::unix::fs::symlink("x", mp.join("sym")), "symlink");
    }
}

fn walk_first_file(dir: &Path) -> PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_file() {
                return e.path();
            }
            if t.is_dir() {
                stack.push(e.path());
            }
        }
    }
    panic!("no file under {}", dir.display())
}

on_both_transports! {
    fn a_panicking_handler_answers_eio_and_the_mount_lives_on() {
        let src = set("basic");
        // One worker thread: if the panic killed it, every later request would hang.
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("mnt");
        fs::create_dir(&mp).unwrap();
        let mut child = pkgfs()
            .args(["mount", "-f", "--threads", "1"])
            .arg(&src)
            .arg(&mp)
            .args(common::transport_args())
            .env(pkgfs::transport::ops::PANIC_ENV, "boom")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let _g = crate::common::UmountGuard(&mp);
        let start = std::time::Instant::now();
        while fs::read_dir(&mp).map(|d| d.count()).unwrap_or(0) == 0 {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(20));
        }
        common::expect_transport(&mp);
        for _ in 0..3 {
            let e = fs::metadata(mp.join("boom")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        assert!(
            fs::read_dir(&mp).unwrap().count() > 0,
            "the mount still answers"
        );
        run(pkgfs().arg("umount").arg(&mp));
        assert!(child.wait().unwrap().success());
    }
}

/// Once INIT agrees to FUSE over io_uring, the kernel holds every request back until
/// each CPU's queue has an entry: a queue that cannot be set up must turn io_uring off
/// (and the mount serve `/dev/fuse`), not leave every reader waiting.
#[test]
fn a_ring_queue_that_cannot_be_set_up_falls_back_to_dev_fuse() {
    common::with_transport(common::Transport::IoUring, || {
        let src = set("basic");
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("mnt");
        fs::create_dir(&mp).unwrap();
        let log = dir.path().join("log");
        let child = pkgfs()
            .args(["mount", "-f", "--io-uring", "auto", "--no-keeper"])
            .arg(&src)
            .arg(&mp)
            .env(pkgfs::transport::uring::FAULT_QUEUE_ENV, "0")
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Dropped in reverse: the mount is detached, then the daemon killed (which also
        // ends a reader left waiting).
        let _daemon = common::KillOnDrop(child);
        let _g = crate::common::UmountGuard(&mp);
        common::wait_until(Duration::from_secs(20), "the mount appears", || {
            common::is_mountpoint(&mp)
        });
        // Listed on another thread: with the fault unhandled this waits forever.
        let (tx, rx) = std::sync::mpsc::channel();
        let m = mp.clone();
        std::thread::spawn(move || {
            let _ = tx.send(fs::read_dir(&m).map(|d| d.count()));
        });
        let listed = rx.recv_timeout(Duration::from_secs(20));
        let log_text = || fs::read_to_string(&log).unwrap_or_default();
        assert!(
            matches!(listed, Ok(Ok(n)) if n > 0),
            "the mount answers: {listed:?}\n{}",
            log_text()
        );
        expect_matches(&mp, &[&src], &[]);
        // Status says which transport serves, and the log why.
        let out = run(pkgfs().arg("status").arg(&mp));
        let status = String::from_utf8_lossy(&out.stdout);
        assert!(status.contains("transport: /dev/fuse;"), "{status}");
        let text = log_text();
        assert!(text.contains("turning io_uring off"), "{text}");
    });
}

on_both_transports! {
    fn sigterm_unmounts_a_foreground_mount_cleanly() {
        let src = set("basic");
        let mut m = Mount::foreground(&[&src], &[]);
        let child = m.child.as_mut().unwrap();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        m.child = None;
        assert!(status.success(), "{status}");
        assert!(!m.is_mounted(), "SIGTERM must unmount");
    }
}

on_both_transports! {
    fn a_busy_mount_is_detached_lazily() {
        let src = set("basic");
        let mut m = Mount::foreground(&[&src], &[]);
        let busy = fs::File::open(walk_first_file(&m.path())).unwrap();
        let out = pkgfs().arg("umount").arg(m.path()).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("lazily"));
        assert!(!m.is_mounted());
        // The open file still reads; the daemon exits once it is closed.
        let mut byte = [0u8; 1];
        busy.read_at(&mut byte, 0)
            .expect("a file open across the detach still reads");
        drop(busy);
        let child = m.child.as_mut().unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "daemon did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m.child = None;
    }
}

#[test]
fn umount_refuses_what_is_not_a_fuse_mount() {
    let out = pkgfs().args(["umount", "/"]).output().unwrap();
    assert!(!out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let out = pkgfs().arg("umount").arg(dir.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted"));
}

/// One mistake, one line: what is wrong, the path it is about and the fix, once; the
/// exit status 1 (2 is for usage errors).
#[test]
fn mount_fails_clearly_on_a_missing_source_or_mountpoint() {
    let dir = tempfile::tempdir().unwrap();
    let one_line = |out: &std::process::Output, want: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(lines.len(), 1, "one line wanted: {err}");
        for w in want {
            assert!(lines[0].contains(w), "{w:?} not in {err}");
        }
    };
    let missing = dir.path().join("nope.zip");
    let out = pkgfs()
        .arg("mount")
        .arg(&missing)
        .arg(dir.path())
        .output()
        .unwrap();
    one_line(&out, &[&missing.display().to_string(), "no such file"]);
    let mountpoint = dir.path().join("no-such-mountpoint");
    let out = pkgfs()
        .arg("mount")
        .arg(set("basic"))
        .arg(&mountpoint)
        .output()
        .unwrap();
    one_line(
        &out,
        &[&mountpoint.display().to_string(), "not a directory"],
    );
    // Found by the background daemon, not before it starts: still one line, its own.
    let image = format!("oci:{}:latest", dir.path().join("no-image").display());
    let out = pkgfs()
        .arg("mount")
        .arg(&image)
        .arg(dir.path())
        .output()
        .unwrap();
    one_line(&out, &["no-image"]);
}

on_both_transports! {
    /// The first user of the mission: a directory of wheels mounted as site-packages.
    /// `import_check.py` imports from the mount with no other site-packages, and checks
    /// every file against the hash its wheel's RECORD gives, as `importlib.metadata`
    /// reads it.
    fn python_imports_from_a_mount_of_real_wheels() {
        let wheels = common::real_wheels();
        let m = Mount::new(&[&wheels], &[]);
        let out = run(Command::new("python3")
            .args(["-I", "-S"])
            .arg(common::repo().join("mount-tests/import_check.py"))
            .arg(m.path())
            .arg(&wheels));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.starts_with("ok: 5 distributions"), "{said}");
        // Every wheel's top-level entries are there, side by side.
        for name in ["attr", "attrs", "certifi", "idna", "packaging", "six.py"] {
            assert!(m.path().join(name).exists(), "{name}");
        }
    }
}

#[test]
fn mount_refuses_to_hide_its_own_sources() {
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    std::fs::create_dir(&pkgs).unwrap();
    std::fs::copy(
        common::repo().join("images/10-hello.zip"),
        pkgs.join("base.zip"),
    )
    .unwrap();
    // The source is the mountpoint; a source inside it (an archive named directly).
    for (source, mountpoint) in [
        (pkgs.clone(), pkgs.clone()),
        (pkgs.join("base.zip"), dir.path().to_path_buf()),
    ] {
        let out = pkgfs()
            .arg("mount")
            .arg(&source)
            .arg(&mountpoint)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            let _ = pkgfs().arg("umount").arg(&mountpoint).output();
        }
        assert!(!out.status.success(), "{}: {err}", source.display());
        assert!(err.contains("the mount would hide it"), "{err}");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(
            !mounts.contains(mountpoint.to_str().unwrap()),
            "left mounted"
        );
    }
}

on_both_transports! {
    fn statfs_and_negative_lookups() {
        let src = set("basic");
        let m = Mount::new(&[&src], &[]);
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(m.path().to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        let listing = pkgfs().arg("ls").arg(&src).output().unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout);
        let entries = listing.lines().count() as u64;
        let bytes: u64 = listing
            .lines()
            .filter(|l| l.starts_with('-') || l.starts_with('l'))
            .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(st.f_files, entries + 1, "inodes = entries + root");
        assert_eq!(st.f_blocks, bytes.div_ceil(4096));
        assert_eq!(st.f_namemax, 255);
        for _ in 0..3 {
            let e = fs::metadata(m.path().join("definitely-missing")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound);
        }
        // An ioctl (here Python's isatty check on open) is refused with ENOTTY, quietly:
        // the daemon's log does not grow a line per opened file.
        let file = walk_first_file(&m.path());
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys; f = open(sys.argv[1], 'rb'); print(f.isatty(), len(f.read()) >= 0)",
            ])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "False True");
        assert!(
            !m.log_text().contains("Not Implemented"),
            "{}",
            m.log_text()
        );
    }
}

/// The first number after `key` on its line of `/proc/PID/FILE`.
fn proc_number(pid: u32, file: &str, key: &str) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/{file}"))
        .parse()
        .unwrap()
}

#[test]
fn mounting_600_archives_reads_only_their_indexes() {
    if !require_fuse() {
        return;
    }
    // 600 packages of 200 KiB of stored data each: 120 MB of data, small indexes.
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    let mut total = 0u64;
    for i in 0..600 {
        let path = pkgs.join(format!("pkg{i:03}.zip"));
        let mut w = zip::ZipWriter::new(fs::File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for j in 0..4 {
            w.start_file(format!("pkg{i:03}/file{j}.bin"), opts)
                .unwrap();
            std::io::Write::write_all(&mut w, &vec![(i + j) as u8; 50 * 1024]).unwrap();
        }
        w.finish().unwrap();
        total += fs::metadata(&path).unwrap().len();
    }
    let m = Mount::foreground(&[&pkgs], &[]);
    let pid = m.server_pid();
    // The server's descriptor table was grown before its threads started (each growth
    // after waits an RCU grace period: io::blob::reserve_descriptor_slots), so it holds
    // a descriptor for each of the 600 packages without growing.
    let slots = proc_number(pid, "status", "FDSize:");
    let soft = proc_number(pid, "limits", "Max open files");
    let want = pkgfs::io::blob::RESERVED_SLOTS as u64;
    let want = want.min(soft);
    assert!(
        slots >= want,
        "the server's table has {slots} slots, not {want}"
    );
    let rchar = proc_number(pid, "io", "rchar:");
    // Each archive costs one read of its last 16 KiB (end record and, for archives this
    // small, the whole central directory): about 8% of these 200 KiB packages.
    assert!(
        rchar < total / 8,
        "mounting read {rchar} bytes of {total}: more than the indexes"
    );
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 600);
    let f = fs::read(m.path().join("pkg599/file3.bin")).unwrap();
    assert_eq!(f, vec![(599 + 3) as u8; 50 * 1024]);
}

on_both_transports! {
    fn uid_and_gid_overrides_apply_to_every_entry() {
        let src = set("conflicts");
        let m = Mount::new(&[&src], &["--uid", "4321", "-o", "gid=8765"]);
        let mut stack = vec![m.path()];
        let mut seen = 0;
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let md = fs::symlink_metadata(e.path()).unwrap();
                assert_eq!((md.uid(), md.gid()), (4321, 8765), "{:?}", e.path());
                seen += 1;
                if md.is_dir() {
                    stack.push(e.path());
                }
            }
        }
        assert!(seen > 5);
    }
}

on_both_transports! {
    fn hostile_archives_from_the_catalogue() {
        let src = set("hostile");
        let m = Mount::new(&[&src], &[]);
        expect_matches(&m.path(), &[&src], &[]);
        let mp = m.path();
        // Garbage before the archive: found past the stub.
        assert!(
            fs::read(mp.join("sfx/inside.txt"))
                .unwrap()
                .starts_with(b"found past the stub")
        );
        // 100,000 entries with one name: one file, the last copy.
        assert_eq!(fs::read(mp.join("dup/same.txt")).unwrap(), b"copy 99999\n");
        // Symlink loops are served verbatim; the kernel reports the loop.
        let e = fs::metadata(mp.join("loop/a")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        // A 1000-level path reads; a 256-byte name was skipped with a warning.
        let deep = mp.join(format!("deep/{}leaf.txt", "d/".repeat(1000)));
        assert_eq!(fs::read(deep).unwrap(), b"deep leaf\n");
        assert!(m.stderr.contains("longer than 255"), "{}", m.stderr);
        // Sizes that lie: listed with the lie, read as EIO; the mount lives on.
        let liar = mp.join("b64/liar.txt");
        assert_eq!(fs::metadata(&liar).unwrap().len(), u32::MAX as u64);
        assert_eq!(fs::read(&liar).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(fs::read(mp.join("b64/fine.txt")).unwrap(), b"fine\n");
        // Overlapping entries: the one whose local header names another file is refused.
        assert_eq!(
            fs::read(mp.join("ovl/other.txt"))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(
            fs::read(mp.join("ovl/first.txt")).unwrap(),
            b"first\n".repeat(100)
        );
    }
}

#[test]
fn reading_a_4_gib_bomb_keeps_memory_within_the_cache_budget() {
    if !require_fuse() {
        return;
    }
    let src = large_fixtures().join("large");
    let m = Mount::foreground(&[&src], &["--cache-size", "16M"]);
    let pid = m.server_pid();
    let mut f = fs::File::open(m.path().join("zeros.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..768 {
        f.read_exact(&mut buf).unwrap();
    }
    assert!(buf.iter().all(|&b| b == 0));
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("server {pid}: {e}; the mount's log:\n{}", m.log_text()));
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap();
    assert!(
        rss_kb < 120 * 1024,
        "daemon RSS {rss_kb} kB after 768 MiB of a 4 GiB member"
    );
}

/// Peak resident memory of a process, in KiB.
fn peak_rss_kb(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap()
}

#[test]
fn stress_many_threads_random_ranges_for_a_bounded_time() {
    if !require_fuse() {
        return;
    }
    // It drops the page cache every 200 ms.
    let _page_cache = crate::common::page_cache_dropped();
    // ZIP layers of every kind plus a seekable package of the same tree.
    let src = set("basic");
    let ref_dir = tempfile::tempdir().unwrap();
    unzip_layers(&src, ref_dir.path());
    let pkg_dir = tempfile::tempdir().unwrap();
    let pkg = pkg_dir.path().join("zz-package.tar.zst");
    run(pkgfs()
        .arg("pack")
        .arg(ref_dir.path().join("deflate-pkg"))
        .arg("-o")
        .arg(&pkg)
        .args(["--frame-size", "64K"]));
    let m = Mount::foreground(&[&src, &pkg], &["--cache-size", "8M", "--threads", "4"]);
    let pid = m.server_pid();

    // Expected bytes: the unzip extraction (the package's files sit at the root).
    let mut expected: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(ref_dir.path().join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(r);
            } else if t.is_file() {
                let data = fs::read(e.path()).unwrap();
                if let Ok(inner) = r.strip_prefix("deflate-pkg") {
                    expected.push((inner.to_path_buf(), data.clone()));
                }
                expected.push((r, data));
            }
        }
    }
    let expected = Arc::new(expected);
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    let mp = m.path();
    let workers: Vec<_> = (0..16u64)
        .map(|t| {
            let (expected, mp) = (expected.clone(), mp.clone());
            std::thread::spawn(move || {
                let mut rng = (t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let (mut bytes, mut errors, mut reads) = (0u64, 0u64, 0u64);
                while std::time::Instant::now() < deadline {
                    let (path, want) = &expected[(next() % expected.len() as u64) as usize];
                    let Ok(f) = fs::File::open(mp.join(path)) else {
                        errors += 1;
                        continue;
                    };
                    let off = if want.is_empty() {
                        0
                    } else {
                        next() % want.len() as u64
                    };
                    let mut buf = vec![0u8; (next() % 200_000) as usize];
                    match f.read_at(&mut buf, off) {
                        Ok(n)
                            if buf[..n]
                                == want[off as usize..(off as usize + n).min(want.len())] =>
                        {
                            bytes += n as u64;
                        }
                        _ => errors += 1,
                    }
                    reads += 1;
                }
                (bytes, errors, reads)
            })
        })
        .collect();
    // Keep the daemon busy: drop the kernel's page cache every 200 ms, so reads keep
    // reaching pkgfs instead of being served from cached pages.
    let dropper = std::thread::spawn(move || {
        while std::time::Instant::now() < deadline {
            let _ = fs::write("/proc/sys/vm/drop_caches", "1");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let (mut bytes, mut errors, mut reads) = (0, 0, 0);
    dropper.join().unwrap();
    for w in workers {
        let (b, e, r) = w.join().unwrap();
        bytes += b;
        errors += e;
        reads += r;
    }
    let rss = peak_rss_kb(pid);
    eprintln!(
        "stress: {reads} reads, {:.1} MB/s, {errors} errors, daemon peak RSS {} MiB",
        bytes as f64 / 8.0 / 1e6,
        rss / 1024
    );
    assert_eq!(errors, 0);
    assert!(reads > 1000, "only {reads} reads");
    assert!(rss < 200 * 1024, "peak RSS {rss} kB with an 8 MiB cache");
}
mod layouts;
mod python;
