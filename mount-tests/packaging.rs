//! pkgfs as a system tool: the Debian package `packaging/deb.sh` builds (its contents,
//! installed with apt and mounting through fstab, removed again), man pages and
//! completions made from the command-line definitions, and a mount by a user who is not
//! root, through `fusermount3`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{pkgfs, repo, require_fuse, run};

/// A ZIP with one file, written with the `zip` crate.
fn one_zip(path: &Path, name: &str, data: &[u8]) {
    use std::io::Write;
    let mut w = ::zip::ZipWriter::new(fs::File::create(path).unwrap());
    w.start_file(name, ::zip::write::SimpleFileOptions::default())
        .unwrap();
    w.write_all(data).unwrap();
    w.finish().unwrap();
}

/// Build the package from the binary under test into `out`.
fn build_deb(out: &Path) -> PathBuf {
    let o = run(Command::new("bash")
        .arg(repo().join("packaging/deb.sh"))
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_pkgfs"))
        .arg(out));
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

/// The package holds the binary, the mount helper, man pages for every command, the
/// completions, the examples; depends on fuse3. The man pages and completions are the
/// binary's own (`pkgfs manpages`, `pkgfs completions`), so they say what `--help`
/// says.
#[test]
fn the_debian_package_holds_what_a_system_tool_needs() {
    if !crate::common::require_tools(&["dpkg-deb", "man"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());
    let fields = run(Command::new("dpkg-deb").arg("-f").arg(&deb).args([
        "Package",
        "Depends",
        "Architecture",
    ]));
    let fields = String::from_utf8(fields.stdout).unwrap();
    assert!(fields.contains("Package: pkgfs"), "{fields}");
    assert!(fields.contains("Depends: fuse3"), "{fields}");
    let list = String::from_utf8(run(Command::new("dpkg-deb").arg("-c").arg(&deb)).stdout).unwrap();
    for want in [
        "./usr/bin/pkgfs",
        "./usr/sbin/mount.fuse.pkgfs -> ../bin/pkgfs",
        "./usr/share/man/man1/pkgfs.1.gz",
        "./usr/share/man/man1/pkgfs-mount.1.gz",
        "./usr/share/man/man1/pkgfs-pack.1.gz",
        "./usr/share/bash-completion/completions/pkgfs",
        "./usr/share/zsh/vendor-completions/_pkgfs",
        "./usr/share/fish/vendor_completions.d/pkgfs.fish",
        "./usr/share/doc/pkgfs/examples/fstab",
        "./usr/share/doc/pkgfs/examples/srv-pkgs.mount",
    ] {
        assert!(list.contains(want), "{want} missing:\n{list}");
    }
    assert!(
        !list.contains("manpages.1"),
        "the hidden command has no page"
    );
    // Unpacked: the man page renders and says what --help says; bash loads the
    // completion and it completes subcommands and options.
    let root = dir.path().join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    let page = run(Command::new("man")
        .arg("-l")
        .arg(root.join("usr/share/man/man1/pkgfs-mount.1.gz"))
        .env("MANWIDTH", "200")
        .env("MAN_KEEP_FORMATTING", "0"));
    // Without a terminal, grotty still emboldens by overstriking (`c BS c`): drop it.
    let raw = String::from_utf8_lossy(&page.stdout);
    let mut page = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if chars.peek() == Some(&'\u{8}') {
            chars.next();
        } else {
            page.push(c);
        }
    }
    // Lines joined (words hyphenated at a line's end made whole), spaces collapsed.
    let flat = |t: &str| {
        let mut t = t.to_string();
        while let Some(i) = t.find("\u{2010}\n") {
            let rest = t[i..]
                .trim_start_matches(['\u{2010}', '\n', ' '])
                .to_string();
            t.truncate(i);
            t.push_str(&rest);
        }
        t.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let page = flat(&page);
    let help = flat(&String::from_utf8(run(pkgfs().args(["mount", "--help"])).stdout).unwrap());
    for phrase in ["--index-cache", "--platform", "docker-archive", "suid, dev"] {
        assert!(help.contains(phrase), "--help lacks {phrase}");
        assert!(
            page.contains(phrase),
            "the man page lacks {phrase}:\n{page}"
        );
    }
    let completion = root.join("usr/share/bash-completion/completions/pkgfs");
    let words = run(Command::new("bash").arg("-c").arg(format!(
        "source '{}'; COMP_WORDS=(pkgfs mo); COMP_CWORD=1; COMP_LINE='pkgfs mo'; _pkgfs pkgfs mo pkgfs; echo \"${{COMPREPLY[@]}}\"; \
         COMP_WORDS=(pkgfs mount --pla); COMP_CWORD=2; _pkgfs pkgfs --pla mount; echo \"${{COMPREPLY[@]}}\"",
        completion.display()
    )));
    let words = String::from_utf8(words.stdout).unwrap();
    assert!(
        words
            .lines()
            .next()
            .unwrap()
            .split(' ')
            .any(|w| w == "mount"),
        "{words}"
    );
    assert!(words.contains("--platform"), "{words}");
}

/// Installed with apt on this machine, the package's helper makes the documented fstab
/// line work; removed, nothing of it stays. (Skipped where pkgfs is installed already:
/// the test does not replace a user's installation.)
#[test]
fn the_installed_package_mounts_through_fstab_and_is_removed_cleanly() {
    if !crate::common::require_tools(&["dpkg-deb", "apt-get"]) {
        return;
    }
    let installed = Command::new("dpkg")
        .args(["-s", "pkgfs"])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        assert!(
            !crate::common::strict(),
            "pkgfs is installed on the machine the tests must run on whole"
        );
        eprintln!("skipping: pkgfs is installed here already");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());
    // The helper path is shared with the fstab test of live.rs.
    let _helper = crate::common::helper_lock();
    struct Purge;
    impl Drop for Purge {
        fn drop(&mut self) {
            let _ = Command::new("apt-get")
                .args([
                    "purge",
                    "-y",
                    "-qq",
                    "-o",
                    "DPkg::Lock::Timeout=600",
                    "pkgfs",
                ])
                .output();
        }
    }
    run(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "-o",
            "DPkg::Lock::Timeout=600",
        ])
        .arg(&deb));
    let _purge = Purge;
    assert!(Path::new("/usr/sbin/mount.fuse.pkgfs").exists());
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    one_zip(&pkgs.join("a.zip"), "etc/a.conf", b"from the package\n");
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let _guard = crate::common::UmountGuard(&mp);
    let fstab = dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{}  {}  fuse.pkgfs  ro,nofail,log_file={}  0 0\n",
            pkgs.display(),
            mp.display(),
            dir.path().join("log").display()
        ),
    )
    .unwrap();
    run(Command::new("mount").arg("-T").arg(&fstab).arg(&mp));
    assert_eq!(
        fs::read(mp.join("etc/a.conf")).unwrap(),
        b"from the package\n"
    );
    // The daemon is the installed binary.
    let st = crate::common::status_json(&mp);
    let exe = fs::read_link(format!("/proc/{}/exe", st["pid"])).unwrap();
    assert_eq!(exe, Path::new("/usr/bin/pkgfs"));
    // An upgrade (here the same version again: dpkg runs postinst as for one) gives the
    // mount a server of the new file through its keeper, and the mount stays.
    run(Command::new("apt-get")
        .args([
            "install",
            "--reinstall",
            "-y",
            "-qq",
            "-o",
            "DPkg::Lock::Timeout=600",
        ])
        .arg(&deb));
    let after = crate::common::status_json(&mp);
    assert_ne!(after["server_pid"], st["server_pid"], "{after}");
    assert_eq!(after["keeper"]["reloads"], 1, "{after}");
    let exe = fs::read_link(format!("/proc/{}/exe", after["server_pid"])).unwrap();
    assert_eq!(
        exe,
        Path::new("/usr/bin/pkgfs"),
        "the new file, not a deleted one"
    );
    assert_eq!(
        fs::read(mp.join("etc/a.conf")).unwrap(),
        b"from the package\n"
    );
    run(Command::new("umount").arg(&mp));
    run(Command::new("apt-get").args([
        "purge",
        "-y",
        "-qq",
        "-o",
        "DPkg::Lock::Timeout=600",
        "pkgfs",
    ]));
    assert!(!Path::new("/usr/bin/pkgfs").exists());
    assert!(!Path::new("/usr/sbin/mount.fuse.pkgfs").exists());
}

/// A user who is not root mounts and unmounts through `fusermount3` (setuid, from
/// fuse3), reads the tree, and is the owner of what it shows. This machine's /dev/fuse
/// is root's only (0600): the test lets its user open it for its duration (a desktop's
/// udev makes it 0666).
#[test]
fn a_user_who_is_not_root_mounts_and_unmounts_with_fusermount3() {
    if !require_fuse() || !crate::common::require_tools(&["runuser", "useradd", "fusermount3"]) {
        return;
    }
    const USER: &str = "pkgfs-test";
    if Command::new("id")
        .arg(USER)
        .output()
        .is_ok_and(|o| !o.status.success())
    {
        run(Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(USER));
    }
    struct DevFuse(u32);
    impl Drop for DevFuse {
        fn drop(&mut self) {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
        }
    }
    let _restore = {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
        if mode & 0o006 != 0o006 {
            fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode | 0o006)).unwrap();
        }
        DevFuse(mode)
    };
    // A directory the user owns, outside any root-only path.
    let base = tempfile::Builder::new()
        .prefix("pkgfs-user")
        .tempdir_in("/tmp")
        .unwrap();
    let chown = |p: &Path| run(Command::new("chown").arg(format!("{USER}:")).arg(p));
    chown(base.path());
    let zip = base.path().join("p.zip");
    one_zip(&zip, "hello.txt", b"hello, user\n");
    chown(&zip);
    let mp = base.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    chown(&mp);
    let _guard = crate::common::UmountGuard(&mp);
    // The binary under test, somewhere the user can execute it.
    let bin = base.path().join("pkgfs");
    fs::copy(env!("CARGO_BIN_EXE_pkgfs"), &bin).unwrap();
    let as_user = |args: &[&str]| {
        let mut c = Command::new("runuser");
        c.args(["-u", USER, "--"])
            .arg(&bin)
            .args(args)
            .env("HOME", base.path());
        c
    };
    let mut mount = as_user(&["mount", "--no-index-cache"]);
    mount.arg(&zip).arg(&mp);
    run(&mut mount);
    let line = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.contains(mp.to_str().unwrap()))
        .unwrap()
        .to_string();
    assert!(
        line.contains("fuse.pkgfs") && line.contains("user_id="),
        "{line}"
    );
    let mut cat = Command::new("runuser");
    cat.args(["-u", USER, "--", "cat"])
        .arg(mp.join("hello.txt"));
    assert_eq!(run(&mut cat).stdout, b"hello, user\n");
    // Root cannot look in (no allow_other): the mount is the user's.
    assert!(fs::read_dir(&mp).is_err());
    // The user's mount has a keeper too (fusermount3 passed it the descriptor): a
    // killed server is replaced, and the next lookup is answered, not ENOTCONN.
    let status = |c: &mut Command| -> serde_json::Value {
        serde_json::from_slice(&run(c.arg("--json").arg(&mp)).stdout).unwrap()
    };
    let st = status(&mut as_user(&["status"]));
    assert!(st["keeper_pid"].as_u64().is_some(), "{st}");
    crate::common::kill9(st["server_pid"].as_u64().unwrap() as u32);
    let mut missing = Command::new("runuser");
    missing
        .args(["-u", USER, "--", "stat"])
        .arg(mp.join("not-there"));
    let out = missing.output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No such file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(run(&mut cat).stdout, b"hello, user\n");
    let after = status(&mut as_user(&["status"]));
    assert_eq!(after["keeper"]["restarts"], 1, "{after}");
    let mut umount = as_user(&["umount"]);
    umount.arg(&mp);
    run(&mut umount);
    assert!(!crate::common::is_mountpoint(&mp));
}
