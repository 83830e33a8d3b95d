//! Verified reads (`pkgfs seal`, `mount --verify`): keys made by `ssh-keygen`, seals
//! checked by `ssh-keygen -Y verify`; a sealed store on local disk, served by nginx and
//! by an S3 server (moto), then tampered with: a byte flipped inside a member, an
//! unsealed archive added, an archive swapped for another's bytes, an older seal
//! restored, a seal signed by another key, a truncated seal. Each refused or failed as
//! it should, the rest read right.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{
    Mount, expect_matches, fixtures, pkgfs, repo, require_fuse, require_tools, run, skipped_rows,
    status_json, wait_until,
};
use crate::remote::{Moto, Nginx, big_zip};

/// A store, a key that seals it and the allowed-signers file that trusts the key; the
/// state directory of accepted revisions (as `XDG_STATE_HOME`).
struct Sealed {
    dir: tempfile::TempDir,
}

impl Sealed {
    /// The `basic` fixtures and a 20 MiB stored ZIP, sealed by a new ed25519 key.
    fn new() -> Sealed {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let store = d.join("www/store");
        fs::create_dir_all(&store).unwrap();
        for e in fs::read_dir(fixtures().join("basic")).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                fs::copy(e.path(), store.join(e.file_name())).unwrap();
            }
        }
        big_zip(&store);
        let s = Sealed { dir };
        s.keygen("key", "ci@pkgfs.example");
        fs::write(
            d.join("allowed"),
            format!(
                "ci@pkgfs.example namespaces=\"pkgfs\" {}",
                fs::read_to_string(d.join("key.pub")).unwrap()
            ),
        )
        .unwrap();
        // The directories (a temporary directory is 0700) open to nginx's workers; the
        // files keep the modes they were written with (the seal's must be readable).
        run(Command::new("chmod")
            .args(["a+rx"])
            .arg(d.as_path())
            .arg(d.join("www")));
        s.seal("key", &[]);
        run(Command::new("find")
            .arg(d.join("www"))
            .args(["-type", "d", "-exec", "chmod", "a+rx", "{}", "+"]));
        s
    }

    fn keygen(&self, name: &str, comment: &str) {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(self.dir.path().join(name)));
    }

    fn seal(&self, key: &str, extra: &[&str]) {
        run(pkgfs()
            .arg("seal")
            .arg(self.store())
            .arg("--key")
            .arg(self.dir.path().join(key))
            .args(extra));
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("www/store")
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![(
            "XDG_STATE_HOME",
            self.dir.path().join("state").display().to_string(),
        )]
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--verify".into(),
            self.dir.path().join("allowed").display().to_string(),
            "--no-index-cache".into(),
            "--no-disk-cache".into(),
        ]
    }

    /// `pkgfs mount --verify SOURCE`, with `env` added.
    fn mount(&self, source: &str, extra: &[&str], env: &[(&str, String)]) -> Mount {
        let mut args = self.args();
        if extra.contains(&"--disk-cache") {
            args.retain(|a| a != "--no-disk-cache");
        }
        if extra.contains(&"--index-cache") {
            args.retain(|a| a != "--no-index-cache");
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut all = self.env();
        all.extend(env.iter().map(|(k, v)| (*k, v.clone())));
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Mount::with_env(&[Path::new(source)], &args, &all)
    }

    /// `pkgfs mount --verify` that must fail: its standard error.
    fn refused(&self, source: &str, extra: &[&str]) -> String {
        self.refused_in(source, extra, &[])
    }

    /// The same with `env` added.
    fn refused_with_env(&self, source: &str, env: &[(&str, String)]) -> String {
        self.refused_in(source, &[], env)
    }

    fn refused_in(&self, source: &str, extra: &[&str], env: &[(&str, String)]) -> String {
        let mp = tempfile::tempdir().unwrap();
        let out = pkgfs()
            .arg("mount")
            .args(self.args())
            .args(extra)
            .arg(source)
            .arg(mp.path())
            .envs(self.env())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        if out.status.success() {
            let _ = pkgfs().arg("umount").arg(mp.path()).output();
            panic!("mounted {source} {extra:?}");
        }
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn tools() -> bool {
    require_fuse() && require_tools(&["ssh-keygen", "zip", "nginx", "python3"])
}

/// Flip one byte, `at` bytes into the data of member `member` of the ZIP `zip`.
fn flip_in_member(zip: &Path, member: &str, at: u64) {
    let code = format!(
        "import zipfile\nz = zipfile.ZipFile({zip:?})\ni = z.getinfo({member:?})\n\
         off = i.header_offset + 30 + len(i.filename.encode()) + len(i.extra) + {at}\n\
         z.close()\nf = open({zip:?}, 'r+b')\nf.seek(off)\nb = f.read(1)\nf.seek(off)\n\
         f.write(bytes([b[0] ^ 1]))\nf.close()\n",
        zip = zip.to_str().unwrap()
    );
    run(Command::new("python3").arg("-c").arg(code));
}

/// The bytes of member `member` of the ZIP `zip`, as Python's zipfile reads them.
fn member(zip: &Path, member: &str) -> Vec<u8> {
    let code = format!(
        "import sys, zipfile\nsys.stdout.buffer.write(zipfile.ZipFile({:?}).read({member:?}))",
        zip.to_str().unwrap()
    );
    run(Command::new("python3").arg("-c").arg(code)).stdout
}

/// `store`'s seal recomputed by `seal_check.py` (hashlib, docs/FORMAT.md alone).
fn seal_matches_hashlib(store: &Path) {
    let out = Command::new("python3")
        .arg(repo().join("mount-tests/seal_check.py"))
        .arg(store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the seal of {} is not what hashlib makes of the store: {}{}",
        store.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sealed directory mounts equal to the model, its signature
/// checks with `ssh-keygen -Y verify`, status names the signer and counts the blocks;
/// then tampered with: a flipped byte fails the reads of its block only (EIO, logged,
/// counted), an unsealed archive is skipped, an archive holding another's bytes is
/// refused, an older seal, another key's and a truncated one refuse the mount (the older
/// one mounts with --allow-rollback).
#[test]
fn a_sealed_directory_mounts_checked_and_tampering_is_caught() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let store = s.store();
    // ssh-keygen checks the signature on its own.
    let out = run(Command::new("ssh-keygen")
        .args([
            "-Y",
            "verify",
            "-n",
            "pkgfs",
            "-I",
            "ci@pkgfs.example",
            "-f",
        ])
        .arg(s.dir.path().join("allowed"))
        .arg("-s")
        .arg(store.join("pkgfs.seal.sig"))
        .stdin(fs::File::open(store.join("pkgfs.seal")).unwrap()));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Good \"pkgfs\" signature"));
    // Sums, tree roots and tree files as hashlib makes them.
    seal_matches_hashlib(&store);
    let m = s.mount(store.to_str().unwrap(), &[], &[]);
    expect_matches(&m.path(), &[&store], &[]);
    // The members of big.zip as sealed.
    let big = store.join("big.zip");
    let sealed: Vec<Vec<u8>> = (0..5).map(|i| member(&big, &format!("f{i}.bin"))).collect();
    let st = status_json(&m.path());
    let seal = &st["seals"][0];
    assert_eq!(seal["signer"], "ci@pkgfs.example", "{st}");
    assert!(seal["blocks_checked"].as_u64().unwrap() > 300, "{seal}");
    assert_eq!(seal["failures"], 0);
    assert!(st["skipped"].as_array().unwrap().is_empty(), "{st}");
    drop(m);

    // A byte flipped inside f2.bin of big.zip, an unsealed archive added, a sealed
    // archive's name holding another's bytes.
    flip_in_member(&big, "f2.bin", 1_000_000);
    fs::copy(
        fixtures()
            .join("basic")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
        store.join("zz-unsealed.zip"),
    )
    .unwrap();
    let names: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "zip" || e == "whl")
                    && !p.ends_with("big.zip")
                    && !p.ends_with("zz-unsealed.zip")
            })
            .collect();
        v.sort();
        v
    };
    fs::copy(&names[1], &names[0]).unwrap();
    let m = s.mount(store.to_str().unwrap(), &[], &[]);
    let err = fs::read(m.path().join("f2.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    for i in [0, 1, 3, 4] {
        assert_eq!(
            fs::read(m.path().join(format!("f{i}.bin"))).unwrap(),
            sealed[i],
            "f{i}.bin"
        );
    }
    let st = status_json(&m.path());
    assert!(st["seals"][0]["failures"].as_u64().unwrap() >= 1, "{st}");
    let skipped: Vec<String> = skipped_rows(&st);
    assert!(
        skipped
            .iter()
            .any(|r| r.contains("zz-unsealed.zip") && r.contains("not in the seal")),
        "{skipped:?}"
    );
    let swapped = names[0].file_name().unwrap().to_str().unwrap();
    assert!(skipped.iter().any(|r| r.contains(swapped)), "{skipped:?}");
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("big.zip: block") && log.contains("does not match its seal"),
        "{log}"
    );
    drop(m);

    // Sealed again (revision 2, accepted by a mount), then the first seal restored.
    let old: Vec<(PathBuf, Vec<u8>)> = ["pkgfs.seal", "pkgfs.seal.sig"]
        .iter()
        .map(|n| (store.join(n), fs::read(store.join(n)).unwrap()))
        .collect();
    s.seal("key", &[]);
    drop(s.mount(store.to_str().unwrap(), &[], &[]));
    for (p, b) in &old {
        fs::write(p, b).unwrap();
    }
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(
        err.contains("older than revision") && err.contains("--allow-rollback"),
        "{err}"
    );
    drop(s.mount(store.to_str().unwrap(), &["--allow-rollback"], &[]));
    // Signed by a key that is not allowed.
    s.keygen("other", "intruder@example");
    s.seal("other", &[]);
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(err.contains("not an allowed signer"), "{err}");
    // A truncated seal: its signature fails.
    s.seal("key", &[]);
    seal_matches_hashlib(&store);
    let count = seal_field(&store, "archives");
    let text = fs::read(store.join("pkgfs.seal")).unwrap();
    fs::write(store.join("pkgfs.seal"), &text[..text.len() / 2]).unwrap();
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(err.contains("its seal is refused"), "{err}");
    // A seal whose signature is good but whose list is malformed (one archive fewer
    // than its header says): refused for what is wrong with it.
    let text = String::from_utf8(text).unwrap();
    let short = text.replace(
        &format!("archives {count}\n"),
        &format!("archives {}\n", count + 1),
    );
    fs::write(store.join("pkgfs.seal"), &short).unwrap();
    fs::remove_file(store.join("pkgfs.seal.sig")).unwrap();
    run(Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", "pkgfs", "-f"])
        .arg(s.dir.path().join("key"))
        .arg(store.join("pkgfs.seal")));
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(
        err.contains(&format!(
            "pkgfs.seal: says {} archives, lists {count}",
            count + 1
        )) && !err.contains("refused:"),
        "{err}"
    );
    // No seal at all.
    fs::remove_file(store.join("pkgfs.seal")).unwrap();
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(err.contains("no seal"), "{err}");
    // Images only pinned by digest.
    let err = s.refused("docker://127.0.0.1:1/x:latest", &[]);
    assert!(err.contains("pinned by its digest"), "{err}");
}

/// A sealed store served by nginx mounts checked, equal to the model; a byte flipped on
/// the server fails that file's reads only and is never written to the disk cache; an
/// older seal restored on the server and a missing signature refuse the mount.
#[test]
fn a_sealed_store_over_http_is_checked_and_tampering_on_the_server_is_caught() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let nginx = Nginx::start(&s.dir.path().join("www"));
    let url = nginx.url("store/");
    let m = s.mount(&url, &[], &[]);
    expect_matches(&m.path(), &[&s.store()], &[]);
    let st = status_json(&m.path());
    assert_eq!(st["seals"][0]["source"], url.as_str(), "{st}");
    drop(m);
    let big = s.store().join("big.zip");
    let (f1, f2, f4) = (
        member(&big, "f1.bin"),
        member(&big, "f2.bin"),
        member(&big, "f4.bin"),
    );
    flip_in_member(&big, "f3.bin", 100_000);
    let cache = s.dir.path().join("disk-cache");
    let m = s.mount(&url, &["--disk-cache", cache.to_str().unwrap()], &[]);
    assert_eq!(fs::read(m.path().join("f2.bin")).unwrap(), f2);
    // f3.bin's tampered block is fetched (the read fails on it) ...
    let err = fs::read(m.path().join("f3.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let st = status_json(&m.path());
    assert!(st["seals"][0]["failures"].as_u64().unwrap() >= 1, "{st}");
    // ... then 64 KiB in the middle of f4.bin, fetched after it (2 MiB from what was
    // read before): the disk cache's writer stores ranges in the order they were
    // fetched, so once those bytes are on disk, whatever was kept of the fetch that held
    // the tampered block is on disk too.
    let mid = f4.len() / 2;
    let later = &f4[mid..mid + (64 << 10)];
    let mut got = vec![0u8; later.len()];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(m.path().join("f4.bin")).unwrap(),
        &mut got,
        mid as u64,
    )
    .unwrap();
    assert!(got == later, "f4.bin at {mid}");
    let probe = &later[later.len() - 4096..];
    wait_until(
        Duration::from_secs(10),
        "the middle of f4.bin written to the disk cache",
        || {
            walk_files(&cache)
                .iter()
                .any(|f| fs::read(f).is_ok_and(|b| b.windows(probe.len()).any(|w| w == probe)))
        },
    );
    let served = fs::read(&big).unwrap();
    let code = format!(
        "import zipfile\nz = zipfile.ZipFile({:?})\ni = z.getinfo('f3.bin')\n\
         print(i.header_offset + 30 + len(i.filename.encode()) + len(i.extra) + 100000)",
        big.to_str().unwrap()
    );
    let at: usize = String::from_utf8(run(Command::new("python3").arg("-c").arg(code)).stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let block = seal_field(&s.store(), "block-size") as usize;
    let tampered = &served[at / block * block..(at / block + 1) * block];
    for f in walk_files(&cache) {
        let bytes = fs::read(&f).unwrap();
        assert!(
            !bytes.windows(tampered.len()).any(|w| w == tampered),
            "{} holds the tampered block",
            f.display()
        );
    }
    assert_eq!(fs::read(m.path().join("f1.bin")).unwrap(), f1);
    drop(m);
    // An older seal restored on the server: refused once a newer one was accepted.
    let old_root = fs::read_to_string(s.store().join("pkgfs.seal")).unwrap();
    let old_sig = fs::read(s.store().join("pkgfs.seal.sig")).unwrap();
    let rev = seal_field(&s.store(), "revision");
    s.seal("key", &["--revision", &(rev + 1).to_string()]);
    drop(s.mount(&url, &[], &[]));
    fs::write(s.store().join("pkgfs.seal"), &old_root).unwrap();
    fs::write(s.store().join("pkgfs.seal.sig"), &old_sig).unwrap();
    let err = s.refused(&url, &[]);
    assert!(
        err.contains("older than revision") && err.contains("--allow-rollback"),
        "{err}"
    );
    // The seal is fetched by name, while the store is listed: a missing one is named.
    fs::remove_file(s.store().join("pkgfs.seal.sig")).unwrap();
    let err = s.refused(&url, &[]);
    assert!(err.contains("no seal (pkgfs.seal.sig is missing)"), "{err}");
}

/// The number a header line of `store`'s seal gives (`revision`, `block-size`).
fn seal_field(store: &Path, field: &str) -> u64 {
    fs::read_to_string(store.join("pkgfs.seal"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} line in the seal"))
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The same on S3 (moto): seal, trees and archives uploaded under a prefix; an archive
/// replaced on the server by other bytes fails its reads, an unsealed one is skipped,
/// an older seal uploaded again refuses the mount.
#[test]
fn a_sealed_store_on_s3_is_checked() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let moto = Moto::start();
    let store = s.store();
    moto.boto("s3.create_bucket(Bucket='pkgs')");
    upload(&moto, &store, &store_files(&store));
    // A mount's times are the objects' (their upload): the local files take them, for
    // the model.
    moto.boto(&format!(
        "import os\nfor o in s3.list_objects_v2(Bucket='pkgs', Prefix='repo/')['Contents']:\n    \
         t = o['LastModified'].timestamp()\n    os.utime(os.path.join({:?}, o['Key'][5:]), (t, t))",
        store.to_str().unwrap()
    ));
    let env = moto.env();
    let m = s.mount("s3://pkgs/repo/", &[], &env);
    expect_matches(&m.path(), &[&store], &[]);
    drop(m);
    // big.zip replaced on the server by bytes of the same size, another file added.
    let other = s.dir.path().join("other.zip");
    fs::copy(store.join("big.zip"), &other).unwrap();
    flip_in_member(&other, "f0.bin", 1_500_000);
    moto.boto(&format!(
        "s3.upload_file({:?}, 'pkgs', 'repo/big.zip')\ns3.upload_file({:?}, 'pkgs', 'repo/zz-new.zip')",
        other.to_str().unwrap(),
        other.to_str().unwrap()
    ));
    let m = s.mount("s3://pkgs/repo/", &[], &env);
    match fs::read(m.path().join("f0.bin")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        Ok(b) => panic!("f0.bin of the replaced big.zip read ({} bytes)", b.len()),
    }
    assert_eq!(
        fs::read(m.path().join("f4.bin")).unwrap(),
        member(&store.join("big.zip"), "f4.bin")
    );
    let st = status_json(&m.path());
    assert!(st["skipped"].to_string().contains("zz-new.zip"), "{st}");
    drop(m);
    // A newer seal accepted, then the older one uploaded again: refused.
    let seal_files = [store.join("pkgfs.seal"), store.join("pkgfs.seal.sig")];
    let old: Vec<Vec<u8>> = seal_files.iter().map(|f| fs::read(f).unwrap()).collect();
    let rev = seal_field(&store, "revision");
    s.seal("key", &["--revision", &(rev + 1).to_string()]);
    upload(&moto, &store, &store_files(&store));
    drop(s.mount("s3://pkgs/repo/", &[], &env));
    for (f, bytes) in seal_files.iter().zip(&old) {
        fs::write(f, bytes).unwrap();
    }
    upload(&moto, &store, &seal_files);
    let err = s.refused_with_env("s3://pkgs/repo/", &env);
    assert!(err.contains("older than revision"), "{err}");
}

/// A polled sealed store changes only together with a newer seal: an archive uploaded
/// without one stays out (ENOENT, skipped as unsealed), an archive replaced in place
/// without one fails the reads of its changed block (EIO, never the new bytes), and once
/// the new seal is uploaded both are activated.
#[test]
fn a_polled_sealed_store_changes_only_with_a_new_seal() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let moto = Moto::start();
    let store = s.store();
    moto.boto("s3.create_bucket(Bucket='pkgs')");
    upload(&moto, &store, &store_files(&store));
    let env = moto.env();
    let m = s.mount("s3://pkgs/repo/", &["--poll", "1s"], &env);
    assert!(m.path().join("f0.bin").exists());
    let big = store.join("big.zip");
    let f0 = member(&big, "f0.bin");
    // A new archive, then big.zip replaced in place by bytes of the same size (one byte
    // of f0.bin flipped), no new seal.
    let staged = s.dir.path().join("staged");
    fs::create_dir(&staged).unwrap();
    fs::write(staged.join("new-file.txt"), b"sealed later\n").unwrap();
    run(Command::new("zip")
        .current_dir(&staged)
        .args(["-q", "-X"])
        .arg(store.join("zz-new.zip"))
        .arg("new-file.txt"));
    let other = s.dir.path().join("other.zip");
    fs::copy(&big, &other).unwrap();
    flip_in_member(&other, "f0.bin", 1_500_000);
    let mut f0_new = f0.clone();
    f0_new[1_500_000] ^= 1;
    upload(&moto, &store, &[store.join("zz-new.zip")]);
    // A poll lists it and refuses it (nothing active changes): status names it.
    wait_until(
        Duration::from_secs(20),
        "the unsealed archive named skipped",
        || {
            let st = status_json(&m.path()).to_string();
            st.contains("zz-new.zip") && st.contains("not in the seal")
        },
    );
    let err = fs::metadata(m.path().join("new-file.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    moto.boto(&format!(
        "s3.upload_file({:?}, 'pkgs', 'repo/big.zip')",
        other.to_str().unwrap()
    ));
    wait_until(
        Duration::from_secs(20),
        "the replaced big.zip is activated",
        || {
            m.log_text()
                .lines()
                .any(|l| l.contains("activating new version of package") && l.contains("big.zip"))
        },
    );
    // Its reads: the sealed bytes or EIO, never the new bytes.
    let f = fs::File::open(m.path().join("f0.bin")).unwrap();
    let mut eio = 0;
    for off in (0..f0.len()).step_by(128 << 10) {
        let mut buf = vec![0u8; (128 << 10).min(f0.len() - off)];
        match std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, off as u64) {
            Ok(()) => assert!(
                buf == f0[off..off + buf.len()],
                "f0.bin at {off}: not as sealed"
            ),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "f0.bin at {off}: {e}");
                eio += 1;
            }
        }
    }
    assert!(eio >= 1, "no read of f0.bin failed on its changed block");
    drop(f);
    let err = fs::metadata(m.path().join("new-file.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    let st = status_json(&m.path());
    assert!(
        st["skipped"].to_string().contains("zz-new.zip")
            && st["skipped"].to_string().contains("not in the seal"),
        "{st}"
    );
    // Sealed (as it now is) and uploaded: activated at the next poll.
    fs::copy(&other, &big).unwrap();
    s.seal("key", &[]);
    upload(&moto, &store, &store_files(&store));
    wait_until(
        Duration::from_secs(20),
        "the newly sealed archive is activated",
        || fs::read(m.path().join("new-file.txt")).is_ok_and(|b| b == b"sealed later\n"),
    );
    assert!(fs::read(m.path().join("f0.bin")).unwrap() == f0_new);
    let st = status_json(&m.path());
    assert!(st["activations"].as_u64().unwrap() >= 2, "{st}");
    assert_eq!(st["seals"][0]["failures"], 0, "{st}");
}

/// The files of a store and of its seal's tree directory.
fn store_files(store: &Path) -> Vec<PathBuf> {
    let mut v = vec![];
    for e in fs::read_dir(store).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(fs::read_dir(&p).unwrap().map(|t| t.unwrap().path()));
        } else {
            v.push(p);
        }
    }
    v
}

/// Upload `paths` of the store to the bucket `pkgs` under `repo/`, keyed by their path in
/// the store.
fn upload(moto: &Moto, store: &Path, paths: &[PathBuf]) {
    let mut code = String::new();
    for f in paths {
        let key = f.strip_prefix(store).unwrap().to_str().unwrap();
        code += &format!(
            "s3.upload_file({:?}, 'pkgs', 'repo/{key}')\n",
            f.to_str().unwrap()
        );
    }
    moto.boto(&code);
}

/// A seal kept apart from its store (`--seal-file`: the store has none, a mount without
/// the option says so); the offline tools under `--verify` (`ls` lists every member,
/// `cat` reads one, `check` finds a flipped byte); single archives and local images
/// refused; the options of allowed-signers lines: `valid-before` past and
/// `valid-after` to come refuse, a window around now takes, another `namespaces`
/// refuses, `cert-authority` is refused as unsupported.
#[test]
fn seal_files_offline_tools_and_allowed_signers_options() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let (store, d) = (s.store(), s.dir.path().to_path_buf());
    for n in ["pkgfs.seal", "pkgfs.seal.sig"] {
        fs::remove_file(store.join(n)).unwrap();
    }
    fs::remove_dir_all(store.join("pkgfs.seal.d")).unwrap();
    fs::create_dir(d.join("seals")).unwrap();
    let seal_file = d.join("seals/store.seal");
    let sf = ["--seal-file", seal_file.to_str().unwrap()];
    s.seal("key", &sf);
    assert!(seal_file.exists() && !store.join("pkgfs.seal").exists());
    let err = s.refused(store.to_str().unwrap(), &[]);
    assert!(err.contains("no seal"), "{err}");
    let m = s.mount(store.to_str().unwrap(), &sf, &[]);
    expect_matches(&m.path(), &[&store], &[]);
    drop(m);

    let tool = |cmd: &str, allowed: &str, extra: &[&str]| {
        let out = pkgfs()
            .arg(cmd)
            .arg("--verify")
            .arg(d.join(allowed))
            .args(sf)
            .arg(&store)
            .args(extra)
            .envs(s.env())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), out.stdout, text)
    };
    let (ok, stdout, text) = tool("ls", "allowed", &[]);
    assert!(ok, "{text}");
    let listed: std::collections::BTreeSet<String> = String::from_utf8_lossy(&stdout)
        .lines()
        .filter_map(|l| {
            // MODE UID GID SIZE MTIME PATH[ -> TARGET]\tARCHIVE
            let mut rest = l.split('\t').next()?;
            for _ in 0..5 {
                rest = rest.trim_start();
                rest = &rest[rest.find(' ')?..];
            }
            Some(rest.trim_start().split(" -> ").next()?.to_string())
        })
        .collect();
    let code = format!(
        "import glob, zipfile\nfor p in sorted(glob.glob({:?})):\n    \
         for i in zipfile.ZipFile(p).infolist():\n        \
         n = i.filename if i.flag_bits & 0x800 else i.filename.encode('cp437').decode()\n        \
         print(n.rstrip('/'))",
        format!("{}/*.zip", store.display())
    );
    let members =
        String::from_utf8(run(Command::new("python3").arg("-c").arg(code)).stdout).unwrap();
    for n in members.lines() {
        assert!(listed.contains(n), "ls --verify does not list {n}");
    }
    let big = store.join("big.zip");
    let (ok, stdout, text) = tool("cat", "allowed", &["f2.bin"]);
    assert!(
        ok && stdout == member(&big, "f2.bin"),
        "{}",
        &text[..text.len().min(500)]
    );

    // Allowed-signers options, checked by `ls` (the same check as a mount's).
    let key = fs::read_to_string(d.join("key.pub")).unwrap();
    for (name, options, want) in [
        (
            "past",
            "namespaces=\"pkgfs\",valid-before=\"20200101\"",
            Some("is not valid now"),
        ),
        (
            "future",
            "namespaces=\"pkgfs\",valid-after=\"29990101\"",
            Some("is not valid now"),
        ),
        (
            "now",
            "namespaces=\"pkgfs\",valid-after=\"20200101\",valid-before=\"29990101\"",
            None,
        ),
        (
            "ns",
            "namespaces=\"other\"",
            Some("may not sign for namespace \"pkgfs\""),
        ),
        (
            "ca",
            "cert-authority,namespaces=\"pkgfs\"",
            Some("cert-authority keys are not supported"),
        ),
    ] {
        let file = format!("allowed-{name}");
        fs::write(d.join(&file), format!("ci@pkgfs.example {options} {key}")).unwrap();
        let (ok, _, text) = tool("ls", &file, &[]);
        match want {
            Some(w) => assert!(!ok && text.contains(w), "{name}: {text}"),
            None => assert!(ok, "{name}: {text}"),
        }
    }

    // Sources that cannot have a seal.
    let err = s.refused(big.to_str().unwrap(), &[]);
    assert!(err.contains("not single files"), "{err}");
    let err = s.refused(&format!("oci:{}", store.display()), &[]);
    assert!(err.contains("a local layout has no seal"), "{err}");

    // `check --verify` reads every byte: a flipped one is found, naming its archive.
    flip_in_member(&big, "f3.bin", 10);
    let (ok, _, text) = tool("check", "allowed", &[]);
    assert!(
        !ok && text.contains("big.zip") && text.contains("does not match its seal"),
        "{text}"
    );
}

/// An archive is indexed from its first and last blocks (a format's probe): when either
/// fails its check the archive is not mounted (skipped, named), though its bytes still
/// parse: an unverified mount of the same files shows it.
#[test]
fn an_archive_whose_first_or_last_block_fails_is_not_mounted() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let store = s.store();
    let big = store.join("big.zip");
    // A byte of f0.bin's data in big.zip's first block; a copy of big.zip, sealed too,
    // with a byte of f4.bin's data in its last block (with the central directory).
    let tail = store.join("tail.zip");
    fs::copy(&big, &tail).unwrap();
    s.seal("key", &[]);
    flip_in_member(&big, "f0.bin", 100);
    let size = fs::metadata(&tail).unwrap().len();
    let code = format!(
        "import zipfile\nz = zipfile.ZipFile({:?})\ni = z.getinfo('f4.bin')\n\
         print(i.header_offset + 30 + len(i.filename.encode()) + len(i.extra) + i.compress_size)",
        tail.to_str().unwrap()
    );
    let f4_end: u64 = String::from_utf8(run(Command::new("python3").arg("-c").arg(code)).stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let block = seal_field(&store, "block-size");
    assert_eq!(
        (f4_end - 10) / block,
        (size - 1) / block,
        "in the last block"
    );
    flip_in_member(&tail, "f4.bin", 4 * 1024 * 1024 - 10);
    // Times as before the flips (the root's time is its newest archive's).
    run(Command::new("touch")
        .arg("-r")
        .arg(store.join("a-stored.zip"))
        .arg(&big)
        .arg(&tail));
    // Unverified, both mount.
    let plain = Mount::new(&[&store], &["--no-index-cache"]);
    let st = status_json(&plain.path());
    assert!(
        !st["skipped"].to_string().contains(".zip"),
        "unverified, the tampered archives still mount: {st}"
    );
    drop(plain);
    let m = s.mount(store.to_str().unwrap(), &[], &[]);
    let st = status_json(&m.path());
    let skipped = st["skipped"].to_string();
    for name in ["big.zip", "tail.zip"] {
        assert!(
            skipped.contains(name) && skipped.contains("does not match its seal"),
            "{name} is skipped: {st}"
        );
    }
    let err = fs::metadata(m.path().join("f1.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    expect_matches(
        &m.path(),
        &[
            &store.join("a-stored.zip"),
            &store.join("b-deflate.zip"),
            &store.join("c-pyzip.zip"),
            &store.join("d-lib.jar"),
        ],
        &[],
    );
}

/// Index caches under `--verify` are keyed by the tree root: an index an unverified
/// mount cached is not taken (one more entry), nor one of another seal of the same bytes
/// (another block size: another entry); the same seal mounted again adds none.
#[test]
fn verified_index_caches_are_keyed_by_tree_root() {
    if !tools() {
        return;
    }
    let s = Sealed::new();
    let store = s.store();
    let stage = s.dir.path().join("stage");
    fs::create_dir(&stage).unwrap();
    fs::write(stage.join("in-tarball.txt"), b"indexed by a pass\n").unwrap();
    run(Command::new("tar")
        .current_dir(&stage)
        .arg("czf")
        .arg(store.join("t.tar.gz"))
        .arg("in-tarball.txt"));
    s.seal("key", &[]);
    let idx = s.dir.path().join("index-cache");
    let ic = ["--index-cache", idx.to_str().unwrap()];
    // Indexes, not the kept tree of the unverified mount.
    let entries = || {
        if idx.exists() {
            walk_files(&idx)
                .iter()
                .filter(|p| {
                    !p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("tree-")
                })
                .count()
        } else {
            0
        }
    };
    let read = |mp: &Path| fs::read(mp.join("in-tarball.txt")).unwrap();
    let plain = Mount::new(&[&store], &ic);
    assert_eq!(read(&plain.path()), b"indexed by a pass\n");
    wait_until(
        Duration::from_secs(10),
        "the unverified index cached",
        || entries() == 1,
    );
    drop(plain);
    let m = s.mount(store.to_str().unwrap(), &ic, &[]);
    assert_eq!(read(&m.path()), b"indexed by a pass\n");
    wait_until(
        Duration::from_secs(10),
        "an index of its own for the verified mount",
        || entries() == 2,
    );
    drop(m);
    let m = s.mount(store.to_str().unwrap(), &ic, &[]);
    assert_eq!(read(&m.path()), b"indexed by a pass\n");
    drop(m);
    assert_eq!(entries(), 2, "the same seal's index taken again");
    s.seal("key", &["--block-size", "16K"]);
    let m = s.mount(store.to_str().unwrap(), &ic, &[]);
    assert_eq!(read(&m.path()), b"indexed by a pass\n");
    wait_until(
        Duration::from_secs(10),
        "an index of its own for another tree root",
        || entries() == 3,
    );
}
