//! `pkgfs status MOUNTPOINT`: asking a running mount what it serves and how it is doing.
//!
//! The channel is a Unix socket in Linux's *abstract* namespace named after the mount's
//! device number (`pkgfs-status-<st_dev>`): nothing appears in the tree or on disk,
//! nothing is left behind when the daemon dies, and `stat MOUNTPOINT` is all a client
//! needs to find it. The daemon answers only its own user and root (checked with
//! `SO_PEERCRED`). A client sends one line, `status` or `status json`, and reads the
//! report until the daemon closes the connection.
//!
//! The report: the mount and its sources, the generation (how many activations), each
//! active package with its entry count and how many path conflicts it wins and loses,
//! skipped archives with the reason, the block cache (size, budget, hit rate, blocks
//! dropped once the kernel held them), bytes read from archives and produced by
//! decompression, request counts, and data errors.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::{debug, warn};

use crate::fs::PkgFs;

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
    /// When the mount started.
    pub started: SystemTime,
}

/// What happened since the mount: kept by the daemon, shown by `status`.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    /// Activations done (package sets swapped in).
    pub activations: u64,
    /// When the last one happened, and what it changed.
    pub last: Option<(SystemTime, String)>,
    /// Archives skipped by the last scan, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
    /// Rescans that failed (a source directory could not be read).
    pub failed_scans: u64,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// One package line of the report.
struct PackageRow {
    path: String,
    format: &'static str,
    entries: usize,
    wins: usize,
    loses: usize,
}

/// The status report of `fs`, as text for people or JSON for scripts.
pub fn report(fs: &PkgFs, info: &MountInfo, activity: &Activity, json: bool) -> String {
    let view = fs.view();
    let mut rows: Vec<PackageRow> = view
        .layers
        .iter()
        .map(|l| PackageRow {
            path: l.archive.path.display().to_string(),
            format: match l.archive.format {
                crate::archive::Format::Zip => "zip",
                crate::archive::Format::SeekableTar => "seekable-zstd",
            },
            entries: l.entries,
            wins: 0,
            loses: 0,
        })
        .collect();
    for c in &view.tree.conflicts {
        if let Some(r) = rows.get_mut(c.winner as usize) {
            r.wins += 1;
        }
        if let Some(r) = rows.get_mut(c.loser as usize) {
            r.loses += 1;
        }
    }
    let cache = fs.reader().cache();
    let (hits, misses, released) = (
        cache.stats.hits.load(Relaxed),
        cache.stats.misses.load(Relaxed),
        cache.stats.released.load(Relaxed),
    );
    let rs = &fs.reader().stats;
    let ops = &fs.stats;
    let counters = [
        ("lookup", ops.lookups.load(Relaxed)),
        ("getattr", ops.getattrs.load(Relaxed)),
        ("readdir", ops.readdirs.load(Relaxed)),
        ("readlink", ops.readlinks.load(Relaxed)),
        ("read", ops.reads.load(Relaxed)),
    ];
    let uptime = info.started.elapsed().unwrap_or(Duration::ZERO).as_secs();
    let pid = std::process::id();
    if json {
        let mut o = String::from("{");
        let _ = write!(
            o,
            "\"mountpoint\":{},\"pid\":{pid},\"uptime_s\":{uptime},\"watching\":{},\"whiteouts\":{},\"sources\":[{}],",
            json_str(&info.mountpoint.display().to_string()),
            info.watching,
            info.whiteouts,
            info.sources
                .iter()
                .map(|s| json_str(&s.display().to_string()))
                .collect::<Vec<_>>()
                .join(",")
        );
        let _ = write!(
            o,
            "\"generation\":{},\"activations\":{},\"failed_scans\":{},\"last_activation\":{},",
            view.generation,
            activity.activations,
            activity.failed_scans,
            activity
                .last
                .as_ref()
                .map_or("null".into(), |(t, what)| format!(
                    "{{\"time\":{},\"changes\":{}}}",
                    secs(*t),
                    json_str(what)
                ))
        );
        let pkgs: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"path\":{},\"format\":\"{}\",\"entries\":{},\"conflicts_won\":{},\"conflicts_lost\":{}}}",
                    json_str(&r.path),
                    r.format,
                    r.entries,
                    r.wins,
                    r.loses
                )
            })
            .collect();
        let skipped: Vec<String> = activity
            .skipped
            .iter()
            .map(|(p, why)| {
                format!(
                    "{{\"path\":{},\"reason\":{}}}",
                    json_str(&p.display().to_string()),
                    json_str(why)
                )
            })
            .collect();
        let _ = write!(
            o,
            "\"packages\":[{}],\"skipped\":[{}],\"inodes\":{},\"inodes_retired\":{},",
            pkgs.join(","),
            skipped.join(","),
            view.tree.len(),
            fs.retired_count()
        );
        let _ = write!(
            o,
            "\"cache\":{{\"bytes\":{},\"budget\":{},\"hits\":{hits},\"misses\":{misses},\"released\":{released}}},",
            cache.bytes(),
            cache.budget()
        );
        let _ = write!(
            o,
            "\"archive_bytes_read\":{},\"bytes_decompressed\":{},\"streams_started\":{},\"checkpoint_resumes\":{},\"read_bytes\":{},\"prefetched_files\":{},\"prefetched_bytes\":{},\"prefetch_failed\":{},\"errors\":{},\"requests\":{{{}}}}}",
            rs.archive_bytes.load(Relaxed),
            rs.decompressed_bytes.load(Relaxed),
            rs.streams_started.load(Relaxed),
            rs.checkpoint_resumes.load(Relaxed),
            ops.read_bytes.load(Relaxed),
            ops.prefetched.load(Relaxed),
            ops.prefetched_bytes.load(Relaxed),
            ops.prefetch_failed.load(Relaxed),
            ops.errors.load(Relaxed),
            counters
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        o.push('\n');
        return o;
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "pkgfs at {} (pid {pid}, up {uptime} s)",
        info.mountpoint.display()
    );
    let _ = writeln!(
        o,
        "sources: {} ({})",
        info.sources
            .iter()
            .map(|s| s.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        match (info.watching, info.whiteouts) {
            (true, false) => "watched",
            (false, false) => "fixed set",
            (true, true) => "watched; whiteouts honoured",
            (false, true) => "fixed set; whiteouts honoured",
        }
    );
    let _ = write!(
        o,
        "generation {}: {} activations",
        view.generation, activity.activations
    );
    if let Some((t, what)) = &activity.last {
        let ago = t.elapsed().unwrap_or(Duration::ZERO).as_secs();
        let _ = write!(o, ", last {ago} s ago ({what})");
    }
    if activity.failed_scans > 0 {
        let _ = write!(o, ", {} failed rescans", activity.failed_scans);
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "packages: {} active, {} skipped; {} inodes ({} still held from older generations)",
        rows.len(),
        activity.skipped.len(),
        view.tree.len(),
        fs.retired_count()
    );
    let _ = writeln!(
        o,
        "  {:>9} {:>6} {:>6}  {:<13} package",
        "entries", "wins", "loses", "format"
    );
    for r in &rows {
        let _ = writeln!(
            o,
            "  {:>9} {:>6} {:>6}  {:<13} {}",
            r.entries, r.wins, r.loses, r.format, r.path
        );
    }
    for (p, why) in &activity.skipped {
        let _ = writeln!(o, "  skipped {}: {why}", p.display());
    }
    let rate = if hits + misses > 0 {
        100.0 * hits as f64 / (hits + misses) as f64
    } else {
        0.0
    };
    let _ = writeln!(
        o,
        "cache: {} of {}; {hits} hits, {misses} misses ({rate:.1}% hit rate); {released} blocks dropped once the kernel held them",
        mib(cache.bytes()),
        mib(cache.budget())
    );
    let _ = writeln!(
        o,
        "archives: {} read, {} decompressed, {} streams started, {} resumed from checkpoints",
        mib(rs.archive_bytes.load(Relaxed)),
        mib(rs.decompressed_bytes.load(Relaxed)),
        rs.streams_started.load(Relaxed),
        rs.checkpoint_resumes.load(Relaxed)
    );
    let _ = writeln!(
        o,
        "requests: {}; {} served by read",
        counters
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        mib(ops.read_bytes.load(Relaxed))
    );
    let _ = writeln!(
        o,
        "prefetch: {} files ({}) pushed into the page cache ahead of readers, {} refused",
        ops.prefetched.load(Relaxed),
        mib(ops.prefetched_bytes.load(Relaxed)),
        ops.prefetch_failed.load(Relaxed)
    );
    let _ = writeln!(o, "errors: {}", ops.errors.load(Relaxed));
    o
}

/// The socket address of the status channel of the mount with device number `dev`.
fn address(dev: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("pkgfs-status-{dev}").as_bytes())
}

/// The user id of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a correctly sized local struct.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
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

/// Serve status requests for the mount with device number `dev` on a background thread
/// (which first waits for the channel's name if a departing daemon still holds it).
pub fn serve(
    dev: u64,
    fs: Arc<PkgFs>,
    info: MountInfo,
    activity: Arc<Mutex<Activity>>,
) -> std::io::Result<()> {
    let address = address(dev)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    std::thread::Builder::new()
        .name("pkgfs-status".into())
        .spawn(move || {
            let listener = match bind(&address) {
                Ok(l) => l,
                Err(e) => {
                    warn!("no status channel: {e}");
                    return;
                }
            };
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                match peer_uid(&conn) {
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
                let json = match line.trim() {
                    "status" => false,
                    "status json" => true,
                    other => {
                        let _ = writeln!(conn, "error: unknown request {other:?}");
                        continue;
                    }
                };
                let act = activity.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let text = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    report(&fs, &info, &act, json)
                }))
                .unwrap_or_else(|_| "error: the report failed\n".into());
                if let Err(e) = conn.write_all(text.as_bytes()) {
                    debug!("status reply: {e}");
                }
            }
        })?;
    Ok(())
}

/// Ask the daemon of the mount at `mountpoint` for its status.
pub fn query(mountpoint: &Path, json: bool) -> Result<String, String> {
    let meta =
        std::fs::metadata(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let addr = address(meta.dev()).map_err(|e| e.to_string())?;
    let mut s = UnixStream::connect_addr(&addr).map_err(|e| {
        format!(
            "{}: no pkgfs daemon answers for this mount ({e}); is it a pkgfs mountpoint?",
            mountpoint.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(if json { b"status json\n" } else { b"status\n" })
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    if out.is_empty() {
        warn!("the daemon closed the status channel without an answer");
        return Err(format!(
            "{}: the pkgfs daemon refused the request (another user's mount?)",
            mountpoint.display()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Ownership, TreeBuilder};

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
            started: SystemTime::now(),
        };
        serve(dev, fs, info, Arc::new(Mutex::new(Activity::default()))).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(held);
        let start = std::time::Instant::now();
        let answer = loop {
            if let Ok(mut s) = UnixStream::connect_addr(&address(dev).unwrap()) {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(b"status json\n").unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                break out;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "nobody took the name"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(answer.contains("/the/new/mount"), "{answer}");
    }
}
