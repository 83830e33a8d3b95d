//! The interpreter a Python environment is for: its version and install scheme, asked
//! of the interpreter itself, and the environment's own files (`pyvenv.cfg`, `bin/python*`,
//! the activate scripts) as `python -m venv --without-pip` makes them.
//!
//! The skeleton is made by the interpreter's own `venv` module, in a temporary directory
//! whose last component is the environment's (the prompt the activate scripts show is
//! that name), and its path replaced by the environment's in every file and link: the
//! result is what `python -m venv --without-pip VENV` writes, for any Python version and
//! any distribution's patches to `venv`, without pkgfs knowing its templates.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::Entry;

/// A skeleton file larger than this is refused (the activate scripts are a few KiB).
const MAX_SKELETON_FILE: u64 = 1 << 20;
/// How long the interpreter may take to answer or to make the skeleton.
const PYTHON_WAIT: Duration = Duration::from_secs(60);

/// Asks the interpreter for its version and the `venv` scheme's paths for an
/// environment at `sys.argv[1]`, as pip computes them inside one.
/// Also its PEP 508 marker variables, and the wheel tags it supports in order of
/// preference (`packaging.tags.sys_tags()`, from `packaging`, pip's copy of it, or the
/// copy in the pip wheel its `ensurepip` bundles; else [`FALLBACK_TAGS`]). Run with
/// [`FALLBACK_TAGS`] in front.
const PROBE: &str = r#"
import importlib, importlib.util, json, os, platform, sys, sysconfig
venv = sys.argv[1]
scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
v = {"base": venv, "platbase": venv, "installed_base": venv, "installed_platbase": venv}
p = sysconfig.get_paths(scheme=scheme, vars=v)
i = sys.implementation.version
iv = "%d.%d.%d" % (i.major, i.minor, i.micro)
if i.releaselevel != "final":
    iv += i.releaselevel[0] + str(i.serial)
markers = {
    "implementation_name": sys.implementation.name, "implementation_version": iv,
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}
tags = tags_from = None
for mod in ("packaging.tags", "pip._vendor.packaging.tags"):
    try:
        tags = [str(t) for t in importlib.import_module(mod).sys_tags()]
        tags_from = mod
        break
    except Exception:
        pass
bundled = None
if tags is None:
    # The pip wheel the interpreter's own ensurepip installs (upstream: `_bundled`
    # beside it; Debian and Fedora: WHEEL_PKG_DIR, /usr/share/python-wheels), imported
    # from the wheel: packaging's tags for musl, PyPy, free-threaded builds alike.
    import glob
    def version(w):
        v = os.path.basename(w).split("-")[1]
        return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))
    try:
        import ensurepip
        places = [os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")]
    except Exception:
        places = []
    places += [sysconfig.get_config_var("WHEEL_PKG_DIR"), "/usr/share/python-wheels"]
    wheels = [w for d in places if d for w in glob.glob(os.path.join(d, "pip-*.whl"))]
    for w in sorted(wheels, key=version, reverse=True):
        try:
            sys.path.insert(0, w)
            tags = [str(t) for t in importlib.import_module("pip._vendor.packaging.tags").sys_tags()]
            tags_from, bundled = "pip._vendor.packaging.tags from " + w, w
            break
        except Exception:
            sys.path.remove(w)
            for m in [m for m in sys.modules if m == "pip" or m.startswith("pip.")]:
                del sys.modules[m]
if tags is None:
    tags = fallback_tags()
    tags_from = None if tags is None else "computed"
tag = sys.implementation.cache_tag
bytecode = None if tag is None else tag + "-" + importlib.util.MAGIC_NUMBER.hex()
# The files these answers (and venv's) come from: a change to one asks again.
deps = [sys.executable] + ([bundled] if bundled else [])
for mod in ("sysconfig", "venv", "site", tags_from if tags_from in
            ("packaging.tags", "pip._vendor.packaging.tags") else None,
            getattr(sysconfig, "_get_sysconfigdata_name", lambda: None)()):
    try:
        spec = mod and importlib.util.find_spec(mod)
        if spec and spec.origin and os.path.isfile(spec.origin):
            deps.append(spec.origin)
    except Exception:
        pass
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "bytecode": bytecode,
                  "purelib": p["purelib"], "platlib": p["platlib"],
                  "scripts": p["scripts"], "data": p["data"],
                  "markers": markers, "tags": tags, "tags_from": tags_from, "deps": deps}))
"#;

/// The tags `packaging.tags.sys_tags()` gives, for CPython on glibc Linux, computed as it
/// computes them, for an interpreter with neither `packaging` nor pip (Debian's
/// `/usr/bin/python3` without `python3-pip`): `cpXY` with its own ABI, `abi3` and `none`
/// on each platform (manylinux from the C library's version down, with the legacy
/// aliases, then `linux_ARCH`), older `abi3`, `pyXY`…`pyX0` on each platform, then
/// `cpXY-none-any` and the `py` versions on `any`. Elsewhere: `None` (every wheel taken).
const FALLBACK_TAGS: &str = r#"
def fallback_tags():
    import os, platform, sys, sysconfig
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        return None
    x, y = sys.version_info[:2]
    arch = sysconfig.get_platform().split("-", 1)[-1].replace(".", "_").replace("-", "_")
    plats = []
    try:
        lib, ver = os.confstr("CS_GNU_LIBC_VERSION").split()
        gmaj, gmin = (int(v) for v in ver.split(".")[:2])
    except Exception:
        lib = None
    if lib == "glibc" and gmaj == 2:
        low = 5 if arch in ("x86_64", "i686") else 17
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        for minor in range(gmin, low - 1, -1):
            plats.append("manylinux_2_%d_%s" % (minor, arch))
            if minor in legacy and (arch in ("x86_64", "i686") or minor == 17):
                plats.append("%s_%s" % (legacy[minor], arch))
    plats.append("linux_" + arch)
    cp = "cp%d%d" % (x, y)
    out = []
    for abi in (cp, "abi3", "none"):
        out += ["%s-%s-%s" % (cp, abi, p) for p in plats]
    for m in range(y - 1, 1, -1):
        out += ["cp%d%d-abi3-%s" % (x, m, p) for p in plats]
    pys = ["py%d%d" % (x, y), "py%d" % x] + ["py%d%d" % (x, m) for m in range(y - 1, -1, -1)]
    for v in pys:
        out += ["%s-none-%s" % (v, p) for p in plats]
    out.append(cp + "-none-any")
    out += [v + "-none-any" for v in pys]
    return out
"#;

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Probe {
    version: String,
    bytecode: Option<String>,
    purelib: String,
    platlib: String,
    scripts: String,
    data: String,
    markers: std::collections::HashMap<String, String>,
    tags: Option<Vec<String>>,
    /// Where the tags came from: `packaging.tags`, pip's copy, pip's copy in the wheel
    /// `ensurepip` installs, or `computed` ([`FALLBACK_TAGS`]).
    #[serde(default)]
    tags_from: Option<String>,
    /// The files the answers (and `venv`'s) come from.
    #[serde(default)]
    deps: Vec<String>,
}

/// Where an environment's files go, as absolute component lists.
#[derive(Debug, Clone)]
pub struct Scheme {
    /// `X.Y`.
    pub version: String,
    /// The environment's root.
    pub root: Vec<Vec<u8>>,
    /// Pure-Python packages (`site-packages`).
    pub purelib: Vec<Vec<u8>>,
    /// Platform-specific packages (the same directory in most environments).
    pub platlib: Vec<Vec<u8>>,
    /// Scripts and launchers (`bin`).
    pub scripts: Vec<Vec<u8>>,
    /// Data files (the environment's root).
    pub data: Vec<Vec<u8>>,
    /// `include/site/pythonX.Y`: pip's header directory in an environment (a project's
    /// headers go in a directory of its name below).
    pub headers: Vec<Vec<u8>>,
    /// PEP 508 marker variables.
    pub markers: super::lock::Markers,
    /// The wheel tags the interpreter supports, if it could say.
    pub tags: Option<Vec<String>>,
    /// Its bytecode's name: `sys.implementation.cache_tag` and the magic number
    /// (`cpython-311-a70d0d0a`); `None`: it writes no bytecode.
    pub bytecode: Option<String>,
}

/// What the interpreter said of an environment: its [`Scheme`] and the environment's own
/// files (entries relative to its root).
type Asked = (Scheme, Vec<Entry>);

/// The scheme and skeleton of `python` for an environment at `venv`.
///
/// Asked once per process while the interpreter's file is unchanged (a live mount
/// rescans often), and kept in `cache` (the index cache) across processes: each ask
/// costs two interpreter starts (about 0.14 s here), a kept answer a few `stat`s. A kept
/// answer is used while the interpreter, every file it named as a source of its answers
/// (`sysconfig`, `venv`, `site`, the tags module, the sysconfig data) and the kernel
/// release are as they were; it is made in a directory named as `venv` (a stand-in
/// name for a plain one), so one answer serves every environment of that name (every
/// plain name), paths and name replaced as [`skeleton_of`] does.
pub fn asked(
    python: &Path,
    venv: &Path,
    cache: Option<&crate::format::IndexCache>,
) -> Result<Asked> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Key = (PathBuf, PathBuf, String);
    static ASKED: OnceLock<Mutex<HashMap<Key, Asked>>> = OnceLock::new();
    let id = identity(python).map_err(|e| Error::Format(format!("{}: {e}", python.display())))?;
    let key = (python.to_path_buf(), venv.to_path_buf(), id.clone());
    let memo = ASKED.get_or_init(Default::default);
    if let Some(a) = crate::sync::lock(memo).get(&key) {
        return Ok(a.clone());
    }
    let name = venv.file_name().unwrap_or(venv.as_os_str());
    // A plain name is asked as a stand-in, replaced afterwards: one answer serves every
    // environment with a plain name (ten environments keep one answer, not ten).
    let plain = is_plain(name.as_encoded_bytes());
    let asked_as = if plain {
        std::ffi::OsStr::new(STAND_IN)
    } else {
        name
    };
    let kept_at = cache.map(|c| {
        let question = format!(
            "{}\n{:016x}",
            String::from_utf8_lossy(asked_as.as_encoded_bytes()),
            crc32fast::hash(format!("{FALLBACK_TAGS}{PROBE}{SKELETON_FORM}").as_bytes())
        );
        (
            c,
            c.key_for(
                "python-interp",
                &format!("{}\n{id}", python.display()),
                &question,
            ),
        )
    });
    let kept = kept_at
        .as_ref()
        .and_then(|(c, k)| c.load(k))
        .and_then(|b| serde_json::from_slice::<Kept>(&b).ok())
        .filter(Kept::holds);
    let answers = match kept {
        Some(k) => k.answers,
        None => {
            let answers = ask(python, asked_as)?;
            if let Some((c, k)) = &kept_at {
                let kept = Kept::of(answers);
                match serde_json::to_vec(&kept).map_err(|e| Error::Internal(e.to_string())) {
                    Ok(b) => {
                        if let Err(e) = c.store(k, &b) {
                            log::warn!("keeping the interpreter's answers: {e}");
                        }
                    }
                    Err(e) => log::warn!("keeping the interpreter's answers: {e}"),
                }
                kept.answers
            } else {
                answers
            }
        }
    };
    log::debug!(
        "{}: wheel tags from {}",
        python.display(),
        answers
            .probe
            .tags_from
            .as_deref()
            .unwrap_or("nowhere (every wheel is taken)")
    );
    let a = (
        scheme_of(&answers.probe, &answers.made, venv)?,
        skeleton_of(&answers, venv, now()),
    );
    crate::sync::lock(memo).insert(key, a.clone());
    Ok(a)
}

/// Bumped when the skeleton's kept form or its making changes (part of the key).
const SKELETON_FORM: &str = "skeleton 2";

/// The name an environment with a plain name ([`is_plain`]) is made under, replaced by
/// its own wherever it occurs (the activate scripts' prompt): no template holds it.
const STAND_IN: &str = "pkgfs-venv-name-5b1d4e607f3a9c2e";

/// Whether an environment's name is plain: letters, digits, `.`, `_`, `-` (not `.` or
/// `..`), which `venv` writes into its files as it is, with no quoting that could
/// differ from the stand-in's.
fn is_plain(name: &[u8]) -> bool {
    !name.is_empty()
        && name != b"."
        && name != b".."
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A file's identity: device, inode, size, modification and change times. A package
/// manager replaces a file (a new inode) or writes it (new times).
fn identity(p: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(p)?;
    Ok(format!(
        "{} {} {} {}.{} {}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The kernel's release and version, as `platform.release()` and `platform.version()`
/// (marker variables) give them.
fn uname() -> (String, String) {
    // SAFETY: `uname` fills the struct it is given; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return (String::new(), String::new());
        }
        let s = |f: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(f.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        (s(&u.release), s(&u.version))
    }
}

/// What the interpreter answered, as it made it: paths name the directory `made`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Answers {
    probe: Probe,
    /// The environment's path when it was made (replaced by the mount's).
    made: Vec<u8>,
    skeleton: Vec<Made>,
}

/// One file `python -m venv` made: a directory, a link (`bytes`: its target) or a small
/// file (`bytes`: its content).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Made {
    rel: Vec<u8>,
    kind: MadeKind,
    perm: u16,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum MadeKind {
    Dir,
    Link,
    File,
}

/// [`Answers`] kept on disk, with what they depend on.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    answers: Answers,
    /// Each file the answers came from, and its identity then.
    deps: Vec<(String, String)>,
    /// The kernel's release and version then (marker variables).
    uname: (String, String),
}

impl Kept {
    fn of(answers: Answers) -> Kept {
        let deps = answers
            .probe
            .deps
            .iter()
            .map(|d| (d.clone(), identity(Path::new(d)).unwrap_or_default()))
            .collect();
        Kept {
            answers,
            deps,
            uname: uname(),
        }
    }

    /// Whether nothing it came from has changed.
    fn holds(&self) -> bool {
        self.uname == uname()
            && self
                .deps
                .iter()
                .all(|(p, id)| !id.is_empty() && identity(Path::new(p)).ok().as_ref() == Some(id))
    }
}

/// Ask `python` afresh: the probe and `python -m venv --without-pip` at once (two
/// interpreters, in parallel), for an environment named `name` in a temporary directory.
fn ask(python: &Path, name: &std::ffi::OsStr) -> Result<Answers> {
    let err = |e: std::io::Error| Error::Format(format!("making the environment's files: {e}"));
    let tmp = tempfile::Builder::new()
        .prefix("pkgfs-venv")
        .tempdir()
        .map_err(err)?;
    let made: PathBuf = tmp.path().join(name);
    let (probe, skeleton) = std::thread::scope(|s| {
        let probe = s.spawn(|| probe(python, &made));
        let skeleton = skeleton(python, &made);
        let probe = probe
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the interpreter probe panicked".into())));
        (probe, skeleton)
    });
    Ok(Answers {
        probe: probe?,
        made: made.as_os_str().as_encoded_bytes().to_vec(),
        skeleton: skeleton?,
    })
}

/// Components of an absolute path.
pub fn abs_components(p: &Path) -> Vec<Vec<u8>> {
    p.as_os_str()
        .as_encoded_bytes()
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

/// Run `cmd`, killing it after [`PYTHON_WAIT`]; its stdout, or an error with its stderr.
fn run(cmd: &mut Command, what: &str) -> Result<Vec<u8>> {
    run_with(cmd, what, None, PYTHON_WAIT)
}

/// Run the interpreter command `cmd` with `input` on its standard input (else none),
/// killing it after `wait`: its stdout, or an error saying `what` failed, with its
/// stderr.
pub fn run_with(
    cmd: &mut Command,
    what: &str,
    input: Option<&[u8]>,
    wait: Duration,
) -> Result<Vec<u8>> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Format(format!("{what}: cannot run the interpreter: {e}")))?;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write as _;
        // A child that stops reading has failed: its status and stderr say why.
        let _ = stdin.write_all(data);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = stdout.join().unwrap_or_default();
        let _ = tx.send((out, stderr.join().unwrap_or_default()));
    });
    let Ok((out, err)) = rx.recv_timeout(wait) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Error::Format(format!(
            "{what}: the interpreter did not finish in {} s",
            wait.as_secs()
        )));
    };
    let status = child
        .wait()
        .map_err(|e| Error::Format(format!("{what}: {e}")))?;
    if !status.success() {
        return Err(Error::Format(format!(
            "{what}: the interpreter failed ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        )));
    }
    Ok(out)
}

/// Ask `python` where an environment at `venv` puts each kind of file.
fn probe(python: &Path, venv: &Path) -> Result<Probe> {
    let out = run(
        Command::new(python)
            .arg("-I")
            .arg("-c")
            .arg(format!("{FALLBACK_TAGS}{PROBE}"))
            .arg(venv),
        "asking the interpreter for its install scheme",
    )?;
    serde_json::from_slice(&out)
        .map_err(|e| Error::Format(format!("the interpreter's install scheme: {e}")))
}

/// The scheme of `p`, asked for an environment at `made`, for one at `venv`.
fn scheme_of(p: &Probe, made: &[u8], venv: &Path) -> Result<Scheme> {
    use std::os::unix::ffi::OsStrExt as _;
    let made = abs_components(Path::new(std::ffi::OsStr::from_bytes(made)));
    let root = abs_components(venv);
    let under = |s: &str| -> Result<Vec<Vec<u8>>> {
        let c = abs_components(Path::new(s));
        if !c.starts_with(&made) || c.iter().any(|x| x == b"..") {
            return Err(Error::Format(format!(
                "the interpreter puts files at {s}, outside the environment"
            )));
        }
        Ok([root.clone(), c[made.len()..].to_vec()].concat())
    };
    let mut headers = root.clone();
    headers.extend([
        b"include".to_vec(),
        b"site".to_vec(),
        format!("python{}", p.version).into_bytes(),
    ]);
    Ok(Scheme {
        purelib: under(&p.purelib)?,
        platlib: under(&p.platlib)?,
        scripts: under(&p.scripts)?,
        data: under(&p.data)?,
        headers,
        root,
        version: p.version.clone(),
        markers: p.markers.clone(),
        tags: p.tags.clone(),
        bytecode: p.bytecode.clone(),
    })
}

fn replace_all(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

/// The environment's own files for one at `venv`, from those made at `a.made`: that
/// path replaced by `venv`'s in every file and link, each dated `mtime`.
fn skeleton_of(a: &Answers, venv: &Path, mtime: i64) -> Vec<Entry> {
    let to = venv.as_os_str().as_encoded_bytes();
    let name = venv
        .file_name()
        .unwrap_or(venv.as_os_str())
        .as_encoded_bytes();
    // The path first, then the stand-in name where it is left (the prompt).
    let fix = |b: &[u8]| {
        let b = replace_all(b, &a.made, to);
        if a.made.ends_with(STAND_IN.as_bytes()) {
            replace_all(&b, STAND_IN.as_bytes(), name)
        } else {
            b
        }
    };
    a.skeleton
        .iter()
        .map(|m| match m.kind {
            MadeKind::Dir => super::super::dir(&m.rel, m.perm, mtime),
            MadeKind::Link => super::super::symlink(&m.rel, &fix(&m.bytes), mtime),
            MadeKind::File => super::super::inline_file(&m.rel, &fix(&m.bytes), m.perm, mtime),
        })
        .collect()
}

/// What `python -m venv --without-pip MADE` writes, read back (the result is what it
/// writes for an environment at any path, once `MADE` is replaced: [`skeleton_of`]).
fn skeleton(python: &Path, made: &Path) -> Result<Vec<Made>> {
    let err = |e: std::io::Error| Error::Format(format!("making the environment's files: {e}"));
    run(
        Command::new(python)
            .args(["-I", "-m", "venv", "--without-pip"])
            .arg(made),
        "making the environment with python -m venv",
    )?;
    let mut out = Vec::new();
    let mut stack = vec![made.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(err)?
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(err)?;
        names.sort_by_key(|d| d.file_name());
        for d in names {
            let p = d.path();
            let md = std::fs::symlink_metadata(&p).map_err(err)?;
            let rel = p
                .strip_prefix(made)
                .map_err(|_| Error::Internal("a skeleton path outside its directory".into()))?
                .as_os_str()
                .as_encoded_bytes()
                .to_vec();
            use std::os::unix::fs::MetadataExt as _;
            let perm = (md.mode() & 0o7777) as u16;
            let ft = md.file_type();
            let (kind, bytes) = if ft.is_dir() {
                stack.push(p);
                (MadeKind::Dir, Vec::new())
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&p).map_err(err)?;
                (MadeKind::Link, target.into_os_string().into_encoded_bytes())
            } else if ft.is_file() && md.len() <= MAX_SKELETON_FILE {
                (MadeKind::File, std::fs::read(&p).map_err(err)?)
            } else {
                return Err(Error::Format(format!(
                    "python -m venv made {}, which is not a directory, link or small file",
                    p.display()
                )));
            };
            out.push(Made {
                rel,
                kind,
                perm,
                bytes,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `python3 ARGS` prints; it must succeed.
    fn python3(args: &[&str]) -> Vec<u8> {
        let out = Command::new("python3")
            .args(args)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// The computed tags are `packaging`'s, in its order (pip's copy of it asked on the
    /// same interpreter).
    #[test]
    fn fallback_tags_are_packaging_s() {
        let script = format!(
            "{FALLBACK_TAGS}\nimport json\nfrom pip._vendor.packaging import tags\n\
             print(json.dumps([fallback_tags(), [str(t) for t in tags.sys_tags()]]))"
        );
        let (mut ours, theirs): (Vec<String>, Vec<String>) =
            serde_json::from_slice(&python3(&["-c", &script])).unwrap();
        assert!(theirs.len() > 100);
        // packaging before 22 (pip 23's copy is 21.3) did not list `cpXY-none-any`;
        // the computed list is current packaging's (24.2 gives it, in this place).
        let cp_any = ours
            .iter()
            .position(|t| t.starts_with("cp") && t.ends_with("-none-any"));
        if let Some(i) = cp_any
            && !theirs.contains(&ours[i])
        {
            ours.remove(i);
        }
        assert_eq!(ours, theirs);
    }

    /// An interpreter that cannot import `packaging` or pip (here: without its site
    /// directories) gets packaging's tags from the pip wheel its `ensurepip` bundles;
    /// on this CPython on glibc they are the computed ones (less `cpXY-none-any`, which
    /// packaging before 22 did not list).
    #[test]
    fn tags_come_from_the_bundled_pip_without_packaging_or_pip() {
        let probe = format!("{FALLBACK_TAGS}{PROBE}");
        let p: Probe = serde_json::from_slice(&python3(&["-I", "-S", "-c", &probe, "/v"])).unwrap();
        let from = p.tags_from.clone().unwrap_or_default();
        assert!(
            from.starts_with("pip._vendor.packaging.tags from ") && from.ends_with(".whl"),
            "{from}"
        );
        let whl = from.rsplit(' ').next().unwrap();
        assert!(p.deps.iter().any(|d| d == whl), "{:?}", p.deps);
        let script = format!("{FALLBACK_TAGS}\nimport json\nprint(json.dumps(fallback_tags()))");
        let mut computed: Vec<String> =
            serde_json::from_slice(&python3(&["-I", "-S", "-c", &script])).unwrap();
        let tags = p.tags.unwrap();
        if !tags
            .iter()
            .any(|t| t.starts_with("cp") && t.ends_with("-none-any"))
        {
            computed.retain(|t| !(t.starts_with("cp") && t.ends_with("-none-any")));
        }
        assert!(tags.len() > 100);
        assert_eq!(tags, computed);
    }

    /// A kept answer serves another process (and an environment of the same name at
    /// another path) without starting the interpreter, and is asked again once the
    /// interpreter changes.
    #[test]
    fn answers_are_kept_on_disk_until_the_interpreter_changes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let python = dir.path().join("python");
        let wrapper = format!(
            "#!/bin/sh\necho run >> '{}'\nexec python3 \"$@\"\n",
            count.display()
        );
        std::fs::write(&python, &wrapper).unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = crate::format::IndexCache::new(dir.path().join("cache"));
        let runs = || {
            std::fs::read_to_string(&count)
                .unwrap_or_default()
                .lines()
                .count()
        };

        let (a, skel_a) = asked(&python, Path::new("/srv/a/env"), Some(&cache)).unwrap();
        assert_eq!(runs(), 2, "the probe and python -m venv");
        // Another path (not this process's memo), the same name: from the disk.
        let (b, skel_b) = asked(&python, Path::new("/srv/b/env"), Some(&cache)).unwrap();
        assert_eq!(runs(), 2, "asked again despite a kept answer");
        let b_root = abs_components(Path::new("/srv/b/env"));
        assert!(b.purelib.starts_with(&b_root) && b.purelib.len() > b_root.len());
        assert_eq!(a.purelib[a.root.len()..], b.purelib[b.root.len()..]);
        assert_eq!(
            (a.version, a.tags, a.bytecode),
            (b.version, b.tags, b.bytecode)
        );
        // The skeleton names the environment's own path, never the one it was made at.
        let activate =
            |s: &[Entry]| match &s.iter().find(|e| e.path == b"bin/activate").unwrap().data {
                crate::format::Loc::Inline(d) => String::from_utf8_lossy(d).into_owned(),
                other => panic!("{other:?}"),
            };
        assert!(activate(&skel_a).contains("/srv/a/env"));
        assert!(activate(&skel_b).contains("/srv/b/env"));
        assert!(!activate(&skel_b).contains("pkgfs-venv"));
        assert_eq!(skel_a.len(), skel_b.len());
        // Another plain name: the same kept answer, the prompt its own.
        let (_, skel_d) = asked(&python, Path::new("/srv/d/other.env"), Some(&cache)).unwrap();
        assert_eq!(runs(), 2, "asked again for another plain name");
        assert!(
            activate(&skel_d).contains("(other.env) "),
            "{}",
            activate(&skel_d)
        );
        assert!(activate(&skel_a).contains("(env) "));
        assert!(!activate(&skel_d).contains(STAND_IN));
        // Byte for byte what venv writes there itself.
        let real = dir.path().join("real").join("other.env");
        let st = Command::new("python3")
            .args(["-I", "-m", "venv", "--without-pip"])
            .arg(&real)
            .status()
            .unwrap();
        assert!(st.success());
        let (_, skel_r) = asked(&python, &real, Some(&cache)).unwrap();
        assert_eq!(runs(), 2);
        for e in &skel_r {
            let at = real.join(String::from_utf8_lossy(&e.path).as_ref());
            match &e.data {
                crate::format::Loc::Inline(d) => {
                    assert_eq!(&d[..], std::fs::read(&at).unwrap(), "{}", at.display())
                }
                _ if e.kind == crate::format::EntryKind::Symlink => {
                    assert_eq!(
                        std::fs::read_link(&at)
                            .unwrap()
                            .as_os_str()
                            .as_encoded_bytes(),
                        e.link
                    )
                }
                _ => assert!(at.is_dir(), "{}", at.display()),
            }
        }
        // A name venv might quote is asked as itself.
        let (_, skel_e) = asked(&python, Path::new("/srv/e/my env"), Some(&cache)).unwrap();
        assert_eq!(runs(), 4);
        assert!(activate(&skel_e).contains("(my env) "));

        // The interpreter changes: asked again.
        std::fs::write(&python, format!("{wrapper}\n")).unwrap();
        asked(&python, Path::new("/srv/c/env"), Some(&cache)).unwrap();
        assert_eq!(runs(), 6);
    }

    /// A kept answer holds while each file it came from is as it was.
    #[test]
    fn kept_answers_fail_when_a_source_changes_or_goes() {
        let dir = tempfile::tempdir().unwrap();
        let dep = dir.path().join("sysconfig.py");
        std::fs::write(&dep, "one").unwrap();
        let probe = Probe {
            version: "3.11".into(),
            bytecode: None,
            purelib: "/m/env/lib".into(),
            platlib: "/m/env/lib".into(),
            scripts: "/m/env/bin".into(),
            data: "/m/env".into(),
            markers: Default::default(),
            tags: None,
            tags_from: None,
            deps: vec![dep.display().to_string()],
        };
        let answers = Answers {
            probe,
            made: b"/m/env".to_vec(),
            skeleton: Vec::new(),
        };
        let kept = Kept::of(answers.clone());
        assert!(kept.holds());
        std::fs::write(&dep, "two!").unwrap();
        assert!(!kept.holds());
        let kept = Kept::of(answers);
        std::fs::remove_file(&dep).unwrap();
        assert!(!kept.holds());
    }

    /// Paths of a scheme outside the environment it was asked for are refused.
    #[test]
    fn a_scheme_outside_the_environment_is_refused() {
        let mut probe = Probe {
            version: "3.11".into(),
            bytecode: None,
            purelib: "/m/env/lib/site-packages".into(),
            platlib: "/m/env/lib/site-packages".into(),
            scripts: "/m/env/bin".into(),
            data: "/m/env".into(),
            markers: Default::default(),
            tags: None,
            tags_from: None,
            deps: Vec::new(),
        };
        let s = scheme_of(&probe, b"/m/env", Path::new("/v")).unwrap();
        assert_eq!(s.scripts, vec![b"v".to_vec(), b"bin".to_vec()]);
        probe.scripts = "/m/env/../bin".into();
        assert!(scheme_of(&probe, b"/m/env", Path::new("/v")).is_err());
        probe.scripts = "/usr/bin".into();
        assert!(scheme_of(&probe, b"/m/env", Path::new("/v")).is_err());
    }

    #[test]
    fn paths_are_replaced_wherever_they_occur() {
        assert_eq!(replace_all(b"a/t/v b /t/v", b"/t/v", b"/x"), b"a/x b /x");
        assert_eq!(
            abs_components(Path::new("/a//b/./c/")),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
    }
}
