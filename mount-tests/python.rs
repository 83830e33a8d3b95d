//! Mount tests of the python layout (`--layout python`): a mount of real PyPI wheels
//! (mount-tests/python/wheels.txt) is compared with what `python -m venv --without-pip`
//! and `pip install --no-deps --no-compile` of the same wheels write at the same
//! absolute path, then used: every module imported, launchers and a rewritten script
//! run, the environment activated, and every RECORD entry hashed again through
//! `importlib.metadata`. Hostile wheels are refused by name, the rest mounted. With an
//! index cache, the bytecode compiled in the background is pip's compiled install's.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::{UmountGuard, is_mountpoint, pkgfs, repo, require_tools, run, trees_match};

/// The interpreter of the tests (python3's own executable, not a shim).
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = run(Command::new("python3").args(["-c", "import sys; print(sys.executable)"]));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// pip of [`python`], without this machine's configuration.
fn pip(args: &[&str]) -> Command {
    let mut c = Command::new(python());
    c.args(["-m", "pip", "--disable-pip-version-check", "--no-input"])
        .args(args)
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env_remove("PIP_REQUIRE_VIRTUALENV");
    c
}

fn wheel_list() -> PathBuf {
    repo().join("mount-tests/python/wheels.txt")
}

/// The pinned wheels, downloaded once per target directory (again when the list
/// changes).
fn wheels() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| download(&wheel_list(), "python-wheels"))
}

/// The large set's lock: jupyter.in and every dependency, with hashes.
fn jupyter_lock() -> PathBuf {
    repo().join("mount-tests/python/jupyter-lock.txt")
}

/// The large set's wheels (64), downloaded once per target directory.
fn jupyter_wheels() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| download(&jupyter_lock(), "python-jupyter-wheels"))
}

/// The wheels `requirements` pins, downloaded into the target directory's `name` once
/// (again when the file changes).
fn download(requirements: &Path, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let list = fs::read(requirements).unwrap();
    let stamp = format!("{:x}\n", crc32fast::hash(&list));
    if fs::read_to_string(dir.join("stamp")).ok().as_deref() == Some(stamp.as_str()) {
        return dir;
    }
    let part = dir.with_extension("part");
    let _ = fs::remove_dir_all(&part);
    let _ = fs::remove_dir_all(&dir);
    run(&mut pip(&[
        "download",
        "-q",
        "--timeout",
        "30",
        "--retries",
        "3",
        "--only-binary=:all:",
        "--no-deps",
        "-d",
        part.to_str().unwrap(),
        "-r",
        requirements.to_str().unwrap(),
    ]));
    fs::write(part.join("stamp"), stamp).unwrap();
    fs::rename(&part, &dir).unwrap();
    dir
}

/// A python-layout mount at `venv`, unmounted when dropped.
struct Venv {
    mp: PathBuf,
    log: PathBuf,
    out: Output,
}

impl Venv {
    fn mount(sources: &[&Path], venv: &Path) -> Venv {
        Venv::mount_with(sources, venv, &[])
    }

    /// Without bytecode (the references are pip's `--no-compile` installs) unless
    /// `extra` gives `--index-cache`, where the packs go.
    fn mount_with(sources: &[&Path], venv: &Path, extra: &[&str]) -> Venv {
        let log = venv.with_extension("log");
        let _ = fs::remove_file(&log);
        let compile = extra.contains(&"--index-cache");
        let out = pkgfs()
            .arg("mount")
            .args(["--layout", "python", "--python"])
            .arg(python())
            .args(if compile {
                &[][..]
            } else {
                &["--no-compile"][..]
            })
            .args(extra)
            .args(sources)
            .arg(venv)
            .arg("--log-file")
            .arg(&log)
            .output()
            .unwrap();
        let v = Venv {
            mp: venv.to_path_buf(),
            log,
            out,
        };
        assert!(
            v.out.status.success() && is_mountpoint(venv),
            "pkgfs mount --layout python failed: {}",
            v.messages()
        );
        v
    }

    fn messages(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.out.stderr),
            fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

impl Drop for Venv {
    fn drop(&mut self) {
        let _guard = UmountGuard(&self.mp);
        let _ = pkgfs().arg("umount").arg(&self.mp).output();
    }
}

/// The lines of a RECORD file (`\r\n` ends kept) but INSTALLER's (whose bytes differ by
/// design), in order.
fn record_rows(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap()
        .split_inclusive('\n')
        .filter(|l| !l.contains(".dist-info/INSTALLER,"))
        .map(str::to_string)
        .collect()
}

fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

#[test]
fn python_layout_is_what_venv_and_pip_install_write_and_runs() {
    if !require_tools(&["python3"]) {
        return;
    }
    let wheels = wheels();
    let tmp = tempfile::tempdir().unwrap();
    let venv = tmp.path().join("venv");
    let reference = reference_install(&venv, &wheel_list(), &[]);
    let m = Venv::mount(&[wheels], &venv);
    let infos = same_environment(&reference, &venv);
    assert_eq!(infos, 12, "every wheel installed by pip");
    // Used as an environment: imports (a compiled extension, a namespace package, a
    // .pth file run at start-up), launchers, a rewritten script, activation.
    let py = venv.join("bin/python");
    let out = stdout_of(Command::new(&py).args([
        "-c",
        "import sys, attr, certifi, idna, packaging.version, six, jmespath, docutils, \
         pygments, greenlet, setuptools, zope.interface\n\
         assert greenlet.getcurrent() is not None\n\
         assert '_distutils_hack' in sys.modules, 'setuptools .pth ran'\n\
         print(sys.prefix)",
    ]));
    assert_eq!(out.trim(), venv.to_str().unwrap());
    let v = stdout_of(Command::new(venv.join("bin/pygmentize")).arg("-V"));
    assert!(v.contains("Pygments version 2.18.0"), "{v}");
    let v = stdout_of(Command::new(venv.join("bin/docutils")).arg("--version"));
    assert!(v.contains("0.21.2"), "{v}");
    let mut jp = Command::new(venv.join("bin/jp.py"));
    jp.args(["-f", "/dev/stdin", "a"])
        .stdin(std::process::Stdio::piped());
    let mut child = jp.stdout(std::process::Stdio::piped()).spawn().unwrap();
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"{\"a\": 42}")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    let act = stdout_of(Command::new("bash").arg("-c").arg(format!(
        ". {}/bin/activate && command -v python && python -c 'import sys; print(sys.prefix)'",
        venv.display()
    )));
    assert_eq!(
        act.lines().collect::<Vec<_>>(),
        [py.to_str().unwrap(), venv.to_str().unwrap()]
    );
    // importlib.metadata: every RECORD entry with a hash, read through the mount,
    // hashed again.
    let (n, bad) = rehash_every_record(&py);
    assert!(n > 1000 && bad.is_empty(), "{n}: {bad:?}");
    assert!(!m.messages().contains("WARN"), "{}", m.messages());
}

/// Every RECORD entry with a hash of the environment of `py`, read through
/// `importlib.metadata` and hashed again: how many, and those whose hash or size
/// differ (pip's own install has some: a wheel's shipped `.pyc` that pip compiles again
/// keeps the wheel's row).
fn rehash_every_record(py: &Path) -> (u64, Vec<String>) {
    let out = stdout_of(Command::new(py).args([
        "-c",
        "import importlib.metadata as m, hashlib, base64, json\n\
         n, bad = 0, []\n\
         for d in m.distributions():\n\
         \x20   for f in d.files or []:\n\
         \x20       if f.hash is None: continue\n\
         \x20       data = f.locate().read_bytes()\n\
         \x20       h = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b'=').decode()\n\
         \x20       if h != f.hash.value or (f.size is not None and f.size != len(data)): bad.append(str(f))\n\
         \x20       n += 1\n\
         print(json.dumps([n, sorted(bad)]))",
    ]));
    serde_json::from_str(&out).unwrap()
}

/// The reference: `python -m venv --without-pip VENV`, then pip installs the wheels of
/// `requirements` into it (with `extra` options), then VENV is renamed away (its files
/// keep naming VENV) and an empty VENV made for the mount. Returns where it went.
fn reference_install(venv: &Path, requirements: &Path, extra: &[&str]) -> PathBuf {
    reference_install_from(wheels(), venv, requirements, extra)
}

/// [`reference_install`] from the wheels in `wheels`.
fn reference_install_from(
    wheels: &Path,
    venv: &Path,
    requirements: &Path,
    extra: &[&str],
) -> PathBuf {
    run(Command::new(python())
        .args(["-m", "venv", "--without-pip"])
        .arg(venv));
    let target_python = venv.join("bin/python");
    let mut args = vec![
        "--python",
        target_python.to_str().unwrap(),
        "install",
        "-q",
        "--no-deps",
        "--no-compile",
        "--no-index",
        "--no-warn-script-location",
        "--find-links",
        wheels.to_str().unwrap(),
        "-r",
        requirements.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&mut pip(&args));
    let reference = venv.with_extension("reference");
    fs::rename(venv, &reference).unwrap();
    fs::create_dir(venv).unwrap();
    reference
}

/// Check the mount at `venv` against pip's `reference`: the trees equal but for
/// modification times and each RECORD and INSTALLER, each RECORD equal line for line but
/// for INSTALLER's row, INSTALLER `pkgfs`. Returns how many projects are installed.
fn same_environment(reference: &Path, venv: &Path) -> usize {
    same_environment_with(reference, venv, &[])
}

/// [`same_environment`] with more of treecmp's options (`--pyc`).
fn same_environment_with(reference: &Path, venv: &Path, extra: &[&str]) -> usize {
    let site = format!("lib/python{}/site-packages", python_version());
    let mut ignore: Vec<String> = Vec::new();
    let mut infos = Vec::new();
    for e in fs::read_dir(reference.join(&site)).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".dist-info") {
            for f in ["RECORD", "INSTALLER"] {
                ignore.extend(["--ignore".to_string(), format!("{site}/{name}/{f}")]);
            }
            infos.push(name);
        }
    }
    let mut args = vec!["--no-mtime"];
    args.extend_from_slice(extra);
    args.extend(ignore.iter().map(String::as_str));
    trees_match(reference, venv, &args);
    for info in &infos {
        let at = |root: &Path, f: &str| root.join(&site).join(info).join(f);
        assert_eq!(
            record_rows(&at(reference, "RECORD")),
            record_rows(&at(venv, "RECORD")),
            "{info}/RECORD"
        );
        assert_eq!(fs::read(at(venv, "INSTALLER")).unwrap(), b"pkgfs\n");
    }
    infos.len()
}

/// The `.pyc` files under `root`.
fn pyc_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "pyc") {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Wait, at most `secs` seconds, until the bytecode compiled in the background has
/// landed (`landed`, polled: what lands is files in the tree); the comparison that
/// follows says what is missing if it never does.
fn settle(secs: u64, mut landed: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !landed() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Modules of the environment at `venv` that an import compiled from source, and how
/// many it loaded from `__pycache__` (`python -v` says which).
fn imported_from(venv: &Path, modules: &str) -> (Vec<String>, usize) {
    let out =
        run(Command::new(venv.join("bin/python")).args(["-v", "-c", &format!("import {modules}")]));
    let err = String::from_utf8_lossy(&out.stderr);
    let mine = format!("{}/", venv.display());
    let compiled = err
        .lines()
        .filter(|l| l.starts_with(&format!("# code object from {mine}")) && l.ends_with(".py"))
        .map(str::to_string)
        .collect();
    let cached = err
        .lines()
        .filter(|l| l.contains(" matches ") && l.contains(&mine))
        .count();
    (compiled, cached)
}

#[test]
fn python_layout_serves_the_bytecode_pip_compiles() {
    if !require_tools(&["python3"]) {
        return;
    }
    let wheels = wheels();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("index-cache");
    let cache_arg = cache.to_str().unwrap();
    let venv = tmp.path().join("venv");
    let reference = reference_install(&venv, &wheel_list(), &["--compile"]);
    let want = pyc_files(&reference);
    assert!(want.len() > 300, "pip compiled {} files", want.len());
    let m = Venv::mount_with(&[wheels], &venv, &["--index-cache", cache_arg]);
    // Compiled in the background, activated as the packs arrive: wait (bounded) until
    // the mount serves as many as pip wrote, then compare.
    settle(180, || pyc_files(&venv).len() >= want.len());
    // pip's tree, bytecode and RECORD rows included; every .pyc valid for the source
    // the mount serves.
    let infos = same_environment_with(&reference, &venv, &["--pyc"]);
    assert_eq!(infos, 12);
    assert!(
        m.messages().contains("compiled the bytecode of"),
        "{}",
        m.messages()
    );
    let packs = fs::read_dir(cache.join("python")).unwrap().count();
    assert!(packs >= 11, "{packs} packs");
    let modules = "attr, certifi, idna, packaging.version, six, jmespath, docutils.core,                    pygments.lexers, setuptools, zope.interface";
    let (compiled, cached) = imported_from(&venv, modules);
    assert!(compiled.is_empty(), "compiled from source: {compiled:#?}");
    assert!(cached > 100, "{cached} modules from __pycache__");
    // Another environment of the same wheels, elsewhere: the packs serve it at once
    // (nothing compiled), and its code names its own files.
    let other = tmp.path().join("other-env");
    fs::create_dir(&other).unwrap();
    let m2 = Venv::mount_with(&[wheels], &other, &["--index-cache", cache_arg]);
    let site = format!("lib/python{}/site-packages", python_version());
    let served: Vec<PathBuf> = pyc_files(&other)
        .into_iter()
        .filter(|p| p.starts_with(&site))
        .collect();
    let pip_site: Vec<PathBuf> = want
        .iter()
        .filter(|p| p.starts_with(&site))
        .cloned()
        .collect();
    assert_eq!(served, pip_site);
    let (compiled, cached) = imported_from(&other, modules);
    assert!(compiled.is_empty(), "compiled from source: {compiled:#?}");
    assert!(cached > 100, "{cached} modules from __pycache__");
    let file = stdout_of(Command::new(other.join("bin/python")).args([
        "-c",
        "import jmespath; print(jmespath.search.__code__.co_filename)",
    ]));
    assert!(file.trim().starts_with(other.to_str().unwrap()), "{file}");
    assert!(
        !m2.messages().contains("compiled the bytecode of"),
        "{}",
        m2.messages()
    );
    // Every pack was there: that mount kept its tree, and the next one loads it and
    // serves the same environment, file for file and byte for byte.
    let folded = snapshot(&other);
    assert!(folded.len() > 1000, "{} entries", folded.len());
    drop(m2);
    let kept = Venv::mount_with(&[wheels], &other, &["--index-cache", cache_arg]);
    let st = crate::common::status_json(&other);
    let packages = st["packages"].as_array().unwrap();
    assert!(
        packages.len() > 20
            && packages
                .iter()
                .all(|p| p["index"] == "kept" || p["format"] == "layout"),
        "{packages:#?}"
    );
    let (compiled, cached) = imported_from(&other, modules);
    assert!(compiled.is_empty(), "compiled from source: {compiled:#?}");
    assert!(cached > 100, "{cached} modules from __pycache__");
    assert!(
        snapshot(&other) == folded,
        "the kept tree serves another environment"
    );
    drop(kept);
    // --no-compile: none served.
    let m3 = Venv::mount_with(&[wheels], &other, &[]);
    assert!(pyc_files(&other).is_empty());
    drop(m3);
    // A pack holding what is not its wheel's bytecode is refused by name, and made
    // again: six's modules get their bytecode, the stray file never shows.
    let tag = stdout_of(Command::new(python()).args([
        "-c",
        "import sys, importlib.util; print(sys.implementation.cache_tag + '-' + importlib.util.MAGIC_NUMBER.hex())",
    ]));
    let bad_cache = tmp.path().join("bad-cache");
    fs::create_dir_all(bad_cache.join("python")).unwrap();
    let bad = bad_cache.join("python").join(format!(
        "{}.{}.pyc.zip",
        sha256_hex(&wheel_of("six")),
        tag.trim()
    ));
    let zip = format!(
        "import zipfile\nwith zipfile.ZipFile({bad:?}, 'w') as z:\n    z.writestr('{site}/evil.pyc', b'x')"
    );
    run(Command::new(python()).args(["-c", &zip]));
    let m4 = Venv::mount_with(
        &[wheels],
        &other,
        &["--index-cache", bad_cache.to_str().unwrap()],
    );
    let six_pyc = other.join(format!(
        "{site}/__pycache__/six.{}.pyc",
        tag.trim().rsplit_once('-').unwrap().0
    ));
    settle(180, || six_pyc.exists());
    assert!(six_pyc.exists(), "{}", m4.messages());
    assert!(!other.join(&site).join("evil.pyc").exists());
    let log = m4.messages();
    assert!(
        log.contains("WARN")
            && log.contains(bad.file_name().unwrap().to_str().unwrap())
            && log.contains("is not the cache file of a module of its wheel"),
        "{log}"
    );
}

/// Every entry under `root`: its path, mode, size and mtime, and its bytes' digest or
/// its link's target, in path order.
fn snapshot(root: &Path) -> Vec<String> {
    use sha2::Digest as _;
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let what = if m.is_dir() {
                todo.push(p.clone());
                String::new()
            } else if m.file_type().is_symlink() {
                fs::read_link(&p).unwrap().display().to_string()
            } else {
                format!("{:x}", sha2::Sha256::digest(fs::read(&p).unwrap()))
            };
            out.push(format!(
                "{} {:o} {} {} {what}",
                p.strip_prefix(root).unwrap().display(),
                m.mode(),
                m.size(),
                m.mtime()
            ));
        }
    }
    out.sort();
    out
}

/// `mount-tests/python/env_check.py MODE ARGS…` run by `py`, its JSON.
fn env_check(py: &Path, args: &[&str]) -> serde_json::Value {
    let script = repo().join("mount-tests/python/env_check.py");
    let out = stdout_of(Command::new(py).arg(script).args(args));
    serde_json::from_str(&out).unwrap()
}

/// The issue's test set: 64 wheels (a Jupyter kernel and console, plotly's 15,000
/// files, numpy, cryptography, pyzmq, psutil, namespace packages, `.data` of every
/// kind, console and GUI scripts) from a lock `uv pip compile --generate-hashes` wrote.
/// The mount, its bytecode landed, is pip's `--require-hashes` compiled install of the
/// lock; then every module imports as in pip's, every launcher answers `--version` as
/// pip's entry point does, `pip check` finds every requirement, `importlib.metadata`
/// hashes every RECORD entry again, and `jupyter kernelspec list` finds the kernel
/// ipykernel installs under `share/`.
#[test]
fn python_layout_of_a_jupyter_stack_is_pips_compiled_install_and_works() {
    if !require_tools(&["python3"]) {
        return;
    }
    let wheels = jupyter_wheels();
    let lock = jupyter_lock();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("index-cache");
    let venv = tmp.path().join("venv");
    let reference =
        reference_install_from(wheels, &venv, &lock, &["--require-hashes", "--compile"]);
    let want = pyc_files(&reference).len();
    assert!(want > 10_000, "pip compiled {want} files");
    let m = Venv::mount_with(
        &[wheels],
        &venv,
        &[
            "--lockfile",
            lock.to_str().unwrap(),
            "--index-cache",
            cache.to_str().unwrap(),
        ],
    );
    settle(600, || pyc_files(&venv).len() >= want);
    let infos = same_environment_with(&reference, &venv, &["--pyc"]);
    assert_eq!(infos, 64, "every wheel of the lock");
    let site = venv.join(format!("lib/python{}/site-packages", python_version()));
    let site_s = site.to_str().unwrap();
    let py = venv.join("bin/python");
    let ref_py = reference.join("bin/python");
    // Every module and package the RECORDs list: imported as in pip's environment.
    let ours = env_check(&py, &["imports", site_s]);
    let pips = env_check(&ref_py, &["imports", site_s]);
    assert_eq!(ours, pips);
    let ok = ours
        .as_object()
        .unwrap()
        .values()
        .filter(|v| *v == "ok")
        .count();
    assert!(ok > 60, "{ours}");
    // Every console and GUI launcher, --version, as pip's entry point answers.
    let runs = env_check(
        &py,
        &[
            "launchers",
            site_s,
            venv.join("bin").to_str().unwrap(),
            ref_py.to_str().unwrap(),
        ],
    );
    let runs = runs.as_object().unwrap();
    assert!(runs.len() > 25, "{runs:?}");
    for (name, r) in runs {
        assert_eq!(r[0], r[1], "{name}: the launcher, then pip's entry point");
        assert_ne!(r[0][0], "timeout", "{name}");
    }
    assert!(
        runs.values().filter(|r| r[0][0] == 0).count() > 20,
        "{runs:?}"
    );
    // pip check: every requirement of every project installed.
    let check = stdout_of(&mut pip(&["--python", py.to_str().unwrap(), "check"]));
    assert!(check.contains("No broken requirements found"), "{check}");
    let (n, bad) = rehash_every_record(&py);
    assert!(n > 20_000, "{n}");
    assert_eq!(bad, rehash_every_record(&ref_py).1, "as in pip's install");
    // The kernel ipykernel's .data/data put under share/.
    let specs: serde_json::Value =
        serde_json::from_str(&stdout_of(Command::new(venv.join("bin/jupyter")).args([
            "kernelspec",
            "list",
            "--json",
        ])))
        .unwrap();
    assert_eq!(
        specs["kernelspecs"]["python3"]["resource_dir"],
        venv.join("share/jupyter/kernels/python3").to_str().unwrap()
    );
    assert!(!m.messages().contains("WARN"), "{}", m.messages());
}

/// Wheels from a remote store: an nginx directory listing of the 12 wheels (started
/// here on loopback, stopped after). The mount is pip's install of the same wheels, and
/// its bytecode lands as from local wheels (the packs are local).
#[test]
fn python_layout_installs_wheels_from_an_http_store() {
    if !require_tools(&["python3", "nginx"]) {
        return;
    }
    let wheels = wheels();
    let www = crate::remote::www();
    fs::create_dir(www.path().join("wheels")).unwrap();
    for e in fs::read_dir(wheels).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "whl") {
            fs::copy(&p, www.path().join("wheels").join(p.file_name().unwrap())).unwrap();
        }
    }
    crate::remote::readable(www.path());
    let nginx = crate::remote::Nginx::start(www.path());
    let tmp = tempfile::tempdir().unwrap();
    let venv = tmp.path().join("venv");
    let reference = reference_install(&venv, &wheel_list(), &[]);
    let url = nginx.url("wheels/");
    let m = Venv::mount_with(&[Path::new(&url)], &venv, &[]);
    assert_eq!(same_environment(&reference, &venv), 12);
    let out = stdout_of(Command::new(venv.join("bin/python")).args([
        "-c",
        "import zope.interface, greenlet, docutils; print(greenlet.__file__)",
    ]));
    assert!(out.trim().starts_with(venv.to_str().unwrap()), "{out}");
    assert!(!m.messages().contains("WARN"), "{}", m.messages());
}

/// The sha256 of a file, in hex.
fn sha256_hex(path: &Path) -> String {
    let out = stdout_of(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_string()
}

/// The wheel file of `project` in the fixture.
fn wheel_of(project: &str) -> PathBuf {
    fs::read_dir(wheels())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_lowercase();
            n.starts_with(&format!("{project}-")) && n.ends_with(".whl")
        })
        .unwrap_or_else(|| panic!("no wheel of {project}"))
}

#[test]
fn python_layout_installs_what_a_lock_file_pins_and_checks_its_hashes() {
    if !require_tools(&["python3", "sha256sum"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pins = [
        ("six", "1.17.0"),
        ("attrs", "24.3.0"),
        ("greenlet", "3.1.1"),
    ];
    let line = |(p, v): &(&str, &str)| {
        format!(
            "{p}=={v} \\\n    --hash=sha256:{}\n",
            sha256_hex(&wheel_of(p))
        )
    };
    let mut req = String::from("# pinned, as pip-compile --generate-hashes writes it\n");
    for p in &pins {
        req.push_str(&line(p));
    }
    // For another platform: its marker is false here, and its wheel is in no source.
    req.push_str("colorama==0.4.6 ; sys_platform == 'win32' \\\n    --hash=sha256:4f1d9991f5acc0ca119f9d443620b77f9d6b33703e51011c16baf57afb285fc6\n");
    let lockfile = tmp.path().join("requirements.txt");
    fs::write(&lockfile, &req).unwrap();

    // The same environment as pip's --require-hashes install of the lock, from a source
    // holding every fixture wheel.
    let venv = tmp.path().join("venv");
    let reference = reference_install(&venv, &lockfile, &["--require-hashes"]);
    let lock_arg = lockfile.to_str().unwrap();
    {
        let m = Venv::mount_with(&[wheels()], &venv, &["--lockfile", lock_arg]);
        assert_eq!(same_environment(&reference, &venv), 3);
        assert!(!m.messages().contains("WARN"), "{}", m.messages());
    }

    // pylock.toml of the same pins gives the same environment.
    let mut pylock = String::from("lock-version = \"1.0\"\ncreated-by = \"pkgfs-test\"\n");
    for (p, v) in &pins {
        let w = wheel_of(p);
        pylock.push_str(&format!(
            "[[packages]]\nname = \"{p}\"\nversion = \"{v}\"\nwheels = [{{ name = \"{}\", hashes = {{ sha256 = \"{}\" }} }}]\n",
            w.file_name().unwrap().to_string_lossy(),
            sha256_hex(&w)
        ));
    }
    let pylock_path = tmp.path().join("pylock.toml");
    fs::write(&pylock_path, &pylock).unwrap();
    {
        let _m = Venv::mount_with(
            &[wheels()],
            &venv,
            &["--lockfile", pylock_path.to_str().unwrap()],
        );
        assert_eq!(same_environment(&reference, &venv), 3);
    }

    // A wheel whose bytes are not the lock's is refused, naming it and both digests;
    // the rest is mounted.
    let bad = req.replace(&sha256_hex(&wheel_of("six")), &"0".repeat(64));
    fs::write(&lockfile, &bad).unwrap();
    {
        let m = Venv::mount_with(&[wheels()], &venv, &["--lockfile", lock_arg]);
        let msgs = m.messages();
        let six = sha256_hex(&wheel_of("six"));
        assert!(
            msgs.lines().any(|l| l.contains("six 1.17.0")
                && l.contains(&six)
                && l.contains(&"0".repeat(64))),
            "{msgs}"
        );
        let site = venv.join(format!("lib/python{}/site-packages", python_version()));
        assert!(!site.join("six.py").exists());
        assert!(site.join("attr").exists());
    }

    // A locked project with no wheel in the sources fails the mount, naming it, unless
    // --allow-missing.
    fs::write(
        &lockfile,
        format!("{req}requests==2.32.3 --hash=sha256:{}\n", "1".repeat(64)),
    )
    .unwrap();
    let out = pkgfs()
        .args(["mount", "--layout", "python", "--python"])
        .arg(python())
        .args(["--lockfile", lock_arg])
        .arg(wheels())
        .arg(&venv)
        .output()
        .unwrap();
    let _guard = UmountGuard(&venv);
    assert!(!out.status.success() && !is_mountpoint(&venv));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("requests==2.32.3") && err.contains("--allow-missing"),
        "{err}"
    );
    {
        let m = Venv::mount_with(
            &[wheels()],
            &venv,
            &["--lockfile", lock_arg, "--allow-missing"],
        );
        assert!(
            m.messages().contains("requests==2.32.3"),
            "{}",
            m.messages()
        );
        assert_eq!(same_environment(&reference, &venv), 3);
    }

    // Of two wheels of the pinned version, the one whose tag the interpreter prefers
    // (py311 before py3), though it comes second in layer order.
    let tagged = tmp.path().join("tagged");
    fs::create_dir(&tagged).unwrap();
    let plain = tagged.join("six-1.17.0-py3-none-any.whl");
    fs::copy(wheel_of("six"), &plain).unwrap();
    let preferred = tagged.join("six-1.17.0-py311-none-any.whl");
    run(Command::new("python3").args([
        "-c",
        "import shutil, sys, zipfile\n\
         shutil.copy(sys.argv[1], sys.argv[2])\n\
         with zipfile.ZipFile(sys.argv[2], 'a') as z:\n\
         \x20   z.writestr('six_preferred.py', '')",
        plain.to_str().unwrap(),
        preferred.to_str().unwrap(),
    ]));
    fs::write(
        &lockfile,
        format!(
            "six==1.17.0 --hash=sha256:{} --hash=sha256:{}\n",
            sha256_hex(&plain),
            sha256_hex(&preferred)
        ),
    )
    .unwrap();
    let m = Venv::mount_with(&[&tagged], &venv, &["--lockfile", lock_arg]);
    let site = venv.join(format!("lib/python{}/site-packages", python_version()));
    assert!(site.join("six_preferred.py").exists(), "{}", m.messages());
    assert!(site.join("six.py").exists());
    assert!(!m.messages().contains("WARN"), "{}", m.messages());
}

fn python_version() -> String {
    let out = stdout_of(
        Command::new(python()).args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
    );
    out.trim().to_string()
}

/// Write a wheel with Python's zipfile: `files` as (name, text), scripts executable; a
/// WHEEL, METADATA and RECORD for `project` are added unless `bare`.
fn write_wheel(path: &Path, project: &str, files: &[(&str, &str)], bare: bool) {
    let mut all: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    if !bare {
        let info = format!("{project}-1.0.dist-info");
        all.push((
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .into(),
        ));
        all.push((
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n"),
        ));
        all.push((format!("{info}/RECORD"), String::new()));
    }
    let spec = serde_json::to_string(&all).unwrap();
    run(Command::new("python3").args([
        "-c",
        "import json, sys, zipfile\n\
         with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
         \x20   for n, t in json.loads(sys.argv[2]):\n\
         \x20       i = zipfile.ZipInfo(n, (2020, 1, 1, 0, 0, 0))\n\
         \x20       i.external_attr = (0o100755 if '/scripts/' in n else 0o100644) << 16\n\
         \x20       z.writestr(i, t)",
        path.to_str().unwrap(),
        &spec,
    ]));
}

#[test]
fn python_layout_refuses_hostile_wheels_by_name_and_mounts_the_rest() {
    if !require_tools(&["python3"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("wheels");
    fs::create_dir(&src).unwrap();
    let ep = "good-1.0.dist-info/entry_points.txt";
    write_wheel(
        &src.join("good-1.0-py3-none-any.whl"),
        "good",
        &[
            ("good/__init__.py", "def main():\n    print('good')\n"),
            (
                ep,
                "[console_scripts]\ngood = good:main\n[gui_scripts]\ngoodgui = good:main\n",
            ),
            (
                "good-1.0.data/scripts/tool",
                "#!python -E\nimport good\ngood.main()\n",
            ),
        ],
        false,
    );
    write_wheel(
        &src.join("good-2.0-py3-none-any.whl"),
        "Good",
        &[("good/second.py", "")],
        false,
    );
    write_wheel(
        &src.join("badkey-1.0-py3-none-any.whl"),
        "badkey",
        &[("badkey-1.0.data/evil/x", "x")],
        false,
    );
    write_wheel(
        &src.join("badep-1.0-py3-none-any.whl"),
        "badep",
        &[(
            "badep-1.0.dist-info/entry_points.txt",
            "[console_scripts]\n../../evil = os:system\n",
        )],
        false,
    );
    write_wheel(
        &src.join("nodist-1.0-py3-none-any.whl"),
        "nodist",
        &[("nodist/__init__.py", "")],
        true,
    );
    write_wheel(
        &src.join("escape-1.0-py3-none-any.whl"),
        "escape",
        &[("escape-1.0.data/scripts/../../../../outside", "x")],
        false,
    );
    let venv = tmp.path().join("venv");
    fs::create_dir(&venv).unwrap();
    let m = Venv::mount(&[&src], &venv);
    let msgs = m.messages();
    for (wheel, why) in [
        ("good-2.0-py3-none-any.whl", "a second wheel of Good"),
        ("badkey-1.0-py3-none-any.whl", "unknown .data key \"evil\""),
        ("badep-1.0-py3-none-any.whl", "not a script name"),
        ("nodist-1.0-py3-none-any.whl", "no .dist-info"),
        (
            "escape-1.0-py3-none-any.whl",
            "escape-1.0.data/scripts/../../../../outside",
        ),
    ] {
        assert!(
            msgs.lines().any(|l| l.contains(wheel) && l.contains(why)),
            "{wheel}: {why}\n{msgs}"
        );
    }
    let site = venv.join(format!("lib/python{}/site-packages", python_version()));
    assert!(site.join("good/__init__.py").exists());
    assert!(!site.join("good/second.py").exists());
    assert!(!site.join("nodist").exists() && !site.join("badkey").exists());
    assert!(!tmp.path().join("outside").exists() && !venv.join("outside").exists());
    let py = venv.join("bin/python");
    let launcher = fs::read_to_string(venv.join("bin/good")).unwrap();
    assert_eq!(
        launcher,
        format!(
            "#!{}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom good import main\n\
             if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n",
            py.display()
        )
    );
    assert_eq!(
        fs::read_to_string(venv.join("bin/goodgui")).unwrap(),
        launcher
    );
    assert_eq!(
        fs::read_to_string(venv.join("bin/tool")).unwrap(),
        format!("#!{}\nimport good\ngood.main()\n", py.display())
    );
    for f in ["bin/good", "bin/tool"] {
        let out = stdout_of(&mut Command::new(venv.join(f)));
        assert_eq!(out, "good\n", "{f}");
    }
}
