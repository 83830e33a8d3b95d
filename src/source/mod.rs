//! From command-line sources to layers: the scan's driver. [`Packages`] keeps what the
//! sources provide between scans, and a scan runs the stages in order: discovery
//! (`discover`: sources into candidates, `verify`: sealed sources checked on the way),
//! indexing (`index`: on all cores, handed out in layer order), placing and folding into
//! the tree (`fold`, or `lazy` for layouts that place packages by name), and the report
//! (`report`). [`load`] is one scan, for a fixed mount and the offline tools.
//!
//! The other modules: `candidate` (a file that may be an archive), `image` (container
//! images as sources), `remote` (S3 and HTTP stores), `store` (`pkgfs store`), `watch`
//! (inotify and polling), `live` (rescans activated on a live mount).
//!
//! Layer order is the documented precedence rule: sources in command-line order; inside a
//! directory source, its archives in byte order of their file names. Archives are found
//! by content, not by extension; a directory's files that are not archives are ignored,
//! and hidden files (names starting with `.`, e.g. partial downloads) are never considered.
//! An archive that cannot be read is skipped with a warning naming it: one bad package
//! never takes down the mount.

mod candidate;
pub mod chores;
mod discover;
mod fold;
pub mod image;
mod index;
mod kept;
mod lazy;
pub mod live;
pub mod remote;
mod report;
mod start;
pub mod store;
pub mod verify;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use log::{info, warn};

use crate::error::{Error, Result};
use crate::format::{Archive, IndexCache, IndexProgress, OpenContext, OpenError};
use crate::fs::PkgFs;
use crate::layout::{Layout, Placement};
use crate::tree::view::{Graft, Layer};
use crate::tree::{Ownership, Tree};

pub use candidate::{Candidate, Stamp};
pub use discover::{Listing, Verifying, discover};
pub use index::BACKGROUND_OVER;
pub use report::{LoadReport, display_archive};
pub use start::keep_starts;

use candidate::{archive_stamp, stat_all};
use fold::{Active, Changes, Fold, Placing, drop_conflicts_within_images};
use index::{
    Background, INDEX_WINDOW, IndexStream, Indexing, Job, REMOTE_INDEX_THREADS, StreamState,
    index_job,
};
use lazy::{LazyContext, LazyPackage};
use report::Bad;
use report::log_tree;

/// Settings for [`load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads for parsing indexes.
    pub threads: usize,
    /// Ownership defaults and overrides.
    pub owner: Ownership,
    /// Block cache budget in bytes.
    pub cache_bytes: u64,
    /// Where to keep indexes that cost a pass over an archive (None: no cache).
    pub index_cache: Option<IndexCache>,
    /// Treat `.wh.` entries as OCI whiteouts (always when an image is among the
    /// sources; see [`TreeBuilder::with_whiteouts`](crate::tree::TreeBuilder::with_whiteouts)).
    pub whiteouts: bool,
    /// Which platform's image to take from a multi-platform image (None: this machine's).
    pub platform: Option<image::Platform>,
    /// Timeouts and retries of remote sources.
    pub remote: crate::io::remote::RemoteConfig,
    /// Credentials, certificates and TLS of registries (`docker://` sources).
    pub registry: crate::io::registry::RegistryConfig,
    /// Who hears about passes over archives while the first scan indexes them.
    pub progress: Option<Progress>,
    /// Where each package goes.
    pub layout: crate::layout::Config,
    /// `--verify`: sources mount only under a seal by an allowed signer.
    pub verify: Option<verify::VerifyConfig>,
    /// Keep the first scan's tree in the index cache and load it whole when nothing
    /// changed ([`kept`]; `--no-kept-tree` turns it off).
    pub keep_tree: bool,
}

/// How layers merge and where packages go: the options `mount` and the offline tools
/// (`ls`, `cat`, `check`) share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merge {
    /// Treat `.wh.` entries as OCI whiteouts.
    pub whiteouts: bool,
    /// The platform to take from a multi-platform image.
    pub platform: Option<image::Platform>,
    /// Where each package goes.
    pub layout: crate::layout::Config,
    /// How registries are reached (`docker://` sources).
    pub registry: crate::io::registry::RegistryConfig,
    /// `--verify`: only what a seal lists, every byte checked.
    pub verify: Option<verify::VerifyConfig>,
}

impl Merge {
    /// The options a load of sources takes under these merge settings; the rest (threads,
    /// owner, caches, remote settings) is the caller's.
    pub fn load_options(
        &self,
        threads: usize,
        owner: Ownership,
        cache_bytes: u64,
        index_cache: Option<PathBuf>,
        remote: crate::io::remote::RemoteConfig,
    ) -> LoadOptions {
        LoadOptions {
            threads,
            owner,
            cache_bytes,
            index_cache: index_cache.map(crate::format::IndexCache::new),
            whiteouts: self.whiteouts,
            platform: self.platform.clone(),
            remote,
            progress: Some(Progress(Arc::new(crate::progress::IndexBars::default()))),
            layout: self.layout.clone(),
            verify: self.verify.clone(),
            registry: self.registry.clone(),
            // A mount turns it on (the offline tools read every index anyway).
            keep_tree: false,
        }
    }
}

/// A shared [`IndexProgress`].
#[derive(Clone)]
pub struct Progress(pub Arc<dyn IndexProgress + Send>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// What a scan does with one candidate.
enum Plan {
    /// Unchanged since the last scan: its index is read again.
    Reindex(Arc<Archive>),
    /// Indexed in the background since the last scan (the result is in `ready_for`).
    Ready,
    /// Being indexed in the background: the archive this path had before, if any,
    /// stays (its index read again).
    Pending(Option<Arc<Archive>>),
    /// Failed before and unchanged: skipped quietly.
    KnownBad,
    /// New or changed: opened and indexed.
    Open,
}

/// The result of a scan of the sources: a tree ready to mount or to activate.
#[derive(Debug)]
pub struct Scan {
    /// The merged tree.
    pub tree: Tree,
    /// Its layers.
    pub layers: Vec<Layer>,
    /// Packages in directories of their own, indexed on first use (`Tree::graft`
    /// numbers index this).
    pub grafts: Vec<Arc<Graft>>,
    /// Mounted, skipped and ignored files.
    pub report: LoadReport,
    /// Packages that became active since the previous scan.
    pub added: Vec<PathBuf>,
    /// Packages that are no longer active.
    pub removed: Vec<PathBuf>,
    /// Packages whose file was replaced by another version.
    pub replaced: Vec<PathBuf>,
    /// The tree's numbering digest, when the scan computed it already (a kept tree's,
    /// or one just kept): `fs::numbering_digest` need not compute it again.
    pub numbering: Option<String>,
}

/// The set of packages the sources provide, kept between scans so that a rescan only
/// indexes archives that are new or changed: an unchanged archive keeps its open file
/// (and so its inodes and cached blocks) and only its index is read again.
pub struct Packages {
    sources: Vec<PathBuf>,
    opts: LoadOptions,
    active: Vec<Active>,
    /// Files that failed, by stamp: warned about once, not retried until they change.
    bad: Bad,
    scanned: bool,
    /// The background indexer of a live mount.
    background: Option<Background>,
    /// The runtime of remote sources, made when the first one is listed.
    remote: std::sync::OnceLock<Arc<crate::io::remote::Remote>>,
    /// The registry clients (made on first use: a source is `docker://`).
    registries: std::sync::OnceLock<Arc<crate::io::registry::Registries>>,
    /// The last listing of each remote source: kept when listing it again fails.
    listed: HashMap<PathBuf, Listing>,
    /// The grafts of the last scan, by path: kept while their package is unchanged.
    grafts: HashMap<PathBuf, Arc<Graft>>,
    /// What the layout learnt of each archive of the last scan, by archive key.
    facts: HashMap<u32, crate::layout::Facts>,
    /// The seals of the last listing (`--verify`), shared with the status.
    sealed: Arc<verify::Seals>,
    /// The files the last scan skipped, with why: kept when nothing active changed
    /// (a refused archive added changes nothing active, but status must name it).
    skipped: Vec<(PathBuf, String)>,
    /// Remote sources that are one version of one object, given, not listed
    /// ([`load_object`]).
    pinned: HashMap<PathBuf, crate::io::remote::ObjectVersion>,
    /// What the layouts of the scans so far asked to have done once the mount serves
    /// ([`crate::layout::Chore`]), not yet taken.
    chores: Vec<Box<dyn crate::layout::Chore>>,
}

/// What the sources hold now (the first stage of a scan).
struct Listed {
    candidates: Vec<Candidate>,
    stamps: Vec<Option<Stamp>>,
    /// Modification times (0 for a candidate gone since it was listed).
    mtimes: Vec<i64>,
    images: Vec<image::Image>,
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
            background: None,
            remote: std::sync::OnceLock::new(),
            registries: std::sync::OnceLock::new(),
            listed: HashMap::new(),
            grafts: HashMap::new(),
            facts: HashMap::new(),
            sealed: Arc::default(),
            skipped: Vec::new(),
            pinned: HashMap::new(),
            chores: Vec::new(),
        }
    }

    /// The work the layout asked for in the scans so far (python's bytecode), to run
    /// once the mount serves (`chores::Chores`).
    pub fn take_chores(&mut self) -> Vec<Box<dyn crate::layout::Chore>> {
        std::mem::take(&mut self.chores)
    }

    /// The seals of the sources (`--verify`), as the last listing accepted them.
    pub fn seals(&self) -> Arc<verify::Seals> {
        self.sealed.clone()
    }

    /// The runtime of remote sources, if one was made (a source is remote).
    pub fn remote_made(&self) -> Option<Arc<crate::io::remote::Remote>> {
        self.remote.get().cloned()
    }

    /// The runtime of remote sources (made on first use).
    pub fn remote(&self) -> Result<Arc<crate::io::remote::Remote>> {
        if let Some(r) = self.remote.get() {
            return Ok(r.clone());
        }
        let r = crate::io::remote::Remote::new(self.opts.remote.clone())?;
        Ok(self.remote.get_or_init(|| r).clone())
    }

    /// The registry clients (made on first use, on the remote sources' runtime).
    pub fn registries(&self) -> Result<Arc<crate::io::registry::Registries>> {
        if let Some(r) = self.registries.get() {
            return Ok(r.clone());
        }
        let r = Arc::new(crate::io::registry::Registries::new(
            self.remote()?,
            self.opts.registry.clone(),
        ));
        Ok(self.registries.get_or_init(|| r).clone())
    }

    /// From now on, rescans leave archives that need a long pass to a background thread
    /// (`pkgfs-index`), which wakes `waker` each time one is ready; until then a path
    /// keeps the version it had, if any.
    pub fn index_in_background(&mut self, waker: watch::Waker) -> Result<()> {
        self.background = Some(Background::start(self.opts.index_cache.clone(), waker)?);
        Ok(())
    }

    /// Archives being indexed in the background, not active yet.
    pub fn pending(&self) -> Vec<PathBuf> {
        self.background
            .as_ref()
            .map(Background::pending)
            .unwrap_or_default()
    }

    /// The directories among the sources (the ones a live mount watches).
    pub fn source_dirs(&self) -> Vec<PathBuf> {
        self.sources.iter().filter(|s| is_dir(s)).cloned().collect()
    }

    /// The files the last scan skipped, with why (as `status` shows them).
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    /// Find the archives of the sources, index what is new or changed, and build the
    /// tree. Files in `busy` (being written) are left out for now. Returns `None` when
    /// nothing changed since the last scan. Errors only if a source itself cannot be
    /// listed, or the layout refuses the whole set (a lockfile's package missing); bad
    /// archives are skipped, with a warning the first time.
    ///
    /// The stages, in order: [`Packages::list`] what the sources hold; the layout places
    /// packages by name ([`Packages::place_by_name`], each a graft indexed on first use),
    /// or [`Packages::plan`] what to index and [`Packages::index_and_place`] (indexing on
    /// worker threads while this thread places and folds, in layer order); the layout's
    /// own entries; [`Packages::settle`] what changed.
    pub fn scan(&mut self, busy: &HashSet<PathBuf>) -> Result<Option<Scan>> {
        let first = !self.scanned;
        let started = std::time::Instant::now();
        let mut layout = self.opts.layout.kind.start(&self.opts.layout)?;
        // A record of an earlier mount's tree, read while the sources are listed.
        let early = if first && self.opts.keep_tree {
            kept::Keeping::start(&self.opts, &self.sources, layout.by_name())
        } else {
            None
        };
        let mut listed = self.list(busy, first, &*layout)?;
        if layout.by_name() && !listed.images.is_empty() {
            return Err(Error::Unsupported(format!(
                "--layout {} gives each archive a directory: container images take --layout merge",
                self.opts.layout.kind.name()
            )));
        }
        let mut keeping = early.and_then(|e| kept::Keeping::of(e, &self.opts, &listed));
        if let Some(k) = keeping.as_mut().and_then(|k| k.load(&listed, &self.opts)) {
            return Ok(Some(self.kept(k, first, started)));
        }
        let images = std::mem::take(&mut listed.images);
        let names: Vec<&[u8]> = listed
            .candidates
            .iter()
            .map(|c| crate::layout::file_name(&c.path))
            .collect();
        layout.listed(&names);
        let mut fold = Fold::new(self.opts.owner, self.opts.whiteouts, images);
        if layout.by_name() {
            self.place_by_name(&listed, &mut *layout, &mut fold);
        } else {
            let (plan, ready) = self.plan(&listed.candidates, &listed.stamps);
            self.index_and_place(&listed, plan, ready, &mut *layout, &mut fold, first)?;
        }
        fold.own(self.opts.layout.kind, layout.finish()?);
        let chore = layout.chore();
        // A scan that left work behind (bytecode to compile) is not kept: what that work
        // makes changes the next mount's packages anyway.
        let keeping = keeping.filter(|_| chore.is_none());
        self.chores.extend(chore);
        let Fold {
            builder,
            layers,
            grafts,
            report,
            active,
            indexed,
        } = fold;
        let changes = self.settle(active, first);
        self.skipped = report
            .skipped
            .iter()
            .map(|(p, e)| (p.clone(), e.to_string()))
            .collect();
        if changes.unchanged {
            return Ok(None);
        }
        let mut tree = builder.finish();
        drop_conflicts_within_images(&mut tree, &report);
        log_tree(&tree, &report.layers, first, false, started.elapsed());
        let numbering = keeping.map(|k| {
            let digest = crate::fs::tree_digest(&tree, &[]);
            k.store(&listed, &layers, &indexed, &report, &tree, &digest);
            digest
        });
        Ok(Some(Scan {
            tree,
            layers,
            grafts,
            report,
            added: changes.added,
            removed: changes.removed,
            replaced: changes.replaced,
            numbering,
        }))
    }

    /// A first scan as an earlier mount kept it ([`kept`]): nothing indexed, nothing
    /// folded; the layout's work was done when it was kept.
    fn kept(&mut self, k: kept::KeptScan, first: bool, started: std::time::Instant) -> Scan {
        let kept::KeptScan {
            tree,
            digest,
            layers,
            report,
            active,
        } = k;
        for (p, e) in &report.skipped {
            warn!("skipping {}: {e}", p.display());
        }
        let changes = self.settle(active, first);
        self.skipped = report
            .skipped
            .iter()
            .map(|(p, e)| (p.clone(), e.to_string()))
            .collect();
        log_tree(&tree, &report.layers, first, true, started.elapsed());
        Scan {
            tree,
            layers,
            grafts: Vec::new(),
            report,
            added: changes.added,
            removed: changes.removed,
            replaced: changes.replaced,
            numbering: Some(digest),
        }
    }

    /// Stage 1: the candidates of the sources in layer order (remote sources listed
    /// again, keeping the last listing when that fails), less the busy ones and the files
    /// of directory sources that the layout does not take, with their stamps.
    fn list(
        &mut self,
        busy: &HashSet<PathBuf>,
        first: bool,
        layout: &dyn Layout,
    ) -> Result<Listed> {
        let mut listed = std::mem::take(&mut self.listed);
        let mut list_remote = |r: &remote::RemoteRef, src: &Path| -> Result<Listing> {
            if let Some(v) = self.pinned.get(src) {
                let blob = self.remote().and_then(|rt| remote::object(v, &rt))?;
                return Ok(vec![(v.url.clone(), blob)]);
            }
            match self.remote().and_then(|rt| remote::list(r, &rt)) {
                Ok(l) => {
                    listed.insert(src.to_path_buf(), l.clone());
                    Ok(l)
                }
                // A server down at a poll is not every package removed.
                Err(e) => match listed.get(src) {
                    Some(prev) if !first => {
                        log::warn!(
                            "listing {} failed: {e}; keeping the {} objects listed before",
                            src.display(),
                            prev.len()
                        );
                        Ok(prev.clone())
                    }
                    _ => Err(e),
                },
            }
        };
        let registries = || self.registries();
        let rt = || self.remote();
        let verifying = self.opts.verify.as_ref().map(|config| Verifying {
            config,
            remote: &rt,
            sealed: Mutex::new(Vec::new()),
        });
        let found = discover(
            &self.sources,
            self.opts.platform.as_ref(),
            &mut list_remote,
            &registries,
            verifying.as_ref(),
        );
        let sealed = verifying.map(|v| v.sealed.into_inner().unwrap_or_else(|p| p.into_inner()));
        self.listed = listed;
        let (found, images) = found?;
        if let Some(s) = sealed {
            *crate::sync::lock(&self.sealed.0) = s;
        }
        let candidates: Vec<Candidate> = found
            .into_iter()
            .filter(|c| !busy.contains(&c.path))
            .filter(|c| c.explicit || layout.takes(crate::layout::file_name(&c.path)))
            .collect();
        let (stamps, mtimes) = stat_all(&candidates, self.opts.threads)
            .into_iter()
            .map(|st| match st {
                Some((s, t)) => (Some(s), t),
                None => (None, 0),
            })
            .unzip();
        Ok(Listed {
            candidates,
            stamps,
            mtimes,
            images,
        })
    }

    /// Stage 2 (layouts that place by name): a graft for each package, the last scan's
    /// kept where the package is unchanged. Nothing is opened.
    fn place_by_name(&mut self, listed: &Listed, layout: &mut dyn Layout, fold: &mut Fold) {
        let cx = Arc::new(LazyContext {
            owner: self.opts.owner,
            index_cache: self.opts.index_cache.clone(),
        });
        let mut previous = std::mem::take(&mut self.grafts);
        for ((cand, stamp), &mtime) in listed
            .candidates
            .iter()
            .zip(&listed.stamps)
            .zip(&listed.mtimes)
        {
            let Some(stamp) = stamp else {
                // Gone since it was listed.
                continue;
            };
            let (dir, inner, extra) = match layout.place_name(&cand.path) {
                Placement::Own { dir, inner, extra } => (dir, inner, extra),
                Placement::Fold(_) => continue,
                Placement::Refused(why) => {
                    fold.refuse(&cand.path, &why);
                    continue;
                }
                Placement::Unused(why) => {
                    info!("{}: {why}", cand.path.display());
                    continue;
                }
            };
            let graft = match previous.remove(&cand.path) {
                Some(g) if g.source.version() == stamp => g,
                _ => Arc::new(Graft::new(Box::new(LazyPackage {
                    cand: cand.clone(),
                    version: stamp.clone(),
                    inner,
                    extra,
                    cx: cx.clone(),
                }))),
            };
            if fold.graft(&cand.path, &dir, graft.clone(), mtime) {
                self.grafts.insert(cand.path.clone(), graft);
            } else {
                fold.refuse(&cand.path, "its directory is taken");
            }
        }
    }

    /// Stage 2 (layouts that place indexed packages): what to do with each candidate,
    /// and the background indexer's finished results, taken.
    fn plan(
        &mut self,
        candidates: &[Candidate],
        stamps: &[Option<Stamp>],
    ) -> (Vec<Plan>, Vec<Option<Indexing>>) {
        // What the background indexer has finished: taken by this scan (results for
        // paths no longer there are dropped).
        let mut ready: HashMap<PathBuf, Indexing> = self
            .background
            .as_mut()
            .map(Background::take_ready)
            .unwrap_or_default();
        let old: HashMap<&Path, &Active> =
            self.active.iter().map(|a| (a.path.as_path(), a)).collect();
        let mut plan: Vec<Plan> = Vec::with_capacity(candidates.len());
        let mut ready_for: Vec<Option<Indexing>> = Vec::with_capacity(candidates.len());
        for (c, st) in candidates.iter().zip(stamps) {
            ready_for.push(None);
            let previous = old.get(c.path.as_path()).and_then(|a| a.archive());
            let kept = previous.filter(|a| Some(archive_stamp(a)) == *st).cloned();
            let queued = self
                .background
                .as_ref()
                .is_some_and(|b| b.is_queued(&c.path, st));
            plan.push(if let Some(archive) = kept {
                Plan::Reindex(archive)
            } else if let Some(r) = ready.remove(&c.path) {
                ready_for[plan.len()] = Some(r);
                Plan::Ready
            } else if queued {
                // Still being indexed: the version this path had, if any, stays.
                Plan::Pending(previous.cloned())
            } else if matches!(self.bad.get(&c.path), Some((s, _)) if s == st) {
                Plan::KnownBad
            } else {
                Plan::Open
            });
        }
        (plan, ready_for)
    }

    /// Stage 3: index what the plan says on worker threads (at most [`INDEX_WINDOW`]
    /// archives of raw entries wait in memory), while this thread has the layout place
    /// each archive, in layer order, and folds it in. Archives that need a long pass on
    /// a live mount go to the background indexer.
    fn index_and_place(
        &mut self,
        listed: &Listed,
        plan: Vec<Plan>,
        mut ready_for: Vec<Option<Indexing>>,
        layout: &mut dyn Layout,
        fold: &mut Fold,
        first: bool,
    ) -> Result<()> {
        let candidates = &listed.candidates;
        let jobs = jobs(candidates, &plan);
        let progress = self.opts.progress.clone();
        let cx = OpenContext {
            layer: None,
            index_cache: self.opts.index_cache.as_ref(),
            // A rescan of a live mount does not wait for long passes.
            defer_over: (!first && self.background.is_some()).then_some(BACKGROUND_OVER),
            progress: match (&progress, first) {
                (Some(p), true) => Some(&*p.0),
                _ => None,
            },
        };
        // Remote archives are indexed by a few small requests each: mostly waiting, so
        // many at once.
        let threads = if candidates.iter().any(|c| c.blob.is_some()) {
            self.opts.threads.max(REMOTE_INDEX_THREADS)
        } else {
            self.opts.threads
        };
        let streamed = StreamState::new(jobs.len(), INDEX_WINDOW);
        let inspector = layout.inspector();
        // What the layout learnt of an archive kept from the last scan holds still (npm
        // hashes every tarball: not again at each rescan).
        let known = std::mem::take(&mut self.facts);
        let work = |job: &Job| {
            let (archive, entries) = index_job(job, &cx)?;
            let facts = match known.get(&archive.key) {
                Some(f) => f.clone(),
                None => inspector
                    .inspect(&archive, &entries)
                    .map_err(OpenError::Bad)?,
            };
            Ok((archive, entries, facts))
        };
        let old: HashMap<PathBuf, Arc<Archive>> = self
            .active
            .iter()
            .filter_map(|a| Some((a.path.clone(), a.archive()?.clone())))
            .collect();
        let index_cache = self.opts.index_cache.as_ref();
        let mut placing = Placing::new(layout, &*inspector, fold, &mut self.bad, old, index_cache);
        let failed_layer = std::thread::scope(|scope| -> Option<Error> {
            let mut stream = IndexStream::start(scope, &streamed, &jobs, threads, &work);
            for (((cand, st), plan), ready) in candidates
                .iter()
                .zip(&listed.stamps)
                .zip(&plan)
                .zip(&mut ready_for)
            {
                let result = match plan {
                    Plan::Reindex(_) | Plan::Open | Plan::Pending(Some(_)) => match stream.next() {
                        Some(r) => r,
                        None => continue,
                    },
                    Plan::Ready => match ready.take() {
                        Some(r) => r.map_err(OpenError::Bad).and_then(|(a, e)| {
                            let facts = inspector.inspect(&a, &e).map_err(OpenError::Bad)?;
                            Ok((a, e, facts))
                        }),
                        None => continue,
                    },
                    Plan::Pending(None) => continue,
                    Plan::KnownBad => {
                        placing.known_bad(cand);
                        continue;
                    }
                };
                if let Some(e) = placing.take(cand, st, result) {
                    return Some(e);
                }
            }
            None
        });
        if let Some(e) = failed_layer {
            return Err(e);
        }
        let (learnt, deferred) = placing.finish();
        self.facts = learnt;
        if let Some(b) = &mut self.background {
            b.queue(deferred);
        }
        Ok(())
    }

    /// Stage 4: what changed since the last scan (see [`Changes::between`]); the active
    /// set becomes `active`.
    fn settle(&mut self, active: Vec<Active>, first: bool) -> Changes {
        let changes = Changes::between(&self.active, &active, first);
        self.active = active;
        self.scanned = true;
        changes
    }
}

/// What the index stream does, in candidate order: open the new or changed archives,
/// read again the index of the kept ones (and of those whose new version is still
/// being indexed in the background).
fn jobs<'a>(candidates: &'a [Candidate], plan: &'a [Plan]) -> Vec<Job<'a>> {
    candidates
        .iter()
        .zip(plan)
        .filter_map(|(c, p)| match p {
            Plan::Reindex(archive) | Plan::Pending(Some(archive)) => {
                Some(Job::Reindex(archive, Some(c)))
            }
            Plan::Open => Some(Job::Open(c)),
            _ => None,
        })
        .collect()
}

/// Build a fixed filesystem from command-line sources, logging what was skipped.
pub fn load(sources: &[PathBuf], opts: &LoadOptions) -> Result<(PkgFs, LoadReport)> {
    fixed(Packages::new(sources.to_vec(), opts.clone()))
}

/// The filesystem of one scan of `packages`.
fn fixed(mut packages: Packages) -> Result<(PkgFs, LoadReport)> {
    let scan = packages
        .scan(&HashSet::new())?
        .ok_or_else(|| Error::Format("first scan found nothing to do".into()))?;
    Ok((
        PkgFs::with_grafts(
            scan.tree,
            scan.layers,
            scan.grafts,
            packages.opts.cache_bytes,
            false,
        ),
        scan.report,
    ))
}

/// Build a fixed filesystem of one version of a store's object, as an earlier listing
/// gave it (not listed again).
pub fn load_object(
    v: &crate::io::remote::ObjectVersion,
    opts: &LoadOptions,
) -> Result<(PkgFs, LoadReport)> {
    let src = PathBuf::from(&v.url);
    let mut packages = Packages::new(vec![src.clone()], opts.clone());
    packages.pinned.insert(src, v.clone());
    fixed(packages)
}

/// Whether `path` exists and is a directory (for argument checks).
pub fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const OWNER: Ownership = Ownership::defaults(0, 0);

    /// A ZIP at `path` of `files` (name, bytes).
    pub(super) fn write_zip(path: &Path, files: &[(String, Vec<u8>)]) {
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, data) in files {
            w.start_file(name.as_str(), ::zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
    }

    /// Local files named on the command line.
    pub(super) fn candidates(paths: &[PathBuf]) -> Vec<Candidate> {
        paths
            .iter()
            .map(|p| Candidate {
                path: p.clone(),
                explicit: true,
                layer: None,
                blob: None,
                refused: None,
                sealed: None,
            })
            .collect()
    }

    fn file_of(scan: &Scan, path: &str) -> Option<u64> {
        let t = &scan.tree;
        t.resolve(path.as_bytes())
            .and_then(|i| t.node(i))
            .map(|n| n.size)
    }

    #[test]
    fn a_rescan_rereads_kept_packages_and_names_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = |name: &str, data: &str| (name.to_string(), data.as_bytes().to_vec());
        write_zip(&d.join("a.zip"), &[file("x", "1")]);
        write_zip(&d.join("b.zip"), &[file("y", "22")]);
        write_zip(&d.join("c.zip"), &[file("z", "333")]);
        let opts = LoadOptions {
            threads: 3,
            index_cache: None,
            keep_tree: false,
            ..keeping(d)
        };
        let mut pk = Packages::new(vec![d.to_path_buf()], opts);
        let none = HashSet::new();
        let first = pk.scan(&none).unwrap().unwrap();
        assert_eq!(first.added.len(), 3);
        let a = first.layers[0].archive.clone();
        assert!(pk.scan(&none).unwrap().is_none(), "nothing changed");

        std::fs::remove_file(d.join("b.zip")).unwrap();
        write_zip(&d.join(".c.zip"), &[file("z", "4444"), file("w", "5")]);
        std::fs::rename(d.join(".c.zip"), d.join("c.zip")).unwrap();
        write_zip(&d.join("d.zip"), &[file("v", "66")]);
        let s = pk.scan(&none).unwrap().unwrap();
        assert_eq!(s.added, [d.join("d.zip")]);
        assert_eq!(s.removed, [d.join("b.zip")]);
        assert_eq!(s.replaced, [d.join("c.zip")]);
        assert!(
            Arc::ptr_eq(&s.layers[0].archive, &a),
            "a.zip kept, not reopened"
        );
        let sizes: Vec<_> = ["x", "y", "z", "w", "v"]
            .iter()
            .map(|p| file_of(&s, p))
            .collect();
        assert_eq!(sizes, [Some(1), None, Some(4), Some(1), Some(2)]);
    }

    /// Options of a mount that keeps its tree in `cache`.
    fn keeping(cache: &Path) -> LoadOptions {
        LoadOptions {
            threads: 2,
            owner: OWNER,
            cache_bytes: 1 << 20,
            index_cache: Some(IndexCache::new(cache.to_path_buf())),
            whiteouts: false,
            platform: None,
            remote: Default::default(),
            registry: Default::default(),
            progress: None,
            layout: Default::default(),
            verify: None,
            keep_tree: true,
        }
    }

    /// The tree and every file's bytes, read through a filesystem of the scan.
    fn contents(scan: Scan) -> Vec<(Vec<u8>, u64, Vec<u8>)> {
        let t = &scan.tree;
        let mut out: Vec<_> = (1..=t.len() as u64)
            .map(|ino| {
                let n = *t.node(ino).unwrap();
                (
                    t.path_of(ino),
                    n.size,
                    format!("{:?}{:o}{}", n.kind, n.perm, n.mtime),
                )
            })
            .collect();
        let fs = PkgFs::with_layers(scan.tree, scan.layers, 1 << 20, false);
        out.iter_mut()
            .map(|(p, size, what)| {
                let ino = fs.resolve(p).unwrap();
                let data = if what.starts_with("File") {
                    fs.read(ino, 0, *size as u32).unwrap()
                } else {
                    Vec::new()
                };
                (
                    std::mem::take(p),
                    *size,
                    [what.as_bytes(), b":", &data].concat(),
                )
            })
            .collect()
    }

    /// A second mount of the same packages loads the tree the first kept, serves the
    /// same bytes, and reads each package's index only when a file of it is read; a
    /// package changed, or the record damaged, and the packages are indexed again.
    #[test]
    fn a_kept_tree_is_loaded_until_a_package_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (d, cache) = (dir.path().join("pkgs"), dir.path().join("cache"));
        std::fs::create_dir(&d).unwrap();
        let file = |name: &str, data: &str| (name.to_string(), data.as_bytes().to_vec());
        write_zip(&d.join("a.zip"), &[file("x", "1"), file("d/e", "two")]);
        write_zip(&d.join("b.zip"), &[file("x", "22"), file("d/f", "three")]);
        let none = HashSet::new();
        let scan = |opts: LoadOptions| {
            Packages::new(vec![d.clone()], opts)
                .scan(&none)
                .unwrap()
                .unwrap()
        };

        let first = scan(keeping(&cache));
        assert!(!first.report.kept);
        let digest = crate::fs::tree_digest(&first.tree, &[]);
        assert_eq!(
            first.numbering.as_ref(),
            Some(&digest),
            "computed once, kept"
        );
        let records = || -> Vec<PathBuf> {
            std::fs::read_dir(&cache)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("tree-")
                })
                .collect()
        };
        assert_eq!(records().len(), 1, "kept");
        let expected = contents(first);

        let second = scan(keeping(&cache));
        assert!(second.report.kept, "loaded, not folded");
        assert_eq!(second.numbering.as_ref(), Some(&digest));
        assert_eq!(crate::fs::tree_digest(&second.tree, &[]), digest);
        assert_eq!(second.report.layers, [d.join("a.zip"), d.join("b.zip")]);
        assert!(
            second
                .layers
                .iter()
                .all(|l| l.archive.origin == crate::format::IndexOrigin::Kept),
            "no index read at mount"
        );
        assert_eq!(contents(second), expected);
        let off = LoadOptions {
            keep_tree: false,
            ..keeping(&cache)
        };
        assert!(!scan(off).report.kept, "--no-kept-tree");

        // A package changed: indexed again, and the record replaced, not added to;
        // the records of other sources unused for two weeks go, recent ones stay.
        let other = |name: &str, days: u64| {
            let p = cache.join(name);
            std::fs::write(&p, b"x").unwrap();
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 86400);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
            p
        };
        let (old, recent) = (other("tree-old.idx", 15), other("tree-recent.idx", 13));
        write_zip(&d.join(".b.zip"), &[file("x", "333")]);
        std::fs::rename(d.join(".b.zip"), d.join("b.zip")).unwrap();
        let third = scan(keeping(&cache));
        assert!(!third.report.kept);
        assert_eq!(file_of(&third, "x"), Some(3));
        assert!(!old.exists() && recent.exists(), "unused records cleared");
        std::fs::remove_file(recent).unwrap();
        assert_eq!(records().len(), 1, "one record for these sources");
        assert!(scan(keeping(&cache)).report.kept);

        // A damaged record: a miss (and a new record), never trusted.
        let record = records().pop().unwrap();
        let mut bytes = std::fs::read(&record).unwrap();
        let at = bytes.len() - 40;
        bytes[at] ^= 0x55;
        std::fs::write(&record, &bytes).unwrap();
        let fourth = scan(keeping(&cache));
        assert!(!fourth.report.kept);
        assert_eq!(file_of(&fourth, "x"), Some(3));
        assert!(scan(keeping(&cache)).report.kept);
    }
}
