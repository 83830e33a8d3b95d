//! The image-layer formats, made here byte by byte and read through the filesystem:
//! zstd:chunked and eStargz tables of contents (chunks checked on read, tables against
//! a manifest's digest), zstd tarballs served by frames or from a decompressed copy, and
//! the whole-layer digest check of `open_layer`.

use std::io::Write;
use std::sync::Arc;

use serde_json::json;

use crate::format::floor::tar::{TarKind, TarWriter, WriteEntry};
use crate::format::{self, Checked, DigestOf, IndexOrigin, LayerCheck, OpenContext};
use crate::fs::PkgFs;
use crate::io::blob::{Blob, Bytes};
use crate::io::digest::{Algorithm, Digest, Hasher};
use crate::tree::{Ownership, TreeBuilder};

fn sha(b: &[u8]) -> Digest {
    let mut h = Hasher::new(Algorithm::Sha256);
    h.update(b);
    h.finish()
}

fn text(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            b"layers of an image\n"[(x >> 27) as usize % 19]
        })
        .collect()
}

/// A layer check whose blob digest is `blob`'s, with the given table digests.
fn check(blob: &[u8], toc_blob: Option<Digest>, toc_json: Option<Digest>) -> LayerCheck {
    LayerCheck {
        digest: sha(blob),
        of: DigestOf::Blob,
        toc_blob,
        toc_json,
        ztoc: None,
    }
}

/// Open `bytes` as a layer with `cx` and mount it as a `PkgFs` (no FUSE).
fn mount(bytes: Vec<u8>, cx: &OpenContext) -> crate::error::Result<(PkgFs, Checked, IndexOrigin)> {
    let blob: Arc<dyn Blob> = Arc::new(Bytes::new("layer", bytes));
    let idx = format::open(blob, cx).map_err(|e| match e {
        format::OpenError::Bad(e) => e,
        format::OpenError::NotAnArchive => crate::error::Error::Format("not an archive".into()),
    })?;
    let (checked, origin) = (idx.archive.checked, idx.archive.origin);
    let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
    b.add_layer(0, 0, &idx.entries);
    Ok((
        PkgFs::new(b.finish(), vec![idx.archive], 1 << 20),
        checked,
        origin,
    ))
}

fn read(fs: &PkgFs, path: &str) -> crate::error::Result<Vec<u8>> {
    let ino = fs.resolve(path.as_bytes()).expect(path);
    let size = fs.getattr(ino)?.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let d = fs.read(ino, out.len() as u64, 100_000)?;
        assert!(!d.is_empty());
        out.extend_from_slice(&d);
    }
    Ok(out)
}

/// A zstd:chunked layer (containers/storage's layout): each chunk of each file its own
/// zstd frame, then the table in a skippable frame, then the 48-byte footer. Returns
/// the layer, the offset of every chunk, and the compressed table.
fn zstd_chunked(files: &[(&str, &[u8], usize)]) -> (Vec<u8>, Vec<usize>, Vec<u8>) {
    let mut out = Vec::new();
    let mut entries = Vec::new();
    let mut offsets = Vec::new();
    for (name, data, chunk) in files {
        let first = entries.len();
        for (i, piece) in data.chunks(*chunk).enumerate() {
            let off = out.len();
            offsets.push(off);
            out.extend_from_slice(&zstd::bulk::compress(piece, 3).unwrap());
            entries.push(if i == 0 {
                json!({"type": "reg", "name": name, "mode": 0o4755, "uid": 7, "gid": 8,
                       "size": data.len(), "modtime": "2024-01-01T00:00:00Z", "offset": off,
                       "chunkSize": piece.len(), "chunkDigest": sha(piece).to_string(),
                       "digest": sha(data).to_string(),
                       "xattrs": {"user.k": "dmFsdWU="}})
            } else {
                json!({"type": "chunk", "name": name, "offset": off, "chunkSize": piece.len(),
                       "chunkOffset": i * chunk, "chunkDigest": sha(piece).to_string()})
            });
        }
        if data.is_empty() {
            entries.push(json!({"type": "reg", "name": name, "mode": 0o644,
                                "modtime": "2024-01-01T00:00:00Z"}));
        }
        entries[first]["endOffset"] = out.len().into();
    }
    entries.push(json!({"type": "char", "name": "dev/null", "mode": 0o666,
                        "devMajor": 1, "devMinor": 3, "modtime": "2024-01-01T00:00:00Z"}));
    let toc = serde_json::to_vec(&json!({"version": 1, "entries": entries})).unwrap();
    let ctoc = zstd::bulk::compress(&toc, 3).unwrap();
    out.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    out.extend_from_slice(&(ctoc.len() as u32).to_le_bytes());
    let toc_off = out.len() as u64;
    out.extend_from_slice(&ctoc);
    out.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    out.extend_from_slice(&40u32.to_le_bytes());
    for v in [toc_off, ctoc.len() as u64, toc.len() as u64, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(b"GnUlInUx");
    (out, offsets, ctoc)
}

#[test]
fn zstd_chunked_layers_read_from_their_table_and_check_every_chunk() {
    let big = text(300_000, 3);
    let files: [(&str, &[u8], usize); 3] = [
        ("etc/hostname", b"pkgfs\n", 4096),
        ("usr/lib/big", &big, 64 * 1024),
        ("empty", b"", 4096),
    ];
    let (layer, offsets, ctoc) = zstd_chunked(&files);
    let good = check(&layer, Some(sha(&ctoc)), None);
    let cx = OpenContext {
        layer: Some(&good),
        ..OpenContext::default()
    };
    let (fs, checked, origin) = mount(layer.clone(), &cx).unwrap();
    assert_eq!((checked, origin), (Checked::Toc, IndexOrigin::Archive));
    assert_eq!(read(&fs, "etc/hostname").unwrap(), b"pkgfs\n");
    assert_eq!(read(&fs, "usr/lib/big").unwrap(), big);
    assert_eq!(read(&fs, "empty").unwrap(), b"");
    // Across a chunk boundary, from the middle.
    let ino = fs.resolve(b"usr/lib/big").unwrap();
    assert_eq!(
        &fs.read(ino, 65_000, 2_000).unwrap()[..],
        &big[65_000..67_000]
    );
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.perm, a.uid, a.gid), (0o4755, 7, 8));
    assert_eq!(fs.getxattr(ino, b"user.k").unwrap(), b"value");
    let null = fs.getattr(fs.resolve(b"dev/null").unwrap()).unwrap();
    assert_eq!((null.kind, null.rdev), (crate::tree::Kind::CharDev, 0x103));

    // A chunk whose bytes were changed (here its frame's last byte, the content
    // checksum's or the data's): that chunk reads EIO, the rest of the file and the
    // layer read.
    let mut bad = layer.clone();
    let third = offsets[3] - 1; // the end of the second chunk of usr/lib/big
    bad[third] ^= 0x55;
    let (fs, _, _) = mount(bad, &cx).unwrap();
    assert_eq!(read(&fs, "etc/hostname").unwrap(), b"pkgfs\n");
    let ino = fs.resolve(b"usr/lib/big").unwrap();
    assert_eq!(&fs.read(ino, 0, 1000).unwrap()[..], &big[..1000]);
    let err = fs.read(ino, 70_000, 10).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");

    // A table that is not the one the manifest names: the layer is refused.
    let wrong = check(&layer, Some(sha(b"another table")), None);
    let cx = OpenContext {
        layer: Some(&wrong),
        ..OpenContext::default()
    };
    let err = mount(layer.clone(), &cx).err().unwrap().to_string();
    assert!(err.contains("does not match its digest"), "{err}");

    // Opened as a plain file (no manifest): served, nothing vouched for by a manifest.
    let (fs, checked, _) = mount(layer, &OpenContext::default()).unwrap();
    assert_eq!(checked, Checked::Nothing);
    assert_eq!(read(&fs, "usr/lib/big").unwrap(), big);
}

/// An eStargz layer: each chunk starts a gzip member, the table is
/// `stargz.index.json` in a tar in a gzip member, then the 51-byte footer.
fn estargz(files: &[(&str, &[u8], usize)]) -> (Vec<u8>, Vec<u8>) {
    estargz_with(files, None)
}

/// [`estargz`], with the first `prioritized` files before a `.prefetch.landmark` (as
/// `ctr-remote image optimize` writes them) instead of a `.no.prefetch.landmark` first.
fn estargz_with(files: &[(&str, &[u8], usize)], prioritized: Option<usize>) -> (Vec<u8>, Vec<u8>) {
    let gz = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let mut out = Vec::new();
    let mut entries = Vec::new();
    let landmark = |name: &str, out: &mut Vec<u8>, entries: &mut Vec<serde_json::Value>| {
        entries.push(
            json!({"type": "reg", "name": name, "size": 1, "offset": out.len(),
                            "chunkDigest": sha(b"\xf0").to_string()}),
        );
        out.extend_from_slice(&gz(b"\xf0"));
    };
    if prioritized.is_none() {
        landmark(".no.prefetch.landmark", &mut out, &mut entries);
    }
    for (fi, (name, data, chunk)) in files.iter().enumerate() {
        if prioritized == Some(fi) {
            landmark(".prefetch.landmark", &mut out, &mut entries);
        }
        let pieces = data.len().div_ceil(*chunk);
        for (i, piece) in data.chunks(*chunk).enumerate() {
            let off = out.len();
            // Tar padding after the chunk lies in its member: reads stop at its size.
            out.extend_from_slice(&gz(&[piece, &[0u8; 300][..]].concat()));
            entries.push(if i == 0 {
                json!({"type": "reg", "name": name, "mode": 0o644, "size": data.len(),
                       "modtime": "2024-01-01T00:00:00Z", "offset": off,
                       "chunkSize": piece.len(), "chunkDigest": sha(piece).to_string()})
            } else if i + 1 == pieces {
                // stargz-snapshotter's writer gives the last chunk no size: it runs to
                // the end of the file.
                json!({"type": "chunk", "name": name, "offset": off,
                       "chunkOffset": i * chunk, "chunkDigest": sha(piece).to_string()})
            } else {
                json!({"type": "chunk", "name": name, "offset": off, "chunkSize": piece.len(),
                       "chunkOffset": i * chunk, "chunkDigest": sha(piece).to_string()})
            });
        }
    }
    entries.push(json!({"type": "hardlink", "name": "link", "linkName": files[0].0}));
    let json = serde_json::to_vec(&json!({"version": 1, "entries": entries})).unwrap();
    let mut t = TarWriter::new(Vec::new());
    t.header(&WriteEntry {
        path: b"stargz.index.json",
        kind: TarKind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: 0,
        size: json.len() as u64,
        link: &[],
    })
    .unwrap();
    t.data(&json).unwrap();
    t.end_entry().unwrap();
    let toc_off = out.len();
    out.extend_from_slice(&gz(&t.finish().unwrap()));
    let mut footer = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 26, 0, b'S', b'G', 22, 0,
    ];
    footer.extend_from_slice(format!("{toc_off:016x}STARGZ").as_bytes());
    footer.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(footer.len(), 51);
    out.extend_from_slice(&footer);
    (out, json)
}

#[test]
fn estargz_layers_read_from_their_table_without_the_format_s_own_files() {
    let big = text(200_000, 5);
    let files: [(&str, &[u8], usize); 2] = [("bin/sh", b"#!\n", 4096), ("big", &big, 60_000)];
    let (layer, json) = estargz(&files);
    let good = check(&layer, None, Some(sha(&json)));
    let cx = OpenContext {
        layer: Some(&good),
        ..OpenContext::default()
    };
    let (fs, checked, _) = mount(layer.clone(), &cx).unwrap();
    assert_eq!(checked, Checked::Toc);
    assert_eq!(read(&fs, "bin/sh").unwrap(), b"#!\n");
    assert_eq!(read(&fs, "big").unwrap(), big);
    assert_eq!(read(&fs, "link").unwrap(), b"#!\n");
    assert!(fs.resolve(b".no.prefetch.landmark").is_none());
    assert!(fs.resolve(b"stargz.index.json").is_none());
    let wrong = check(&layer, None, Some(sha(b"{}")));
    let cx = OpenContext {
        layer: Some(&wrong),
        ..OpenContext::default()
    };
    assert!(mount(layer, &cx).is_err());
}

#[test]
fn estargz_prioritized_files_are_the_bytes_to_fetch_first() {
    let big = text(200_000, 7);
    let files: [(&str, &[u8], usize); 3] = [
        ("usr/bin/python3", b"started first", 4096),
        ("usr/lib/json.py", b"imported second", 4096),
        ("big", &big, 60_000),
    ];
    let read_first = |layer: Vec<u8>| {
        let blob: Arc<dyn Blob> = Arc::new(Bytes::new("layer", layer));
        let idx = format::open(blob, &OpenContext::default()).unwrap_or_else(|_| panic!("opens"));
        idx.archive.package.read_first()
    };
    // The landmark after the first two files: the layer's bytes up to it come first.
    let (layer, json) = estargz_with(&files, Some(2));
    let toc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let offset = |name: &str| {
        toc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()["offset"]
            .as_u64()
            .unwrap()
    };
    let end = offset(".prefetch.landmark");
    assert_eq!(read_first(layer.clone()), Some((0, end)));
    assert!(offset("usr/bin/python3") < end && offset("usr/lib/json.py") < end);
    assert!(offset("big") > end, "the rest is not prioritized");
    // The layer reads as ever, the landmark not shown.
    let (fs, ..) = mount(layer, &OpenContext::default()).unwrap();
    assert_eq!(read(&fs, "usr/lib/json.py").unwrap(), b"imported second");
    assert_eq!(read(&fs, "big").unwrap(), big);
    assert!(fs.resolve(b".prefetch.landmark").is_none());
    // A landmark first prioritizes nothing; `.no.prefetch.landmark` says so outright.
    assert_eq!(read_first(estargz_with(&files, Some(0)).0), None);
    assert_eq!(read_first(estargz(&files).0), None);
}

/// Bytes behind a round trip each: the reads and the read-ahead advice it was given.
#[derive(Debug)]
struct Trips {
    inner: Bytes,
    reads: std::sync::Mutex<Vec<(u64, u64)>>,
    advice: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Blob for Trips {
    fn name(&self) -> &std::path::Path {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> crate::error::Result<()> {
        self.reads
            .lock()
            .unwrap()
            .push((offset, offset + buf.len() as u64));
        self.inner.read_exact_at(buf, offset)
    }
    fn round_trips(&self) -> bool {
        true
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.advice.lock().unwrap().extend_from_slice(ranges);
    }
    fn version(&self) -> &str {
        self.inner.version()
    }
    fn mtime(&self) -> i64 {
        0
    }
}

#[test]
fn a_chunk_of_many_pieces_from_a_server_is_asked_for_whole_before_its_first_piece() {
    // Incompressible, in one chunk: its gzip member is several of the decoder's pieces.
    let mut x = 0x9e37_79b9_u32;
    let big: Vec<u8> = (0..700_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let files: [(&str, &[u8], usize); 2] = [("bin/sh", b"#!\n", 4096), ("big", &big, 1 << 20)];
    let (layer, json) = estargz(&files);
    let toc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let offsets: Vec<u64> = toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["offset"].as_u64())
        .collect();
    let at = toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "big")
        .unwrap()["offset"]
        .as_u64()
        .unwrap();
    let blob = Arc::new(Trips {
        inner: Bytes::new("layer", layer),
        reads: Default::default(),
        advice: Default::default(),
    });
    let idx = format::open(blob.clone(), &OpenContext::default()).unwrap_or_else(|_| panic!());
    let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
    b.add_layer(0, 0, &idx.entries);
    let fs = PkgFs::new(b.finish(), vec![idx.archive], 1 << 20);
    blob.reads.lock().unwrap().clear();
    assert_eq!(read(&fs, "big").unwrap(), big);
    let reads = blob.reads.lock().unwrap().clone();
    assert!(reads.len() > 1, "the chunk is read in pieces: {reads:?}");
    let end = reads.iter().map(|r| r.1).max().unwrap();
    assert!(end - at > 256 * 1024 && offsets.iter().all(|&o| o <= at || o >= end));
    // All of it asked for at once, so the pieces wait for one round trip, not one each.
    let advice = blob.advice.lock().unwrap().clone();
    assert!(
        advice.iter().any(|&(s, e)| s <= at && end <= e),
        "advice {advice:?}, chunk {at}-{end}"
    );
}

/// A tar stream of `files`.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut t = TarWriter::new(Vec::new());
    for (name, data) in files {
        t.header(&WriteEntry {
            path: name.as_bytes(),
            kind: TarKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 1_700_000_000,
            size: data.len() as u64,
            link: &[],
        })
        .unwrap();
        t.data(data).unwrap();
        t.end_entry().unwrap();
    }
    t.finish().unwrap()
}

#[test]
fn zstd_tarballs_serve_small_frames_in_place_and_one_big_frame_from_a_copy() {
    let a = text(3 << 20, 7);
    let b = text(9 << 20, 9);
    let tar = tar_of(&[("a", &a), ("dir/b", &b)]);
    let framed: Vec<u8> = tar
        .chunks(1 << 20)
        .flat_map(|c| zstd::bulk::compress(c, 3).unwrap())
        .collect();
    let single = zstd::bulk::compress(&tar, 3).unwrap();
    for (what, bytes, copies) in [("frames", framed, 0), ("one frame", single, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let cache = format::IndexCache::new(dir.path().join("cache"));
        let ok = check(&bytes, None, None);
        let cx = OpenContext {
            layer: Some(&ok),
            index_cache: Some(&cache),
            ..OpenContext::default()
        };
        for origin in [IndexOrigin::Pass, IndexOrigin::Cache] {
            let (fs, checked, got) = mount(bytes.clone(), &cx).unwrap();
            assert_eq!((checked, got), (Checked::Digest, origin), "{what}");
            assert_eq!(read(&fs, "a").unwrap(), a, "{what}");
            assert_eq!(read(&fs, "dir/b").unwrap(), b, "{what}");
        }
        let copies_made = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("tar".as_ref()))
            .count();
        assert_eq!(copies_made, copies, "{what}");
        // The wrong digest: refused, and nothing cached for it.
        let mut wrong = check(&bytes, None, None);
        wrong.digest = sha(b"not this layer");
        let cx = OpenContext {
            layer: Some(&wrong),
            index_cache: Some(&cache),
            ..OpenContext::default()
        };
        let err = mount(bytes.clone(), &cx).err().unwrap().to_string();
        assert!(err.contains("does not match its digest"), "{what}: {err}");
    }
}

#[test]
fn a_layer_read_without_a_pass_is_hashed_whole_once() {
    let tar = tar_of(&[("f", b"plain tar layer\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = format::IndexCache::new(dir.path().join("cache"));
    let cx = OpenContext {
        index_cache: Some(&cache),
        ..OpenContext::default()
    };
    let blob: Arc<dyn Blob> = Arc::new(Bytes::new("layer.tar", tar.clone()));
    let good = check(&tar, None, None);
    let idx = format::open_layer(blob.clone(), &good, &cx).unwrap();
    assert_eq!(
        (idx.archive.format(), idx.archive.checked),
        ("tar", Checked::Digest)
    );
    // The check is remembered: the marker is in the cache, keyed by version and digest.
    let marker = cache.key("digest", &*blob, &good.digest.to_string());
    assert!(cache.load(&marker).is_some());
    let mut bad = good.clone();
    bad.digest = sha(b"other");
    let err = match format::open_layer(blob, &bad, &cx) {
        Err(format::OpenError::Bad(e)) => e.to_string(),
        _ => panic!("a wrong digest must fail"),
    };
    assert!(err.contains("does not match its digest"), "{err}");
}

/// A blob that notes, in one log shared with others, each read and each read-ahead
/// advice it is given, under its own name.
#[derive(Debug)]
struct Noted {
    inner: Bytes,
    tag: &'static str,
    log: Arc<std::sync::Mutex<Vec<(&'static str, &'static str)>>>,
}

impl Blob for Noted {
    fn name(&self) -> &std::path::Path {
        self.inner.name()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> crate::error::Result<()> {
        self.log.lock().unwrap().push((self.tag, "read"));
        self.inner.read_exact_at(buf, offset)
    }
    fn will_need(&self, _ranges: &[(u64, u64)]) {
        self.log.lock().unwrap().push((self.tag, "advice"));
    }
    fn version(&self) -> &str {
        self.inner.version()
    }
    fn mtime(&self) -> i64 {
        0
    }
}

/// A gzip layer whose index is to be made from its SOCI zTOC has the zTOC asked for
/// before anything of the layer is read (the probes for its format cost round trips
/// the zTOC's transfer can run under); once an index made from that zTOC is kept,
/// nothing is asked.
#[test]
fn a_layers_ztoc_is_asked_for_before_its_format_is_probed() {
    let tar = tar_of(&[("f", b"a gzip layer with a zTOC\n")]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = format::IndexCache::new(dir.path().join("cache"));
    let cx = OpenContext {
        index_cache: Some(&cache),
        ..OpenContext::default()
    };
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let noted = |tag, bytes: Vec<u8>| -> Arc<dyn Blob> {
        Arc::new(Noted {
            inner: Bytes::new(tag, bytes),
            tag,
            log: log.clone(),
        })
    };
    // Not a zTOC the parser takes: the layer falls back to a pass, which is no matter
    // here (what is asked for first is).
    let ztoc = b"not really a zTOC".to_vec();
    let mut check = check(&gz, None, None);
    check.ztoc = Some(format::ZtocRef {
        blob: noted("ztoc", ztoc.clone()),
        digest: sha(&ztoc),
    });
    let layer = noted("layer", gz.clone());
    assert!(format::open_layer(layer.clone(), &check, &cx).is_ok());
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.first(), Some(&("ztoc", "advice")), "{seen:?}");
    assert!(seen.contains(&("ztoc", "read")), "{seen:?}");

    // Kept: the zTOC is not wanted.
    let z = check.ztoc.as_ref().unwrap();
    let kept = cache.key("tar.gz ztoc", &*layer, &z.digest.to_string());
    cache.store(&kept, b"an index made from it").unwrap();
    log.lock().unwrap().clear();
    let _ = format::open_layer(layer, &check, &cx);
    let seen = log.lock().unwrap().clone();
    assert!(!seen.contains(&("ztoc", "advice")), "{seen:?}");
}
