//! Mount tests of container images: a Debian root (debootstrap) made into a three-layer
//! OCI image by umoci, copied by skopeo to zstd, zstd:chunked, gzip, an oci-archive and a
//! docker-archive, converted by stargz-snapshotter to eStargz and its own zstd:chunked
//! (`mount-tests/images/make_images.sh`, built once into `target/image-fixtures`). Every
//! copy, mounted by reference (`oci:DIR`, `oci-archive:FILE`, `docker-archive:FILE`), is
//! compared byte for byte and owner for owner with umoci's own unpack; the image's
//! programs run from the mount in a chroot; tools' quirks and hand-made hostile images
//! are refused or contained.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::{Mount, pkgfs, repo, require_fuse, run, status_json, trees_match};

/// The fixtures, built on first use (about a minute and a half; then cached).
pub fn images() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("target dir")
            .join("image-fixtures");
        run(Command::new("bash")
            .arg(repo().join("mount-tests/images/make_images.sh"))
            .arg(&dir));
        dir
    })
}

/// The image `reference` (`oci:…` relative to the fixtures), mounted with an index cache
/// of its own under `tmp`.
fn mount(reference: &str, tmp: &Path, extra: &[&str]) -> Mount {
    let source = image_ref(reference);
    let cache = tmp.join("index-cache").display().to_string();
    let mut args = vec!["--index-cache", cache.as_str()];
    args.extend_from_slice(extra);
    Mount::new(&[Path::new(&source)], &args)
}

/// `transport:PATH[:REF]` with PATH made absolute under the fixtures.
fn image_ref(reference: &str) -> String {
    let (transport, rest) = reference.split_once(':').expect("transport:path");
    format!("{transport}:{}/{rest}", images().display())
}

/// The layer digests of `layout` as its own catalogue (fixtures.json) lists them.
fn catalogue_digests(layout: &str) -> Vec<String> {
    let cat: serde_json::Value =
        serde_json::from_slice(&fs::read(images().join("fixtures.json")).unwrap()).unwrap();
    cat["images"][layout]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// The image's own programs run from `root` in a chroot: its self-test script and
/// `dpkg -l`, each printing what it printed from umoci's unpack.
pub fn runs_its_programs(root: &Path) {
    assert_eq!(
        in_chroot(root, &["/usr/local/bin/pkgfs-selftest"]),
        fs::read_to_string(images().join("reference.selftest")).unwrap()
    );
    assert_eq!(
        in_chroot(root, &["dpkg", "-l"]),
        fs::read_to_string(images().join("reference.dpkg-l")).unwrap()
    );
}

/// Run `args` in a chroot of `root`; its standard output.
pub fn in_chroot(root: &Path, args: &[&str]) -> String {
    let out = run(Command::new("chroot").arg(root).args(args).env_clear().env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ));
    String::from_utf8(out.stdout).unwrap()
}

crate::on_both_transports! {
    /// umoci's image, by `oci:DIR:TAG`: the mount equals `umoci unpack` (content, modes,
    /// owners, times, symlinks, hard links, devices, a FIFO, xattrs and a file
    /// capability), the image's own dpkg and shell script run from it in a chroot, and
    /// status names the image and the digests of its layers.
    fn an_umoci_image_equals_its_unpack_and_runs_its_programs() {
        let dir = tempfile::tempdir().unwrap();
        let m = mount("oci:oci-gzip:latest", dir.path(), &[]);
        let reference = images().join("reference/rootfs");
        trees_match(&reference, &m.path(), &[]);
        runs_its_programs(&m.path());
        let st = status_json(&m.path());
        let img = &st["images"][0];
        assert!(img["reference"].as_str().unwrap().starts_with("oci:"), "{st}");
        assert!(img["manifest"].as_str().unwrap().starts_with("sha256:"));
        assert_eq!(img["platform"], "linux/amd64");
        let digests: Vec<String> = img["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(digests, catalogue_digests("oci-gzip"));
        for p in st["packages"].as_array().unwrap() {
            assert_eq!(p["format"], "tar.gz", "{p}");
            assert_eq!(p["checked"], "digest", "{p}");
        }
        assert!(st["whiteouts"].as_bool().unwrap(), "whiteouts are on for images");
        assert!(
            !m.stderr.contains("conflicts"),
            "an image's own layering is no conflict: {}",
            m.stderr
        );
    }
}

/// Every other copy of the image (skopeo's zstd, zstd:chunked, gzip, oci-archive and
/// docker-archive; stargz-snapshotter's eStargz and zstd:chunked) mounts equal to the
/// reference unpack, each layer checked in its own way; a second mount reads the indexes
/// from the cache; the chroot runs on a table-of-contents image too.
#[test]
fn every_copy_of_the_image_equals_the_reference() {
    if !require_fuse() {
        return;
    }
    let reference = images().join("reference/rootfs");
    let copies = [
        ("oci:oci-zstd", "tar.zst", "digest"),
        ("oci:oci-zstd-chunked", "zstd:chunked", "toc"),
        ("oci:oci-gzip-skopeo:latest", "tar.gz", "digest"),
        ("oci-archive:oci-archive.tar", "tar.gz", "digest"),
        (
            "docker-archive:docker-archive.tar:pkgfs/debian:latest",
            "tar",
            "digest",
        ),
        ("oci:oci-estargz", "estargz", "toc"),
        ("oci:oci-zstd-chunked-ctr", "zstd:chunked", "toc"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (reference_name, format, checked) in copies {
        let path = reference_name.split(':').nth(1).unwrap();
        if !images().join(path).exists() {
            // The stargz-snapshotter copies are optional (PKGFS_IMAGES_ESTARGZ=0).
            assert!(!crate::common::strict(), "{path} was not built");
            continue;
        }
        for round in ["first", "cached"] {
            let m = mount(reference_name, dir.path(), &[]);
            trees_match(&reference, &m.path(), &[]);
            let st = status_json(&m.path());
            for p in st["packages"].as_array().unwrap() {
                assert_eq!(p["format"], format, "{reference_name}: {p}");
                assert_eq!(p["checked"], checked, "{reference_name}: {p}");
                if round == "cached" && checked == "digest" {
                    // A pass (or a whole-blob hash) is made once: the second mount
                    // reads the cache (small layers may be read directly).
                    assert_ne!(p["index"], "pass", "{reference_name}: {p}");
                }
            }
            if reference_name == "oci:oci-zstd-chunked" && round == "first" {
                assert_eq!(
                    in_chroot(&m.path(), &["/usr/local/bin/pkgfs-selftest"]),
                    fs::read_to_string(images().join("reference.selftest")).unwrap()
                );
            }
        }
    }
}

/// Layers with a table of contents cost the table at mount and then only the chunks
/// read: reading one file of a mounted eStargz or zstd:chunked image reads a small part
/// of its layers (the goal for a container's start: under 10 %).
#[test]
fn table_of_contents_layers_read_only_what_is_asked() {
    if !require_fuse() {
        return;
    }
    for layout in ["oci-zstd-chunked", "oci-estargz"] {
        if !images().join(layout).exists() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        // No read-ahead: only what the reader asks for.
        let m = mount(&format!("oci:{layout}"), dir.path(), &["--prefetch", "0"]);
        let bash = fs::read(m.path().join("usr/bin/bash")).unwrap();
        assert_eq!(
            bash,
            fs::read(images().join("reference/rootfs/usr/bin/bash")).unwrap()
        );
        let st = status_json(&m.path());
        let read = st["archive_bytes_read"].as_u64().unwrap();
        let total: u64 = st["images"][0]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["size"].as_u64().unwrap())
            .sum();
        assert!(
            read > 0 && read * 20 < total,
            "{layout}: {read} of {total} bytes of layers read for one file"
        );
    }
}

/// Tools' own quirks: umoci 0.4.7's `insert` writes layers that stop right after the
/// last file's data (no padding, no end blocks), and skopeo once labelled plain tar
/// layers as gzip. Both mount as their listing says (formats are found by content).
#[test]
fn images_with_tool_quirks_mount_as_listed() {
    if !require_fuse() {
        return;
    }
    for quirk in ["umoci-insert", "skopeo-mislabelled"] {
        let dir = tempfile::tempdir().unwrap();
        let m = mount(&format!("oci:quirks/{quirk}"), dir.path(), &[]);
        let out = run(Command::new("python3")
            .arg(repo().join("mount-tests/images/ocitool.py"))
            .arg("tree")
            .arg(m.path()));
        let want = fs::read_to_string(images().join(format!("quirks/{quirk}.tree"))).unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        // Directories a layer only implies take the time of the layer's blob: the
        // listing leaves directory times out, so this compares everything it has.
        assert_eq!(got, want, "{quirk}");
    }
}

/// Broken and hostile images (`hostile.py`): each is refused with an error that names
/// the flaw, or mounted with nothing outside the image served.
#[test]
fn hostile_images_are_refused_or_contained() {
    if !require_fuse() {
        return;
    }
    let refused = [
        ("missing-blob", "is missing from the image"),
        ("missing-manifest", "is missing from the image"),
        ("digest-mismatch", "does not match its digest"),
        ("size-mismatch", "its descriptor says"),
        ("bad-json", "is not valid"),
        ("huge-manifest", "more than the 4 MiB pkgfs reads"),
        ("many-layers", "more than the 4 MiB pkgfs reads"),
        ("nested-index", "nest more than 8 deep"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    for (case, why) in refused {
        let out = pkgfs()
            .arg("mount")
            .arg(image_ref(&format!("oci:hostile/{case}")))
            .arg(&mp)
            .args(["--index-cache"])
            .arg(dir.path().join("cache"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case} mounted");
        assert!(err.contains(why), "{case}: {err}");
        assert!(
            err.contains(&format!("hostile/{case}")),
            "{case} is named: {err}"
        );
        assert!(!crate::common::is_mountpoint(&mp), "{case} left a mount");
    }

    // Unsafe paths: the entries that would leave the root are skipped, named; the
    // rest, and the legitimate whiteout, apply.
    let m = mount("oci:hostile/unsafe-paths", dir.path(), &[]);
    let mut names: Vec<String> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "after.txt", "dot-slash.txt"]);
    assert_eq!(
        fs::read_to_string(m.path().join("a/double/slash.txt")).unwrap(),
        "doubled slashes\n"
    );
    for skipped in ["../escape-dotdot.txt", "/abs-path.txt", "hardlink-abs"] {
        assert!(m.stderr.contains(skipped), "{skipped}: {}", m.stderr);
    }
    drop(m);

    // Symlinks that point out are served as they are and never followed: what layer 2
    // writes "through" them is a directory of the mount, as overlayfs makes it.
    let m = mount("oci:hostile/symlink-escape", dir.path(), &[]);
    assert_eq!(
        fs::read_link(m.path().join("escape-abs")).unwrap(),
        Path::new("/../../etc/passwd")
    );
    assert!(m.path().join("escape-rel").is_dir());
    assert!(
        m.path().join("escape-rel/pkgfs-pwned").is_file()
            && !Path::new("/etc/pkgfs-pwned").exists()
            && !Path::new("/tmp/pkgfs-pwned").exists()
    );
    assert!(!m.path().join("hardlink-through").exists());
    drop(m);

    // A gzip stream cut in half (its digest matches what is there): the layer mounts,
    // the file whose bytes are missing reads EIO, at once.
    let m = mount("oci:hostile/truncated-gzip", dir.path(), &[]);
    let err = fs::read(m.path().join("data.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(m);

    // 1 GiB of zeros in 1 MiB of gzip: served lazily, its end read without decoding it
    // all again, the daemon's memory bounded.
    let m = mount("oci:hostile/gzip-bomb", dir.path(), &[]);
    let f = fs::File::open(m.path().join("zeros.bin")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 30);
    let mut tail = vec![1u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, (1 << 30) - 4096).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    let pid = status_json(&m.path())["pid"].as_u64().unwrap();
    let rss_kb: u64 = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(rss_kb < 512 * 1024, "daemon RSS {rss_kb} kB after the bomb");
}

/// A multi-platform index (`skopeo copy --all`): the mount takes this machine's image,
/// `--platform` another's; a platform the index lacks is an error that lists what it
/// has; a tag can name a manifest directly.
#[test]
fn a_multi_platform_image_mounts_this_machine_s_or_the_asked_platform() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("multi");
    run(Command::new("python3")
        .arg(repo().join("mount-tests/images/multiarch.py"))
        .arg(&layout));
    let src = format!("oci:{}:latest", layout.display());
    let host = match std::env::consts::ARCH {
        "x86_64" => "linux/amd64",
        "aarch64" => "linux/arm64/v8",
        _ => return,
    };
    let m = Mount::new(&[Path::new(&src)], &[]);
    assert_eq!(
        fs::read_to_string(m.path().join("platform")).unwrap(),
        format!("{host}\n")
    );
    drop(m);
    let m = Mount::new(&[Path::new(&src)], &["--platform", "linux/s390x"]);
    assert_eq!(
        fs::read_to_string(m.path().join("platform")).unwrap(),
        "linux/s390x\n"
    );
    assert_eq!(
        status_json(&m.path())["images"][0]["platform"],
        "linux/s390x"
    );
    drop(m);
    let out = pkgfs()
        .args(["ls", "--platform", "linux/riscv64", &src])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no image for linux/riscv64") && err.contains("linux/arm64"),
        "{err}"
    );
    let out = run(pkgfs().args([
        "cat",
        &format!("oci:{}:amd64-only", layout.display()),
        "platform",
    ]));
    assert_eq!(out.stdout, b"linux/amd64\n");
}

/// `ls`, `cat` and `check` take image references as `mount` does.
#[test]
fn offline_tools_take_image_references() {
    if !require_fuse() {
        return;
    }
    let src = image_ref("oci:oci-gzip:latest");
    let out = run(pkgfs().args(["cat", &src, "etc/hostname"]));
    assert_eq!(out.stdout, b"pkgfs-fixture\n");
    let out = run(pkgfs().args(["ls", &src, "etc/default"]));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("etc/default/pkgfs") && !text.contains("pkgfs-layer2"),
        "{text}"
    );
    assert!(text.contains("layer 3/3 (sha256:"), "{text}");
    let archive = image_ref("docker-archive:docker-archive.tar");
    let out = run(pkgfs().args(["check", &archive]));
    assert!(out.status.success());
}

/// A container runtime runs the image from the mount as its root filesystem: `runc run`
/// on a bundle whose `rootfs` is the mount (mounted `-o suid,dev`, as a container's root
/// wants), read-only, the image's own script as the process.
#[test]
fn a_container_runtime_runs_the_image_from_the_mount() {
    if !crate::common::require_tools(&["runc"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    let source = image_ref("oci:oci-gzip:latest");
    run(pkgfs()
        .args(["mount", "-q", "-o", "suid,dev", "--index-cache"])
        .arg(dir.path().join("cache"))
        .arg(&source)
        .arg(&rootfs));
    let _guard = crate::common::UmountGuard(&rootfs);
    assert_eq!(
        in_runc(&rootfs, &["/usr/local/bin/pkgfs-selftest"]),
        fs::read_to_string(images().join("reference.selftest")).unwrap()
    );
    run(pkgfs().arg("umount").arg(&rootfs));
}

/// Run `args` under runc in a bundle whose read-only root is `rootfs`; its output.
pub fn in_runc(rootfs: &Path, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path();
    run(Command::new("runc").arg("spec").current_dir(bundle));
    let spec = bundle.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&fs::read(&spec).unwrap()).unwrap();
    c["process"]["terminal"] = false.into();
    c["process"]["args"] = serde_json::json!(args);
    c["root"] = serde_json::json!({"path": rootfs, "readonly": true});
    fs::write(&spec, serde_json::to_vec(&c).unwrap()).unwrap();
    let name = format!(
        "pkgfs-test-{}-{}",
        std::process::id(),
        rootfs.display().to_string().len() + args.len()
    );
    let out = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(&name)
        .output()
        .unwrap();
    let _ = Command::new("runc")
        .args(["delete", "--force", &name])
        .output();
    assert!(
        out.status.success(),
        "runc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
