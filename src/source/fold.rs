//! Folding a scan's packages into the merged tree: [`Fold`] is the tree being built and
//! what it is built from (layers, grafts, the report, the packages active);
//! [`Placing`] has the layout place each indexed archive, in layer order, and folds it
//! in, or records why not (deferred to the background, ignored, skipped); [`Changes`] is
//! what a scan changed since the last one.
//!
//! Kept apart from the scan's driver (`source/mod.rs`) so that the driver reads as its
//! stages, and what happens to one archive is in one place.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{debug, info, warn};

use crate::error::Error;
use crate::format::{Archive, Entry, IndexCache, OpenContext, OpenError};
use crate::layout::{Facts, Inspect, Layout, Placement};
use crate::tree::view::{Graft, Layer};
use crate::tree::{Ownership, Place, Tree, TreeBuilder};

use super::candidate::{Candidate, Stamp, looks_like_archive};
use super::image;
use super::index::{Deferred, Opened};
use super::report::{Bad, LoadReport, failed};

/// What an active package is: an open archive, or a graft (a directory of its own,
/// indexed on first use).
#[derive(Debug, Clone)]
pub(super) enum Provided {
    Archive(Arc<Archive>),
    Graft(Arc<Graft>),
}

impl Provided {
    /// Whether two are the same version of a package (the same open archive or graft).
    pub(super) fn same(&self, other: &Provided) -> bool {
        match (self, other) {
            (Provided::Archive(a), Provided::Archive(b)) => a.key == b.key,
            (Provided::Graft(a), Provided::Graft(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// An active package.
#[derive(Debug, Clone)]
pub(super) struct Active {
    pub(super) path: PathBuf,
    pub(super) provided: Provided,
}

impl Active {
    pub(super) fn archive(&self) -> Option<&Arc<Archive>> {
        match &self.provided {
            Provided::Archive(a) => Some(a),
            Provided::Graft(_) => None,
        }
    }
}

/// The tree being built by a scan, and what it is built from.
pub(super) struct Fold {
    pub(super) builder: TreeBuilder,
    pub(super) layers: Vec<Layer>,
    pub(super) grafts: Vec<Arc<Graft>>,
    pub(super) report: LoadReport,
    pub(super) active: Vec<Active>,
    /// How many entries each archive's index held before the layout placed them, by
    /// archive key (what a kept tree checks an archive's index against: `kept`).
    pub(super) indexed: HashMap<u32, usize>,
}

impl Fold {
    /// An empty tree owned as `owner` says; `.wh.` entries are whiteouts if `whiteouts`
    /// or if there are `images`.
    pub(super) fn new(owner: Ownership, whiteouts: bool, images: Vec<image::Image>) -> Self {
        let whiteouts = whiteouts || !images.is_empty();
        Fold {
            builder: TreeBuilder::new(owner).with_whiteouts(whiteouts),
            layers: Vec::new(),
            grafts: Vec::new(),
            report: LoadReport {
                images,
                ..LoadReport::default()
            },
            active: Vec::new(),
            indexed: HashMap::new(),
        }
    }

    /// Fold an archive's entries in at each of `places` (one layer).
    fn archive(&mut self, path: &Path, archive: Arc<Archive>, entries: &[Entry], places: &[Place]) {
        let idx = self.layers.len() as u32;
        for place in places {
            self.builder
                .add_layer_at(idx, archive.mtime(), entries, place);
        }
        self.report.layers.push(path.to_path_buf());
        self.layers.push(Layer {
            archive: archive.clone(),
            entries: entries.len(),
            places: places
                .iter()
                .filter(|p| !p.prefix.is_empty())
                .map(|p| p.prefix.join(&b'/'))
                .collect(),
        });
        self.active.push(Active {
            path: path.to_path_buf(),
            provided: Provided::Archive(archive),
        });
    }

    /// A graft at `dir`; `false` (and nothing added) if the path is taken.
    pub(super) fn graft(
        &mut self,
        path: &Path,
        dir: &[Vec<u8>],
        graft: Arc<Graft>,
        mtime: i64,
    ) -> bool {
        let comps: Vec<&[u8]> = dir.iter().map(Vec::as_slice).collect();
        if !self
            .builder
            .add_graft(&comps, self.grafts.len() as u32, u32::MAX, mtime)
        {
            return false;
        }
        self.grafts.push(graft.clone());
        self.active.push(Active {
            path: path.to_path_buf(),
            provided: Provided::Graft(graft),
        });
        true
    }

    /// The layout's own entries (npm's `.bin` links), at the root.
    pub(super) fn own(&mut self, kind: crate::layout::Kind, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let idx = self.layers.len() as u32;
        self.builder.add_layer(idx, 0, &entries);
        let n = entries.len();
        self.report
            .layers
            .push(PathBuf::from(format!("(layout {})", kind.name())));
        self.layers.push(Layer {
            archive: crate::layout::own_archive(kind.name(), entries),
            entries: n,
            places: Vec::new(),
        });
    }

    /// Leave out the package at `path`, warned about and reported.
    pub(super) fn refuse(&mut self, path: &Path, why: &str) {
        warn!("skipping {}: {why}", path.display());
        self.report
            .skipped
            .push((path.to_path_buf(), Error::Format(why.to_string())));
    }
}

/// What changed since the previous scan.
pub(super) struct Changes {
    /// Nothing: the same packages, in the same order, at the same versions.
    pub(super) unchanged: bool,
    pub(super) added: Vec<PathBuf>,
    pub(super) removed: Vec<PathBuf>,
    pub(super) replaced: Vec<PathBuf>,
}

impl Changes {
    /// What changed from the packages active `before` to those active `after`, by path
    /// (through hash maps: ten thousand packages make pairwise scans slow); a `first`
    /// scan is never unchanged.
    pub(super) fn between(before: &[Active], after: &[Active], first: bool) -> Changes {
        let unchanged = !first
            && after.len() == before.len()
            && after
                .iter()
                .zip(before)
                .all(|(a, b)| a.path == b.path && a.provided.same(&b.provided));
        let was: HashMap<&Path, &Provided> = before
            .iter()
            .map(|o| (o.path.as_path(), &o.provided))
            .collect();
        let mut added = Vec::new();
        let mut replaced = Vec::new();
        for a in after {
            match was.get(a.path.as_path()) {
                None => added.push(a.path.clone()),
                Some(p) if !p.same(&a.provided) => replaced.push(a.path.clone()),
                Some(_) => {}
            }
        }
        let now: HashSet<&Path> = after.iter().map(|a| a.path.as_path()).collect();
        let removed = before
            .iter()
            .filter(|o| !now.contains(o.path.as_path()))
            .map(|o| o.path.clone())
            .collect();
        Changes {
            unchanged,
            added,
            removed,
            replaced,
        }
    }
}

/// The placing of indexed archives, one after another in layer order: the layout says
/// where each goes and the fold takes it in; what went wrong is remembered.
pub(super) struct Placing<'a> {
    layout: &'a mut dyn Layout,
    inspector: &'a dyn Inspect,
    fold: &'a mut Fold,
    /// Files known bad (the scan's record, kept across scans): added to, and pruned of
    /// files no longer bad by [`Placing::finish`].
    bad: &'a mut Bad,
    /// The last scan's archives by path: a deferred one stays until the new one is
    /// ready.
    old: HashMap<PathBuf, Arc<Archive>>,
    index_cache: Option<&'a IndexCache>,
    /// What the layout learnt of each archive placed, by archive key.
    learnt: HashMap<u32, Facts>,
    /// Archives whose index needs a long pass (for the background indexer), with their
    /// stamps.
    deferred: Deferred,
    /// Files of `bad` still bad in this scan.
    still_bad: HashSet<PathBuf>,
}

impl<'a> Placing<'a> {
    /// Placing into `fold` by `layout` (whose `inspector` learns the facts of an archive
    /// placed again), with `old` the last scan's archives by path.
    pub(super) fn new(
        layout: &'a mut dyn Layout,
        inspector: &'a dyn Inspect,
        fold: &'a mut Fold,
        bad: &'a mut Bad,
        old: HashMap<PathBuf, Arc<Archive>>,
        index_cache: Option<&'a IndexCache>,
    ) -> Self {
        Placing {
            layout,
            inspector,
            fold,
            bad,
            old,
            index_cache,
            learnt: HashMap::new(),
            deferred: Vec::new(),
            still_bad: HashSet::new(),
        }
    }

    /// A candidate known bad and unchanged: skipped quietly (reported, not warned of).
    pub(super) fn known_bad(&mut self, cand: &Candidate) {
        if let Some((_, e)) = self.bad.get(&cand.path) {
            self.fold
                .report
                .skipped
                .push((cand.path.clone(), e.clone()));
        }
        self.still_bad.insert(cand.path.clone());
    }

    /// What indexing `cand` (stamped `st`) gave: placed and folded in, deferred,
    /// ignored or skipped. An error refuses the whole scan (an image without one of its
    /// layers).
    pub(super) fn take(
        &mut self,
        cand: &Candidate,
        st: &Option<Stamp>,
        result: Opened,
    ) -> Option<Error> {
        match result {
            Ok((archive, mut entries, facts)) => {
                debug!("{}: {} entries", cand.path.display(), entries.len());
                self.fold.indexed.insert(archive.key, entries.len());
                self.place(&cand.path, archive.clone(), &mut entries, &facts);
                self.learnt.insert(archive.key, facts);
            }
            Err(OpenError::Bad(Error::Deferred)) => {
                self.deferred.push((cand.clone(), st.clone()));
                // The version this path had stays until the new one is ready.
                if let Some(a) = self.old.get(&cand.path).cloned() {
                    self.place_again(&cand.path, &a);
                }
            }
            Err(OpenError::NotAnArchive) if !cand.explicit && !looks_like_archive(&cand.path) => {
                info!("{}: not an archive, ignored", cand.path.display());
                self.fold.report.ignored.push(cand.path.clone());
            }
            Err(e) => {
                if let Some(e) = failed(self.bad, cand, st, e, &mut self.fold.report) {
                    return Some(e);
                }
                self.still_bad.insert(cand.path.clone());
            }
        }
        None
    }

    /// Done: files no longer bad are forgotten; what the layout learnt, and the
    /// archives deferred.
    pub(super) fn finish(self) -> (HashMap<u32, Facts>, Deferred) {
        let still_bad = self.still_bad;
        self.bad.retain(|p, _| still_bad.contains(p));
        (self.learnt, self.deferred)
    }

    /// Have the layout place an indexed archive and fold it in where it says.
    fn place(
        &mut self,
        path: &Path,
        archive: Arc<Archive>,
        entries: &mut Vec<Entry>,
        facts: &Facts,
    ) {
        match self.layout.place(path, entries, facts) {
            Placement::Fold(places) => self.fold.archive(path, archive, entries, &places),
            Placement::Own { .. } => self
                .fold
                .refuse(path, "this layout places packages by name"),
            Placement::Refused(why) => self.fold.refuse(path, &why),
            Placement::Unused(why) => info!("{}: {why}", path.display()),
        }
    }

    /// Place an archive of the last scan again (its index read again), as it was.
    fn place_again(&mut self, path: &Path, archive: &Arc<Archive>) {
        let cx = OpenContext {
            index_cache: self.index_cache,
            ..OpenContext::default()
        };
        if let Ok(mut entries) = archive.entries(&cx)
            && let Ok(facts) = self.inspector.inspect(archive, &entries)
        {
            self.place(path, archive.clone(), &mut entries, &facts);
        }
    }
}

/// One layer of an image replacing or whiting out what a lower one has is how the image
/// is made, not a conflict between packages.
pub(super) fn drop_conflicts_within_images(tree: &mut Tree, report: &LoadReport) {
    let image_of: HashMap<&Path, usize> = report
        .images
        .iter()
        .enumerate()
        .flat_map(|(i, img)| img.layers.iter().map(move |l| (l.name.as_path(), i)))
        .collect();
    if image_of.is_empty() {
        return;
    }
    let image_at = |layer: u32| {
        report
            .layers
            .get(layer as usize)
            .and_then(|p| image_of.get(p.as_path()))
    };
    tree.conflicts
        .retain(|c| image_at(c.winner).is_none() || image_at(c.winner) != image_at(c.loser));
}
