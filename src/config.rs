//! The plain configuration every command runs on: what [`crate::cli`] (or the mount(8)
//! helper's options, [`crate::fstab`]) validated, with no trace of clap.
//!
//! The daemon and the offline tools read these structs and nothing else of the command
//! line, as mountpoint-s3 keeps its `config.rs` apart from its `cli.rs`. [`Merge`] (the
//! source layer's: it makes the `LoadOptions` a load takes) holds the options that
//! `mount`, `ls`, `cat` and `check` share.

use std::path::PathBuf;
use std::time::Duration;

use crate::io::remote::RemoteConfig;
pub use crate::source::Merge;
pub use crate::transport::ops::Access;
use crate::tree::Ownership;

/// Arguments that parse but make no sense: exit status 2, as clap's own errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl From<String> for UsageError {
    fn from(s: String) -> Self {
        UsageError(s)
    }
}

impl From<&str> for UsageError {
    fn from(s: &str) -> Self {
        UsageError(s.to_string())
    }
}

/// Default block cache budget.
pub const DEFAULT_CACHE: &str = "256M";

/// Default largest directory read-ahead window (`--prefetch`).
pub const DEFAULT_PREFETCH: &str = "8M";
/// Default byte budget of the disk cache of remote sources.
pub const DEFAULT_DISK_CACHE: &str = "4G";
/// Default bound on a remote read, seconds.
pub const DEFAULT_REMOTE_TIMEOUT: &str = "30";

/// Validated settings of `pkgfs mount`.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Sources in layer order.
    pub sources: Vec<PathBuf>,
    /// How layers merge and where packages go (the options the offline tools share).
    pub merge: Merge,
    /// Mountpoint.
    pub mountpoint: PathBuf,
    /// Stay attached.
    pub foreground: bool,
    /// Cache budget, bytes.
    pub cache_bytes: u64,
    /// Largest directory read-ahead window, bytes (0: no read-ahead).
    pub prefetch_bytes: u64,
    /// FUSE worker threads.
    pub threads: usize,
    /// Ownership defaults and overrides.
    pub owner: Ownership,
    /// Who may access the mount.
    pub access: Access,
    /// Mount with `noexec`.
    pub noexec: bool,
    /// Mount with `noatime`.
    pub noatime: bool,
    /// Honour setuid/setgid bits (off: `nosuid`).
    pub suid: bool,
    /// Let device nodes be opened as devices (off: `nodev`).
    pub dev: bool,
    /// Name shown in /proc/mounts.
    pub fsname: String,
    /// Daemon log destination.
    pub log_file: Option<PathBuf>,
    /// Index cache directory for foreign seekable archives (None: no cache).
    pub index_cache: Option<PathBuf>,
    /// Watch source directories and activate packages as they come and go.
    pub watch: bool,
    /// Use FUSE over io_uring if the kernel offers it (and no keeper is used).
    pub io_uring: bool,
    /// Hand out listings' files and symlinks plain until attributes are wanted
    /// (`crate::fs::entries`).
    pub plain_entries: bool,
    /// A keeper holds the connection and restarts the server (`crate::keeper`).
    pub keeper: bool,
    /// Keep the merged tree in the index cache for the next mount of the same packages
    /// (`source::kept`; `--no-kept-tree`).
    pub kept_tree: bool,
    /// When the keeper gives up.
    pub restart_limit: crate::keeper::RestartLimit,
    /// Timeouts, retries and disk cache of remote sources.
    pub remote: RemoteConfig,
    /// List remote sources again this often (None: never).
    pub poll: Option<Duration>,
    /// `pkgfs store`: no sources; the tree grows as containers/storage looks up image
    /// references and layers (`source::store`).
    pub store: bool,
    /// `pkgfs store --cri-image-proxy`: the CRI image service served there and passed on
    /// to containerd, its pull secrets kept for the store (`snapshot::cri`).
    pub cri_proxy: Option<CriProxyConfig>,
}

/// Where `pkgfs store` serves the CRI image service, and where it passes it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriProxyConfig {
    /// The socket kubelet's `--image-service-endpoint` names.
    pub listen: PathBuf,
    /// containerd's socket (its CRI plugin).
    pub upstream: PathBuf,
}

/// containerd's socket, where `--cri-upstream` points by default.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// Default root of `pkgfs snapshotter`.
pub const DEFAULT_SNAPSHOTTER_ROOT: &str = "/var/lib/pkgfs/snapshotter";
/// Default socket of `pkgfs snapshotter`.
pub const DEFAULT_SNAPSHOTTER_ADDRESS: &str = "/run/pkgfs/snapshotter.sock";

/// Validated settings of `pkgfs snapshotter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotterConfig {
    /// Where the snapshots and their database live.
    pub root: PathBuf,
    /// The Unix socket containerd's `proxy_plugins` entry names.
    pub address: PathBuf,
    /// A `pkgfs store` mount to read layers from lazily (None: containerd unpacks every
    /// layer).
    pub store: Option<PathBuf>,
}

/// A validated command.
#[derive(Debug, Clone)]
pub enum Command {
    /// Mount.
    Mount(Box<MountConfig>),
    /// Query a running mount.
    Status {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Text, text with every package, or JSON.
        style: crate::status::Style,
    },
    /// Replace a mount's server.
    Reload {
        /// The mountpoint.
        mountpoint: PathBuf,
    },
    /// Unmount.
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Detach immediately.
        lazy: bool,
    },
    /// List.
    Ls {
        /// Sources.
        sources: Vec<PathBuf>,
        /// Path inside the tree.
        path: Vec<u8>,
        /// How layers merge.
        merge: Merge,
    },
    /// Print a file.
    Cat {
        /// Sources.
        sources: Vec<PathBuf>,
        /// Path inside the tree.
        path: Vec<u8>,
        /// How layers merge.
        merge: Merge,
    },
    /// Verify.
    Check {
        /// Sources.
        sources: Vec<PathBuf>,
        /// How layers merge.
        merge: Merge,
    },
    /// Pack a directory.
    Pack(crate::tools::pack::PackConfig),
    /// Serve containerd's snapshots API.
    Snapshotter(SnapshotterConfig),
    /// Seal a directory of archives.
    Seal(Box<crate::tools::seal::SealConfig>),
    /// Print a completion script for this shell.
    Completions(clap_complete::Shell),
    /// Write the man pages to this directory.
    Manpages(PathBuf),
}

/// Parse a restart limit: `COUNT/DURATION`, as `3/60s`.
pub fn parse_restart_limit(s: &str) -> Result<crate::keeper::RestartLimit, UsageError> {
    let bad = || {
        UsageError(format!(
            "restart limit {s:?}: want COUNT/DURATION, as 3/60s"
        ))
    };
    let (count, window) = s.split_once('/').ok_or_else(bad)?;
    Ok(crate::keeper::RestartLimit {
        count: count.trim().parse().map_err(|_| bad())?,
        window: parse_duration(window.trim())?,
    })
}

/// Parse a duration: `30` (seconds), `30s`, `500ms`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, UsageError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 500ms, 5m)"))?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)").into()),
    };
    if d.is_zero() {
        return Err(format!("{s:?}: a duration must be more than zero").into());
    }
    Ok(d)
}

/// [`parse_duration`], or `0` for none (a setting that zero turns off).
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, UsageError> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

/// Parse a byte size such as `512`, `64K`, `256M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, UsageError> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(
                        format!("bad size {s:?}: unknown suffix {c:?} (use K, M, G)").into(),
                    );
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = digits.trim().parse().map_err(|_| {
        format!("bad size {s:?}: expected a number with an optional K, M or G suffix")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large").into())
}

/// FUSE worker threads by default: one a core, at least four.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .max(4)
}
