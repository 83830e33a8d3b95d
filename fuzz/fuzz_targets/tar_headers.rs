//! Fuzz the tar header scanner (pax, ustar, GNU long names, base-256 numbers).
#![no_main]
use libfuzzer_sys::fuzz_target;
use pkgfs::format::floor::tar;

fuzz_target!(|data: &[u8]| {
    let _ = tar::scan(data);
});
