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
                let start = Start::begin(l, cx);
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

/// A lazily read layer's start (`io::starts`): the record of its image's earlier start
/// fetched ahead, or this start recorded.
enum Start {
    /// Nothing to do: not read from a registry, no index cache, or no window.
    None,
    /// The record of the image's last start, to be fetched once the layer is open (not
    /// before: the open's own reads, a table of contents, are what a pull waits for).
    Replay {
        blob: Arc<dyn crate::io::blob::Blob>,
        ranges: Vec<(u64, u64)>,
    },
    /// Recording into the index cache under `key` once its window is over.
    Recording {
        recorder: Arc<crate::io::starts::Recorder>,
        blob: Arc<dyn crate::io::blob::Blob>,
        key: format::cache::CacheKey,
        cache: format::cache::IndexCache,
    },
}

impl Start {
    /// Before layer `l` is opened: its image's record, if there is one; otherwise a
    /// recorder.
    fn begin(l: &image::ImageLayer, cx: &OpenContext) -> Start {
        use crate::io::starts;
        let (Some(spec), Some(cache)) = (&l.start, cx.index_cache) else {
            return Start::None;
        };
        if !l.blob.round_trips() {
            return Start::None;
        }
        let key = cache.key_for("start", l.blob.version(), &spec.image);
        if let Some(bytes) = cache.load(&key) {
            match starts::decode(&bytes, l.blob.size()) {
                Ok(ranges) => {
                    return Start::Replay {
                        blob: l.blob.clone(),
                        ranges,
                    };
                }
                // Recorded again below.
                Err(e) => log::warn!("{}: {e}; recording it again", l.name.display()),
            }
        }
        let recorder = starts::Recorder::new(spec.window);
        Start::Recording {
            blob: starts::recording(l.blob.clone(), recorder.clone()),
            recorder,
            key,
            cache: cache.clone(),
        }
    }

    /// The blob to open the layer through.
    fn blob(&self, l: &image::ImageLayer) -> Arc<dyn crate::io::blob::Blob> {
        match self {
            Start::None | Start::Replay { .. } => l.blob.clone(),
            Start::Recording { blob, .. } => blob.clone(),
        }
    }

    /// The layer is open and read lazily: the start begins. The last start's record is
    /// fetched, in order; or this start's is kept when the window is over (by a thread
    /// that waits for it).
    fn arm(&self) {
        let (recorder, key, cache, blob) = match self {
            Start::None => return,
            Start::Replay { blob, ranges } => {
                log::info!(
                    "{}: fetching ahead what its image's last start read ({} ranges, {} bytes)",
                    blob.name().display(),
                    ranges.len(),
                    ranges.iter().map(|(s, e)| e - s).sum::<u64>()
                );
                blob.fetch_in_order(ranges);
                return;
            }
            Start::Recording {
                recorder,
                key,
                cache,
                blob,
            } => (recorder, key, cache, blob),
        };
        recorder.arm();
        let pending = Arc::new(Pending {
            recorder: recorder.clone(),
            key: key.clone(),
            cache: cache.clone(),
            name: blob.name().display().to_string(),
            kept: std::sync::atomic::AtomicBool::new(false),
        });
        crate::sync::lock(&PENDING).push(pending.clone());
        let spawned = std::thread::Builder::new()
            .name("pkgfs-start".into())
            .spawn(move || {
                if let Some(ends) = pending.recorder.ends() {
                    std::thread::sleep(ends.saturating_duration_since(std::time::Instant::now()));
                }
                pending.keep();
            });
        if let Err(e) = spawned {
            log::warn!("{}: its start not recorded: {e}", blob.name().display());
        }
    }
}

/// A start being recorded, kept when its window is over or when the process stops
/// ([`keep_starts`]), whichever comes first.
struct Pending {
    recorder: Arc<crate::io::starts::Recorder>,
    key: format::cache::CacheKey,
    cache: format::cache::IndexCache,
    name: String,
    kept: std::sync::atomic::AtomicBool,
}

/// The starts being recorded in this process.
static PENDING: std::sync::Mutex<Vec<Arc<Pending>>> = std::sync::Mutex::new(Vec::new());

impl Pending {
    /// Store what was recorded (once).
    fn keep(&self) {
        if self.kept.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        crate::sync::lock(&PENDING).retain(|p| !std::ptr::eq(&**p, self));
        let ranges = self.recorder.take();
        if ranges.is_empty() {
            return;
        }
        match self
            .cache
            .store(&self.key, &crate::io::starts::encode(&ranges))
        {
            Ok(()) => log::info!(
                "{}: its start recorded ({} ranges, {} bytes), to be fetched ahead of the next",
                self.name,
                ranges.len(),
                ranges.iter().map(|(s, e)| e - s).sum::<u64>()
            ),
            Err(e) => log::warn!("{}: its start not recorded: {e}", self.name),
        }
    }
}

/// The process stops: every start being recorded is kept as it is so far (a store
/// restarted right after a pull still has the record of the start that followed it).
pub fn keep_starts() {
    let pending: Vec<Arc<Pending>> = crate::sync::lock(&PENDING).clone();
    for p in pending {
        p.keep();
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
