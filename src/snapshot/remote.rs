//! The seam for layers that do not need unpacking (remote, lazily read layers: a later
//! step), and the labels containerd sends for them.
//!
//! When containerd (its CRI plugin, or `ctr`/nerdctl with a remote-snapshotter
//! handler) pulls an image for a snapshotter that may provide layers itself, it calls
//! Prepare for each layer with the label [`TARGET`] set to the name the committed layer
//! will have (its chain ID) and, from CRI, labels naming the image and the layer. If the
//! snapshotter answers `AlreadyExists` and a snapshot of that name now exists, containerd
//! takes the layer as unpacked and neither downloads nor unpacks it.
//!
//! [`LayerSource::provide`] is where a later step plugs in: asked with those labels, it
//! fills (or mounts onto) the new snapshot's empty `fs` directory and says so; the
//! snapshotter then commits it under the target name and answers `AlreadyExists`. The
//! source of step 1, [`Unpacked`], never provides anything: containerd unpacks every
//! layer as it does for its own overlayfs snapshotter. docs/design/snapshotter.md has
//! the plan.

use std::path::Path;

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

/// Something that can provide a layer's contents without containerd unpacking it.
pub trait LayerSource: Send + Sync {
    /// Provide the layer `req` names at `fs` (an empty directory: fill it, or mount over
    /// it). `Ok(false)`: not this one; containerd unpacks it as usual. An error is
    /// logged and treated as `Ok(false)`.
    fn provide(&self, req: &LayerRequest<'_>, fs: &Path) -> Result<bool>;
}

/// Step 1: every layer is unpacked by containerd.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unpacked;

impl LayerSource for Unpacked {
    fn provide(&self, _req: &LayerRequest<'_>, _fs: &Path) -> Result<bool> {
        Ok(false)
    }
}
