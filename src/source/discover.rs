//! Discovery: the command line's sources expanded into candidate files in layer order
//! (an image into its layers, a remote store into its objects, a directory into its
//! files, a file into itself), and under `--verify` each source's seal opened and its
//! candidates wrapped or refused on the way.
//!
//! Kept apart from the scan so that the scan sees only candidates, and so that the
//! verification of sources (`verify`) depends on discovery and not on the scan.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

use super::candidate::Candidate;
use super::remote::{self, RemoteRef};
use super::verify::SealedSource;
use super::{image, verify};

/// The objects of a remote source: (name, blob), in layer order.
pub type Listing = Vec<(String, Arc<dyn crate::io::blob::Blob>)>;

/// What `discover` needs to verify sources, and where it puts their seals.
pub struct Verifying<'a> {
    /// The settings.
    pub config: &'a verify::VerifyConfig,
    /// The remote runtime (tree files of remote stores are fetched through it).
    pub remote: &'a dyn Fn() -> Result<Arc<crate::io::remote::Remote>>,
    /// The seals of the sources, as they are accepted.
    pub sealed: Mutex<Vec<Arc<verify::SealedSource>>>,
}

/// Expand sources into candidate files in layer order: an image into its layers (see
/// [`image`]), a directory into its files, a file into itself.
pub fn discover(
    sources: &[PathBuf],
    platform: Option<&image::Platform>,
    list_remote: &mut dyn FnMut(&RemoteRef, &Path) -> Result<Listing>,
    registries: &dyn Fn() -> Result<Arc<crate::io::registry::Registries>>,
    verify: Option<&Verifying<'_>>,
) -> Result<(Vec<Candidate>, Vec<image::Image>)> {
    let mut out = Vec::new();
    let mut images = Vec::new();
    for src in sources {
        if let Some(r) = src.to_str().and_then(RemoteRef::parse) {
            out.extend(remote_source(src, &r, list_remote, verify)?);
        } else if let Some(r) = image::ImageRef::parse(src.as_os_str()) {
            let img = image_source(&r, platform, registries, verify)?;
            out.extend(img.layers.iter().map(|l| Candidate {
                path: l.name.clone(),
                explicit: true,
                layer: Some(Arc::new(l.clone())),
                blob: None,
                refused: None,
                sealed: None,
            }));
            images.push(img);
        } else {
            out.extend(local_source(src, verify)?);
        }
    }
    Ok((out, images))
}

/// The objects of a remote source (a store's seal fetched while it is listed: the mount
/// waits for one round trip less).
fn remote_source(
    src: &Path,
    r: &RemoteRef,
    list_remote: &mut dyn FnMut(&RemoteRef, &Path) -> Result<Listing>,
    verify: Option<&Verifying<'_>>,
) -> Result<Vec<Candidate>> {
    let source = src.to_string_lossy();
    let one_file = matches!(r, RemoteRef::HttpFile(_));
    let (listing, seal) = match verify {
        Some(v) if !one_file => {
            let rt = (v.remote)()?;
            let (listing, seal) = std::thread::scope(|s| {
                let seal = s.spawn(|| verify::fetch_remote(r, &source, &rt));
                (list_remote(r, src), seal.join())
            });
            let seal =
                seal.unwrap_or_else(|_| Err(Error::Internal("fetching a seal panicked".into())));
            (listing?, Some(seal?))
        }
        _ => (list_remote(r, src)?, None),
    };
    let found: Vec<Candidate> = listing
        .iter()
        .map(|(name, blob)| Candidate {
            path: PathBuf::from(name),
            explicit: one_file,
            layer: None,
            blob: Some(blob.clone()),
            refused: None,
            sealed: None,
        })
        .collect();
    let Some(v) = verify else {
        return Ok(found);
    };
    if one_file {
        return Err(unsealed(src));
    }
    let seal =
        seal.ok_or_else(|| Error::Internal("a remote store's seal was not fetched".into()))?;
    let sealed = Arc::new(verify::open_remote(v.config, &source, seal)?);
    let out = seal_candidates(&sealed, found);
    crate::sync::lock(&v.sealed).push(sealed);
    Ok(out)
}

/// An image, resolved into its layers.
fn image_source(
    r: &image::ImageRef,
    platform: Option<&image::Platform>,
    registries: &dyn Fn() -> Result<Arc<crate::io::registry::Registries>>,
    verify: Option<&Verifying<'_>>,
) -> Result<image::Image> {
    // A registry image pinned by digest is its own root of trust; nothing else of an
    // image is sealed.
    if verify.is_some() && r.registry.as_ref().is_none_or(|x| x.digest.is_none()) {
        return Err(Error::Format(format!(
            "{r}: --verify mounts an image only from a registry and pinned by its \
             digest (docker://HOST/REPO@sha256:…): a tag or a local layout has no seal"
        )));
    }
    image::resolve(r, platform, registries)
}

/// A local file (itself), or a local directory's files in byte order of their names
/// (hidden ones left out), through the directory's seal when verifying.
fn local_source(src: &Path, verify: Option<&Verifying<'_>>) -> Result<Vec<Candidate>> {
    let meta = std::fs::metadata(src).map_err(|e| Error::Io(e).with_path(src))?;
    if !meta.is_dir() && verify.is_some() {
        return Err(unsealed(src));
    }
    if !meta.is_dir() {
        return Ok(vec![Candidate {
            path: src.to_path_buf(),
            explicit: true,
            layer: None,
            blob: None,
            refused: None,
            sealed: None,
        }]);
    }
    let found = dir_files(src)?.into_iter().map(|n| Candidate {
        path: src.join(n),
        explicit: false,
        layer: None,
        blob: None,
        refused: None,
        sealed: None,
    });
    match verify {
        Some(v) => {
            let sealed = Arc::new(verify::open_local(v.config, src)?);
            let out = seal_candidates(&sealed, found.collect());
            crate::sync::lock(&v.sealed).push(sealed);
            Ok(out)
        }
        None => Ok(found.collect()),
    }
}

/// The names of the files in directory `src` (symlinks followed), hidden ones left out,
/// in byte order.
fn dir_files(src: &Path) -> Result<Vec<std::ffi::OsString>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(src).map_err(|e| Error::Io(e).with_path(src))? {
        let entry = entry.map_err(|e| Error::Io(e).with_path(src))?;
        let name = entry.file_name();
        if name.as_encoded_bytes().first() == Some(&b'.') {
            continue;
        }
        // Follow symlinks: a directory of links to packages is a normal setup. The
        // type from the listing saves a stat per file (10,000 packages).
        let is_file = match entry.file_type() {
            Ok(t) if t.is_file() => true,
            Ok(t) if t.is_dir() => false,
            _ => std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()),
        };
        if is_file {
            names.push(name);
        }
    }
    names.sort_unstable_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    Ok(names)
}

fn unsealed(src: &Path) -> Error {
    Error::Format(format!(
        "{}: --verify mounts directories and remote stores sealed by `pkgfs seal`, not single files",
        src.display()
    ))
}

/// The candidates of a sealed source, each checked against the seal: an archive the seal
/// does not list, or of another size, is refused (and skipped, named); the others read
/// through their tree. Archives the seal lists that are not there are warned of.
fn seal_candidates(sealed: &Arc<SealedSource>, candidates: Vec<Candidate>) -> Vec<Candidate> {
    let mut seen = std::collections::HashSet::new();
    let out: Vec<Candidate> = candidates
        .into_iter()
        .filter(|c| {
            let n = file_name(c);
            !(n.starts_with(crate::seal::SEAL_FILE))
        })
        .map(|mut c| {
            let name = file_name(&c);
            seen.insert(name.clone());
            // A local file is opened (and its size checked) by the indexing threads, in
            // parallel: opening 100,000 one after another here took a second.
            let wrapped = match c.blob.clone() {
                Some(b) => sealed.wrap(&name, b).map(Some),
                None => sealed.listed(&name).map(|_| None),
            };
            match wrapped {
                Ok(Some(b)) => c.blob = Some(b),
                Ok(None) => c.sealed = Some(sealed.clone()),
                Err(e) => {
                    log::warn!("{}: {e}", c.path.display());
                    c.refused = Some(e);
                }
            }
            c
        })
        .collect();
    for a in &sealed.seal.archives {
        if !seen.contains(&a.name) {
            log::warn!(
                "{}: {} is in the seal but not in the store",
                sealed.source,
                a.name
            );
        }
    }
    out
}

fn file_name(c: &Candidate) -> String {
    match &c.blob {
        Some(_) => remote::object_name(&c.path.to_string_lossy()),
        None => c
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}
