//! The formats' read paths, exercised through the filesystem: ZIP members stored,
//! streamed, decoded in one call and through checkpoints, and frames of seekable
//! packages; lies, damage and what the cache keeps.

use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;

use crate::format::zip::{CHECKPOINT_EVERY, VERIFY_MAX};
use crate::format::{self, OpenContext, Probe, floor, seekable};
use crate::fs::PkgFs;
use crate::io::BLOCK_SIZE;
use crate::tree::{Ownership, TreeBuilder};

const OWNER: Ownership = Ownership::defaults(0, 0);

/// Write a ZIP with the `zip` crate and mount it as a `PkgFs` (no FUSE).
fn build(
    files: &[(&str, ::zip::CompressionMethod, &[u8])],
    cache: u64,
) -> (tempfile::TempDir, PkgFs) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.zip");
    let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for (name, method, data) in files {
        let opts = ::zip::write::SimpleFileOptions::default()
            .compression_method(*method)
            .large_file(data.len() > u32::MAX as usize);
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap();
    (dir, open(&path, cache))
}

fn open(path: &std::path::Path, cache: u64) -> PkgFs {
    let idx = format::open_path(path, &OpenContext::default())
        .unwrap_or_else(|_| panic!("open {}", path.display()));
    let mut b = TreeBuilder::new(OWNER);
    b.add_layer(0, 0, &idx.entries);
    PkgFs::new(b.finish(), vec![idx.archive], cache)
}

fn data(n: usize) -> Vec<u8> {
    // Compressible but not trivially: a slow-changing pseudo-random text.
    let mut x = 1u32;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            b"abcdefgh\n"[(x >> 28) as usize % 9]
        })
        .collect()
}

#[test]
fn random_reads_deep_in_a_deflate_member_resume_from_checkpoints() {
    let big = data(40 << 20);
    // A cache of 1 MiB: blocks do not stay, so every read below must decode.
    let (_d, fs) = build(
        &[("big", ::zip::CompressionMethod::Deflated, &big)],
        1 << 20,
    );
    let ino = fs.resolve(b"big").unwrap();
    let s = &fs.io().stats;
    // The first read near the end decodes everything before it once, leaving
    // checkpoints on the way.
    let end = big.len() as u64 - 4096;
    assert_eq!(fs.read(ino, end, 4096).unwrap(), &big[end as usize..]);
    assert_eq!(s.streams_started.load(Relaxed), 1);
    // Then reads at random places cost at most one checkpoint interval each.
    let mut x = 7u64;
    let mut early = 0;
    for _ in 0..40 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let off = (x >> 11) % (big.len() as u64 - 4096);
        let before = s.decompressed_bytes.load(Relaxed);
        let got = fs.read(ino, off, 4096).unwrap();
        assert_eq!(got, &big[off as usize..off as usize + 4096], "at {off}");
        // Before the first checkpoint, the member's start is the nearest point.
        early += u64::from(off < CHECKPOINT_EVERY);
        let cost = s.decompressed_bytes.load(Relaxed) - before;
        assert!(
            cost <= CHECKPOINT_EVERY + 2 * BLOCK_SIZE,
            "read at {off} decoded {cost} bytes"
        );
    }
    assert!(
        s.streams_started.load(Relaxed) <= 1 + early,
        "from the start only before the first checkpoint"
    );
    assert!(s.checkpoint_resumes.load(Relaxed) >= 20);
    // And a full sequential read through checkpoints still checks the CRC.
    assert_eq!(read_all(&fs, ino, 1 << 20), big);
}

fn read_all(fs: &PkgFs, ino: u64, chunk: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let c = fs.read(ino, out.len() as u64, chunk).unwrap();
        if c.is_empty() {
            return out;
        }
        out.extend(c);
    }
}

#[test]
fn sequential_reads_decode_each_block_once() {
    use ::zip::CompressionMethod::{Deflated, Zstd};
    let big = data(3 * BLOCK_SIZE as usize + 1234);
    for method in [Deflated, Zstd] {
        let (_d, fs) = build(&[("big", method, &big)], 64 << 20);
        let ino = fs.resolve(b"big").unwrap();
        assert_eq!(read_all(&fs, ino, 128 * 1024), big, "{method:?}");
        let s = &fs.io().stats;
        assert_eq!(
            s.streams_started.load(Relaxed),
            1,
            "never restarted ({method:?})"
        );
        assert_eq!(s.blocks_decoded.load(Relaxed), 4);
        assert_eq!(s.decompressed_bytes.load(Relaxed), big.len() as u64);
        // A second pass is served from the cache.
        assert_eq!(read_all(&fs, ino, 100_000), big);
        assert_eq!(s.blocks_decoded.load(Relaxed), 4);
    }
}

#[test]
fn blocks_the_kernel_holds_leave_the_cache() {
    use ::zip::CompressionMethod::{Deflated, Stored};
    // Twice the grace of decoded blocks, and a stored member (never cached).
    let big = data(2 * crate::io::cache::RELEASE_GRACE as usize + 1000);
    let small = data(5000);
    let (_d, fs) = build(&[("big", Deflated, &big), ("s", Stored, &small)], 1 << 30);
    let ino = fs.resolve(b"big").unwrap();
    assert_eq!(read_all(&fs, ino, 128 * 1024), big);
    let cache = fs.io().cache();
    assert_eq!(cache.bytes(), big.len() as u64, "every block cached");
    // Pages given to the kernel as it asks for them: 128 KiB reads straddle no block
    // but fill each one in two; a block given in part stays.
    let blocks = big.len() as u64 / BLOCK_SIZE;
    fs.delivered(ino, 0, (blocks * BLOCK_SIZE) - 4096);
    fs.delivered(ino, blocks * BLOCK_SIZE - 4096, 4096 + 100);
    let released = cache.stats.released.load(Relaxed);
    assert!(released > 0 && released < blocks, "{released} of {blocks}");
    assert!(
        cache.bytes() <= crate::io::cache::RELEASE_GRACE + 2 * BLOCK_SIZE,
        "only the grace stays: {}",
        cache.bytes()
    );
    assert_eq!(
        cache.bytes() % BLOCK_SIZE,
        1000,
        "the last block, given in part, stays"
    );
    // What is still cached is served without decoding; what went is decoded again,
    // correctly.
    let decoded = fs.io().stats.blocks_decoded.load(Relaxed);
    assert_eq!(read_all(&fs, ino, 128 * 1024), big);
    assert!(fs.io().stats.blocks_decoded.load(Relaxed) > decoded);
    // Members not cached, and inodes that are not files, are ignored.
    fs.delivered(fs.resolve(b"s").unwrap(), 0, 5000);
    fs.delivered(1, 0, 4096);
    fs.delivered(999_999, 0, 4096);
}

#[test]
fn concurrent_misses_share_one_decompression() {
    let big = data(2 * BLOCK_SIZE as usize);
    let (_d, fs) = build(
        &[("big", ::zip::CompressionMethod::Deflated, &big)],
        64 << 20,
    );
    let ino = fs.resolve(b"big").unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| assert_eq!(fs.read(ino, 1000, 10).unwrap(), &big[1000..1010]));
        }
    });
    assert_eq!(fs.io().stats.blocks_decoded.load(Relaxed), 1);
}

#[test]
fn a_tiny_cache_still_reads_correctly() {
    let big = data(5 * BLOCK_SIZE as usize);
    let (_d, fs) = build(&[("big", ::zip::CompressionMethod::Deflated, &big)], 1000);
    let ino = fs.resolve(b"big").unwrap();
    assert_eq!(read_all(&fs, ino, 70_000), big);
    assert_eq!(
        fs.io().cache().bytes(),
        0,
        "blocks larger than the budget are not kept"
    );
    // Backwards: restarts, still right.
    assert_eq!(fs.read(ino, 10, 20).unwrap(), &big[10..30]);
}

#[test]
fn stored_members_are_read_in_place_and_crc_checked() {
    let small = data(5000);
    let large = data(VERIFY_MAX as usize + 10);
    let (dir, fs) = build(
        &[
            ("small", ::zip::CompressionMethod::Stored, &small),
            ("large", ::zip::CompressionMethod::Stored, &large),
        ],
        1 << 20,
    );
    let ino = fs.resolve(b"large").unwrap();
    assert_eq!(fs.read(ino, 7, 100).unwrap(), &large[7..107]);
    assert_eq!(fs.io().stats.decompressed_bytes.load(Relaxed), 0);
    assert_eq!(
        fs.io().cache().bytes(),
        0,
        "stored data is not copied into the cache"
    );
    let ino = fs.resolve(b"small").unwrap();
    assert_eq!(fs.read(ino, 0, 10).unwrap(), &small[..10]);

    // Flip one byte of the small member's data: its first read fails with EIO.
    let path = dir.path().join("t.zip");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(100)
        .position(|w| w == &small[1000..1100])
        .unwrap();
    bytes[at] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let fs = open(&path, 1 << 20);
    let ino = fs.resolve(b"small").unwrap();
    let e = fs.read(ino, 0, 10).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("CRC"), "{e}");
}

/// Patch the central directory record of the first member: `f` edits its fields.
fn patch_cd(path: &std::path::Path, f: impl Fn(&mut [u8])) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    f(&mut bytes[at..at + 46]);
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn lying_sizes_and_crcs_are_corruption_not_allocation() {
    let body = data(400_000);
    type Edit = fn(&mut [u8]);
    let cases: [(&str, Edit); 3] = [
        // Declared size far larger than the stream: the stream ends early.
        ("size too large", |r| {
            r[24..28].copy_from_slice(&u32::MAX.to_le_bytes())
        }),
        // Declared size smaller than the stream: more data than declared.
        ("size too small", |r| {
            r[24..28].copy_from_slice(&1000u32.to_le_bytes())
        }),
        ("bad crc", |r| r[16] ^= 1),
    ];
    for (what, edit) in cases {
        let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
        let path = dir.path().join("t.zip");
        patch_cd(&path, edit);
        let fs = open(&path, 1 << 20);
        let ino = fs.resolve(b"f").unwrap();
        let mut err = None;
        let mut off = 0;
        while off < fs.getattr(ino).unwrap().size {
            match fs.read(ino, off, 1 << 20) {
                Ok(c) if c.is_empty() => break,
                Ok(c) => off += c.len() as u64,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let e = err.unwrap_or_else(|| panic!("{what}: no error"));
        assert_eq!(e.errno(), libc::EIO, "{what}");
    }
}

/// Members of one block are decoded in one call (libdeflate), not streamed: the same
/// lies are caught, with the same errors.
#[test]
fn one_call_deflate_members_are_checked_like_streams() {
    let body = data(100_000);
    let (_dir, fs) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
    let ino = fs.resolve(b"f").unwrap();
    assert!(fs.read(ino, 0, 1 << 20).unwrap() == body);
    assert!(fs.read(ino, 99_000, 5_000).unwrap() == body[99_000..]);
    type Edit = fn(&mut [u8]);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "size too large",
            |r| r[24..28].copy_from_slice(&200_000u32.to_le_bytes()),
            "ends after 100000",
        ),
        (
            "size too small",
            |r| r[24..28].copy_from_slice(&1000u32.to_le_bytes()),
            "more than the 1000",
        ),
        ("bad crc", |r| r[16] ^= 1, "CRC-32"),
        (
            "input cut short",
            |r| r[20..24].copy_from_slice(&100u32.to_le_bytes()),
            "bad deflate",
        ),
    ];
    for (what, edit, says) in cases {
        let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
        let path = dir.path().join("t.zip");
        patch_cd(&path, edit);
        let fs = open(&path, 1 << 20);
        let e = fs.read(fs.resolve(b"f").unwrap(), 0, 1 << 20).unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "{what}");
        assert!(e.to_string().contains(says), "{what}: {e}");
    }
}

/// The archive bytes of a file's member, as its archive's extent sees them now.
fn extent_of(fs: &PkgFs, ino: u64) -> (u64, u64) {
    let (v, local) = fs.find(ino).unwrap();
    let n = v.tree.node(local).unwrap();
    let m = v.tree.member(n).unwrap();
    v.layers[m.archive as usize]
        .archive
        .extent(fs.io(), &m.loc, m.size)
        .unwrap()
}

/// The seek table of the first package of `fs`, with its frames' file bytes counted.
fn table_of(fs: &PkgFs) -> floor::frames::SeekTable {
    let v = fs.view();
    let a = &v.layers[0].archive;
    let probe = Probe::read(&*a.blob).unwrap();
    let mut table = floor::frames::read_table(&*a.blob, &probe)
        .unwrap()
        .unwrap();
    table.count_file_bytes(&a.entries(&OpenContext::default()).unwrap());
    table
}

#[test]
fn extents_cover_the_data_and_local_headers_are_read_with_it() {
    // Members whose local extra field is shorter and longer than the guess made
    // before the local header is read (the second needs a read of its own).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.zip");
    let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let bodies: Vec<Vec<u8>> = (0..3).map(|i| data(20_000 + i * 7_000)).collect();
    for (i, extra) in [0usize, 40, 300].into_iter().enumerate() {
        let mut opts = ::zip::write::FullFileOptions::default()
            .compression_method(::zip::CompressionMethod::Deflated);
        if extra > 0 {
            opts.add_extra_field(0x7777, vec![7u8; extra], false)
                .unwrap();
        }
        w.start_file(format!("f{i}"), opts).unwrap();
        w.write_all(&bodies[i]).unwrap();
    }
    w.finish().unwrap();
    let fs = open(&path, 1 << 20);
    let zip = std::fs::read(&path).unwrap();
    for (i, body) in bodies.iter().enumerate() {
        let ino = fs.resolve(format!("f{i}").as_bytes()).unwrap();
        let guess = extent_of(&fs, ino);
        assert!(fs.read(ino, 0, 1 << 20).unwrap() == *body, "f{i}");
        let (start, end) = extent_of(&fs, ino);
        assert_eq!(start, guess.0);
        assert_eq!(&zip[start as usize..start as usize + 4], b"PK\x03\x04");
        // The data ends where the next local header or the central directory starts.
        assert!(
            matches!(&zip[end as usize..end as usize + 2], b"PK"),
            "f{i}"
        );
        // The first two fit the guess; the third's data ends past it.
        assert_eq!(guess.1 >= end, i < 2, "f{i}: {guess:?} against {end}");
        assert!(fs.read(ino, 1000, 10).unwrap() == body[1000..1010]);
    }
    // A package's extent is the frames holding the file.
    let big = data(300_000);
    let (_d, fs) = packed(
        &[("a", &big[..1000]), ("b", &big), ("c", &big[..10])],
        65_536,
    );
    let _ = fs.find(1).unwrap();
    let table = table_of(&fs);
    let (start, end) = extent_of(&fs, fs.resolve(b"b").unwrap());
    let frames: Vec<_> = table
        .frames
        .iter()
        .filter(|f| f.coff >= start && f.coff + u64::from(f.csize) <= end)
        .collect();
    let covered: u64 = frames.iter().map(|f| u64::from(f.dsize)).sum();
    assert!(
        (300_000..300_000 + 2 * 65_536).contains(&covered),
        "{covered}"
    );
}

#[test]
fn unsupported_and_truncated_members_fail_cleanly() {
    let body = data(100_000);
    let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
    let path = dir.path().join("t.zip");
    patch_cd(&path, |r| r[10] = 12); // claim bzip2
    let fs = open(&path, 1 << 20);
    let e = fs.read(fs.resolve(b"f").unwrap(), 0, 10).unwrap_err();
    assert!(e.to_string().contains("bzip2"), "{e}");

    // Compressed size cut short: the stream runs out of input.
    let (dir, _) = build(&[("f", ::zip::CompressionMethod::Deflated, &body)], 1 << 20);
    let path = dir.path().join("t.zip");
    patch_cd(&path, |r| r[20..24].copy_from_slice(&100u32.to_le_bytes()));
    let fs = open(&path, 1 << 20);
    let e = fs.read(fs.resolve(b"f").unwrap(), 0, 200_000).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
}

fn packed(files: &[(&str, &[u8])], frame_size: usize) -> (tempfile::TempDir, PkgFs) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for (name, data) in files {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    let out = dir.path().join("p.tar.zst");
    crate::tools::pack::pack(&crate::tools::pack::PackConfig {
        dir: src,
        output: out.clone(),
        level: 3,
        threads: 2,
        frame_size,
        mtime_clamp: None,
        owner: None,
        follow: crate::tools::pack::Follow::Never,
    })
    .unwrap();
    let fs = open(&out, 64 << 20);
    (dir, fs)
}

#[test]
fn frames_the_kernel_holds_leave_the_cache() {
    // 48 files of about 300 KB, three to a frame of 1 MiB: 14 MB, beyond the grace.
    let files: Vec<(String, Vec<u8>)> = (0..48)
        .map(|i| (format!("d/f{i:02}"), data(300_000 + i * 7)))
        .collect();
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let (_d, fs) = packed(&refs, 1 << 20);
    let table = table_of(&fs);
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    assert_eq!(table.file_bytes.len(), table.frames.len());
    assert_eq!(
        table.file_bytes.iter().map(|&b| b as usize).sum::<usize>(),
        total,
        "every file byte is in one frame"
    );
    assert!(
        table
            .file_bytes
            .iter()
            .zip(&table.frames)
            .all(|(&b, f)| b < f.dsize)
    );
    let inos: Vec<u64> = files
        .iter()
        .map(|(n, d)| {
            let ino = fs.resolve(n.as_bytes()).unwrap();
            assert!(fs.read(ino, 0, d.len() as u32).unwrap() == *d);
            ino
        })
        .collect();
    let cache = fs.io().cache();
    let cached = cache.bytes();
    assert!(cached as usize > total);
    // Half of every file given: no frame is whole.
    for ((_, d), &ino) in files.iter().zip(&inos) {
        fs.delivered(ino, 0, d.len() as u64 / 2);
    }
    assert_eq!(cache.stats.released.load(Relaxed), 0);
    assert_eq!(cache.bytes(), cached);
    // The other halves: every frame is, and all but the grace leave.
    for ((_, d), &ino) in files.iter().zip(&inos) {
        let half = d.len() as u64 / 2;
        fs.delivered(ino, half, d.len() as u64 - half);
    }
    assert!(cache.stats.released.load(Relaxed) > 0);
    assert!(
        cache.bytes() <= crate::io::cache::RELEASE_GRACE + (2 << 20),
        "{} bytes still cached",
        cache.bytes()
    );
    // Dropped frames are decoded again when asked for.
    for ((_, d), &ino) in files.iter().zip(&inos) {
        assert!(fs.read(ino, 0, d.len() as u32).unwrap() == *d);
    }
}

#[test]
fn seekable_random_reads_decode_only_the_frames_they_need() {
    let big = data(40 * 65536 + 77);
    let (_d, fs) = packed(&[("big.bin", &big), ("small.txt", b"small")], 65536);
    let ino = fs.resolve(b"big.bin").unwrap();
    let s = &fs.io().stats;
    let mut expected_frames = 0;
    for off in [1_000_000u64, 5, 2_000_000, 65536 * 7 - 10, 2_500_000] {
        let before = s.blocks_decoded.load(Relaxed);
        let got = fs.read(ino, off, 4096).unwrap();
        assert_eq!(got, &big[off as usize..off as usize + 4096]);
        let used = s.blocks_decoded.load(Relaxed) - before;
        assert!(
            (1..=2).contains(&used),
            "a 4 KiB read decoded {used} frames"
        );
        expected_frames += used;
    }
    assert!(s.decompressed_bytes.load(Relaxed) <= expected_frames * 65536);
    // A small file sits in one frame: one decode, then cached.
    let small = fs.resolve(b"small.txt").unwrap();
    let before = s.blocks_decoded.load(Relaxed);
    assert_eq!(fs.read(small, 0, 100).unwrap(), b"small");
    assert_eq!(fs.read(small, 0, 100).unwrap(), b"small");
    assert!(s.blocks_decoded.load(Relaxed) - before <= 1);
}

#[test]
fn corrupt_seekable_archives_fail_cleanly() {
    let big = data(10 * 65536);
    let (dir, _) = packed(&[("big.bin", &big)], 65536);
    let path = dir.path().join("p.tar.zst");
    let good = std::fs::read(&path).unwrap();

    // A damaged frame: reads that need it fail with EIO, the others still work.
    let mut bytes = good.clone();
    bytes[200] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let fs = open(&path, 1 << 20);
    let ino = fs.resolve(b"big.bin").unwrap();
    assert_eq!(fs.read(ino, 0, 100).unwrap_err().errno(), libc::EIO);
    assert_eq!(
        fs.read(ino, 9 * 65536, 100).unwrap(),
        &big[9 * 65536..9 * 65536 + 100]
    );

    // Truncated, or a seek table that disagrees with the file: the archive is refused.
    for cut in [good.len() - 3, good.len() / 2, 100] {
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(
            format::open_path(&path, &OpenContext::default()).is_err(),
            "cut at {cut}"
        );
    }
    let mut bytes = good.clone();
    let n = bytes.len();
    bytes[n - 17..n - 13].copy_from_slice(&u32::MAX.to_le_bytes()); // last frame's csize
    std::fs::write(&path, &bytes).unwrap();
    assert!(format::open_path(&path, &OpenContext::default()).is_err());
}

#[test]
fn check_compares_the_index_with_the_tar_stream() {
    let (dir, fs) = packed(&[("a.txt", b"aaa"), ("b/c.txt", b"ccc")], 65536);
    let path = dir.path().join("p.tar.zst");
    let cx = OpenContext::default();
    let idx = format::open_path(&path, &cx).ok().unwrap();
    let view = fs.view();
    let a = &view.layers[0].archive;
    assert!(a.package.verify(a, &cx).unwrap().is_empty());
    let mut lying = idx.entries.clone();
    let f = lying.iter_mut().find(|e| e.path == b"a.txt").unwrap();
    f.data = format::Loc::Stream(0);
    let problems = seekable::compare(&lying, &idx.entries);
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[test]
fn overlapping_entries_are_refused() {
    // Point the second entry's local header offset at the first entry's header: the
    // overlapping-zip-bomb trick. Its read fails; the first entry still reads.
    let (dir, _) = build(
        &[
            ("first", ::zip::CompressionMethod::Deflated, &data(1000)),
            ("other", ::zip::CompressionMethod::Deflated, &data(2000)),
        ],
        1 << 20,
    );
    let path = dir.path().join("t.zip");
    let mut bytes = std::fs::read(&path).unwrap();
    let cds: Vec<usize> = bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"PK\x01\x02")
        .map(|(i, _)| i)
        .collect();
    let first_offset = bytes[cds[0] + 42..cds[0] + 46].to_vec();
    bytes[cds[1] + 42..cds[1] + 46].copy_from_slice(&first_offset);
    std::fs::write(&path, &bytes).unwrap();
    let fs = open(&path, 1 << 20);
    let e = fs.read(fs.resolve(b"other").unwrap(), 0, 10).unwrap_err();
    assert!(e.to_string().contains("overlapping"), "{e}");
    assert_eq!(
        fs.read(fs.resolve(b"first").unwrap(), 0, 10).unwrap(),
        &data(1000)[..10]
    );
}
