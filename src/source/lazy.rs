//! Packages indexed on first use: a layout that places packages by name gives each a
//! directory of its own, a [`Graft`](crate::tree::view::Graft) whose source is a [`LazyPackage`], opened and
//! indexed the first time the directory is looked into. `pkgfs store` makes its layers'
//! `diff` directories the same way, on the same [`LazyContext`].
//!
//! Kept apart from the scan: nothing here runs while the sources are scanned, only
//! when the mount is used.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Entry, IndexCache, Indexed, OpenContext, OpenError};
use crate::tree::view::{GraftSource, Layer};
use crate::tree::{Ownership, Place, Tree, TreeBuilder};

use super::candidate::{Candidate, Stamp};
use super::report::log_graft;

/// What every lazily indexed package of a scan shares.
#[derive(Debug)]
pub(super) struct LazyContext {
    /// Ownership defaults and overrides of the package's entries.
    pub(super) owner: Ownership,
    /// Where to keep indexes that cost a pass (None: no cache).
    pub(super) index_cache: Option<IndexCache>,
}

/// A package a layout placed by name: opened and indexed when its directory is first
/// looked into ([`Graft`](crate::tree::view::Graft)).
#[derive(Debug)]
pub(super) struct LazyPackage {
    /// The package.
    pub(super) cand: Candidate,
    /// Its stamp when it was placed.
    pub(super) version: Stamp,
    /// Where in its directory the archive's entries go.
    pub(super) inner: Place,
    /// The layout's entries added to the directory (cargo's `.cargo-ok`).
    pub(super) extra: Vec<Entry>,
    /// What every package of the scan shares.
    pub(super) cx: Arc<LazyContext>,
}

impl GraftSource for LazyPackage {
    fn name(&self) -> &Path {
        &self.cand.path
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn index(&self) -> Result<(Tree, Vec<Layer>)> {
        let started = std::time::Instant::now();
        let Indexed { archive, entries } = self.cx.open(&self.cand)?;
        let mtime = archive.mtime();
        let mut b = TreeBuilder::new(self.cx.owner);
        b.add_layer_at(0, mtime, &entries, &self.inner);
        let mut layers = vec![Layer {
            archive: Arc::new(archive),
            entries: entries.len(),
            places: Vec::new(),
        }];
        if !self.extra.is_empty() {
            let extra: Vec<Entry> = self
                .extra
                .iter()
                .cloned()
                .map(|e| Entry { mtime, ..e })
                .collect();
            b.add_layer(1, mtime, &extra);
            layers.push(Layer {
                entries: extra.len(),
                archive: crate::layout::own_archive("extra", extra),
                places: Vec::new(),
            });
        }
        let tree = b.finish();
        log_graft(&self.cand.path, &tree, entries.len(), started);
        Ok((tree, layers))
    }
}

impl LazyContext {
    /// Open and index `cand` for a graft.
    pub(super) fn open(&self, cand: &Candidate) -> Result<Indexed> {
        let cx = OpenContext {
            index_cache: self.index_cache.as_ref(),
            ..OpenContext::default()
        };
        cand.open(&cx).map_err(|e| match e {
            OpenError::NotAnArchive => Error::Format("not an archive pkgfs reads".into()),
            OpenError::Bad(e) => e,
        })
    }
}
