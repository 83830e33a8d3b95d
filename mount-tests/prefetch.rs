//! Directory read-ahead through real mounts: a walk over a directory of small files, as
//! `tar` does it (list, then read each file in listing order), gets the right bytes for
//! a small fraction of the READ requests, for ZIPs written by Info-ZIP and for `pkgfs
//! pack` packages; `prefetch=0` turns it off; a reader that opens files by name without
//! listing them gets no pushes; decoded blocks the kernel holds leave the block cache.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{Mount, pkgfs, require_fuse, run};

const FILES: usize = 400;

/// `root/d/f000..` of pseudo-random sizes (up to ~40 KB) and contents, and `root/d/sub/x`.
fn small_files(root: &Path) {
    let d = root.join("d");
    fs::create_dir_all(d.join("sub")).unwrap();
    let mut x = 11u64;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    for i in 0..FILES {
        let len = (next() % 40_000) as usize + 1;
        let data: Vec<u8> = (0..len)
            .map(|j| b"abcdefghij \n"[((next() >> 3) as usize + j) % 12])
            .collect();
        fs::write(d.join(format!("f{i:03}")), data).unwrap();
    }
    fs::write(d.join("sub/x"), b"below").unwrap();
}

/// `n` bytes of pseudo-random text of 16 symbols (compressible, not trivially), from
/// `seed`, which moves on.
fn text(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b"abcdefghijklmn \n"[(*seed >> 60) as usize]
        })
        .collect()
}

/// A number of `pkgfs status --json`: a top-level field, or one of `requests` or `cache`.
fn status_field(mp: &Path, key: &str) -> u64 {
    let json = crate::common::status_json(mp);
    json.get(key)
        .or_else(|| json["requests"].get(key))
        .or_else(|| json["cache"].get(key))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
}

/// Whether every page of `p` is in the kernel's page cache (`mincore` of a mapping,
/// which reads nothing).
fn resident(p: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    assert!(len > 0);
    // SAFETY: a fresh read-only shared mapping of an open file, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap {}", p.display());
    let mut pages = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `pages` has one byte per page of the mapping.
    let r = unsafe { libc::mincore(addr, len, pages.as_mut_ptr()) };
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(r, 0);
    pages.iter().all(|v| v & 1 == 1)
}

/// Wait until the read-ahead thread has taken every hint sent so far and has nothing
/// left to push; returns the files and bytes it has pushed. (A READ's hint is sent
/// before the read is answered, and the end of a listing's before the last batch is, so
/// every hint a test's reads and listings caused is counted by then.)
fn settled(mp: &Path) -> (u64, u64) {
    let mut json = serde_json::Value::Null;
    crate::common::wait_until(Duration::from_secs(30), "pushes never settle", || {
        json = crate::common::status_json(mp);
        json["prefetch_idle"] == true && json["prefetch_hints"] == json["prefetch_hints_taken"]
    });
    let n = |k: &str| json[k].as_u64().unwrap();
    (n("prefetched_files"), n("prefetched_bytes"))
}

/// `src` as an Info-ZIP archive (`zip -6`) in `tmp/zips` and as a `pkgfs pack` package
/// in `tmp/zsts`; returns the two directories.
fn both_formats(tmp: &Path, src: &Path) -> [std::path::PathBuf; 2] {
    let zips = tmp.join("zips");
    let zsts = tmp.join("zsts");
    fs::create_dir_all(&zips).unwrap();
    fs::create_dir_all(&zsts).unwrap();
    run(Command::new("zip")
        .current_dir(src)
        .args(["-q", "-r", "-6"])
        .arg(zips.join("a.zip"))
        .arg("."));
    run(pkgfs()
        .arg("pack")
        .arg(src)
        .arg("-o")
        .arg(zsts.join("a.tar.zst")));
    [zips, zsts]
}

fn file(i: usize) -> String {
    format!("d/f{i:03}")
}

fn check(m: &Mount, src: &Path, i: usize) {
    assert!(
        fs::read(m.path().join(file(i))).unwrap() == fs::read(src.join(file(i))).unwrap(),
        "{} differs",
        file(i)
    );
}

/// List `d` as `tar` does and check the order (the order files are pushed in).
fn list(m: &Mount) {
    let names: Vec<_> = fs::read_dir(m.path().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "readdir lists names in byte order");
    assert_eq!(names.len(), FILES + 1);
}

#[test]
fn a_walk_over_small_files_is_served_from_pushed_pages() {
    if !require_fuse() {
        return;
    }
    let _page_cache = crate::common::page_cache_observed();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_files(&src);
    let [zips, zsts] = both_formats(tmp.path(), &src);
    for pkgs in [&zips, &zsts] {
        walk_served_from_pushes(pkgs, &src);
    }
    // Control: read-ahead off (no read-ahead thread at all), nothing is pushed and every
    // file costs a READ.
    let m = Mount::new(&[&zips], &["-o", "prefetch=0"]);
    list(&m);
    check(&m, &src, 0);
    assert!(!resident(&m.path().join(file(1))));
    for i in 1..FILES {
        check(&m, &src, i);
    }
    assert_eq!(status_field(&m.path(), "prefetched_files"), 0);
    assert_eq!(status_field(&m.path(), "read"), FILES as u64);
}

/// One format's part of `a_walk_over_small_files_is_served_from_pushed_pages`.
fn walk_served_from_pushes(pkgs: &Path, src: &Path) {
    let m = Mount::new(&[pkgs], &[]);
    let mp = m.path();
    list(&m);
    // A miss on the first file: the files after it are pushed (the first window,
    // 128 KiB of them), and nothing beyond.
    check(&m, src, 0);
    let (n1, bytes1) = settled(&mp);
    assert!(
        n1 >= 3 && bytes1 >= 128 * 1024,
        "{n1} files, {bytes1} bytes"
    );
    let n1 = n1 as usize;
    assert!((1..=n1).all(|i| resident(&mp.join(file(i)))));
    assert!(!resident(&mp.join(file(n1 + 1))));
    // Reading them costs no request.
    let reads = status_field(&mp, "read");
    for i in 1..=n1 {
        check(&m, src, i);
    }
    assert_eq!(status_field(&mp, "read"), reads);
    // The next miss is sequential: the reader is left the file after it, and a
    // window twice as large is pushed after that.
    check(&m, src, n1 + 1);
    let (n2, bytes2) = settled(&mp);
    assert!(bytes2 - bytes1 >= 256 * 1024, "{bytes1} then {bytes2}");
    assert!(!resident(&mp.join(file(n1 + 2))));
    let pushed = (n2 - n1 as u64) as usize;
    assert!((n1 + 3..n1 + 3 + pushed).all(|i| resident(&mp.join(file(i)))));
    // The rest of the walk, whatever the timing (and a second one, from the page
    // cache where the kernel kept it): the bytes are right.
    for i in n1 + 2..FILES {
        check(&m, src, i);
    }
    let reads = status_field(&mp, "read");
    eprintln!("{}: {reads} READs for {FILES} files", pkgs.display());
    for i in 0..FILES {
        check(&m, src, i);
    }
}

#[test]
fn files_opened_by_name_without_a_listing_are_not_pushed() {
    if !require_fuse() {
        return;
    }
    let _page_cache = crate::common::page_cache_observed();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_files(&src);
    let zips = tmp.path().join("zips");
    fs::create_dir_all(&zips).unwrap();
    run(Command::new("zip")
        .current_dir(&src)
        .args(["-q", "-r", "-6"])
        .arg(zips.join("a.zip"))
        .arg("."));
    let m = Mount::new(&[&zips], &[]);
    // The kernel holds no inode of the files not looked up yet: nothing can be pushed
    // to them, and nothing is decoded for them.
    for i in 0..20 {
        let name = format!("d/f{i:03}");
        assert_eq!(
            fs::read(m.path().join(&name)).unwrap(),
            fs::read(src.join(&name)).unwrap()
        );
    }
    // A window ends at the first file the kernel does not hold, so at most the file
    // the reader looked up just before the pusher got there can be pushed (a race);
    // with a listing, the 20 misses would push hundreds of files.
    let pushed = status_field(&m.path(), "prefetched_files");
    let reads = status_field(&m.path(), "read");
    assert!(pushed <= 5, "{pushed} files pushed");
    assert!(reads + pushed >= 20 && reads <= 20, "{reads} READs");
}

#[test]
fn a_file_larger_than_a_block_is_pushed_whole_and_right() {
    if !require_fuse() {
        return;
    }
    let _page_cache = crate::common::page_cache_observed();
    // `d/a` small, `d/b` spanning several decoded blocks (256 KiB each: ZIP blocks start
    // at multiples of that in the member, package frames wherever the tar stream puts
    // them, so the push's pieces end mid-page there), `d/c` small.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/a"), b"first file\n").unwrap();
    let big = text(&mut 7, 900_000);
    fs::write(src.join("d/b"), &big).unwrap();
    fs::write(src.join("d/c"), b"last file\n").unwrap();
    let [zips, zsts] = both_formats(tmp.path(), &src);
    for pkgs in [&zips, &zsts] {
        large_file_pushed(pkgs, &big);
    }
}

/// One format's part of `a_file_larger_than_a_block_is_pushed_whole_and_right`.
fn large_file_pushed(pkgs: &Path, big: &[u8]) {
    let m = Mount::new(&[pkgs], &[]);
    let mp = m.path();
    fs::read_dir(mp.join("d")).unwrap().for_each(drop);
    assert_eq!(fs::read(mp.join("d/a")).unwrap(), b"first file\n");
    let (n, bytes) = settled(&mp);
    assert!(
        n >= 1 && bytes >= big.len() as u64,
        "{n} files, {bytes} bytes"
    );
    assert!(resident(&mp.join("d/b")), "{} d/b resident", pkgs.display());
    let reads = status_field(&mp, "read");
    assert!(
        fs::read(mp.join("d/b")).unwrap() == big,
        "{}: d/b differs",
        pkgs.display()
    );
    assert_eq!(
        status_field(&mp, "read"),
        reads,
        "d/b came from pushed pages"
    );
}

#[test]
fn blocks_the_kernel_holds_leave_the_block_cache() {
    if !require_fuse() {
        return;
    }
    let _page_cache = crate::common::page_cache_dropped();
    // 16 files of 1 MiB (pushed during the walk) and one of 12 MiB (larger than the
    // push window: the kernel READs it), 28 MiB decoded in all, 3.5 times the grace
    // for which blocks the kernel holds stay cached; as a ZIP (blocks of members,
    // followed page by page) and as a package (frames, counted against the file bytes
    // they hold).
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    let mut seed = 5;
    let mut files: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| (format!("d/f{i:02}"), text(&mut seed, 1 << 20)))
        .collect();
    files.push(("d/large".into(), text(&mut seed, 12 << 20)));
    for (name, data) in &files {
        fs::write(src.join(name), data).unwrap();
    }
    for pkgs in both_formats(tmp.path(), &src) {
        held_blocks_leave(&pkgs, &files);
    }
}

/// One format's part of `blocks_the_kernel_holds_leave_the_block_cache`.
fn held_blocks_leave(pkgs: &Path, files: &[(String, Vec<u8>)]) {
    let m = Mount::new(&[pkgs], &[]);
    let mp = m.path();
    let walk = || {
        fs::read_dir(mp.join("d")).unwrap().for_each(drop);
        for (name, data) in files {
            assert!(fs::read(mp.join(name)).unwrap() == *data, "{name} differs");
        }
    };
    walk();
    settled(&mp);
    let cached = status_field(&mp, "bytes");
    let released = status_field(&mp, "released");
    let what = pkgs.display();
    assert!(released >= 10, "{what}: {released} blocks dropped");
    assert!(
        cached <= 10 << 20,
        "{what}: {cached} bytes cached after a walk over 28 MiB the kernel holds"
    );
    // The kernel lets go of its pages: the dropped blocks are decoded again, right.
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let decoded = status_field(&mp, "bytes_decompressed");
    walk();
    assert!(status_field(&mp, "bytes_decompressed") > decoded);
}

/// Drop the kernel's pages of every file under `d` (`POSIX_FADV_DONTNEED`), as memory
/// pressure or `drop_caches` would; the inodes stay.
fn drop_pages(m: &Mount) {
    use std::os::fd::AsRawFd;
    for i in 0..FILES {
        let f = fs::File::open(m.path().join(file(i))).unwrap();
        // SAFETY: an advice on a descriptor open for this call.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
    }
}

#[test]
fn a_walk_after_the_kernel_dropped_its_pages_is_pushed_again() {
    if !require_fuse() {
        return;
    }
    let _page_cache = crate::common::page_cache_observed();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    small_files(&src);
    let [zips, _] = both_formats(tmp.path(), &src);
    let m = Mount::new(&[&zips], &[]);
    let mp = m.path();
    // A walk as `tar` does it: the listing, then every file in its order.
    let walk = || {
        list(&m);
        for i in 0..FILES {
            check(&m, &src, i);
        }
        let (files, _) = settled(&mp);
        (files, status_field(&mp, "read"))
    };
    let (pushed1, reads1) = walk();
    // The kernel drops every page: the next walk's first READ says so, and the files
    // after it are pushed again, as in the first walk. How many depends on how the
    // reads and the pushes race (the first walk pushed 88–369 of the 400 files, in runs
    // here and under CI's load); without this, the second pushed none and read every
    // file itself.
    let drops = status_field(&mp, "page_drops");
    drop_pages(&m);
    assert!((0..FILES).all(|i| !resident(&mp.join(file(i)))));
    let (pushed2, reads2) = walk();
    let (again, reads) = (pushed2 - pushed1, reads2 - reads1);
    eprintln!("walks: {pushed1} pushed and {reads1} READs, then {again} and {reads}");
    assert!(status_field(&mp, "page_drops") > drops);
    assert!(
        again as usize >= FILES / 8,
        "{again} pushed in the second walk, {pushed1} in the first"
    );
    assert!(
        (reads as usize) <= FILES * 7 / 8,
        "the second walk took {reads} READs for {FILES} files"
    );
}
