//! What a scan tells: the [`LoadReport`] of what was mounted, skipped and ignored, the
//! warnings for a candidate that could not be opened ([`failed`]), and the log lines of
//! a scan ([`log_tree`]) and of a graft indexed on first use ([`log_graft`]).
//!
//! One home for the words a scan uses about itself, so that the driver, the fold and the
//! lazy grafts report alike.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use log::{debug, info, warn};

use crate::error::Error;
use crate::format::OpenError;
use crate::tree::Tree;

use super::candidate::{Candidate, Stamp};
use super::image;

/// Files that failed, by path, with the stamp they had and why: warned about once, not
/// retried until they change.
pub(super) type Bad = HashMap<PathBuf, (Option<Stamp>, Error)>;

/// What happened to each candidate while loading.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Archives mounted, in layer order.
    pub layers: Vec<PathBuf>,
    /// Archives skipped, with the reason.
    pub skipped: Vec<(PathBuf, Error)>,
    /// Files in source directories that are not archives.
    pub ignored: Vec<PathBuf>,
    /// The images among the sources, resolved (their layers are in `layers`).
    pub images: Vec<image::Image>,
    /// The tree was loaded as an earlier mount kept it (`source::kept`), not folded.
    pub kept: bool,
}

/// A candidate that could not be opened: skipped with a warning and remembered
/// (until it changes), or, for an image's layer, the error that refuses the image.
pub(super) fn failed(
    bad: &mut Bad,
    cand: &Candidate,
    st: &Option<Stamp>,
    e: OpenError,
    report: &mut LoadReport,
) -> Option<Error> {
    let e = match e {
        OpenError::NotAnArchive => Error::Format(
            "not an archive pkgfs reads (ZIP, tar, tar.gz, tar.zst, seekable zstd, zstd:chunked, eStargz)".into(),
        ),
        OpenError::Bad(e) => e,
    };
    if cand.layer.is_some() {
        // An image without one of its layers is another image: it is refused whole.
        return Some(e.with_path(&cand.path));
    }
    warn!("skipping {}: {e}", cand.path.display());
    report.skipped.push((cand.path.clone(), e.clone()));
    // A remote object that could not be fetched (the network, not its bytes) is
    // tried again at the next poll.
    if !(cand.blob.is_some() && matches!(e, Error::Io(_))) {
        bad.insert(cand.path.clone(), (st.clone(), e));
    }
    None
}

/// What indexing a graft's package made: its skipped entries, and how long it took.
pub(super) fn log_graft(path: &Path, tree: &Tree, entries: usize, started: std::time::Instant) {
    for s in &tree.skipped {
        warn!(
            "{}: skipping entry {:?}: {}",
            path.display(),
            String::from_utf8_lossy(&s.path),
            s.reason
        );
    }
    info!(
        "{}: indexed on first use, {entries} entries in {:.3} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}

/// What a scan made: entries skipped (warned of at mount only), conflicts, and the
/// size of the tree.
pub(super) fn log_tree(
    tree: &Tree,
    layers: &[PathBuf],
    first: bool,
    kept: bool,
    took: std::time::Duration,
) {
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
    let how = if kept {
        "tree kept from an earlier mount, loaded"
    } else {
        "indexed and merged"
    };
    info!(
        "{} archives, {} inodes, {} bytes of file data ({how} in {:.3} s)",
        layers.len(),
        tree.len(),
        tree.total_bytes,
        took.as_secs_f64()
    );
}

/// The display name of archive number `idx` among `layers`.
pub fn display_archive(layers: &[PathBuf], idx: u32) -> String {
    layers
        .get(idx as usize)
        .map_or_else(|| format!("archive #{idx}"), |p| p.display().to_string())
}
