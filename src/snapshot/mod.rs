//! `pkgfs snapshotter`: a snapshotter for containerd, served as a proxy plugin over
//! gRPC on a Unix socket.
//!
//! containerd keeps a container's image as a chain of snapshots, one per layer, each
//! made by its snapshotter: Prepare gives an empty writable directory on the layer
//! below, containerd unpacks the layer into it, Commit freezes it under the layer's
//! chain ID; a container's root is one more Active snapshot on top. A proxy plugin
//! (`[proxy_plugins.NAME] type = "snapshot"` in containerd's config) is such a
//! snapshotter in another process; containerd talks to it with the
//! `containerd.services.snapshots.v1.Snapshots` service.
//!
//! Step 1 behaves as containerd's own overlayfs snapshotter: every layer is unpacked by
//! containerd into `ROOT/snapshots/ID/fs`, and the mounts handed back are bind mounts
//! and overlayfs mounts of those directories ([`Snapshotter::mounts`] has the rule).
//! Layers read lazily from a registry are a later step: [`remote`] is the seam.
//!
//! The parts, each usable without the others:
//!
//! - [`meta`]: the records (redb, one transaction per change) and containerd's rules;
//! - [`filter`]: containerd's filter language, for List;
//! - [`disk`]: the directories and disk usage;
//! - [`Snapshotter`] (here): the operations, putting those together; no gRPC;
//! - [`service`]: the thin tonic adapter, requests in and status codes out;
//! - [`report`]: what `pkgfs status SOCKET` says of the snapshots and their layers;
//! - [`server`]: the socket, the runtime and the signals of `pkgfs snapshotter`;
//! - [`cri`]: the CRI image-service proxy `pkgfs store` serves, bringing kubelet's pull
//!   secrets to the store;
//! - [`api`]: the generated protocol types (checked in, see `api/gen.sh`).

pub mod api;
pub mod cri;
pub mod disk;
pub mod filter;
pub mod meta;
pub mod remote;
pub mod report;
pub mod server;
pub mod service;

use std::path::{Path, PathBuf};

use disk::Dirs;
pub use meta::{Error, Info, Kind, Labels, Result, Usage};
use meta::{Snapshot, Store};
use remote::{LayerRequest, LayerSource, Provided, Unpacked};

/// A mount as containerd's `mount.Mount`: what to mount, from where, how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `bind` or `overlay`.
    pub kind: String,
    /// The directory (bind) or `overlay`.
    pub source: String,
    /// mount(8) options.
    pub options: Vec<String>,
}

/// The snapshotter: its records and its directories under one root.
pub struct Snapshotter {
    store: Store,
    dirs: Dirs,
    source: Box<dyn LayerSource>,
    /// Overlay mounts get `index=off` (the kernel's overlayfs has the option).
    index_off: bool,
}

/// Present when the kernel's overlayfs knows the `index` option.
const OVERLAY_INDEX: &str = "/sys/module/overlay/parameters/index";

impl Snapshotter {
    /// Open (or start) the snapshotter at `root` (`ROOT/metadata.redb`,
    /// `ROOT/snapshots/`), every layer unpacked by containerd.
    pub fn open(root: &Path) -> Result<Snapshotter> {
        Snapshotter::with_source(root, Box::new(Unpacked))
    }

    /// [`Snapshotter::open`] with layers possibly provided by `source`.
    pub fn with_source(root: &Path, source: Box<dyn LayerSource>) -> Result<Snapshotter> {
        std::fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        // Mount options are strings: the paths in them must be absolute and UTF-8.
        let root = root.canonicalize().map_err(|e| Error::io(root, e))?;
        if root.to_str().is_none() || root.to_string_lossy().contains([':', ',']) {
            return Err(Error::InvalidArgument(format!(
                "snapshotter root {}: the path must be UTF-8 without ':' or ',' (it goes into mount options)",
                root.display()
            )));
        }
        let dirs = Dirs::open(&root)?;
        let store = Store::open(&root.join("metadata.redb"))?;
        let s = Snapshotter {
            store,
            dirs,
            source,
            // As containerd's `supportsIndex`: the inode index ties an upper directory
            // to the lower directories it was first mounted with, and layers are shared
            // between mounts.
            index_off: Path::new(OVERLAY_INDEX).exists(),
        };
        s.restore()?;
        Ok(s)
    }

    /// Mount again every committed layer the source provided whose `fs` has nothing
    /// mounted (after a reboot; a restart of the snapshotter alone leaves them mounted).
    /// A layer that cannot be mounted is logged: the containers on it fail to start,
    /// not the snapshotter.
    fn restore(&self) -> Result<()> {
        for info in self.store.list()? {
            if info.kind != Kind::Committed || !info.labels.contains_key(remote::REMOTE) {
                continue;
            }
            let fs = self.dirs.fs(self.store.get(&info.name)?.id);
            if disk::is_mount_point(&fs) {
                continue;
            }
            match self.source.restore(&info.labels, &fs) {
                Ok(true) => log::info!("layer {}: mounted again", info.name),
                Ok(false) => log::warn!(
                    "layer {}: read lazily before, and this snapshotter has no source for it (--store)",
                    info.name
                ),
                Err(e) => log::warn!("layer {}: cannot be mounted again: {e}", info.name),
            }
        }
        Ok(())
    }

    /// `ROOT/snapshots`.
    pub fn snapshots_dir(&self) -> &Path {
        self.dirs.snapshots()
    }

    fn create(&self, kind: Kind, key: &str, parent: &str, labels: Labels) -> Result<Snapshot> {
        let mut made: Option<PathBuf> = None;
        let r = self.store.create(kind, key, parent, labels, |s| {
            made = Some(self.dirs.make(s.id, kind, s.parent_ids.first().copied())?);
            Ok(())
        });
        if r.is_err()
            && let Some(dir) = made
            && let Err(e) = disk::remove_all(&dir)
        {
            log::warn!("snapshot directory left behind: {e}");
        }
        r
    }

    /// A new Active snapshot `key` on the committed `parent` (empty: none); the mounts
    /// of its writable root. With the label [`remote::TARGET`], the layer source is
    /// asked first: a layer it provides is committed under the target name and the
    /// answer is `AlreadyExists`, which tells containerd not to unpack it.
    pub fn prepare(&self, key: &str, parent: &str, labels: Labels) -> Result<Vec<Mount>> {
        let target = labels.get(remote::TARGET).cloned();
        // A layer already committed (the same chain ID, pulled by another image or in
        // another namespace: containerd finds it by its target label) is not provided
        // again.
        if let Some(target) = &target
            && self
                .store
                .stat(target)
                .is_ok_and(|i| i.kind == Kind::Committed)
        {
            return Err(Error::AlreadyExists(format!("target snapshot {target}")));
        }
        let snap = self.create(Kind::Active, key, parent, labels.clone())?;
        if let Some(target) = target {
            let req = LayerRequest {
                key,
                parent,
                target: &target,
                labels: &labels,
            };
            let what = match remote::named_layer(&labels) {
                Some((reference, digest)) => format!("layer {digest} of {reference}"),
                None => format!("layer {target}"),
            };
            let fs = self.dirs.fs(snap.id);
            let provided = self.source.provide(&req, &fs).unwrap_or_else(|e| {
                log::warn!("{what}: {e}");
                Provided::No(e.to_string())
            });
            match provided {
                Provided::No(why) => {
                    log::info!("{what}: unpacked by containerd: {why}");
                    // Kept with the layer for `pkgfs status` (carried over at Commit);
                    // a record that cannot take it must not fail the pull.
                    let noted = self.store.stat(key).and_then(|mut info| {
                        info.labels
                            .insert(remote::UNPACKED.into(), remote::label_value(&why));
                        self.store
                            .update(&info, &[format!("labels.{}", remote::UNPACKED)])
                    });
                    if let Err(e) = noted {
                        log::warn!("{what}: why it was unpacked is not kept: {e}");
                    }
                }
                Provided::Yes(extra) => {
                    log::info!("{what}: read lazily (committed as {target})");
                    let mut labels = labels;
                    labels.extend(extra);
                    // Nothing of a lazily read layer is on this disk: its usage is zero
                    // (as stargz-snapshotter counts its remote layers), and measuring it
                    // would walk the whole layer.
                    let committed = self
                        .store
                        .commit(key, &target, labels, |_| Ok(Usage::default()));
                    return Err(match committed {
                        Ok(_) => Error::AlreadyExists(format!("target snapshot {target}")),
                        Err(e) => {
                            if let Err(e) = self.remove(key) {
                                log::warn!("snapshot {key}: {e}");
                            }
                            e
                        }
                    });
                }
            }
        }
        Ok(self.mounts_of(&snap))
    }

    /// A new View snapshot `key` of the committed `parent`: read-only mounts.
    pub fn view(&self, key: &str, parent: &str, labels: Labels) -> Result<Vec<Mount>> {
        let snap = self.create(Kind::View, key, parent, labels)?;
        Ok(self.mounts_of(&snap))
    }

    /// The mounts of an Active or View snapshot (or, as containerd allows, a committed
    /// one: its bind mount or its parents' overlay).
    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
        Ok(self.mounts_of(&self.store.get(key)?))
    }

    /// containerd 1.6's `overlay.go` `mounts()`, exactly (`userxattr`, for rootless
    /// overlayfs, is never set):
    ///
    /// - no parent: a bind mount of its own `fs`, `rw` if Active, else `ro`;
    /// - Active with parents: overlay with `workdir`, `upperdir` (its own) and
    ///   `lowerdir` (the parents' `fs`, nearest first);
    /// - View with one parent: a read-only bind mount of the parent's `fs`;
    /// - View with more: overlay with `lowerdir` alone.
    ///
    /// Overlay options start with `index=off` where the kernel knows it.
    fn mounts_of(&self, s: &Snapshot) -> Vec<Mount> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let Some(&nearest) = s.parent_ids.first() else {
            let rw = if s.kind == Kind::View { "ro" } else { "rw" };
            return vec![Mount {
                kind: "bind".into(),
                source: path(self.dirs.fs(s.id)),
                options: vec![rw.into(), "rbind".into()],
            }];
        };
        let mut options = Vec::new();
        if self.index_off {
            options.push("index=off".to_string());
        }
        if s.kind == Kind::Active {
            options.push(format!("workdir={}", path(self.dirs.work(s.id))));
            options.push(format!("upperdir={}", path(self.dirs.fs(s.id))));
        } else if s.parent_ids.len() == 1 {
            return vec![Mount {
                kind: "bind".into(),
                source: path(self.dirs.fs(nearest)),
                options: vec!["ro".into(), "rbind".into()],
            }];
        }
        let lower: Vec<String> = s
            .parent_ids
            .iter()
            .map(|&id| path(self.dirs.fs(id)))
            .collect();
        options.push(format!("lowerdir={}", lower.join(":")));
        vec![Mount {
            kind: "overlay".into(),
            source: "overlay".into(),
            options,
        }]
    }

    /// Commit the Active snapshot `key` as `name` with `labels`, measuring its upper
    /// directory for Usage.
    pub fn commit(&self, name: &str, key: &str, mut labels: Labels) -> Result<()> {
        // Why a layer was unpacked stays with it (containerd's labels replace the
        // Active snapshot's at Commit).
        if let Some(why) = self.store.stat(key)?.labels.remove(remote::UNPACKED) {
            labels.entry(remote::UNPACKED.into()).or_insert(why);
        }
        self.store
            .commit(key, name, labels, |id| disk::usage(&self.dirs.fs(id)))
            .map(|_| ())
    }

    /// The root this snapshotter keeps its snapshots and records in.
    pub fn root(&self) -> &Path {
        self.dirs
            .snapshots()
            .parent()
            .unwrap_or(self.dirs.snapshots())
    }

    /// Remove `key`: its record in one transaction, then its directory. Once the record
    /// is gone the removal has happened; a directory that cannot be removed is logged
    /// and left to Cleanup.
    pub fn remove(&self, key: &str) -> Result<()> {
        let (id, _) = self.store.remove(key)?;
        if let Err(e) = disk::remove_snapshot_dir(&self.dirs.dir(id)) {
            log::warn!("snapshot {key} removed, its directory left for Cleanup: {e}");
        }
        Ok(())
    }

    /// The info of `key`.
    pub fn stat(&self, key: &str) -> Result<Info> {
        self.store.stat(key)
    }

    /// Change the labels of `info.name` as the field `paths` say.
    pub fn update(&self, info: &Info, paths: &[String]) -> Result<Info> {
        self.store.update(info, paths)
    }

    /// Disk usage of `key`'s own directory: as recorded at Commit, or measured now for
    /// an Active snapshot (a View's is zero).
    pub fn usage(&self, key: &str) -> Result<Usage> {
        let (snap, recorded) = self.store.usage(key)?;
        match snap.kind {
            Kind::Active => disk::usage(&self.dirs.fs(snap.id)),
            _ => Ok(recorded),
        }
    }

    /// Every snapshot that passes `filters` (containerd's syntax, see [`filter`]), in key
    /// order.
    pub fn list<S: AsRef<str>>(&self, filters: &[S]) -> Result<Vec<Info>> {
        let f = filter::Filters::parse_all(filters)?;
        let mut all = self.store.list()?;
        all.retain(|i| f.matches(i));
        Ok(all)
    }

    /// Remove every directory under `ROOT/snapshots` that no snapshot owns (left by a
    /// crash, or by a Remove whose directory could not go). No snapshot is made or removed
    /// meanwhile.
    pub fn cleanup(&self) -> Result<()> {
        self.store.with_ids_locked(|ids| {
            let dir = self.dirs.snapshots();
            let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(dir, e))?;
                let owned = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|id| ids.contains(&id));
                if !owned && let Err(e) = disk::remove_snapshot_dir(&entry.path()) {
                    log::warn!("cleanup: {e}");
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Snapshotter) {
        let d = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(&d.path().join("root")).unwrap();
        (d, s)
    }

    fn fs_of(s: &Snapshotter, key: &str) -> String {
        s.dirs
            .fs(s.store.get(key).unwrap().id)
            .to_string_lossy()
            .into_owned()
    }

    /// Prepare, write a file, commit: a layer.
    fn layer(s: &Snapshotter, name: &str, parent: &str) {
        let key = format!("extract-{name}");
        s.prepare(&key, parent, Labels::new()).unwrap();
        std::fs::write(Path::new(&fs_of(s, &key)).join(format!("{name}.txt")), name).unwrap();
        s.commit(name, &key, Labels::new()).unwrap();
    }

    #[test]
    fn mounts_are_those_of_containerds_overlayfs_snapshotter() {
        let (_d, s) = open();
        let m = s.prepare("a-key", "", Labels::new()).unwrap();
        let a_fs = fs_of(&s, "a-key");
        assert_eq!(
            m,
            vec![Mount {
                kind: "bind".into(),
                source: a_fs.clone(),
                options: vec!["rw".into(), "rbind".into()],
            }]
        );
        s.commit("a", "a-key", Labels::new()).unwrap();
        layer(&s, "b", "a");
        let b_fs = fs_of(&s, "b");
        // Active on two layers: overlay, lowerdir nearest first.
        let m = s.prepare("c", "b", Labels::new()).unwrap();
        let c = s.store.get("c").unwrap().id;
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].kind.as_str(), m[0].source.as_str()),
            ("overlay", "overlay")
        );
        let index: Vec<String> = s
            .index_off
            .then(|| "index=off".into())
            .into_iter()
            .collect();
        assert_eq!(
            m[0].options,
            [
                index.clone(),
                vec![
                    format!("workdir={}", s.dirs.work(c).display()),
                    format!("upperdir={}", s.dirs.fs(c).display()),
                    format!("lowerdir={b_fs}:{a_fs}"),
                ]
            ]
            .concat()
        );
        assert_eq!(s.mounts("c").unwrap(), m);
        // A view of one layer: its fs, bound read-only.
        let m = s.view("v1", "a", Labels::new()).unwrap();
        assert_eq!(
            m,
            vec![Mount {
                kind: "bind".into(),
                source: a_fs.clone(),
                options: vec!["ro".into(), "rbind".into()],
            }]
        );
        // A view of two: lowerdir alone.
        let m = s.view("v2", "b", Labels::new()).unwrap();
        assert_eq!(m[0].kind, "overlay");
        assert_eq!(
            m[0].options,
            [index, vec![format!("lowerdir={b_fs}:{a_fs}")]].concat()
        );
        // A view of nothing: its own empty fs, read-only.
        let m = s.view("v0", "", Labels::new()).unwrap();
        assert_eq!(m[0].options, vec!["ro".to_string(), "rbind".to_string()]);
        assert_eq!(m[0].source, fs_of(&s, "v0"));
    }

    #[test]
    fn usage_is_measured_for_active_and_recorded_at_commit() {
        let (_d, s) = open();
        s.prepare("k", "", Labels::new()).unwrap();
        let empty = s.usage("k").unwrap();
        assert_eq!(empty.inodes, 1);
        std::fs::write(Path::new(&fs_of(&s, "k")).join("f"), vec![1u8; 65536]).unwrap();
        let grown = s.usage("k").unwrap();
        assert_eq!(grown.inodes, 2);
        assert!(grown.size >= empty.size + 65536);
        s.commit("layer", "k", Labels::new()).unwrap();
        assert_eq!(s.usage("layer").unwrap(), grown);
        // Recorded: a later change on disk is not seen (a committed layer never changes).
        std::fs::write(Path::new(&fs_of(&s, "layer")).join("g"), b"x").unwrap();
        assert_eq!(s.usage("layer").unwrap(), grown);
        assert!(matches!(
            s.usage("missing").unwrap_err(),
            Error::NotFound(_)
        ));
    }

    #[test]
    fn remove_and_cleanup_leave_only_owned_directories() {
        let (_d, s) = open();
        layer(&s, "a", "");
        layer(&s, "b", "a");
        s.prepare("c", "b", Labels::new()).unwrap();
        let ids = |s: &Snapshotter| {
            let mut v: Vec<String> = std::fs::read_dir(s.snapshots_dir())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(ids(&s), ["1", "2", "3"]);
        assert!(matches!(
            s.remove("b").unwrap_err(),
            Error::FailedPrecondition(_)
        ));
        s.remove("c").unwrap();
        assert_eq!(ids(&s), ["1", "2"]);
        // Garbage: a crash's temporary directory, a stray id, a file.
        std::fs::create_dir_all(s.snapshots_dir().join("new-9/fs")).unwrap();
        std::fs::create_dir_all(s.snapshots_dir().join("77/fs")).unwrap();
        std::fs::write(s.snapshots_dir().join("junk"), b"x").unwrap();
        s.cleanup().unwrap();
        assert_eq!(ids(&s), ["1", "2"]);
        s.remove("b").unwrap();
        s.remove("a").unwrap();
        assert!(ids(&s).is_empty());
    }

    #[test]
    fn list_filters_as_containerd_does() {
        let (_d, s) = open();
        layer(&s, "a", "");
        let mut l = Labels::new();
        l.insert("containerd.io/gc.root".into(), "1".into());
        s.prepare("k", "a", l).unwrap();
        let names = |f: &[&str]| -> Vec<String> {
            s.list(f).unwrap().into_iter().map(|i| i.name).collect()
        };
        assert_eq!(names(&[]), ["a", "k"]);
        assert_eq!(names(&["parent==a"]), ["k"]);
        assert_eq!(names(&["kind==committed"]), ["a"]);
        assert_eq!(names(&[r#"labels."containerd.io/gc.root""#]), ["k"]);
        assert_eq!(names(&["name==a", "name==k"]), ["a", "k"]);
        assert!(matches!(s.list(&["name=="]).unwrap_err(), Error::Filter(_)));
    }

    #[test]
    fn a_failed_prepare_leaves_no_directory() {
        let (_d, s) = open();
        layer(&s, "a", "");
        assert!(s.prepare("a", "", Labels::new()).is_err());
        assert!(s.prepare("x", "missing", Labels::new()).is_err());
        let n = std::fs::read_dir(s.snapshots_dir()).unwrap().count();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_root_that_cannot_go_into_mount_options_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = Snapshotter::open(&d.path().join("a:b")).err().unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }

    /// A layer source that provides layers whose digest label it knows.
    struct Fake;

    impl LayerSource for Fake {
        fn provide(&self, req: &LayerRequest<'_>, fs: &Path) -> Result<Provided> {
            match req.labels.get(remote::LAYER_DIGEST).map(String::as_str) {
                Some("sha256:known") => {
                    std::fs::write(fs.join("provided"), req.target).unwrap();
                    Ok(Provided::Yes(Labels::from([(
                        remote::REMOTE.to_string(),
                        "fake".to_string(),
                    )])))
                }
                Some("sha256:broken") => Err(Error::InvalidArgument("broken".into())),
                _ => Ok(Provided::No("unknown".into())),
            }
        }
    }

    #[test]
    fn a_provided_layer_is_committed_under_its_target_and_answers_already_exists() {
        let d = tempfile::tempdir().unwrap();
        let s = Snapshotter::with_source(d.path(), Box::new(Fake)).unwrap();
        let labels = |digest: &str| {
            let mut l = Labels::new();
            l.insert(remote::TARGET.into(), "sha256:chain".into());
            l.insert(remote::LAYER_DIGEST.into(), digest.into());
            l
        };
        let e = s
            .prepare("extract-1", "", labels("sha256:known"))
            .unwrap_err();
        assert!(matches!(e, Error::AlreadyExists(_)), "{e}");
        let info = s.stat("sha256:chain").unwrap();
        assert_eq!(info.kind, Kind::Committed);
        // The request's labels and the source's, and no usage: nothing is on this disk.
        assert_eq!(info.labels[remote::REMOTE], "fake");
        assert_eq!(info.labels[remote::LAYER_DIGEST], "sha256:known");
        assert_eq!(s.usage("sha256:chain").unwrap(), Usage::default());
        assert!(matches!(
            s.stat("extract-1").unwrap_err(),
            Error::NotFound(_)
        ));
        let fs = fs_of(&s, "sha256:chain");
        assert_eq!(
            std::fs::read(Path::new(&fs).join("provided")).unwrap(),
            b"sha256:chain"
        );
        // The same layer again (another image, another namespace): already there, the
        // source is not asked (a broken source would fail), no Active snapshot is made.
        let mut again = labels("sha256:broken");
        again.insert(remote::IMAGE_REF.into(), "other/image:1".into());
        let e = s.prepare("extract-2", "", again).unwrap_err();
        assert!(matches!(e, Error::AlreadyExists(_)), "{e}");
        assert!(matches!(
            s.stat("extract-2").unwrap_err(),
            Error::NotFound(_)
        ));
        // Not known, or failing: an ordinary Active snapshot for containerd to unpack into.
        for digest in ["sha256:other", "sha256:broken"] {
            let key = format!("extract-{digest}");
            let mut l = labels(digest);
            l.insert(remote::TARGET.into(), format!("chain-of-{digest}"));
            let m = s.prepare(&key, "", l).unwrap();
            assert_eq!(m[0].options, vec!["rw".to_string(), "rbind".to_string()]);
            assert_eq!(s.stat(&key).unwrap().kind, Kind::Active);
        }
    }
}
