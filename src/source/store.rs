//! `pkgfs store`: an additional layer store for podman and CRI-O.
//!
//! containers/storage (the storage library of podman, buildah, skopeo and CRI-O), with
//! `additionallayerstores = ["MOUNTPOINT:ref"]` in `storage.conf`, asks such a store for
//! each layer it is about to pull: it looks up `MOUNTPOINT/BASE64(REF)/DIGEST/` and, if
//! `diff`, `info` and `blob` are there, takes the layer from the store instead of
//! downloading it. `REF` is the image reference as pulled (`127.0.0.1:5000/deb:latest`),
//! `DIGEST` the layer's digest in the manifest (containers/storage 1.43, podman 4.x; from
//! 1.54, podman 5.1, the digest of a zstd:chunked or eStargz layer's table of contents
//! instead, see docs/SEMANTICS.md). In it:
//!
//! - `diff/`: that layer alone, overlay-native, as overlayfs takes it for a lower layer: a
//!   whiteout `.wh.NAME` is a character device `NAME` numbered 0/0, an opaque-directory
//!   marker `.wh..wh..opq` the xattr `trusted.overlay.opaque=y` on its directory;
//! - `info`: containers/storage's layer record as JSON (`compressed-diff-digest`,
//!   `compressed-size`, `diff-digest` from the config's `rootfs.diff_ids`, `diff-size`
//!   where an annotation gives it, `compression`);
//! - `blob`: the layer as the registry holds it (for push and save).
//!
//! Nothing is listed: names come to be when they are looked up ([`crate::fs::Grow`]), the
//! image resolved then (manifest, config; a tag again when a digest it does not list is
//! asked for, at most every [`REFRESH`]). A layer's `diff` is indexed on first look (a
//! graft, as a layout's package), by the same formats and checks as `pkgfs mount
//! docker://`. The store is mounted writable only so that containers/storage's signals
//! arrive: creating `DIGEST/use` (a layer taken into use) and removing the `DIGEST`
//! directory (released) are counted and answered `ENOENT`, as the protocol asks of a
//! store that takes notice; everything else is refused.
//!
//! The encoded reference is one path component: base64 writes `/` only for a sextet of
//! all ones, which needs a byte whose low six bits are set (`?`, DEL or beyond ASCII),
//! and no reference holds one.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use log::{info, warn};

use super::candidate::Candidate;
use super::image::{self, ImageLayer, ImageRef, Platform};
use super::lazy::LazyContext;
use super::report::log_graft;
use crate::error::{Error, Result};
use crate::format::{self, Entry, EntryKind, Indexed, Loc};
use crate::fs::{Generation, Grow};
use crate::io::registry::Registries;
use crate::layout::inline_file;
use crate::sync::lock;
use crate::tree::view::{Graft, GraftSource, Layer};
use crate::tree::{OPAQUE_WHITEOUT, Ownership, Tree, TreeBuilder, WHITEOUT_PREFIX};

/// A tag is asked for again when a digest it did not list is looked up, at most this
/// often (podman looks up each layer three times, `diff`, `info`, `blob`).
pub const REFRESH: Duration = Duration::from_secs(5);
/// A reference that failed to resolve is not tried again before this (each of podman's
/// lookups would otherwise wait for the registry's timeout again).
const FAILED_HOLD: Duration = Duration::from_secs(10);
/// Longest encoded reference (a reference is at most 4096 bytes).
const MAX_ENCODED: usize = 5464;
/// containers/storage's `archive.Compression` numbers.
const UNCOMPRESSED: u32 = 0;
const GZIP: u32 = 2;
const ZSTD: u32 = 4;

/// What the store is told at start.
pub struct StoreOptions {
    /// Owner of entries that have none and of the store's own directories.
    pub owner: Ownership,
    /// Where indexes that cost a pass are kept.
    pub index_cache: Option<format::IndexCache>,
    /// Which image of a multi-platform index.
    pub platform: Option<Platform>,
}

/// The store: the references looked up so far, and what it made of them.
pub struct LayerStore {
    opts: StoreOptions,
    registries: Box<dyn Fn() -> Result<Arc<Registries>> + Send + Sync>,
    cx: Arc<LazyContext>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By encoded name.
    refs: BTreeMap<Vec<u8>, RefDir>,
    /// Names that failed to resolve, and when.
    failed: BTreeMap<Vec<u8>, Instant>,
}

/// An image reference's directory.
struct RefDir {
    reference: String,
    image: ImageRef,
    /// Every layer any resolution of it listed, by digest.
    layers: BTreeMap<String, Arc<StoreLayer>>,
    resolved: Instant,
    /// The image as last resolved (for `pkgfs status`).
    summary: crate::source::image::ImageSummary,
}

/// One layer of the store.
struct StoreLayer {
    layer: Arc<ImageLayer>,
    info: Vec<u8>,
    diff: Arc<Graft>,
    /// `blob`: the layer as stored, and its entry.
    blob: Arc<format::Archive>,
    blob_entry: Entry,
    /// Taken into use (`use` created) less released (`rmdir`).
    uses: AtomicU64,
    released: AtomicU64,
}

impl LayerStore {
    /// A store resolving images through `registries` (made on first use).
    pub fn new(
        opts: StoreOptions,
        registries: Box<dyn Fn() -> Result<Arc<Registries>> + Send + Sync>,
    ) -> Self {
        let cx = Arc::new(LazyContext {
            owner: opts.owner,
            index_cache: opts.index_cache.clone(),
        });
        LayerStore {
            opts,
            registries,
            cx,
            state: Mutex::new(State::default()),
        }
    }

    /// The first generation: an empty root.
    pub fn empty_tree(&self) -> Tree {
        TreeBuilder::new(self.opts.owner).finish()
    }

    /// Resolve `reference` (as containers/storage names it, without `docker://`).
    fn resolve(&self, reference: &str) -> Result<(ImageRef, image::Image)> {
        let r = ImageRef::parse(std::ffi::OsStr::new(&format!("docker://{reference}")))
            .ok_or_else(|| Error::Format(format!("{reference:?} is not an image reference")))?;
        let img = image::resolve(&r, self.opts.platform.as_ref(), &*self.registries)?;
        Ok((r, img))
    }

    /// The layers of `img` the store does not have yet, made.
    fn add_layers(&self, dir: &mut RefDir, img: &image::Image) {
        for l in &img.layers {
            let key = l.check.digest.to_string();
            if dir.layers.contains_key(&key) {
                continue;
            }
            let layer = Arc::new(l.clone());
            let (blob, blob_entry) = format::raw::archive(l.blob.clone(), b"blob", 0o444);
            let blob = Arc::new(blob);
            let cand = Candidate {
                path: l.name.clone(),
                explicit: true,
                layer: Some(layer.clone()),
                blob: None,
                refused: None,
                sealed: None,
            };
            let ahead = Arc::new(Ahead::default());
            if l.blob.round_trips() {
                let (ahead, cx, cand) = (ahead.clone(), self.cx.clone(), cand.clone());
                let spawned = std::thread::Builder::new()
                    .name("pkgfs-open-ahead".into())
                    .spawn(move || ahead.open(&cx, &cand));
                if let Err(e) = spawned {
                    warn!("{}: not opened ahead: {e}", l.name.display());
                }
            }
            let made = |info: Vec<u8>| {
                Arc::new(StoreLayer {
                    info,
                    // Each directory its own graft: a graft's inodes hang off one place.
                    diff: Arc::new(Graft::new(Box::new(LayerDiff {
                        cand: cand.clone(),
                        version: l.check.digest.to_string(),
                        cx: self.cx.clone(),
                        ahead: ahead.clone(),
                    }))),
                    layer: layer.clone(),
                    blob: blob.clone(),
                    blob_entry: blob_entry.clone(),
                    uses: AtomicU64::new(0),
                    released: AtomicU64::new(0),
                })
            };
            // containers/storage 1.54 and later (podman 5.1) ask for a zstd:chunked or
            // eStargz layer by the digest of its table of contents.
            if let Some(toc) = l.check.toc_blob.as_ref().or(l.check.toc_json.as_ref()) {
                dir.layers
                    .insert(toc.to_string(), made(info_by_toc_json(l, toc)));
            }
            dir.layers.insert(key, made(info_json(l)));
        }
        dir.summary = img.summary();
        dir.resolved = Instant::now();
    }

    /// The tree of everything looked up so far.
    fn generation(&self, st: &State) -> Generation {
        let mut own: Vec<Entry> = Vec::new();
        let mut b = TreeBuilder::new(self.opts.owner);
        let mut layers: Vec<Layer> = vec![Layer::new(
            crate::layout::own_archive("store", Vec::new()),
            0,
        )];
        let mut grafts: Vec<Arc<Graft>> = Vec::new();
        let mut blobs: Vec<(u32, i64, Entry)> = Vec::new();
        let dir = |path: &[u8]| crate::layout::dir(path, 0o555, 0);
        let mut graft_paths: Vec<Vec<u8>> = Vec::new();
        for (name, r) in &st.refs {
            own.push(dir(name));
            for (digest, l) in &r.layers {
                let at = |leaf: &str| {
                    let mut p = name.clone();
                    p.push(b'/');
                    p.extend_from_slice(digest.as_bytes());
                    if !leaf.is_empty() {
                        p.push(b'/');
                        p.extend_from_slice(leaf.as_bytes());
                    }
                    p
                };
                own.push(dir(&at("")));
                own.push(inline_file(&at("info"), &l.info, 0o444, 0));
                let mut entry = l.blob_entry.clone();
                entry.path = at("blob");
                blobs.push((layers.len() as u32, entry.mtime, entry));
                layers.push(Layer::new(l.blob.clone(), 1));
                grafts.push(l.diff.clone());
                graft_paths.push(at("diff"));
            }
        }
        b.add_layer(0, 0, &own);
        let n = own.len();
        layers[0] = Layer::new(crate::layout::own_archive("store", own), n);
        for (idx, mtime, entry) in &blobs {
            b.add_layer(*idx, *mtime, std::slice::from_ref(entry));
        }
        for (i, p) in graft_paths.iter().enumerate() {
            let comps: Vec<&[u8]> = p.split(|&c| c == b'/').collect();
            if !b.add_graft(&comps, i as u32, u32::MAX, 0) {
                warn!("store: {} is taken", String::from_utf8_lossy(p));
            }
        }
        (b.finish(), layers, grafts)
    }

    /// A lookup of `name` in the root: an encoded reference.
    fn grow_ref(&self, st: &mut State, name: &[u8]) -> Result<bool> {
        if name.len() > MAX_ENCODED || !name.iter().all(|&c| is_base64(c)) {
            return Ok(false);
        }
        if let Some(t) = st.failed.get(name)
            && t.elapsed() < FAILED_HOLD
        {
            return Err(Error::Io(std::io::Error::other(format!(
                "{}: failed to resolve moments ago",
                String::from_utf8_lossy(name)
            ))));
        }
        let Some(reference) = decode_ref(name) else {
            return Ok(false);
        };
        let (image, img) = match self.resolve(&reference) {
            Ok(x) => x,
            Err(e) => {
                warn!("store: {reference}: {e}");
                st.failed.insert(name.to_vec(), Instant::now());
                return Err(e);
            }
        };
        st.failed.remove(name);
        info!(
            "store: {reference}: {} layers (manifest {})",
            img.layers.len(),
            img.manifest
                .as_ref()
                .map_or("?".into(), ToString::to_string)
        );
        let mut dir = RefDir {
            reference,
            image,
            layers: BTreeMap::new(),
            resolved: Instant::now(),
            summary: img.summary(),
        };
        self.add_layers(&mut dir, &img);
        st.refs.insert(name.to_vec(), dir);
        Ok(true)
    }

    /// A lookup of a digest in a reference's directory that missed: the tag again, if it
    /// may have moved.
    fn grow_layer(&self, st: &mut State, dir: &[u8], name: &[u8]) -> Result<bool> {
        let Some(r) = st.refs.get_mut(dir) else {
            return Ok(false);
        };
        let wanted = String::from_utf8_lossy(name).into_owned();
        let pinned = r
            .image
            .registry
            .as_ref()
            .is_some_and(|x| x.digest.is_some());
        if pinned || crate::io::digest::Digest::parse(&wanted).is_err() {
            return Ok(false);
        }
        if r.resolved.elapsed() < REFRESH {
            return Ok(false);
        }
        r.resolved = Instant::now();
        let reference = r.reference.clone();
        let (_, img) = self.resolve(&reference)?;
        let r = st
            .refs
            .get_mut(dir)
            .ok_or_else(|| Error::Internal("store: reference gone".into()))?;
        self.add_layers(r, &img);
        Ok(r.layers.contains_key(&wanted))
    }
}

impl StoreState for LayerStore {
    fn images(&self) -> Vec<crate::source::image::ImageSummary> {
        lock(&self.state)
            .refs
            .values()
            .map(|r| r.summary.clone())
            .collect()
    }

    fn layers(&self) -> Vec<StoreLayerRow> {
        let st = lock(&self.state);
        st.refs
            .values()
            .flat_map(|r| {
                r.layers.iter().map(|(d, l)| StoreLayerRow {
                    reference: r.reference.clone(),
                    digest: d.clone(),
                    media_type: l.layer.media_type.clone(),
                    indexed: l.diff.indexed().is_some(),
                    error: l.diff.error().map(ToString::to_string),
                    uses: l.uses.load(Relaxed),
                    released: l.released.load(Relaxed),
                    fetched_bytes: l.layer.blob.fetched().unwrap_or(0),
                })
            })
            .collect()
    }
}

impl Grow for LayerStore {
    fn grow(&self, dir: &[u8], name: &[u8]) -> Result<Option<Generation>> {
        let mut st = lock(&self.state);
        let grown = if dir.is_empty() {
            self.grow_ref(&mut st, name)?
        } else {
            self.grow_layer(&mut st, dir, name)?
        };
        Ok(grown.then(|| self.generation(&st)))
    }

    /// `DIGEST/use` only: any other create is a write, refused (`EROFS`).
    fn created(&self, dir: &[u8], name: &[u8]) -> bool {
        if name != b"use" {
            return false;
        }
        let Some(l) = self.layer_at(dir) else {
            return false;
        };
        let n = l.uses.fetch_add(1, Relaxed) + 1;
        info!("store: {} taken into use ({n})", l.layer.name.display());
        true
    }

    fn removed(&self, dir: &[u8], name: &[u8]) {
        let mut path = dir.to_vec();
        path.push(b'/');
        path.extend_from_slice(name);
        if let Some(l) = self.layer_at(&path) {
            let n = l.released.fetch_add(1, Relaxed) + 1;
            info!("store: {} released ({n})", l.layer.name.display());
        }
    }
}

impl LayerStore {
    /// The layer whose directory is `path` (`ENCODED/DIGEST`).
    fn layer_at(&self, path: &[u8]) -> Option<Arc<StoreLayer>> {
        let i = path.iter().rposition(|&c| c == b'/')?;
        let (dir, digest) = (&path[..i], &path[i + 1..]);
        let st = lock(&self.state);
        st.refs
            .get(dir)?
            .layers
            .get(std::str::from_utf8(digest).ok()?)
            .cloned()
    }
}

fn is_base64(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'+' || c == b'='
}

/// The reference an encoded name stands for, if it decodes to one.
fn decode_ref(encoded: &[u8]) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let s = String::from_utf8(bytes).ok()?;
    crate::io::registry::Reference::parse(&s).ok()?;
    Some(s)
}

/// containers/storage's layer record for `l` (its `Layer` struct as JSON: the fields an
/// additional layer store fills).
fn info_json(l: &ImageLayer) -> Vec<u8> {
    let compression = compression(l);
    let mut v = serde_json::json!({
        "compressed-diff-digest": l.check.digest.to_string(),
        "compressed-size": l.blob.size(),
        "compression": compression,
    });
    if let Some(d) = &l.diff_id {
        v["diff-digest"] = d.to_string().into();
    }
    if let Some(n) = l.diff_size {
        v["diff-size"] = n.into();
    }
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

/// The layer record of `l` asked for by the digest `toc` of its table of contents
/// (containers/storage 1.54 and later): what stargz-store gives there, the table's
/// digest (which containers/image checks), the compression, the size where known (-1
/// otherwise) and the diff digest the config expects as a flag; no compressed digest,
/// since a layer taken by its table is not claimed to be that blob.
fn info_by_toc_json(l: &ImageLayer, toc: &crate::io::digest::Digest) -> Vec<u8> {
    let compression = compression(l);
    let mut v = serde_json::json!({
        "diff-size": l.diff_size.map_or(-1, |n| n as i64),
        "compression": compression,
        "toc-digest": toc.to_string(),
    });
    if let Some(d) = &l.diff_id {
        v["flags"] = serde_json::json!({ "expected-layer-diffid": d.to_string() });
    }
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

/// containers/storage's number for the layer's compression, from its media type
/// (`…tar+gzip`, `…tar.gzip`, `…tar+zstd`; a plain `…tar` is uncompressed).
fn compression(l: &ImageLayer) -> u32 {
    if l.media_type.contains("zstd") {
        ZSTD
    } else if l.media_type.contains("gzip") {
        GZIP
    } else {
        UNCOMPRESSED
    }
}

/// A layer's `diff`: the layer alone, overlay-native, indexed on first look.
#[derive(Debug)]
struct LayerDiff {
    cand: Candidate,
    version: String,
    cx: Arc<LazyContext>,
    /// The layer opened ahead (shared by the names it has in the store).
    ahead: Arc<Ahead>,
}

/// A layer opened ahead of overlayfs's first look into its `diff`: every layer of an
/// image, in parallel, once the image resolves. A pull prepares layers one after
/// another, and each open waits for round trips (the footer, the table of contents)
/// that need not wait for the layer before (the second layer of python's image opened
/// 0.13 s after the first).
#[derive(Default, Debug)]
struct Ahead(std::sync::OnceLock<Mutex<Option<Result<Indexed>>>>);

impl Ahead {
    /// Open it now (or wait for the open under way).
    fn open(&self, cx: &LazyContext, cand: &Candidate) {
        self.0.get_or_init(|| Mutex::new(Some(cx.open(cand))));
    }

    /// The open's result: the one made ahead, once; after that, opened again.
    fn take(&self, cx: &LazyContext, cand: &Candidate) -> Result<Indexed> {
        let slot = self.0.get_or_init(|| Mutex::new(Some(cx.open(cand))));
        let taken = crate::sync::lock(slot).take();
        taken.unwrap_or_else(|| cx.open(cand))
    }
}

impl GraftSource for LayerDiff {
    fn name(&self) -> &std::path::Path {
        &self.cand.path
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn index(&self) -> Result<(Tree, Vec<Layer>)> {
        let started = Instant::now();
        let Indexed { archive, entries } = self.ahead.take(&self.cx, &self.cand)?;
        let entries = overlay_native(entries);
        let mtime = archive.mtime();
        let mut b = TreeBuilder::new(self.cx.owner);
        b.add_layer(0, mtime, &entries);
        let tree = b.finish();
        log_graft(&self.cand.path, &tree, entries.len(), started);
        Ok((tree, vec![Layer::new(Arc::new(archive), entries.len())]))
    }
}

/// A layer's entries as overlayfs takes a lower layer: `.wh.NAME` becomes a character
/// device `NAME` numbered 0/0 (mode 0), `.wh..wh..opq` the xattr
/// `trusted.overlay.opaque=y` on its directory (the directory made if the layer does not
/// hold it). Other `.wh..wh.` names (reserved by the OCI spec) are dropped.
pub fn overlay_native(entries: Vec<Entry>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::with_capacity(entries.len());
    let mut opaque: Vec<(Vec<u8>, i64)> = Vec::new();
    for mut e in entries {
        let trimmed = trim_slashes(&e.path);
        let (parent, leaf) = match trimmed.iter().rposition(|&c| c == b'/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (&b""[..], trimmed),
        };
        if leaf == OPAQUE_WHITEOUT {
            opaque.push((normal(parent), e.mtime));
            continue;
        }
        let Some(hidden) = leaf.strip_prefix(WHITEOUT_PREFIX) else {
            out.push(e);
            continue;
        };
        if hidden.starts_with(WHITEOUT_PREFIX) || hidden.is_empty() {
            continue;
        }
        let mut path = parent.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(hidden);
        e.path = path;
        e.kind = EntryKind::CharDev;
        e.perm = 0;
        e.rdev = 0;
        e.size = 0;
        e.data = Loc::None;
        e.link = Vec::new();
        e.xattrs = Vec::new();
        out.push(e);
    }
    for (dir, mtime) in opaque {
        let found = out
            .iter_mut()
            .filter(|e| e.kind == EntryKind::Dir && normal(trim_slashes(&e.path)) == dir)
            .last();
        let xattr = (b"trusted.overlay.opaque".to_vec(), b"y".to_vec());
        match found {
            Some(e) => e.xattrs.push(xattr),
            None if !dir.is_empty() => out.push(Entry {
                uid: Some(0),
                gid: Some(0),
                xattrs: vec![xattr],
                ..crate::layout::dir(&dir, 0o755, mtime)
            }),
            // The root is never opaque to overlayfs (it is the layer).
            None => {}
        }
    }
    out
}

fn trim_slashes(p: &[u8]) -> &[u8] {
    let mut p = p;
    while let Some(rest) = p.strip_suffix(b"/") {
        p = rest;
    }
    p
}

/// `p` with `./` components and repeated slashes gone (how two spellings of one
/// directory in a tar compare).
fn normal(p: &[u8]) -> Vec<u8> {
    p.split(|&c| c == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect::<Vec<_>>()
        .join(&b'/')
}

impl std::fmt::Debug for LayerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerStore").finish_non_exhaustive()
    }
}

/// What `pkgfs store` has resolved, as `pkgfs status` shows it.
pub trait StoreState: Send + Sync + std::fmt::Debug {
    /// The images looked up so far.
    fn images(&self) -> Vec<crate::source::image::ImageSummary>;
    /// Their layers.
    fn layers(&self) -> Vec<StoreLayerRow>;
}

/// One layer of a `pkgfs store`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StoreLayerRow {
    /// The image reference, as containers/storage names it.
    pub reference: String,
    /// The layer's digest.
    pub digest: String,
    /// Its media type.
    pub media_type: String,
    /// `diff` has been indexed.
    pub indexed: bool,
    /// Why its index failed, if it did.
    pub error: Option<String>,
    /// Times containers/storage took it into use (`use` created).
    pub uses: u64,
    /// Times it was released (`rmdir`).
    pub released: u64,
    /// Bytes of it fetched from the registry by this process.
    pub fetched_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> Entry {
        inline_file(path.as_bytes(), b"x", 0o644, 7)
    }

    fn dir(path: &str) -> Entry {
        Entry {
            kind: EntryKind::Dir,
            size: 0,
            data: Loc::None,
            perm: 0o755,
            ..file(path)
        }
    }

    #[test]
    fn whiteouts_become_what_overlayfs_reads() {
        let got = overlay_native(vec![
            dir("./etc/"),
            file("./etc/.wh.motd"),
            dir("opt/x/"),
            file("opt/x/.wh..wh..opq"),
            file("var/lib/.wh..wh..opq"),
            file(".wh.root-gone"),
            file("usr/.wh..wh..plnk"),
            file("usr/keep"),
        ]);
        let find = |p: &str| {
            got.iter()
                .find(|e| normal(trim_slashes(&e.path)) == p.as_bytes())
        };
        let motd = find("etc/motd").unwrap();
        assert_eq!(
            (motd.kind, motd.rdev, motd.perm, motd.size),
            (EntryKind::CharDev, 0, 0, 0)
        );
        assert_eq!(find("root-gone").unwrap().kind, EntryKind::CharDev);
        let opq = (b"trusted.overlay.opaque".to_vec(), b"y".to_vec());
        assert_eq!(find("opt/x").unwrap().xattrs, vec![opq.clone()]);
        // A marker whose directory the layer does not list makes it.
        let var = find("var/lib").unwrap();
        assert_eq!((var.kind, var.xattrs.clone()), (EntryKind::Dir, vec![opq]));
        assert!(find("etc").unwrap().xattrs.is_empty());
        assert!(got.iter().all(|e| !e.path.windows(4).any(|w| w == b".wh.")));
        assert!(find("usr/keep").is_some());
    }

    #[test]
    fn names_decode_to_references_or_are_their_start() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            decode_ref(enc("127.0.0.1:5000/deb:latest").as_bytes()).as_deref(),
            Some("127.0.0.1:5000/deb:latest")
        );
        assert_eq!(decode_ref(b"bm90IGEgcmVm"), None); // "not a ref"
        assert_eq!(decode_ref(b"abc"), None);
        // No reference encodes to a `/` (or a `+`): one path component each.
        let chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@";
        for a in chars.chars() {
            for b in chars.chars() {
                for c in chars.chars() {
                    let e = enc(&format!("{a}{b}{c}"));
                    assert!(!e.contains('/') && !e.contains('+'), "{a}{b}{c}: {e}");
                }
            }
        }
    }

    #[test]
    fn info_is_the_layer_record_containers_storage_reads() {
        let blob: Arc<dyn crate::io::blob::Blob> =
            Arc::new(crate::io::blob::Bytes::new("l", vec![1u8; 42]));
        let digest =
            crate::io::digest::Digest::parse(&format!("sha256:{}", "a".repeat(64))).unwrap();
        let diff = crate::io::digest::Digest::parse(&format!("sha256:{}", "b".repeat(64))).unwrap();
        let l = ImageLayer {
            name: "l".into(),
            blob,
            check: format::LayerCheck {
                digest: digest.clone(),
                of: format::DigestOf::Blob,
                toc_blob: None,
                toc_json: None,
                ztoc: None,
            },
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            background_fetch: false,
            diff_id: Some(diff.clone()),
            diff_size: Some(1000),
            start: None,
        };
        let v: serde_json::Value = serde_json::from_slice(&info_json(&l)).unwrap();
        assert_eq!(v["compressed-diff-digest"], digest.to_string());
        assert_eq!(v["compressed-size"], 42);
        assert_eq!(v["diff-digest"], diff.to_string());
        assert_eq!(v["diff-size"], 1000);
        assert_eq!(v["compression"], 2);
        // Asked for by its table of contents (podman 5.1 and later).
        let toc = crate::io::digest::Digest::parse(&format!("sha256:{}", "c".repeat(64))).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&info_by_toc_json(&l, &toc)).unwrap();
        assert_eq!(v["toc-digest"], toc.to_string());
        assert_eq!(v["diff-size"], 1000);
        assert_eq!(v["flags"]["expected-layer-diffid"], diff.to_string());
        assert!(v.get("compressed-diff-digest").is_none());
    }
}
