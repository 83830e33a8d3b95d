//! Layouts: where each package goes in the mount.
//!
//! A layout is chosen per mount (`--layout`). `merge` folds every archive into one tree
//! (the rule of docs/SEMANTICS.md, "Merging"); the others give each package a directory
//! of its own, as the build tool that reads them expects it:
//!
//! - [`each`]: a directory per archive, named after its file (`http-1.2.0.tar.gz` →
//!   `http-1.2.0/`): a pub cache, a vendor directory of loose tarballs;
//! - [`npm`]: `node_modules` as npm writes it, from the packages' own `package.json`
//!   and, with a lockfile, exactly where `npm ci` puts each package;
//! - [`cargo`]: cargo's `registry/src/INDEX/`, each `.crate` at `NAME-VERSION/` with the
//!   marker cargo writes after unpacking;
//! - [`python`]: a virtual environment made of wheels, as `python -m venv` and `pip
//!   install` leave it.
//!
//! A layout sees packages, never files of a mount: the scan (`crate::source`) asks it
//! where each package goes ([`Placement`]) and folds the entries there with
//! [`crate::tree::Place`]. Layouts that can name a package's directory from its file name
//! alone (`each`, `cargo`) let it be indexed lazily: the directory is a graft
//! ([`crate::tree::view::Graft`]) whose index is read when it is first looked into. A
//! layout that needs the package's contents to place it (`npm` reads `package.json` and
//! checks the lockfile's integrity) places it once it is indexed.
//!
//! Adding a layout: a module here with a type implementing [`Layout`], a [`Kind`]
//! variant and its line in [`Kind::start`].

pub mod cargo;
pub mod each;
pub mod npm;
pub mod python;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Archive, Entry, EntryKind, Loc};
use crate::tree::Place;

/// The layouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Every archive folded into one tree.
    #[default]
    Merge,
    /// A directory per archive, named after its file.
    Each,
    /// npm's `node_modules`.
    Npm,
    /// cargo's `registry/src/INDEX/`.
    Cargo,
    /// A Python virtual environment of wheels.
    Python,
}

impl Kind {
    /// Every layout, in the order `--help` lists them.
    pub const ALL: [Kind; 5] = [
        Kind::Merge,
        Kind::Each,
        Kind::Npm,
        Kind::Cargo,
        Kind::Python,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Merge => "merge",
            Kind::Each => "each",
            Kind::Npm => "npm",
            Kind::Cargo => "cargo",
            Kind::Python => "python",
        }
    }

    /// The layout of this name.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The rules of one scan (a layout may keep state while it places packages: names
    /// taken, the lockfile's packages found).
    pub fn start(self, cfg: &Config) -> Result<Box<dyn Layout>> {
        Ok(match self {
            Kind::Merge => Box::new(Merge { strip: cfg.strip }),
            Kind::Each => Box::new(each::Each::new(cfg.strip)),
            Kind::Npm => Box::new(npm::Npm::new(cfg)?),
            Kind::Cargo => Box::new(cargo::Cargo::default()),
            Kind::Python => Box::new(python::Python::new(cfg)?),
        })
    }
}

/// A mount's layout and its settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which layout.
    pub kind: Kind,
    /// Leading path components dropped from every entry (`merge` and `each`).
    pub strip: usize,
    /// npm: the `package-lock.json` the mount follows; python: its `pylock.toml` or
    /// hashed `requirements.txt`.
    pub lockfile: Option<PathBuf>,
    /// npm and python: mount even if packages of the lockfile are missing from the
    /// sources.
    pub allow_missing: bool,
    /// python: the base interpreter the environment is for.
    pub python: Option<PathBuf>,
    /// python: the environment's absolute path (the mountpoint), which its scripts and
    /// activate files name.
    pub venv: Option<PathBuf>,
    /// python: serve no `__pycache__` (`--no-compile`, as pip's flag).
    pub no_compile: bool,
    /// python: the directory of compiled bytecode packs, one per wheel and interpreter
    /// (`INDEX_CACHE/python`, a source of the mount; `None`: no bytecode).
    pub bytecode: Option<PathBuf>,
    /// python: the index cache, where the digests of local packages are kept
    /// ([`cached_digest`]).
    pub index_cache: Option<PathBuf>,
}

/// Where one package goes.
#[derive(Debug)]
pub enum Placement {
    /// Its entries, folded into the mount at each place (merge: the root; npm: every
    /// path the lockfile installs it at).
    Fold(Vec<Place>),
    /// A directory of its own at `dir` (components), indexed on first use; inside it,
    /// the entries placed by `inner`, and `extra` entries of the layout's own.
    Own {
        /// The directory.
        dir: Vec<Vec<u8>>,
        /// Where the package's entries go inside it.
        inner: Place,
        /// Entries the layout adds inside it (cargo's `.cargo-ok`).
        extra: Vec<Entry>,
    },
    /// Not mounted, and why: a warning naming the package.
    Refused(String),
    /// Not mounted because the layout has no use for it (not in the lockfile): logged
    /// at `info`, no warning.
    Unused(String),
}

/// What a layout learns of a package on the indexing thread, before it is placed.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// npm: the bytes of the package's `package.json`.
    pub manifest: Option<Vec<u8>>,
    /// npm with a lockfile: digests of the archive's bytes as `(algorithm, digest)`
    /// (`sha512`, `sha1`).
    pub digests: Vec<(&'static str, Vec<u8>)>,
    /// python: members the layout reads (metadata, scripts), as `(path, bytes)`; the
    /// `RECORD` is in `record`, parsed.
    pub members: Vec<(Vec<u8>, Vec<u8>)>,
    /// python: the members an installer makes executable, when the format says (a ZIP's
    /// external attributes: a regular file's Unix mode with an execute bit, as pip
    /// reads them); `None`: the entries' modes decide.
    pub executable: Option<std::collections::HashSet<Vec<u8>>>,
    /// python: the rows of the wheel's `RECORD`, parsed on the indexing thread (plotly's
    /// has 15,000).
    pub record: Option<std::sync::Arc<Vec<Vec<String>>>>,
}

/// Finds out what a layout needs to know of an indexed package ([`Facts`]).
pub trait Inspect: Sync {
    /// The facts of `archive`, whose index is `entries`.
    fn inspect(&self, archive: &Archive, entries: &[Entry]) -> Result<Facts>;
}

/// Layouts that need no facts.
struct NoFacts;

impl Inspect for NoFacts {
    fn inspect(&self, _: &Archive, _: &[Entry]) -> Result<Facts> {
        Ok(Facts::default())
    }
}

/// One layout's rules, for one scan.
pub trait Layout: Send + Sync {
    /// Packages are placed by their names alone, each in a directory of its own that is
    /// indexed on first use ([`Layout::place_name`]); otherwise each is indexed first
    /// and placed by [`Layout::place`].
    fn by_name(&self) -> bool {
        false
    }

    /// Whether a file of a directory source is a package, by its name alone (a layout
    /// placing by name cannot open files to find out).
    fn takes(&self, _file_name: &[u8]) -> bool {
        true
    }

    /// The file names of every package of this scan, before any is placed (python
    /// prefers, among several wheels of one pinned version, the one whose tags its
    /// interpreter prefers, whatever their order).
    fn listed(&mut self, _file_names: &[&[u8]]) {}

    /// Where the package named `name` goes, by name ([`Layout::by_name`] layouts).
    fn place_name(&mut self, name: &Path) -> Placement {
        Placement::Refused(format!(
            "{}: this layout places packages once indexed",
            name.display()
        ))
    }

    /// What finds out, on the indexing threads (so in parallel), what the layout needs
    /// to know of each indexed package before it places it.
    fn inspector(&self) -> Box<dyn Inspect> {
        Box::new(NoFacts)
    }

    /// Where the indexed package `name` goes; it may adjust the entries (npm makes
    /// `bin` targets executable; python moves, drops and adds them, as an installer
    /// does).
    fn place(&mut self, name: &Path, entries: &mut Vec<Entry>, facts: &Facts) -> Placement;

    /// Once every package is placed: entries of the layout's own at the mount's root
    /// (npm's `.bin` links), or why the mount cannot be made (a lockfile's package that
    /// no source holds).
    fn finish(&mut self) -> Result<Vec<Entry>> {
        Ok(Vec::new())
    }

    /// After [`Layout::finish`]: work to do once the mount serves, off the scan's path
    /// (python compiles the bytecode its environment lacks).
    fn chore(&mut self) -> Option<Box<dyn Chore>> {
        None
    }
}

/// Work a layout asks for once the mount serves (python's bytecode): run by the daemon
/// on its `pkgfs-chores` thread, one at a time, never during a scan. What it makes
/// reaches the mount as a source does (a file in a watched directory, activated live).
pub trait Chore: Send + Sync {
    /// What it does, for the log.
    fn describe(&self) -> String;
    /// Do it: what was done, for the log (`None`: nothing was left to do).
    fn run(self: Box<Self>) -> Result<Option<String>>;
}

/// `merge`: every archive at the root.
struct Merge {
    strip: usize,
}

impl Layout for Merge {
    fn place(&mut self, _: &Path, _: &mut Vec<Entry>, _: &Facts) -> Placement {
        Placement::Fold(vec![Place {
            strip: self.strip,
            prefix: Vec::new(),
        }])
    }
}

/// A plain path component: not empty, `.`, `..`, no `/`, `\`, NUL, at most 255 bytes.
pub fn plain_component(c: &[u8]) -> bool {
    !c.is_empty()
        && c != b"."
        && c != b".."
        && c.len() <= crate::tree::path::NAME_MAX
        && !c.iter().any(|&b| b == b'/' || b == b'\\' || b == 0)
}

/// The last component of a package's name (a path, or an object's key).
pub fn file_name(name: &Path) -> &[u8] {
    let b = name.as_os_str().as_encoded_bytes();
    b.rsplit(|&c| c == b'/').next().unwrap_or(b)
}

/// Feed every byte of `archive`'s file to `f`, a MiB at a time (layouts that check a
/// package against a lockfile's digests: npm, python).
pub fn each_chunk(archive: &Archive, mut f: impl FnMut(&[u8])) -> Result<()> {
    let blob = &archive.blob;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < blob.size() {
        let n = (blob.size() - at).min(buf.len() as u64) as usize;
        blob.read_exact_at(&mut buf[..n], at)?;
        f(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// The digest `algo` of `archive`'s bytes, made by `compute` or kept in `cache`: for a
/// local file only, by its identity (device, inode, size, modification time) and its
/// change time, which no user can set back, so a file changed since never matches.
/// Remote objects are always hashed (their version is the server's word).
pub fn cached_digest(
    cache: Option<&crate::format::IndexCache>,
    archive: &Archive,
    algo: &str,
    compute: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt as _;
    let key = cache.and_then(|c| {
        let meta = std::fs::metadata(&archive.path).ok()?;
        (archive.blob.version() == crate::io::blob::local_version(&meta)).then(|| {
            let extra = format!("{algo} ctime {}.{:09}", meta.ctime(), meta.ctime_nsec());
            (c, c.key("digest", &*archive.blob, &extra))
        })
    });
    if let Some((c, k)) = &key
        && let Some(d) = c.load(k)
    {
        return Ok(d);
    }
    let d = compute()?;
    if let Some((c, k)) = &key
        && let Err(e) = c.store(k, &d)
    {
        log::debug!("{}: digest not kept: {e}", archive.path.display());
    }
    Ok(d)
}

/// A directory entry of a layout's own.
pub fn dir(path: &[u8], perm: u16, mtime: i64) -> Entry {
    Entry {
        path: path.to_vec(),
        kind: EntryKind::Dir,
        perm,
        mtime,
        uid: None,
        gid: None,
        size: 0,
        data: Loc::None,
        link: Vec::new(),
        rdev: 0,
        xattrs: Vec::new(),
    }
}

/// A file entry of a layout's own, with its bytes.
pub fn inline_file(path: &[u8], data: &[u8], perm: u16, mtime: i64) -> Entry {
    Entry {
        path: path.to_vec(),
        kind: EntryKind::File,
        perm,
        mtime,
        uid: None,
        gid: None,
        size: data.len() as u64,
        data: Loc::Inline(data.into()),
        link: Vec::new(),
        rdev: 0,
        xattrs: Vec::new(),
    }
}

/// A symlink of a layout's own.
pub fn symlink(path: &[u8], target: &[u8], mtime: i64) -> Entry {
    Entry {
        path: path.to_vec(),
        kind: EntryKind::Symlink,
        perm: 0o777,
        mtime,
        uid: None,
        gid: None,
        size: target.len() as u64,
        data: Loc::None,
        link: target.to_vec(),
        rdev: 0,
        xattrs: Vec::new(),
    }
}

/// The format name of the archive of a layout's own entries ([`own_archive`]).
pub const OWN_FORMAT: &str = "layout";

/// The archive that serves a layout's own entries (their bytes are in the entries).
pub fn own_archive(name: &str, entries: Vec<Entry>) -> Arc<Archive> {
    let blob: Arc<dyn crate::io::blob::Blob> = Arc::new(crate::io::blob::Bytes::new(
        format!("(layout: {name})"),
        Vec::new(),
    ));
    Arc::new(Archive::new(
        blob,
        Box::new(Own { entries }),
        crate::format::IndexOrigin::Archive,
    ))
}

/// The package of a layout's own entries: every byte is in its index.
///
/// Why a layout implements `format::Package`: the tree serves every entry as a `Loc` of
/// some [`Archive`] among its layers, and a layout's own entries (`.cargo-ok`, npm's
/// `.bin` links) have no archive of their own, so the layout makes one. It is not a
/// format (no file is ever probed as one, it is not in `format::FORMATS`), and it needs
/// nothing of a format's read path: its files' bytes are `Loc::Inline`, which
/// `Archive::read` serves before a package is asked, so `read` here is unreachable and
/// `entries` only gives the index again for a rescan (a kept tree's own archive lists
/// them without their bytes, which its tree's members hold: `source::kept`). Kept here, beside the entries it
/// serves, rather than in `format/`: it knows nothing of any format, and the formats
/// need not know that layouts exist.
#[derive(Debug)]
struct Own {
    entries: Vec<Entry>,
}

impl crate::format::Package for Own {
    fn format(&self) -> &'static str {
        OWN_FORMAT
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn entries(
        &self,
        _: &Arc<dyn crate::io::blob::Blob>,
        _: &crate::format::OpenContext,
    ) -> Result<Vec<Entry>> {
        Ok(self.entries.clone())
    }
    fn read(
        &self,
        _: &crate::format::Reading<'_>,
        _: u64,
        _: u64,
        _: crate::io::Span,
    ) -> Result<crate::io::ReadData> {
        Err(Error::Internal("a layout's entry without its bytes".into()))
    }
    fn extent(&self, _: &crate::format::Reading<'_>) -> Option<(u64, u64)> {
        None
    }
    fn delivered(&self, _: &crate::format::Reading<'_>, _: u64, _: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_components_refuse_what_could_escape() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\\b", b"a\0"] {
            assert!(!plain_component(bad), "{bad:?}");
        }
        assert!(plain_component(b"@scope"));
        assert!(plain_component(b"x-1.2.3"));
        assert!(!plain_component(&[b'a'; 256]));
    }

    /// A local file's digest is kept, and computed again once the file changes, even
    /// with its inode, size and modification time as they were (its change time moved).
    #[test]
    fn digests_are_kept_until_the_file_changes() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.zip");
        let write = |data: &[u8]| {
            let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
            z.start_file("a", zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut z, data).unwrap();
            z.finish().unwrap();
        };
        write(b"one");
        let cache = crate::format::IndexCache::new(dir.path().join("cache"));
        let digest = |tag: u8| {
            let mut a = crate::format::open_path(&path, &Default::default())
                .map_err(|_| ())
                .unwrap()
                .archive;
            a.path = path.clone();
            cached_digest(Some(&cache), &a, "test", || Ok(vec![tag])).unwrap()
        };
        assert_eq!(digest(1), [1]);
        assert_eq!(digest(2), [1], "kept");
        let before = std::fs::metadata(&path).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(b"two");
        let t = std::fs::FileTimes::new().set_modified(
            std::time::UNIX_EPOCH
                + std::time::Duration::new(before.mtime() as u64, before.mtime_nsec() as u32),
        );
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_times(t)
            .unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().mtime_nsec(),
            before.mtime_nsec()
        );
        assert_eq!(digest(3), [3], "computed again");
    }

    #[test]
    fn layouts_are_named_as_on_the_command_line() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse("nope"), None);
    }
}
