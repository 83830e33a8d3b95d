//! Faults while mounted: archives rewritten, truncated or deleted under a live mount, and
//! a daemon killed with SIGKILL. Readers must get EIO or the old bytes, never wrong bytes.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{Mount, pkgfs, require_fuse, run, wait_until};

/// An archive of `n` stored files, `f{i}.bin`, each 64 KiB of byte `i`.
fn stored_archive(path: &Path, n: usize, fill: u8) {
    let mut w = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..n {
        w.start_file(format!("f{i}.bin"), opts).unwrap();
        w.write_all(&vec![fill.wrapping_add(i as u8); 65536])
            .unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn an_archive_changed_under_the_mount_gives_eio_or_old_bytes_never_new_ones() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let arc = dir.path().join("a.zip");
    stored_archive(&arc, 4, 0);
    let m = Mount::new(&[&arc], &[]);
    let mp = m.path();
    assert_eq!(fs::read(mp.join("f0.bin")).unwrap(), vec![0u8; 65536]);

    // Rewrite the same bytes positions with other content, in place (same size).
    let other = dir.path().join("b.zip");
    stored_archive(&other, 4, 100);
    let bytes = fs::read(&other).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&arc)
        .unwrap()
        .write_all(&bytes)
        .unwrap();

    // Already read: the old bytes (page cache). Not yet read: EIO, never the new bytes.
    assert_eq!(fs::read(mp.join("f0.bin")).unwrap(), vec![0u8; 65536]);
    for i in 1..4 {
        match fs::read(mp.join(format!("f{i}.bin"))) {
            Ok(data) => assert_eq!(
                data,
                vec![i as u8; 65536],
                "f{i}: only old bytes may be served"
            ),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "f{i}: {e}"),
        }
    }
    assert!(
        m.log_text().contains("changed while mounted"),
        "{}",
        m.log_text()
    );
}

#[test]
fn truncated_or_deleted_archives_do_not_take_the_mount_down() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    stored_archive(&pkgs.join("a.zip"), 4, 0);
    let mut w = zip::ZipWriter::new(fs::File::create(pkgs.join("b.zip")).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("b.bin", opts).unwrap();
    w.write_all(&[7u8; 100_000]).unwrap();
    w.finish().unwrap();

    let m = Mount::new(&[&pkgs], &[]);
    let mp = m.path();
    // Deleted: the daemon holds the file open, so the old bytes are still served.
    fs::remove_file(pkgs.join("b.zip")).unwrap();
    assert_eq!(fs::read(mp.join("b.bin")).unwrap(), vec![7u8; 100_000]);
    // Truncated: EIO for what is gone; the rest of the mount keeps working.
    fs::OpenOptions::new()
        .write(true)
        .open(pkgs.join("a.zip"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    let e = fs::read(mp.join("f3.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(fs::read_dir(&mp).unwrap().count(), 5);
    assert_eq!(fs::read(mp.join("b.bin")).unwrap().len(), 100_000);
}

/// A foreground mount of a two-file stored archive made in `dir`; returns the archive too.
fn stored_mount(dir: &Path) -> (std::path::PathBuf, Mount) {
    let arc = dir.join("a.zip");
    stored_archive(&arc, 2, 0);
    let m = Mount::foreground(&[&arc], &[]);
    (arc, m)
}

/// SIGKILL a foreground mount's daemon (its keeper, whose server dies with it) and wait
/// until both are gone.
fn kill_daemon(m: &mut Mount) {
    let server = m.server_pid();
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        Duration::from_secs(10),
        "the server outlived its keeper",
        || crate::common::process_ended(server),
    );
}

crate::on_both_transports! {
    fn requests_in_flight_when_the_daemon_is_killed_fail_instead_of_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut m) = stored_mount(dir.path());
        let mp = m.path();
        // A reader that keeps requests flowing: every name is new, so every stat is a
        // LOOKUP the daemon must answer. It stops at the first error other than ENOENT.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let reader = {
            let (mp, done) = (mp.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0u64.. {
                    match fs::metadata(mp.join(format!("missing-{i}"))) {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return (i, e.raw_os_error()),
                        Ok(_) => panic!("missing-{i} exists"),
                    }
                    done.store(i + 1, std::sync::atomic::Ordering::Relaxed);
                }
                unreachable!()
            })
        };
        // Killed while requests flow: after the reader's first hundred.
        wait_until(Duration::from_secs(10), "the reader never got going", || {
            done.load(std::sync::atomic::Ordering::Relaxed) > 100
        });
        kill_daemon(&mut m);
        wait_until(
            Duration::from_secs(10),
            "a reader hangs on a dead daemon",
            || reader.is_finished(),
        );
        let (lookups, errno) = reader.join().unwrap();
        assert!(lookups > 100, "the reader was running: {lookups} lookups");
        assert!(
            matches!(
                errno,
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
            ),
            "{errno:?}"
        );
        run(pkgfs().arg("umount").arg(&mp));
    }
}

crate::on_both_transports! {
    fn a_killed_daemon_is_cleaned_up_by_umount_and_by_the_next_mount() {
        let dir = tempfile::tempdir().unwrap();
        let (arc, mut m) = stored_mount(dir.path());
        let mp = m.path();
        kill_daemon(&mut m);
        // A dead FUSE mount. With io_uring, requests made while the kernel is still tearing
        // the dead daemon's rings down end with ECONNABORTED or ECANCELED; within
        // milliseconds every request gets ENOTCONN.
        let start = Instant::now();
        loop {
            let e = fs::metadata(mp.join("never-looked-up")).unwrap_err();
            match e.raw_os_error() {
                Some(libc::ENOTCONN) => break,
                Some(libc::ECONNABORTED | libc::ECANCELED)
                    if crate::common::transport() == crate::common::Transport::IoUring
                        && start.elapsed() < Duration::from_secs(2) => {}
                _ => panic!("a dead FUSE mount: {e}"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }

        // A new mount on the same mountpoint clears the dead one first.
        run(pkgfs()
            .arg("mount")
            .arg(&arc)
            .arg(&mp)
            .args(crate::common::transport_args()));
        crate::common::expect_transport(&mp);
        assert_eq!(fs::read(mp.join("f1.bin")).unwrap(), vec![1u8; 65536]);
        // A live mount is not mounted over.
        let again = pkgfs().arg("mount").arg(&arc).arg(&mp).output().unwrap();
        assert!(!again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("already a FUSE mount"));
        run(pkgfs().arg("umount").arg(&mp));

        // And `pkgfs umount` cleans a dead mount too.
        let mut m2 = Mount::foreground(&[&arc], &[]);
        let mp2 = m2.path();
        kill_daemon(&mut m2);
        run(pkgfs().arg("umount").arg(&mp2));
        wait_until(Duration::from_secs(5), "dead mount not removed", || {
            !m2.is_mounted()
        });
        assert!(
            fs::read_dir(&mp2).unwrap().next().is_none(),
            "the plain directory again"
        );
    }
}

#[test]
fn thousands_of_archives_mount_under_a_low_descriptor_limit() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    for i in 0..1000 {
        let mut w =
            zip::ZipWriter::new(fs::File::create(pkgs.join(format!("p{i:04}.zip"))).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        w.start_file(format!("d{}/f{i}.txt", i % 10), opts).unwrap();
        w.write_all(format!("file {i}\n").repeat(i % 50 + 1).as_bytes())
            .unwrap();
        w.finish().unwrap();
    }
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let mut cmd = pkgfs();
    cmd.args(["mount", "-f"]).arg(&pkgs).arg(&mp);
    // SAFETY: setrlimit in the child before exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let lim = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let _g = crate::common::UmountGuard(&mp);
    let start = Instant::now();
    while fs::read_dir(&mp).map(|d| d.count()).unwrap_or(0) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "mount did not appear"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every file of every archive reads back, twice (descriptors are recycled).
    for round in 0..2 {
        for i in (0..1000).rev() {
            let p = mp.join(format!("d{}/f{i}.txt", i % 10));
            let want = format!("file {i}\n").repeat(i % 50 + 1);
            assert_eq!(
                fs::read_to_string(&p).unwrap(),
                want,
                "round {round}, {}",
                p.display()
            );
        }
    }
    // The server's descriptors (it inherits the keeper's limit).
    let server = crate::common::status_json(&mp)["server_pid"].clone();
    let fds = fs::read_dir(format!("/proc/{server}/fd")).unwrap().count();
    assert!(fds <= 64, "{fds} descriptors open");
    run(pkgfs().arg("umount").arg(&mp));
    assert!(child.wait().unwrap().success());
}
