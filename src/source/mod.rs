//! From command-line sources to layers: finding archives, opening and indexing them in
//! parallel, and folding them into the merged tree.
//!
//! Layer order is the documented precedence rule: sources in command-line order; inside a
//! directory source, its archives in byte order of their file names. Archives are found
//! by content, not by extension; a directory's files that are not archives are ignored,
//! and hidden files (names starting with `.`, e.g. partial downloads) are never considered.
//! An archive that cannot be read is skipped with a warning naming it: one bad package
//! never takes down the mount.

pub mod image;
pub mod live;
pub mod remote;
pub mod store;
pub mod verify;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use log::{debug, info, warn};

use crate::error::{Error, Result};
use crate::format::{
    self, Archive, Entry, IndexCache, IndexProgress, Indexed, OpenContext, OpenError,
};
use crate::fs::PkgFs;
use crate::layout::{Layout, Placement};
use crate::tree::view::{Graft, GraftSource, Layer};
use crate::tree::{Ownership, Place, Tree, TreeBuilder};

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
    fn stat(&self) -> Option<(Stamp, i64)> {
        match (&self.layer, &self.blob) {
            (Some(l), _) => Some((l.blob.version().to_string(), l.blob.mtime())),
            (None, Some(b)) => Some((b.version().to_string(), b.mtime())),
            (None, None) => {
                use std::os::unix::fs::MetadataExt;
                let m = std::fs::metadata(&self.path).ok()?;
                let mut version = crate::io::blob::local_version(&m);
                // As the version of the blob it is read through (`VerifiedBlob`).
                if let Some(s) = &self.sealed {
                    version = verify::sealed_version(&version, &s.tree_of(&self.path)?);
                }
                Some((version, m.mtime()))
            }
        }
    }

    /// Open and index it.
    fn open(&self, cx: &OpenContext) -> std::result::Result<Indexed, OpenError> {
        if let Some(e) = &self.refused {
            return Err(OpenError::Bad(e.clone()));
        }
        match (&self.layer, &self.blob) {
            (Some(l), _) => {
                let r = format::open_layer(l.blob.clone(), &l.check, cx);
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
                    if l.background_fetch {
                        l.blob.will_need(&[(0, l.blob.size())]);
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
}

/// Expand sources into candidate files in layer order: an image into its layers (see
/// [`image`]), a directory into its files, a file into itself.
pub fn discover(
    sources: &[PathBuf],
    platform: Option<&image::Platform>,
    list_remote: &mut dyn FnMut(&remote::RemoteRef, &Path) -> Result<Listing>,
    registries: &dyn Fn() -> Result<Arc<crate::io::registry::Registries>>,
    verify: Option<&Verifying<'_>>,
) -> Result<(Vec<Candidate>, Vec<image::Image>)> {
    let mut out = Vec::new();
    let mut images = Vec::new();
    for src in sources {
        if let Some(r) = src.to_str().and_then(remote::RemoteRef::parse) {
            let source = src.to_string_lossy();
            // A store's seal is fetched while it is listed: the mount waits for one
            // round trip less.
            let (listing, seal) = match verify {
                Some(v) if !matches!(r, remote::RemoteRef::HttpFile(_)) => {
                    let rt = (v.remote)()?;
                    let (listing, seal) = std::thread::scope(|s| {
                        let seal = s.spawn(|| verify::fetch_remote(&r, &source, &rt));
                        (list_remote(&r, src), seal.join())
                    });
                    let seal = seal.unwrap_or_else(|_| {
                        Err(Error::Internal("fetching a seal panicked".into()))
                    });
                    (listing?, Some(seal?))
                }
                _ => (list_remote(&r, src)?, None),
            };
            let found: Vec<Candidate> = listing
                .iter()
                .map(|(name, blob)| Candidate {
                    path: PathBuf::from(name),
                    explicit: matches!(r, remote::RemoteRef::HttpFile(_)),
                    layer: None,
                    blob: Some(blob.clone()),
                    refused: None,
                    sealed: None,
                })
                .collect();
            match verify {
                Some(v) => {
                    if matches!(r, remote::RemoteRef::HttpFile(_)) {
                        return Err(unsealed(src));
                    }
                    let seal = seal.ok_or_else(|| {
                        Error::Internal("a remote store's seal was not fetched".into())
                    })?;
                    let sealed = Arc::new(verify::open_remote(v.config, &source, seal)?);
                    out.extend(verify::apply(&sealed, found));
                    crate::sync::lock(&v.sealed).push(sealed);
                }
                None => out.extend(found),
            }
            continue;
        }
        if let Some(r) = image::ImageRef::parse(src.as_os_str()) {
            // A registry image pinned by digest is its own root of trust; nothing else
            // of an image is sealed.
            if verify.is_some() && r.registry.as_ref().is_none_or(|x| x.digest.is_none()) {
                return Err(Error::Format(format!(
                    "{r}: --verify mounts an image only from a registry and pinned by its \
                     digest (docker://HOST/REPO@sha256:…): a tag or a local layout has no seal"
                )));
            }
            let img = image::resolve(&r, platform, registries)?;
            out.extend(img.layers.iter().map(|l| Candidate {
                path: l.name.clone(),
                explicit: true,
                layer: Some(Arc::new(l.clone())),
                blob: None,
                refused: None,
                sealed: None,
            }));
            images.push(img);
            continue;
        }
        let meta = std::fs::metadata(src).map_err(|e| Error::Io(e).with_path(src))?;
        if !meta.is_dir() && verify.is_some() {
            return Err(unsealed(src));
        }
        if !meta.is_dir() {
            out.push(Candidate {
                path: src.clone(),
                explicit: true,
                layer: None,
                blob: None,
                refused: None,
                sealed: None,
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
            // Follow symlinks: a directory of links to packages is a normal setup. The
            // type from the listing saves a stat per file (10,000 packages).
            let is_file = match entry.file_type() {
                Ok(t) if t.is_file() => true,
                Ok(t) if t.is_dir() => false,
                _ => std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()),
            };
            if is_file {
                names.push(name);
            }
        }
        names.sort_unstable_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        let found = names.into_iter().map(|n| Candidate {
            path: src.join(n),
            explicit: false,
            layer: None,
            blob: None,
            refused: None,
            sealed: None,
        });
        match verify {
            Some(v) => {
                let sealed = Arc::new(verify::open_local(v.config, src)?);
                out.extend(verify::apply(&sealed, found.collect()));
                crate::sync::lock(&v.sealed).push(sealed);
            }
            None => out.extend(found),
        }
    }
    Ok((out, images))
}

/// What `discover` needs to verify sources, and where it puts their seals.
pub struct Verifying<'a> {
    /// The settings.
    pub config: &'a verify::VerifyConfig,
    /// The remote runtime (tree files of remote stores are fetched through it).
    pub remote: &'a dyn Fn() -> Result<Arc<crate::io::remote::Remote>>,
    /// The seals of the sources, as they are accepted.
    pub sealed: Mutex<Vec<Arc<verify::SealedSource>>>,
}

fn unsealed(src: &Path) -> Error {
    Error::Format(format!(
        "{}: --verify mounts directories and remote stores sealed by `pkgfs seal`, not single files",
        src.display()
    ))
}

/// Archives indexed ahead of the tree builder, at most: the raw entries waiting to be
/// folded into the tree are bounded by this many archives, whatever the source holds.
const INDEX_WINDOW: usize = 256;
/// Indexing threads when remote archives are opened (each waits on the network).
const REMOTE_INDEX_THREADS: usize = 256;

/// Work for an [`IndexStream`]: an archive to open and index, or one kept from the
/// previous scan (unchanged) whose index is read again.
enum Job<'a> {
    Open(&'a Candidate),
    /// A kept archive, with what its image promised of it if it is a layer.
    Reindex(&'a Arc<Archive>, Option<&'a Candidate>),
}

/// What an [`IndexStream`] hands out: an archive, its entries, and what the layout
/// learnt of it.
type Opened = std::result::Result<(Arc<Archive>, Vec<Entry>, crate::layout::Facts), OpenError>;

/// An archive and its entries, or why not.
type Entries = std::result::Result<(Arc<Archive>, Vec<Entry>), OpenError>;

/// The objects of a remote source: (name, blob), in layer order.
pub type Listing = Vec<(String, Arc<dyn crate::io::blob::Blob>)>;

/// Archives being opened and indexed on worker threads while the caller folds the ones
/// already indexed into the tree, in order: the workers mostly wait on the disk (reading
/// the indexes) and the builder on the CPU, so the two overlap.
///
/// [`IndexStream::next`] hands the results out in candidate order. At most `window`
/// archives are indexed ahead of the last one handed out. A panic while indexing one
/// archive becomes that archive's error. Dropping the stream stops the workers after
/// the archive each is on.
struct IndexStream<'a> {
    shared: &'a StreamState,
}

/// What the workers and the consumer of an [`IndexStream`] share.
struct StreamState {
    slots: Mutex<Slots>,
    /// A slot was filled.
    filled: std::sync::Condvar,
    /// The consumer took a slot (room for the workers) or stopped.
    room: std::sync::Condvar,
    window: usize,
}

struct Slots {
    results: Vec<Option<Opened>>,
    /// Next candidate to claim.
    next: usize,
    /// Results handed out so far.
    taken: usize,
    stopped: bool,
}

impl StreamState {
    /// State for `n` candidates, indexing at most `window` ahead of the consumer.
    fn new(n: usize, window: usize) -> Self {
        StreamState {
            slots: Mutex::new(Slots {
                results: (0..n).map(|_| None).collect(),
                next: 0,
                taken: 0,
                stopped: false,
            }),
            filled: std::sync::Condvar::new(),
            room: std::sync::Condvar::new(),
            window: window.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        crate::sync::lock(&self.slots)
    }
}

/// Open and index a new archive, or re-read the index of a kept one.
fn index_job(job: &Job, cx: &OpenContext) -> Entries {
    match *job {
        Job::Open(cand) => {
            let Indexed { archive, entries } = cand.open(cx)?;
            Ok((Arc::new(archive), entries))
        }
        Job::Reindex(archive, cand) => {
            // A kept archive's index costs no pass (it was made once): never deferred.
            // A layer's index is found under the digest that was checked.
            let cx = OpenContext {
                defer_over: None,
                progress: None,
                layer: cand.and_then(|c| c.layer.as_ref()).map(|l| &l.check),
                ..*cx
            };
            match archive.entries(&cx) {
                Ok(entries) => Ok((archive.clone(), entries)),
                Err(e) => Err(OpenError::Bad(e)),
            }
        }
    }
}

impl<'a> IndexStream<'a> {
    /// Start `threads` workers in `scope` doing `work` (normally [`index_job`]) on `jobs`.
    fn start<'s>(
        scope: &'s std::thread::Scope<'s, 'a>,
        shared: &'a StreamState,
        jobs: &'a [Job<'a>],
        threads: usize,
        work: &'a (dyn Fn(&Job<'a>) -> Opened + Sync),
    ) -> Self {
        let workers = threads.clamp(1, jobs.len().max(1));
        for _ in 0..workers {
            scope.spawn(move || {
                loop {
                    let i = {
                        let mut s = shared.lock();
                        while !s.stopped && s.next < jobs.len() && s.next >= s.taken + shared.window
                        {
                            s = crate::sync::wait(&shared.room, s);
                        }
                        if s.stopped || s.next >= jobs.len() {
                            return;
                        }
                        s.next += 1;
                        s.next - 1
                    };
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&jobs[i])))
                            .unwrap_or_else(|_| {
                                Err(OpenError::Bad(Error::Format(
                                    "internal error while indexing (a bug: please report it)"
                                        .into(),
                                )))
                            });
                    shared.lock().results[i] = Some(r);
                    // One consumer waits on `filled`.
                    shared.filled.notify_one();
                }
            });
        }
        IndexStream { shared }
    }

    /// The next job's result, waiting for it if a worker is still on it.
    fn next(&mut self) -> Option<Opened> {
        let mut s = self.shared.lock();
        let i = s.taken;
        if i >= s.results.len() {
            return None;
        }
        let r = loop {
            if let Some(r) = s.results[i].take() {
                break r;
            }
            s = crate::sync::wait(&self.shared.filled, s);
        };
        s.taken += 1;
        drop(s);
        // One slot freed: one worker to take it (waking all of them, hundreds for a
        // remote source, costs more than the indexing).
        self.shared.room.notify_one();
        Some(r)
    }
}

impl Drop for IndexStream<'_> {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.room.notify_all();
    }
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
    /// Where to keep indexes that cost a pass over an archive (None: no cache).
    pub index_cache: Option<IndexCache>,
    /// Treat `.wh.` entries as OCI whiteouts ([`TreeBuilder::with_whiteouts`]; always
    /// when an image is among the sources).
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
}

/// A shared [`IndexProgress`].
#[derive(Clone)]
pub struct Progress(pub Arc<dyn IndexProgress + Send>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// On a live mount, an archive larger than this whose index needs a pass over its data
/// is indexed in the background instead of holding up the rescan (and with it every
/// other change): about half a second of decoding on one core.
pub const BACKGROUND_OVER: u64 = 32 << 20;

/// What a background index pass gave: an archive and its entries, or why not.
type Indexing = std::result::Result<(Arc<Archive>, Vec<crate::format::Entry>), Error>;

/// Archives indexed by the `pkgfs-index` thread, for the next rescan to take.
struct Background {
    jobs: std::sync::mpsc::Sender<Candidate>,
    /// Results by path (the archive knows the version it was made of).
    ready: Arc<Mutex<HashMap<PathBuf, Indexing>>>,
    /// Paths queued and not taken yet, with the stamp they were queued at.
    queued: HashMap<PathBuf, Option<Stamp>>,
}

/// What identifies the file at a path: its blob version (device, inode, size and
/// modification time). A package replaced by rename, or rewritten in place, has a
/// different stamp.
pub type Stamp = String;

fn archive_stamp(a: &Archive) -> Stamp {
    a.blob.version().to_string()
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

/// What an active package is: an open archive, or a graft (a directory of its own,
/// indexed on first use).
#[derive(Debug, Clone)]
enum Provided {
    Archive(Arc<Archive>),
    Graft(Arc<Graft>),
}

impl Provided {
    /// Whether two are the same version of a package (the same open archive or graft).
    fn same(&self, other: &Provided) -> bool {
        match (self, other) {
            (Provided::Archive(a), Provided::Archive(b)) => a.key == b.key,
            (Provided::Graft(a), Provided::Graft(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// An active package.
#[derive(Debug, Clone)]
struct Active {
    path: PathBuf,
    provided: Provided,
}

impl Active {
    fn archive(&self) -> Option<&Arc<Archive>> {
        match &self.provided {
            Provided::Archive(a) => Some(a),
            Provided::Graft(_) => None,
        }
    }
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
}

/// What the sources hold now (the first stage of a scan).
struct Listed {
    candidates: Vec<Candidate>,
    stamps: Vec<Option<Stamp>>,
    /// Modification times (0 for a candidate gone since it was listed).
    mtimes: Vec<i64>,
    images: Vec<image::Image>,
}

/// The tree being built by a scan, and what it is built from.
struct Fold {
    builder: TreeBuilder,
    layers: Vec<Layer>,
    grafts: Vec<Arc<Graft>>,
    report: LoadReport,
    active: Vec<Active>,
}

impl Fold {
    fn new(opts: &LoadOptions, images: Vec<image::Image>) -> Self {
        let whiteouts = opts.whiteouts || !images.is_empty();
        Fold {
            builder: TreeBuilder::new(opts.owner).with_whiteouts(whiteouts),
            layers: Vec::new(),
            grafts: Vec::new(),
            report: LoadReport {
                images,
                ..LoadReport::default()
            },
            active: Vec::new(),
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
        });
        self.active.push(Active {
            path: path.to_path_buf(),
            provided: Provided::Archive(archive),
        });
    }

    /// A graft at `dir`; `false` (and nothing added) if the path is taken.
    fn graft(&mut self, path: &Path, dir: &[Vec<u8>], graft: Arc<Graft>, mtime: i64) -> bool {
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
    fn own(&mut self, kind: crate::layout::Kind, entries: Vec<Entry>) {
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
        });
    }

    fn refuse(&mut self, path: &Path, why: &str) {
        warn!("skipping {}: {why}", path.display());
        self.report
            .skipped
            .push((path.to_path_buf(), Error::Format(why.to_string())));
    }
}

/// What changed since the previous scan.
struct Changes {
    unchanged: bool,
    added: Vec<PathBuf>,
    removed: Vec<PathBuf>,
    replaced: Vec<PathBuf>,
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
        }
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
    pub fn index_in_background(&mut self, waker: crate::source::watch::Waker) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<Candidate>();
        let ready: Arc<Mutex<HashMap<PathBuf, Indexing>>> = Arc::default();
        let done = ready.clone();
        let cache = self.opts.index_cache.clone();
        std::thread::Builder::new()
            .name("pkgfs-index".into())
            .spawn(move || {
                for cand in rx {
                    let path = cand.path.clone();
                    info!("indexing {} in the background", path.display());
                    let cx = OpenContext {
                        index_cache: cache.as_ref(),
                        ..OpenContext::default()
                    };
                    let opened =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cand.open(&cx)));
                    let r = match opened {
                        Ok(Ok(Indexed { archive, entries })) => Ok((Arc::new(archive), entries)),
                        Ok(Err(OpenError::Bad(e))) => Err(e),
                        Ok(Err(OpenError::NotAnArchive)) => {
                            Err(Error::Format("not an archive".into()))
                        }
                        Err(_) => Err(Error::Internal("indexing panicked".into())),
                    };
                    crate::sync::lock(&done).insert(path, r);
                    waker.wake();
                }
            })
            .map_err(Error::Io)?;
        self.background = Some(Background {
            jobs: tx,
            ready,
            queued: HashMap::new(),
        });
        Ok(())
    }

    /// Archives being indexed in the background, not active yet.
    pub fn pending(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .background
            .as_ref()
            .map(|b| b.queued.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
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
        let mut listed = self.list(busy, first, &*layout)?;
        if layout.by_name() && !listed.images.is_empty() {
            return Err(Error::Unsupported(format!(
                "--layout {} gives each archive a directory: container images take --layout merge",
                self.opts.layout.kind.name()
            )));
        }
        let mut fold = Fold::new(&self.opts, std::mem::take(&mut listed.images));
        if layout.by_name() {
            self.place_by_name(&listed, &mut *layout, &mut fold);
        } else {
            let (plan, ready) = self.plan(&listed.candidates, &listed.stamps);
            self.index_and_place(&listed, plan, ready, &mut *layout, &mut fold, first)?;
        }
        fold.own(self.opts.layout.kind, layout.finish()?);
        let Fold {
            builder,
            layers,
            grafts,
            report,
            active,
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
        log_tree(&tree, &report.layers, first, started.elapsed());
        Ok(Some(Scan {
            tree,
            layers,
            grafts,
            report,
            added: changes.added,
            removed: changes.removed,
            replaced: changes.replaced,
        }))
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
        let mut ready: HashMap<PathBuf, Indexing> = match &mut self.background {
            Some(b) => {
                let done = std::mem::take(&mut *crate::sync::lock(&b.ready));
                for p in done.keys() {
                    b.queued.remove(p);
                }
                done
            }
            None => HashMap::new(),
        };
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
                .and_then(|b| b.queued.get(&c.path))
                .is_some_and(|q| q == st);
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
        let jobs: Vec<Job> = candidates
            .iter()
            .zip(&plan)
            .filter_map(|(c, p)| match p {
                Plan::Reindex(archive) | Plan::Pending(Some(archive)) => {
                    Some(Job::Reindex(archive, Some(c)))
                }
                Plan::Open => Some(Job::Open(c)),
                _ => None,
            })
            .collect();
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
        let mut learnt = HashMap::new();
        let old: HashMap<PathBuf, Arc<Archive>> = self
            .active
            .iter()
            .filter_map(|a| Some((a.path.clone(), a.archive()?.clone())))
            .collect();
        let mut deferred = Vec::new();
        let bad_before: HashSet<PathBuf> = self.bad.keys().cloned().collect();
        let mut still_bad = HashSet::new();
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
                        // Known bad and unchanged: skip quietly.
                        if let Some((_, e)) = self.bad.get(&cand.path) {
                            fold.report.skipped.push((cand.path.clone(), e.clone()));
                        }
                        still_bad.insert(cand.path.clone());
                        continue;
                    }
                };
                match result {
                    Ok((archive, mut entries, facts)) => {
                        debug!("{}: {} entries", cand.path.display(), entries.len());
                        place(
                            layout,
                            fold,
                            &cand.path,
                            archive.clone(),
                            &mut entries,
                            &facts,
                        );
                        learnt.insert(archive.key, facts);
                    }
                    Err(OpenError::Bad(Error::Deferred)) => {
                        deferred.push((cand.clone(), st.clone()));
                        // The version this path had stays until the new one is ready.
                        if let Some(a) = old.get(&cand.path) {
                            let cache = self.opts.index_cache.as_ref();
                            place_again(layout, &*inspector, fold, &cand.path, a, cache);
                        }
                    }
                    Err(OpenError::NotAnArchive)
                        if !cand.explicit && !looks_like_archive(&cand.path) =>
                    {
                        info!("{}: not an archive, ignored", cand.path.display());
                        fold.report.ignored.push(cand.path.clone());
                    }
                    Err(e) => {
                        if let Some(e) = failed(&mut self.bad, cand, st, e, fold) {
                            return Some(e);
                        }
                        still_bad.insert(cand.path.clone());
                    }
                }
            }
            None
        });
        if let Some(e) = failed_layer {
            return Err(e);
        }
        self.facts = learnt;
        for gone in bad_before.difference(&still_bad) {
            self.bad.remove(gone);
        }
        if let Some(b) = &mut self.background {
            for (cand, st) in deferred {
                let path = cand.path.clone();
                if b.queued.get(&path) != Some(&st) && b.jobs.send(cand).is_ok() {
                    b.queued.insert(path, st);
                }
            }
        }
        Ok(())
    }

    /// Stage 4: what changed since the last scan, by path (through hash maps: ten
    /// thousand packages make pairwise scans slow); the active set becomes `active`.
    fn settle(&mut self, active: Vec<Active>, first: bool) -> Changes {
        let unchanged = !first
            && active.len() == self.active.len()
            && active
                .iter()
                .zip(&self.active)
                .all(|(a, b)| a.path == b.path && a.provided.same(&b.provided));
        let before: HashMap<&Path, &Provided> = self
            .active
            .iter()
            .map(|o| (o.path.as_path(), &o.provided))
            .collect();
        let mut added = Vec::new();
        let mut replaced = Vec::new();
        for a in &active {
            match before.get(a.path.as_path()) {
                None => added.push(a.path.clone()),
                Some(p) if !p.same(&a.provided) => replaced.push(a.path.clone()),
                Some(_) => {}
            }
        }
        let now: HashSet<&Path> = active.iter().map(|a| a.path.as_path()).collect();
        let removed = self
            .active
            .iter()
            .filter(|o| !now.contains(o.path.as_path()))
            .map(|o| o.path.clone())
            .collect();
        self.active = active;
        self.scanned = true;
        Changes {
            unchanged,
            added,
            removed,
            replaced,
        }
    }
}

/// A candidate that could not be opened: skipped with a warning and remembered
/// (until it changes), or, for an image's layer, the error that refuses the image.
fn failed(
    bad: &mut HashMap<PathBuf, (Option<Stamp>, Error)>,
    cand: &Candidate,
    st: &Option<Stamp>,
    e: OpenError,
    fold: &mut Fold,
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
    fold.report.skipped.push((cand.path.clone(), e.clone()));
    // A remote object that could not be fetched (the network, not its bytes) is
    // tried again at the next poll.
    if !(cand.blob.is_some() && matches!(e, Error::Io(_))) {
        bad.insert(cand.path.clone(), (st.clone(), e));
    }
    None
}

/// Candidates at least this many are `stat`ed on several threads: a cold `stat` waits on
/// the disk, and a virtual disk answers several at once (10,000 files: 65 ms on one
/// thread, 35 ms on two or more, docs/BENCHMARKS.md "Layouts").
const PARALLEL_STAT_FROM: usize = 512;

/// [`Candidate::stat`] of every candidate, in order; on up to `threads` threads when
/// there are many.
fn stat_all(candidates: &[Candidate], threads: usize) -> Vec<Option<(Stamp, i64)>> {
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

/// Have the layout place an indexed archive and fold it in where it says.
fn place(
    layout: &mut dyn Layout,
    fold: &mut Fold,
    path: &Path,
    archive: Arc<Archive>,
    entries: &mut [Entry],
    facts: &crate::layout::Facts,
) {
    match layout.place(path, entries, facts) {
        Placement::Fold(places) => fold.archive(path, archive, entries, &places),
        Placement::Own { .. } => fold.refuse(path, "this layout places packages by name"),
        Placement::Refused(why) => fold.refuse(path, &why),
        Placement::Unused(why) => info!("{}: {why}", path.display()),
    }
}

/// Place an archive of the last scan again (its index read again), as it was.
fn place_again(
    layout: &mut dyn Layout,
    inspector: &dyn crate::layout::Inspect,
    fold: &mut Fold,
    path: &Path,
    archive: &Arc<Archive>,
    index_cache: Option<&IndexCache>,
) {
    let cx = OpenContext {
        index_cache,
        ..OpenContext::default()
    };
    if let Ok(mut entries) = archive.entries(&cx)
        && let Ok(facts) = inspector.inspect(archive, &entries)
    {
        place(layout, fold, path, archive.clone(), &mut entries, &facts);
    }
}

/// One layer of an image replacing or whiting out what a lower one has is how the image
/// is made, not a conflict between packages.
fn drop_conflicts_within_images(tree: &mut Tree, report: &LoadReport) {
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

/// What every lazily indexed package of a scan shares.
#[derive(Debug)]
struct LazyContext {
    owner: Ownership,
    index_cache: Option<IndexCache>,
}

/// A package a layout placed by name: opened and indexed when its directory is first
/// looked into ([`Graft`]).
#[derive(Debug)]
struct LazyPackage {
    cand: Candidate,
    version: Stamp,
    inner: Place,
    extra: Vec<Entry>,
    cx: Arc<LazyContext>,
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
            });
        }
        let tree = b.finish();
        log_graft(&self.cand.path, &tree, entries.len(), started);
        Ok((tree, layers))
    }
}

impl LazyContext {
    /// Open and index `cand` for a graft.
    fn open(&self, cand: &Candidate) -> Result<Indexed> {
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

/// What indexing a graft's package made: its skipped entries, and how long it took.
fn log_graft(path: &Path, tree: &Tree, entries: usize, started: std::time::Instant) {
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

fn log_tree(tree: &Tree, layers: &[PathBuf], first: bool, took: std::time::Duration) {
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
        "{} archives, {} inodes, {} bytes of file data (indexed and merged in {:.3} s)",
        layers.len(),
        tree.len(),
        tree.total_bytes,
        took.as_secs_f64()
    );
}

/// Build a fixed filesystem from command-line sources, logging what was skipped.
pub fn load(sources: &[PathBuf], opts: &LoadOptions) -> Result<(PkgFs, LoadReport)> {
    let mut packages = Packages::new(sources.to_vec(), opts.clone());
    let scan = packages
        .scan(&HashSet::new())?
        .ok_or_else(|| Error::Format("first scan found nothing to do".into()))?;
    Ok((
        PkgFs::with_grafts(scan.tree, scan.layers, scan.grafts, opts.cache_bytes, false),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const OWNER: Ownership = Ownership::defaults(0, 0);

    fn with_no_facts(r: Entries) -> Opened {
        r.map(|(a, e)| (a, e, crate::layout::Facts::default()))
    }

    fn write_zip(path: &Path, files: &[(String, Vec<u8>)]) {
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, data) in files {
            w.start_file(name.as_str(), ::zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
    }

    fn candidates(paths: &[PathBuf]) -> Vec<Candidate> {
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

    /// Package `i` of `packages`: `i % 5 + 1` files, or garbage when `i % 7 == 3`.
    fn packages(dir: &Path, n: usize) -> Vec<PathBuf> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("p{i:02}.zip"));
                if i % 7 == 3 {
                    std::fs::write(&p, b"not an archive at all").unwrap();
                } else {
                    let files: Vec<_> = (0..i % 5 + 1)
                        .map(|j| (format!("p{i}/f{j}"), format!("{i}.{j}").into_bytes()))
                        .collect();
                    write_zip(&p, &files);
                }
                p
            })
            .collect()
    }

    #[test]
    fn the_stream_hands_out_every_archive_in_order_whatever_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 40);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        for window in [1, 2, 5, 64] {
            let shared = StreamState::new(jobs.len(), window);
            let work = |job: &Job| with_no_facts(index_job(job, &OpenContext::default()));
            let got: Vec<Opened> = std::thread::scope(|s| {
                let mut stream = IndexStream::start(s, &shared, &jobs, 4, &work);
                std::iter::from_fn(|| stream.next()).collect()
            });
            assert_eq!(got.len(), paths.len(), "window {window}");
            for (i, r) in got.iter().enumerate() {
                match r {
                    Ok((a, entries, _)) => {
                        assert_eq!(a.path, paths[i], "window {window}");
                        assert_eq!(entries.len(), i % 5 + 1, "window {window}");
                    }
                    Err(_) => assert_eq!(i % 7, 3, "window {window}: {i} failed"),
                }
            }
        }
    }

    #[test]
    fn a_stream_dropped_early_stops_its_workers() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 30);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        let shared = StreamState::new(jobs.len(), 2);
        let work = |job: &Job| with_no_facts(index_job(job, &OpenContext::default()));
        // The scope joins the workers: it returns only if they stop.
        std::thread::scope(|s| {
            let mut stream = IndexStream::start(s, &shared, &jobs, 3, &work);
            assert!(stream.next().is_some());
        });
        let claimed = shared.lock().next;
        assert!(
            claimed <= 3,
            "{claimed} claimed: the window (2) did not hold"
        );
    }

    #[test]
    fn a_panic_while_indexing_is_that_archive_s_error_and_the_rest_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 12);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        let shared = StreamState::new(jobs.len(), 3);
        let work = |job: &Job| {
            if let Job::Open(c) = job
                && c.path.ends_with("p05.zip")
            {
                panic!("injected");
            }
            with_no_facts(index_job(job, &OpenContext::default()))
        };
        let got: Vec<Opened> = std::thread::scope(|s| {
            let mut stream = IndexStream::start(s, &shared, &jobs, 2, &work);
            std::iter::from_fn(|| stream.next()).collect()
        });
        assert_eq!(got.len(), 12);
        for (i, r) in got.iter().enumerate() {
            match (i, r) {
                (5, Err(OpenError::Bad(e))) => assert!(e.to_string().contains("internal error")),
                (5, _) => panic!("the panicking archive is not an error"),
                (3 | 10, r) => assert!(r.is_err(), "{i}: garbage"),
                (_, r) => assert!(r.is_ok(), "{i}"),
            }
        }
    }

    fn file_of(scan: &Scan, path: &str) -> Option<u64> {
        let t = &scan.tree;
        t.resolve(path.as_bytes())
            .and_then(|i| t.node(i))
            .map(|n| n.size)
    }

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
            owner: OWNER,
            cache_bytes: 1 << 20,
            index_cache: None,
            whiteouts: false,
            platform: None,
            remote: Default::default(),
            registry: Default::default(),
            progress: None,
            layout: Default::default(),
            verify: None,
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
}
