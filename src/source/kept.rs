//! A kept tree: the first scan of a mount, loaded whole from the index cache when the
//! packages, the layout's inputs and the binary are those of an earlier mount that
//! stored it, instead of opening every archive and folding every index again.
//!
//! Why: a mount's cost is reading N indexes and folding them (609 packages: about
//! 0.15 s; a Python environment of 128 archives: about 0.25 s), while what it makes
//! depends only on those inputs. With the tree kept, a mount costs listing and
//! `stat`ing the packages, opening their files, and reading one record.
//!
//! - **Where and what from**: a record's file is named by the sources and the merge
//!   settings (ownership, whiteouts, the layout's configuration: [`Keeping::start`]);
//!   inside, it names what it was made from ([`Keeping::of`]): this binary's identity,
//!   the files the layout reads besides the packages (a lockfile, an interpreter), and
//!   every package's path and stamp (device, inode, size, mtime) in layer order. Any
//!   change and the scan runs as before, its result kept in place of the old record.
//! - **Read while the packages are listed**: the record is read, checked and parsed on
//!   a thread of its own (`pkgfs-kept`) from before the listing; once the packages are
//!   `stat`ed, what it was made from is compared, and only then are packages opened,
//!   while the rest of the record is parsed.
//! - **Kept only when the scan is whole**: local packages only (no image, remote
//!   object or seal: those have their own caches and checks), a layout that folds
//!   (by-name layouts are lazy already), no work left behind (python's bytecode
//!   still to compile: the next mount's packs change the key anyway), no archive
//!   skipped for a passing reason (an I/O error).
//! - **Archives are read on first use** ([`Deferred`]): each is opened at mount (its
//!   file, not its index) and checked to be the version the key named; its index is
//!   read by the first request that needs it, and must have as many entries as when
//!   the tree was kept, or its reads fail with `EIO`, logged.
//! - **The record** is the layers (which package, or the layout's own entries: their
//!   bytes are in the tree's members, which serve them, so the layout's own list is
//!   kept without them), what the scan skipped and ignored, then the tree
//!   ([`crate::tree::kept`]) and its numbering digest, then a CRC-32 of all of it. A
//!   damaged record is a miss, logged, never trusted. Its format is this binary's: the
//!   binary's identity is among the inputs, so no build reads another's record.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, mpsc};

use log::{debug, warn};
use sha2::Digest as _;

use crate::error::{Error, Result};
use crate::format::Loc;
use crate::format::{
    Archive, Entry, EntryKind, IndexCache, IndexOrigin, OpenContext, OpenError, Package, Reading,
};
use crate::io::blob::Blob;
use crate::tree::Tree;
use crate::tree::kept::{Damaged, Dec, Decoded, Enc, decode_loc, encode_loc};
use crate::tree::view::Layer;

use super::fold::{Active, Provided};
use super::report::LoadReport;
use super::{Listed, LoadOptions};

/// First bytes of a record (after the index cache's own header).
const MAGIC: &[u8] = b"pkgfs-kept-scan 3\n";

/// A first scan's record, being read while the packages are listed ([`Keeping::start`]).
pub(super) struct Early {
    cache: IndexCache,
    slot: crate::format::cache::CacheKey,
    ahead: mpsc::Receiver<Ahead>,
}

/// Where a scan's result is kept, if it may be.
pub(super) struct Keeping {
    cache: IndexCache,
    /// The record's file: one per mount of these sources with these settings, so a
    /// change of packages replaces the record rather than adding one.
    slot: crate::format::cache::CacheKey,
    /// What the record must have been made from: this binary, the layout's input files
    /// and every package as they are now.
    inputs: [u8; 32],
    /// The record as it is read ahead, until [`Keeping::load`] takes it.
    ahead: Option<mpsc::Receiver<Ahead>>,
}

/// A scan loaded from its record.
pub(super) struct KeptScan {
    pub(super) tree: Tree,
    /// The tree's numbering digest (`fs::tree_digest`), as the fold computed it.
    pub(super) digest: String,
    pub(super) layers: Vec<Layer>,
    pub(super) report: LoadReport,
    pub(super) active: Vec<Active>,
}

impl Keeping {
    /// Before the packages are listed: the record of a mount of `sources` with these
    /// settings, read and parsed on a thread meanwhile; `None` if a scan of this kind
    /// is never kept (see the module documentation).
    pub(super) fn start(opts: &LoadOptions, sources: &[PathBuf], by_name: bool) -> Option<Early> {
        let cache = opts.index_cache.clone()?;
        if by_name || opts.verify.is_some() {
            return None;
        }
        let mut slot = format!("{:?}\n{}\n{:?}\n", opts.owner, opts.whiteouts, opts.layout);
        for s in sources {
            slot.push_str(&format!("{}\n", s.display()));
        }
        let slot = cache.key_for("tree", &slot, "");
        let ahead = read_ahead(cache.clone(), slot.clone());
        Some(Early { cache, slot, ahead })
    }

    /// After the listing: where the first scan of `listed` is kept, if it may be (no
    /// image, every package a local file), and what its record must have been made
    /// from.
    pub(super) fn of(early: Early, opts: &LoadOptions, listed: &Listed) -> Option<Keeping> {
        if !listed.images.is_empty() || listed.candidates.is_empty() {
            return None;
        }
        let mut h = sha2::Sha256::new();
        h.update(MAGIC);
        h.update(file_identity(&std::env::current_exe().ok()?).as_bytes());
        for input in [&opts.layout.lockfile, &opts.layout.python]
            .into_iter()
            .flatten()
        {
            h.update(file_identity(input).as_bytes());
        }
        for (c, st) in listed.candidates.iter().zip(&listed.stamps) {
            if c.layer.is_some() || c.blob.is_some() || c.sealed.is_some() || c.refused.is_some() {
                return None;
            }
            h.update(c.path.as_os_str().as_encoded_bytes());
            h.update([0, u8::from(c.explicit)]);
            h.update(st.as_deref()?.as_bytes());
            h.update([b'\n']);
        }
        Some(Keeping {
            cache: early.cache,
            slot: early.slot,
            inputs: h.finalize().into(),
            ahead: Some(early.ahead),
        })
    }

    /// The kept scan, if there is a record and it still describes `listed` (made from
    /// the same inputs; every package opens as the version it was made from).
    pub(super) fn load(&mut self, listed: &Listed, opts: &LoadOptions) -> Option<KeptScan> {
        let ahead = self.ahead.take()?;
        let damaged = |e: Damaged| {
            let path = self.slot.path().display();
            if e.0 == OTHER_FORMAT {
                debug!("{path}: {OTHER_FORMAT}; the packages are indexed again");
            } else {
                warn!("{path}: {e}; the packages are indexed again");
            }
        };
        match ahead.recv().ok()? {
            Ahead::Inputs(Ok(i)) if i == self.inputs => {}
            Ahead::Inputs(Ok(_)) => {
                debug!(
                    "the packages, the layout's inputs or the binary changed since the tree was kept"
                );
                return None;
            }
            Ahead::Inputs(Err(e)) | Ahead::Parsed(Err(e)) => {
                damaged(e);
                return None;
            }
            Ahead::Parsed(Ok(_)) => return None,
        }
        // While the record is parsed: the packages, opened (their stamps checked as they
        // are taken); the opens (about 2.5 ms for 609) overlap the parse.
        let opened: Vec<Option<Arc<dyn Blob>>> = listed
            .candidates
            .iter()
            .map(|c| match crate::io::blob::LocalFile::open(&c.path) {
                Ok(b) => Some(b as Arc<dyn Blob>),
                Err(e) => {
                    debug!("{}: {e}: the tree kept is not used", c.path.display());
                    None
                }
            })
            .collect();
        let parsed = match ahead.recv().ok()? {
            Ahead::Parsed(Ok(p)) => p,
            Ahead::Parsed(Err(e)) | Ahead::Inputs(Err(e)) => {
                damaged(e);
                return None;
            }
            Ahead::Inputs(Ok(_)) => return None,
        };
        match resolve(*parsed, listed, opened, opts) {
            Ok(Some(k)) => {
                // Used: not among the records a later store clears away.
                let now = std::time::SystemTime::now();
                if let Ok(f) = std::fs::File::options().write(true).open(self.slot.path()) {
                    let _ = f.set_modified(now);
                }
                Some(k)
            }
            Ok(None) => None,
            Err(e) => {
                damaged(e);
                None
            }
        }
    }

    /// Keep a first scan's result, if it is whole (see the module documentation).
    /// Best effort: a failure is logged, the mount goes on.
    pub(super) fn store(
        &self,
        listed: &Listed,
        layers: &[Layer],
        indexed: &HashMap<u32, usize>,
        report: &LoadReport,
        tree: &Tree,
        digest: &str,
    ) {
        let Some(record) = encode(&self.inputs, listed, layers, indexed, report, tree, digest)
        else {
            debug!("the tree is not kept: a package was skipped for a passing reason");
            return;
        };
        match self.cache.store(&self.slot, &record) {
            Ok(()) => {
                debug!(
                    "tree kept for the next mount ({} bytes, {})",
                    record.len(),
                    self.slot.path().display()
                );
                self.clear_unused();
            }
            Err(e) => warn!(
                "could not keep the tree in {}: {e}",
                self.slot.path().display()
            ),
        }
    }
}

impl Keeping {
    /// Remove the records of other sources no mount has loaded for [`UNUSED_FOR`]: a
    /// record is as large as its tree, and sources come and go (a mount of a temporary
    /// directory keeps one that no mount will load again).
    fn clear_unused(&self) {
        let Ok(dir) = std::fs::read_dir(self.cache.dir()) else {
            return;
        };
        let now = std::time::SystemTime::now();
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with("tree-") && name.ends_with(".idx"))
                || e.path() == self.slot.path()
            {
                continue;
            }
            let unused = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > UNUSED_FOR);
            if unused && std::fs::remove_file(e.path()).is_ok() {
                debug!(
                    "removed {}, unused for {:?}",
                    e.path().display(),
                    UNUSED_FOR
                );
            }
        }
    }
}

/// How long a record no mount loads is kept (see [`Keeping::clear_unused`]).
pub(super) const UNUSED_FOR: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);

/// A file's identity for the key: its stamp, or that it is not there.
fn file_identity(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{}={}\n",
            path.display(),
            crate::io::blob::local_version(&m)
        ),
        Err(_) => format!("{}=absent\n", path.display()),
    }
}

/// Kinds of entries, as stored.
const ENTRY_KINDS: [EntryKind; 9] = [
    EntryKind::File,
    EntryKind::Dir,
    EntryKind::Symlink,
    EntryKind::HardLink,
    EntryKind::CharDev,
    EntryKind::BlockDev,
    EntryKind::Fifo,
    EntryKind::Socket,
    EntryKind::Special,
];

/// Where each index origin is stored.
const ORIGINS: [IndexOrigin; 4] = [
    IndexOrigin::Archive,
    IndexOrigin::Cache,
    IndexOrigin::Pass,
    IndexOrigin::Ztoc,
];

/// The error kinds a skipped package's reason is kept as (others are not kept).
fn encode_error(e: &mut Enc, err: &Error) -> bool {
    let (tag, m) = match err {
        Error::Format(m) => (0, m),
        Error::Corrupt(m) => (1, m),
        Error::Unsupported(m) => (2, m),
        _ => return false,
    };
    e.u8(tag);
    e.bytes(m.as_bytes());
    true
}

fn decode_error(d: &mut Dec) -> Decoded<Error> {
    let tag = d.u8()?;
    let m = String::from_utf8_lossy(d.bytes()?).into_owned();
    Ok(match tag {
        0 => Error::Format(m),
        1 => Error::Corrupt(m),
        2 => Error::Unsupported(m),
        _ => return Err(Damaged("reason")),
    })
}

fn encode_entry(e: &mut Enc, x: &Entry) {
    e.bytes(&x.path);
    e.u8(ENTRY_KINDS.iter().position(|k| *k == x.kind).unwrap_or(8) as u8);
    e.u16(x.perm);
    e.i64(x.mtime);
    e.u64(x.uid.map_or(u64::MAX, u64::from));
    e.u64(x.gid.map_or(u64::MAX, u64::from));
    e.u64(x.size);
    encode_loc(e, &x.data);
    e.bytes(&x.link);
    e.u64(x.rdev);
    e.u64(x.xattrs.len() as u64);
    for (k, v) in &x.xattrs {
        e.bytes(k);
        e.bytes(v);
    }
}

fn decode_entry(d: &mut Dec) -> Decoded<Entry> {
    let path = d.bytes()?.to_vec();
    let kind = *ENTRY_KINDS
        .get(usize::from(d.u8()?))
        .ok_or(Damaged("entry kind"))?;
    let perm = d.u16()?;
    let mtime = d.i64()?;
    let id = |v: u64| u32::try_from(v).ok();
    let uid = id(d.u64()?);
    let gid = id(d.u64()?);
    let size = d.u64()?;
    let data = decode_loc(d)?;
    let link = d.bytes()?.to_vec();
    let rdev = d.u64()?;
    let n = d.count(16)?;
    let mut xattrs = Vec::with_capacity(n);
    for _ in 0..n {
        xattrs.push((d.bytes()?.to_vec(), d.bytes()?.to_vec()));
    }
    Ok(Entry {
        path,
        kind,
        perm,
        mtime,
        uid,
        gid,
        size,
        data,
        link,
        rdev,
        xattrs,
    })
}

/// The record of a scan; `None` if it may not be kept.
fn encode(
    inputs: &[u8; 32],
    listed: &Listed,
    layers: &[Layer],
    indexed: &HashMap<u32, usize>,
    report: &LoadReport,
    tree: &Tree,
    digest: &str,
) -> Option<Vec<u8>> {
    let by_path: HashMap<&Path, usize> = listed
        .candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (c.path.as_path(), i))
        .collect();
    let mut e = Enc(MAGIC.to_vec());
    e.0.extend_from_slice(inputs);
    e.u64(layers.len() as u64);
    let cx = OpenContext {
        layer: None,
        index_cache: None,
        defer_over: None,
        progress: None,
    };
    for (i, l) in layers.iter().enumerate() {
        let a = &l.archive;
        if a.format() == crate::layout::OWN_FORMAT {
            // The layout's own entries, last of all.
            if i + 1 != layers.len() {
                return None;
            }
            let name = report.layers.get(i)?;
            // Their bytes are kept once, in the tree's members (the layer is read
            // through them); the package's own list goes without.
            let entries = a.entries(&cx).ok()?;
            e.u8(1);
            e.bytes(name.as_os_str().as_encoded_bytes());
            e.u64(entries.len() as u64);
            for x in &entries {
                match x.data {
                    Loc::Inline(_) => encode_entry(
                        &mut e,
                        &Entry {
                            data: Loc::None,
                            ..x.clone()
                        },
                    ),
                    _ => encode_entry(&mut e, x),
                }
            }
            continue;
        }
        let idx = *by_path.get(a.path.as_path())?;
        if a.checked != crate::format::Checked::Nothing {
            return None;
        }
        e.u8(0);
        e.u32(idx as u32);
        e.bytes(a.format().as_bytes());
        e.u8(ORIGINS.iter().position(|o| *o == a.origin)? as u8);
        e.u64(l.entries as u64);
        e.u64(*indexed.get(&a.key)? as u64);
        e.u64(l.places.len() as u64);
        for p in &l.places {
            e.bytes(p);
        }
    }
    e.u64(report.skipped.len() as u64);
    for (p, err) in &report.skipped {
        e.bytes(p.as_os_str().as_encoded_bytes());
        if !encode_error(&mut e, err) {
            return None;
        }
    }
    e.u64(report.ignored.len() as u64);
    for p in &report.ignored {
        e.bytes(p.as_os_str().as_encoded_bytes());
    }
    tree.encode(&mut e);
    e.bytes(digest.as_bytes());
    let crc = crc32fast::hash(&e.0);
    e.u32(crc);
    Some(e.0)
}

fn path_of(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt as _;
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

/// A record parsed: everything but opening its packages, which needs the listing.
struct Parsed {
    layers: Vec<ParsedLayer>,
    skipped: Vec<(PathBuf, Error)>,
    ignored: Vec<PathBuf>,
    tree: Tree,
    digest: String,
}

/// One layer of a record.
enum ParsedLayer {
    /// Candidate number `idx` of the listing.
    Package {
        idx: usize,
        format: &'static str,
        entries: usize,
        indexed: usize,
        places: Vec<Vec<u8>>,
    },
    /// The layout's own entries.
    Own { name: PathBuf, entries: Vec<Entry> },
}

/// What the reader thread says, in order: what the record was made from (once its
/// checksum holds), then the record parsed.
enum Ahead {
    Inputs(Decoded<[u8; 32]>),
    Parsed(Decoded<Box<Parsed>>),
}

/// Read the record at `slot` on a thread of its own, while the scan lists and `stat`s
/// the packages: the receiver hears [`Ahead::Inputs`] as soon as the file is read and
/// checked, then [`Ahead::Parsed`] (nothing at all if there is no record). A receiver
/// dropped early (the inputs differ) ends the thread before it parses.
fn read_ahead(cache: IndexCache, slot: crate::format::cache::CacheKey) -> mpsc::Receiver<Ahead> {
    let (tx, rx) = mpsc::sync_channel(2);
    let work = move || {
        let Some(bytes) = cache.load(&slot) else {
            return;
        };
        let body = match checked(&bytes) {
            Ok(body) => body,
            Err(e) => {
                let _ = tx.send(Ahead::Inputs(Err(e)));
                return;
            }
        };
        let (inputs, rest) = match body.split_first_chunk::<32>() {
            Some((i, rest)) => (*i, rest),
            None => {
                let _ = tx.send(Ahead::Inputs(Err(Damaged("no inputs"))));
                return;
            }
        };
        if tx.send(Ahead::Inputs(Ok(inputs))).is_err() {
            return;
        }
        let _ = tx.send(Ahead::Parsed(parse(&mut Dec(rest)).map(Box::new)));
    };
    if let Err(e) = std::thread::Builder::new()
        .name("pkgfs-kept".into())
        .spawn(work)
    {
        debug!("no thread to read the kept tree: {e}");
    }
    rx
}

/// Why a whole record of another format is not used: not damage, so not a warning
/// (the first mount after an upgrade meets the record the older pkgfs kept).
const OTHER_FORMAT: &str = "kept by a pkgfs of another record format";

/// The record's body after its magic, if its checksum holds.
fn checked(bytes: &[u8]) -> Decoded<&[u8]> {
    let (body, crc) = bytes
        .split_last_chunk::<4>()
        .ok_or(Damaged("no checksum"))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(Damaged("checksum"));
    }
    let family = MAGIC.split(|&b| b == b' ').next().unwrap_or(MAGIC);
    match body.strip_prefix(MAGIC) {
        Some(rest) => Ok(rest),
        None if body.starts_with(family) => Err(Damaged(OTHER_FORMAT)),
        None => Err(Damaged("not a kept scan")),
    }
}

/// The record after its inputs, parsed (see [`encode`]).
fn parse(d: &mut Dec) -> Decoded<Parsed> {
    let n = d.count(2)?;
    let mut layers = Vec::with_capacity(n);
    for _ in 0..n {
        layers.push(match d.u8()? {
            0 => {
                let idx = d.u32()? as usize;
                let format = static_format(d.bytes()?);
                // Where the index came from when the tree was kept: its next read may
                // come from elsewhere (the index cache), so the status says "kept".
                ORIGINS.get(usize::from(d.u8()?)).ok_or(Damaged("origin"))?;
                let entries = usize::try_from(d.u64()?).map_err(|_| Damaged("entries"))?;
                let indexed = usize::try_from(d.u64()?).map_err(|_| Damaged("entries"))?;
                let p = d.count(8)?;
                let mut places = Vec::with_capacity(p);
                for _ in 0..p {
                    places.push(d.bytes()?.to_vec());
                }
                ParsedLayer::Package {
                    idx,
                    format,
                    entries,
                    indexed,
                    places,
                }
            }
            1 => {
                let name = path_of(d.bytes()?);
                let k = d.count(40)?;
                let mut entries = Vec::with_capacity(k);
                for _ in 0..k {
                    entries.push(decode_entry(d)?);
                }
                ParsedLayer::Own { name, entries }
            }
            _ => return Err(Damaged("layer kind")),
        });
    }
    let mut skipped = Vec::new();
    for _ in 0..d.count(9)? {
        let p = path_of(d.bytes()?);
        skipped.push((p, decode_error(d)?));
    }
    let mut ignored = Vec::new();
    for _ in 0..d.count(8)? {
        ignored.push(path_of(d.bytes()?));
    }
    let tree = Tree::decode(d, layers.len() as u32)?;
    let digest = String::from_utf8(d.bytes()?.to_vec()).map_err(|_| Damaged("digest"))?;
    if !d.is_empty() {
        return Err(Damaged("bytes after the tree"));
    }
    Ok(Parsed {
        layers,
        skipped,
        ignored,
        tree,
        digest,
    })
}

/// A parsed record over the packages of `listed`, each opened and checked to be the
/// version the record was made from: `Ok(None)` if one changed between its `stat` and
/// its open.
fn resolve(
    p: Parsed,
    listed: &Listed,
    opened: Vec<Option<Arc<dyn Blob>>>,
    opts: &LoadOptions,
) -> Decoded<Option<KeptScan>> {
    let mut layers = Vec::with_capacity(p.layers.len());
    let mut report = LoadReport {
        kept: true,
        skipped: p.skipped,
        ignored: p.ignored,
        ..LoadReport::default()
    };
    let mut active = Vec::with_capacity(p.layers.len());
    let cache = opts.index_cache.clone();
    for l in p.layers {
        match l {
            ParsedLayer::Package {
                idx,
                format,
                entries,
                indexed,
                places,
            } => {
                let cand = listed
                    .candidates
                    .get(idx)
                    .ok_or(Damaged("package number"))?;
                let stamp = listed.stamps.get(idx).and_then(Option::as_ref);
                let Some(blob) = opened.get(idx).cloned().flatten() else {
                    // Not opened (said why above).
                    return Ok(None);
                };
                if Some(blob.version()) != stamp.map(String::as_str) {
                    debug!("{} changed: the tree kept is not used", cand.path.display());
                    return Ok(None);
                }
                let package = Deferred {
                    format,
                    entries: indexed,
                    blob: blob.clone(),
                    cache: cache.clone(),
                    opened: OnceLock::new(),
                };
                let archive = Arc::new(Archive::new(blob, Box::new(package), IndexOrigin::Kept));
                report.layers.push(cand.path.clone());
                active.push(Active {
                    path: cand.path.clone(),
                    provided: Provided::Archive(archive.clone()),
                });
                layers.push(Layer {
                    archive,
                    entries,
                    places,
                });
            }
            ParsedLayer::Own { name, entries } => {
                report.layers.push(name);
                layers.push(Layer {
                    entries: entries.len(),
                    archive: crate::layout::own_archive(opts.layout.kind.name(), entries),
                    places: Vec::new(),
                });
            }
        }
    }
    Ok(Some(KeptScan {
        tree: p.tree,
        digest: p.digest,
        layers,
        report,
        active,
    }))
}

/// A format's name as the packages give it (`Package::format` is `&'static str`).
fn static_format(name: &[u8]) -> &'static str {
    const OTHERS: [&str; 6] = ["zip", "tar", "tar.gz", "tar.zst", "seekable-zstd", "raw"];
    crate::format::FORMATS
        .iter()
        .map(|f| f.name())
        .chain(OTHERS)
        .find(|n| n.as_bytes() == name)
        .unwrap_or("archive")
}

/// An archive of a kept tree: its index is read the first time a request needs it,
/// and must be the index the tree was made from (as many entries).
struct Deferred {
    format: &'static str,
    /// How many entries its index held when the tree was kept.
    entries: usize,
    blob: Arc<dyn Blob>,
    cache: Option<IndexCache>,
    opened: OnceLock<std::result::Result<Box<dyn Package>, Error>>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("format", &self.format)
            .field("path", &self.blob.name())
            .field("opened", &self.opened.get().map(|r| r.is_ok()))
            .finish()
    }
}

impl Deferred {
    /// The format's read path, its index read now if it was not yet.
    fn package(&self) -> Result<&dyn Package> {
        let r = self.opened.get_or_init(|| {
            let cx = OpenContext {
                layer: None,
                index_cache: self.cache.as_ref(),
                defer_over: None,
                progress: None,
            };
            let name = self.blob.name().display().to_string();
            let opened = match crate::format::open(self.blob.clone(), &cx) {
                Ok(ix) if ix.entries.len() == self.entries => Ok(ix.archive.package),
                Ok(ix) => Err(Error::Format(format!(
                    "{name}: its index has {} entries, {} when its tree was kept",
                    ix.entries.len(),
                    self.entries
                ))),
                Err(OpenError::NotAnArchive) => Err(Error::Format(format!(
                    "{name}: no longer an archive pkgfs reads"
                ))),
                Err(OpenError::Bad(e)) => Err(e),
            };
            match &opened {
                Ok(_) => debug!("{name}: index read on first use"),
                Err(e) => warn!("{name}: {e}: its files fail with EIO"),
            }
            opened
        });
        match r {
            Ok(p) => Ok(&**p),
            Err(e) => Err(e.clone()),
        }
    }
}

impl Package for Deferred {
    fn format(&self) -> &'static str {
        match self.opened.get() {
            Some(Ok(p)) => p.format(),
            _ => self.format,
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        match self.package() {
            Ok(p) => p.as_any(),
            Err(_) => self,
        }
    }
    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        self.package()?.entries(blob, cx)
    }
    fn read(
        &self,
        r: &Reading<'_>,
        offset: u64,
        end: u64,
        span: crate::io::Span,
    ) -> Result<crate::io::ReadData> {
        self.package()?.read(r, offset, end, span)
    }
    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        self.package().ok()?.extent(r)
    }
    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        if let Some(Ok(p)) = self.opened.get() {
            p.delivered(r, start, end);
        }
    }
    fn read_first(&self) -> Option<(u64, u64)> {
        self.package().ok()?.read_first()
    }
    fn crc32(&self, loc: &crate::format::Loc) -> Option<u32> {
        self.package().ok()?.crc32(loc)
    }
    fn verify(&self, archive: &Archive, cx: &OpenContext) -> Result<Vec<String>> {
        self.package()?.verify(archive, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(body: &[u8]) -> Vec<u8> {
        let mut b = body.to_vec();
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// A record of this format is read; one an older pkgfs kept is refused as another
    /// format (logged quietly: an upgrade is not damage), anything else as damage.
    #[test]
    fn a_record_of_another_format_is_told_from_a_damaged_one() {
        let mut ours = MAGIC.to_vec();
        ours.extend_from_slice(b"rest");
        assert_eq!(checked(&sealed(&ours)).unwrap(), b"rest");
        let older = sealed(b"pkgfs-kept-scan 1\nrest");
        assert_eq!(checked(&older).unwrap_err().0, OTHER_FORMAT);
        let stranger = sealed(b"something else\nrest");
        assert_eq!(checked(&stranger).unwrap_err().0, "not a kept scan");
        let mut torn = sealed(&ours);
        torn[3] ^= 1;
        assert_eq!(checked(&torn).unwrap_err().0, "checksum");
    }
}
