//! From command-line sources to layers: finding archives, opening and indexing them in
//! parallel, and folding them into the merged tree.
//!
//! Layer order is the documented precedence rule: sources in command-line order; inside a
//! directory source, its archives in byte order of their file names. Archives are found
//! by content, not by extension; a directory's files that are not archives are ignored,
//! and hidden files (names starting with `.`, e.g. partial downloads) are never considered.
//! An archive that cannot be read is skipped with a warning naming it: one bad package
//! never takes down the mount.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, info, warn};

use crate::archive::seekable::IndexCache;
use crate::archive::{self, Archive, Indexed, OpenError};
use crate::error::{Error, Result};
use crate::fs::PkgFs;
use crate::tree::{Ownership, Tree, TreeBuilder};
use crate::view::Layer;

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
/// `kept_open` counts the archives left open so far (across calls): beyond the
/// descriptor budget, indexed archives are closed now and reopened when first read.
pub fn index_all(
    candidates: &[Candidate],
    threads: usize,
    cache: Option<&IndexCache>,
    kept_open: &AtomicUsize,
) -> Vec<std::result::Result<Indexed, OpenError>> {
    let results: Vec<Mutex<Option<std::result::Result<Indexed, OpenError>>>> =
        candidates.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
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

/// What identifies the file at a path: device, inode, size and modification time. A
/// package replaced by rename, or rewritten in place, has a different stamp.
pub type Stamp = (u64, u64, u64, (i64, i64));

fn stamp_of(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), (m.mtime(), m.mtime_nsec())))
}

fn archive_stamp(a: &Archive) -> Stamp {
    let (dev, ino) = a.file_id();
    (dev, ino, a.size, a.mtime_ns)
}

/// Archives indexed together before their entries are folded into the tree.
const INDEX_CHUNK: usize = 256;

/// An active package.
#[derive(Debug, Clone)]
struct Active {
    path: PathBuf,
    archive: Arc<Archive>,
}

/// The result of a scan of the sources: a tree ready to mount or to activate.
#[derive(Debug)]
pub struct Scan {
    /// The merged tree.
    pub tree: Tree,
    /// Its layers.
    pub layers: Vec<Layer>,
    /// Mounted, skipped and ignored files.
    pub report: LoadReport,
    /// Packages that became active since the previous scan.
    pub added: Vec<PathBuf>,
    /// Packages that are no longer active.
    pub removed: Vec<PathBuf>,
    /// Packages whose file was replaced by another version.
    pub replaced: Vec<PathBuf>,
}

/// The set of packages the sources provide, kept between scans so that a rescan only
/// indexes archives that are new or changed: an unchanged archive keeps its open file
/// (and so its inodes and cached blocks) and only its index is read again.
pub struct Packages {
    sources: Vec<PathBuf>,
    opts: LoadOptions,
    active: Vec<Active>,
    /// Files that failed, by stamp: warned about once, not retried until they change.
    bad: HashMap<PathBuf, (Option<Stamp>, Error)>,
    scanned: bool,
}

impl Packages {
    /// Packages of `sources`; nothing is read until [`Packages::scan`].
    pub fn new(sources: Vec<PathBuf>, opts: LoadOptions) -> Self {
        Packages {
            sources,
            opts,
            active: Vec::new(),
            bad: HashMap::new(),
            scanned: false,
        }
    }

    /// The directories among the sources (the ones a live mount watches).
    pub fn source_dirs(&self) -> Vec<PathBuf> {
        self.sources.iter().filter(|s| is_dir(s)).cloned().collect()
    }

    /// Find the archives of the sources, index what is new or changed, and build the
    /// merged tree. Files in `busy` (being written) are left out for now. Returns `None`
    /// when nothing changed since the last scan. Errors only if a source itself cannot
    /// be listed; bad archives are skipped, with a warning the first time.
    pub fn scan(&mut self, busy: &HashSet<PathBuf>) -> Result<Option<Scan>> {
        let first = !self.scanned;
        let candidates: Vec<Candidate> = discover(&self.sources)?
            .into_iter()
            .filter(|c| !busy.contains(&c.path))
            .collect();
        let stamps: Vec<Option<Stamp>> = candidates.iter().map(|c| stamp_of(&c.path)).collect();
        // Reuse what is unchanged; open the rest, in parallel, a chunk at a time (a
        // chunk's entries are folded into the tree and dropped before the next chunk is
        // read, so memory holds one chunk of raw entries, not all of them).
        let old: HashMap<&Path, &Active> =
            self.active.iter().map(|a| (a.path.as_path(), a)).collect();
        let mut reuse: Vec<Option<Arc<Archive>>> = Vec::with_capacity(candidates.len());
        let mut needs_open = Vec::with_capacity(candidates.len());
        for (c, st) in candidates.iter().zip(&stamps) {
            let kept = old
                .get(c.path.as_path())
                .filter(|a| Some(archive_stamp(&a.archive)) == *st)
                .map(|a| a.archive.clone());
            let known_bad = matches!(self.bad.get(&c.path), Some((s, _)) if s == st);
            needs_open.push(kept.is_none() && !known_bad);
            reuse.push(kept);
        }
        let mut opened: HashMap<PathBuf, std::result::Result<Indexed, OpenError>> = HashMap::new();
        let mut chunk_end = 0;
        // Archives kept open: those reused, and then new ones up to the budget.
        let kept_open = AtomicUsize::new(reuse.iter().flatten().filter(|a| a.is_open()).count());

        let mut report = LoadReport::default();
        let mut builder = TreeBuilder::new(self.opts.owner);
        let mut layers: Vec<Layer> = Vec::new();
        let mut active = Vec::new();
        let bad_before: HashSet<PathBuf> = self.bad.keys().cloned().collect();
        let mut still_bad = HashSet::new();
        for (i, ((cand, st), kept)) in candidates.iter().zip(&stamps).zip(reuse).enumerate() {
            if i >= chunk_end {
                chunk_end = (i + INDEX_CHUNK).min(candidates.len());
                let batch: Vec<Candidate> = (i..chunk_end)
                    .filter(|&j| needs_open[j])
                    .map(|j| candidates[j].clone())
                    .collect();
                opened = index_all(
                    &batch,
                    self.opts.threads,
                    self.opts.index_cache.as_ref(),
                    &kept_open,
                )
                .into_iter()
                .zip(&batch)
                .map(|(r, c)| (c.path.clone(), r))
                .collect();
            }
            let result = match kept {
                Some(archive) => match archive::reindex(&archive, self.opts.index_cache.as_ref()) {
                    Ok(entries) => Ok((archive, entries)),
                    Err(e) => Err(OpenError::Bad(e)),
                },
                None => match opened.remove(&cand.path) {
                    Some(r) => r.map(|Indexed { archive, entries }| (Arc::new(archive), entries)),
                    None => {
                        // Known bad and unchanged: skip quietly.
                        if let Some((_, e)) = self.bad.get(&cand.path) {
                            report.skipped.push((cand.path.clone(), e.clone()));
                        }
                        still_bad.insert(cand.path.clone());
                        continue;
                    }
                },
            };
            match result {
                Ok((archive, entries)) => {
                    debug!("{}: {} entries", cand.path.display(), entries.len());
                    builder.add_layer(layers.len() as u32, archive.mtime, &entries);
                    report.layers.push(cand.path.clone());
                    layers.push(Layer {
                        archive: archive.clone(),
                        entries: entries.len(),
                    });
                    active.push(Active {
                        path: cand.path.clone(),
                        archive,
                    });
                }
                Err(OpenError::NotAnArchive)
                    if !cand.explicit && !looks_like_archive(&cand.path) =>
                {
                    info!("{}: not an archive, ignored", cand.path.display());
                    report.ignored.push(cand.path.clone());
                }
                Err(e) => {
                    let e = match e {
                        OpenError::NotAnArchive => Error::Format(
                            "not a ZIP archive (no end of central directory record)".into(),
                        ),
                        OpenError::Bad(e) => e,
                    };
                    warn!("skipping {}: {e}", cand.path.display());
                    report.skipped.push((cand.path.clone(), e.clone()));
                    self.bad.insert(cand.path.clone(), (*st, e));
                    still_bad.insert(cand.path.clone());
                }
            }
        }
        for gone in bad_before.difference(&still_bad) {
            self.bad.remove(gone);
        }

        let key = |a: &Active| (a.path.clone(), a.archive.key);
        let unchanged = !first
            && active.len() == self.active.len()
            && active
                .iter()
                .zip(&self.active)
                .all(|(a, b)| key(a) == key(b));
        let mut added = Vec::new();
        let mut replaced = Vec::new();
        for a in &active {
            match self.active.iter().find(|o| o.path == a.path) {
                None => added.push(a.path.clone()),
                Some(o) if o.archive.key != a.archive.key => replaced.push(a.path.clone()),
                Some(_) => {}
            }
        }
        let removed = self
            .active
            .iter()
            .filter(|o| !active.iter().any(|a| a.path == o.path))
            .map(|o| o.path.clone())
            .collect();
        self.active = active;
        self.scanned = true;
        if unchanged {
            return Ok(None);
        }
        let tree = builder.finish();
        log_tree(&tree, &report.layers, first);
        Ok(Some(Scan {
            tree,
            layers,
            report,
            added,
            removed,
            replaced,
        }))
    }
}

fn log_tree(tree: &Tree, layers: &[PathBuf], first: bool) {
    for s in &tree.skipped {
        // Entries of unchanged packages were reported at mount.
        let level = if first {
            log::Level::Warn
        } else {
            log::Level::Debug
        };
        log::log!(
            level,
            "{}: skipping entry {:?}: {}",
            display_archive(layers, s.archive),
            String::from_utf8_lossy(&s.path),
            s.reason
        );
    }
    if !tree.conflicts.is_empty() && first {
        warn!(
            "{} path conflicts between or within packages (the later package wins; `pkgfs check` lists them)",
            tree.conflicts.len()
        );
    }
    for c in &tree.conflicts {
        debug!(
            "conflict at {:?}: {} wins over {} ({})",
            String::from_utf8_lossy(&c.path),
            display_archive(layers, c.winner),
            display_archive(layers, c.loser),
            c.reason
        );
    }
    info!(
        "{} archives, {} inodes, {} bytes of file data",
        layers.len(),
        tree.len(),
        tree.total_bytes
    );
}

/// Build a fixed filesystem from command-line sources, logging what was skipped.
pub fn load(sources: &[PathBuf], opts: &LoadOptions) -> Result<(PkgFs, LoadReport)> {
    let mut packages = Packages::new(sources.to_vec(), opts.clone());
    let scan = packages
        .scan(&HashSet::new())?
        .ok_or_else(|| Error::Format("first scan found nothing to do".into()))?;
    Ok((
        PkgFs::with_layers(scan.tree, scan.layers, opts.cache_bytes, false),
        scan.report,
    ))
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
