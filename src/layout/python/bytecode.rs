//! Bytecode: the `__pycache__` files pip's compiled install has, served from packs.
//!
//! A read-only `site-packages` cannot take the `.pyc` files an interpreter writes, so
//! without them every start compiles every module it imports. pip compiles each `.py`
//! file it installs from a wheel (`compileall.compile_file`, the interpreter's default
//! invalidation mode: timestamps); pkgfs does the same once per wheel and interpreter,
//! in the background after the mount, and serves the result:
//!
//! - A **pack** is a ZIP of stored members, `SHA256.TAG.pyc.zip` in the bytecode
//!   directory (`INDEX_CACHE/python/`, a source of every python mount): SHA256 is the
//!   wheel file's, TAG the interpreter's cache tag and magic number
//!   (`cpython-311-a70d0d0a`). Its members are the `.pyc` files at their paths in the
//!   environment (`lib/python3.11/site-packages/pkg/__pycache__/m.cpython-311.pyc`),
//!   which are the same for every environment of that interpreter: one pack serves
//!   every environment of the wheel.
//! - **Placing** ([`Bytecode::place`]): a pack is placed only after its wheel, with
//!   each member checked to be the cache file of a `.py` that wheel installed; its
//!   files become rows of the wheel's `RECORD` with no hash, as pip lists them.
//! - **Compiling** ([`Compile`], a [`Chore`] run once the mount serves): the
//!   interpreter compiles the wheel's files *through the mount* (`py_compile`, so the
//!   header's source time and size are what the mount serves, and the code's file name
//!   is the environment's path, as pip's), into a hidden file of the bytecode
//!   directory renamed into place; the watched directory then activates it like any
//!   new package. A file that does not compile (pip skips it too) is left out.
//!
//! A `.pyc` carries the path of the environment it was compiled for; the interpreter
//! replaces it with the path it loads from (`_imp._fix_co_filename`), so another
//! environment's tracebacks name their own files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{NotPlaced, Record, wheel};
use crate::error::{Error, Result};
use crate::format::{Entry, EntryKind};

/// The file name suffix of a bytecode pack.
pub const PACK_SUFFIX: &str = ".pyc.zip";

/// How long one compile of an environment's missing bytecode may take.
const COMPILE_WAIT: Duration = Duration::from_secs(3600);

/// Compiles the wheels of `job` (JSON on stdin) through the mount into packs, as pip
/// compiles an install: `py_compile` of each file at its installed path, warnings and
/// failures silenced (a file that fails is left out); ends when its parent does.
const COMPILE: &str = r#"
import importlib.util, json, os, py_compile, sys, tempfile, time, warnings, zipfile
job = json.load(sys.stdin)
parent = os.getppid()
try:
    os.nice(10)
except OSError:
    pass
warnings.filterwarnings("ignore")
venv, out, tag = job["venv"], job["dir"], job["tag"]
with tempfile.TemporaryDirectory() as tmp:
    cfile = os.path.join(tmp, "c.pyc")
    for w in job["wheels"]:
        if os.getppid() != parent:
            sys.exit(1)
        name = "%s.%s.pyc.zip" % (w["sha256"], tag)
        final = os.path.join(out, name)
        if not w["replace"] and os.path.exists(final):
            continue
        part = os.path.join(out, ".%s.%d.part" % (name, os.getpid()))
        n = 0
        with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as z:
            for rel in w["files"]:
                src = os.path.join(venv, rel)
                try:
                    py_compile.compile(src, cfile=cfile, doraise=True)
                except Exception:
                    continue
                at = os.path.relpath(importlib.util.cache_from_source(src), venv)
                info = zipfile.ZipInfo(at, time.localtime()[:6])
                info.create_system = 3
                info.external_attr = 0o100644 << 16
                with open(cfile, "rb") as f:
                    z.writestr(info, f.read())
                n += 1
        os.replace(part, final)
        print(w["sha256"], n, len(w["files"]), flush=True)
"#;

/// A pack's wheel sha256 (64 hex digits) and interpreter tag, from its file name.
pub fn pack_name(file_name: &[u8]) -> Option<(&str, &str)> {
    let s = std::str::from_utf8(file_name).ok()?;
    let stem = s.strip_suffix(PACK_SUFFIX)?;
    let (sha, tag) = stem.split_once('.')?;
    (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) && !tag.is_empty())
        .then_some((sha, tag))
}

/// The cache file of source `py` (relative path) for interpreter tag `cache_tag`, as
/// `importlib.util.cache_from_source` names it: `DIR/__pycache__/NAME.TAG.pyc`.
#[cfg(test)]
fn cache_file(py: &[u8], cache_tag: &str) -> Option<Vec<u8>> {
    let stem = py.strip_suffix(b".py")?;
    let (dir, name) = match stem.iter().rposition(|&b| b == b'/') {
        Some(i) => (&stem[..=i], &stem[i + 1..]),
        None => (&b""[..], stem),
    };
    Some(
        [
            dir,
            b"__pycache__/",
            name,
            b".",
            cache_tag.as_bytes(),
            b".pyc",
        ]
        .concat(),
    )
}

/// The module whose cache file (as [`cache_file`] names it) `cache` is.
fn source_of(cache: &[u8], cache_tag: &str) -> Option<Vec<u8>> {
    let rest = cache
        .strip_suffix(b".pyc")?
        .strip_suffix(cache_tag.as_bytes())?
        .strip_suffix(b".")?;
    let (dir, name) = match rest.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rest[..=i], &rest[i + 1..]),
        None => return None,
    };
    let dir = dir.strip_suffix(b"__pycache__/")?;
    if name.is_empty() || !(dir.is_empty() || dir.ends_with(b"/")) {
        return None;
    }
    Some([dir, name, b".py"].concat())
}

/// The python layout's bytecode for one scan.
pub struct Bytecode {
    dir: PathBuf,
    /// `cache_tag-magic`.
    tag: String,
    python: PathBuf,
    venv: PathBuf,
    /// Wheels (sha256) whose pack this scan listed.
    listed: HashSet<String>,
    /// Wheels whose pack was placed.
    placed: HashSet<String>,
}

impl Bytecode {
    /// Packs in `dir` for the interpreter `python` (bytecode tag `tag`), of an
    /// environment at `venv`.
    pub fn new(dir: PathBuf, tag: String, python: PathBuf, venv: PathBuf) -> Self {
        Bytecode {
            dir,
            tag,
            python,
            venv,
            listed: HashSet::new(),
            placed: HashSet::new(),
        }
    }

    /// The interpreter's `sys.implementation.cache_tag` (the tag less its magic number).
    fn cache_tag(&self) -> &str {
        self.tag.rsplit_once('-').map_or(&self.tag, |(t, _)| t)
    }

    /// Note the packs of this interpreter among the scan's files.
    pub fn listed(&mut self, file_names: &[&[u8]]) {
        for f in file_names {
            if let Some((sha, tag)) = pack_name(f)
                && tag == self.tag
            {
                self.listed.insert(sha.to_ascii_lowercase());
            }
        }
    }

    /// The cache files among a wheel's own members (`installed`, relative to the
    /// environment) that its pack replaces, if this scan lists its pack: pip compiles
    /// over a `.pyc` a wheel ships (numpy ships one), so the pack's is the one shown, not
    /// a conflict.
    pub(super) fn replaced(
        &self,
        sha256: Option<&str>,
        sources: &[(Vec<u8>, String)],
        installed: &[Entry],
    ) -> HashSet<Vec<u8>> {
        if !sha256.is_some_and(|s| self.listed.contains(s))
            || !installed.iter().any(|e| e.path.ends_with(b".pyc"))
        {
            return HashSet::new();
        }
        let sources: HashSet<&[u8]> = sources.iter().map(|(py, _)| py.as_slice()).collect();
        installed
            .iter()
            .filter(|e| {
                source_of(&e.path, self.cache_tag())
                    .is_some_and(|py| sources.contains(py.as_slice()))
            })
            .map(|e| e.path.clone())
            .collect()
    }

    /// Place the pack `name` after its wheel: its members are the cache files of the
    /// wheel's sources, added to its `RECORD` (of `records`) with no hash.
    pub(super) fn place(
        &mut self,
        name: &Path,
        entries: &[Entry],
        records: &mut [Record],
    ) -> std::result::Result<Vec<Entry>, NotPlaced> {
        let file = super::super::file_name(name);
        let Some((sha, tag)) = pack_name(file) else {
            return Err(NotPlaced::Unused("not a bytecode pack".into()));
        };
        if tag != self.tag {
            return Err(NotPlaced::Unused(format!(
                "bytecode of another interpreter ({tag}; this one's is {})",
                self.tag
            )));
        }
        let sha = sha.to_ascii_lowercase();
        let Some(record) = records
            .iter_mut()
            .find(|r| r.sha256.as_deref() == Some(sha.as_str()))
        else {
            return Err(NotPlaced::Unused(
                "bytecode of a wheel this environment does not install".into(),
            ));
        };
        let sources: HashSet<&[u8]> = record.sources.iter().map(|(py, _)| py.as_slice()).collect();
        let venv = super::interp::abs_components(&self.venv);
        // The library directory relative to the environment, if it is inside it.
        let lib_rel = record
            .lib
            .starts_with(&venv)
            .then(|| record.lib[venv.len()..].join(&b'/'));
        let mut out = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            if e.kind == EntryKind::Dir {
                continue;
            }
            let shown = String::from_utf8_lossy(&e.path).into_owned();
            let comps = crate::tree::path::components(&e.path)
                .map_err(|err| format!("bytecode pack member {shown:?}: {err}"))?;
            let rel = comps.join(&b'/');
            let of_a_module =
                source_of(&rel, self.cache_tag()).is_some_and(|py| sources.contains(py.as_slice()));
            if e.kind != EntryKind::File || !of_a_module {
                return Err(NotPlaced::Refused(format!(
                    "bytecode pack member {shown:?} is not the cache file of a module of its wheel"
                )));
            }
            let at = match &lib_rel {
                Some(l) if rel.starts_with(l) && rel.get(l.len()) == Some(&b'/') => {
                    String::from_utf8_lossy(&rel[l.len() + 1..]).into_owned()
                }
                _ => {
                    let mut abs = venv.clone();
                    abs.extend(comps.iter().map(|c| c.to_vec()));
                    String::from_utf8_lossy(&wheel::relpath(&abs, &record.lib)).into_owned()
                }
            };
            rows.push((at, String::new(), String::new()));
            out.push(Entry {
                path: rel,
                kind: EntryKind::File,
                perm: 0o644,
                mtime: e.mtime,
                uid: None,
                gid: None,
                size: e.size,
                data: e.data.clone(),
                link: Vec::new(),
                rdev: 0,
                xattrs: Vec::new(),
            });
        }
        record.rows.extend(rows);
        self.placed.insert(sha);
        Ok(out)
    }

    /// The compile of every placed wheel with sources and no pack placed (a pack listed
    /// but not placed is made again).
    pub(super) fn chore(&mut self, records: &[Record]) -> Option<Box<dyn super::super::Chore>> {
        let wheels: Vec<Job> = records
            .iter()
            .filter(|r| !r.sources.is_empty())
            .filter_map(|r| {
                let sha = r.sha256.clone()?;
                (!self.placed.contains(&sha)).then(|| Job {
                    replace: self.listed.contains(&sha),
                    files: r.sources.iter().map(|(_, as_pip)| as_pip.clone()).collect(),
                    sha256: sha,
                })
            })
            .collect();
        if wheels.is_empty() {
            return None;
        }
        Some(Box::new(Compile {
            python: self.python.clone(),
            job: CompileJob {
                venv: self.venv.to_string_lossy().into_owned(),
                dir: self.dir.to_string_lossy().into_owned(),
                tag: self.tag.clone(),
                wheels,
            },
        }))
    }
}

/// One wheel to compile.
#[derive(serde::Serialize)]
struct Job {
    sha256: String,
    /// Make it even if a pack exists (the one listed could not be placed).
    replace: bool,
    /// Its `.py` files, relative to the environment, as pip names them (the library
    /// directory joined with the RECORD path: the code's file name).
    files: Vec<String>,
}

/// What [`COMPILE`] reads.
#[derive(serde::Serialize)]
struct CompileJob {
    venv: String,
    dir: String,
    tag: String,
    wheels: Vec<Job>,
}

/// The bytecode an environment lacks, compiled by its interpreter through the mount.
struct Compile {
    python: PathBuf,
    job: CompileJob,
}

impl super::super::Chore for Compile {
    fn describe(&self) -> String {
        format!(
            "compiling the bytecode of {} wheel(s) of {} into {}",
            self.job.wheels.len(),
            self.job.venv,
            self.job.dir
        )
    }

    fn run(mut self: Box<Self>) -> Result<Option<String>> {
        // Packs made since the scan that asked (by an earlier chore) are not made again.
        let dir = PathBuf::from(&self.job.dir);
        let tag = self.job.tag.clone();
        self.job.wheels.retain(|w| {
            w.replace
                || !dir
                    .join(format!("{}.{tag}{PACK_SUFFIX}", w.sha256))
                    .exists()
        });
        if self.job.wheels.is_empty() {
            return Ok(None);
        }
        let done = format!(
            "compiled the bytecode of {} wheel(s) for {}",
            self.job.wheels.len(),
            self.job.venv
        );
        let input = serde_json::to_vec(&self.job)
            .map_err(|e| Error::Internal(format!("the compile job: {e}")))?;
        let out = super::interp::run_with(
            Command::new(&self.python).arg("-I").arg("-c").arg(COMPILE),
            "compiling bytecode",
            Some(&input),
            COMPILE_WAIT,
        )?;
        for line in String::from_utf8_lossy(&out).lines() {
            log::debug!("bytecode compiled (wheel sha256, files, of): {line}");
        }
        Ok(Some(done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_are_named_by_wheel_hash_and_interpreter() {
        let sha = "ab".repeat(32);
        let name = format!("{sha}.cpython-311-a70d0d0a.pyc.zip");
        assert_eq!(
            pack_name(name.as_bytes()),
            Some((sha.as_str(), "cpython-311-a70d0d0a"))
        );
        for bad in [
            "x.cpython-311-a70d0d0a.pyc.zip".to_string(),
            format!("{sha}.pyc.zip"),
            format!("{sha}..pyc.zip"),
            format!("{sha}.cpython-311.zip"),
        ] {
            assert_eq!(pack_name(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn cache_files_are_named_as_importlib_names_them() {
        assert_eq!(
            cache_file(b"lib/p/site-packages/a/b.py", "cpython-311").unwrap(),
            b"lib/p/site-packages/a/__pycache__/b.cpython-311.pyc"
        );
        assert_eq!(
            cache_file(b"m.py", "cpython-311").unwrap(),
            b"__pycache__/m.cpython-311.pyc"
        );
        assert_eq!(cache_file(b"m.pyx", "cpython-311"), None);
        // And back.
        for py in [&b"lib/p/site-packages/a/b.py"[..], b"m.py", b"a/b.c.py"] {
            let c = cache_file(py, "cpython-311").unwrap();
            assert_eq!(source_of(&c, "cpython-311").unwrap(), py);
        }
        for not in [
            &b"a/b.cpython-311.pyc"[..],
            b"a/__pycache__/b.cpython-312.pyc",
            b"a/__pycache__/.cpython-311.pyc",
            b"a__pycache__/b.cpython-311.pyc",
            b"a/__pycache__/b.cpython-311.pyc.x",
        ] {
            assert_eq!(
                source_of(not, "cpython-311"),
                None,
                "{}",
                String::from_utf8_lossy(not)
            );
        }
    }
}
