//! `npm`: a `node_modules` directory made of npm tarballs.
//!
//! An npm tarball (`npm pack`, the registry's `.tgz`) holds its files under one top
//! directory (`package/`); npm installs them at `node_modules/NAME/` without it. A
//! tarball is an npm package if it has `TOP/package.json`; its name and version are the
//! ones in that file (never the tarball's file name).
//!
//! - Without a lockfile, each package goes to `NAME/` (`@scope/NAME/`): the mount is a
//!   project's `node_modules`. A second package of a name already placed is refused (the
//!   first in layer order stays; a lockfile says which version goes where).
//! - With a lockfile (`package-lock.json` of lockfile versions 2 and 3), the mount is the
//!   tree `npm ci` writes from it: each of its `packages` entries under `node_modules/`
//!   gets the tarball of that name and version, checked against the entry's
//!   `integrity` before it is placed (sha512, or sha1 for old entries); nested
//!   `node_modules` where the lockfile nests them; one tarball serves every place it is
//!   installed at. Entries npm would skip are skipped the same way: bundled ones
//!   (`inBundle`, they come inside their parent's tarball), links to workspace
//!   directories (`link`, warned), optional ones for another OS or CPU. A lockfile
//!   package that no source holds fails the mount, naming it, unless `--allow-missing`.
//! - Each package's `bin` entries are linked from the `.bin` directory of the
//!   `node_modules` it sits in (`.bin/NAME` → `../PKG/path`), as npm links them, and their
//!   targets are made executable (npm sets the execute bits on them).
//! - Files are shown as npm writes them: modes with npm's umask (022) applied and no
//!   set-id bits, owned by the mount's owner (npm, as root or not, does not keep the
//!   owners a tarball records).
//!
//! Refused, with a warning naming the tarball, the rest mounted: a `package.json` without
//! a usable name (`../../etc`, `@scope` without a slash, not a string), a second tarball
//! of one name and version, an integrity mismatch, a lockfile path outside
//! `node_modules/` or with a component that is not a plain name.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Facts, Layout, Placement, plain_component, symlink};
use crate::error::{Error, Result};
use crate::format::{Archive, Entry, EntryKind};
use crate::tree::Place;

/// A `package.json` larger than this is refused.
const MAX_MANIFEST: u64 = 4 << 20;
/// The mode bits npm leaves of a tarball's: its default umask (022) applied, and no
/// set-id or sticky bit.
const NPM_MODE_MASK: u16 = 0o755;
/// A lockfile larger than this is refused.
const MAX_LOCKFILE: u64 = 256 << 20;

/// `package-lock.json`, the parts a mount needs.
#[derive(Debug, Deserialize)]
struct Lockfile {
    #[serde(rename = "lockfileVersion", default)]
    version: u32,
    #[serde(default)]
    packages: BTreeMap<String, Locked>,
}

/// One entry of a lockfile's `packages`.
#[derive(Debug, Deserialize, Default)]
struct Locked {
    /// The package's real name, when it is installed under another (an alias).
    name: Option<String>,
    version: Option<String>,
    integrity: Option<String>,
    #[serde(default)]
    link: bool,
    #[serde(default, rename = "inBundle")]
    in_bundle: bool,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    os: Vec<String>,
    #[serde(default)]
    cpu: Vec<String>,
    /// Its `bin` as its `package.json` has it (kept for bundled packages, whose
    /// `package.json` is inside their parent's tarball).
    #[serde(default)]
    bin: serde_json::Value,
    /// Where a link points (a workspace directory, relative to the project).
    resolved: Option<String>,
}

/// A package by name and version.
type Id = (String, String);

/// Where a lockfile installs a package: the mount path's components, and the integrity
/// the lockfile gives there.
type Installed = (Vec<Vec<u8>>, Option<String>);

/// Where a lockfile installs packages.
#[derive(Debug)]
struct Plan {
    /// The places each package is installed at.
    wanted: HashMap<Id, Vec<Installed>>,
    /// Packages placed so far, by (name, version): the tarball.
    found: HashMap<Id, PathBuf>,
    /// Packages whose tarball was refused (its integrity): not missing, refused.
    refused: HashMap<Id, PathBuf>,
    /// Bundled packages with bins: where each is (inside its parent's tarball), and
    /// its bins (linked, and their targets made executable, as npm does).
    bundled: Vec<(Vec<Vec<u8>>, Vec<Bin>)>,
}

/// A `bin` entry: (link name, path inside the package).
type Bin = (Vec<u8>, Vec<u8>);

/// `package.json`, the parts a mount needs.
#[derive(Debug, Deserialize)]
struct Manifest {
    name: serde_json::Value,
    #[serde(default)]
    version: serde_json::Value,
    #[serde(default)]
    bin: serde_json::Value,
}

/// The `npm` layout.
pub struct Npm {
    plan: Option<Plan>,
    allow_missing: bool,
    /// Without a lockfile: names placed, with their tarballs.
    taken: HashMap<Vec<u8>, PathBuf>,
    /// `.bin` links: path → target, in the order made (the first of a name stays).
    bins: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Npm {
    /// The layout, with the lockfile of `cfg` read and checked.
    pub fn new(cfg: &super::Config) -> Result<Self> {
        let plan = cfg.lockfile.as_deref().map(read_lockfile).transpose()?;
        let mut npm = Npm {
            plan,
            allow_missing: cfg.allow_missing,
            taken: HashMap::new(),
            bins: BTreeMap::new(),
        };
        let bundled: Vec<_> = npm.plan.iter().flat_map(|p| p.bundled.clone()).collect();
        for (at, bins) in &bundled {
            npm.link_bins(at, install_len(at), bins);
        }
        Ok(npm)
    }
}

fn read_lockfile(path: &Path) -> Result<Plan> {
    let err = |e: Error| e.with_path(path);
    let meta = std::fs::metadata(path).map_err(|e| err(Error::Io(e)))?;
    if meta.len() > MAX_LOCKFILE {
        return Err(err(Error::Format(format!(
            "a lockfile of {} bytes (at most {MAX_LOCKFILE})",
            meta.len()
        ))));
    }
    let text = std::fs::read(path).map_err(|e| err(Error::Io(e)))?;
    let lock: Lockfile = serde_json::from_slice(&text)
        .map_err(|e| err(Error::Format(format!("not a package-lock.json: {e}"))))?;
    if !(2..=3).contains(&lock.version) {
        return Err(err(Error::Unsupported(format!(
            "lockfile version {} (versions 2 and 3 are read; npm 7 or later writes them)",
            lock.version
        ))));
    }
    let mut wanted: HashMap<Id, Vec<Installed>> = HashMap::new();
    let mut bundled = Vec::new();
    // The workspace directories the links point at: entries of the project, not
    // packages to place (quietly left out, as the links are).
    let workspaces: std::collections::HashSet<String> = lock
        .packages
        .values()
        .filter(|l| l.link)
        .filter_map(|l| l.resolved.clone())
        .collect();
    for (key, locked) in lock.packages {
        if workspaces.contains(&key) {
            log::debug!("{}: {key} is a workspace directory", path.display());
            continue;
        }
        if locked.in_bundle
            && let Some((comps, install_name)) = install_path(&key)
        {
            // Its files come inside its parent's tarball; its bins are linked all the same.
            let name = locked.name.clone().unwrap_or(install_name);
            let m = Manifest {
                name: serde_json::Value::Null,
                version: serde_json::Value::Null,
                bin: locked.bin,
            };
            let b = bins(&m, &name);
            if !b.is_empty() {
                bundled.push((comps, b));
            }
            continue;
        }
        if key.is_empty() || locked.in_bundle {
            // The project itself; a bundled package at a path that is not a name.
            continue;
        }
        if locked.link {
            log::warn!(
                "{}: {key} is a link to a workspace directory: not mounted",
                path.display()
            );
            continue;
        }
        if !for_this_machine(&locked) {
            log::info!("{}: {key} is for another platform: skipped", path.display());
            continue;
        }
        let Some((comps, install_name)) = install_path(&key) else {
            log::warn!(
                "{}: refusing {key:?}: not a path under node_modules/ of plain names",
                path.display()
            );
            continue;
        };
        let name = locked.name.clone().unwrap_or(install_name);
        let Some(version) = locked.version.clone() else {
            log::warn!("{}: refusing {key:?}: no version", path.display());
            continue;
        };
        wanted
            .entry((name, version))
            .or_default()
            .push((comps, locked.integrity.clone()));
    }
    Ok(Plan {
        wanted,
        found: HashMap::new(),
        refused: HashMap::new(),
        bundled,
    })
}

/// Whether an optional package's `os` and `cpu` admit this machine (npm skips the rest).
fn for_this_machine(l: &Locked) -> bool {
    if !l.optional {
        return true;
    }
    let os = std::env::consts::OS;
    let cpu = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        "x86" => "ia32",
        a => a,
    };
    admits(&l.os, os) && admits(&l.cpu, cpu)
}

/// npm's rule for `os`/`cpu` lists: `!x` excludes x; if any plain name is listed, one
/// must match.
fn admits(list: &[String], this: &str) -> bool {
    if list.iter().any(|v| v.strip_prefix('!') == Some(this)) {
        return false;
    }
    let plain: Vec<&String> = list.iter().filter(|v| !v.starts_with('!')).collect();
    plain.is_empty() || plain.iter().any(|v| *v == this)
}

/// A lockfile key (`node_modules/a/node_modules/@s/b`) as mount components
/// (`a/node_modules/@s/b`) and the name it is installed under (`@s/b`).
fn install_path(key: &str) -> Option<(Vec<Vec<u8>>, String)> {
    let rest = key.strip_prefix("node_modules/")?;
    let comps: Vec<&str> = rest.split('/').collect();
    if comps.iter().any(|c| !plain_component(c.as_bytes())) {
        return None;
    }
    // The name is what follows the last `node_modules` (one component, or two if scoped).
    let start = comps
        .iter()
        .rposition(|c| *c == "node_modules")
        .map_or(0, |i| i + 1);
    let name = &comps[start..];
    let ok = match name {
        [n] => !n.starts_with('@'),
        [s, n] => s.starts_with('@') && !n.starts_with('@'),
        _ => false,
    };
    ok.then(|| {
        (
            comps.iter().map(|c| c.as_bytes().to_vec()).collect(),
            name.join("/"),
        )
    })
}

/// How many of the last components of an install path are the package's name (2 when
/// scoped).
fn install_len(at: &[Vec<u8>]) -> usize {
    if at.len() >= 2 && at[at.len() - 2].starts_with(b"@") {
        2
    } else {
        1
    }
}

/// A package name as directory components: `name` or `@scope/name`, plain names, not
/// starting with `.` or `_` (npm refuses those).
fn name_components(name: &str) -> Option<Vec<Vec<u8>>> {
    let parts: Vec<&str> = name.split('/').collect();
    let ok_name = |n: &str| plain_component(n.as_bytes()) && !n.starts_with(['.', '_', '@']);
    match parts[..] {
        [n] if ok_name(n) => Some(vec![n.as_bytes().to_vec()]),
        [s, n]
            if s.len() > 1 && s.starts_with('@') && plain_component(s.as_bytes()) && ok_name(n) =>
        {
            Some(vec![s.as_bytes().to_vec(), n.as_bytes().to_vec()])
        }
        _ => None,
    }
}

/// The `TOP/package.json` entry of a tarball's entries.
fn manifest_entry(entries: &[Entry]) -> Option<&Entry> {
    entries.iter().find(|e| {
        e.kind == EntryKind::File
            && crate::tree::path::components(&e.path)
                .is_ok_and(|c| c.len() == 2 && c[1] == b"package.json")
    })
}

/// Digests of all of `archive`'s bytes.
fn digests(archive: &Archive) -> Result<Vec<(&'static str, Vec<u8>)>> {
    use sha1::Digest as _;
    let (mut s512, mut s1) = (sha2::Sha512::new(), sha1::Sha1::new());
    super::each_chunk(archive, |b| {
        s512.update(b);
        s1.update(b);
    })?;
    Ok(vec![
        ("sha512", s512.finalize().to_vec()),
        ("sha1", s1.finalize().to_vec()),
    ])
}

/// Whether `facts`' digests satisfy an SRI `integrity` string (`sha512-BASE64 …`): the
/// strongest algorithm both know must match.
fn integrity_ok(integrity: &str, facts: &Facts) -> std::result::Result<(), String> {
    use base64::Engine as _;
    for (algo, got) in &facts.digests {
        let listed: Vec<&str> = integrity
            .split_whitespace()
            .filter_map(|h| h.strip_prefix(algo)?.strip_prefix('-'))
            .map(|h| h.split('?').next().unwrap_or(h))
            .collect();
        if listed.is_empty() {
            continue;
        }
        let have = base64::engine::general_purpose::STANDARD.encode(got);
        return if listed.contains(&have.as_str()) {
            Ok(())
        } else {
            Err(format!(
                "integrity mismatch: the lockfile says {algo}-{}, the tarball is {algo}-{have}",
                listed[0]
            ))
        };
    }
    Err(format!("no integrity the mount can check in {integrity:?}"))
}

/// The `bin` entries of a manifest as (link name, path inside the package).
fn bins(m: &Manifest, name: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let pairs: Vec<(String, String)> = match &m.bin {
        serde_json::Value::String(p) => {
            vec![(
                name.rsplit('/').next().unwrap_or(name).to_string(),
                p.clone(),
            )]
        }
        serde_json::Value::Object(o) => o
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter_map(|(k, v)| {
            // As npm-normalize-package-bin: the link is the key's last component, the
            // target a path inside the package.
            let link = k.rsplit(['/', '\\']).next().unwrap_or(&k);
            let target = crate::tree::path::components(v.as_bytes())
                .ok()?
                .join(&b'/');
            plain_component(link.as_bytes()).then(|| (link.as_bytes().to_vec(), target))
        })
        .collect()
}

impl Npm {
    /// Read and check the manifest facts of the package `name`: (name, version).
    fn identify(facts: &Facts) -> std::result::Result<(Manifest, String, String), String> {
        let bytes = facts
            .manifest
            .as_deref()
            .ok_or("not an npm package (no package/package.json)")?;
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| format!("its package.json: {e}"))?;
        let name = m
            .name
            .as_str()
            .ok_or("its package.json has no name")?
            .to_string();
        let version = m.version.as_str().unwrap_or_default().to_string();
        Ok((m, name, version))
    }

    /// Link the package's bins from the `.bin` of the `node_modules` it is at (`at`).
    fn link_bins(&mut self, at: &[Vec<u8>], install_name_len: usize, bins: &[(Vec<u8>, Vec<u8>)]) {
        let (parent, own) = at.split_at(at.len() - install_name_len);
        for (link, target) in bins {
            let mut path = parent.join(&b'/');
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(b".bin/");
            path.extend_from_slice(link);
            let mut t = b"../".to_vec();
            t.extend_from_slice(&own.join(&b'/'));
            t.push(b'/');
            t.extend_from_slice(target);
            self.bins.entry(path).or_insert(t);
        }
    }
}

/// What npm needs of a tarball: its `package.json`, and with a lockfile its digests.
struct Inspector {
    digests: bool,
}

impl super::Inspect for Inspector {
    fn inspect(&self, archive: &Archive, entries: &[Entry]) -> Result<Facts> {
        let mut facts = Facts::default();
        if let Some(e) = manifest_entry(entries) {
            if e.size > MAX_MANIFEST {
                return Err(Error::Format(format!("a package.json of {} bytes", e.size)));
            }
            let io = crate::io::Io::new(0);
            let data = archive.read(
                &io,
                &e.data,
                e.size,
                0,
                e.size as u32,
                crate::io::Span::Whole,
            )?;
            facts.manifest = Some(data.into_vec());
        }
        if self.digests {
            facts.digests = digests(archive)?;
        }
        Ok(facts)
    }
}

impl Layout for Npm {
    fn inspector(&self) -> Box<dyn super::Inspect> {
        Box::new(Inspector {
            digests: self.plan.is_some(),
        })
    }

    fn place(&mut self, name: &Path, entries: &mut Vec<Entry>, facts: &Facts) -> Placement {
        let (manifest, pkg, version) = match Self::identify(facts) {
            Ok(x) => x,
            Err(why) => return Placement::Refused(why),
        };
        let Some(own) = name_components(&pkg) else {
            return Placement::Refused(format!(
                "its package.json names it {pkg:?}, not a package name"
            ));
        };
        let places: Vec<Vec<Vec<u8>>> = match &mut self.plan {
            None => {
                let key = own.join(&b'/');
                if let Some(first) = self.taken.get(&key) {
                    return Placement::Refused(format!(
                        "{pkg} is placed already, from {}",
                        first.display()
                    ));
                }
                self.taken.insert(key, name.to_path_buf());
                vec![own.clone()]
            }
            Some(plan) => {
                let id = (pkg.clone(), version.clone());
                if let Some(first) = plan.found.get(&id) {
                    return Placement::Refused(format!(
                        "a second tarball of {pkg}@{version} (the first: {})",
                        first.display()
                    ));
                }
                let Some(wanted) = plan.wanted.get(&id) else {
                    return Placement::Unused(format!("{pkg}@{version} is not in the lockfile"));
                };
                for (_, integrity) in wanted {
                    let checked = match integrity {
                        Some(i) => integrity_ok(i, facts),
                        None => Ok(()),
                    };
                    if let Err(why) = checked {
                        plan.refused.insert(id, name.to_path_buf());
                        return Placement::Refused(format!("{pkg}@{version}: {why}"));
                    }
                }
                plan.found.insert(id, name.to_path_buf());
                wanted.iter().map(|(c, _)| c.clone()).collect()
            }
        };
        let bins = bins(&manifest, &pkg);
        // The bin targets of packages bundled in this one, inside its tarball.
        let bundled: Vec<Vec<u8>> = self
            .plan
            .iter()
            .flat_map(|p| &p.bundled)
            .flat_map(|(comps, b)| {
                places
                    .iter()
                    .filter(|at| comps.len() > at.len() && comps.starts_with(at))
                    .flat_map(move |at| {
                        b.iter().map(move |(_, t)| {
                            let mut p = comps[at.len()..].join(&b'/');
                            p.push(b'/');
                            p.extend_from_slice(t);
                            p
                        })
                    })
            })
            .collect();
        for e in entries.iter_mut() {
            // As npm writes files: its umask (022) applied, no set-id or sticky bits,
            // owned by whoever installs (the mount's owner), bin targets executable.
            e.perm &= NPM_MODE_MASK;
            e.uid = None;
            e.gid = None;
            if let Ok(c) = crate::tree::path::components(&e.path)
                && c.len() > 1
                && (bins.iter().any(|(_, t)| c[1..].join(&b'/') == *t)
                    || bundled.contains(&c[1..].join(&b'/')))
            {
                e.perm |= 0o111;
            }
        }
        for at in &places {
            self.link_bins(at, install_len(at), &bins);
        }
        Placement::Fold(
            places
                .into_iter()
                .map(|prefix| Place { strip: 1, prefix })
                .collect(),
        )
    }

    fn finish(&mut self) -> Result<Vec<Entry>> {
        if let Some(plan) = &self.plan {
            let mut missing: Vec<String> = plan
                .wanted
                .iter()
                .filter(|(id, _)| !plan.found.contains_key(*id) && !plan.refused.contains_key(*id))
                .map(|((n, v), at)| {
                    let at: Vec<String> = at
                        .iter()
                        .map(|(c, _)| String::from_utf8_lossy(&c.join(&b'/')).into_owned())
                        .collect();
                    format!("{n}@{v} (node_modules/{})", at.join(", node_modules/"))
                })
                .collect();
            missing.sort();
            if !missing.is_empty() {
                let list = missing.join("; ");
                if !self.allow_missing {
                    return Err(Error::Format(format!(
                        "{} package(s) of the lockfile are in no source: {list} (--allow-missing mounts without them)",
                        missing.len()
                    )));
                }
                log::warn!(
                    "{} package(s) of the lockfile are in no source: {list}",
                    missing.len()
                );
            }
        }
        Ok(self
            .bins
            .iter()
            .map(|(path, target)| symlink(path, target, 0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lockfile_keys_become_nested_paths_and_escapes_are_refused() {
        let (c, n) = install_path("node_modules/a/node_modules/@s/b").unwrap();
        assert_eq!(c.join(&b'/'), b"a/node_modules/@s/b");
        assert_eq!(n, "@s/b");
        for bad in [
            "packages/x",
            "node_modules/../etc",
            "node_modules/@s",
            "node_modules/a//b",
            "node_modules/a/node_modules/@s/@t",
        ] {
            assert!(install_path(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn package_names_must_be_names() {
        assert_eq!(name_components("@s/b").unwrap().len(), 2);
        assert_eq!(name_components("lodash").unwrap().len(), 1);
        for bad in ["../../etc", "@scope", "a/b", ".hidden", "@s/../x", ""] {
            assert!(name_components(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn integrity_is_checked_with_the_strongest_listed_digest() {
        use base64::Engine as _;
        let facts = Facts {
            digests: vec![("sha512", vec![1; 64]), ("sha1", vec![2; 20])],
            ..Facts::default()
        };
        let b = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
        assert!(integrity_ok(&format!("sha512-{}", b(&[1; 64])), &facts).is_ok());
        assert!(integrity_ok(&format!("sha1-{}", b(&[2; 20])), &facts).is_ok());
        let bad = integrity_ok(
            &format!("sha512-{} sha1-{}", b(&[9; 64]), b(&[2; 20])),
            &facts,
        );
        assert!(bad.unwrap_err().contains("mismatch"));
        assert!(integrity_ok("md5-xx", &facts).is_err());
    }

    #[test]
    fn optional_packages_for_other_platforms_are_skipped() {
        assert!(admits(&[], "linux"));
        assert!(admits(&["linux".into()], "linux"));
        assert!(!admits(&["darwin".into()], "linux"));
        assert!(!admits(&["!linux".into()], "linux"));
        assert!(admits(&["!win32".into()], "linux"));
    }

    #[test]
    fn bins_link_from_the_node_modules_the_package_is_in() {
        let m: Manifest = serde_json::from_str(
            r#"{"name":"@s/tool","version":"1.0.0","bin":{"tool":"./bin/t.js","../x":"bin/x.js","bad":"../../etc/passwd"}}"#,
        )
        .unwrap();
        let b = bins(&m, "@s/tool");
        assert_eq!(
            b,
            vec![
                (b"x".to_vec(), b"bin/x.js".to_vec()),
                (b"tool".to_vec(), b"bin/t.js".to_vec())
            ]
        );
        let mut npm = Npm::new(&crate::layout::Config::default()).unwrap();
        let at: Vec<Vec<u8>> = [&b"a"[..], b"node_modules", b"@s", b"tool"]
            .iter()
            .map(|c| c.to_vec())
            .collect();
        npm.link_bins(&at, 2, &b[1..]);
        assert_eq!(
            npm.bins.get(&b"a/node_modules/.bin/tool"[..]).unwrap(),
            b"../@s/tool/bin/t.js"
        );
    }
}
