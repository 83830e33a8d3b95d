//! Micro-benchmarks of the hot paths: building the tree from 100,000 entries, lookups,
//! a block-cache hit and a frame decode. Run with `cargo bench`; CI only builds them
//! (`cargo bench --no-run`): timings belong in docs/BENCHMARKS.md, never in tests.

use std::hint::black_box;
use std::io::Write;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pkgfs::format::floor::frames as seekable;
use pkgfs::format::{Entry, EntryKind, Loc};
use pkgfs::io::blob::LocalFile;
use pkgfs::io::cache::{Block, BlockCache};
use pkgfs::tree::{Ownership, TreeBuilder};

const OWNER: Ownership = Ownership::defaults(0, 0);

fn entries(n: usize) -> Vec<Entry> {
    (0..n)
        .map(|i| Entry {
            path: format!("pkg{}/dir{}/file{i}.py", i % 97, i % 13).into_bytes(),
            kind: EntryKind::File,
            perm: 0o644,
            mtime: 1_700_000_000,
            uid: None,
            gid: None,
            size: 100,
            data: Loc::Record(i as u32),
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        })
        .collect()
}

fn tree(c: &mut Criterion) {
    let e = entries(100_000);
    let mut g = c.benchmark_group("tree");
    g.throughput(Throughput::Elements(e.len() as u64));
    g.bench_function("build 100k entries", |b| {
        b.iter(|| {
            let mut t = TreeBuilder::new(OWNER);
            t.add_layer(0, 0, black_box(&e));
            t.finish()
        })
    });
    let mut t = TreeBuilder::new(OWNER);
    t.add_layer(0, 0, &e);
    let t = t.finish();
    g.throughput(Throughput::Elements(1));
    g.bench_function("resolve a 3-level path", |b| {
        b.iter(|| t.resolve(black_box(b"pkg42/dir3/file12345.py")))
    });
    g.finish();
}

fn cache(c: &mut Criterion) {
    let cache = BlockCache::new(64 << 20);
    for i in 0..200u64 {
        cache.insert(i, Arc::new(Block::new(vec![0u8; 256 * 1024])));
    }
    c.bench_function("block cache hit", |b| b.iter(|| cache.get(black_box(&123))));
}

fn frame(c: &mut Criterion) {
    // One 256 KiB frame in a real seekable file, decoded by the read path's function.
    let data: Vec<u8> = (0..256 * 1024)
        .map(|i| b"fn main() { println!(); }\n"[i % 26])
        .collect();
    let compressed = zstd::bulk::compress(&data, 12).expect("compress");
    let table = seekable::encode_seek_table(&[(compressed.len() as u32, data.len() as u32)]);
    let mut file = tempfile::NamedTempFile::new().expect("tempfile");
    file.write_all(&compressed).expect("write");
    file.write_all(&table).expect("write");
    file.flush().expect("flush");
    let size = (compressed.len() + table.len()) as u64;
    let table = seekable::parse_seek_table(&table, size).expect("table");
    let file = LocalFile::open(file.path()).expect("open");
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("decode a 256 KiB frame", |b| {
        b.iter(|| seekable::decode_frame(&*file, black_box(&table), 0))
    });
    g.finish();
}

criterion_group!(benches, tree, cache, frame);
criterion_main!(benches);
