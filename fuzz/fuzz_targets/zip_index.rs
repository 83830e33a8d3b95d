//! Fuzz the ZIP index parsers: end-record search and central-directory records.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pkgfs::format::zip::index as zip;

fuzz_target!(|data: &[u8]| {
    let _ = zip::find_eocd(data);
    if let Ok(index) = zip::parse_central_directory(data, 0, 1 << 40) {
        for e in index.entries {
            let _ = pkgfs::tree::path::components(&e.path);
        }
    }
});
