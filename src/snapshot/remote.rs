//! Layers that need no unpacking: the seam ([`LayerSource`]), the labels containerd sends
//! for them, and the source that reads them lazily from registries ([`StoreLayers`]).
//!
//! When containerd (its CRI plugin, or `ctr`/nerdctl with a remote-snapshotter
//! handler) pulls an image for a snapshotter that may provide layers itself, it calls
//! Prepare for each layer with the label [`TARGET`] set to the name the committed layer
//! will have (its chain ID) and, from CRI, labels naming the image and the layer. If the
//! snapshotter answers `AlreadyExists` and a snapshot of that name now exists, containerd
//! takes the layer as unpacked and neither downloads nor unpacks it.
//!
//! [`LayerSource::provide`], asked with those labels, fills (or mounts onto) the new
//! snapshot's empty `fs` directory and says so; the snapshotter then commits it under the
//! target name, with the labels the source gives back, and answers `AlreadyExists`.
//!
//! Two sources: [`Unpacked`] never provides anything (containerd unpacks every layer, as
//! for its own overlayfs snapshotter); [`StoreLayers`] takes each layer from a `pkgfs
//! store` mount (`crate::source::store`: `STORE/BASE64(REF)/DIGEST/diff`, the layer
//! alone, overlay-native, read lazily from its registry) and bind-mounts that `diff` on
//! the snapshot's `fs`. The store is its own daemon with its own keeper, so layers keep
//! reading while the snapshotter restarts. docs/design/snapshotter.md has the plan.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::disk;
use super::meta::{Labels, Result};

/// The committed name the layer will have (set by containerd's unpacker on Prepare).
pub const TARGET: &str = "containerd.io/snapshot.ref";
/// The image reference (CRI).
pub const IMAGE_REF: &str = "containerd.io/snapshot/cri.image-ref";
/// The layer's compressed digest (CRI).
pub const LAYER_DIGEST: &str = "containerd.io/snapshot/cri.layer-digest";
/// The image manifest's digest (CRI).
pub const MANIFEST_DIGEST: &str = "containerd.io/snapshot/cri.manifest-digest";
/// The digests of this layer and those above it, comma-separated, so that a snapshotter
/// can prefetch ahead (CRI; cut to fit in a label).
pub const IMAGE_LAYERS: &str = "containerd.io/snapshot/cri.image-layers";
/// Prefix of the labels stargz-snapshotter puts on layers it provided (`…/stargz.*`):
/// what a lazily read layer carries in its info.
pub const STARGZ_PREFIX: &str = "containerd.io/snapshot/remote/stargz.";
/// The image reference, as stargz-snapshotter's clients (`ctr-remote images rpull`,
/// nerdctl for `--snapshotter stargz`) set it.
pub const STARGZ_REFERENCE: &str = "containerd.io/snapshot/remote/stargz.reference";
/// The layer's digest, as stargz-snapshotter's clients set it.
pub const STARGZ_DIGEST: &str = "containerd.io/snapshot/remote/stargz.digest";
/// Set on every layer a source provided (as stargz-snapshotter sets it): the layer is
/// read from elsewhere, not unpacked here.
pub const REMOTE: &str = "containerd.io/snapshot/remote";
/// The reference a layer [`StoreLayers`] provided was read from (kept so that a restart
/// can mount it again).
pub const PKGFS_REFERENCE: &str = "containerd.io/snapshot/remote/pkgfs.reference";
/// That layer's digest.
pub const PKGFS_DIGEST: &str = "containerd.io/snapshot/remote/pkgfs.digest";
/// Why a layer that containerd's unpacker asked for was not read lazily (kept on the
/// layer for `pkgfs status`).
pub const UNPACKED: &str = "containerd.io/snapshot/pkgfs.unpacked";

/// `text` cut to fit a label value (at most 1,024 bytes, on a character boundary).
pub fn label_value(text: &str) -> String {
    let mut end = text.len().min(1024);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// What a Prepare with a target asks of a [`LayerSource`].
#[derive(Debug, Clone, Copy)]
pub struct LayerRequest<'a> {
    /// The key of the Active snapshot made for the layer.
    pub key: &'a str,
    /// Its parent (the layer below), empty for the bottom layer.
    pub parent: &'a str,
    /// The name the layer is to be committed as ([`TARGET`]).
    pub target: &'a str,
    /// Every label of the request ([`IMAGE_REF`], [`LAYER_DIGEST`]…).
    pub labels: &'a Labels,
}

/// A [`LayerSource`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provided {
    /// The layer is at `fs`: commit it with these labels added.
    Yes(Labels),
    /// Not provided, for this reason (logged; containerd unpacks the layer).
    No(String),
}

/// Something that can provide a layer's contents without containerd unpacking it.
pub trait LayerSource: Send + Sync {
    /// Provide the layer `req` names at `fs` (an empty directory: fill it, or mount over
    /// it). An error is logged and taken as [`Provided::No`]: containerd unpacks it.
    fn provide(&self, req: &LayerRequest<'_>, fs: &Path) -> Result<Provided>;

    /// At start: the committed layer with `labels` (those [`LayerSource::provide`] gave
    /// it among them) has nothing at `fs` (after a reboot, or a mount undone by hand):
    /// put it back. `Ok(false)`: not one of this source's.
    fn restore(&self, _labels: &Labels, _fs: &Path) -> Result<bool> {
        Ok(false)
    }
}

/// Every layer is unpacked by containerd.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unpacked;

impl LayerSource for Unpacked {
    fn provide(&self, _req: &LayerRequest<'_>, _fs: &Path) -> Result<Provided> {
        Ok(Provided::No("no layer store (--store)".into()))
    }
}

/// The image reference and layer digest a Prepare names: CRI's labels first, then
/// stargz-snapshotter's (what `ctr-remote images rpull` sends). `None` for a Prepare
/// without them (a plain `ctr images pull`, an import).
pub fn named_layer(labels: &Labels) -> Option<(&str, &str)> {
    [(IMAGE_REF, LAYER_DIGEST), (STARGZ_REFERENCE, STARGZ_DIGEST)]
        .iter()
        .find_map(|(r, d)| {
            let (r, d) = (labels.get(*r)?, labels.get(*d)?);
            (!r.is_empty() && !d.is_empty()).then_some((r.as_str(), d.as_str()))
        })
}

/// Layers from a `pkgfs store` mounted at a path: the layer `DIGEST` of image `REF` is
/// `STORE/BASE64(REF)/DIGEST/diff`, bind-mounted read-only on the snapshot's `fs`.
#[derive(Debug, Clone)]
pub struct StoreLayers {
    store: PathBuf,
}

impl StoreLayers {
    /// Layers from the store mounted at `store`.
    pub fn new(store: PathBuf) -> StoreLayers {
        StoreLayers { store }
    }

    /// The store's directory of layer `digest` of `reference` (a digest is
    /// `ALGORITHM:HEX`, one plain path component; anything else is refused).
    fn layer_dir(&self, reference: &str, digest: &str) -> Option<PathBuf> {
        let (algo, hex) = digest.split_once(':')?;
        let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
        if !plain(algo) || !plain(hex) || reference.is_empty() || reference.len() > 4096 {
            return None;
        }
        let enc = base64::engine::general_purpose::STANDARD.encode(reference);
        Some(self.store.join(enc).join(digest))
    }

    /// Bind the store's `diff` of (`reference`, `digest`) on `fs`, once the store has
    /// shown it: the lookup resolves the image and the layer, and the first entry read
    /// indexes it (a table of contents, a SOCI zTOC, or one pass), so a layer the store
    /// cannot serve is found here, while containerd can still unpack it.
    fn bind(&self, reference: &str, digest: &str, fs: &Path) -> std::result::Result<(), String> {
        let dir = self
            .layer_dir(reference, digest)
            .ok_or_else(|| format!("{reference} {digest}: not a reference and a digest"))?;
        let diff = dir.join("diff");
        // The store's reason (access refused, a format it cannot read) is in its log:
        // a lookup only returns an errno.
        let cannot = |e: std::io::Error| {
            format!(
                "the store at {} cannot serve layer {digest} of {reference} ({e}; its log says why)",
                self.store.display()
            )
        };
        let entries = std::fs::read_dir(&diff).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => format!(
                "the store at {} has no layer {digest} of {reference} (see its log)",
                self.store.display()
            ),
            Some(libc::ENOTCONN) => format!("the store at {} is not served", self.store.display()),
            _ => cannot(e),
        })?;
        // An empty layer reads as empty; an error is a layer the store cannot serve.
        if let Some(Err(e)) = entries.into_iter().next() {
            return Err(cannot(e));
        }
        disk::bind_read_only(&diff, fs).map_err(|e| e.to_string())
    }
}

impl LayerSource for StoreLayers {
    fn provide(&self, req: &LayerRequest<'_>, fs: &Path) -> Result<Provided> {
        let Some((reference, digest)) = named_layer(req.labels) else {
            return Ok(Provided::No(
                "the pull named no image and layer (labels of CRI or of stargz's clients)".into(),
            ));
        };
        if let Err(why) = self.bind(reference, digest, fs) {
            return Ok(Provided::No(why));
        }
        let labels = Labels::from([
            (REMOTE.to_string(), "remote snapshot".to_string()),
            (PKGFS_REFERENCE.to_string(), reference.to_string()),
            (PKGFS_DIGEST.to_string(), digest.to_string()),
        ]);
        Ok(Provided::Yes(labels))
    }

    fn restore(&self, labels: &Labels, fs: &Path) -> Result<bool> {
        let (Some(reference), Some(digest)) =
            (labels.get(PKGFS_REFERENCE), labels.get(PKGFS_DIGEST))
        else {
            return Ok(false);
        };
        self.bind(reference, digest, fs)
            .map_err(super::meta::Error::InvalidArgument)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_named_by_cri_labels_or_by_stargz_clients_labels() {
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(named_layer(&l(&[(TARGET, "sha256:1")])), None);
        let cri = l(&[(IMAGE_REF, "r/a:1"), (LAYER_DIGEST, "sha256:aa")]);
        assert_eq!(named_layer(&cri), Some(("r/a:1", "sha256:aa")));
        let stargz = l(&[(STARGZ_REFERENCE, "r/b:2"), (STARGZ_DIGEST, "sha256:bb")]);
        assert_eq!(named_layer(&stargz), Some(("r/b:2", "sha256:bb")));
        // Both: CRI's; half of one family and an empty value are not a name.
        let mut both = cri.clone();
        both.extend(stargz);
        assert_eq!(named_layer(&both), Some(("r/a:1", "sha256:aa")));
        assert_eq!(named_layer(&l(&[(IMAGE_REF, "r/a:1")])), None);
        assert_eq!(
            named_layer(&l(&[(IMAGE_REF, ""), (LAYER_DIGEST, "sha256:aa")])),
            None
        );
    }

    #[test]
    fn a_digest_must_be_one_plain_component() {
        let s = StoreLayers::new(PathBuf::from("/store"));
        let dir = s
            .layer_dir("127.0.0.1:5000/deb:latest", "sha256:0a1b")
            .unwrap();
        assert_eq!(
            dir,
            Path::new("/store/MTI3LjAuMC4xOjUwMDAvZGViOmxhdGVzdA==/sha256:0a1b")
        );
        for bad in [
            "sha256:../x",
            "../../etc",
            "sha256:",
            ":ab",
            "sha256:a/b",
            "sha256:a\0",
        ] {
            assert_eq!(s.layer_dir("r", bad), None, "{bad}");
        }
        assert_eq!(s.layer_dir("", "sha256:ab"), None);
    }
}
