//! `python`: a virtual environment made of wheels, as `python -m venv --without-pip VENV`
//! followed by `pip install --no-deps` of every wheel would leave it, with nothing copied
//! or unpacked: the mount is the environment (`pkgfs mount --layout python --python
//! /usr/bin/python3.X WHEELS… VENV`).
//!
//! - The environment's own files (`pyvenv.cfg`, `bin/python*`, the activate scripts) are
//!   made by the interpreter's `venv` module and served from memory ([`interp`]).
//! - Each wheel is installed as the wheel specification says and pip does it
//!   ([`wheel`]): its root into purelib or platlib by `Root-Is-Purelib`, its
//!   `NAME.data/KEY/` directories into the scheme's `scripts`, `headers`
//!   (`include/site/pythonX.Y/NAME/`), `data` (the environment's root), `purelib` and
//!   `platlib`; scripts starting `#!python` rewritten for the environment's interpreter;
//!   console and GUI launchers generated in `bin/`; `RECORD` rewritten (moved paths, new
//!   hashes of rewritten files, generated files listed), `INSTALLER` (`pkgfs`) and
//!   `REQUESTED` added. Modes as pip leaves them: 0644, or 0755 for members the wheel
//!   marks executable and for launchers; owned by the mount's owner. Everything not
//!   rewritten is served from the wheel in place.
//! - A second wheel of a project already placed is refused (the first in layer order
//!   stays); files two projects both install follow the merge rule (the later wins, and
//!   status reports the conflict), as pip's later install overwrites.
//!
//! Refused, with a warning naming the wheel, the rest mounted: no `*.dist-info/WHEEL`
//! or more than one `.dist-info`, a `Wheel-Version` other than 1.x, a `.data` key pip does
//! not know, a member path that would leave its directory, an entry point that is not
//! `NAME = MODULE:ATTR` with a plain name, metadata files larger than 16 MiB.
//!
//! With a lock file ([`lock`]: `pylock.toml`, hashed `requirements.txt`), only the
//! wheels it pins are installed: the pinned version, a file it lists, tags the
//! interpreter supports (the best-ranked wheel of several, [`Layout::listed`]), and a
//! sha256 it gives, checked on the indexing threads before any of the wheel is placed;
//! a locked project with no wheel fails the mount unless `--allow-missing`.
//!
//! Not yet: `__pycache__` (docs/design/python.md has the plan).

pub mod bytecode;
pub mod interp;
pub mod lock;
pub mod wheel;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::{Facts, Layout, Placement, inline_file};
use crate::error::{Error, Result};
use crate::format::{Archive, Entry, EntryKind, Loc};
use crate::tree::Place;

use bytecode::Bytecode;
use interp::Scheme;
use wheel::EntryPoint;

/// A metadata file or script larger than this is refused.
const MAX_MEMBER: u64 = 16 << 20;

/// The layout's state for one scan.
pub struct Python {
    scheme: Scheme,
    /// The environment's interpreter, as scripts and launchers name it (`VENV/bin/python`).
    python: Vec<u8>,
    /// The environment's own files.
    skeleton: Vec<Entry>,
    /// Projects placed (normal names), and by which wheel.
    taken: HashMap<String, PathBuf>,
    /// With a lock file: what it locks, and what was found of it.
    plan: Option<Plan>,
    /// The `RECORD` of each wheel placed, written by [`Layout::finish`] (a wheel's
    /// bytecode, placed after it, adds rows).
    records: Vec<Record>,
    /// Compiled bytecode: packs placed with their wheels, compiled for those without.
    bytecode: Option<Bytecode>,
    /// Where the digests of local wheels are kept.
    index_cache: Option<crate::format::IndexCache>,
}

/// A placed wheel's `RECORD`, until every row is known.
struct Record {
    /// Where it goes, relative to the environment.
    at: Vec<u8>,
    /// Its rows (written sorted, as pip writes them).
    rows: Vec<(String, String, String)>,
    /// The library directory its paths are relative to (absolute components).
    lib: Vec<Vec<u8>>,
    mtime: i64,
    /// The wheel's sha256 (hex), if hashed.
    sha256: Option<String>,
    /// The `.py` files it installed (what pip compiles): relative to the environment,
    /// and as pip names them when it compiles them.
    sources: Vec<(Vec<u8>, String)>,
}

/// A lock file's projects and what became of each.
struct Plan {
    locked: BTreeMap<String, lock::Locked>,
    /// Projects whose wheel was refused (hash mismatch): not also reported missing.
    refused: HashSet<String>,
    /// The interpreter's supported tags and their rank (0: most preferred); `None`: it
    /// could not say, and every wheel is taken.
    supported: Option<HashMap<String, usize>>,
    /// For each (normal project name, version), the wheel file of the scan whose tags
    /// the interpreter prefers, and their rank.
    best: HashMap<(String, String), (usize, String)>,
    allow_missing: bool,
}

impl Plan {
    /// The project, version and best tag rank of a wheel file here, if the interpreter
    /// supports one of its tags.
    fn rank(&self, file: &str) -> Option<(String, String, usize)> {
        let (name, version, tags) = lock::wheel_name(file).ok()?;
        let supported = self.supported.as_ref()?;
        let rank = tags.iter().filter_map(|t| supported.get(t)).min()?;
        Some((wheel::normalize(&name), version, *rank))
    }
}

/// Read the lock file of `cfg` for the interpreter of `scheme`.
fn read_plan(cfg: &super::Config, scheme: &Scheme) -> Result<Option<Plan>> {
    let Some(path) = &cfg.lockfile else {
        return Ok(None);
    };
    let shown = path.display();
    let err = |e: String| Error::Format(format!("{shown}: {e}"));
    let size = std::fs::metadata(path)
        .map_err(|e| err(e.to_string()))?
        .len();
    if size > lock::MAX_LOCK {
        return Err(err(format!("a lock file of {size} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let locked = lock::read(&name, &text, &scheme.markers).map_err(err)?;
    Ok(Some(Plan {
        locked,
        refused: HashSet::new(),
        supported: scheme.tags.as_ref().map(|t| {
            t.iter()
                .enumerate()
                .map(|(i, tag)| (tag.clone(), i))
                .rev()
                .collect()
        }),
        best: HashMap::new(),
        allow_missing: cfg.allow_missing,
    }))
}

impl Python {
    /// Ask the interpreter of `cfg` for its scheme and make the environment's own files.
    pub fn new(cfg: &super::Config) -> Result<Self> {
        let python = cfg.python.as_deref().ok_or_else(|| {
            Error::Format("--layout python needs --python (the base interpreter)".into())
        })?;
        let venv = cfg.venv.as_deref().ok_or_else(|| {
            Error::Format("--layout python needs the environment's path (the mountpoint)".into())
        })?;
        let index_cache = cfg.index_cache.clone().map(crate::format::IndexCache::new);
        let (scheme, skeleton) = interp::asked(python, venv, index_cache.as_ref())?;
        let plan = read_plan(cfg, &scheme)?;
        let mut exe = scheme.scripts.clone();
        exe.push(b"python".to_vec());
        let bytecode = match (&cfg.bytecode, &scheme.bytecode) {
            (Some(dir), Some(tag)) if !cfg.no_compile => Some(Bytecode::new(
                dir.clone(),
                tag.clone(),
                python.to_path_buf(),
                venv.to_path_buf(),
            )),
            _ => None,
        };
        Ok(Python {
            python: absolute(&exe),
            scheme,
            skeleton,
            taken: HashMap::new(),
            plan,
            records: Vec::new(),
            bytecode,
            index_cache,
        })
    }
}

fn absolute(c: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for x in c {
        out.push(b'/');
        out.extend_from_slice(x);
    }
    out
}

/// The wheel's `.dist-info` directory: the one top-level directory of that suffix that
/// holds `WHEEL`.
fn dist_info(entries: &[Entry]) -> std::result::Result<Vec<u8>, String> {
    let mut found: HashSet<Vec<u8>> = HashSet::new();
    for e in entries {
        if !e.path.windows(10).any(|w| w == b".dist-info") {
            continue;
        }
        if let Ok(c) = crate::tree::path::components(&e.path)
            && c.len() >= 2
            && c[0].ends_with(b".dist-info")
        {
            found.insert(c[0].to_vec());
        }
    }
    match found.len() {
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        0 => Err("no .dist-info directory: not a wheel".into()),
        n => Err(format!("{n} .dist-info directories")),
    }
}

/// Whether `path` (components) is a file the layout needs the bytes of.
fn wanted(c: &[&[u8]], info: &[u8]) -> bool {
    (c.len() == 2
        && c[0] == info
        && matches!(
            c[1],
            b"WHEEL" | b"METADATA" | b"entry_points.txt" | b"RECORD"
        ))
        || (c.len() >= 3 && c[0].ends_with(b".data") && c[1] == b"scripts")
}

struct Inspector {
    /// Hash the wheel file (a lock file's hashes are checked).
    digest: bool,
    /// Where the digests of local wheels are kept.
    cache: Option<crate::format::IndexCache>,
}

/// The sha256 of all of `archive`'s bytes.
fn sha256(archive: &Archive) -> Result<Vec<u8>> {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    super::each_chunk(archive, |b| h.update(b))?;
    Ok(h.finalize().to_vec())
}

impl super::Inspect for Inspector {
    fn inspect(&self, archive: &Archive, entries: &[Entry]) -> Result<Facts> {
        let mut facts = Facts::default();
        // Not a wheel (a bytecode pack): nothing to learn.
        let Ok(info) = dist_info(entries) else {
            return Ok(facts);
        };
        if self.digest {
            let d =
                super::cached_digest(self.cache.as_ref(), archive, "sha256", || sha256(archive))?;
            facts.digests.push(("sha256", d));
        }
        if let Some(zip) = archive
            .package
            .as_any()
            .downcast_ref::<crate::format::zip::ZipPackage>()
        {
            facts.executable = Some(
                entries
                    .iter()
                    .filter(|e| e.kind == EntryKind::File)
                    .filter(|e| {
                        zip.external_attributes(&e.data)
                            .is_some_and(wheel::executable)
                    })
                    .map(|e| e.path.clone())
                    .collect(),
            );
        }
        let io = crate::io::Io::new(0);
        for e in entries {
            let Ok(c) = crate::tree::path::components(&e.path) else {
                continue;
            };
            if e.kind != EntryKind::File || !wanted(&c, &info) {
                continue;
            }
            if e.size > MAX_MEMBER {
                return Err(Error::Format(format!(
                    "{} is {} bytes",
                    String::from_utf8_lossy(&e.path),
                    e.size
                )));
            }
            let data = archive.read(
                &io,
                &e.data,
                e.size,
                0,
                e.size as u32,
                crate::io::Span::Whole,
            )?;
            let data = data.into_vec();
            // RECORD is kept parsed only (plotly's is 1.5 MB of text).
            if c.len() == 2 && c[1] == b"RECORD" {
                facts.record = Some(std::sync::Arc::new(wheel::parse_record(&data)));
            } else {
                facts.members.push((e.path.clone(), data));
            }
        }
        Ok(facts)
    }
}

/// Whether a `.data/scripts` file is a launcher setuptools made for an entry point
/// (`EP`, `EP.exe`, `EP-script.py`, `EP.pya`), which pip leaves out.
fn is_entrypoint_wrapper(file: &str, console: &[EntryPoint], gui: &[EntryPoint]) -> bool {
    let lower = file.to_lowercase();
    let stem = if lower.ends_with(".exe") || lower.ends_with(".pya") {
        &file[..file.len() - 4]
    } else if lower.ends_with("-script.py") {
        &file[..file.len() - 10]
    } else {
        file
    };
    console.iter().chain(gui).any(|e| e.name == stem)
}

/// One wheel, installed: the entries it becomes (paths relative to the environment).
struct Install<'a> {
    scheme: &'a Scheme,
    python: &'a [u8],
    out: Vec<Entry>,
    /// Wheel RECORD path → installed RECORD path (relative to the library directory).
    installed: Vec<(String, String)>,
    /// Installed RECORD paths of rewritten files, with their new bytes.
    changed: HashMap<String, Vec<u8>>,
    lib: Vec<Vec<u8>>,
}

impl Install<'_> {
    /// Path of `dest` (absolute components) relative to the environment's root.
    fn rel_root(&self, dest: &[Vec<u8>]) -> Vec<u8> {
        dest[self.scheme.root.len()..].join(&b'/')
    }

    fn record_path(&self, dest: &[Vec<u8>]) -> String {
        String::from_utf8_lossy(&wheel::relpath(dest, &self.lib)).into_owned()
    }
}

impl Python {
    fn install(
        &mut self,
        name: &Path,
        entries: &[Entry],
        facts: &Facts,
    ) -> std::result::Result<Vec<Entry>, NotPlaced> {
        let info = dist_info(entries)?;
        let info_s = String::from_utf8_lossy(&info).into_owned();
        let member = |f: &str| {
            let want = format!("{info_s}/{f}");
            facts
                .members
                .iter()
                .find(|(p, _)| p.as_slice() == want.as_bytes())
                .map(|(_, d)| d.as_slice())
        };
        let purelib = wheel::root_is_purelib(member("WHEEL").ok_or("no WHEEL file")?)?;
        let project = member("METADATA")
            .and_then(wheel::metadata_name)
            .or_else(|| info_s.split('-').next().map(str::to_string))
            .ok_or("no project name")?;
        let key = wheel::normalize(&project);
        if let Some(plan) = &mut self.plan {
            let version = member("METADATA").and_then(wheel::metadata_version);
            plan.admit(name, &key, &project, version.as_deref(), facts)?;
        }
        if let Some(first) = self.taken.get(&key) {
            return Err(format!(
                "a second wheel of {project} (the first: {})",
                first.display()
            )
            .into());
        }
        let (console, gui) = match member("entry_points.txt") {
            Some(t) => wheel::entry_points(t)?,
            None => (Vec::new(), Vec::new()),
        };
        // pip names the headers' directory after the requirement it installs: the name
        // as the lock writes it, or the wheel file's with `_` as `-`.
        let header_dir = match self.plan.as_ref().and_then(|p| p.locked.get(&key)) {
            Some(l) => l.name.clone(),
            None => String::from_utf8_lossy(super::file_name(name))
                .split('-')
                .next()
                .unwrap_or(&project)
                .replace('_', "-"),
        };
        let lib = if purelib {
            self.scheme.purelib.clone()
        } else {
            self.scheme.platlib.clone()
        };
        let mut inst = Install {
            scheme: &self.scheme,
            python: &self.python,
            out: Vec::new(),
            installed: Vec::new(),
            changed: HashMap::new(),
            lib: lib.clone(),
        };
        let record_at = {
            let mut p = lib.clone();
            p.extend([info.clone(), b"RECORD".to_vec()]);
            p
        };
        let mtime = entries.iter().map(|e| e.mtime).max().unwrap_or(0);
        let lib_rel = inst.rel_root(&lib);
        for e in entries {
            if !matches!(e.kind, EntryKind::File | EntryKind::Symlink) {
                continue;
            }
            let shown = String::from_utf8_lossy(&e.path).into_owned();
            let comps = crate::tree::path::components(&e.path)
                .map_err(|err| format!("member {shown:?}: {err}"))?;
            let exec = e.kind == EntryKind::File
                && match &facts.executable {
                    Some(set) => set.contains(&e.path),
                    None => e.perm & 0o111 != 0,
                };
            if !comps[0].ends_with(b".data") {
                // Most members: into the library directory as they are (no allocation
                // beyond the entry's own).
                let rel = comps.join(&b'/');
                if comps.len() == 2 && comps[0] == info.as_slice() && comps[1] == b"RECORD" {
                    continue;
                }
                let mut path = Vec::with_capacity(lib_rel.len() + 1 + rel.len());
                path.extend_from_slice(&lib_rel);
                path.push(b'/');
                path.extend_from_slice(&rel);
                let rec = String::from_utf8_lossy(&rel).into_owned();
                inst.installed.push((shown, rec));
                inst.out.push(installed_entry(e, path, exec));
                continue;
            }
            let comps: Vec<Vec<u8>> = comps.iter().map(|c| c.to_vec()).collect();
            let mut script = false;
            let dest: Vec<Vec<u8>> = if comps[0].ends_with(b".data") {
                if comps.len() < 3 {
                    return Err(format!("{shown}: .data contents must be named KEY/PATH").into());
                }
                let rest = &comps[2..];
                let base = match comps[1].as_slice() {
                    b"purelib" => self.scheme.purelib.clone(),
                    b"platlib" => self.scheme.platlib.clone(),
                    b"data" => self.scheme.data.clone(),
                    b"headers" => {
                        let mut h = self.scheme.headers.clone();
                        h.push(header_dir.clone().into_bytes());
                        h
                    }
                    b"scripts" => {
                        let file = String::from_utf8_lossy(&comps[comps.len() - 1]).into_owned();
                        if is_entrypoint_wrapper(&file, &console, &gui) {
                            continue;
                        }
                        script = true;
                        self.scheme.scripts.clone()
                    }
                    k => {
                        return Err(format!(
                            "{shown}: unknown .data key {:?} (pip knows {})",
                            String::from_utf8_lossy(k),
                            wheel::SCHEME_KEYS.join(", ")
                        )
                        .into());
                    }
                };
                [base, rest.to_vec()].concat()
            } else {
                [lib.clone(), comps.clone()].concat()
            };
            if dest == record_at {
                continue;
            }
            let mut entry = installed_entry(e, inst.rel_root(&dest), exec);
            let rec = inst.record_path(&dest);
            if script
                && let Some(text) = facts
                    .members
                    .iter()
                    .find(|(p, _)| *p == e.path)
                    .and_then(|(_, d)| wheel::fix_script(d, inst.python))
            {
                entry.size = text.len() as u64;
                entry.data = Loc::Inline(text.clone().into());
                inst.changed.insert(rec.clone(), text);
            }
            inst.installed.push((shown, rec));
            inst.out.push(entry);
        }
        // Generated: launchers, INSTALLER, REQUESTED, then RECORD listing them all.
        let mut generated: Vec<(Vec<Vec<u8>>, Vec<u8>, u16)> = Vec::new();
        for ep in console.iter().chain(&gui) {
            let mut at = self.scheme.scripts.clone();
            at.push(ep.name.clone().into_bytes());
            generated.push((at, wheel::launcher(ep, inst.python), 0o755));
        }
        let info_dir = [lib.clone(), vec![info.clone()]].concat();
        generated.push((
            [info_dir.clone(), vec![b"INSTALLER".to_vec()]].concat(),
            b"pkgfs\n".to_vec(),
            0o644,
        ));
        generated.push((
            [info_dir, vec![b"REQUESTED".to_vec()]].concat(),
            Vec::new(),
            0o644,
        ));
        let old: &[Vec<String>] = facts.record.as_deref().map_or(&[], Vec::as_slice);
        // Each old row takes the first installed file of its path not yet taken (a map:
        // plotly's RECORD has 15,000 rows).
        // (The first of each path in `by_src`, the next of the same path in `next`.)
        let installed = &inst.installed;
        let mut by_src: HashMap<&str, usize> = HashMap::with_capacity(installed.len());
        let mut next = vec![usize::MAX; installed.len()];
        for (i, (src, _)) in installed.iter().enumerate().rev() {
            if let Some(after) = by_src.insert(src.as_str(), i) {
                next[i] = after;
            }
        }
        let mut taken = vec![false; installed.len()];
        let mut rows: Vec<(String, String, String)> = Vec::with_capacity(old.len() + 8);
        for row in old {
            let Some(path) = row.first() else { continue };
            let first = by_src
                .get_mut(path.as_str())
                .filter(|i| **i != usize::MAX)
                .map(|i| std::mem::replace(i, next[*i]));
            let new = match first {
                Some(i) => {
                    taken[i] = true;
                    installed[i].1.clone()
                }
                None => path.clone(),
            };
            let (hash, size) = match inst.changed.get(&new) {
                Some(text) => (wheel::record_hash(text), text.len().to_string()),
                None => (
                    row.get(1).cloned().unwrap_or_default(),
                    row.get(2).cloned().unwrap_or_default(),
                ),
            };
            rows.push((new, hash, size));
        }
        for (at, data, _) in &generated {
            rows.push((
                inst.record_path(at),
                wheel::record_hash(data),
                data.len().to_string(),
            ));
        }
        rows.extend(
            installed
                .iter()
                .zip(&taken)
                .filter(|(_, t)| !**t)
                .map(|((_, new), _)| (new.clone(), String::new(), String::new())),
        );
        // Generated files replace members at the same place, as pip overwrites them.
        // (A few: a list.)
        let paths: Vec<Vec<u8>> = generated
            .iter()
            .map(|(at, _, _)| inst.rel_root(at))
            .collect();
        inst.out.retain(|e| !paths.contains(&e.path));
        for (at, data, perm) in &generated {
            let path = inst.rel_root(at);
            inst.out.push(inline_file(&path, data, *perm, mtime));
        }
        // pip compiles what it installed from the wheel, not what it generated.
        // pip compiles each at the library directory joined with its RECORD path
        // (`site-packages/../../../bin/x.py` for a script): the code's file name.
        let sources = inst
            .out
            .iter()
            .filter(|e| e.kind == EntryKind::File && e.path.ends_with(b".py"))
            .filter(|e| !paths.contains(&e.path))
            .map(|e| {
                if e.path.starts_with(&lib_rel) && e.path.get(lib_rel.len()) == Some(&b'/') {
                    return (
                        e.path.clone(),
                        String::from_utf8_lossy(&e.path).into_owned(),
                    );
                }
                let mut dest = self.scheme.root.clone();
                dest.extend(e.path.split(|&b| b == b'/').map(<[u8]>::to_vec));
                let as_pip = [&lib_rel[..], b"/", &wheel::relpath(&dest, &lib)].concat();
                (
                    e.path.clone(),
                    String::from_utf8_lossy(&as_pip).into_owned(),
                )
            })
            .collect::<Vec<_>>();
        let sha256 = sha256_hex(facts);
        if let Some(b) = &self.bytecode {
            let replaced = b.replaced(sha256.as_deref(), &sources, &inst.out);
            inst.out.retain(|e| !replaced.contains(&e.path));
        }
        self.records.push(Record {
            at: inst.rel_root(&record_at),
            rows,
            lib,
            mtime,
            sha256,
            sources,
        });
        self.taken.insert(key, name.to_path_buf());
        Ok(inst.out)
    }
}

/// Member `e` of a wheel as installed at `path` (relative to the environment): pip
/// writes a symlink member as a file of its target's text, and a file with mode 0755 or
/// 0644 by `exec`; owners and extended attributes are not kept.
fn installed_entry(e: &Entry, path: Vec<u8>, exec: bool) -> Entry {
    let (kind, size, data, perm) = if e.kind == EntryKind::Symlink {
        let size = e.link.len() as u64;
        (
            EntryKind::File,
            size,
            Loc::Inline(e.link.clone().into()),
            0o644,
        )
    } else {
        let perm = if exec { 0o755 } else { 0o644 };
        (e.kind, e.size, e.data.clone(), perm)
    };
    Entry {
        path,
        kind,
        perm,
        mtime: e.mtime,
        uid: None,
        gid: None,
        size,
        data,
        link: Vec::new(),
        rdev: 0,
        xattrs: Vec::new(),
    }
}

/// Why a wheel is not installed.
enum NotPlaced {
    /// Refused, with a warning.
    Refused(String),
    /// Not this lock's (another version, another interpreter's): logged at `info`.
    Unused(String),
}

impl From<String> for NotPlaced {
    fn from(s: String) -> Self {
        NotPlaced::Refused(s)
    }
}

impl From<&str> for NotPlaced {
    fn from(s: &str) -> Self {
        NotPlaced::Refused(s.to_string())
    }
}

/// The sha256 the inspector found of a wheel, in hex.
fn sha256_hex(facts: &Facts) -> Option<String> {
    facts
        .digests
        .iter()
        .find(|(a, _)| *a == "sha256")
        .map(|(_, d)| d.iter().map(|b| format!("{b:02x}")).collect())
}

impl Plan {
    /// Whether the lock wants this wheel of `project` (normal name `key`): the version it
    /// pins, a file it lists (pylock), tags the interpreter supports, and its sha256
    /// among the lock's hashes (checked before any of it is placed).
    fn admit(
        &mut self,
        name: &Path,
        key: &str,
        project: &str,
        version: Option<&str>,
        facts: &Facts,
    ) -> std::result::Result<(), NotPlaced> {
        let file = String::from_utf8_lossy(super::file_name(name)).into_owned();
        let Some(locked) = self.locked.get(key) else {
            return Err(NotPlaced::Unused(format!(
                "{project} is not in the lock file"
            )));
        };
        if version != Some(locked.version.as_str()) {
            return Err(NotPlaced::Unused(format!(
                "{project} {}: the lock file wants {}",
                version.unwrap_or("(no version)"),
                locked.version
            )));
        }
        if let Some(files) = &locked.files
            && !files.contains(&file)
        {
            return Err(NotPlaced::Unused(format!(
                "{file} is not a wheel the lock file lists"
            )));
        }
        if self.supported.is_some() {
            let Some((_, _, rank)) = self.rank(&file) else {
                return Err(NotPlaced::Unused(format!(
                    "{file} is not for this interpreter"
                )));
            };
            if let Some((best, better)) = self.best.get(&(key.to_string(), locked.version.clone()))
                && *best < rank
            {
                return Err(NotPlaced::Unused(format!(
                    "{better} is the wheel of {project} {} this interpreter prefers",
                    locked.version
                )));
            }
        }
        let digest = sha256_hex(facts).unwrap_or_default();
        if !locked.sha256.contains(&digest) {
            self.refused.insert(key.to_string());
            return Err(NotPlaced::Refused(format!(
                "{project} {}: sha256 {digest} is not one the lock file gives ({})",
                locked.version,
                locked.sha256.join(", ")
            )));
        }
        Ok(())
    }
}

impl Layout for Python {
    fn takes(&self, file_name: &[u8]) -> bool {
        file_name.ends_with(b".whl")
            || (self.bytecode.is_some() && file_name.ends_with(bytecode::PACK_SUFFIX.as_bytes()))
    }

    fn listed(&mut self, file_names: &[&[u8]]) {
        if let Some(b) = &mut self.bytecode {
            b.listed(file_names);
        }
        let Some(plan) = &mut self.plan else { return };
        for f in file_names {
            let f = String::from_utf8_lossy(f).into_owned();
            if let Some((name, version, rank)) = plan.rank(&f) {
                let slot = plan
                    .best
                    .entry((name, version))
                    .or_insert((rank, f.clone()));
                if rank < slot.0 {
                    *slot = (rank, f);
                }
            }
        }
    }

    fn inspector(&self) -> Box<dyn super::Inspect> {
        Box::new(Inspector {
            digest: self.plan.is_some() || self.bytecode.is_some(),
            cache: self.index_cache.clone(),
        })
    }

    fn place(&mut self, name: &Path, entries: &mut Vec<Entry>, facts: &Facts) -> Placement {
        let placed = match &mut self.bytecode {
            Some(b) if bytecode::pack_name(super::file_name(name)).is_some() => {
                b.place(name, entries, &mut self.records)
            }
            _ => self.install(name, entries, facts),
        };
        match placed {
            Ok(out) => {
                *entries = out;
                Placement::Fold(vec![Place::default()])
            }
            Err(NotPlaced::Refused(why)) => Placement::Refused(why),
            Err(NotPlaced::Unused(why)) => Placement::Unused(why),
        }
    }

    fn finish(&mut self) -> Result<Vec<Entry>> {
        if let Some(plan) = &self.plan {
            let missing: Vec<String> = plan
                .locked
                .iter()
                .filter(|(k, _)| !self.taken.contains_key(*k) && !plan.refused.contains(*k))
                .map(|(_, l)| format!("{}=={}", l.name, l.version))
                .collect();
            if !missing.is_empty() {
                let list = missing.join(", ");
                if !plan.allow_missing {
                    return Err(Error::Format(format!(
                        "{} project(s) of the lock file have no wheel in the sources for this interpreter: {list} (--allow-missing mounts without them)",
                        missing.len()
                    )));
                }
                log::warn!(
                    "{} project(s) of the lock file have no wheel in the sources: {list}",
                    missing.len()
                );
            }
        }
        let mut out = self.skeleton.clone();
        for r in &mut self.records {
            out.push(inline_file(
                &r.at,
                &wheel::write_record(&mut r.rows),
                0o644,
                r.mtime,
            ));
        }
        Ok(out)
    }

    fn chore(&mut self) -> Option<Box<dyn super::Chore>> {
        let b = self.bytecode.as_mut()?;
        b.chore(&self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuptools_wrappers_are_recognised_as_pip_does() {
        let ep = |n: &str| EntryPoint {
            name: n.into(),
            module: "m".into(),
            attr: "f".into(),
        };
        let console = [ep("jp")];
        for f in ["jp", "jp.exe", "jp-script.py", "jp.pya", "JP.EXE"] {
            assert_eq!(
                is_entrypoint_wrapper(f, &console, &[]),
                f != "JP.EXE",
                "{f}"
            );
        }
        assert!(!is_entrypoint_wrapper("jp.py", &console, &[]));
    }
}
