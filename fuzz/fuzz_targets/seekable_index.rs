//! Fuzz the seekable-zstd tail parsers: seek table footer and table, pkgfs index frame.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pkgfs::format::floor::{codec, frames};

fuzz_target!(|data: &[u8]| {
    let size = data.len() as u64 + 1000;
    let _ = frames::probe(data, size);
    if let Ok(t) = frames::parse_seek_table(data, size) {
        let _ = t.frame_at(t.total / 2);
    }
    let _ = codec::decode_index(data, 1 << 30);
});
