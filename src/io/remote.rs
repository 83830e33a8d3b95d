//! Objects on an S3-compatible store or an HTTP(S) server, as [`Blob`]s.
//!
//! The protocols are the `object_store` crate's (request signing, credentials, retries
//! with backoff on 5xx and resets, connect and request timeouts); this module adds what
//! a filesystem needs on top:
//!
//! - **One version.** An object is opened with the ETag (and size) its listing gave, and
//!   every range is asked for with `If-Match: ETAG`: an object replaced on the server
//!   fails the read (`EIO`) instead of mixing bytes of two versions; the next listing
//!   makes it a replaced package.
//! - **A bounded wait.** Every read is given at most [`RemoteConfig::read_timeout`],
//!   retries included; then it fails with `EIO`. A read never hangs on a dead server.
//! - **Read-ahead.** A read that starts where the last one of the object ended is
//!   sequential: the fetch grows (doubling up to [`MAX_READ_AHEAD`]) and what is fetched
//!   beyond the read is kept for the next one (in memory: [`KEPT_BYTES`] over all
//!   objects, least recently fetched first out). Other reads
//!   fetch just their range, 4 KiB aligned, so a mount fetches about what the indexes
//!   are.
//!
//! - **A disk cache.** With one ([`DiskCache`]), reads look there before they fetch and
//!   keep what they fetched, keyed by the object's version: a remount reads the indexes
//!   from disk, and cached bytes serve while the server is down.
//!
//! The requests run on a small tokio runtime owned by [`Remote`]; callers (FUSE workers,
//! indexing threads) block on them. Every HTTP request goes through one counting
//! connector, so `pkgfs status` shows the requests sent, including the retries.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService,
};
use object_store::{GetOptions, GetRange, ObjectStore};

use super::blob::Blob;
use super::diskcache::DiskCache;
use crate::error::{Error, Result};

/// Largest fetch a sequential reader grows to.
pub const MAX_READ_AHEAD: u64 = 8 << 20;
/// ... for a zTOC layer's blob read sparingly ([`Blob::fetch_sparingly`]). Measured on
/// a zstd:chunked image 40 ms away (docs/BENCHMARKS.md), before its chunks were read
/// ahead by file: python's first output after 11.5 s and 6.8 % of the layers fetched
/// with no read-ahead, 3.8 s and 12 % at 256 KiB, 2.6 s and 19 % at 1 MiB, 2.3 s and
/// 51 % at 8 MiB: a read-ahead by offset runs into the files next in the layer.
pub const SPARING_READ_AHEAD: u64 = 1 << 20;
/// Background fetches in flight at most (all objects).
const PREFETCHES: usize = 64;
/// Pieces a whole blob is fetched in behind reads ([`Blob::fetch_in_background`]): a
/// read that arrives while one is on the wire waits for at most this much of it (42 ms
/// at 100 Mbit/s).
const BACKGROUND_PIECE: u64 = 512 << 10;
/// Such pieces in flight at first and at least (all objects): 1 MiB, what a 100 Mbit/s
/// path of 80 ms round trip holds, so the background fetch still fills the link between
/// reads. The window grows from here while pieces cross in no more than a round trip
/// ([`Pacer`]).
const BACKGROUND_FLIGHTS: usize = 2;
/// The background window at most: 32 MiB a round trip (800 MB/s at 40 ms).
const BACKGROUND_MAX_FLIGHTS: usize = 64;
/// A start's record fetched ahead ([`Blob::fetch_in_order`]): requests in flight at
/// most, their bytes at most, and the largest. A megabyte is what a 100 Mbit/s path of
/// 80 ms round trip holds: the link is full, and a read the record does not hold (or a
/// layer being opened, during a pull) waits behind 80 ms of it at most. Sixteen small
/// reads (python's start reads files of a few KB) fill a round trip.
const ORDERED_FLIGHTS: usize = 16;
const ORDERED_BYTES: u64 = 1 << 20;
const ORDERED_PIECE: u64 = 256 << 10;
/// Bytes of fetched extents kept in memory, over all objects of a runtime: what readers
/// fetched beyond their read and what the walk's read-ahead fetched, until it is read.
/// Without a disk cache it is the only place such bytes wait; kept by count (the last
/// eight extents of each object), a read-all over HTTP of the 609 packages without a
/// disk cache did not end in 300 s: the read-ahead's extents were dropped unread.
pub const KEPT_BYTES: u64 = 64 << 20;
/// Without a disk cache, the walk's read-ahead of one object under way at once: a
/// quarter of [`KEPT_BYTES`], so what it fetches is not dropped before it is read. As
/// much again of its advice waits its turn ([`Kept::deferred`]) and starts as fetches
/// land; advice past that is dropped (readers fetch it themselves).
const READ_AHEAD_SHARE: u64 = KEPT_BYTES / 4;
/// Fetches are aligned to this.
const ALIGN: u64 = 4096;

/// Timeouts and retries of remote reads.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Longest a read waits, retries included, before it fails with `EIO`.
    pub read_timeout: Duration,
    /// Longest a connection takes to open.
    pub connect_timeout: Duration,
    /// Retries of a failed request (5xx, reset, timeout).
    pub retries: usize,
    /// The disk cache: its directory and byte budget (None: none).
    pub disk_cache: Option<(PathBuf, u64)>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            read_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retries: 5,
            disk_cache: None,
        }
    }
}

/// Counters of remote reads, for `pkgfs status`.
#[derive(Debug, Default)]
pub struct RemoteStats {
    /// HTTP requests sent (ranges, listings, HEADs), retries included.
    pub requests: AtomicU64,
    /// Requests that failed (5xx, reset, timeout): each is retried or ends in an error.
    pub failed_requests: AtomicU64,
    /// Range reads (fetches), each one or more requests.
    pub fetches: AtomicU64,
    /// Bytes of objects received.
    pub bytes: AtomicU64,
    /// Reads served from what an earlier fetch kept in memory.
    pub kept_hits: AtomicU64,
    /// Reads and listings that failed (after their retries, or out of time).
    pub errors: AtomicU64,
    /// Fetches started ahead of readers, from read-ahead advice.
    pub prefetches: AtomicU64,
    /// Requests that fetched several ranges at once (`multipart/byteranges`).
    pub multi_range: AtomicU64,
}

impl RemoteStats {
    /// Failed requests that were tried again.
    pub fn retries(&self) -> u64 {
        self.failed_requests
            .load(Relaxed)
            .saturating_sub(self.errors.load(Relaxed))
    }
}

/// The HTTP client of every store: reqwest (rustls), each request counted.
#[derive(Debug, Clone)]
struct Counted {
    client: Arc<LazyClient>,
    stats: Arc<RemoteStats>,
}

/// A reqwest client made on first use: making one loads and parses the system's root
/// certificates (12 ms of a 0.2 s warm mount that sends no request at all).
pub struct LazyClient {
    made: std::sync::OnceLock<std::result::Result<reqwest::Client, String>>,
    make: MakeClient,
}

/// How a [`LazyClient`] is made.
type MakeClient = Box<dyn Fn() -> std::result::Result<reqwest::Client, String> + Send + Sync>;

impl std::fmt::Debug for LazyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.made.get() {
            None => "LazyClient(not made)",
            Some(Ok(_)) => "LazyClient(made)",
            Some(Err(_)) => "LazyClient(failed)",
        })
    }
}

impl LazyClient {
    /// A client `make` makes when it is first asked for (its error, a message).
    pub fn new(
        make: impl Fn() -> std::result::Result<reqwest::Client, String> + Send + Sync + 'static,
    ) -> Self {
        LazyClient {
            made: std::sync::OnceLock::new(),
            make: Box::new(make),
        }
    }

    /// The client (made now if it was not); why not, if it cannot be made.
    pub fn get(&self) -> std::result::Result<&reqwest::Client, &str> {
        self.made
            .get_or_init(|| (self.make)())
            .as_ref()
            .map_err(String::as_str)
    }
}

#[async_trait::async_trait]
impl HttpService for Counted {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        self.stats.requests.fetch_add(1, Relaxed);
        let client = match self.client.get() {
            Ok(c) => c,
            Err(e) => {
                self.stats.failed_requests.fetch_add(1, Relaxed);
                return Err(HttpError::new(
                    object_store::client::HttpErrorKind::Unknown,
                    std::io::Error::other(e.to_string()),
                ));
            }
        };
        let what = log::log_enabled!(log::Level::Trace).then(|| {
            let range = req
                .headers()
                .get("range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            (
                req.method().clone(),
                req.uri().clone(),
                range,
                std::time::Instant::now(),
            )
        });
        let r = client.call(req).await;
        if let Some((method, uri, range, t0)) = what {
            let status = r.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
            log::trace!("{method} {uri} {range}: {status} in {:?}", t0.elapsed());
        }
        if r.as_ref().map_or(true, |r| r.status().is_server_error()) {
            self.stats.failed_requests.fetch_add(1, Relaxed);
        }
        r
    }
}

impl HttpConnector for Counted {
    fn connect(&self, _: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(self.clone()))
    }
}

/// The runtime and settings remote objects share.
#[derive(Debug)]
pub struct Remote {
    rt: tokio::runtime::Runtime,
    client: Counted,
    /// Settings.
    pub config: RemoteConfig,
    /// Counters.
    pub stats: Arc<RemoteStats>,
    /// The disk cache, if there is one.
    pub disk: Option<Arc<DiskCache>>,
    /// Background fetches (read-ahead advice) in flight at most.
    prefetch: Arc<tokio::sync::Semaphore>,
    /// Pieces of whole-blob background fetches in flight at most, paced by how long
    /// pieces take.
    background: Arc<Pacer>,
    /// Reads waiting for the source now: whole-blob background fetches wait for none.
    foreground: Arc<Foreground>,
    /// The memory budget of kept extents, all objects.
    kept_budget: Arc<KeptBudget>,
}

/// The window of whole-blob background fetches: how many pieces may be on the wire at
/// once, over all blobs, paced by the time pieces take (delay-based, as LEDBAT paces
/// background transfers).
///
/// Why: a window fixed for a node's 100 Mbit/s link (two 512 KiB pieces) keeps reads from
/// queueing behind a layer there, but caps a fast link at 1 MiB a round trip: at 40 ms
/// with no bandwidth limit a cold zstd:chunked mount started python in 1.6 s instead of
/// 0.78 s (docs/BENCHMARKS.md). The time a piece takes tells which link this is: as long
/// as pieces take about the quickest piece's time (a round trip and the piece's own
/// transfer), the link has room, and the window grows by one; once a piece takes more
/// than twice that, pieces queue on the link (which reads would queue behind too), and
/// the window gives back one place, never below [`BACKGROUND_FLIGHTS`].
#[derive(Debug)]
struct Pacer {
    slots: Arc<tokio::sync::Semaphore>,
    state: Mutex<PacerState>,
}

#[derive(Debug)]
struct PacerState {
    /// The quickest piece yet (of those that moved a whole piece).
    quickest: Option<Duration>,
    /// Places in the window now.
    window: usize,
}

impl Pacer {
    fn new() -> Pacer {
        Pacer {
            slots: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_FLIGHTS)),
            state: Mutex::new(PacerState {
                quickest: None,
                window: BACKGROUND_FLIGHTS,
            }),
        }
    }

    /// A place in the window.
    async fn place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }

    /// A piece that held `permit` ended after `took`; `whole`: it moved a whole piece
    /// (a piece mostly held or under way already says nothing of the link).
    fn ended(&self, permit: tokio::sync::OwnedSemaphorePermit, took: Duration, whole: bool) {
        let mut st = crate::sync::lock(&self.state);
        if !whole {
            return;
        }
        let quickest = st.quickest.map_or(took, |q| q.min(took));
        st.quickest = Some(quickest);
        if took <= quickest.mul_f32(1.5) && st.window < BACKGROUND_MAX_FLIGHTS {
            st.window += 1;
            self.slots.add_permits(1);
        } else if took > quickest * 2 && st.window > BACKGROUND_FLIGHTS {
            st.window -= 1;
            permit.forget();
        }
    }

    /// Places in the window now.
    #[cfg(test)]
    fn window(&self) -> usize {
        crate::sync::lock(&self.state).window
    }
}

/// Reads waiting for the source, so that background fetches can keep out of their way.
#[derive(Debug, Default)]
struct Foreground {
    waiting: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One read waiting for the source, until dropped.
struct Waiting<'a>(&'a Foreground);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Relaxed) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Foreground {
    fn enter(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Relaxed);
        Waiting(self)
    }

    /// Until no read waits for the source.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check: a read that ends in between still wakes it.
            notified.as_mut().enable();
            if self.waiting.load(Relaxed) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Remote {
    /// A runtime of two worker threads (`pkgfs-net`), the client, the disk cache.
    pub fn new(config: RemoteConfig) -> Result<Arc<Remote>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pkgfs-net")
            .enable_all()
            .build()?;
        // One attempt may take a third of the bound: a stalled connection is retried
        // in time.
        let (connect, timeout) = (config.connect_timeout, config.read_timeout / 3);
        let client = Arc::new(LazyClient::new(move || {
            reqwest::Client::builder()
                .connect_timeout(connect)
                .timeout(timeout)
                .build()
                .map_err(|e| format!("HTTP client: {}", describe(&e)))
        }));
        let stats = Arc::new(RemoteStats::default());
        let disk = match &config.disk_cache {
            Some((dir, budget)) => Some(DiskCache::open(dir, *budget).map_err(|e| {
                Error::Io(std::io::Error::other(format!(
                    "disk cache {}: {e}",
                    dir.display()
                )))
            })?),
            None => None,
        };
        Ok(Arc::new(Remote {
            rt,
            client: Counted {
                client,
                stats: stats.clone(),
            },
            config,
            stats,
            disk,
            prefetch: Arc::new(tokio::sync::Semaphore::new(PREFETCHES)),
            background: Arc::new(Pacer::new()),
            foreground: Arc::new(Foreground::default()),
            kept_budget: Arc::new(KeptBudget::new(KEPT_BYTES)),
        }))
    }

    /// The counting connector, for the stores' builders.
    pub fn connector(&self) -> impl HttpConnector + use<> {
        self.client.clone()
    }

    /// A GET of `url` through the counting client: the body, at most `limit` bytes.
    /// Resets, timeouts and 5xx answers are retried with backoff, as the stores do.
    pub async fn get_page(&self, url: &str, limit: usize) -> Result<Vec<u8>> {
        use futures::StreamExt;
        let io = |e: reqwest::Error| io_msg(url, &describe(&e));
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        let r = loop {
            self.stats.requests.fetch_add(1, Relaxed);
            let client = self.client.client.get().map_err(|e| io_msg(url, e))?;
            let failed = match client.get(url).send().await {
                Ok(r) if !r.status().is_server_error() => break r,
                Ok(r) => Error::Io(std::io::Error::other(format!("{url}: {}", r.status()))),
                Err(e) => io(e),
            };
            self.stats.failed_requests.fetch_add(1, Relaxed);
            attempt += 1;
            if attempt > self.config.retries {
                return Err(failed);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        };
        let r = r.error_for_status().map_err(io)?;
        let mut body = Vec::new();
        let mut stream = r.bytes_stream();
        while let Some(chunk) = stream.next().await {
            body.extend_from_slice(&chunk.map_err(io)?);
            if body.len() > limit {
                return Err(Error::Format(format!("{url}: index page too large")));
            }
        }
        Ok(body)
    }

    /// Run `f` on the runtime and wait for it, at most the read timeout.
    pub fn run<T>(&self, what: &str, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let limit = self.config.read_timeout;
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(limit, f).await });
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.stats.errors.fetch_add(1, Relaxed);
                Err(e)
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Relaxed);
                Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {} s", limit.as_secs()),
                )))
            }
        }
    }

    /// Client options and retry settings for the stores.
    pub fn client_options(&self) -> (object_store::ClientOptions, object_store::RetryConfig) {
        let opts = object_store::ClientOptions::new()
            .with_allow_http(true)
            .with_connect_timeout(self.config.connect_timeout)
            .with_timeout(self.config.read_timeout);
        let retry = object_store::RetryConfig {
            max_retries: self.config.retries,
            retry_timeout: self.config.read_timeout,
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
        };
        (opts, retry)
    }
}

/// An I/O error about `url`.
fn io_msg(url: &str, msg: &str) -> Error {
    Error::Io(std::io::Error::other(format!("{url}: {msg}")))
}

/// An error of the store as the crate's own: a missing object is `Format` (the listing
/// is stale), a changed one (`If-Match` failed) is `Corrupt`, the rest `Io`.
pub fn store_error(what: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::Format(format!("{what}: not found")),
        object_store::Error::Precondition { .. } => {
            Error::Corrupt(format!("{what} changed on the server since it was listed"))
        }
        e => Error::Io(std::io::Error::other(format!("{what}: {}", describe(&e)))),
    }
}

/// An error and its causes, `outer: inner: innermost` (reqwest's and hyper's messages
/// keep the useful part, "Connection refused", in their sources).
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Where a [`RemoteBlob`]'s bytes come from: an object of a store
/// ([`ObjectRanges`]), a blob of a container registry (`io::registry`). The blob adds
/// what every source shares (the bounded wait, read-ahead, kept extents, the disk
/// cache); a source answers ranges.
pub trait Ranges: Send + Sync + std::fmt::Debug {
    /// The bytes `start..end`, exactly (a short answer is an error of the caller's).
    fn get(
        &self,
        start: u64,
        end: u64,
    ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>>;

    /// Several ranges (sorted, apart): by default one request each, concurrently; a
    /// source whose servers take several ranges in one request may do that instead.
    fn get_many(
        &self,
        ranges: &[(u64, u64)],
    ) -> futures::future::BoxFuture<'static, Result<Vec<bytes::Bytes>>> {
        let jobs: Vec<_> = ranges.iter().map(|&(s, e)| self.get(s, e)).collect();
        Box::pin(futures::future::try_join_all(jobs))
    }
}

/// An object of an `object_store` store, one version of it: every range asked for with
/// `If-Match: ETAG` (or `If-Unmodified-Since` where the server gives no ETag).
#[derive(Debug)]
pub struct ObjectRanges {
    name: String,
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    etag: Option<String>,
    modified: chrono::DateTime<chrono::Utc>,
}

impl Ranges for ObjectRanges {
    fn get(
        &self,
        start: u64,
        end: u64,
    ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
        let opts = GetOptions {
            if_match: self.etag.clone(),
            if_unmodified_since: self.etag.is_none().then_some(self.modified),
            range: Some(GetRange::Bounded(start..end)),
            ..GetOptions::default()
        };
        let (store, path, what) = (self.store.clone(), self.path.clone(), self.name.clone());
        Box::pin(async move {
            let r = store
                .get_opts(&path, opts)
                .await
                .map_err(|e| store_error(&what, e))?;
            r.bytes().await.map_err(|e| store_error(&what, e))
        })
    }
}

/// One version of an object of a store (S3, HTTP) as its listing gave it: what opens that
/// version again in another process (a next server, for a file still open in a package
/// that has been replaced since: `crate::keeper`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectVersion {
    /// Its URL (`s3://BUCKET/KEY`, `http(s)://…`), as the listing named it.
    pub url: String,
    /// Its ETag, if the server gave one.
    pub etag: Option<String>,
    /// Its size.
    pub size: u64,
    /// Its modification time: seconds since the epoch, and nanoseconds.
    pub modified: (i64, u32),
}

/// One version of an object.
#[derive(Debug)]
pub struct RemoteBlob {
    name: PathBuf,
    source: Arc<dyn Ranges>,
    size: u64,
    modified: i64,
    /// Bytes fetched from the server for this blob (read-ahead included).
    fetched: Arc<AtomicU64>,
    /// Largest fetch sequential reads grow to.
    read_ahead: AtomicU64,
    version: String,
    /// Its key in the disk cache.
    disk_key: String,
    remote: Arc<Remote>,
    /// Recently fetched extents, the read-ahead state and the fetches in flight: shared
    /// with background fetches ([`Blob::will_need`]).
    kept: Arc<Mutex<Kept>>,
    /// What may be kept of fetched bytes ([`Blob::set_keep_gate`]); all when unset.
    gate: GateCell,
    /// The object version, for one of a store's objects.
    object: Option<ObjectVersion>,
}

/// A [`crate::io::blob::KeepGate`], set once.
#[derive(Default)]
struct GateCell(std::sync::OnceLock<crate::io::blob::KeepGate>);

impl std::fmt::Debug for GateCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "gated"
        } else {
            "ungated"
        })
    }
}

/// The prefix of `bytes` (fetched at `start`) that `gate` lets be kept.
fn keepable(
    gate: Option<&crate::io::blob::KeepGate>,
    start: u64,
    bytes: &bytes::Bytes,
    can_wait: bool,
) -> bytes::Bytes {
    match gate {
        None => bytes.clone(),
        Some(g) => bytes.slice(..g(start, bytes, can_wait).min(bytes.len())),
    }
}

/// What a [`RemoteBlob`] keeps in memory.
#[derive(Debug)]
struct Kept {
    /// Fetched extents by offset; their bytes counted in `budget`.
    extents: std::collections::BTreeMap<u64, bytes::Bytes>,
    /// The next fetch size of a sequential reader.
    next: u64,
    /// Background fetches under way: (start, end, done).
    flights: Vec<(u64, u64, Arc<Flight>)>,
    /// Read-ahead advised past the share under way (no disk cache), in the order
    /// advised, at most [`READ_AHEAD_SHARE`] of it: started as fetches land.
    deferred: std::collections::VecDeque<(u64, u64)>,
    budget: Arc<KeptBudget>,
}

/// Extents that start up to this far before an offset are looked at for it (a fetch
/// is rarely larger: reads ahead grow to [`MAX_READ_AHEAD`]); one that starts earlier
/// is not found, and its bytes are fetched again.
const LOOK_BACK: u64 = 8 * MAX_READ_AHEAD;

/// Kept extents in the order kept: (whose, start, length).
type KeptQueue = std::collections::VecDeque<(std::sync::Weak<Mutex<Kept>>, u64, u64)>;

/// The memory budget of the extents all the [`RemoteBlob`]s of a runtime keep: the
/// oldest kept go first once their bytes pass it.
#[derive(Debug)]
struct KeptBudget {
    /// (whose, start, length) in the order kept, and the bytes held.
    state: Mutex<(KeptQueue, u64)>,
    limit: u64,
}

impl KeptBudget {
    fn new(limit: u64) -> KeptBudget {
        KeptBudget {
            state: Mutex::new((std::collections::VecDeque::new(), 0)),
            limit,
        }
    }

    /// Keep `bytes` at `start` in `kept`, and drop the oldest extents (any object's)
    /// while the bytes kept pass the limit.
    fn keep(&self, kept: &Arc<Mutex<Kept>>, start: u64, bytes: bytes::Bytes) {
        let len = bytes.len() as u64;
        let replaced = crate::sync::lock(kept)
            .extents
            .insert(start, bytes)
            .map_or(0, |b| b.len() as u64);
        // Objects upgraded here are released after the lock: the last reference to
        // one drops its `Kept`, which takes this lock to give its bytes back.
        let mut held = Vec::new();
        let mut st = crate::sync::lock(&self.state);
        let (queue, total) = &mut *st;
        *total = (*total + len).saturating_sub(replaced);
        queue.push_back((Arc::downgrade(kept), start, len));
        while *total > self.limit {
            let Some((whose, s, l)) = queue.pop_front() else {
                break;
            };
            let Some(k) = whose.upgrade() else { continue };
            {
                let mut k = crate::sync::lock(&k);
                if k.extents.get(&s).is_some_and(|b| b.len() as u64 == l) {
                    k.extents.remove(&s);
                    *total = total.saturating_sub(l);
                }
            }
            held.push(k);
        }
        drop(st);
        drop(held);
    }

    /// `n` bytes are no longer kept.
    fn release(&self, n: u64) {
        let mut st = crate::sync::lock(&self.state);
        st.1 = st.1.saturating_sub(n);
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.budget
            .release(self.extents.values().map(|b| b.len() as u64).sum());
    }
}

impl Kept {
    fn new(budget: Arc<KeptBudget>) -> Kept {
        Kept {
            extents: std::collections::BTreeMap::new(),
            next: 0,
            flights: Vec::new(),
            deferred: std::collections::VecDeque::new(),
            budget,
        }
    }

    /// Bytes of the fetches under way (readers' and read-ahead's).
    fn flying(&self) -> u64 {
        self.flights.iter().map(|(s, e, _)| e - s).sum()
    }

    /// Register fetches of what of `[a, b)` is neither held nor under way: the ranges
    /// to fetch, each with its flight (readers of it wait for it).
    fn register(&mut self, a: u64, b: u64) -> Vec<(u64, u64, Arc<Flight>)> {
        let covered = self
            .extents
            .range(a.saturating_sub(LOOK_BACK)..b)
            .map(|(s, bytes)| (*s, s + bytes.len() as u64))
            .chain(self.flights.iter().map(|(s, e, _)| (*s, *e)))
            .collect();
        uncovered(covered, a, b)
            .into_iter()
            .map(|(s, e)| {
                let f = Arc::new(Flight::default());
                self.flights.push((s, e, f.clone()));
                (s, e, f)
            })
            .collect()
    }

    /// The read-ahead of `pieces` (each at most [`MAX_READ_AHEAD`]) without a disk
    /// cache: what fits the share under way ([`READ_AHEAD_SHARE`]) is registered and
    /// returned to be fetched, the next share waits in `deferred`, the rest is dropped.
    fn plan_read_ahead(&mut self, pieces: &[(u64, u64)]) -> Vec<(u64, u64, Arc<Flight>)> {
        let mut start = Vec::new();
        for &(a, b) in pieces {
            let waiting: u64 = self.deferred.iter().map(|(s, e)| e - s).sum();
            if waiting == 0 && self.flying() + (b - a) <= READ_AHEAD_SHARE {
                start.extend(self.register(a, b));
            } else if waiting + (b - a) <= READ_AHEAD_SHARE {
                self.deferred.push_back((a, b));
            } else {
                break;
            }
        }
        start
    }

    /// The deferred read-ahead that fits the share under way now, registered, to be
    /// fetched (called as fetches land).
    fn start_deferred(&mut self) -> Vec<(u64, u64, Arc<Flight>)> {
        let mut start = Vec::new();
        while let Some(&(a, b)) = self.deferred.front() {
            if self.flying() + (b - a) > READ_AHEAD_SHARE {
                break;
            }
            self.deferred.pop_front();
            start.extend(self.register(a, b));
        }
        start
    }

    /// The extents that may hold bytes at `offset` and after: the eight that start
    /// nearest before it (extents seldom overlap; one missed is fetched again).
    fn before(&self, offset: u64) -> impl Iterator<Item = (&u64, &bytes::Bytes)> {
        self.extents
            .range(offset.saturating_sub(LOOK_BACK)..=offset)
            .rev()
            .take(8)
    }

    /// Forget every extent.
    fn clear(&mut self) {
        self.budget
            .release(self.extents.values().map(|b| b.len() as u64).sum());
        self.extents.clear();
    }
}

/// The parts of `[a, b)` outside the `covered` ranges, in order; slivers under
/// [`ALIGN`] between covered parts are left out (a reader that needs one fetches it).
fn uncovered(mut covered: Vec<(u64, u64)>, a: u64, b: u64) -> Vec<(u64, u64)> {
    covered.retain(|&(s, e)| s < b && a < e);
    covered.sort_unstable();
    let mut gaps = Vec::new();
    let mut pos = a;
    for (s, e) in covered {
        if s > pos {
            gaps.push((pos, s));
        }
        pos = pos.max(e);
    }
    if pos < b {
        gaps.push((pos, b));
    }
    if gaps != [(a, b)] {
        gaps.retain(|(s, e)| e - s >= ALIGN);
    }
    gaps
}

/// A background fetch: readers of its range wait for it rather than fetch it again.
#[derive(Debug, Default)]
struct Flight {
    done: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Flight {
    fn finish(&self) {
        *crate::sync::lock(&self.done) = true;
        self.cv.notify_all();
    }

    /// Wait until it is done, at most `limit`.
    fn wait(&self, limit: Duration) {
        let g = crate::sync::lock(&self.done);
        let _ = self
            .cv
            .wait_timeout_while(g, limit, |done| !*done)
            .map_err(|e| e.into_inner());
    }
}

/// The fetches under way that a read of `[a, b)` can wait for instead of fetching: those
/// it overlaps, when they and the extents held cover all of it (a read that straddles
/// the end of one background fetch and the start of the next, as a zTOC span's check
/// does, waits for both); none when some of it is neither held nor under way.
fn flights_covering(k: &Kept, a: u64, b: u64) -> Vec<Arc<Flight>> {
    let flying: Vec<&(u64, u64, Arc<Flight>)> = k
        .flights
        .iter()
        .filter(|(s, e, _)| *s < b && a < *e)
        .collect();
    if flying.is_empty() {
        return Vec::new();
    }
    let mut covered: Vec<(u64, u64)> = k
        .extents
        .range(a.saturating_sub(LOOK_BACK)..b)
        .map(|(s, bytes)| (*s, s + bytes.len() as u64))
        .chain(flying.iter().map(|(s, e, _)| (*s, *e)))
        .collect();
    covered.sort_unstable();
    let mut pos = a;
    for (s, e) in covered {
        if s > pos {
            break;
        }
        pos = pos.max(e);
    }
    if pos < b {
        return Vec::new();
    }
    flying.into_iter().map(|(_, _, f)| f.clone()).collect()
}

/// [`Kept::register`] under its lock.
fn register_flights(kept: &Mutex<Kept>, a: u64, b: u64) -> Vec<(u64, u64, Arc<Flight>)> {
    crate::sync::lock(kept).register(a, b)
}

/// A blob's parts a background fetch works with on the runtime.
#[derive(Clone)]
struct Prefetcher {
    source: Arc<dyn Ranges>,
    remote: Arc<Remote>,
    kept: Arc<Mutex<Kept>>,
    disk_key: String,
    fetched: Arc<AtomicU64>,
    name: String,
    gate: Option<crate::io::blob::KeepGate>,
}

impl Prefetcher {
    /// Fetch `[a, b)` (registered as `flight`) into memory and the disk cache; then the
    /// flight ends, whatever happened.
    async fn fetch(&self, a: u64, b: u64, flight: Arc<Flight>) {
        let remote = &self.remote;
        remote.stats.prefetches.fetch_add(1, Relaxed);
        let job = RemoteBlob::fetch(self.source.clone(), a, b, self.name.clone());
        match tokio::time::timeout(remote.config.read_timeout, job).await {
            Ok(Ok(bytes)) => {
                remote.stats.fetches.fetch_add(1, Relaxed);
                remote.stats.bytes.fetch_add(bytes.len() as u64, Relaxed);
                self.fetched.fetch_add(bytes.len() as u64, Relaxed);
                // On the runtime: a gate may not wait here.
                let bytes = keepable(self.gate.as_ref(), a, &bytes, false);
                if !bytes.is_empty() {
                    if let Some(d) = &remote.disk {
                        // Written by the cache's thread, or here past its budget: off
                        // the runtime's threads then.
                        let (d, key, b) = (d.clone(), self.disk_key.clone(), bytes.clone());
                        let _ = tokio::task::spawn_blocking(move || {
                            d.store_later(&key, a, b);
                        })
                        .await;
                    }
                    remote.kept_budget.keep(&self.kept, a, bytes);
                }
            }
            // A reader that needs these bytes fetches them itself, and reports.
            Ok(Err(e)) => log::debug!("read-ahead of {}: {e}", self.name),
            Err(_) => log::debug!("read-ahead of {}: out of time", self.name),
        }
        let mut k = crate::sync::lock(&self.kept);
        k.flights.retain(|(_, _, f)| !Arc::ptr_eq(f, &flight));
        let next = k.start_deferred();
        drop(k);
        flight.finish();
        for (s, e, f) in next {
            self.spawn_fetch(s, e, f);
        }
    }

    /// Fetch `[a, b)` (registered as `flight`) on the runtime, once one of the
    /// [`PREFETCHES`] is free.
    fn spawn_fetch(&self, a: u64, b: u64, flight: Arc<Flight>) {
        let p = self.clone();
        let sem = self.remote.prefetch.clone();
        self.remote.rt.spawn(async move {
            if let Ok(_permit) = sem.acquire_owned().await {
                p.fetch(a, b, flight).await;
            }
        });
    }

    /// Fetch the `holes` in pieces of [`BACKGROUND_PIECE`], each started only while no
    /// read waits for the source, as many at once (all blobs) as the [`Pacer`]'s window.
    async fn behind_reads(self, holes: Vec<(u64, u64)>) {
        let remote = self.remote.clone();
        for (s, e) in holes {
            let mut a = s;
            while a < e {
                let b = (a + BACKGROUND_PIECE).min(e);
                remote.foreground.idle().await;
                let Some(permit) = remote.background.place().await else {
                    return;
                };
                // The permit may have taken a while: the link must still be free.
                remote.foreground.idle().await;
                let pieces = register_flights(&self.kept, a, b);
                let p = self.clone();
                remote.rt.spawn(async move {
                    let start = std::time::Instant::now();
                    let moved: u64 = pieces.iter().map(|(s, e, _)| e - s).sum();
                    for (s, e, f) in pieces {
                        p.fetch(s, e, f).await;
                    }
                    let whole = moved == BACKGROUND_PIECE;
                    p.remote.background.ended(permit, start.elapsed(), whole);
                });
                a = b;
            }
        }
    }
}

impl RemoteBlob {
    /// The object `path` of `store` as listed: named `name` (its URL) in messages.
    pub fn new(
        name: String,
        store: Arc<dyn ObjectStore>,
        path: object_store::path::Path,
        meta: &object_store::ObjectMeta,
        remote: Arc<Remote>,
    ) -> RemoteBlob {
        let etag = meta.e_tag.clone();
        let version = format!(
            "{name}\0{}\0{}\0{}",
            etag.as_deref().unwrap_or(""),
            meta.size,
            meta.last_modified.timestamp()
        );
        let object = ObjectVersion {
            url: name.clone(),
            etag: etag.clone(),
            size: meta.size,
            modified: (
                meta.last_modified.timestamp(),
                meta.last_modified.timestamp_subsec_nanos(),
            ),
        };
        let source = Arc::new(ObjectRanges {
            name: name.clone(),
            store,
            path,
            etag,
            modified: meta.last_modified,
        });
        RemoteBlob {
            object: Some(object),
            ..RemoteBlob::of(
                name,
                source,
                meta.size,
                version,
                meta.last_modified.timestamp(),
                remote,
            )
        }
    }

    /// A blob of `size` bytes whose ranges `source` answers; `version` names its bytes
    /// (the disk cache's key: a content digest shares one entry among all that name
    /// it), `mtime` is what directories it implies show.
    pub fn of(
        name: String,
        source: Arc<dyn Ranges>,
        size: u64,
        version: String,
        mtime: i64,
        remote: Arc<Remote>,
    ) -> RemoteBlob {
        RemoteBlob {
            name: PathBuf::from(name),
            source,
            size,
            modified: mtime,
            fetched: Arc::default(),
            read_ahead: AtomicU64::new(MAX_READ_AHEAD),
            disk_key: DiskCache::key(&version),
            version,
            kept: Arc::new(Mutex::new(Kept::new(remote.kept_budget.clone()))),
            remote,
            gate: GateCell::default(),
            object: None,
        }
    }

    /// Copy `buf.len()` bytes at `offset` out of kept extents, if they hold them all
    /// (one, or several one after another: a read across the boundary of two fetches
    /// of the read-ahead went to the network, over half the fetches of a read-all
    /// without a disk cache).
    fn copy_kept(&self, buf: &mut [u8], offset: u64) -> bool {
        let k = crate::sync::lock(&self.kept);
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let Some((start, bytes)) = k.before(pos).find(|(s, b)| **s + b.len() as u64 > pos)
            else {
                return false;
            };
            let upto = (start + bytes.len() as u64).min(end);
            buf[(pos - offset) as usize..(upto - offset) as usize]
                .copy_from_slice(&bytes[(pos - start) as usize..(upto - start) as usize]);
            pos = upto;
        }
        true
    }

    /// Served without the network: from a kept extent or the disk cache.
    fn cached(&self, buf: &mut [u8], offset: u64) -> bool {
        if self.copy_kept(buf, offset) {
            self.remote.stats.kept_hits.fetch_add(1, Relaxed);
            return true;
        }
        self.remote
            .disk
            .as_ref()
            .is_some_and(|d| d.read(&self.disk_key, buf, offset))
    }

    /// What to fetch for a read of `[offset, end)`: `(start, fetch_end, suffix, flight)`,
    /// where `suffix` is a kept extent holding `[fetch_end, end)` when only a prefix is
    /// missing (a central directory read after the tail that holds its end), and
    /// `flight` the fetch registered for others to wait on (the caller finishes it).
    fn plan(&self, offset: u64, end: u64) -> (u64, u64, Option<(u64, bytes::Bytes)>, Arc<Flight>) {
        let mut k = crate::sync::lock(&self.kept);
        let (start, fetch_end, suffix) = Self::plan_in(
            &mut k,
            self.size,
            offset,
            end,
            self.read_ahead.load(Relaxed),
        );
        let flight = Arc::new(Flight::default());
        k.flights.push((start, fetch_end, flight.clone()));
        (start, fetch_end, suffix, flight)
    }

    fn plan_in(
        k: &mut Kept,
        size: u64,
        offset: u64,
        end: u64,
        read_ahead: u64,
    ) -> (u64, u64, Option<(u64, bytes::Bytes)>) {
        // Sequential: starts where a fetch ended (give or take the alignment of the
        // read-ahead's own fetches): fetch more, and more each time.
        let sequential = read_ahead > 0
            && k.before(offset).any(|(s, b)| {
                let e = s + b.len() as u64;
                e <= offset && offset - e < ALIGN
            });
        if sequential {
            k.next = (k.next * 2).clamp((256 * 1024).min(read_ahead), read_ahead);
            let want = (end - offset).max(k.next);
            let mut fetch_end = ((offset + want).div_ceil(ALIGN) * ALIGN).min(size);
            // Not into what is held or being fetched already.
            for s in k
                .extents
                .range(offset + 1..fetch_end.max(offset + 1))
                .map(|(s, _)| *s)
                .take(1)
                .chain(k.flights.iter().map(|f| f.0))
            {
                if s > offset && s < fetch_end {
                    fetch_end = s;
                }
            }
            return (offset, fetch_end.max(end), None);
        }
        let suffix = k
            .extents
            .range(offset + 1..end.max(offset + 1))
            .find(|(s, b)| *s + b.len() as u64 >= end)
            .map(|(s, b)| (*s, b.clone()));
        match suffix {
            Some((s, b)) => (offset, s, Some((s, b))),
            None => (offset, end, None),
        }
    }

    /// Fetch `[start, end)` of this version (`If-Match`), counted.
    /// Fetch `start..end` of `source`: exactly that many bytes, or an error.
    async fn fetch(
        source: Arc<dyn Ranges>,
        start: u64,
        end: u64,
        what: String,
    ) -> Result<bytes::Bytes> {
        let bytes = source.get(start, end).await?;
        if bytes.len() as u64 != end - start {
            return Err(Error::Corrupt(format!(
                "{what}: asked for {} bytes, got {}",
                end - start,
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    fn fetch_all(&self, ranges: &[(u64, u64)]) -> Result<Vec<bytes::Bytes>> {
        let what = self.name.display().to_string();
        let _waiting = self.remote.foreground.enter();
        let got = if ranges.len() == 1 {
            let (s, e) = ranges[0];
            vec![
                self.remote
                    .run(&what, Self::fetch(self.source.clone(), s, e, what.clone()))?,
            ]
        } else {
            let got = self.remote.run(&what, self.source.get_many(ranges))?;
            for (&(s, e), b) in ranges.iter().zip(&got) {
                if b.len() as u64 != e - s {
                    return Err(Error::Corrupt(format!(
                        "{what}: asked for {} bytes, got {}",
                        e - s,
                        b.len()
                    )));
                }
            }
            got
        };
        let stats = &self.remote.stats;
        for (&(start, _), bytes) in ranges.iter().zip(&got) {
            stats.fetches.fetch_add(1, Relaxed);
            stats.bytes.fetch_add(bytes.len() as u64, Relaxed);
            self.fetched.fetch_add(bytes.len() as u64, Relaxed);
            let keep = keepable(self.gate.0.get(), start, bytes, true);
            if keep.is_empty() {
                continue;
            }
            if let Some(disk) = &self.remote.disk {
                disk.store_later(&self.disk_key, start, keep.clone());
            }
            self.remote.kept_budget.keep(&self.kept, start, keep);
        }
        Ok(got)
    }

    /// Start background fetches of what of `[a, b)` is neither held nor under way (a
    /// range that overlaps a fetch still gets the rest fetched: the walk's advice for a
    /// ZIP's directory often overlaps a reader's fetch of one of its members).
    fn prefetch_range(&self, a: u64, b: u64) {
        for (s, e, f) in register_flights(&self.kept, a, b) {
            self.spawn_prefetch(s, e, f);
        }
    }

    /// What a fetch on the runtime needs of this blob.
    fn prefetcher(&self) -> Prefetcher {
        Prefetcher {
            source: self.source.clone(),
            remote: self.remote.clone(),
            kept: self.kept.clone(),
            disk_key: self.disk_key.clone(),
            fetched: self.fetched.clone(),
            name: self.name.display().to_string(),
            gate: self.gate.0.get().cloned(),
        }
    }

    /// Fetch `[a, b)` on the runtime (registered as `flight`), into memory and the disk
    /// cache.
    fn spawn_prefetch(&self, a: u64, b: u64, flight: Arc<Flight>) {
        self.prefetcher().spawn_fetch(a, b, flight);
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<u64> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                Error::Format(format!(
                    "unexpected end of {} at offset {}",
                    self.name.display(),
                    self.size
                ))
            })
    }
}

impl Blob for RemoteBlob {
    fn name(&self) -> &Path {
        &self.name
    }

    fn object(&self) -> Option<ObjectVersion> {
        self.object.clone()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = self.check_range(offset, buf.len())?;
        if buf.is_empty() || self.cached(buf, offset) {
            return Ok(());
        }
        // Being fetched in the background: wait for it rather than fetch it twice.
        let flights = flights_covering(&crate::sync::lock(&self.kept), offset, end);
        if !flights.is_empty() {
            for f in flights {
                f.wait(self.remote.config.read_timeout);
            }
            if self.cached(buf, offset) {
                return Ok(());
            }
        }
        if log::log_enabled!(log::Level::Trace) {
            let k = crate::sync::lock(&self.kept);
            let fl: Vec<_> = k.flights.iter().map(|(s, e, _)| (*s, *e)).collect();
            let ex: Vec<_> = k
                .extents
                .range(offset.saturating_sub(LOOK_BACK)..end)
                .map(|(s, b)| (*s, s + b.len() as u64))
                .collect();
            log::trace!("read {offset}-{end}: fetch; flights {fl:?}, kept {ex:?}");
        }
        let (start, fetch_end, suffix, flight) = self.plan(offset, end);
        let got = self.fetch_all(&[(start, fetch_end)]);
        // Readers and read-ahead that waited on (or kept clear of) this fetch go on.
        let next = {
            let mut k = crate::sync::lock(&self.kept);
            k.flights.retain(|(_, _, f)| !Arc::ptr_eq(f, &flight));
            k.start_deferred()
        };
        flight.finish();
        for (s, e, f) in next {
            self.spawn_prefetch(s, e, f);
        }
        let got = got?;
        let bytes = &got[0];
        let n = (fetch_end.min(end) - offset) as usize;
        buf[..n].copy_from_slice(&bytes[..n]);
        if let Some((s, b)) = suffix {
            let from = (fetch_end - s) as usize;
            let rest = buf.len() - n;
            buf[n..].copy_from_slice(&b[from..from + rest]);
        }
        Ok(())
    }

    fn round_trips(&self) -> bool {
        true
    }

    /// Fetch the ranges in the background (at most [`PREFETCHES`] at once over all
    /// objects, pieces of at most [`MAX_READ_AHEAD`]), into memory and the disk cache:
    /// a walk's read-ahead (`fs::prefetch`) then reads many objects at once instead of
    /// one round trip after another. Ranges already held or in flight are skipped.
    fn will_need(&self, ranges: &[(u64, u64)]) {
        // Without a disk cache, fetched ranges wait in memory ([`KEPT_BYTES`] for all
        // objects): an object's read-ahead is bounded by its share
        // ([`Kept::plan_read_ahead`]), so what it fetches is not dropped before it is
        // read.
        let Some(disk) = &self.remote.disk else {
            let mut pieces = Vec::new();
            for &(s, e) in ranges {
                let e = e.min(self.size);
                let mut a = s;
                while a < e {
                    let b = (a + MAX_READ_AHEAD).min(e);
                    pieces.push((a, b));
                    a = b;
                }
            }
            log::trace!("{}: will need {pieces:?}", self.name.display());
            let start = crate::sync::lock(&self.kept).plan_read_ahead(&pieces);
            for (s, e, f) in start {
                self.spawn_prefetch(s, e, f);
            }
            return;
        };
        for &(s, e) in ranges {
            let e = e.min(self.size);
            // Only what the disk cache does not hold; not the small gaps between what
            // it holds (the advice merges extents across gaps: headers nobody read).
            let mut holes = disk.holes(&self.disk_key, s, e);
            if holes != [(s, e)] {
                holes.retain(|(a, b)| b - a >= ALIGN);
            }
            log::trace!(
                "{}: will need {s}-{e}, holes {holes:?}",
                self.name.display()
            );
            for (s, e) in holes {
                let mut a = s;
                while a < e {
                    let b = (a + MAX_READ_AHEAD).min(e);
                    self.prefetch_range(a, b);
                    a = b;
                }
            }
        }
    }

    /// 4 KiB: a ZIP's end record and a package's seek table and index usually fit; a
    /// larger central directory is fetched next, without what this already holds.
    fn first_tail(&self) -> u64 {
        4096
    }

    /// The ranges not cached are fetched concurrently, adjacent ones as one request.
    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<()> {
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for (buf, offset) in reads.iter_mut() {
            let end = self.check_range(*offset, buf.len())?;
            if !buf.is_empty() && !self.cached(buf, *offset) {
                missing.push((*offset, end));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in missing {
            match merged.last_mut() {
                Some(last) if s <= last.1 + ALIGN => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let got = self.fetch_all(&merged)?;
        for (buf, offset) in reads.iter_mut() {
            let end = *offset + buf.len() as u64;
            if let Some(((s, _), bytes)) = merged
                .iter()
                .zip(&got)
                .find(|((s, e), _)| *s <= *offset && end <= *e)
            {
                let at = (*offset - s) as usize;
                buf.copy_from_slice(&bytes[at..at + buf.len()]);
            }
        }
        Ok(())
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn mtime(&self) -> i64 {
        self.modified
    }

    fn fetched(&self) -> Option<u64> {
        Some(self.fetched.load(Relaxed))
    }

    fn set_keep_gate(&self, gate: crate::io::blob::KeepGate) {
        let _ = self.gate.0.set(gate);
    }

    fn fetch_sparingly(&self, sequential: u64) {
        self.read_ahead.store(sequential, Relaxed);
    }

    /// In the order given, in pieces of at most [`ORDERED_PIECE`], at most
    /// [`ORDERED_FLIGHTS`] at once; what the disk cache holds or a fetch brings already
    /// is skipped. While it runs the background fetch ([`Blob::fetch_in_background`])
    /// waits, as it does for reads.
    fn fetch_in_order(&self, ranges: &[(u64, u64)]) {
        let mut pieces = Vec::new();
        for &(s, e) in ranges {
            let e = e.min(self.size);
            let holes = match &self.remote.disk {
                Some(d) => d.holes(&self.disk_key, s, e),
                None => vec![(s, e)],
            };
            for (s, e) in holes {
                let mut a = s;
                while a < e {
                    let b = (a + ORDERED_PIECE).min(e);
                    pieces.push((a, b));
                    a = b;
                }
            }
        }
        if pieces.is_empty() {
            return;
        }
        let p = self.prefetcher();
        self.remote.rt.spawn(async move {
            let remote = p.remote.clone();
            let _ahead = remote.foreground.enter();
            let slots = Arc::new(tokio::sync::Semaphore::new(ORDERED_FLIGHTS));
            // In KiB.
            let room = Arc::new(tokio::sync::Semaphore::new((ORDERED_BYTES >> 10) as usize));
            let mut running = Vec::new();
            for (a, b) in pieces {
                let (Ok(slot), Ok(bytes)) = (
                    slots.clone().acquire_owned().await,
                    room.clone()
                        .acquire_many_owned((b - a).div_ceil(1024) as u32)
                        .await,
                ) else {
                    return;
                };
                let flights = register_flights(&p.kept, a, b);
                let p = p.clone();
                running.push(tokio::spawn(async move {
                    for (s, e, f) in flights {
                        p.fetch(s, e, f).await;
                    }
                    drop((slot, bytes));
                }));
            }
            for r in running {
                let _ = r.await;
            }
        });
    }

    /// Pieces of [`BACKGROUND_PIECE`], started only while no read of any blob waits for
    /// the source, at most [`BACKGROUND_FLIGHTS`] at once: a program's reads share the
    /// link with half a megabyte of it at most, where 64 read-aheads of 8 MiB (the
    /// walk's advice) would queue them behind the whole layer on a slow link. Into the
    /// disk cache; without one, as the walk's advice (memory bounds what is kept).
    fn fetch_in_background(&self) {
        let Some(disk) = &self.remote.disk else {
            self.will_need(&[(0, self.size)]);
            return;
        };
        let holes = disk.holes(&self.disk_key, 0, self.size);
        if holes.is_empty() {
            return;
        }
        let p = self.prefetcher();
        self.remote.rt.spawn(p.behind_reads(holes));
    }

    fn forget(&self) {
        crate::sync::lock(&self.kept).clear();
        if let Some(d) = &self.remote.disk {
            d.forget(&self.disk_key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes in memory as ranges, each request counted.
    #[derive(Debug)]
    struct Counting(Arc<Vec<u8>>, Arc<AtomicU64>);

    impl Ranges for Counting {
        fn get(
            &self,
            start: u64,
            end: u64,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
            self.1.fetch_add(1, Relaxed);
            let b = bytes::Bytes::copy_from_slice(&self.0[start as usize..end as usize]);
            Box::pin(async move { Ok(b) })
        }
    }

    #[test]
    fn a_read_across_two_kept_extents_is_served_from_them() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        let asked = Arc::new(AtomicU64::new(0));
        let remote = Remote::new(RemoteConfig::default()).unwrap();
        let blob = RemoteBlob::of(
            "x.zip".into(),
            Arc::new(Counting(Arc::new(data.clone()), asked.clone())),
            data.len() as u64,
            "v".into(),
            0,
            remote,
        );
        // Read-ahead of two ranges that touch, as a walk's advice is cut.
        blob.will_need(&[(0, 8192), (8192, 16_384)]);
        let start = std::time::Instant::now();
        while !blob.kept.lock().unwrap().flights.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(5), "read-ahead stuck");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(asked.load(Relaxed), 2);
        let mut buf = vec![0u8; 1000];
        blob.read_exact_at(&mut buf, 7_700).unwrap();
        assert_eq!(buf, data[7_700..8_700]);
        assert_eq!(
            asked.load(Relaxed),
            2,
            "a read across the two went to the server"
        );
    }

    #[test]
    fn a_read_waits_for_the_fetches_under_way_only_when_they_and_what_is_held_cover_it() {
        let budget = Arc::new(KeptBudget::new(1 << 20));
        let kept = Arc::new(Mutex::new(Kept::new(budget.clone())));
        budget.keep(&kept, 0, bytes::Bytes::from(vec![1u8; 10_000]));
        let mut k = kept.lock().unwrap();
        let (f1, f2) = (Arc::new(Flight::default()), Arc::new(Flight::default()));
        k.flights.push((10_000, 20_000, f1.clone()));
        k.flights.push((20_000, 30_000, f2.clone()));
        let ids = |v: Vec<Arc<Flight>>| -> Vec<bool> {
            v.iter()
                .map(|f| Arc::ptr_eq(f, &f1) || Arc::ptr_eq(f, &f2))
                .collect()
        };
        // Within one fetch; across held bytes and a fetch; across two fetches.
        assert_eq!(flights_covering(&k, 12_000, 13_000).len(), 1);
        assert_eq!(ids(flights_covering(&k, 9_000, 11_000)), [true]);
        assert_eq!(flights_covering(&k, 9_000, 25_000).len(), 2);
        // Past what is under way, or nothing under way: the read fetches.
        assert!(flights_covering(&k, 25_000, 31_000).is_empty());
        assert!(flights_covering(&k, 1_000, 2_000).is_empty());
        k.flights.remove(0);
        assert!(
            flights_covering(&k, 9_000, 25_000).is_empty(),
            "a hole at 10,000-20,000"
        );
    }

    #[test]
    fn kept_extents_of_all_objects_share_one_budget_oldest_out() {
        let budget = Arc::new(KeptBudget::new(10_000));
        let kept = || Arc::new(Mutex::new(Kept::new(budget.clone())));
        let held = || budget.state.lock().unwrap().1;
        let (a, b) = (kept(), kept());
        let bytes = |n: usize| bytes::Bytes::from(vec![7u8; n]);
        // Many small extents of one object are all kept (not the last eight).
        for i in 0..20u64 {
            budget.keep(&a, i * 100, bytes(100));
        }
        assert_eq!(a.lock().unwrap().extents.len(), 20);
        assert_eq!(held(), 2000);
        // Another object's extents push the oldest of the first out, over both.
        budget.keep(&b, 0, bytes(7_000));
        budget.keep(&b, 7_000, bytes(2_000));
        assert_eq!(held(), 10_000, "ten of a's extents went");
        budget.keep(&b, 9_000, bytes(500));
        assert_eq!(held(), 10_000);
        let first = *a.lock().unwrap().extents.keys().next().unwrap();
        assert_eq!(first, 1_500, "the fifteen oldest extents of a went first");
        // Replacing an extent counts once; clearing and dropping give bytes back.
        budget.keep(&b, 9_000, bytes(500));
        assert_eq!(held(), 10_000);
        a.lock().unwrap().clear();
        assert_eq!(held(), 9_500);
        drop(b);
        assert_eq!(held(), 0);
        // What is left in the queue of dropped objects is skipped.
        let c = kept();
        budget.keep(&c, 0, bytes(10_000));
        budget.keep(&c, 10_000, bytes(10));
        assert_eq!(held(), 10, "the first went, once");
    }

    /// Bytes in memory as ranges; each request noted with how many reads waited for the
    /// source when it started.
    struct Noting {
        data: Arc<Vec<u8>>,
        remote: Arc<Remote>,
        asked: Arc<Mutex<Vec<(u64, u64, usize)>>>,
    }

    impl std::fmt::Debug for Noting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Noting")
        }
    }

    impl Ranges for Noting {
        fn get(
            &self,
            start: u64,
            end: u64,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
            let waiting = self.remote.foreground.waiting.load(Relaxed);
            self.asked.lock().unwrap().push((start, end, waiting));
            let b = bytes::Bytes::copy_from_slice(&self.data[start as usize..end as usize]);
            Box::pin(async move { Ok(b) })
        }
    }

    #[test]
    fn a_whole_blob_fetched_in_the_background_keeps_out_of_reads_way() {
        let d = tempfile::tempdir().unwrap();
        let remote = Remote::new(RemoteConfig {
            disk_cache: Some((d.path().join("cache"), 1 << 30)),
            ..RemoteConfig::default()
        })
        .unwrap();
        let data: Arc<Vec<u8>> = Arc::new((0..3_000_000u32).map(|i| (i * 13) as u8).collect());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let source = Noting {
            data: data.clone(),
            remote: remote.clone(),
            asked: asked.clone(),
        };
        let size = data.len() as u64;
        let blob = RemoteBlob::of(
            "layer".into(),
            Arc::new(source),
            size,
            "v".into(),
            0,
            remote.clone(),
        );
        // A read waits for the source: the background fetch starts nothing meanwhile,
        // and another read goes straight to the source.
        let waiting = remote.foreground.enter();
        blob.fetch_in_background();
        let mut buf = vec![0u8; 1000];
        blob.read_exact_at(&mut buf, 2_000_000).unwrap();
        assert_eq!(buf, data[2_000_000..2_001_000]);
        let read = asked.lock().unwrap().clone();
        assert_eq!(read.len(), 1, "only the read went to the source: {read:?}");
        assert_eq!(read[0].2, 2, "it and the other read were waiting");
        drop(waiting);
        // Then all of it, in pieces, each started while no read waited.
        let disk = remote.disk.clone().unwrap();
        let start = std::time::Instant::now();
        while !disk.holes(&blob.disk_key, 0, size).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "background fetch stuck"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let asked = asked.lock().unwrap().clone();
        let background = &asked[1..];
        assert!(background.len() >= 5, "{asked:?}");
        for &(s, e, waiting) in background {
            assert_eq!(waiting, 0, "a piece started while a read waited: {asked:?}");
            assert!(e - s <= BACKGROUND_PIECE, "{asked:?}");
        }
    }

    #[test]
    fn the_background_window_grows_while_pieces_cross_in_a_round_trip_and_shrinks_when_they_queue()
    {
        let pacer = Pacer::new();
        let ms = Duration::from_millis;
        // Every place taken, then given back after a piece: the places there are always
        // the window.
        let piece = |took, whole| {
            let permit = pacer.slots.clone().try_acquire_owned().expect("a place");
            pacer.ended(permit, took, whole);
            assert_eq!(pacer.slots.available_permits(), pacer.window());
        };
        assert_eq!(pacer.window(), BACKGROUND_FLIGHTS);
        // A fast link: pieces take about a round trip, the window grows to its top.
        piece(ms(40), true);
        assert_eq!(pacer.window(), BACKGROUND_FLIGHTS + 1);
        for _ in 0..2 * BACKGROUND_MAX_FLIGHTS {
            piece(ms(45), true);
        }
        assert_eq!(pacer.window(), BACKGROUND_MAX_FLIGHTS);
        // A piece mostly held already says nothing of the link.
        piece(ms(500), false);
        assert_eq!(pacer.window(), BACKGROUND_MAX_FLIGHTS);
        // Pieces queue on the link (each takes over twice the quickest): one place back
        // a piece, never below the floor.
        piece(ms(100), true);
        assert_eq!(pacer.window(), BACKGROUND_MAX_FLIGHTS - 1);
        for _ in 0..2 * BACKGROUND_MAX_FLIGHTS {
            piece(ms(200), true);
        }
        assert_eq!(pacer.window(), BACKGROUND_FLIGHTS);
        // Between the two (a piece's own transfer on a slow link): the window stays.
        piece(ms(70), true);
        assert_eq!(pacer.window(), BACKGROUND_FLIGHTS);
    }

    #[test]
    fn read_ahead_fetches_only_what_is_neither_held_nor_under_way() {
        let k = 1 << 20;
        // Nothing covered: the whole range.
        assert_eq!(uncovered(vec![], 0, k), [(0, k)]);
        // A reader's fetch inside the advice (a ZIP member of the directory advised):
        // the rest on both sides is still fetched.
        assert_eq!(
            uncovered(vec![(100_000, 200_000)], 0, k),
            [(0, 100_000), (200_000, k)]
        );
        // Overlapping and unsorted cover, one past the end, one outside.
        assert_eq!(
            uncovered(
                vec![
                    (500_000, 600_000),
                    (0, 50_000),
                    (40_000, 60_000),
                    (900_000, 2 * k),
                    (3 * k, 4 * k)
                ],
                0,
                k
            ),
            [(60_000, 500_000), (600_000, 900_000)]
        );
        // Slivers between held ranges are left to readers, unless that is all there is.
        assert_eq!(uncovered(vec![(0, 10_000), (10_100, k)], 0, k), []);
        assert_eq!(uncovered(vec![], 10, 20), [(10, 20)]);
        // All held.
        assert_eq!(uncovered(vec![(0, k)], 10, 20), []);
    }

    /// Bytes in memory as ranges, each request noted; every answer held until the gate
    /// is closed (opened for all).
    #[derive(Debug)]
    struct Gated {
        data: Arc<Vec<u8>>,
        asked: Arc<Mutex<Vec<(u64, u64)>>>,
        gate: Arc<tokio::sync::Semaphore>,
    }

    impl Ranges for Gated {
        fn get(
            &self,
            start: u64,
            end: u64,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
            self.asked.lock().unwrap().push((start, end));
            let b = bytes::Bytes::copy_from_slice(&self.data[start as usize..end as usize]);
            let gate = self.gate.clone();
            Box::pin(async move {
                // Closed: every waiter goes on.
                let _ = gate.acquire().await;
                Ok(b)
            })
        }
    }

    #[test]
    fn read_ahead_past_its_share_waits_its_turn_and_is_read_from_memory() {
        const M: u64 = 1 << 20;
        let remote = Remote::new(RemoteConfig::default()).unwrap();
        assert!(remote.disk.is_none());
        let data: Arc<Vec<u8>> = Arc::new((0..40 * M as u32).map(|i| (i * 31) as u8).collect());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let blob = RemoteBlob::of(
            "layer".into(),
            Arc::new(Gated {
                data: data.clone(),
                asked: asked.clone(),
                gate: gate.clone(),
            }),
            data.len() as u64,
            "v".into(),
            0,
            remote.clone(),
        );
        // A walk advises 40 MiB: one share (16 MiB) under way, the next waiting, the
        // last 8 MiB dropped.
        blob.will_need(&[(0, 40 * M)]);
        {
            let k = blob.kept.lock().unwrap();
            let mut flying: Vec<(u64, u64)> = k.flights.iter().map(|(s, e, _)| (*s, *e)).collect();
            flying.sort_unstable();
            assert_eq!(flying, [(0, 8 * M), (8 * M, 16 * M)]);
            assert_eq!(
                k.deferred.iter().copied().collect::<Vec<_>>(),
                [(16 * M, 24 * M), (24 * M, 32 * M)]
            );
        }
        // The fetches land: the waiting share starts, then lands too.
        gate.close();
        let start = std::time::Instant::now();
        loop {
            {
                let k = blob.kept.lock().unwrap();
                if k.flights.is_empty() && k.deferred.is_empty() {
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "read-ahead stuck"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut got = asked.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(
            got,
            [
                (0, 8 * M),
                (8 * M, 16 * M),
                (16 * M, 24 * M),
                (24 * M, 32 * M)
            ]
        );
        // Read from memory, the waiting share's bytes too; past it, from the source.
        for at in [M, 20 * M, 31 * M] {
            let mut buf = vec![0u8; 4096];
            blob.read_exact_at(&mut buf, at).unwrap();
            assert_eq!(buf, data[at as usize..at as usize + 4096]);
        }
        assert_eq!(asked.lock().unwrap().len(), 4, "a read went to the source");
        let mut buf = vec![0u8; 4096];
        blob.read_exact_at(&mut buf, 36 * M).unwrap();
        assert_eq!(buf, data[36 * M as usize..36 * M as usize + 4096]);
        assert_eq!(asked.lock().unwrap().len(), 5);
    }
}
