//! Live activation: packages coming and going under a mount.
//!
//! The watcher thread runs [`Live::run`]: it waits for a batch of changes in the source
//! directories ([`Watcher`]), and the [`Activator`] rescans the sources
//! ([`Packages::scan`], which reuses every unchanged archive), swaps the new tree in
//! ([`PkgFs::activate`]) and tells the kernel exactly which cached entries went stale
//! ([`KernelCache::invalidate`]). A failed or panicking rescan leaves the mount with the
//! packages it has. What happened is kept in [`Activity`] for `pkgfs status`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use log::{debug, error, info, warn};

use super::watch::Watcher;
use super::{LoadReport, Packages};
use crate::fs::{KernelCache, PkgFs};
use crate::sync::lock;
use crate::tree::view::Invalidation;

/// Rescans and activations, without the waiting: one [`Activator::apply`] per batch of
/// changes.
pub struct Activator {
    packages: Packages,
    fs: Arc<PkgFs>,
    kernel: Arc<dyn KernelCache>,
    activity: Arc<Mutex<Activity>>,
    /// Where the layout's chores of each rescan go (python's bytecode).
    chores: Arc<super::chores::Chores>,
}

/// What one [`Activator::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Nothing changed in the set of packages.
    Nothing,
    /// A new generation is active.
    Activated {
        /// Its number.
        generation: u64,
        /// Kernel cache entries invalidated (that the kernel had).
        invalidated: usize,
    },
    /// The rescan failed or panicked; the mount keeps its packages.
    Failed,
}

impl Activator {
    /// Activations of `packages` (already scanned once for the mount) into `fs`.
    pub fn new(
        packages: Packages,
        fs: Arc<PkgFs>,
        kernel: Arc<dyn KernelCache>,
        activity: Arc<Mutex<Activity>>,
    ) -> Self {
        Activator {
            packages,
            fs,
            kernel,
            activity,
            chores: Arc::default(),
        }
    }

    /// Hand the layout's chores of each rescan to `chores` (the daemon's queue).
    pub fn with_chores(mut self, chores: Arc<super::chores::Chores>) -> Self {
        self.chores = chores;
        self
    }

    /// Rescan (leaving out the files in `busy`, which are being written) and activate
    /// what changed.
    pub fn apply(&mut self, busy: &HashSet<PathBuf>) -> Applied {
        let started = Instant::now();
        // A bug in a rescan must not end live activation: the mount keeps its tree.
        let scanned =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.packages.scan(busy)));
        self.chores.run(self.packages.take_chores());
        lock(&self.activity).indexing = self.packages.pending();
        let scan = match scanned {
            Ok(Ok(Some(scan))) => scan,
            Ok(Ok(None)) => {
                // Nothing active changed, but what was skipped may have (an archive
                // added and refused).
                lock(&self.activity).skipped = self.packages.skipped().to_vec();
                return Applied::Nothing;
            }
            Ok(Err(e)) => {
                warn!("rescan failed: {e}; the mount keeps its current packages");
                lock(&self.activity).failed_scans += 1;
                return Applied::Failed;
            }
            Err(_) => {
                error!("rescan panicked; the mount keeps its current packages");
                lock(&self.activity).failed_scans += 1;
                return Applied::Failed;
            }
        };
        for p in &scan.added {
            info!("activating package {}", p.display());
        }
        for p in &scan.replaced {
            info!("activating new version of package {}", p.display());
        }
        for p in &scan.removed {
            info!("deactivating package {}", p.display());
        }
        let summary = format!(
            "+{} -{} ~{}",
            scan.added.len(),
            scan.removed.len(),
            scan.replaced.len()
        );
        let skipped = skipped_list(&scan.report);
        let act = self.fs.activate_with(scan.tree, scan.layers, scan.grafts);
        let invalidated = invalidate(&*self.kernel, &act.invalidations);
        info!(
            "generation {}: {} packages ({summary}), {invalidated} kernel cache entries invalidated, {} inodes of older generations still in use, {} ms",
            act.generation,
            self.fs.view().layers.len(),
            act.retired,
            started.elapsed().as_millis()
        );
        let mut a = lock(&self.activity);
        a.activations += 1;
        a.last = Some((SystemTime::now(), summary));
        a.skipped = skipped;
        // A polled tag may name another image now.
        a.images = scan.report.images.iter().map(|i| i.summary()).collect();
        Applied::Activated {
            generation: act.generation,
            invalidated,
        }
    }
}

/// The watcher thread's loop: a batch of changes, then an activation, until watching
/// fails.
pub struct Live {
    watcher: Watcher,
    activator: Activator,
}

impl Live {
    /// Activate changes `watcher` reports with `activator`.
    pub fn new(watcher: Watcher, activator: Activator) -> Self {
        Live { watcher, activator }
    }

    /// Run [`Live::run`] on the `pkgfs-watch` thread.
    pub fn spawn(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("pkgfs-watch".into())
            .spawn(move || self.run())
            .map(drop)
    }

    /// Run until watching fails (the mount then keeps its current packages).
    pub fn run(mut self) {
        loop {
            let batch = match self.watcher.next_batch() {
                Ok(b) => b,
                Err(e) => {
                    error!(
                        "watching the sources failed: {e}; the mount keeps its current packages"
                    );
                    return;
                }
            };
            if self.activator.apply(&batch.busy) == Applied::Nothing {
                debug!("{} events, no package changed", batch.events);
            }
        }
    }
}

/// Send the invalidations; returns how many the kernel had cached. ENOENT means the
/// kernel did not have the entry: nothing to do.
fn invalidate(kernel: &dyn KernelCache, list: &[Invalidation]) -> usize {
    let mut sent = 0;
    for inv in list {
        match kernel.invalidate(inv) {
            Ok(()) => sent += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => debug!("invalidating {inv:?}: {e}"),
        }
    }
    sent
}

/// The skipped archives of a scan, with their reasons, as `status` shows them.
pub fn skipped_list(report: &LoadReport) -> Vec<(PathBuf, String)> {
    report
        .skipped
        .iter()
        .map(|(p, e)| (p.clone(), e.to_string()))
        .collect()
}

/// What happened since the mount: kept by the daemon and the [`Activator`], shown by
/// `pkgfs status`.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    /// Activations done (package sets swapped in).
    pub activations: u64,
    /// When the last one happened, and what it changed.
    pub last: Option<(SystemTime, String)>,
    /// Archives skipped by the last scan, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
    /// Rescans that failed (a source directory could not be read).
    pub failed_scans: u64,
    /// Archives being indexed in the background (not active yet).
    pub indexing: Vec<PathBuf>,
    /// The images among the sources.
    pub images: Vec<crate::source::image::ImageSummary>,
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::source::LoadOptions;
    use crate::tree::{Ownership, ROOT_INO};

    /// The kernel as activations see it: invalidations recorded, `ENOENT` for names it
    /// never cached (here: every `Entry` of a new name).
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Invalidation>>);

    impl KernelCache for Recorder {
        fn store(&self, _: u64, _: u64, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
        fn invalidate(&self, inv: &Invalidation) -> std::io::Result<()> {
            self.0.lock().unwrap().push(inv.clone());
            match inv {
                Invalidation::Entry { .. } => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
                _ => Ok(()),
            }
        }
    }

    fn zip(path: &std::path::Path, files: &[&str]) {
        let mut w = ::zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for f in files {
            w.start_file(*f, ::zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(f.as_bytes()).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn packages_added_and_removed_are_activated_and_the_kernel_told() {
        let dir = tempfile::tempdir().unwrap();
        zip(&dir.path().join("a.zip"), &["d/a"]);
        let opts = LoadOptions {
            threads: 2,
            owner: Ownership::defaults(0, 0),
            cache_bytes: 1 << 20,
            index_cache: None,
            whiteouts: false,
            platform: None,
            remote: Default::default(),
            registry: Default::default(),
            progress: None,
            layout: Default::default(),
            verify: None,
            keep_tree: false,
        };
        let mut packages = Packages::new(vec![dir.path().to_path_buf()], opts);
        let scan = packages.scan(&HashSet::new()).unwrap().unwrap();
        let fs = Arc::new(PkgFs::with_layers(scan.tree, scan.layers, 1 << 20, true));
        let kernel = Arc::new(Recorder::default());
        let activity = Arc::new(Mutex::new(Activity::default()));
        let mut act = Activator::new(packages, fs.clone(), kernel.clone(), activity.clone());
        assert_eq!(act.apply(&HashSet::new()), Applied::Nothing);

        // A package added: a new name in `d`, which the kernel had not cached.
        zip(&dir.path().join("b.zip"), &["d/b"]);
        let d = fs.lookup(ROOT_INO, b"d").unwrap().ino;
        let applied = act.apply(&HashSet::new());
        assert!(
            matches!(applied, Applied::Activated { generation: 1, .. }),
            "{applied:?}"
        );
        assert!(fs.resolve(b"d/b").is_some());
        assert!(kernel.0.lock().unwrap().contains(&Invalidation::Dir(d)));
        {
            let a = activity.lock().unwrap();
            assert_eq!(a.activations, 1);
            assert_eq!(a.last.as_ref().map(|l| l.1.as_str()), Some("+1 -0 ~0"));
        }

        // Being written: left out until it is done.
        let c = dir.path().join("c.zip");
        zip(&c, &["d/c"]);
        let busy: HashSet<PathBuf> = [c.clone()].into();
        assert_eq!(act.apply(&busy), Applied::Nothing);
        assert!(fs.resolve(b"d/c").is_none());

        // A package removed: its name is deleted from the kernel's cache.
        std::fs::remove_file(dir.path().join("a.zip")).unwrap();
        std::fs::remove_file(&c).unwrap();
        kernel.0.lock().unwrap().clear();
        assert!(matches!(
            act.apply(&HashSet::new()),
            Applied::Activated { .. }
        ));
        assert!(fs.resolve(b"d/a").is_none());
        assert!(kernel.0.lock().unwrap().iter().any(|i| matches!(
            i,
            Invalidation::Delete { name, .. } if name == b"a"
        )));

        // A source that cannot be listed: the mount keeps what it has.
        let moved = dir.path().with_extension("gone");
        std::fs::rename(dir.path(), &moved).unwrap();
        assert_eq!(act.apply(&HashSet::new()), Applied::Failed);
        assert!(fs.resolve(b"d/b").is_some());
        assert_eq!(activity.lock().unwrap().failed_scans, 1);
        std::fs::rename(&moved, dir.path()).unwrap();
    }
}
