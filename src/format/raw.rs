//! A blob served as one file, byte for byte: not an archive format (nothing probes for
//! it), the package of a file whose bytes are a whole blob (`pkgfs store`'s `blob` file:
//! a layer as the registry holds it, for podman to push or save).

use std::sync::Arc;

use super::floor::plain;
use super::{Archive, Entry, EntryKind, IndexOrigin, Loc, OpenContext, Package, Reading};
use crate::error::Result;
use crate::io::blob::Blob;
use crate::io::{ReadData, Span};

/// An archive of one entry at `path`, the whole of `blob`, with permissions `perm`.
pub fn archive(blob: Arc<dyn Blob>, path: &[u8], perm: u16) -> (Archive, Entry) {
    let entry = Entry {
        path: path.to_vec(),
        kind: EntryKind::File,
        perm,
        mtime: blob.mtime(),
        uid: None,
        gid: None,
        size: blob.size(),
        data: Loc::Stream(0),
        link: Vec::new(),
        rdev: 0,
        xattrs: Vec::new(),
    };
    let package = Raw {
        entry: entry.clone(),
    };
    (
        Archive::new(blob, Box::new(package), IndexOrigin::Archive),
        entry,
    )
}

/// The package: its one entry.
#[derive(Debug)]
struct Raw {
    entry: Entry,
}

impl Package for Raw {
    fn format(&self) -> &'static str {
        "raw"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn entries(&self, _: &Arc<dyn Blob>, _: &OpenContext) -> Result<Vec<Entry>> {
        Ok(vec![self.entry.clone()])
    }
    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, _: Span) -> Result<ReadData> {
        plain::read_from(r.blob, r, offset, end)
    }
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        plain::extent(r)
    }
    fn delivered(&self, _: &Reading<'_>, _: u64, _: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Io;

    #[test]
    fn the_file_is_the_blob() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let blob: Arc<dyn Blob> = Arc::new(crate::io::blob::Bytes::new("layer", bytes.clone()));
        let (archive, entry) = archive(blob, b"x/blob", 0o444);
        assert_eq!(entry.size, 10_000);
        let io = Io::new(1 << 20);
        let got = archive
            .read(&io, &entry.data, entry.size, 4_000, 3_000, Span::Whole)
            .unwrap();
        assert_eq!(&got[..], &bytes[4_000..7_000]);
    }
}
