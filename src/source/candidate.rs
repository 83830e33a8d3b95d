//! A file that may be an archive ([`Candidate`]): how it was named, how to tell
//! whether it changed ([`Stamp`], [`stat_all`] on several threads), and how to open and
//! index it, whatever it is read through (a local file, a remote object, an image
//! layer, a seal).
//!
//! Kept apart from discovery and from the scan so that what a candidate *is* has one
//! home: `discover` makes candidates, `verify` wraps them, the indexing threads and the
//! lazy grafts open them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Error;
use crate::format::{self, Archive, Indexed, OpenContext, OpenError};

use super::{image, verify};

/// A file that may be an archive, with how it was named.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its path (for an image's layer: its name, `oci:DIR:TAG layer 2/3 (sha256:…)`).
    pub path: PathBuf,
    /// Named directly on the command line (a non-archive is then an error, not ignored).
    pub explicit: bool,
    /// The image layer it is, if it is one.
    pub layer: Option<Arc<image::ImageLayer>>,
    /// Its bytes, when it is not a local file (an object of a remote source, or any
    /// archive of a sealed source: read through its seal).
    pub blob: Option<Arc<dyn crate::io::blob::Blob>>,
    /// Why it may not be mounted, though listed (`--verify`: not in the seal).
    pub refused: Option<Error>,
    /// The seal a local file of a sealed source is read through, once it is opened (by
    /// the indexing threads: not one by one while the source is listed).
    pub sealed: Option<Arc<verify::SealedSource>>,
}

impl Candidate {
    /// The version of its bytes now (None if it is gone), and its modification time.
    pub(super) fn stat(&self) -> Option<(Stamp, i64)> {
        match (&self.layer, &self.blob) {
            (Some(l), _) => Some((l.blob.version().to_string(), l.blob.mtime())),
            (None, Some(b)) => Some((b.version().to_string(), b.mtime())),
            (None, None) => {
                use std::os::unix::fs::MetadataExt;
                let m = std::fs::metadata(&self.path).ok()?;
                let mut version = crate::io::blob::local_version(&m);
                // As the version of the blob it is read through (`VerifiedBlob`).
                if let Some(s) = &self.sealed {
                    version =
                        crate::io::verified::sealed_version(&version, &s.tree_of(&self.path)?);
                }
                Some((version, m.mtime()))
            }
        }
    }

    /// Open and index it.
    pub(super) fn open(&self, cx: &OpenContext) -> std::result::Result<Indexed, OpenError> {
        if let Some(e) = &self.refused {
            return Err(OpenError::Bad(e.clone()));
        }
        match (&self.layer, &self.blob) {
            (Some(l), _) => {
                let start = super::start::Start::begin(l, cx);
                let r = format::open_layer(start.blob(l), &l.check, cx);
                // A layer read lazily from a server (a table of contents, a zTOC): the
                // rest of it in the background, so that a program's reads, one after
                // another, wait for no round trip once it is in; or, without the
                // background fetch, little more than what is read.
                if let Ok(ix) = &r
                    && l.blob.round_trips()
                    && matches!(
                        ix.archive.checked,
                        format::Checked::Toc | format::Checked::Ztoc
                    )
                {
                    // What the image's build found its start reading (eStargz's
                    // prioritized files): at once and in parallel, whatever follows, in
                    // pieces of 1 MiB so that a read waits for its piece, not for all.
                    if let Some((start, end)) = ix.archive.package.read_first() {
                        let pieces: Vec<(u64, u64)> = (start..end)
                            .step_by(1 << 20)
                            .map(|a| (a, (a + (1 << 20)).min(end)))
                            .collect();
                        l.blob.will_need(&pieces);
                    }
                    start.arm();
                    if l.background_fetch {
                        l.blob.fetch_in_background();
                    } else if ix.archive.checked == format::Checked::Toc {
                        // Its chunks read ahead within each file (`format::toc`).
                        l.blob.fetch_sparingly(0);
                    } else {
                        l.blob
                            .fetch_sparingly(crate::io::remote::SPARING_READ_AHEAD);
                    }
                }
                r
            }
            (None, Some(b)) => format::open(b.clone(), cx),
            (None, None) => match &self.sealed {
                Some(s) => {
                    let blob =
                        crate::io::blob::LocalFile::open(&self.path).map_err(OpenError::Bad)?;
                    let blob = s.wrap_local(&self.path, blob).map_err(OpenError::Bad)?;
                    format::open(blob, cx)
                }
                None => format::open_path(&self.path, cx),
            },
        }
    }
}

/// What identifies the file at a path: its blob version (device, inode, size and
/// modification time). A package replaced by rename, or rewritten in place, has a
/// different stamp.
pub type Stamp = String;

pub(super) fn archive_stamp(a: &Archive) -> Stamp {
    a.blob.version().to_string()
}

/// Candidates at least this many are `stat`ed on several threads: a cold `stat` waits on
/// the disk, and a virtual disk answers several at once (10,000 files: 65 ms on one
/// thread, 35 ms on two or more, docs/BENCHMARKS.md "Layouts").
pub(super) const PARALLEL_STAT_FROM: usize = 512;

/// [`Candidate::stat`] of every candidate, in order; on up to `threads` threads when
/// there are many.
pub(super) fn stat_all(candidates: &[Candidate], threads: usize) -> Vec<Option<(Stamp, i64)>> {
    if candidates.len() < PARALLEL_STAT_FROM || threads < 2 {
        return candidates.iter().map(Candidate::stat).collect();
    }
    let chunk = candidates.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = candidates
            .chunks(chunk)
            .map(|c| {
                let h = s.spawn(move || c.iter().map(Candidate::stat).collect::<Vec<_>>());
                (c.len(), h)
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|(n, h)| {
                // A panicking stat (there is none) leaves its candidates unknown: gone.
                h.join().unwrap_or_else(|_| vec![None; n])
            })
            .collect()
    })
}

/// Extensions of ZIP-based package formats. A file in a source directory with one of
/// these names, or starting with a ZIP signature, that cannot be read is *skipped with a
/// warning* (it is a broken package); any other non-archive is ignored quietly.
const ARCHIVE_EXTENSIONS: &[&str] = &[
    "zip", "jar", "war", "ear", "aar", "whl", "egg", "apk", "xpi", "nupkg", "vsix", "ipa", "pkg",
];

/// Whether a file that pkgfs cannot read looks like a broken package (warned about and
/// skipped) rather than some other file (ignored quietly): by its extension or its first
/// bytes.
pub(super) fn looks_like_archive(path: &Path) -> bool {
    let by_name = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ARCHIVE_EXTENSIONS.iter().any(|a| a.eq_ignore_ascii_case(e)));
    let mut magic = [0u8; 4];
    let by_content = std::fs::File::open(path)
        .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
        .is_ok_and(|()| magic[..2] == *b"PK");
    by_name || by_content
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::tests::candidates;

    #[test]
    fn many_candidates_are_stat_ed_in_parallel_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths: Vec<PathBuf> = (0..PARALLEL_STAT_FROM + 100)
            .map(|i| {
                let p = dir.path().join(format!("f{i:04}"));
                std::fs::write(&p, vec![0u8; i]).unwrap();
                p
            })
            .collect();
        paths.insert(7, dir.path().join("gone"));
        let cands = candidates(&paths);
        let one = stat_all(&cands, 1);
        let many = stat_all(&cands, 4);
        assert_eq!(one, many);
        assert!(many[7].is_none(), "a file gone since its listing");
        assert_eq!(many.iter().filter(|s| s.is_some()).count(), paths.len() - 1);
    }
}
