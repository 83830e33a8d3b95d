//! A lazily read image layer's start (`io::starts`): the policy around the recorder.
//! Which layers are recorded (read from a registry, lazily, with an index cache and a
//! window), under which key (the layer's digest and its image's manifest digest: each
//! image starts its own program), where (the index cache, `start-*.idx`), when the
//! record is kept (its window over, or the daemon stopping: [`keep_starts`]), and when
//! a record is fetched (once the layer is open: the open's table of contents is what a
//! pull waits for).

use std::sync::Arc;

use crate::format::{self, OpenContext};

use super::image;

/// A lazily read layer's start (`io::starts`): the record of its image's earlier start
/// fetched ahead, or this start recorded.
pub(super) enum Start {
    /// Nothing to do: not read from a registry, no index cache, or no window.
    None,
    /// The record of the image's last start, to be fetched once the layer is open (not
    /// before: the open's own reads, a table of contents, are what a pull waits for).
    Replay {
        blob: Arc<dyn crate::io::blob::Blob>,
        ranges: Vec<(u64, u64)>,
    },
    /// Recording into the index cache under `key` once its window is over.
    Recording {
        recorder: Arc<crate::io::starts::Recorder>,
        blob: Arc<dyn crate::io::blob::Blob>,
        key: format::cache::CacheKey,
        cache: format::cache::IndexCache,
    },
}

impl Start {
    /// Before layer `l` is opened: its image's record, if there is one; otherwise a
    /// recorder.
    pub(super) fn begin(l: &image::ImageLayer, cx: &OpenContext) -> Start {
        use crate::io::starts;
        let (Some(spec), Some(cache)) = (&l.start, cx.index_cache) else {
            return Start::None;
        };
        if !l.blob.round_trips() {
            return Start::None;
        }
        let key = cache.key_for("start", l.blob.version(), &spec.image);
        if let Some(bytes) = cache.load(&key) {
            match starts::decode(&bytes, l.blob.size()) {
                Ok(ranges) => {
                    return Start::Replay {
                        blob: l.blob.clone(),
                        ranges,
                    };
                }
                // Recorded again below.
                Err(e) => log::warn!("{}: {e}; recording it again", l.name.display()),
            }
        }
        let recorder = starts::Recorder::new(spec.window);
        Start::Recording {
            blob: starts::recording(l.blob.clone(), recorder.clone()),
            recorder,
            key,
            cache: cache.clone(),
        }
    }

    /// The blob to open the layer through.
    pub(super) fn blob(&self, l: &image::ImageLayer) -> Arc<dyn crate::io::blob::Blob> {
        match self {
            Start::None | Start::Replay { .. } => l.blob.clone(),
            Start::Recording { blob, .. } => blob.clone(),
        }
    }

    /// The layer is open and read lazily: the start begins. The last start's record is
    /// fetched, in order; or this start's is kept when the window is over (by a thread
    /// that waits for it).
    pub(super) fn arm(&self) {
        let (recorder, key, cache, blob) = match self {
            Start::None => return,
            Start::Replay { blob, ranges } => {
                log::info!(
                    "{}: fetching ahead what its image's last start read ({} ranges, {} bytes)",
                    blob.name().display(),
                    ranges.len(),
                    ranges.iter().map(|(s, e)| e - s).sum::<u64>()
                );
                blob.fetch_in_order(ranges);
                return;
            }
            Start::Recording {
                recorder,
                key,
                cache,
                blob,
            } => (recorder, key, cache, blob),
        };
        recorder.arm();
        let pending = Arc::new(Pending {
            recorder: recorder.clone(),
            key: key.clone(),
            cache: cache.clone(),
            name: blob.name().display().to_string(),
            kept: std::sync::atomic::AtomicBool::new(false),
        });
        crate::sync::lock(&PENDING).push(pending.clone());
        let spawned = std::thread::Builder::new()
            .name("pkgfs-start".into())
            .spawn(move || {
                if let Some(ends) = pending.recorder.ends() {
                    std::thread::sleep(ends.saturating_duration_since(std::time::Instant::now()));
                }
                pending.keep();
            });
        if let Err(e) = spawned {
            log::warn!("{}: its start not recorded: {e}", blob.name().display());
        }
    }
}

/// A start being recorded, kept when its window is over or when the process stops
/// ([`keep_starts`]), whichever comes first.
struct Pending {
    recorder: Arc<crate::io::starts::Recorder>,
    key: format::cache::CacheKey,
    cache: format::cache::IndexCache,
    name: String,
    kept: std::sync::atomic::AtomicBool,
}

/// The starts being recorded in this process.
static PENDING: std::sync::Mutex<Vec<Arc<Pending>>> = std::sync::Mutex::new(Vec::new());

impl Pending {
    /// Store what was recorded (once).
    fn keep(&self) {
        if self.kept.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        crate::sync::lock(&PENDING).retain(|p| !std::ptr::eq(&**p, self));
        let ranges = self.recorder.take();
        if ranges.is_empty() {
            return;
        }
        match self
            .cache
            .store(&self.key, &crate::io::starts::encode(&ranges))
        {
            Ok(()) => log::info!(
                "{}: its start recorded ({} ranges, {} bytes), to be fetched ahead of the next",
                self.name,
                ranges.len(),
                ranges.iter().map(|(s, e)| e - s).sum::<u64>()
            ),
            Err(e) => log::warn!("{}: its start not recorded: {e}", self.name),
        }
    }
}

/// The process stops: every start being recorded is kept as it is so far (a store
/// restarted right after a pull still has the record of the start that followed it).
pub fn keep_starts() {
    let pending: Vec<Arc<Pending>> = crate::sync::lock(&PENDING).clone();
    for p in pending {
        p.keep();
    }
}
