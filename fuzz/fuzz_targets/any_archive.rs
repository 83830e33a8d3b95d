//! Fuzz every format at once, as a mount meets an untrusted file: recognition by
//! content (tables of contents, seek tables, ZIP, gzip, zstd and plain tar), the index
//! each format reads, and a read of every file it lists (chunks checked against a
//! table's digests, frames, tar data).
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pkgfs::format::{self, EntryKind, OpenContext};
use pkgfs::io::blob::{Blob, Bytes};
use pkgfs::io::{Io, Span};

fuzz_target!(|data: &[u8]| {
    let blob: Arc<dyn Blob> = Arc::new(Bytes::new("fuzz", data.to_vec()));
    let Ok(indexed) = format::open(blob, &OpenContext::default()) else {
        return;
    };
    let io = Io::new(4 << 20);
    for e in indexed.entries.iter().take(256) {
        if e.kind == EntryKind::File {
            let len = e.size.min(1 << 20) as u32;
            let _ = indexed.archive.read(&io, &e.data, e.size, 0, len, Span::Whole);
        }
    }
});
