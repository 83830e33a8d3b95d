//! Container images as sources, named as skopeo and podman name them:
//!
//! - `oci:DIR[:TAG]`: an OCI image layout (`index.json`, `blobs/sha256/…`), as
//!   `skopeo copy … oci:DIR:TAG`, `buildah push`, `umoci` write it;
//! - `oci-archive:FILE[:TAG]`: the same layout in a tar archive, read in place;
//! - `docker-archive:FILE[:REF]`: a `docker save` archive (`manifest.json`, a config
//!   and one tar per layer), `REF` a repository tag it lists (`name:tag`) or `@N`, the
//!   N-th image in it;
//! - `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]`: an image in a registry
//!   (`crate::io::registry`): the manifest fetched by tag or digest, the config by
//!   range, each layer a `RemoteBlob` whose ranges are fetched as the formats ask for
//!   them (a table of contents and then chunks; a pass over a gzip or zstd layer), kept
//!   in the disk cache under the blob's digest, so a layer two images or tags share is
//!   fetched once.
//!
//! An image resolves to its layers, bottom first: index → manifest (an index of several
//! platforms picks this machine's, or `--platform`'s) → config → layers. Every JSON
//! document is checked against the digest and size its descriptor gives, and is at most
//! [`MAX_JSON`] bytes; indexes nest at most [`MAX_NESTING`] deep; an image has at most
//! [`MAX_LAYERS`] layers. Each layer then goes to the formats like any archive (by
//! content, not by media type: some tools label plain tars as gzip), with what the
//! manifest promises of it ([`LayerCheck`]) for the format to check. Nothing is written
//! beside the image.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use log::{debug, warn};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::format::{DigestOf, LayerCheck};
use crate::io::blob::{Blob, LocalFile, Slice};
use crate::io::digest::Digest;
use crate::io::registry::{Reference, Registries, Registry};
use crate::io::remote::RemoteBlob;

/// Largest JSON document (index, manifest, config) read.
pub const MAX_JSON: u64 = 4 << 20;
/// Deepest nesting of image indexes.
pub const MAX_NESTING: usize = 8;
/// Most layers an image may have.
pub const MAX_LAYERS: usize = 1024;

/// How an image is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// An OCI image layout directory.
    Oci,
    /// An OCI image layout in a tar archive.
    OciArchive,
    /// A `docker save` archive.
    DockerArchive,
    /// A registry (`docker://`).
    Docker,
}

impl Transport {
    /// The prefix that names it.
    pub fn prefix(self) -> &'static str {
        match self {
            Transport::Oci => "oci",
            Transport::OciArchive => "oci-archive",
            Transport::DockerArchive => "docker-archive",
            Transport::Docker => "docker",
        }
    }
}

/// An image as named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// How it is stored.
    pub transport: Transport,
    /// The layout directory or the archive.
    pub path: PathBuf,
    /// Which image of it: a tag (`latest`), a `name:tag`, `@N`.
    pub reference: Option<String>,
    /// For `docker://`: the registry, repository, tag and digest (`path` is empty).
    pub registry: Option<Reference>,
}

impl ImageRef {
    /// Parse `oci:…`, `oci-archive:…` or `docker-archive:…`; `None` for anything else
    /// (a path). The path ends at the first `:` after the prefix (as in skopeo: a path
    /// with a colon cannot be named so); the rest is the reference.
    pub fn parse(s: &OsStr) -> Option<ImageRef> {
        let b = s.as_bytes();
        if let Some(rest) = b.strip_prefix(b"docker://") {
            // A malformed reference is still one: resolving it says what is wrong.
            let text = String::from_utf8_lossy(rest).into_owned();
            return Some(ImageRef {
                transport: Transport::Docker,
                path: PathBuf::new(),
                registry: Reference::parse(&text).ok(),
                reference: Some(text),
            });
        }
        let (transport, rest) = [
            Transport::OciArchive,
            Transport::DockerArchive,
            Transport::Oci,
        ]
        .into_iter()
        .find_map(|t| {
            b.strip_prefix(t.prefix().as_bytes())
                .and_then(|r| r.strip_prefix(b":"))
                .map(|r| (t, r))
        })?;
        let (path, reference) = match rest.iter().position(|&c| c == b':') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        Some(ImageRef {
            transport,
            path: PathBuf::from(OsStr::from_bytes(path)),
            reference: reference
                .filter(|r| !r.is_empty())
                .map(|r| String::from_utf8_lossy(r).into_owned()),
            registry: None,
        })
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.transport == Transport::Docker {
            return match &self.registry {
                Some(r) => write!(f, "{r}"),
                None => write!(f, "docker://{}", self.reference.as_deref().unwrap_or("")),
            };
        }
        write!(f, "{}:{}", self.transport.prefix(), self.path.display())?;
        if let Some(r) = &self.reference {
            write!(f, ":{r}")?;
        }
        Ok(())
    }
}

/// Which platform's image to take from a multi-platform index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`…
    pub architecture: String,
    /// `v8`, `v7`… (matched only when given).
    pub variant: Option<String>,
}

impl Platform {
    /// This machine's platform, in OCI's words.
    pub fn host() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", None),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
            "loongarch64" => ("loong64", None),
            other => (other, None),
        };
        Platform {
            os: std::env::consts::OS.into(),
            architecture: architecture.into(),
            variant: variant.map(Into::into),
        }
    }

    /// Parse `os/arch[/variant]`.
    pub fn parse(s: &str) -> std::result::Result<Platform, String> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts[..] {
            [os, arch] | [os, arch, _] if !os.is_empty() && !arch.is_empty() => Ok(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: parts.get(2).filter(|v| !v.is_empty()).map(|v| (*v).into()),
            }),
            _ => Err(format!("platform {s:?} is not OS/ARCH[/VARIANT]")),
        }
    }

    fn matches(&self, p: &PlatformJson) -> bool {
        p.os == self.os
            && p.architecture == self.architecture
            && self
                .variant
                .as_ref()
                .is_none_or(|v| p.variant.as_deref().is_none_or(|pv| pv == v))
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A resolved image.
#[derive(Debug, Clone)]
pub struct Image {
    /// How it was named.
    pub reference: ImageRef,
    /// The digest of its manifest (OCI), or of its config (docker archives have no
    /// manifest of their own).
    pub manifest: Option<Digest>,
    /// The digest of its config.
    pub config: Option<Digest>,
    /// The platform its config names.
    pub platform: Option<String>,
    /// Its layers, bottom first.
    pub layers: Vec<ImageLayer>,
}

impl Image {
    /// What `pkgfs status` says of it.
    pub fn summary(&self) -> ImageSummary {
        ImageSummary {
            reference: self.reference.to_string(),
            manifest: self.manifest.as_ref().map(ToString::to_string),
            config: self.config.as_ref().map(ToString::to_string),
            platform: self.platform.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| {
                    (
                        l.check.digest.to_string(),
                        l.media_type.clone(),
                        l.blob.size(),
                    )
                })
                .collect(),
        }
    }
}

/// One layer of a resolved image.
#[derive(Debug, Clone)]
pub struct ImageLayer {
    /// How it is named in messages and `status`: the image, the layer's number and digest.
    pub name: PathBuf,
    /// Its bytes.
    pub blob: Arc<dyn Blob>,
    /// What the manifest promises of it.
    pub check: LayerCheck,
    /// Its media type, as the manifest gives it.
    pub media_type: String,
    /// Fetch all of it in the background once it is open, if it is read lazily (a
    /// registry's layers, unless `--no-background-fetch`).
    pub background_fetch: bool,
    /// The digest of its uncompressed tar stream, as the config's `rootfs.diff_ids`
    /// gives it.
    pub diff_id: Option<Digest>,
    /// The size of its uncompressed tar stream, where an annotation gives it (eStargz's
    /// `io.containers.estargz.uncompressed-size`).
    pub diff_size: Option<u64>,
    /// Its image's start is recorded and replayed (`io::starts`), if it is read lazily
    /// from a registry and the image's digest is known.
    pub start: Option<StartSpec>,
}

/// Where a layer's start is recorded: under its image's manifest digest (a layer shared
/// by two images has a record for each), for how long after the layer opens.
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// The image's manifest digest.
    pub image: String,
    /// How long its reads are recorded.
    pub window: std::time::Duration,
}

/// The annotation eStargz writers put on a layer with its uncompressed size.
const UNCOMPRESSED_SIZE_ANNOTATION: &str = "io.containers.estargz.uncompressed-size";

/// `platform` of a descriptor.
#[derive(Deserialize, Debug, Clone, Default)]
struct PlatformJson {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

/// An OCI content descriptor.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<PlatformJson>,
    /// Set on artifacts that are not images (a SOCI index beside its image).
    #[serde(default)]
    artifact_type: Option<String>,
}

/// An image index (`index.json`, a manifest list).
#[derive(Deserialize, Debug)]
struct IndexJson {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Deserialize, Debug)]
struct ManifestJson {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
    /// What it refers to (a SOCI index manifest v1: its image).
    #[serde(default)]
    subject: Option<Descriptor>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// What a manifest or index blob is, by media type or (unlabelled) by content.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Sniff {
    #[serde(default)]
    media_type: String,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    layers: Option<serde::de::IgnoredAny>,
}

/// An image config (the parts pkgfs looks at).
#[derive(Deserialize, Debug, Default)]
struct ConfigJson {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Deserialize, Debug, Default)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// One entry of a docker archive's `manifest.json`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// Annotations naming a zstd:chunked layer's table digest (sha256 of the stored table).
const TOC_BLOB_ANNOTATIONS: &[&str] = &[
    "io.github.containers.zstd-chunked.manifest-checksum",
    "io.containers.zstd-chunked.manifest-checksum",
];
/// Annotation naming an eStargz layer's table digest (of its JSON).
const TOC_JSON_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";

/// Where an image's files are: a directory, members of a tar archive, a repository of
/// a registry.
enum Store {
    Dir(PathBuf),
    Archive {
        file: Arc<dyn Blob>,
        /// Regular members: normalised path → (data offset, size).
        members: HashMap<Vec<u8>, (u64, u64)>,
    },
    Registry {
        registry: Arc<Registry>,
        reference: Reference,
    },
}

/// A manifest or index, fetched: its bytes, digest and media type (from its descriptor
/// or the registry's answer; empty if neither says).
struct Doc {
    bytes: Vec<u8>,
    digest: Digest,
    media_type: String,
}

impl Store {
    fn open(r: &ImageRef, registries: &dyn Fn() -> Result<Arc<Registries>>) -> Result<Store> {
        match r.transport {
            Transport::Docker => {
                let reference = match &r.registry {
                    Some(rr) => rr.clone(),
                    None => Reference::parse(r.reference.as_deref().unwrap_or(""))?,
                };
                Ok(Store::Registry {
                    registry: registries()?.get(&reference.host)?,
                    reference,
                })
            }
            Transport::Oci => {
                if !r.path.is_dir() {
                    return Err(Error::Format(format!(
                        "{}: not an OCI image layout directory",
                        r.path.display()
                    )));
                }
                Ok(Store::Dir(r.path.clone()))
            }
            Transport::OciArchive | Transport::DockerArchive => {
                let file: Arc<dyn Blob> =
                    LocalFile::open(&r.path).map_err(|e| e.with_path(&r.path))?;
                let mut members = HashMap::new();
                crate::format::floor::tar::walk_blob(&*file, |te| {
                    if te.kind == crate::format::floor::tar::TarKind::File {
                        let p = crate::tree::path::components(&te.path)
                            .map(|c| c.join(&b'/'))
                            .unwrap_or_default();
                        members.insert(p, (te.data_offset, te.size));
                    }
                    Ok(())
                })
                .map_err(|e| Error::Format(format!("{}: {e}", r.path.display())))?;
                Ok(Store::Archive { file, members })
            }
        }
    }

    /// The file at `name` (a path inside the layout or archive), if present.
    fn file(&self, name: &str) -> Result<Option<Arc<dyn Blob>>> {
        match self {
            Store::Dir(dir) => {
                // Names come from the image's own JSON: refuse any that could leave it.
                let comps = crate::tree::path::components(name.as_bytes()).map_err(|e| {
                    Error::Format(format!("unsafe path {name:?} in the image: {e}"))
                })?;
                let path = comps
                    .iter()
                    .fold(dir.clone(), |p, c| p.join(OsStr::from_bytes(c)));
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.is_file() => Ok(Some(LocalFile::open(&path)? as Arc<dyn Blob>)),
                    Ok(_) => Err(Error::Format(format!(
                        "{} is not a regular file",
                        path.display()
                    ))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::Io(e).with_path(&path)),
                }
            }
            Store::Archive { file, members } => {
                let key = crate::tree::path::components(name.as_bytes())
                    .map(|c| c.join(&b'/'))
                    .map_err(|e| {
                        Error::Format(format!("unsafe path {name:?} in the image: {e}"))
                    })?;
                match members.get(&key) {
                    Some(&(off, len)) => Ok(Some(Arc::new(Slice::new(
                        file.clone(),
                        off,
                        len,
                        PathBuf::from(format!("{}:{name}", file.name().display())),
                    )?))),
                    None => Ok(None),
                }
            }
            Store::Registry { .. } => Ok(None),
        }
    }

    /// The blob a descriptor names: present, of the size it says.
    fn blob(&self, d: &Digest, size: i64, what: &str) -> Result<Arc<dyn Blob>> {
        if let Store::Registry {
            registry,
            reference,
        } = self
        {
            // The descriptor's size is the blob's: nothing is asked of the registry
            // until a range is read (a wrong size fails that read, or the digest).
            let size = u64::try_from(size)
                .map_err(|_| Error::Format(format!("{what} {d}: size {size}")))?;
            return Ok(Arc::new(RemoteBlob::of(
                format!("{}/{}@{d}", reference.host, reference.repo),
                registry.blob(&reference.repo, d),
                size,
                format!("oci-blob\0{d}"),
                0,
                registry.remote().clone(),
            )));
        }
        let blob = self
            .file(&d.blob_path())?
            .ok_or_else(|| Error::Format(format!("{what} {d} is missing from the image")))?;
        if i64::try_from(blob.size()).ok() != Some(size) {
            return Err(Error::Corrupt(format!(
                "{what} {d} has {} bytes, its descriptor says {size}",
                blob.size()
            )));
        }
        Ok(blob)
    }

    /// The manifest or index a descriptor names, checked against its digest and size.
    fn manifest(&self, desc: &Descriptor) -> Result<Doc> {
        let digest = descriptor_digest(desc, "a manifest descriptor")?;
        let what = format!("manifest {digest}");
        let bytes = match self {
            Store::Registry {
                registry,
                reference,
            } => {
                let size = u64::try_from(desc.size)
                    .ok()
                    .filter(|&n| n <= MAX_JSON)
                    .ok_or_else(|| {
                        Error::Format(format!(
                            "{what} has {} bytes: more than the {} MiB pkgfs reads",
                            desc.size,
                            MAX_JSON >> 20
                        ))
                    })?;
                cached_manifest(registry, &reference.repo, &digest, size, &what)?
            }
            _ => {
                let blob = self.blob(&digest, desc.size, "manifest")?;
                self.json(&*blob, Some(&digest), &what)?
            }
        };
        Ok(Doc {
            bytes,
            digest,
            media_type: desc.media_type.clone(),
        })
    }

    /// A manifest named by digest alone (an annotation gives no size): at most
    /// [`MAX_JSON`] bytes, checked against the digest.
    fn manifest_by_digest(&self, digest: &Digest) -> Result<Vec<u8>> {
        let what = format!("manifest {digest}");
        match self {
            Store::Registry {
                registry,
                reference,
            } => {
                if let Some(size) = registry.cached_manifest_size(digest)
                    && let Ok(bytes) =
                        cached_manifest(registry, &reference.repo, digest, size, &what)
                {
                    return Ok(bytes);
                }
                let m = registry.run(
                    &what,
                    registry.manifest(&reference.repo, &digest.to_string(), MAX_JSON as usize),
                )?;
                digest.check(&m.bytes, &what)?;
                registry.keep_manifest(digest, &m.bytes);
                Ok(m.bytes)
            }
            _ => {
                let blob = self
                    .file(&digest.blob_path())?
                    .ok_or_else(|| Error::Format(format!("{what} is missing from the image")))?;
                self.json(&*blob, Some(digest), &what)
            }
        }
    }

    /// The manifest or index a registry reference names (by tag: its digest is computed,
    /// and must equal the registry's `Docker-Content-Digest`; by digest: checked).
    fn top(&self) -> Result<Doc> {
        let Store::Registry {
            registry,
            reference,
        } = self
        else {
            return Err(Error::Format("not a registry".into()));
        };
        let name = reference.manifest_reference();
        let what = format!("manifest {name}");
        // Pinned by a digest whose manifest the disk cache holds: no request at all.
        if let Some(d) = &reference.digest
            && let Some(size) = registry.cached_manifest_size(d)
            && let Ok(bytes) = cached_manifest(registry, &reference.repo, d, size, &what)
        {
            return Ok(Doc {
                bytes,
                digest: d.clone(),
                media_type: String::new(),
            });
        }
        let m = registry.run(
            &what,
            registry.manifest(&reference.repo, &name, MAX_JSON as usize),
        )?;
        let digest = match &reference.digest {
            Some(d) => {
                d.check(&m.bytes, &what)?;
                d.clone()
            }
            None => {
                let mut h = crate::io::digest::Hasher::new(crate::io::digest::Algorithm::Sha256);
                h.update(&m.bytes);
                let computed = h.finish();
                if let Some(said) = m.digest.as_deref().and_then(|d| Digest::parse(d).ok())
                    && said.algorithm() == computed.algorithm()
                    && said != computed
                {
                    return Err(Error::Corrupt(format!(
                        "{what}: the registry says its digest is {said}, its bytes hash to \
                         {computed}"
                    )));
                }
                computed
            }
        };
        registry.keep_manifest(&digest, &m.bytes);
        Ok(Doc {
            bytes: m.bytes,
            digest,
            media_type: m.media_type,
        })
    }

    /// A JSON document: at most [`MAX_JSON`] bytes, checked against `digest` if given.
    fn json(&self, blob: &dyn Blob, digest: Option<&Digest>, what: &str) -> Result<Vec<u8>> {
        if blob.size() > MAX_JSON {
            return Err(Error::Format(format!(
                "{what} has {} bytes: more than the {} MiB pkgfs reads",
                blob.size(),
                MAX_JSON >> 20
            )));
        }
        let mut bytes = vec![0u8; blob.size() as usize];
        blob.read_exact_at(&mut bytes, 0)?;
        if let Some(d) = digest {
            d.check(&bytes, what)?;
        }
        Ok(bytes)
    }
}

/// Manifest `digest` (of `size` bytes) of a registry repository, through the disk cache,
/// checked against its digest (bytes that fail are dropped from the cache).
fn cached_manifest(
    registry: &Arc<Registry>,
    repo: &str,
    digest: &Digest,
    size: u64,
    what: &str,
) -> Result<Vec<u8>> {
    let blob = registry.manifest_blob(repo, digest, size);
    let mut bytes = vec![0u8; size as usize];
    blob.read_exact_at(&mut bytes, 0)?;
    if let Err(e) = digest.check(&bytes, what) {
        blob.forget();
        return Err(e);
    }
    Ok(bytes)
}

fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Format(format!("{what} is not valid: {e}")))
}

fn descriptor_digest(d: &Descriptor, what: &str) -> Result<Digest> {
    Digest::parse(&d.digest).map_err(|e| Error::Format(format!("{what}: {e}")))
}

/// Resolve `r` to its layers; `registries` gives the registry clients (made on first
/// use: only `docker://` needs them).
pub fn resolve(
    r: &ImageRef,
    platform: Option<&Platform>,
    registries: &dyn Fn() -> Result<Arc<Registries>>,
) -> Result<Image> {
    let store = Store::open(r, registries).map_err(|e| match e {
        Error::Format(m) if r.transport == Transport::Docker => Error::Format(m),
        e => e,
    })?;
    let image = match r.transport {
        Transport::Oci | Transport::OciArchive => resolve_oci(r, &store, platform),
        Transport::DockerArchive => resolve_docker(r, &store),
        Transport::Docker => store
            .top()
            .and_then(|top| descend(r, &store, top, platform)),
    }
    .map_err(|e| match e {
        Error::Format(m) => Error::Format(format!("{r}: {m}")),
        Error::Corrupt(m) => Error::Corrupt(format!("{r}: {m}")),
        Error::Unsupported(m) => Error::Unsupported(format!("{r}: {m}")),
        e => e,
    })?;
    debug!(
        "{r}: {} layers (manifest {:?}, config {:?})",
        image.layers.len(),
        image.manifest.as_ref().map(ToString::to_string),
        image.config.as_ref().map(ToString::to_string)
    );
    Ok(image)
}

fn resolve_oci(r: &ImageRef, store: &Store, platform: Option<&Platform>) -> Result<Image> {
    let index_blob = store
        .file("index.json")?
        .ok_or_else(|| Error::Format("no index.json: not an OCI image layout".into()))?;
    let index: IndexJson =
        parse_json(&store.json(&*index_blob, None, "index.json")?, "index.json")?;
    // The tag: `org.opencontainers.image.ref.name` of a top-level descriptor.
    let top: Vec<&Descriptor> = match &r.reference {
        Some(tag) => index
            .manifests
            .iter()
            .filter(|d| d.annotations.get("org.opencontainers.image.ref.name") == Some(tag))
            .collect(),
        None => index.manifests.iter().collect(),
    };
    let desc = match (top.as_slice(), &r.reference) {
        ([d], _) => (*d).clone(),
        ([], Some(tag)) => {
            let tags: Vec<&str> = index
                .manifests
                .iter()
                .filter_map(|d| d.annotations.get("org.opencontainers.image.ref.name"))
                .map(String::as_str)
                .collect();
            return Err(Error::Format(format!(
                "no image tagged {tag:?} (tags: {})",
                if tags.is_empty() {
                    "none".into()
                } else {
                    tags.join(", ")
                }
            )));
        }
        ([], None) => return Err(Error::Format("index.json lists no image".into())),
        (many, None) => {
            // Several descriptors without a tag: one platform's, if that picks one.
            let want = platform.cloned().unwrap_or_else(Platform::host);
            match pick_platform(many, &want) {
                Some(d) => d.clone(),
                None => {
                    return Err(Error::Format(format!(
                        "index.json lists {} images: name one with :TAG",
                        many.len()
                    )));
                }
            }
        }
        (_, Some(tag)) => {
            return Err(Error::Format(format!("several images are tagged {tag:?}")));
        }
    };
    let top = store.manifest(&desc)?;
    descend(r, store, top, platform)
}

/// Down from `doc` through nested indexes to a manifest, and its image.
fn descend(
    r: &ImageRef,
    store: &Store,
    mut doc: Doc,
    platform: Option<&Platform>,
) -> Result<Image> {
    for depth in 0.. {
        if depth > MAX_NESTING {
            return Err(Error::Format(format!(
                "image indexes nest more than {MAX_NESTING} deep"
            )));
        }
        let digest = doc.digest.clone();
        let what = format!("manifest {digest}");
        let bytes = std::mem::take(&mut doc.bytes);
        let sniff: Sniff = parse_json(&bytes, &what)?;
        let media = if doc.media_type.is_empty() {
            sniff.media_type.as_str()
        } else {
            doc.media_type.as_str()
        };
        let is_index =
            INDEX_TYPES.contains(&media) || (media.is_empty() && sniff.manifests.is_some());
        let is_manifest =
            MANIFEST_TYPES.contains(&media) || (media.is_empty() && sniff.layers.is_some());
        if is_index {
            let idx: IndexJson = parse_json(&bytes, &what)?;
            let refs: Vec<&Descriptor> = idx.manifests.iter().collect();
            let want = platform.cloned().unwrap_or_else(Platform::host);
            let desc = match refs.as_slice() {
                [only] if only.platform.is_none() => (*only).clone(),
                _ => pick_platform(&refs, &want).cloned().ok_or_else(|| {
                    let have: Vec<String> = refs
                        .iter()
                        .filter_map(|d| d.platform.as_ref())
                        .map(|p| format!("{}/{}", p.os, p.architecture))
                        .collect();
                    Error::Format(format!(
                        "no image for {want} (the index has {})",
                        if have.is_empty() {
                            "none labelled".into()
                        } else {
                            have.join(", ")
                        }
                    ))
                })?,
            };
            doc = store.manifest(&desc)?;
            continue;
        }
        if !is_manifest {
            return Err(Error::Unsupported(format!(
                "{what} has media type {media:?}, not an image manifest"
            )));
        }
        let manifest: ManifestJson = parse_json(&bytes, &what)?;
        return image_of(r, store, Some(digest), &manifest, platform);
    }
    unreachable!("the loop returns or fails")
}

/// The descriptor for `want`, if one matches (an image's, not an artifact's: a SOCI
/// index sits beside its image with the same platform).
fn pick_platform<'a>(descs: &[&'a Descriptor], want: &Platform) -> Option<&'a Descriptor> {
    descs
        .iter()
        .filter(|d| d.artifact_type.is_none() && !d.annotations.contains_key(SOCI_IMAGE_ANNOTATION))
        .find(|d| d.platform.as_ref().is_some_and(|p| want.matches(p)))
        .copied()
}

/// A manifest's annotation naming its SOCI index (SOCI index manifest v2).
const SOCI_INDEX_ANNOTATION: &str = "com.amazon.soci.index-digest";
/// A SOCI index's annotation naming its image.
const SOCI_IMAGE_ANNOTATION: &str = "com.amazon.soci.image-manifest-digest";
/// The config media types of SOCI indexes.
const SOCI_INDEX_TYPES: &[&str] = &[
    "application/vnd.amazon.soci.index.v2+json",
    "application/vnd.amazon.soci.index.v1+json",
];
/// A zTOC descriptor's annotation naming the layer it describes.
const SOCI_LAYER_ANNOTATION: &str = "com.amazon.soci.image-layer-digest";
/// The artifact type of a SOCI index manifest v1 (a referrer of its image).
const SOCI_V1_ARTIFACT: &str = "application/vnd.amazon.soci.index.v1+json";

/// The SOCI index manifest v1 of the image whose manifest is `digest`, found among its
/// referrers (the referrers API or its fallback tag). Only for an image named by tag:
/// a v1 index is not part of the image (anyone who may push to the repository can add
/// one), so an image pinned by digest, a root of trust, never takes one.
fn soci_v1_index(store: &Store, digest: &Digest) -> Result<Option<Digest>> {
    let Store::Registry {
        registry,
        reference,
    } = store
    else {
        return Ok(None);
    };
    if reference.digest.is_some() {
        return Ok(None);
    }
    let Some(bytes) = registry.run(
        "SOCI referrers",
        registry.referrers(&reference.repo, digest, SOCI_V1_ARTIFACT, MAX_JSON as usize),
    )?
    else {
        return Ok(None);
    };
    let index: IndexJson = parse_json(&bytes, "the referrers index")?;
    // The last one listed: the newest, as soci itself picks.
    index
        .manifests
        .iter()
        .rev()
        .find(|d| d.artifact_type.as_deref() == Some(SOCI_V1_ARTIFACT))
        .map(|d| descriptor_digest(d, "a referrer"))
        .transpose()
}

/// The zTOCs of the SOCI index `manifest` names, by layer digest (none when it names
/// none; a SOCI index that cannot be read is reported and its image mounts without it:
/// it only spares passes).
fn soci_ztocs(
    r: &ImageRef,
    store: &Store,
    manifest: &ManifestJson,
    manifest_digest: Option<&Digest>,
) -> HashMap<Digest, crate::format::ZtocRef> {
    // v2: the manifest names it. v1: a referrer of the manifest, looked for only where
    // a gzip layer would otherwise take a pass.
    let (d, v1) = match manifest.annotations.get(SOCI_INDEX_ANNOTATION) {
        Some(d) => (d.clone(), false),
        None => {
            let wants_one = manifest.layers.iter().any(|l| {
                l.media_type.ends_with("gzip")
                    && !TOC_BLOB_ANNOTATIONS
                        .iter()
                        .chain(&[TOC_JSON_ANNOTATION])
                        .any(|a| l.annotations.contains_key(*a))
            });
            let Some(md) = manifest_digest.filter(|_| wants_one) else {
                return HashMap::new();
            };
            match soci_v1_index(store, md) {
                Ok(Some(d)) => (d.to_string(), true),
                Ok(None) => return HashMap::new(),
                Err(e) => {
                    debug!("{r}: no SOCI referrers ({e})");
                    return HashMap::new();
                }
            }
        }
    };
    let d = d.as_str();
    let read = || -> Result<HashMap<Digest, crate::format::ZtocRef>> {
        let digest = Digest::parse(d)?;
        let bytes = store.manifest_by_digest(&digest)?;
        let index: ManifestJson = parse_json(&bytes, "the SOCI index")?;
        if !SOCI_INDEX_TYPES.contains(&index.config.media_type.as_str()) {
            return Err(Error::Format(format!(
                "its config has media type {:?}, not a SOCI index's",
                index.config.media_type
            )));
        }
        // A v1 index is this image's only if its subject says so.
        if v1 {
            let subject = index
                .subject
                .as_ref()
                .map(|s| descriptor_digest(s, "its subject"))
                .transpose()?;
            if subject.as_ref() != manifest_digest {
                return Err(Error::Format(format!(
                    "its subject is {}, not this image",
                    subject.map_or("missing".into(), |s| s.to_string())
                )));
            }
        }
        let mut out = HashMap::new();
        for z in &index.layers {
            let Some(layer) = z.annotations.get(SOCI_LAYER_ANNOTATION) else {
                continue;
            };
            let zd = descriptor_digest(z, "a zTOC descriptor")?;
            let blob = store.blob(&zd, z.size, "zTOC")?;
            out.insert(
                Digest::parse(layer)?,
                crate::format::ZtocRef { blob, digest: zd },
            );
        }
        Ok(out)
    };
    match read() {
        Ok(m) => {
            debug!(
                "{r}: SOCI index {d} (manifest {}): zTOCs for {} layers",
                if v1 { "v1, a referrer" } else { "v2" },
                m.len()
            );
            m
        }
        Err(e) => {
            warn!(
                "{r}: its SOCI index {d} cannot be used ({e}): gzip layers are indexed by a pass"
            );
            HashMap::new()
        }
    }
}

fn image_of(
    r: &ImageRef,
    store: &Store,
    manifest_digest: Option<Digest>,
    manifest: &ManifestJson,
    platform: Option<&Platform>,
) -> Result<Image> {
    if manifest.layers.len() > MAX_LAYERS {
        return Err(Error::Format(format!(
            "{} layers: pkgfs mounts at most {MAX_LAYERS}",
            manifest.layers.len()
        )));
    }
    let config_digest = descriptor_digest(&manifest.config, "the config descriptor")?;
    let config_blob = store.blob(&config_digest, manifest.config.size, "config")?;
    let config: ConfigJson = parse_json(
        &store.json(
            &*config_blob,
            Some(&config_digest),
            &format!("config {config_digest}"),
        )?,
        "the config",
    )?;
    let image_platform = (!config.os.is_empty()).then(|| {
        let mut p = format!("{}/{}", config.os, config.architecture);
        if let Some(v) = &config.variant {
            p.push('/');
            p.push_str(v);
        }
        p
    });
    let want = platform.cloned().unwrap_or_else(Platform::host);
    if !config.os.is_empty()
        && !want.matches(&PlatformJson {
            os: config.os.clone(),
            architecture: config.architecture.clone(),
            variant: config.variant.clone(),
        })
    {
        warn!(
            "{r} is an image for {}, not {want}: its programs may not run here",
            image_platform.as_deref().unwrap_or("?")
        );
    }
    let n = manifest.layers.len();
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| &r.diff_ids[..])
        .unwrap_or(&[]);
    let mut layers = Vec::with_capacity(n);
    let mut ztocs = soci_ztocs(r, store, manifest, manifest_digest.as_ref());
    for (i, d) in manifest.layers.iter().enumerate() {
        let digest = descriptor_digest(d, &format!("layer {}", i + 1))?;
        let ztoc = ztocs.remove(&digest);
        if d.media_type.contains("+encrypted") {
            return Err(Error::Unsupported(format!(
                "layer {} ({digest}) is encrypted",
                i + 1
            )));
        }
        let blob = store.blob(&digest, d.size, &format!("layer {} blob", i + 1))?;
        let annotation = |names: &[&str]| -> Result<Option<Digest>> {
            names
                .iter()
                .find_map(|n| d.annotations.get(*n))
                .map(|v| Digest::parse(v))
                .transpose()
        };
        let (name, blob) = layer_named(r, i, n, &digest, blob);
        layers.push(ImageLayer {
            blob,
            name,
            check: LayerCheck {
                digest,
                of: DigestOf::Blob,
                toc_blob: annotation(TOC_BLOB_ANNOTATIONS)?,
                toc_json: annotation(&[TOC_JSON_ANNOTATION])?,
                ztoc,
            },
            media_type: d.media_type.clone(),
            background_fetch: match store {
                Store::Registry { registry, .. } => registry.background_fetch(),
                _ => false,
            },
            // Only where the config lists one per layer (otherwise the list says nothing
            // reliable of this one).
            diff_id: (diff_ids.len() == n)
                .then(|| Digest::parse(&diff_ids[i]).ok())
                .flatten(),
            diff_size: d
                .annotations
                .get(UNCOMPRESSED_SIZE_ANNOTATION)
                .and_then(|v| v.parse().ok()),
            start: match (store, &manifest_digest) {
                (Store::Registry { registry, .. }, Some(m))
                    if !registry.start_window().is_zero() =>
                {
                    Some(StartSpec {
                        image: m.to_string(),
                        window: registry.start_window(),
                    })
                }
                _ => None,
            },
        });
    }
    Ok(Image {
        reference: r.clone(),
        manifest: manifest_digest,
        config: Some(config_digest),
        platform: image_platform,
        layers,
    })
}

/// The name of layer `i` (from 0) of the `n` of image `r`, `REF layer 2/3 (sha256:…)`,
/// and `blob` under that name in messages (a slice of itself).
fn layer_named(
    r: &ImageRef,
    i: usize,
    n: usize,
    digest: &Digest,
    blob: Arc<dyn Blob>,
) -> (PathBuf, Arc<dyn Blob>) {
    let name = PathBuf::from(format!(
        "{r} layer {}/{n} ({}:{})",
        i + 1,
        digest.algorithm_name(),
        digest.short()
    ));
    let len = blob.size();
    let blob: Arc<dyn Blob> = match Slice::new(blob.clone(), 0, len, name.clone()) {
        Ok(s) => Arc::new(s),
        Err(_) => blob,
    };
    (name, blob)
}

fn resolve_docker(r: &ImageRef, store: &Store) -> Result<Image> {
    let mblob = store
        .file("manifest.json")?
        .ok_or_else(|| Error::Format("no manifest.json: not a docker archive".into()))?;
    let entries: Vec<DockerEntry> = parse_json(
        &store.json(&*mblob, None, "manifest.json")?,
        "manifest.json",
    )?;
    let entry = match r.reference.as_deref() {
        None if entries.len() == 1 => &entries[0],
        None => {
            return Err(Error::Format(format!(
                "the archive holds {} images: name one with :NAME:TAG or :@N",
                entries.len()
            )));
        }
        Some(at) if at.starts_with('@') => {
            let n: usize = at[1..]
                .parse()
                .map_err(|_| Error::Format(format!("{at:?} is not @N")))?;
            entries.get(n).ok_or_else(|| {
                Error::Format(format!(
                    "the archive holds {} images, not @{n}",
                    entries.len()
                ))
            })?
        }
        Some(tag) => entries
            .iter()
            .find(|e| {
                e.repo_tags.iter().flatten().any(|t| {
                    t == tag
                        || t.strip_prefix("docker.io/library/") == Some(tag)
                        || t.strip_prefix("docker.io/") == Some(tag)
                })
            })
            .ok_or_else(|| Error::Format(format!("no image tagged {tag:?} in the archive")))?,
    };
    if entry.layers.len() > MAX_LAYERS {
        return Err(Error::Format(format!(
            "{} layers: pkgfs mounts at most {MAX_LAYERS}",
            entry.layers.len()
        )));
    }
    let cblob = store
        .file(&entry.config)?
        .ok_or_else(|| Error::Format(format!("config {:?} is missing", entry.config)))?;
    let cbytes = store.json(&*cblob, None, "the config")?;
    // The config is named by its digest (`<hex>.json`, or `blobs/sha256/<hex>`).
    let hex = entry
        .config
        .rsplit('/')
        .next()
        .unwrap_or("")
        .trim_end_matches(".json");
    let config_digest = Digest::parse(&format!("sha256:{hex}")).ok();
    if let Some(d) = &config_digest {
        d.check(&cbytes, "the config")?;
    }
    let config: ConfigJson = parse_json(&cbytes, "the config")?;
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| &r.diff_ids[..])
        .unwrap_or(&[]);
    if diff_ids.len() != entry.layers.len() {
        return Err(Error::Corrupt(format!(
            "the config lists {} layer digests for {} layers",
            diff_ids.len(),
            entry.layers.len()
        )));
    }
    let n = entry.layers.len();
    let mut layers = Vec::with_capacity(n);
    for (i, (path, diff)) in entry.layers.iter().zip(diff_ids).enumerate() {
        let digest = Digest::parse(diff)?;
        let diff_id = Some(digest.clone());
        let blob = store.file(path)?.ok_or_else(|| {
            Error::Format(format!(
                "layer {} ({path:?}) is missing from the archive",
                i + 1
            ))
        })?;
        let (name, blob) = layer_named(r, i, n, &digest, blob);
        layers.push(ImageLayer {
            blob,
            name,
            check: LayerCheck {
                digest,
                of: DigestOf::Tar,
                toc_blob: None,
                toc_json: None,
                ztoc: None,
            },
            media_type: String::new(),
            background_fetch: false,
            start: None,
            diff_id,
            diff_size: None,
        });
    }
    let platform =
        (!config.os.is_empty()).then(|| format!("{}/{}", config.os, config.architecture));
    Ok(Image {
        reference: r.clone(),
        manifest: None,
        config: config_digest,
        platform,
        layers,
    })
}

/// What `pkgfs status` says of an image among the sources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageSummary {
    /// How it was named (`oci:DIR:TAG`…).
    pub reference: String,
    /// The digest of its manifest, if it has one.
    pub manifest: Option<String>,
    /// The digest of its config.
    pub config: Option<String>,
    /// The platform its config names.
    pub platform: Option<String>,
    /// Its layers, bottom first: digest, media type, size in bytes.
    pub layers: Vec<(String, String, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn references_parse_as_skopeo_names_them() {
        let p = |s: &str| ImageRef::parse(OsStr::new(s));
        assert_eq!(
            p("oci:/img:latest"),
            Some(ImageRef {
                transport: Transport::Oci,
                path: "/img".into(),
                reference: Some("latest".into()),
                registry: None,
            })
        );
        assert_eq!(p("oci:img").unwrap().reference, None);
        assert_eq!(
            p("oci-archive:a.tar:v1").unwrap().transport,
            Transport::OciArchive
        );
        let d = p("docker-archive:/x/a.tar:pkgfs/debian:latest").unwrap();
        assert_eq!(
            (d.transport, d.path.as_path(), d.reference.as_deref()),
            (
                Transport::DockerArchive,
                Path::new("/x/a.tar"),
                Some("pkgfs/debian:latest")
            )
        );
        assert_eq!(p("/pkgs"), None);
        assert_eq!(p("ocifoo:/x"), None);
        let r = p("docker://busybox").unwrap();
        assert_eq!(r.transport, Transport::Docker);
        assert_eq!(r.to_string(), "docker://docker.io/library/busybox:latest");
        let bad = p("docker://UPPER/x").unwrap();
        assert!(bad.registry.is_none(), "kept, to fail when resolved");
        assert_eq!(p("docker:/x"), None);
        assert_eq!(d.to_string(), "docker-archive:/x/a.tar:pkgfs/debian:latest");
    }

    #[test]
    fn platforms_parse_and_match() {
        let p = Platform::parse("linux/arm64/v8").unwrap();
        assert_eq!(p.to_string(), "linux/arm64/v8");
        let j = |arch: &str, variant: Option<&str>| PlatformJson {
            os: "linux".into(),
            architecture: arch.into(),
            variant: variant.map(Into::into),
        };
        assert!(p.matches(&j("arm64", Some("v8"))));
        assert!(p.matches(&j("arm64", None)));
        assert!(!p.matches(&j("arm64", Some("v9"))));
        assert!(!p.matches(&j("amd64", None)));
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("/amd64").is_err());
        assert_eq!(Platform::host().os, "linux");
    }
}
