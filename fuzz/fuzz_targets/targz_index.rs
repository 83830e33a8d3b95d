//! Fuzz the tar.gz index reader: the gzip member headers, the index pass over a whole
//! (hostile) stream with its points and trailer checks, and the cached form's decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pkgfs::format::targz;

fuzz_target!(|data: &[u8]| {
    let _ = pkgfs::format::floor::gzip::gzip_header(data);
    targz::fuzz_decode(data);
    targz::fuzz_pass(data);
});
