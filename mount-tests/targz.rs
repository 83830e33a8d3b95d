//! Mount tests of gzip tarballs read in place: archives from real tools (GNU tar with
//! gzip, pigz and bgzip, concatenated members, Python's tarfile in pax form, npm pack,
//! cargo package, pip sdists, the crates in cargo's own cache), each mount compared with
//! an extraction by GNU tar; damaged and hostile streams; the index cache; a large
//! tarball indexed in the background of a live mount; progress on a terminal.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{Mount, pkgfs, repo, require_fuse, run, trees_match, wait_until};

/// Run a shell script with `args` as `$1`, `$2`…; it must succeed.
fn sh(script: &str, args: &[&Path]) {
    run(Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args));
}

/// Extract `archive` with GNU tar (as root: owners and modes kept) into `dir`.
fn extract(archive: &Path, dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-xpf"])
        .arg(archive)
        .arg("--same-owner")
        .arg("--numeric-owner"));
}

/// Mount options that keep a test's indexes to itself.
fn own_cache(tmp: &Path) -> [String; 2] {
    [
        "--index-cache".into(),
        tmp.join("index-cache").display().to_string(),
    ]
}

fn mount(sources: &[&Path], tmp: &Path, extra: &[&str]) -> Mount {
    let cache = own_cache(tmp);
    let mut args: Vec<&str> = cache.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    Mount::new(sources, &args)
}

/// Text-like bytes, compressible, of `n` bytes.
fn text(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            b"pkgfs reads gzip tarballs in place\n"[(x >> 59) as usize % 35]
        })
        .collect()
}

crate::on_both_transports! {
    /// GNU tar through gzip, pigz (shared and independent blocks), bgzip (a member
    /// every 64 KiB) and a tar cut in three and gzipped part by part, concatenated:
    /// every mount equals GNU tar's extraction.
    fn gnu_tar_through_gzip_pigz_bgzip_and_concatenated_members_equals_its_extraction() {
        if !crate::common::require_tools(&["tar", "gzip", "pigz", "bgzip", "split"]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path();
        let src = tmp.join("src");
        crate::pack::sample_tree(&src);
        // Large enough that the archives have points inside members.
        fs::write(src.join("big/text.txt"), text(9 << 20, 3)).unwrap();
        let tar = tmp.join("all.tar");
        sh(r#"tar -C "$1" -cf "$2" ."#, &[&src, &tar]);
        let archives = [
            ("gzip.tar.gz", r#"gzip -6 < "$1" > "$2""#),
            ("pigz.tgz", r#"pigz -p 2 < "$1" > "$2""#),
            ("pigz-i.tar.gz", r#"pigz -i -p 2 < "$1" > "$2""#),
            ("bgzip.tar.gz", r#"bgzip -c < "$1" > "$2""#),
            (
                "concat.crate",
                r#"d=$(mktemp -d); split -b 3000000 "$1" "$d/part."; for p in "$d"/part.*; do gzip -c "$p"; done > "$2"; rm -r "$d""#,
            ),
        ];
        let expected = tmp.join("expected");
        extract(&tar, &expected);
        for (name, script) in archives {
            let a = tmp.join(name);
            sh(script, &[&tar, &a]);
            let m = mount(&[&a], tmp, &[]);
            trees_match(&expected, &m.path(), &[]);
            assert!(m.stderr.is_empty(), "{name}: {}", m.stderr);
        }
    }
}

/// Python's tarfile in pax form: long and non-ASCII names, ids beyond 2^31, times before
/// 1970 and fractional ones, hard and symbolic links, empty directories.
#[test]
fn python_tarfile_pax_archives_equal_their_extraction() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let a = tmp.join("pax.tar.gz");
    let script = r#"
import io, sys, tarfile
t = tarfile.open(sys.argv[1], "w:gz", format=tarfile.PAX_FORMAT)
def add(name, data=b"", **kw):
    i = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(i, k, v)
    if i.type == tarfile.REGTYPE:
        i.size = len(data)
    t.addfile(i, io.BytesIO(data) if data else None)
add("dir", type=tarfile.DIRTYPE, mode=0o755, mtime=1_600_000_000)
add("dir/" + "n" * 250 + ".txt", b"long name\n", mode=0o644, mtime=1_600_000_001)
add("dir/ünïcödé 名前.txt", b"unicode\n", mode=0o640, mtime=1_600_000_002)
add("dir/big-ids", b"ids\n", uid=3_000_000_000, gid=4_000_000_000, mode=0o600, mtime=1_600_000_003)
add("dir/old", b"before 1970\n", mode=0o644, mtime=-86400 * 365)
add("dir/frac", b"fraction\n", mode=0o644, mtime=1_600_000_004.75)
add("dir/link", type=tarfile.SYMTYPE, linkname="ünïcödé 名前.txt", mtime=1_600_000_005)
add("dir/hard", type=tarfile.LNKTYPE, linkname="dir/old", mtime=1_600_000_006)
add("dir/" + "d" * 120, type=tarfile.DIRTYPE, mode=0o755, mtime=1_600_000_009)
add("dir/" + "d" * 120 + "/" + "f" * 120, b"deep\n", mode=0o644, mtime=1_600_000_008)
add("empty", type=tarfile.DIRTYPE, mode=0o700, mtime=1_600_000_007)
t.close()
"#;
    run(Command::new("python3").arg("-c").arg(script).arg(&a));
    let expected = tmp.join("expected");
    extract(&a, &expected);
    let m = mount(&[&a], tmp, &[]);
    trees_match(&expected, &m.path(), &[]);
}

crate::on_both_transports! {
    /// What system trees hold: character and block devices, a FIFO, a setuid file, and
    /// extended attributes (`user.*`, a file capability) archived by GNU tar `--xattrs`.
    /// The mount equals GNU tar's extraction, devices and attributes included.
    fn devices_fifos_and_extended_attributes_equal_gnu_tar_s_extraction() {
        if !crate::common::require_tools(&["tar", "mknod", "mkfifo", "setfattr", "getfattr"]) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path();
        let src = tmp.join("src");
        sh(
            r#"set -e; mkdir -p "$1/dev" "$1/run" "$1/bin"
            mknod -m 666 "$1/dev/null" c 1 3
            mknod -m 660 "$1/dev/loop9" b 7 300
            mkfifo -m 600 "$1/run/initctl"
            printf 'ping\n' > "$1/bin/ping"; chmod 4755 "$1/bin/ping"
            setfattr -n user.mime_type -v text/plain "$1/bin/ping"
            setfattr -n security.capability -v 0x0100000200200000000000000000000000000000 "$1/bin/ping"
            setfattr -n user.empty "$1/run"
            ln "$1/bin/ping" "$1/bin/ping6"
            printf 'plain\n' > "$1/bin/plain""#,
            &[&src],
        );
        let a = tmp.join("sys.tar.gz");
        sh(
            r#"tar --xattrs --xattrs-include='*' -C "$1" -czf "$2" ."#,
            &[&src, &a],
        );
        let expected = tmp.join("expected");
        fs::create_dir_all(&expected).unwrap();
        sh(
            r#"tar --xattrs --xattrs-include='*' -C "$2" -xpf "$1" --same-owner"#,
            &[&a, &expected],
        );
        let m = mount(&[&a], tmp, &[]);
        trees_match(&expected, &m.path(), &[]);
        // And through the tools people use.
        let out = Command::new("getfattr")
            .args(["-d", "-m", "-", "--absolute-names"])
            .arg(m.path().join("bin/ping"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("user.mime_type=\"text/plain\""), "{text}");
        assert!(text.contains("security.capability=0s"), "{text}");
        let out = Command::new("stat")
            .args(["-c", "%F %t:%T"])
            .arg(m.path().join("dev/loop9"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "block special file 7:12c\n");
        // A device of the mount is not opened as one unless asked: nodev by default.
        assert!(fs::read(m.path().join("dev/null")).is_err());
        drop(m);
        let m = mount(&[&a], tmp, &["-o", "dev,suid"]);
        assert_eq!(fs::read(m.path().join("dev/null")).unwrap(), b"");
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.contains(&*m.path().to_string_lossy()))
            .unwrap();
        assert!(!line.contains("nosuid") && !line.contains("nodev"), "{line}");
    }
}

/// Packages as the world ships them: crates from cargo's own cache (those this build
/// downloaded), a crate made by `cargo package`, a local package made by `npm pack`, and
/// sdists from the package index (pinned in `mount-tests/sdists.txt`, fetched once).
#[test]
fn crates_npm_tarballs_and_sdists_equal_their_extraction() {
    if !crate::common::require_tools(&["cargo", "npm", "tar"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();

    // Crates of cargo's registry cache: distinct `name-version/` prefixes, so all of
    // them merge into one tree, equal to their extractions side by side.
    let crates = cached_crates(12);
    assert!(
        crates.len() >= 5,
        "cargo's cache holds {} crates",
        crates.len()
    );
    let expected = tmp.join("crates");
    for c in &crates {
        extract(c, &expected);
    }
    let refs: Vec<&Path> = crates.iter().map(PathBuf::as_path).collect();
    let m = mount(&refs, tmp, &[]);
    // Crates, like npm tarballs, hold no directory entries: `tar x` stamps directories
    // with the time it ran, pkgfs gives them the archive's (docs/SEMANTICS.md).
    trees_match(&expected, &m.path(), &["--no-dir-mtime"]);
    drop(m);

    // `cargo package` of a crate made here, offline.
    let krate = tmp.join("made");
    run(Command::new("cargo")
        .args(["new", "--lib", "--vcs", "none", "--quiet"])
        .arg(&krate));
    fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"made\"\nversion = \"0.1.0\"\nedition = \"2021\"\ndescription = \"t\"\nlicense = \"MIT\"\n",
    )
    .unwrap();
    fs::write(krate.join("src/lib.rs"), text(200_000, 5)).unwrap();
    run(Command::new("cargo")
        .args([
            "package",
            "--offline",
            "--no-verify",
            "--allow-dirty",
            "--quiet",
        ])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", tmp.join("cargo-target")));
    let made = tmp.join("cargo-target/package/made-0.1.0.crate");
    check_one(&made, tmp);

    // `npm pack` of a local package.
    let npm = tmp.join("npm");
    fs::create_dir_all(npm.join("lib")).unwrap();
    fs::write(
        npm.join("package.json"),
        r#"{"name": "pkgfs-test", "version": "1.2.3", "main": "lib/index.js", "license": "MIT"}"#,
    )
    .unwrap();
    fs::write(npm.join("lib/index.js"), b"module.exports = 42;\n").unwrap();
    fs::write(npm.join("README.md"), text(50_000, 6)).unwrap();
    run(Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(tmp)
        .current_dir(&npm)
        .env("npm_config_cache", tmp.join("npm-cache"))
        .env("npm_config_update_notifier", "false"));
    check_one(&tmp.join("pkgfs-test-1.2.3.tgz"), tmp);

    // sdists from the package index.
    for sdist in real_sdists() {
        check_one(&sdist, tmp);
    }
}

/// Mount one archive alone and compare it with its extraction (directory times apart:
/// these archives may hold no directory entries, see above).
fn check_one(archive: &Path, tmp: &Path) {
    let name = archive.file_name().unwrap().to_string_lossy().into_owned();
    let expected = tmp.join(format!("expected-{name}"));
    extract(archive, &expected);
    let m = mount(&[archive], tmp, &[]);
    trees_match(&expected, &m.path(), &["--no-dir-mtime"]);
}

/// Up to `n` `.crate` files from cargo's registry cache, in name order.
fn cached_crates(n: usize) -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let mut all: Vec<PathBuf> = fs::read_dir(home.join("registry/cache"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "crate"))
        .collect();
    all.sort();
    all.dedup_by_key(|p| p.file_name().map(|n| n.to_os_string()));
    // Spread over the alphabet rather than the first few.
    let step = (all.len() / n.max(1)).max(1);
    all.into_iter().step_by(step).take(n).collect()
}

/// The sdists pinned in `mount-tests/sdists.txt`, downloaded once under the target dir.
fn real_sdists() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdists");
    let list = repo().join("mount-tests/sdists.txt");
    let pins = fs::read(&list).unwrap();
    if fs::read(dir.join("sdists.txt")).ok().as_ref() != Some(&pins) {
        let part = dir.with_extension("part");
        let _ = fs::remove_dir_all(&part);
        run(Command::new(crate::common::test_python())
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-binary=:all:",
                "--no-deps",
                "--dest",
            ])
            .arg(&part)
            .arg("-r")
            .arg(&list));
        fs::write(part.join("sdists.txt"), &pins).unwrap();
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&part, &dir).unwrap();
    }
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no sdists in {}", dir.display());
    v
}

/// A tar of two files: `good` (small) and `second` (after it).
fn two_files(tmp: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let src = tmp.join("two");
    fs::create_dir_all(&src).unwrap();
    let (good, second) = (text(300_000, 8), text(300_000, 9));
    fs::write(src.join("good"), &good).unwrap();
    fs::write(src.join("second"), &second).unwrap();
    let tar = tmp.join("two.tar");
    sh(r#"tar -C "$1" -cf "$2" good second"#, &[&src, &tar]);
    (tar, good, second)
}

/// Damaged and hostile streams in one source directory beside a good package: each
/// is mounted or skipped as docs/SEMANTICS.md says, with a warning naming it; the bytes
/// that cannot be trusted read EIO; nothing else is affected.
#[test]
fn damaged_and_hostile_tarballs_affect_only_their_untrusted_bytes() {
    if !crate::common::require_tools(&["tar", "pigz", "truncate"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let pkgs = tmp.join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    let (tar, good, second) = two_files(tmp);
    let tar_bytes = fs::read(&tar).unwrap();
    let gz = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        std::io::Write::write_all(&mut e, data).unwrap();
        e.finish().unwrap()
    };
    // `good` in a member of its own, `second` (and the end) in another.
    let cut = 512 + good.len().div_ceil(512) * 512;
    let members = [gz(&tar_bytes[..cut]), gz(&tar_bytes[cut..])];
    let write = |name: &str, bytes: &[u8]| fs::write(pkgs.join(name), bytes).unwrap();
    // A bad CRC in the second member.
    let mut bad = members[1].clone();
    let n = bad.len();
    bad[n - 7] ^= 0x40;
    write("badcrc.tar.gz", &[members[0].clone(), bad].concat());
    // Cut inside the second member.
    write(
        "truncated.tar.gz",
        &[
            members[0].clone(),
            members[1][..members[1].len() / 2].to_vec(),
        ]
        .concat(),
    );
    // Garbage after the end.
    write(
        "garbage.tar.gz",
        &[members[0].clone(), members[1].clone(), b"GARBAGE!".to_vec()].concat(),
    );
    // A tar header that claims 1 GiB for a file of 10 bytes.
    let mut lying = tar_bytes.clone();
    lying[124..136].copy_from_slice(format!("{:011o}\0", 1u64 << 30).as_bytes());
    let sum: u32 = lying[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    lying[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    write("lying.tar.gz", &gz(&lying));
    // 1 GiB of zeros in a megabyte.
    let bomb = pkgs.join("bomb.tar.gz");
    sh(
        r#"d=$(mktemp -d); truncate -s 1G "$d/zeros"; tar -C "$d" -cf - zeros | pigz -p 2 > "$1"; rm -r "$d""#,
        &[&bomb],
    );
    // Garbage named like a tarball, and a healthy package.
    write("notgzip.tar.gz", b"\x1f\x8b\x08 not really gzip at all");
    fs::write(pkgs.join("ok.zip"), {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        w.start_file("ok/file", zip::write::SimpleFileOptions::default())
            .unwrap();
        std::io::Write::write_all(&mut w, b"fine\n").unwrap();
        w.finish().unwrap().into_inner()
    })
    .unwrap();

    let m = mount(&[&pkgs], tmp, &[]);
    let mp = m.path();
    for name in [
        "badcrc.tar.gz",
        "truncated.tar.gz",
        "garbage.tar.gz",
        "notgzip.tar.gz",
    ] {
        assert!(
            m.stderr.contains(name),
            "no warning naming {name}:\n{}",
            m.stderr
        );
    }
    assert_eq!(fs::read(mp.join("ok/file")).unwrap(), b"fine\n");
    // The members that verified serve; the others read EIO. Every archive is one layer
    // over the same two names: the later archive wins, so each is mounted alone too.
    for (name, second_ok) in [
        ("badcrc.tar.gz", false),
        ("truncated.tar.gz", false),
        ("garbage.tar.gz", true),
    ] {
        let one = mount(&[&pkgs.join(name)], tmp, &[]);
        assert!(fs::read(one.path().join("good")).unwrap() == good, "{name}");
        let r = fs::read(one.path().join("second"));
        if second_ok {
            assert!(r.unwrap() == second, "{name}");
        } else {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO), "{name}");
        }
    }
    // The lying entry is listed with its claimed size; bytes past the stream are EIO.
    let one = mount(&[&pkgs.join("lying.tar.gz")], tmp, &[]);
    assert_eq!(
        fs::metadata(one.path().join("good")).unwrap().len(),
        1 << 30
    );
    let e = fs::read(one.path().join("good")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    // The bomb serves its zeros in the daemon's budget.
    let one = mount(&[&bomb], tmp, &["--cache-size", "32M"]);
    let f = fs::File::open(one.path().join("zeros")).unwrap();
    let mut buf = vec![1u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, (1 << 30) - 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    let st = crate::common::status_json(&one.path());
    assert!(st["cache"]["bytes"].as_u64().unwrap() <= 32 << 20);
    // `check` reports what cannot be trusted.
    let out = pkgfs()
        .arg("check")
        .arg(pkgs.join("badcrc.tar.gz"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("fails its check"));
}

/// A large random-ish tarball (incompressible: its gzip is as large as its tar).
fn large_tarball(tmp: &Path, mib: usize) -> (PathBuf, Vec<u8>) {
    let src = tmp.join("large");
    fs::create_dir_all(&src).unwrap();
    let mut x = 99u64;
    let data: Vec<u8> = (0..mib << 20)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect();
    fs::write(src.join("payload.bin"), &data).unwrap();
    let a = tmp.join("large.tar.gz");
    sh(
        r#"tar -C "$1" -cf - payload.bin | gzip -1 > "$2""#,
        &[&src, &a],
    );
    (a, data)
}

/// A tarball dropped into a live mount whose index needs a long pass is indexed in the
/// background: other packages activate meanwhile, and it appears when ready. A second
/// mount reads its index from the cache instead of the archive.
#[test]
fn a_large_tarball_dropped_into_a_live_mount_is_indexed_in_the_background() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let pkgs = tmp.join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    let (big, data) = large_tarball(tmp, 40);
    let _ = two_files(tmp);
    sh(
        r#"tar -C "$1" -czf "$2" good"#,
        &[&tmp.join("two"), &pkgs.join("a.tar.gz")],
    );
    let m = mount(&[&pkgs], tmp, &[]);
    let mp = m.path();
    // Installed by rename, then a small one right after.
    fs::copy(&big, pkgs.join(".big.tmp")).unwrap();
    fs::rename(pkgs.join(".big.tmp"), pkgs.join("big.tar.gz")).unwrap();
    sh(
        r#"tar -C "$1" -czf "$2" second"#,
        &[&tmp.join("two"), &pkgs.join(".b.tmp")],
    );
    fs::rename(pkgs.join(".b.tmp"), pkgs.join("b.tar.gz")).unwrap();
    wait_until(Duration::from_secs(5), "b.tar.gz activated", || {
        mp.join("second").exists()
    });
    wait_until(Duration::from_secs(30), "big.tar.gz activated", || {
        mp.join("payload.bin").exists()
    });
    assert!(
        m.log_text().contains("big.tar.gz in the background"),
        "{}",
        m.log_text()
    );
    assert!(fs::read(mp.join("payload.bin")).unwrap() == data);
    assert!(
        crate::common::status_json(&mp)["indexing"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    drop(m);
    // Another file (another inode): a pass; then the same file again: its index comes
    // from the cache, no pass; and by default the tree the first of them kept is loaded
    // whole, the index read from the cache when the file is read.
    let origin = |m: &Mount| crate::common::status_json(&m.path())["packages"][0]["index"].clone();
    let m2 = mount(&[&big], tmp, &[]);
    let m3 = mount(&[&big], tmp, &["--no-kept-tree"]);
    assert_eq!(origin(&m2), "pass");
    assert_eq!(origin(&m3), "cache");
    assert!(fs::read(m3.path().join("payload.bin")).unwrap() == data);
    let m4 = mount(&[&big], tmp, &[]);
    assert_eq!(origin(&m4), "kept");
    assert!(fs::read(m4.path().join("payload.bin")).unwrap() == data);
}

/// The first mount of a large tarball shows its index pass on a terminal, and nothing
/// when not on one or with `--quiet`.
#[test]
fn the_index_pass_shows_progress_on_a_terminal_only() {
    if !crate::common::require_tools(&["script"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path();
    let (big, _) = large_tarball(tmp, 24);
    let mp = tmp.join("mnt");
    fs::create_dir(&mp).unwrap();
    let _g = crate::common::UmountGuard(&mp);
    let on_terminal = |extra: &str| {
        // `script` gives the command a terminal and records what it wrote there.
        let typescript = tmp.join("typescript");
        let cmd = format!(
            "{} mount --no-index-cache {extra} {} {}",
            env!("CARGO_BIN_EXE_pkgfs"),
            big.display(),
            mp.display()
        );
        run(Command::new("script")
            .args(["-qfec", &cmd])
            .arg(&typescript));
        run(pkgfs().arg("umount").arg(&mp));
        String::from_utf8_lossy(&fs::read(&typescript).unwrap()).into_owned()
    };
    let shown = on_terminal("");
    assert!(
        shown.contains("indexing large.tar.gz:") && shown.contains("MiB"),
        "{shown}"
    );
    assert!(!on_terminal("--quiet").contains("indexing"));
    // Not a terminal: nothing.
    let out = run(pkgfs()
        .args(["mount", "--no-index-cache"])
        .arg(&big)
        .arg(&mp));
    run(pkgfs().arg("umount").arg(&mp));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("indexing"));
}
