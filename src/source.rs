//! From command-line sources to layers: finding archives, opening and indexing them in
//! parallel, and folding them into the merged tree.
//!
//! Layer order is the documented precedence rule: sources in command-line order; inside a
//! directory source, its archives in byte order of their file names. Archives are found
//! by content, not by extension; a directory's files that are not archives are ignored,
//! and hidden files (names starting with `.`, e.g. partial downloads) are never considered.
//! An archive that cannot be read is skipped with a warning naming it: one bad package
//! never takes down the mount.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use log::{debug, info, warn};

use crate::archive::seekable::IndexCache;
use crate::archive::{self, Indexed, OpenError};
use crate::error::{Error, Result};
use crate::fs::PkgFs;
use crate::tree::{Ownership, TreeBuilder};

/// A file that may be an archive, with how it was named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its path.
    pub path: PathBuf,
    /// Named directly on the command line (a non-archive is then an error, not ignored).
    pub explicit: bool,
}

/// What happened to each candidate while loading.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Archives mounted, in layer order.
    pub layers: Vec<PathBuf>,
    /// Archives skipped, with the reason.
    pub skipped: Vec<(PathBuf, Error)>,
    /// Files in source directories that are not archives.
    pub ignored: Vec<PathBuf>,
}

/// Expand sources into candidate files in layer order.
pub fn discover(sources: &[PathBuf]) -> Result<Vec<Candidate>> {
    let mut out = Vec::new();
    for src in sources {
        let meta = std::fs::metadata(src).map_err(|e| Error::Io(e).with_path(src))?;
        if !meta.is_dir() {
            out.push(Candidate {
                path: src.clone(),
                explicit: true,
            });
            continue;
        }
        let mut names = Vec::new();
        for entry in std::fs::read_dir(src).map_err(|e| Error::Io(e).with_path(src))? {
            let entry = entry.map_err(|e| Error::Io(e).with_path(src))?;
            let name = entry.file_name();
            if name.as_encoded_bytes().first() == Some(&b'.') {
                continue;
            }
            // Follow symlinks: a directory of links to packages is a normal setup.
            let path = entry.path();
            if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                names.push(name);
            }
        }
        names.sort_unstable_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        out.extend(names.into_iter().map(|n| Candidate {
            path: src.join(n),
            explicit: false,
        }));
    }
    Ok(out)
}

/// Open and index every candidate using up to `threads` threads, keeping the order.
pub fn index_all(
    candidates: &[Candidate],
    threads: usize,
    cache: Option<&IndexCache>,
) -> Vec<std::result::Result<Indexed, OpenError>> {
    let results: Vec<Mutex<Option<std::result::Result<Indexed, OpenError>>>> =
        candidates.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    // Indexed archives stay open only up to the descriptor budget; the rest are closed
    // now and reopened when first read.
    let kept_open = AtomicUsize::new(0);
    let budget = archive::descriptor_budget();
    let workers = threads.clamp(1, candidates.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = candidates.get(i) else { break };
                    let r = archive::open(&c.path, cache);
                    if let Ok(idx) = &r
                        && kept_open.fetch_add(1, Ordering::Relaxed) >= budget
                    {
                        idx.archive.close();
                    }
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or(Err(OpenError::Bad(Error::Format("not indexed".into()))))
        })
        .collect()
}

/// Settings for [`load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads for parsing indexes.
    pub threads: usize,
    /// Ownership defaults and overrides.
    pub owner: Ownership,
    /// Block cache budget in bytes.
    pub cache_bytes: u64,
    /// Where to keep indexes of seekable archives that have none (None: no cache).
    pub index_cache: Option<IndexCache>,
}

/// Build the filesystem from command-line sources, logging what was skipped.
pub fn load(sources: &[PathBuf], opts: &LoadOptions) -> Result<(PkgFs, LoadReport)> {
    let candidates = discover(sources)?;
    let indexed = index_all(&candidates, opts.threads, opts.index_cache.as_ref());
    let mut report = LoadReport::default();
    let mut builder = TreeBuilder::new(opts.owner);
    let mut archives = Vec::new();
    for (cand, result) in candidates.iter().zip(indexed) {
        match result {
            Ok(Indexed { archive, entries }) => {
                debug!("{}: {} entries", cand.path.display(), entries.len());
                builder.add_layer(archives.len() as u32, archive.mtime, &entries);
                report.layers.push(cand.path.clone());
                archives.push(archive);
            }
            Err(OpenError::NotAnArchive) if !cand.explicit && !looks_like_archive(&cand.path) => {
                info!("{}: not an archive, ignored", cand.path.display());
                report.ignored.push(cand.path.clone());
            }
            Err(OpenError::NotAnArchive) => {
                let e =
                    Error::Format("not a ZIP archive (no end of central directory record)".into());
                warn!("skipping {}: {e}", cand.path.display());
                report.skipped.push((cand.path.clone(), e));
            }
            Err(OpenError::Bad(e)) => {
                warn!("skipping {}: {e}", cand.path.display());
                report.skipped.push((cand.path.clone(), e));
            }
        }
    }
    let tree = builder.finish();
    for s in &tree.skipped {
        warn!(
            "{}: skipping entry {:?}: {}",
            display_archive(&report.layers, s.archive),
            String::from_utf8_lossy(&s.path),
            s.reason
        );
    }
    if !tree.conflicts.is_empty() {
        warn!(
            "{} path conflicts between or within packages (the later package wins; `pkgfs check` lists them)",
            tree.conflicts.len()
        );
        for c in &tree.conflicts {
            debug!(
                "conflict at {:?}: {} wins over {} ({})",
                String::from_utf8_lossy(&c.path),
                display_archive(&report.layers, c.winner),
                display_archive(&report.layers, c.loser),
                c.reason
            );
        }
    }
    info!(
        "{} archives, {} inodes, {} bytes of file data",
        archives.len(),
        tree.len(),
        tree.total_bytes
    );
    Ok((PkgFs::new(tree, archives, opts.cache_bytes), report))
}

/// Extensions of ZIP-based package formats. A file in a source directory with one of
/// these names, or starting with a ZIP signature, that cannot be read is *skipped with a
/// warning* (it is a broken package); any other non-archive is ignored quietly.
const ARCHIVE_EXTENSIONS: &[&str] = &[
    "zip", "jar", "war", "ear", "aar", "whl", "egg", "apk", "xpi", "nupkg", "vsix", "ipa", "pkg",
];

fn looks_like_archive(path: &Path) -> bool {
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

/// The display name of archive number `idx` among `layers`.
pub fn display_archive(layers: &[PathBuf], idx: u32) -> String {
    layers
        .get(idx as usize)
        .map_or_else(|| format!("archive #{idx}"), |p| p.display().to_string())
}

/// Whether `path` exists and is a directory (for argument checks).
pub fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}
