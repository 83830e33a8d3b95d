//! `pkgfs status MOUNTPOINT`: asking a running mount what it serves and how it is doing
//! (and `pkgfs status SOCKET`, a running `pkgfs snapshotter` what its layers are:
//! [`serve_snapshotter`], the report made by `crate::snapshot::report`).
//!
//! The channel is a Unix socket in Linux's *abstract* namespace named after the mount's
//! device number (`pkgfs-status-<st_dev>`): nothing appears in the tree or on disk,
//! nothing is left behind when the daemon dies, and `stat MOUNTPOINT` is all a client
//! needs to find it. The daemon answers only its own user and root (checked with
//! `SO_PEERCRED`). A client sends one line, `status`, `status all` or `status json`, and
//! reads the report until the daemon closes the connection.
//!
//! The report: the mount and its sources, the generation (how many activations), each
//! active package with its entry count and how many path conflicts it wins and loses,
//! skipped archives with the reason, the block cache (size, budget, hit rate, blocks
//! dropped once the kernel held them), bytes read from archives and produced by
//! decompression, request counts, and data errors. As text, that summary comes first and
//! the packages last, at most [`LISTED`] of them unless all are asked for (`status all`):
//! a mount of 10,000 packages still gives a report that fits a screen.

use std::fmt::Write as _;

use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::{debug, warn};

use crate::fs::PkgFs;
use crate::source::image::ImageSummary;
use crate::source::live::Activity;
use crate::source::store::{StoreLayerRow, StoreState};
use crate::source::verify::{SealRow, SealState};

/// What the daemon knows about its mount, beyond the filesystem itself.
#[derive(Debug, Clone)]
pub struct MountInfo {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Its sources, in layer order.
    pub sources: Vec<PathBuf>,
    /// Whether source directories are watched.
    pub watching: bool,
    /// Whether `.wh.` entries are whiteouts (`--whiteouts`).
    pub whiteouts: bool,
    /// Its layout.
    pub layout: crate::layout::Kind,
    /// When the mount started.
    pub started: SystemTime,
    /// The io_uring transport's state.
    pub rings: Arc<crate::transport::uring::RingStats>,
    /// The client of remote sources, if any source is remote.
    pub remote: Option<Arc<crate::io::remote::Remote>>,
    /// `pkgfs store`: its images and layers.
    pub store: Option<Arc<dyn StoreState>>,
    /// `--verify`: the seals of the sources.
    pub seals: Option<Arc<dyn SealState>>,
    /// The keeper that holds the mount's connection, if one does (`crate::keeper`).
    pub keeper: Option<Arc<Mutex<crate::keeper::wire::KeeperReport>>>,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Hits as a percentage of all lookups (0 with none).
fn hit_rate(hits: u64, misses: u64) -> f64 {
    if hits + misses > 0 {
        100.0 * hits as f64 / (hits + misses) as f64
    } else {
        0.0
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// One package line of the report.
#[derive(Debug, Clone, Serialize)]
struct PackageRow {
    path: String,
    format: &'static str,
    /// Where its index came from.
    index: crate::format::IndexOrigin,
    entries: usize,
    /// What of an image layer's digests was checked.
    checked: crate::format::Checked,
    #[serde(rename = "conflicts_won")]
    wins: usize,
    #[serde(rename = "conflicts_lost")]
    loses: usize,
    /// Bytes fetched from a server for it (remote sources and registries only).
    #[serde(skip_serializing_if = "Option::is_none")]
    fetched_bytes: Option<u64>,
}

/// An image among the sources.
#[derive(Debug, Clone, Serialize)]
struct ImageRow {
    reference: String,
    manifest: Option<String>,
    config: Option<String>,
    platform: Option<String>,
    layers: Vec<LayerRow>,
}

/// A layer of an image.
#[derive(Debug, Clone, Serialize)]
struct LayerRow {
    digest: String,
    media_type: String,
    size: u64,
}

/// A skipped archive and why.
#[derive(Debug, Clone, Serialize)]
struct SkippedRow {
    path: String,
    reason: String,
}

/// The last activation.
#[derive(Debug, Clone, Serialize)]
struct LastActivation {
    /// Seconds since the epoch.
    time: u64,
    /// `+added -removed ~replaced`.
    changes: String,
}

/// The block cache.
#[derive(Debug, Clone, Serialize)]
struct CacheReport {
    bytes: u64,
    budget: u64,
    hits: u64,
    misses: u64,
    released: u64,
}

/// Remote sources: what was fetched, and the disk cache.
#[derive(Debug, Clone, Serialize)]
struct RemoteReport {
    /// HTTP requests sent, retries included.
    requests: u64,
    /// Failed requests that were tried again.
    retries: u64,
    /// Reads and listings that failed.
    errors: u64,
    /// Range reads made.
    fetches: u64,
    /// Bytes of objects received.
    bytes: u64,
    /// Reads served from ranges kept in memory.
    kept_hits: u64,
    /// Fetches started ahead of readers (read-ahead advice).
    prefetches: u64,
    /// Requests that fetched several ranges at once.
    multi_range_requests: u64,
    /// Read bound, seconds.
    timeout_s: u64,
    disk_cache: Option<DiskReport>,
}

/// The disk cache of remote sources.
#[derive(Debug, Clone, Serialize)]
struct DiskReport {
    dir: String,
    bytes: u64,
    budget: u64,
    hits: u64,
    misses: u64,
    bytes_read: u64,
    bytes_stored: u64,
    torn: u64,
    evicted: u64,
}

/// Request counts by operation.
#[derive(Debug, Clone, Serialize)]
struct Requests {
    lookup: u64,
    getattr: u64,
    readdir: u64,
    readlink: u64,
    read: u64,
    /// Listing entries handed out plain (without attributes: `crate::fs::entries`).
    plain_entries: u64,
    /// Lookups of names listed plain, each of which made listings full for a while.
    plain_switches: u64,
    /// Cached listings of directories listed plain handed to be dropped at switches, and
    /// how many the kernel was told to drop.
    plain_relist_queued: u64,
    plain_relisted: u64,
}

/// Everything the report says: the JSON form is this, serialised; the text form is
/// written from it.
#[derive(Debug, Clone, Serialize)]
struct Report {
    mountpoint: String,
    pid: u32,
    /// The process serving requests (the same as `pid`).
    server_pid: u32,
    /// The process holding the connection: it restarts the server (None: no keeper,
    /// the mount dies with its server).
    keeper_pid: Option<u32>,
    /// Restarts, their last cause and pause.
    keeper: Option<crate::keeper::wire::KeeperReport>,
    uptime_s: u64,
    watching: bool,
    whiteouts: bool,
    layout: LayoutRow,
    sources: Vec<String>,
    images: Vec<ImageRow>,
    generation: u64,
    activations: u64,
    failed_scans: u64,
    last_activation: Option<LastActivation>,
    packages: Vec<PackageRow>,
    skipped: Vec<SkippedRow>,
    indexing: Vec<String>,
    inodes: usize,
    inodes_retired: usize,
    cache: CacheReport,
    archive_bytes_read: u64,
    bytes_decompressed: u64,
    streams_started: u64,
    checkpoint_resumes: u64,
    read_bytes: u64,
    prefetched_files: u64,
    prefetched_bytes: u64,
    prefetch_failed: u64,
    /// Times the kernel was seen to have dropped pages it had (read-ahead started over).
    page_drops: u64,
    prefetch_hints: u64,
    prefetch_hints_taken: u64,
    prefetch_idle: bool,
    errors: u64,
    transport: &'static str,
    io_uring_requests: u64,
    /// The host's settings that decide what a FUSE round trip costs.
    host: crate::transport::host::HostSettings,
    requests: Requests,
    remote: Option<RemoteReport>,
    store: Option<Vec<StoreLayerRow>>,
    seals: Option<Vec<SealRow>>,
}

/// The forms of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Text: the summary, then at most [`LISTED`] packages and skipped archives.
    Summary,
    /// Text listing every package and skipped archive (`--packages`).
    All,
    /// One JSON object with everything, for scripts (`--json`).
    Json,
}

impl Style {
    /// Every form, for reading requests.
    const ALL: [Style; 3] = [Style::Summary, Style::All, Style::Json];

    /// The request line (without its newline) that asks the daemon for this form.
    fn request(self) -> &'static str {
        match self {
            Style::Summary => "status",
            Style::All => "status all",
            Style::Json => "status json",
        }
    }

    /// The form a request line asks for.
    fn of_request(line: &str) -> Option<Style> {
        Style::ALL.into_iter().find(|s| s.request() == line.trim())
    }
}

/// The layout and, for layouts that index packages on first use, how far that went.
#[derive(Debug, Clone, Serialize)]
struct LayoutRow {
    kind: crate::layout::Kind,
    /// Packages in directories of their own, listed.
    listed: usize,
    /// Of those, indexed so far.
    indexed: usize,
    /// Of those, whose index failed (empty directories).
    failed: usize,
    /// Of those indexed, how many the read-ahead indexed ahead of a walk heading for
    /// them (not the walker).
    indexed_ahead: u64,
}

/// Gather the report of `fs`.
fn gather(fs: &PkgFs, info: &MountInfo, activity: &Activity) -> Report {
    let view = fs.view();
    let packages = package_rows(&view);
    let cache = fs.io().cache();
    let rs = &fs.io().stats;
    let ops = &fs.stats;
    let store_images = info.store.as_ref().map(|s| s.images()).unwrap_or_default();
    Report {
        mountpoint: info.mountpoint.display().to_string(),
        pid: std::process::id(),
        server_pid: std::process::id(),
        keeper_pid: info
            .keeper
            .as_ref()
            .map(|k| crate::sync::lock(k).keeper_pid),
        keeper: info.keeper.as_ref().map(|k| crate::sync::lock(k).clone()),
        uptime_s: info.started.elapsed().unwrap_or(Duration::ZERO).as_secs(),
        watching: info.watching,
        whiteouts: info.whiteouts,
        layout: {
            let (listed, indexed, failed) = fs.graft_counts();
            LayoutRow {
                kind: info.layout,
                listed,
                indexed,
                failed,
                indexed_ahead: fs.stats.indexed_ahead.load(Relaxed),
            }
        },
        sources: info
            .sources
            .iter()
            .map(|s| s.display().to_string())
            .collect(),
        images: image_rows(activity.images.iter().chain(&store_images)),
        generation: view.generation,
        activations: activity.activations,
        failed_scans: activity.failed_scans,
        last_activation: activity.last.as_ref().map(|(t, what)| LastActivation {
            time: secs(*t),
            changes: what.clone(),
        }),
        packages,
        skipped: activity
            .skipped
            .iter()
            .map(|(p, why)| SkippedRow {
                path: p.display().to_string(),
                reason: why.clone(),
            })
            .collect(),
        indexing: activity
            .indexing
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        inodes: view.tree.len(),
        inodes_retired: fs.retired_count(),
        cache: cache_report(cache),
        archive_bytes_read: rs.archive_bytes.load(Relaxed),
        bytes_decompressed: rs.decompressed_bytes.load(Relaxed),
        streams_started: rs.streams_started.load(Relaxed),
        checkpoint_resumes: rs.checkpoint_resumes.load(Relaxed),
        read_bytes: ops.read_bytes.load(Relaxed),
        prefetched_files: ops.prefetched.load(Relaxed),
        prefetched_bytes: ops.prefetched_bytes.load(Relaxed),
        prefetch_failed: ops.prefetch_failed.load(Relaxed),
        page_drops: ops.page_drops.load(Relaxed),
        prefetch_hints: ops.hints.load(Relaxed),
        prefetch_hints_taken: ops.hints_taken.load(Relaxed),
        prefetch_idle: ops.prefetch_idle.load(Relaxed),
        errors: ops.errors.load(Relaxed),
        transport: info.rings.transport(),
        io_uring_requests: info.rings.requests.load(Relaxed),
        host: crate::transport::host::HostSettings::read(),
        requests: requests(ops, &fs.entries),
        remote: info.remote.as_deref().map(remote_report),
        store: info.store.as_ref().map(|s| s.layers()),
        seals: info.seals.as_ref().map(|s| s.seals()),
    }
}

/// One row per active package, with the path conflicts it wins and loses.
fn package_rows(view: &crate::tree::view::View) -> Vec<PackageRow> {
    let mut packages: Vec<PackageRow> = view
        .layers
        .iter()
        .map(|l| PackageRow {
            path: l.archive.path.display().to_string(),
            format: l.archive.format(),
            index: l.archive.origin,
            entries: l.entries,
            checked: l.archive.checked,
            wins: 0,
            loses: 0,
            fetched_bytes: l.archive.blob.fetched(),
        })
        .collect();
    for c in &view.tree.conflicts {
        if let Some(r) = packages.get_mut(c.winner as usize) {
            r.wins += 1;
        }
        if let Some(r) = packages.get_mut(c.loser as usize) {
            r.loses += 1;
        }
    }
    packages
}

/// The images among the sources and those a store looked up.
fn image_rows<'a>(images: impl Iterator<Item = &'a ImageSummary>) -> Vec<ImageRow> {
    images
        .map(|i| ImageRow {
            reference: i.reference.clone(),
            manifest: i.manifest.clone(),
            config: i.config.clone(),
            platform: i.platform.clone(),
            layers: i
                .layers
                .iter()
                .map(|(digest, media_type, size)| LayerRow {
                    digest: digest.clone(),
                    media_type: media_type.clone(),
                    size: *size,
                })
                .collect(),
        })
        .collect()
}

fn cache_report(cache: &crate::io::cache::BlockCache<crate::io::BlockKey>) -> CacheReport {
    CacheReport {
        bytes: cache.bytes(),
        budget: cache.budget(),
        hits: cache.stats.hits.load(Relaxed),
        misses: cache.stats.misses.load(Relaxed),
        released: cache.stats.released.load(Relaxed),
    }
}

fn requests(ops: &crate::fs::OpStats, entries: &crate::fs::entries::EntryPolicy) -> Requests {
    Requests {
        lookup: ops.lookups.load(Relaxed),
        getattr: ops.getattrs.load(Relaxed),
        readdir: ops.readdirs.load(Relaxed),
        readlink: ops.readlinks.load(Relaxed),
        read: ops.reads.load(Relaxed),
        plain_entries: entries.plain.load(Relaxed),
        plain_switches: entries.switched.load(Relaxed),
        plain_relist_queued: entries.relist_queued.load(Relaxed),
        plain_relisted: entries.relisted.load(Relaxed),
    }
}

fn remote_report(r: &crate::io::remote::Remote) -> RemoteReport {
    let s = &r.stats;
    RemoteReport {
        requests: s.requests.load(Relaxed),
        retries: s.retries(),
        errors: s.errors.load(Relaxed),
        fetches: s.fetches.load(Relaxed),
        bytes: s.bytes.load(Relaxed),
        kept_hits: s.kept_hits.load(Relaxed),
        prefetches: s.prefetches.load(Relaxed),
        multi_range_requests: s.multi_range.load(Relaxed),
        timeout_s: r.config.read_timeout.as_secs(),
        disk_cache: r.disk.as_ref().map(|d| DiskReport {
            dir: d.dir().display().to_string(),
            bytes: d.size(),
            budget: d.budget(),
            hits: d.stats.hits.load(Relaxed),
            misses: d.stats.misses.load(Relaxed),
            bytes_read: d.stats.bytes_read.load(Relaxed),
            bytes_stored: d.stats.bytes_stored.load(Relaxed),
            torn: d.stats.torn.load(Relaxed),
            evicted: d.stats.evicted.load(Relaxed),
        }),
    }
}

/// The status report of `fs`, in `style`.
pub fn report(fs: &PkgFs, info: &MountInfo, activity: &Activity, style: Style) -> String {
    let r = gather(fs, info, activity);
    match style {
        Style::Json => match serde_json::to_string(&r) {
            Ok(mut json) => {
                json.push('\n');
                json
            }
            Err(e) => format!("error: the report failed: {e}\n"),
        },
        Style::Summary | Style::All => text(&r, activity, style == Style::All),
    }
}

/// The text form of a report.
fn text(r: &Report, activity: &Activity, all: bool) -> String {
    let mut o = String::new();
    text_mount(&mut o, r);
    text_sources(&mut o, r);
    text_generation(&mut o, r, activity);
    text_caches(&mut o, r);
    text_work(&mut o, r);
    package_table(&mut o, &r.packages, &r.skipped, all);
    o
}

/// The mount, its process and its sources.
fn text_mount(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "pkgfs at {} (pid {}, up {} s)",
        r.mountpoint, r.pid, r.uptime_s
    );
    match &r.keeper {
        Some(k) => {
            let _ = write!(
                o,
                "keeper: pid {} holds the connection (so FUSE over io_uring is not used); {} \
                 restarts ({} reloads, limit {})",
                k.keeper_pid, k.restarts, k.reloads, k.restart_limit
            );
            if let Some(c) = &k.last_cause {
                let _ = write!(o, "; last: {c}");
            }
            if let Some(ms) = k.last_pause_ms {
                let _ = write!(o, ", readers paused {ms} ms");
            }
            if k.pauses_ms.len() > 1 {
                let longest = k.pauses_ms.iter().max().copied().unwrap_or(0);
                let _ = write!(
                    o,
                    " (longest of the last {}: {longest} ms)",
                    k.pauses_ms.len()
                );
            }
            let _ = writeln!(o);
        }
        None => {
            let _ = writeln!(o, "keeper: none (the mount ends with this process)");
        }
    }
    let _ = writeln!(
        o,
        "sources: {} ({})",
        r.sources.join(" "),
        match (r.watching, r.whiteouts) {
            (true, false) => "watched",
            (false, false) => "fixed set",
            (true, true) => "watched; whiteouts honoured",
            (false, true) => "fixed set; whiteouts honoured",
        }
    );
}

/// Images, seals and store layers among the sources.
fn text_sources(o: &mut String, r: &Report) {
    for i in &r.images {
        let _ = writeln!(
            o,
            "image {}: {} layers, manifest {}, config {}{}",
            i.reference,
            i.layers.len(),
            i.manifest.as_deref().unwrap_or("(none)"),
            i.config.as_deref().unwrap_or("(none)"),
            i.platform
                .as_deref()
                .map(|p| format!(", {p}"))
                .unwrap_or_default()
        );
    }
    for s in r.seals.iter().flatten() {
        let _ = writeln!(
            o,
            "seal of {}: revision {} by {}, {} archives; {} blocks ({} bytes) checked, {} failed",
            s.source,
            s.revision,
            s.signer,
            s.archives,
            s.blocks_checked,
            s.bytes_checked,
            s.failures
        );
    }
    for l in r.store.iter().flatten() {
        let _ = writeln!(
            o,
            "store layer {} of {}: {}, {} uses, {} releases, {} bytes fetched{}",
            l.digest,
            l.reference,
            match (&l.error, l.indexed) {
                (Some(e), _) => format!("index failed: {e}"),
                (None, true) => "indexed".into(),
                (None, false) => "not looked into".into(),
            },
            l.uses,
            l.released,
            l.fetched_bytes,
            if l.media_type.is_empty() {
                String::new()
            } else {
                format!(" ({})", l.media_type)
            }
        );
    }
}

/// Generations, activations, the layout's counts, packages and inodes.
fn text_generation(o: &mut String, r: &Report, activity: &Activity) {
    let _ = write!(
        o,
        "generation {}: {} activations",
        r.generation, r.activations
    );
    if let Some((t, what)) = &activity.last {
        let ago = t.elapsed().unwrap_or(Duration::ZERO).as_secs();
        let _ = write!(o, ", last {ago} s ago ({what})");
    }
    if r.failed_scans > 0 {
        let _ = write!(o, ", {} failed rescans", r.failed_scans);
    }
    o.push('\n');
    // The default layout needs no line of its own.
    if r.layout.kind != crate::layout::Kind::default() {
        let _ = writeln!(
            o,
            "layout: {}; {} packages listed, {} indexed ({} ahead of a walk), {} failed",
            r.layout.kind.name(),
            r.layout.listed,
            r.layout.indexed,
            r.layout.indexed_ahead,
            r.layout.failed
        );
    }
    let _ = writeln!(
        o,
        "packages: {} active, {} skipped; {} inodes ({} still held from older generations)",
        r.packages.len(),
        r.skipped.len(),
        r.inodes,
        r.inodes_retired
    );
    if !r.indexing.is_empty() {
        let _ = writeln!(o, "indexing in the background: {}", r.indexing.join(" "));
    }
}

/// The block cache, remote fetches and the disk cache.
fn text_caches(o: &mut String, r: &Report) {
    let c = &r.cache;
    let rate = hit_rate(c.hits, c.misses);
    let _ = writeln!(
        o,
        "cache: {} of {}; {} hits, {} misses ({rate:.1}% hit rate); {} blocks dropped once the kernel held them",
        mib(c.bytes),
        mib(c.budget),
        c.hits,
        c.misses,
        c.released
    );
    if let Some(rm) = &r.remote {
        let _ = writeln!(
            o,
            "remote: {} in {} fetches ({} ahead of readers), {} requests ({} retried), {} errors (bound {} s), {} reads from ranges in memory",
            mib(rm.bytes),
            rm.fetches,
            rm.prefetches,
            rm.requests,
            rm.retries,
            rm.errors,
            rm.timeout_s,
            rm.kept_hits
        );
        match &rm.disk_cache {
            Some(d) => {
                let rate = hit_rate(d.hits, d.misses);
                let _ = writeln!(
                    o,
                    "disk cache: {} of {} in {}; {} hits, {} misses ({rate:.1}% hit rate); {} read, {} stored, {} torn files dropped, {} evicted",
                    mib(d.bytes),
                    mib(d.budget),
                    d.dir,
                    d.hits,
                    d.misses,
                    mib(d.bytes_read),
                    mib(d.bytes_stored),
                    d.torn,
                    d.evicted
                );
            }
            None => {
                let _ = writeln!(o, "disk cache: none");
            }
        }
    }
}

/// Bytes read and decompressed, the transport, requests, prefetch and errors.
fn text_work(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "archives: {} read, {} decompressed, {} streams started, {} resumed from checkpoints",
        mib(r.archive_bytes_read),
        mib(r.bytes_decompressed),
        r.streams_started,
        r.checkpoint_resumes
    );
    let _ = writeln!(
        o,
        "transport: {}; {} requests through io_uring",
        r.transport, r.io_uring_requests
    );
    let _ = writeln!(
        o,
        "host: {}{}",
        r.host.describe(),
        r.host
            .advice()
            .map(|a| format!("\n  advice: {a}"))
            .unwrap_or_default()
    );
    let q = &r.requests;
    let _ = writeln!(
        o,
        "requests: lookup {}, getattr {}, readdir {}, readlink {}, read {}; {} served by read",
        q.lookup,
        q.getattr,
        q.readdir,
        q.readlink,
        q.read,
        mib(r.read_bytes)
    );
    let _ = writeln!(
        o,
        "entries: {} handed out plain (not instantiated), {} lookups of those made listings full (and dropped {} cached plain listings)",
        q.plain_entries, q.plain_switches, q.plain_relisted
    );
    let _ = writeln!(
        o,
        "prefetch: {} files ({}) pushed into the page cache ahead of readers, {} refused, started over {} times after the kernel dropped pages; {} of {} hints taken ({})",
        r.prefetched_files,
        mib(r.prefetched_bytes),
        r.prefetch_failed,
        r.page_drops,
        r.prefetch_hints_taken,
        r.prefetch_hints,
        if r.prefetch_idle { "idle" } else { "busy" }
    );
    let _ = writeln!(o, "errors: {}", r.errors);
}

/// How many packages, and how many skipped archives, the text report lists without
/// `--packages`: a mount of thousands of packages keeps a report that fits a screen.
pub const LISTED: usize = 20;

/// Which packages the text report lists: all of them when there are at most [`LISTED`]
/// (or `all`), otherwise the [`LISTED`] with the most path conflicts (won and lost; the
/// earlier package first on a tie), in mount order, which is the order of precedence.
fn listed_rows(rows: &[PackageRow], all: bool) -> Vec<usize> {
    if all || rows.len() <= LISTED {
        return (0..rows.len()).collect();
    }
    let mut by_conflicts: Vec<usize> = (0..rows.len()).collect();
    by_conflicts.sort_by_key(|&i| (std::cmp::Reverse(rows[i].wins + rows[i].loses), i));
    by_conflicts.truncate(LISTED);
    by_conflicts.sort_unstable();
    by_conflicts
}

/// The table of packages and the skipped archives, after the summary.
fn package_table(o: &mut String, rows: &[PackageRow], skipped: &[SkippedRow], all: bool) {
    let listed = listed_rows(rows, all);
    let _ = writeln!(
        o,
        "  {:>9} {:>6} {:>6}  {:<13} package",
        "entries", "wins", "loses", "format"
    );
    for r in listed.iter().map(|&i| &rows[i]) {
        let checked = match r.checked {
            crate::format::Checked::Nothing => "",
            crate::format::Checked::Digest => " (digest checked)",
            crate::format::Checked::Toc => " (table of contents checked)",
            crate::format::Checked::Ztoc => " (SOCI zTOC checked; spans as read)",
        };
        let _ = writeln!(
            o,
            "  {:>9} {:>6} {:>6}  {:<13} {}{checked}",
            r.entries, r.wins, r.loses, r.format, r.path
        );
    }
    if listed.len() < rows.len() {
        let _ = writeln!(
            o,
            "  ({} of {} packages listed, those with the most path conflicts; --packages lists all)",
            listed.len(),
            rows.len()
        );
    }
    let shown = if all {
        skipped.len()
    } else {
        skipped.len().min(LISTED)
    };
    for sk in &skipped[..shown] {
        let _ = writeln!(o, "  skipped {}: {}", sk.path, sk.reason);
    }
    if shown < skipped.len() {
        let _ = writeln!(
            o,
            "  ({shown} of {} skipped archives listed; --packages lists all)",
            skipped.len()
        );
    }
}

/// The socket address of the status channel of the mount with device number `dev`.
fn address(dev: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pkgfs-status-{dev}").as_bytes())
}

/// How long the status channel waits for its name while another process holds it.
const BIND_PATIENCE: Duration = Duration::from_secs(10);

/// Bind the status channel's name, waiting while another process holds it: device
/// numbers are reused, so a daemon whose mount has just gone may still hold the name of
/// a new mount that got its number, for the moment it takes to exit.
fn bind(address: &SocketAddr) -> std::io::Result<UnixListener> {
    let start = std::time::Instant::now();
    loop {
        match UnixListener::bind_addr(address) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse && start.elapsed() < BIND_PATIENCE =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// Serve status requests for the mount with device number `dev` on a background thread.
///
/// The channel's name is bound before this returns (waiting while a departing daemon
/// still holds it), so once the daemon reports the mount ready, `pkgfs status` answers
/// for it: binding on the thread raced a status query made right after the mount.
pub fn serve(
    dev: u64,
    fs: Arc<PkgFs>,
    info: MountInfo,
    activity: Arc<Mutex<Activity>>,
) -> std::io::Result<()> {
    serve_channel(&address(dev)?, move |style| {
        let act = crate::sync::lock(&activity).clone();
        report(&fs, &info, &act, style)
    })
}

/// The status channel of the `pkgfs snapshotter` serving on the socket whose file is
/// (`dev`, `ino`): a socket file's inode is new with each server.
fn snapshotter_address(dev: u64, ino: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pkgfs-status-snapshotter-{dev}-{ino}").as_bytes())
}

/// Serve status requests for the `pkgfs snapshotter` whose socket file is `socket`
/// (bound already), answered by `answer`, on a background thread.
pub fn serve_snapshotter(
    socket: &Path,
    answer: impl Fn(Style) -> String + Send + 'static,
) -> std::io::Result<()> {
    let md = std::fs::symlink_metadata(socket)?;
    serve_channel(&snapshotter_address(md.dev(), md.ino())?, answer)
}

/// Bind `addr` and answer each request on it with `answer`, on a background thread:
/// only this process's user and root are answered, a request is one line, a panic in
/// `answer` is an error line, not a dead channel.
fn serve_channel(
    addr: &SocketAddr,
    answer: impl Fn(Style) -> String + Send + 'static,
) -> std::io::Result<()> {
    let listener = bind(addr)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    std::thread::Builder::new()
        .name("pkgfs-status".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                match crate::keeper::wire::peer_uid(&conn) {
                    Some(uid) if uid == me || uid == 0 => {}
                    other => {
                        debug!("status request from uid {other:?} refused");
                        continue;
                    }
                }
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                if BufReader::new(&conn)
                    .take(256)
                    .read_line(&mut line)
                    .is_err()
                {
                    continue;
                }
                let Some(style) = Style::of_request(&line) else {
                    let _ = writeln!(conn, "error: unknown request {:?}", line.trim());
                    continue;
                };
                let text = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer(style)))
                    .unwrap_or_else(|_| "error: the report failed\n".into());
                if let Err(e) = conn.write_all(text.as_bytes()) {
                    debug!("status reply: {e}");
                }
            }
        })?;
    Ok(())
}

/// Why `pkgfs status` got no report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The mountpoint cannot be examined.
    #[error("{path}: {source}")]
    Mountpoint {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing answers on the mount's channel.
    #[error("{path}: no pkgfs daemon answers for this mount ({source}); is it a pkgfs mountpoint?")]
    NoDaemon {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The daemon closed the channel without an answer.
    #[error("{0}: the pkgfs daemon refused the request (another user's mount?)")]
    Refused(PathBuf),
    /// The conversation failed half-way.
    #[error("{path}: status channel: {source}")]
    Channel {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Ask the daemon of the mount at `mountpoint` for its status.
pub fn query(mountpoint: &Path, style: Style) -> Result<String, QueryError> {
    let path = || mountpoint.to_path_buf();
    let channel = |source| QueryError::Channel {
        path: path(),
        source,
    };
    let meta = std::fs::metadata(mountpoint).map_err(|source| QueryError::Mountpoint {
        path: path(),
        source,
    })?;
    if meta.file_type().is_socket() {
        // A snapshotter's socket: its inode names the channel, no other server's.
        let addr = snapshotter_address(meta.dev(), meta.ino()).map_err(channel)?;
        return ask(&addr, style, mountpoint);
    }
    let addr = address(meta.dev()).map_err(channel)?;
    let here = crate::transport::session::mount_path(mountpoint);
    // Device numbers are reused: for a moment the daemon of a mount that has just gone
    // may still answer on this mount's channel. Its report names its own mountpoint;
    // ask again until the answer is this mount's.
    let start = std::time::Instant::now();
    loop {
        let out = ask(&addr, style, mountpoint)?;
        match answered_for(&out, style) {
            Some(m) if Path::new(&m) != here && start.elapsed() < ANSWER_PATIENCE => {
                debug!(
                    "status answered for {m}, not {}: asking again",
                    here.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return Ok(out),
        }
    }
}

/// How long `pkgfs status` asks again while another mount's daemon answers.
const ANSWER_PATIENCE: Duration = Duration::from_secs(5);

/// One request on the status channel at `addr`.
fn ask(addr: &SocketAddr, style: Style, mountpoint: &Path) -> Result<String, QueryError> {
    let path = || mountpoint.to_path_buf();
    let channel = |source| QueryError::Channel {
        path: path(),
        source,
    };
    let mut s = UnixStream::connect_addr(addr).map_err(|source| QueryError::NoDaemon {
        path: path(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(channel)?;
    writeln!(s, "{}", style.request()).map_err(channel)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(channel)?;
    if out.is_empty() {
        warn!("the daemon closed the status channel without an answer");
        return Err(QueryError::Refused(path()));
    }
    Ok(out)
}

/// The mountpoint a status report is about (`mountpoint` in JSON, the first line of
/// the text).
fn answered_for(report: &str, style: Style) -> Option<String> {
    if style == Style::Json {
        let v: serde_json::Value = serde_json::from_str(report).ok()?;
        return v["mountpoint"].as_str().map(str::to_string);
    }
    let first = report.lines().next()?.strip_prefix("pkgfs at ")?;
    first.rsplit_once(" (pid ").map(|(m, _)| m.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Ownership, TreeBuilder};

    #[test]
    fn a_report_names_the_mount_it_is_about() {
        let fs = PkgFs::new(
            TreeBuilder::new(Ownership::defaults(0, 0)).finish(),
            vec![],
            0,
        );
        let mut i = info();
        i.mountpoint = PathBuf::from("/srv/a b (pid 7)");
        let act = Activity::default();
        for style in [Style::Summary, Style::All, Style::Json] {
            let r = report(&fs, &i, &act, style);
            assert_eq!(
                answered_for(&r, style).as_deref(),
                Some("/srv/a b (pid 7)"),
                "{style:?}"
            );
        }
        assert_eq!(answered_for("error: nothing", Style::Summary), None);
    }

    /// A mount (no FUSE) of `n` ZIP packages `p00.zip`...: each holds its own file, and
    /// the packages in `shared` also hold `shared`, so the later ones win it.
    fn packages(dir: &Path, n: usize, shared: &[usize]) -> PkgFs {
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        let mut layers = Vec::new();
        for i in 0..n {
            let path = dir.join(format!("p{i:02}.zip"));
            let mut w = ::zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
            let opts = ::zip::write::SimpleFileOptions::default();
            w.start_file(format!("own{i}"), opts).unwrap();
            if shared.contains(&i) {
                w.start_file("shared", opts).unwrap();
            }
            w.finish().unwrap();
            let idx =
                crate::format::open_path(&path, &crate::format::OpenContext::default()).unwrap();
            b.add_layer(i as u32, 0, &idx.entries);
            layers.push(crate::tree::view::Layer::new(
                Arc::new(idx.archive),
                idx.entries.len(),
            ));
        }
        PkgFs::with_layers(b.finish(), layers, 1 << 20, false)
    }

    fn info() -> MountInfo {
        MountInfo {
            mountpoint: PathBuf::from("/m"),
            sources: Vec::new(),
            watching: false,
            whiteouts: false,
            layout: Default::default(),
            started: SystemTime::now(),
            rings: Default::default(),
            remote: None,
            store: None,
            seals: None,
            keeper: None,
        }
    }

    /// The package lines of a text report: (entries, wins, loses, file name).
    fn package_lines(text: &str) -> Vec<(u64, u64, u64, String)> {
        text.lines()
            .filter(|l| l.ends_with(".zip") && !l.trim_start().starts_with("skipped"))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let name = Path::new(w[4])
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into();
                (
                    w[0].parse().unwrap(),
                    w[1].parse().unwrap(),
                    w[2].parse().unwrap(),
                    name,
                )
            })
            .collect()
    }

    #[test]
    fn a_few_packages_are_all_listed_after_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let fs = packages(dir.path(), 3, &[0, 2]);
        let text = report(&fs, &info(), &Activity::default(), Style::Summary);
        let lines = package_lines(&text);
        assert_eq!(
            lines,
            [
                (2, 0, 1, "p00.zip".to_string()),
                (1, 0, 0, "p01.zip".into()),
                (2, 1, 0, "p02.zip".into())
            ],
            "{text}"
        );
        // The summary comes first: the table ends the report.
        let errors = text.find("errors: 0").unwrap();
        assert!(text.find("p00.zip").unwrap() > errors, "{text}");
        assert!(!text.contains("listed"), "{text}");
    }

    #[test]
    fn many_packages_list_those_in_conflict_unless_all_are_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        // 30 packages; four share a path, each overriding the one before: 5 loses it to
        // 12, 12 to 25, 25 to 29.
        let n = LISTED + 10;
        let shared = [5, 12, 25, n - 1];
        let fs = packages(dir.path(), n, &shared);
        let activity = Activity {
            skipped: (0..LISTED + 3)
                .map(|i| {
                    (
                        PathBuf::from(format!("/bad/b{i:02}.zip")),
                        "truncated".into(),
                    )
                })
                .collect(),
            ..Activity::default()
        };
        let text = report(&fs, &info(), &activity, Style::Summary);
        let lines = package_lines(&text);
        assert_eq!(lines.len(), LISTED, "{text}");
        // Those in conflict are among them, in mount order, with their counts.
        let names: Vec<&str> = lines.iter().map(|l| l.3.as_str()).collect();
        for i in shared {
            assert!(names.contains(&format!("p{i:02}.zip").as_str()), "{text}");
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "mount order");
        assert!(
            lines.contains(&(2, 1, 0, format!("p{:02}.zip", n - 1))),
            "{text}"
        );
        assert!(lines.contains(&(2, 1, 1, "p12.zip".into())), "{text}");
        assert!(lines.contains(&(2, 0, 1, "p05.zip".into())), "{text}");
        assert!(
            text.contains(&format!("({LISTED} of {n} packages listed")),
            "{text}"
        );
        assert_eq!(text.matches("  skipped ").count(), LISTED, "{text}");
        assert!(
            text.contains(&format!(
                "({LISTED} of {} skipped archives listed",
                LISTED + 3
            )),
            "{text}"
        );
        assert!(text.contains(&format!("packages: {n} active, {} skipped", LISTED + 3)));

        let all = report(&fs, &info(), &activity, Style::All);
        assert_eq!(package_lines(&all).len(), n, "{all}");
        assert_eq!(all.matches("  skipped ").count(), LISTED + 3, "{all}");
        assert!(!all.contains(" listed"), "{all}");
    }

    #[test]
    fn a_name_a_departing_daemon_still_holds_is_taken_once_released() {
        // A device number no mount has.
        let dev = u64::MAX - u64::from(std::process::id());
        let held = UnixListener::bind_addr(&address(dev).unwrap()).unwrap();
        let owner = Ownership::defaults(0, 0);
        let fs = Arc::new(PkgFs::new(
            TreeBuilder::new(owner).finish(),
            Vec::new(),
            1 << 20,
        ));
        let info = MountInfo {
            mountpoint: PathBuf::from("/the/new/mount"),
            sources: Vec::new(),
            watching: false,
            whiteouts: false,
            layout: Default::default(),
            started: SystemTime::now(),
            rings: Default::default(),
            remote: None,
            store: None,
            seals: None,
            keeper: None,
        };
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        let start = std::time::Instant::now();
        serve(dev, fs, info, Arc::new(Mutex::new(Activity::default()))).unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "bound a held name"
        );
        release.join().unwrap();
        // Once `serve` has returned the channel answers at once: no retry.
        let mut s = UnixStream::connect_addr(&address(dev).unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"status json\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.contains("/the/new/mount"), "{answer}");
    }
}
