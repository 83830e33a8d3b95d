//! Mount tests of seekable-zstd packages: `pkgfs pack` round trips, standard-tool
//! extraction, reproducibility, foreign seekable archives and the index cache.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{Mount, pkgfs, require_fuse, run, test_python, trees_match};

/// Set the mtime of `p` (not following symlinks).
fn set_mtime(p: &Path, secs: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

fn chown(p: &Path, uid: u32, gid: u32) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, gid) }, 0);
}

/// A tree with everything a package may hold.
pub fn sample_tree(root: &Path) {
    let w = |rel: &str, data: &[u8], mode: u32, mtime: i64| {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        set_mtime(&p, mtime);
    };
    let mut x = 7u64;
    let big: Vec<u8> = (0..3_500_000)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 3 == 0 {
                (x >> 56) as u8
            } else {
                b"pkgfs "[i % 6]
            }
        })
        .collect();
    w("big/large.bin", &big, 0o644, 1_600_000_000);
    w("empty", b"", 0o644, 1_500_000_000);
    w("bin/tool", b"#!/bin/sh\necho tool\n", 0o755, 1_234_567_890);
    w("bin/suid", b"setuid\n", 0o4755, 1_234_567_890);
    w("bin/sgid", b"setgid\n", 0o2750, 1_234_567_890);
    w("secret", b"secret\n", 0o400, 1_000_000_000);
    w("owned", b"someone else's\n", 0o640, 1_000_000_001);
    chown(&root.join("owned"), 1234, 5678);
    let long = "l".repeat(120);
    w(
        &format!("deep/{long}/{long}/{long}.txt"),
        b"long path\n",
        0o644,
        1_700_000_000,
    );
    w(
        "names/héllo wörld.txt",
        "non-ASCII\n".as_bytes(),
        0o644,
        1_700_000_001,
    );
    w(
        "names/日本語.txt",
        "日本語\n".as_bytes(),
        0o644,
        1_700_000_002,
    );
    for i in 0..300 {
        w(
            &format!("many/f{i:03}.txt"),
            format!("small file {i}\n").repeat(i % 7 + 1).as_bytes(),
            0o644,
            1_650_000_000 + i as i64,
        );
    }
    w("links/target.txt", b"linked\n", 0o644, 1_600_000_001);
    fs::hard_link(root.join("links/target.txt"), root.join("links/hard1")).unwrap();
    fs::hard_link(root.join("links/target.txt"), root.join("many/hard2")).unwrap();
    symlink("target.txt", root.join("links/rel")).unwrap();
    symlink("/etc/hostname", root.join("links/abs")).unwrap();
    symlink("nowhere/at/all", root.join("links/dangling")).unwrap();
    symlink(
        format!("../{}", "x".repeat(200)),
        root.join("links/longtarget"),
    )
    .unwrap();
    for l in ["rel", "abs", "dangling", "longtarget"] {
        set_mtime(&root.join("links").join(l), 1_400_000_000);
    }
    fs::create_dir_all(root.join("empty-dir/inner")).unwrap();
    fs::create_dir_all(root.join("sticky")).unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir_all(root.join("private")).unwrap();
    w("private/x", b"x\n", 0o600, 1_300_000_000);
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    // Directory mtimes last, deepest first, once their contents exist.
    let mut dirs = vec![];
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
                stack.push(e.path());
            }
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for (i, d) in dirs.iter().enumerate() {
        set_mtime(d, 1_100_000_000 + i as i64);
    }
}

fn pack(src: &Path, out: &Path, extra: &[&str]) {
    run(pkgfs().arg("pack").arg(src).arg("-o").arg(out).args(extra));
}

/// Run a shell pipeline of standard tools with `args` as `$1`, `$2`…; it must succeed.
fn sh(script: &str, args: &[&Path]) {
    run(Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args));
}

#[test]
fn pack_mount_and_standard_extraction_reproduce_the_tree() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src);
    let pkg = dir.path().join("pkg.tar.zst");
    pack(&src, &pkg, &["--frame-size", "64K"]);

    let m = Mount::new(&[&pkg], &[]);
    trees_match(&src, &m.path(), &[]);

    // Standard tools unpack the same tree.
    let out = dir.path().join("extracted");
    fs::create_dir(&out).unwrap();
    sh(
        r#"zstd -dc "$1" | tar -x --same-owner --same-permissions -C "$2""#,
        &[&pkg, &out],
    );
    trees_match(&src, &out, &[]);
}

#[test]
fn pack_is_reproducible_whatever_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src);
    let (a, b) = (dir.path().join("a.tar.zst"), dir.path().join("b.tar.zst"));
    pack(&src, &a, &["--threads", "1"]);
    pack(&src, &b, &["--threads", "3"]);
    assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    // Clamped times and a forced owner show up in the listing.
    let c = dir.path().join("c.tar.zst");
    pack(&src, &c, &["--mtime", "1200000000", "--owner", "0:0"]);
    let ls = run(pkgfs().arg("ls").arg(&c));
    let text = String::from_utf8_lossy(&ls.stdout);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[1], f[2]), ("0", "0"), "{line}");
        assert!(f[4].parse::<i64>().unwrap() <= 1_200_000_000, "{line}");
    }
}

#[test]
fn packages_and_zips_merge_in_one_mount() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("share")).unwrap();
    fs::write(src.join("share/VERSION"), b"from the package\n").unwrap();
    fs::write(src.join("pkg-only.txt"), b"pkg\n").unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    for f in fs::read_dir(crate::common::repo().join("images")).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e != "py") {
            fs::copy(&f, pkgs.join(f.file_name().unwrap())).unwrap();
        }
    }
    pack(&src, &pkgs.join("99-top.tar.zst"), &[]);
    let m = Mount::new(&[&pkgs], &[]);
    assert_eq!(
        fs::read(m.path().join("share/VERSION")).unwrap(),
        b"from the package\n"
    );
    assert_eq!(fs::read(m.path().join("pkg-only.txt")).unwrap(), b"pkg\n");
    assert!(m.path().join("hello/__init__.py").exists());
}

fn foreign(src: &Path, out: &Path) {
    run(Command::new(test_python())
        .arg(crate::common::repo().join("mount-tests/foreign_seekable.py"))
        .arg(src)
        .arg(out));
}

#[test]
fn foreign_seekable_archives_mount_and_their_index_is_cached() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src);
    let arc = dir.path().join("foreign.tar.zst");
    foreign(&src, &arc);
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().unwrap();

    let m = Mount::new(&[&arc], &["--index-cache", cache_arg]);
    assert!(
        m.stderr.contains("scanning"),
        "first mount scans: {}",
        m.stderr
    );
    trees_match(&src, &m.path(), &[]);
    drop(m);
    let (trees, indexes): (Vec<String>, Vec<String>) = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .partition(|n| n.starts_with("tree-"));
    assert_eq!(indexes.len(), 1, "one cached index: {indexes:?}");
    assert_eq!(trees.len(), 1, "and the kept tree: {trees:?}");

    let m = Mount::new(&[&arc], &["--index-cache", cache_arg]);
    assert!(
        !m.stderr.contains("scanning"),
        "second mount uses the cache: {}",
        m.stderr
    );
    trees_match(&src, &m.path(), &[]);
    drop(m);

    // Rewrite the archive with different content: the stale index must not be used.
    fs::write(src.join("empty"), b"now with content\n").unwrap();
    set_mtime(&src.join("empty"), 1_500_000_000);
    foreign(&src, &arc);
    let m = Mount::new(&[&arc], &["--index-cache", cache_arg]);
    assert!(
        m.stderr.contains("scanning"),
        "a changed archive is rescanned: {}",
        m.stderr
    );
    assert_eq!(
        fs::read(m.path().join("empty")).unwrap(),
        b"now with content\n"
    );
}

#[test]
fn tarballs_pkgfs_cannot_serve_are_refused_with_the_fix_named_and_the_rest_mounts() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), b"a\n").unwrap();
    let pkgs = dir.path().join("pkgs");
    fs::create_dir(&pkgs).unwrap();
    pack(&src, &pkgs.join("good.tar.zst"), &[]);
    // Source tarballs as they often come: bzip2 and xz cannot be entered in place.
    let tarballs = [
        ("src.tar.bz2", "| bzip2", "a bzip2 file"),
        ("src.tar.xz", "| xz", "an xz file"),
    ];
    for (name, filter, _) in tarballs {
        sh(
            &format!(r#"tar -C "$1" -cf - . {filter} > "$2""#),
            &[&src, &pkgs.join(name)],
        );
    }
    for (name, _, what) in tarballs {
        // Named on its own: an error that says what it is and names the fix.
        let out = pkgfs().arg("check").arg(pkgs.join(name)).output().unwrap();
        assert!(!out.status.success(), "{name}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains(what) && text.contains("pkgfs pack"),
            "{name}: {text}"
        );
    }
    // In a directory: each is skipped with a warning naming it; the package serves.
    let ls = pkgfs().arg("ls").arg(&pkgs).output().unwrap();
    let err = String::from_utf8_lossy(&ls.stderr);
    for (name, _, what) in tarballs {
        assert!(err.contains(name) && err.contains(what), "{name}: {err}");
    }
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains(" a\t"),
        "the package is listed"
    );
    // An uncompressed tar and a zstd tar without a seek table (as image layers come)
    // are served in place; a zstd file holding no tar is refused, named.
    sh(
        r#"tar -C "$1" -cf "$2" .; tar -C "$1" -cf - . | zstd -q > "$3"; printf 'no tar\n' | zstd -q > "$4""#,
        &[
            &src,
            &pkgs.join("layer.tar"),
            &pkgs.join("plain.tar.zst"),
            &pkgs.join("notes.zst"),
        ],
    );
    for name in ["layer.tar", "plain.tar.zst"] {
        let cat = run(pkgfs().arg("cat").arg(pkgs.join(name)).arg("a"));
        assert_eq!(cat.stdout, b"a\n", "{name}");
    }
    let out = pkgfs()
        .arg("check")
        .arg(pkgs.join("notes.zst"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a zstd file that holds no tar archive"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A gzip tarball is served in place; a gzip file holding no tar is refused.
    sh(
        r#"tar -C "$1" -cf - . | gzip > "$2"; printf 'not a tar\n' | gzip > "$3""#,
        &[&src, &pkgs.join("layer.tar.gz"), &pkgs.join("notes.txt.gz")],
    );
    let cat = pkgfs()
        .arg("cat")
        .arg(pkgs.join("layer.tar.gz"))
        .arg("a")
        .output()
        .unwrap();
    assert_eq!(cat.stdout, b"a\n");
    let out = pkgfs()
        .arg("check")
        .arg(pkgs.join("notes.txt.gz"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a gzip file that holds no tar archive"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // pack refuses the two compressions it does not read and names the pipe that packs
    // them; that command, run as given, makes a package that serves the file.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_pkgfs")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (name, tool) in [("src.tar.bz2", "bzip2"), ("src.tar.xz", "xz")] {
        let package = dir.path().join(format!("{name}.tar.zst"));
        let out = pkgfs()
            .arg("pack")
            .arg(pkgs.join(name))
            .arg("-o")
            .arg(&package)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        let cmd = err
            .split('`')
            .nth(1)
            .unwrap_or_else(|| panic!("{name}: no command in {err}"));
        assert!(cmd.starts_with(&format!("{tool} -dc ")), "{name}: {cmd}");
        run(Command::new("sh").arg("-c").arg(cmd).env("PATH", &path));
        let cat = pkgfs().arg("cat").arg(&package).arg("a").output().unwrap();
        assert_eq!(
            cat.stdout,
            b"a\n",
            "{name}: {}",
            String::from_utf8_lossy(&cat.stderr)
        );
    }
}

#[test]
fn pack_follows_symlinks_only_when_asked_and_never_outside_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("real")).unwrap();
    fs::write(src.join("real/f.txt"), b"inside\n").unwrap();
    symlink("real/f.txt", src.join("in-link")).unwrap();
    let outside = dir.path().join("outside.txt");
    fs::write(&outside, b"outside\n").unwrap();
    let out = dir.path().join("p.tar.zst");
    let cat = |path: &str| run(pkgfs().arg("cat").arg(&out).arg(path)).stdout;

    // Default: links stay links, whatever they point to.
    symlink(&outside, src.join("out-link")).unwrap();
    pack(&src, &out, &[]);
    assert_eq!(cat("in-link"), b"real/f.txt");
    assert_eq!(cat("out-link"), outside.as_os_str().as_bytes());

    // inside: a link leading out of DIR is refused.
    let refused = pkgfs()
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args(["--follow-symlinks", "inside"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("outside"));
    fs::remove_file(src.join("out-link")).unwrap();
    pack(&src, &out, &["--follow-symlinks", "inside"]);
    assert_eq!(cat("in-link"), b"inside\n");

    // all: even the outside target is stored.
    symlink(&outside, src.join("out-link")).unwrap();
    pack(&src, &out, &["--follow-symlinks", "all"]);
    assert_eq!(cat("out-link"), b"outside\n");
}

#[test]
fn a_file_that_is_two_formats_at_once_is_read_by_its_last_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("from-package.txt"), b"package\n").unwrap();
    let pkg = dir.path().join("p.tar.zst");
    pack(&src, &pkg, &[]);
    let zip_path = dir.path().join("z.zip");
    {
        let mut w = zip::ZipWriter::new(fs::File::create(&zip_path).unwrap());
        w.start_file("from-zip.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        std::io::Write::write_all(&mut w, b"zip\n").unwrap();
        w.finish().unwrap();
    }
    let (p, z) = (fs::read(&pkg).unwrap(), fs::read(&zip_path).unwrap());
    // Package then ZIP: the end is a ZIP end record; the package is prepended data.
    let both = dir.path().join("pkg-then-zip");
    fs::write(&both, [p.clone(), z.clone()].concat()).unwrap();
    let ls = String::from_utf8(run(pkgfs().arg("ls").arg(&both)).stdout).unwrap();
    assert!(
        ls.contains("from-zip.txt") && !ls.contains("from-package.txt"),
        "{ls}"
    );
    // ZIP then package: the end is a seek table, whose frames are then not where the
    // table says (the seekable format has no notion of prepended data): refused with a
    // warning naming the file, never read as a mix of both.
    let both = dir.path().join("zip-then-pkg");
    fs::write(&both, [z, p].concat()).unwrap();
    let out = pkgfs().arg("ls").arg(&both).output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping"));
}

/// Extract `layer` into `out` with standard tools: `zstd -dc | tar x` for a package,
/// Info-ZIP `unzip` for a ZIP.
fn extract_layer(layer: &Path, out: &Path) {
    fs::create_dir_all(out).unwrap();
    let script = if layer.extension().is_some_and(|e| e == "zip") {
        r#"unzip -q "$1" -d "$2""#
    } else {
        r#"zstd -dc "$1" | tar -x --same-permissions -C "$2""#
    };
    sh(script, &[layer, out]);
}

/// Image layers with whiteouts (two made by `pkgfs pack`, one by Info-ZIP `zip`),
/// mounted with `--whiteouts`, against the same layers extracted with standard tools
/// and applied in order by an OCI-style unpacker (`oci_apply.py`).
#[test]
fn whiteouts_in_image_layers_match_an_oci_unpacker() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let w = |layer: &str, rel: &str, data: &[u8]| {
        let p = d.join(layer).join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        set_mtime(&p, 1_600_000_000);
    };
    let files: &[(&str, &str, &[u8])] = &[
        ("l1", "etc/passwd", b"root:x:0:0\n"),
        ("l1", "etc/motd", b"hello\n"),
        ("l1", "usr/lib/a.so", b"a"),
        ("l1", "usr/lib/b.so", b"b"),
        ("l1", "opt/x/1", b"1"),
        ("l1", "opt/x/2", b"2"),
        ("l1", "opt/y", b"y"),
        // Its own motd, whiteouts of a file, a symlink, a directory, an opaque
        // directory with a new file, and a whiteout of nothing.
        ("l2", "etc/motd", b"welcome\n"),
        ("l2", "etc/.wh.passwd", b""),
        ("l2", "etc/.wh.pw", b""),
        ("l2", "usr/.wh.lib", b""),
        ("l2", "opt/x/.wh..wh..opq", b""),
        ("l2", "opt/x/3", b"3"),
        ("l2", "new/.wh.nothing", b""),
        // Brings a whited-out directory back, and removes what the layer below added.
        ("l3", "usr/lib/c.so", b"c"),
        ("l3", "opt/x/.wh.3", b""),
        ("l3", "opt/x/4", b"4"),
    ];
    for (layer, rel, data) in files {
        w(layer, rel, data);
    }
    for (name, target) in [("pw", "passwd"), ("greeting", "motd")] {
        symlink(target, d.join("l1/etc").join(name)).unwrap();
        set_mtime(&d.join("l1/etc").join(name), 1_600_000_001);
    }
    for layer in ["l1", "l2", "l3"] {
        for e in walk(&d.join(layer)) {
            if e.is_dir() && !e.is_symlink() {
                fs::set_permissions(&e, fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
    }

    let layers = d.join("layers");
    fs::create_dir(&layers).unwrap();
    let (l1, l2, l3) = (
        layers.join("10-base.tar.zst"),
        layers.join("20-app.zip"),
        layers.join("30-fix.tar.zst"),
    );
    pack(&d.join("l1"), &l1, &[]);
    sh(r#"cd "$1" && zip -q -r -y "$2" ."#, &[&d.join("l2"), &l2]);
    pack(&d.join("l3"), &l3, &[]);

    let expected = d.join("expected");
    let mut unpacker = Command::new("python3");
    unpacker
        .arg(crate::common::repo().join("mount-tests/oci_apply.py"))
        .arg(&expected);
    for (i, layer) in [&l1, &l2, &l3].into_iter().enumerate() {
        let x = d.join(format!("x{i}"));
        extract_layer(layer, &x);
        unpacker.arg(x);
    }
    run(&mut unpacker);
    assert!(expected.join("etc/motd").exists() && !expected.join("etc/pw").exists());

    let m = Mount::new(&[&layers], &["--whiteouts"]);
    trees_match(&expected, &m.path(), &["--no-dir-mtime"]);
    let status = run(pkgfs().arg("status").arg(m.path()));
    assert!(String::from_utf8_lossy(&status.stdout).contains("whiteouts honoured"));
    let json = run(pkgfs().arg("status").arg("--json").arg(m.path()));
    assert!(String::from_utf8_lossy(&json.stdout).contains(r#""whiteouts":true"#));
    // Without the option the markers are ordinary files.
    let plain = Mount::new(&[&layers], &[]);
    assert!(plain.path().join("etc/.wh.passwd").exists());
    assert!(plain.path().join("usr/lib/a.so").exists());
    // The offline tools follow the option too.
    let ls = run(pkgfs().arg("ls").arg("--whiteouts").arg(&layers));
    let text = String::from_utf8_lossy(&ls.stdout);
    assert!(text.contains("usr/lib/c.so") && !text.contains(".wh.") && !text.contains("a.so"));
}

/// Every path under `root` (not following symlinks), `root` included.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        i += 1;
        if p.is_dir() && !p.is_symlink() {
            for e in fs::read_dir(&p).unwrap() {
                out.push(e.unwrap().path());
            }
        }
    }
    out
}

/// Tarballs as source releases and image layers come (GNU and pax formats, plain, gzip
/// and zstd, written by GNU tar), converted by `pkgfs pack TARBALL`: the mount shows the
/// tree that was archived, byte for byte and attribute by attribute.
#[test]
fn tarballs_convert_to_packages_that_mount_the_archived_tree() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src);
    for (name, format, filter) in [
        ("gnu.tar", "gnu", ""),
        ("pax.tar.gz", "pax", "| gzip"),
        ("gnu.tar.zst", "gnu", "| zstd -q"),
    ] {
        let tarball = dir.path().join(name);
        sh(
            &format!(r#"tar -C "$1" --format={format} --numeric-owner -cf - . {filter} > "$2""#),
            &[&src, &tarball],
        );
        let pkg = dir.path().join(format!("{name}.pkg"));
        pack(&tarball, &pkg, &["--frame-size", "64K"]);
        let m = Mount::new(&[&pkg], &[]);
        trees_match(&src, &m.path(), &[]);
    }
    // From a pipe, as `docker save` or a download hands a layer over.
    let piped = dir.path().join("piped.pkg");
    sh(
        r#"tar -C "$1" --numeric-owner -cf - . | gzip | "$2" pack - -o "$3""#,
        &[&src, Path::new(env!("CARGO_BIN_EXE_pkgfs")), &piped],
    );
    let m = Mount::new(&[&piped], &[]);
    trees_match(&src, &m.path(), &[]);
}

/// A hostile tarball (written by Python's `tarfile`): entries that would escape, and a
/// device, are skipped with a warning naming them; the rest is packed.
#[test]
fn converting_a_hostile_tarball_skips_what_would_escape() {
    let dir = tempfile::tempdir().unwrap();
    let tarball = dir.path().join("evil.tar.gz");
    let script = r#"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w:gz", format=tarfile.PAX_FORMAT) as t:
    for name, data in [("../escape", b"x"), ("/etc/abs", b"y"), ("ok/file", b"fine\n"),
                       ("ok/../../up", b"z")]:
        i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))
    d = tarfile.TarInfo("dev/null"); d.type = tarfile.CHRTYPE; d.devmajor = 1; d.devminor = 3
    t.addfile(d)
    l = tarfile.TarInfo("ok/link"); l.type = tarfile.LNKTYPE; l.linkname = "../../etc/passwd"
    t.addfile(l)
"#;
    run(Command::new("python3").arg("-c").arg(script).arg(&tarball));
    let pkg = dir.path().join("evil.pkg");
    let out = run(pkgfs().arg("pack").arg(&tarball).arg("-o").arg(&pkg));
    let err = String::from_utf8_lossy(&out.stderr);
    for name in [
        "../escape",
        "/etc/abs",
        "ok/../../up",
        "dev/null",
        "ok/link",
    ] {
        assert!(err.contains(&format!("skipping {name:?}")), "{name}: {err}");
    }
    let cat = run(pkgfs().arg("cat").arg(&pkg).arg("ok/file"));
    assert_eq!(cat.stdout, b"fine\n");
    let ls = run(pkgfs().arg("ls").arg(&pkg));
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert_eq!(listed.lines().count(), 2, "ok and ok/file only: {listed}");
}
