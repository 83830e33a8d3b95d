//! The decode limit of a store of gzip tarballs, for `bench/crates.py` (issue 37: "every
//! member inflated by the project's own decoder on both cores"): each file's deflate
//! stream inflated whole, the files shared by N threads, from memory (the files are read
//! before the clock starts), by the decoders pkgfs reads with:
//!
//! - `streaming`: `pkgfs::io::inflate::Inflater` (zlib-rs), what the read path of a gzip
//!   tarball decodes its spans with;
//! - `one-call`: `pkgfs::io::inflate::OneShot` (libdeflate), what ZIP members decoded
//!   whole go through (it needs the stream's size, from the gzip trailer).
//!
//! Prints one JSON object: seconds for each, and the bytes each produced.
//!
//!     cargo run --release --example inflate_limit -- [--threads N] FILE.gz...

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use pkgfs::io::inflate::{Inflater, OneShot};

/// The deflate stream of a gzip member and its size from the trailer (RFC 1952).
fn deflate_of(gz: &[u8]) -> Option<(&[u8], usize)> {
    if gz.len() < 18 || gz[0..3] != [0x1f, 0x8b, 8] {
        return None;
    }
    let flags = gz[3];
    let mut at = 10;
    if flags & 4 != 0 {
        let xlen = usize::from(u16::from_le_bytes([gz[at], gz[at + 1]]));
        at += 2 + xlen;
    }
    for bit in [8u8, 16] {
        if flags & bit != 0 {
            at += gz.get(at..)?.iter().position(|&b| b == 0)? + 1;
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    let end = gz.len() - 8;
    let size = u32::from_le_bytes(gz[end + 4..].try_into().ok()?) as usize;
    Some((gz.get(at..end)?, size))
}

fn streaming(deflate: &[u8], buf: &mut [u8]) -> usize {
    let mut z = Inflater::new().expect("zlib-rs decoder");
    let (mut input, mut total) = (deflate, 0);
    loop {
        let p = z.step(input, buf).expect("a valid deflate stream");
        input = &input[p.consumed..];
        total += p.produced;
        if p.ended {
            return total;
        }
        assert!(
            p.consumed > 0 || p.produced > 0,
            "the decoder made no progress"
        );
    }
}

fn one_call(deflate: &[u8], size: usize, out: &mut Vec<u8>) -> usize {
    let mut d = OneShot::new().expect("libdeflate decoder");
    d.decode(deflate, out, size)
        .expect("a valid deflate stream");
    out.len()
}

/// Seconds for `threads` threads to inflate every file with `decode`, and the bytes out.
fn timed(
    files: &[(&[u8], usize)],
    threads: usize,
    decode: impl Fn(&[u8], usize) -> usize + Sync,
) -> (f64, usize) {
    let next = AtomicUsize::new(0);
    let out = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(&(d, size)) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    out.fetch_add(decode(d, size), Ordering::Relaxed);
                }
            });
        }
    });
    (t.elapsed().as_secs_f64(), out.into_inner())
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut threads = 2;
    if let Some(i) = args.iter().position(|a| a == "--threads") {
        threads = args[i + 1].parse().expect("--threads N");
        args.drain(i..i + 2);
    }
    let raw: Vec<Vec<u8>> = args
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .collect();
    let files: Vec<(&[u8], usize)> = raw
        .iter()
        .zip(&args)
        .map(|(b, p)| deflate_of(b).unwrap_or_else(|| panic!("{p}: not a gzip file")))
        .collect();
    let (s_secs, s_bytes) = timed(&files, threads, |d, _| {
        thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 1 << 20]));
        BUF.with(|b| streaming(d, &mut b.borrow_mut()))
    });
    let (o_secs, o_bytes) = timed(&files, threads, |d, size| {
        one_call(d, size, &mut Vec::with_capacity(size))
    });
    println!(
        "{{\"threads\": {threads}, \"files\": {}, \"streaming_s\": {s_secs:.4}, \"streaming_bytes\": {s_bytes}, \"one_call_s\": {o_secs:.4}, \"one_call_bytes\": {o_bytes}}}",
        files.len()
    );
}
