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

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::format::Entry;

/// A skeleton file larger than this is refused (the activate scripts are a few KiB).
const MAX_SKELETON_FILE: u64 = 1 << 20;
/// How long the interpreter may take to answer or to make the skeleton.
const PYTHON_WAIT: Duration = Duration::from_secs(60);

/// Asks the interpreter for its version and the `venv` scheme's paths for an
/// environment at `sys.argv[1]`, as pip computes them inside one.
/// Also its PEP 508 marker variables, and the wheel tags it supports in order of
/// preference (`packaging.tags.sys_tags()`, from `packaging` or pip's copy of it; else
/// [`FALLBACK_TAGS`]). Run with [`FALLBACK_TAGS`] in front.
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
tags = None
for mod in ("packaging.tags", "pip._vendor.packaging.tags"):
    try:
        tags = [str(t) for t in importlib.import_module(mod).sys_tags()]
        break
    except Exception:
        pass
if tags is None:
    tags = fallback_tags()
tag = sys.implementation.cache_tag
bytecode = None if tag is None else tag + "-" + importlib.util.MAGIC_NUMBER.hex()
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "bytecode": bytecode,
                  "purelib": p["purelib"], "platlib": p["platlib"],
                  "scripts": p["scripts"], "data": p["data"],
                  "markers": markers, "tags": tags}))
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

#[derive(Debug, Deserialize)]
struct Probe {
    version: String,
    bytecode: Option<String>,
    purelib: String,
    platlib: String,
    scripts: String,
    data: String,
    markers: std::collections::HashMap<String, String>,
    tags: Option<Vec<String>>,
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

/// What [`scheme`] and [`skeleton`] said for an interpreter (by its file's identity)
/// and an environment path, kept for the process's later scans.
type Asked = (Scheme, Vec<Entry>);

/// [`scheme`] and [`skeleton`] of `python` for `venv`, asked once per process while the
/// interpreter's file is unchanged (a live mount rescans often; each call costs tens
/// of milliseconds of the interpreter's start).
pub fn asked(python: &Path, venv: &Path) -> Result<Asked> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt as _;
    use std::sync::{Mutex, OnceLock};
    type Key = (PathBuf, PathBuf, (u64, u64, i64, i64, u64));
    static ASKED: OnceLock<Mutex<HashMap<Key, Asked>>> = OnceLock::new();
    let id = std::fs::metadata(python)
        .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
        .map_err(|e| Error::Format(format!("{}: {e}", python.display())))?;
    let key = (python.to_path_buf(), venv.to_path_buf(), id);
    let memo = ASKED.get_or_init(Default::default);
    if let Some(a) = crate::sync::lock(memo).get(&key) {
        return Ok(a.clone());
    }
    let a = (scheme(python, venv)?, skeleton(python, venv)?);
    crate::sync::lock(memo).insert(key, a.clone());
    Ok(a)
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
pub fn scheme(python: &Path, venv: &Path) -> Result<Scheme> {
    let out = run(
        Command::new(python)
            .arg("-I")
            .arg("-c")
            .arg(format!("{FALLBACK_TAGS}{PROBE}"))
            .arg(venv),
        "asking the interpreter for its install scheme",
    )?;
    let p: Probe = serde_json::from_slice(&out)
        .map_err(|e| Error::Format(format!("the interpreter's install scheme: {e}")))?;
    let under = |s: &str| -> Result<Vec<Vec<u8>>> {
        let c = abs_components(Path::new(s));
        let root = abs_components(venv);
        if !c.starts_with(&root) || c.iter().any(|x| x == b"..") {
            return Err(Error::Format(format!(
                "the interpreter puts files at {s}, outside {}",
                venv.display()
            )));
        }
        Ok(c)
    };
    let root = abs_components(venv);
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
        version: p.version,
        markers: p.markers,
        tags: p.tags,
        bytecode: p.bytecode,
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

/// The environment's own files, as `python -m venv --without-pip VENV` writes them:
/// entries relative to the environment's root.
pub fn skeleton(python: &Path, venv: &Path) -> Result<Vec<Entry>> {
    let err = |e: std::io::Error| Error::Format(format!("making the environment's files: {e}"));
    let tmp = tempfile::Builder::new()
        .prefix("pkgfs-venv")
        .tempdir()
        .map_err(err)?;
    let name = venv.file_name().unwrap_or(venv.as_os_str());
    let made: PathBuf = tmp.path().join(name);
    run(
        Command::new(python)
            .args(["-I", "-m", "venv", "--without-pip"])
            .arg(&made),
        "making the environment with python -m venv",
    )?;
    let from = made.as_os_str().as_encoded_bytes().to_vec();
    let to = venv.as_os_str().as_encoded_bytes().to_vec();
    let mut out = Vec::new();
    let mut stack = vec![made.clone()];
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
                .strip_prefix(&made)
                .map_err(|_| Error::Internal("a skeleton path outside its directory".into()))?
                .as_os_str()
                .as_encoded_bytes()
                .to_vec();
            use std::os::unix::fs::MetadataExt as _;
            let perm = (md.mode() & 0o7777) as u16;
            let mtime = md.mtime();
            let ft = md.file_type();
            if ft.is_dir() {
                out.push(super::super::dir(&rel, perm, mtime));
                stack.push(p);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&p).map_err(err)?;
                let target = replace_all(target.as_os_str().as_encoded_bytes(), &from, &to);
                out.push(super::super::symlink(&rel, &target, mtime));
            } else if ft.is_file() && md.len() <= MAX_SKELETON_FILE {
                let data = replace_all(&std::fs::read(&p).map_err(err)?, &from, &to);
                out.push(super::super::inline_file(&rel, &data, perm, mtime));
            } else {
                return Err(Error::Format(format!(
                    "python -m venv made {}, which is not a directory, link or small file",
                    p.display()
                )));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The computed tags are `packaging`'s, in its order (pip's copy of it asked on the
    /// same interpreter).
    #[test]
    fn fallback_tags_are_packaging_s() {
        let script = format!(
            "{FALLBACK_TAGS}\nimport json\nfrom pip._vendor.packaging import tags\n\
             print(json.dumps([fallback_tags(), [str(t) for t in tags.sys_tags()]]))"
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut ours, theirs): (Vec<String>, Vec<String>) =
            serde_json::from_slice(&out.stdout).unwrap();
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

    #[test]
    fn paths_are_replaced_wherever_they_occur() {
        assert_eq!(replace_all(b"a/t/v b /t/v", b"/t/v", b"/x"), b"a/x b /x");
        assert_eq!(
            abs_components(Path::new("/a//b/./c/")),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
    }
}
