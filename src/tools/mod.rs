//! Offline tools on the same core as the mount: `ls`, `cat` and `check`.
//!
//! They build the very same merged tree and read through the very same read path as the
//! FUSE daemon, so what `pkgfs ls` and `pkgfs cat` show is what a mount would serve, and
//! `pkgfs check` finds what a mount would answer with EIO, without needing FUSE.

pub mod pack;

use std::io::Write;
use std::path::PathBuf;

use crate::error::Error;
use crate::format::{IndexCache, OpenContext};
use crate::fs::PkgFs;
use crate::source::{self, LoadOptions, LoadReport, display_archive};
use crate::tree::{Kind, Ownership, ROOT_INO};

/// Bytes asked for per read when streaming a whole file.
const CHUNK: u32 = 1 << 20;

/// Why `ls`, `cat` or `check` failed (problems `check` finds are its output, not this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The sources could not be read.
    #[error(transparent)]
    Sources(#[from] Error),
    /// The path is not in the merged tree.
    #[error("{0}: not in the merged tree")]
    NotInTree(String),
    /// `cat` of a directory.
    #[error("{0}: is a directory")]
    IsDir(String),
    /// The file's bytes could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The path in the tree.
        path: String,
        /// Why.
        source: Error,
    },
    /// Writing the output failed (a closed pipe among others).
    #[error("output: {0}")]
    Output(#[from] std::io::Error),
}

/// How the offline tools merge layers (as the matching `mount` options do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merge {
    /// Treat `.wh.` entries as OCI whiteouts.
    pub whiteouts: bool,
    /// The platform to take from a multi-platform image.
    pub platform: Option<crate::source::image::Platform>,
    /// Where each package goes.
    pub layout: crate::layout::Config,
}

fn load(sources: &[PathBuf], merge: &Merge) -> Result<(PkgFs, LoadReport), ToolError> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let opts = LoadOptions {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        owner: Ownership::defaults(uid, gid),
        cache_bytes: 64 << 20,
        index_cache: IndexCache::default_dir().map(IndexCache::new),
        whiteouts: merge.whiteouts,
        platform: merge.platform.clone(),
        remote: Default::default(),
        progress: Some(source::Progress(std::sync::Arc::new(
            crate::progress::IndexBars::default(),
        ))),
        layout: merge.layout.clone(),
    };
    Ok(source::load(sources, &opts)?)
}

fn mode_string(kind: Kind, perm: u16) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::File => '-',
        Kind::CharDev => 'c',
        Kind::BlockDev => 'b',
        Kind::Fifo => 'p',
        Kind::Socket => 's',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if perm & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

/// `pkgfs ls`: one line per entry under `path`, depth first in name order:
/// mode, owner, size, mtime, path (with `-> target` for symlinks), and the package.
pub fn ls(
    sources: &[PathBuf],
    merge: &Merge,
    path: &[u8],
    out: &mut impl Write,
) -> Result<bool, ToolError> {
    let (fs, report) = load(sources, merge)?;
    // A fixed mount: the tree's own node numbers are the inode numbers.
    let view = fs.view();
    let tree = &view.tree;
    let start = tree
        .resolve(path)
        .ok_or_else(|| ToolError::NotInTree(String::from_utf8_lossy(path).into_owned()))?;
    let mut stack = vec![start];
    let mut w = |s: String| out.write_all(s.as_bytes());
    while let Some(ino) = stack.pop() {
        let Some(node) = tree.node(ino) else { continue };
        if ino != ROOT_INO {
            let mut name = String::from_utf8_lossy(&tree.path_of(ino)).into_owned();
            if node.kind == Kind::Symlink {
                match fs.readlink(ino) {
                    Ok(t) => name += &format!(" -> {}", String::from_utf8_lossy(&t)),
                    Err(e) => name += &format!(" -> ({e})"),
                }
            }
            w(format!(
                "{} {:>5} {:>5} {:>12} {:>11} {}\t{}\n",
                mode_string(node.kind, node.perm),
                node.uid,
                node.gid,
                node.size,
                node.mtime,
                name,
                display_archive(&report.layers, node.archive)
            ))?;
        }
        let mut kids: Vec<u64> = tree.children(node).map(|(i, _)| i).collect();
        kids.reverse();
        stack.extend(kids);
    }
    Ok(report.skipped.is_empty())
}

/// `pkgfs cat`: write one file of the merged tree to `out`.
pub fn cat(
    sources: &[PathBuf],
    merge: &Merge,
    path: &[u8],
    out: &mut impl Write,
) -> Result<(), ToolError> {
    let (fs, _) = load(sources, merge)?;
    let shown = || String::from_utf8_lossy(path).into_owned();
    let read_err = |source| ToolError::Read {
        path: shown(),
        source,
    };
    let ino = fs
        .resolve(path)
        .ok_or_else(|| ToolError::NotInTree(shown()))?;
    let node = fs.getattr(ino).map_err(read_err)?;
    if node.kind == Kind::Dir {
        return Err(ToolError::IsDir(shown()));
    }
    if node.kind == Kind::Symlink {
        let t = fs.readlink(ino).map_err(read_err)?;
        return Ok(out.write_all(&t)?);
    }
    let mut written = Ok(());
    stream(&fs, ino, |chunk| {
        written = out.write_all(chunk);
        written.is_ok()
    })
    .map_err(read_err)?;
    Ok(written?)
}

/// Read a whole file in chunks, handing each to `sink` until it answers `false`.
/// Returns the bytes read.
fn stream(fs: &PkgFs, ino: u64, mut sink: impl FnMut(&[u8]) -> bool) -> Result<u64, Error> {
    let mut off = 0u64;
    loop {
        let chunk = fs.read(ino, off, CHUNK)?;
        if chunk.is_empty() {
            return Ok(off);
        }
        off += chunk.len() as u64;
        if !sink(&chunk) {
            return Ok(off);
        }
    }
}

/// `pkgfs check`: verify everything; prints findings to `out`; `Ok(true)` if clean.
pub fn check(sources: &[PathBuf], merge: &Merge, out: &mut impl Write) -> Result<bool, ToolError> {
    let (fs, report) = load(sources, merge)?;
    // A fixed mount: the tree's own node numbers are the inode numbers.
    let view = fs.view();
    let tree = &view.tree;
    let mut errors = 0usize;
    let mut w = |s: String| out.write_all(s.as_bytes());
    for (path, e) in &report.skipped {
        errors += 1;
        w(format!("error: archive {} skipped: {e}\n", path.display()))?;
    }
    for s in &tree.skipped {
        errors += 1;
        w(format!(
            "error: {}: entry {:?} skipped: {}\n",
            display_archive(&report.layers, s.archive),
            String::from_utf8_lossy(&s.path),
            s.reason
        ))?;
    }
    for c in &tree.conflicts {
        w(format!(
            "conflict: {}: {} wins over {} ({})\n",
            String::from_utf8_lossy(&c.path),
            display_archive(&report.layers, c.winner),
            display_archive(&report.layers, c.loser),
            c.reason
        ))?;
    }
    // Checks of whole archives beyond their members (a seekable archive's index must
    // agree with the tar stream it describes).
    let cache = IndexCache::default_dir().map(IndexCache::new);
    let cx = OpenContext {
        index_cache: cache.as_ref(),
        ..OpenContext::default()
    };
    for a in view.layers.iter().map(|l| &l.archive) {
        let problems = a
            .package
            .verify(a, &cx)
            .unwrap_or_else(|e| vec![e.to_string()]);
        for p in problems {
            errors += 1;
            w(format!("error: {}: {p}\n", a.path.display()))?;
        }
    }
    let mut files = 0u64;
    let mut bytes = 0u64;
    for ino in 1..=tree.len() as u64 {
        let Some(node) = tree.node(ino) else { continue };
        let Some(member) = tree.member(node) else {
            continue;
        };
        files += 1;
        let mut crc = crc32fast::Hasher::new();
        let result = stream(&fs, ino, |c| {
            crc.update(c);
            true
        })
        .map_err(|e| e.to_string())
        .and_then(|n| {
            let sum = crc.clone().finalize();
            if n != member.size {
                return Err(format!("read {n} bytes, directory says {}", member.size));
            }
            let recorded = view
                .layers
                .get(member.archive as usize)
                .and_then(|l| l.archive.package.crc32(&member.loc));
            match recorded {
                Some(crc) if sum != crc => {
                    Err(format!("CRC-32 {sum:08x}, directory says {crc:08x}"))
                }
                // Seekable frames carry zstd checksums, verified as they decode.
                _ => Ok(n),
            }
        });
        match result {
            Ok(n) => bytes += n,
            Err(e) => {
                errors += 1;
                w(format!(
                    "error: {} (from {}): {e}\n",
                    String::from_utf8_lossy(&tree.path_of(ino)),
                    display_archive(&report.layers, node.archive)
                ))?;
            }
        }
    }
    w(format!(
        "{} archives ({} skipped, {} ignored), {files} files and symlinks, {bytes} bytes verified, {} conflicts, {errors} errors\n",
        report.layers.len(),
        report.skipped.len(),
        report.ignored.len(),
        tree.conflicts.len(),
    ))?;
    Ok(errors == 0)
}
