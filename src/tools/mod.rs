//! Offline tools on the same core as the mount: `ls`, `cat` and `check`; `pack` and `seal`
//! (their own modules) write packages and seals.
//!
//! They build the very same merged tree and read through the very same read path as the
//! FUSE daemon, so what `pkgfs ls` and `pkgfs cat` show is what a mount would serve, and
//! `pkgfs check` finds what a mount would answer with EIO, without needing FUSE.

pub mod pack;
pub mod seal;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::Error;
use crate::format::{IndexCache, OpenContext};
use crate::fs::PkgFs;
pub use crate::source::Merge;
use crate::source::{self, LoadReport, display_archive};
use crate::tree::view::View;
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

fn load(sources: &[PathBuf], merge: &Merge) -> Result<(PkgFs, LoadReport), ToolError> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let opts = merge.load_options(
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        Ownership::defaults(uid, gid),
        64 << 20,
        IndexCache::default_dir(),
        Default::default(),
    );
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

/// Where a node comes from, for `ls` and `check`: its archive as the scan named it
/// (`report`, for the top generation), a graft's package, or the archive of a graft's
/// own generation.
fn origin(top: &Arc<View>, report: &LoadReport, v: &Arc<View>, local: u64) -> String {
    let Some(node) = v.tree.node(local) else {
        return String::new();
    };
    if let Some(g) = v.graft_at(local) {
        return g.source.name().display().to_string();
    }
    if Arc::ptr_eq(top, v) {
        return display_archive(&report.layers, node.archive);
    }
    v.layers.get(node.archive as usize).map_or_else(
        || format!("archive #{}", node.archive),
        |l| l.archive.path.display().to_string(),
    )
}

/// Every node under `start` (inode, path), depth first in name order, grafts entered
/// (indexed) on the way.
fn walk(
    fs: &PkgFs,
    start: u64,
    start_path: Vec<u8>,
    mut visit: impl FnMut(u64, &[u8]) -> Result<(), ToolError>,
) -> Result<(), ToolError> {
    let mut stack = vec![(start, start_path)];
    while let Some((ino, path)) = stack.pop() {
        visit(ino, &path)?;
        let Some((v, l)) = fs.dir(ino) else { continue };
        let Some(node) = v.tree.node(l).filter(|n| n.kind == Kind::Dir) else {
            continue;
        };
        let mut kids: Vec<(u64, Vec<u8>)> = v
            .tree
            .children(node)
            .map(|(i, n)| {
                let mut p = path.clone();
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(v.tree.name(n));
                (v.global(i), p)
            })
            .collect();
        kids.reverse();
        stack.extend(kids);
    }
    Ok(())
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
    let top = fs.view();
    let start = fs
        .resolve(path)
        .ok_or_else(|| ToolError::NotInTree(String::from_utf8_lossy(path).into_owned()))?;
    let start_path: Vec<u8> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect::<Vec<_>>()
        .join(&b'/');
    walk(&fs, start, start_path, |ino, p| {
        if ino == ROOT_INO {
            return Ok(());
        }
        let Ok((v, l)) = fs.find(ino) else {
            return Ok(());
        };
        let Some(node) = v.tree.node(l) else {
            return Ok(());
        };
        let mut name = String::from_utf8_lossy(p).into_owned();
        if node.kind == Kind::Symlink {
            match fs.readlink(ino) {
                Ok(t) => name += &format!(" -> {}", String::from_utf8_lossy(&t)),
                Err(e) => name += &format!(" -> ({e})"),
            }
        }
        out.write_all(
            format!(
                "{} {:>5} {:>5} {:>12} {:>11} {}\t{}\n",
                mode_string(node.kind, node.perm),
                node.uid,
                node.gid,
                node.size,
                node.mtime,
                name,
                origin(&top, &report, &v, l)
            )
            .as_bytes(),
        )?;
        Ok(())
    })?;
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
/// Packages a layout indexes on first use are all indexed (and checked) here.
pub fn check(sources: &[PathBuf], merge: &Merge, out: &mut impl Write) -> Result<bool, ToolError> {
    let (fs, report) = load(sources, merge)?;
    let top = fs.view();
    let mut errors = 0usize;
    for (path, e) in &report.skipped {
        errors += 1;
        writeln!(out, "error: archive {} skipped: {e}", path.display())?;
    }
    let mut files = 0u64;
    let mut bytes = 0u64;
    let mut views: Vec<Arc<View>> = vec![top.clone()];
    walk(&fs, ROOT_INO, Vec::new(), |ino, p| {
        let Ok((v, l)) = fs.find(ino) else {
            return Ok(());
        };
        let Some(node) = v.tree.node(l) else {
            return Ok(());
        };
        let Some(member) = v.tree.member(node) else {
            return Ok(());
        };
        if !views.iter().any(|x| Arc::ptr_eq(x, &v)) {
            views.push(v.clone());
        }
        files += 1;
        match check_member(&fs, ino, &v, member) {
            Ok(n) => bytes += n,
            Err(e) => {
                errors += 1;
                writeln!(
                    out,
                    "error: {} (from {}): {e}",
                    String::from_utf8_lossy(p),
                    origin(&top, &report, &v, l)
                )?;
            }
        }
        Ok(())
    })?;
    for g in &top.grafts {
        if let Some(e) = g.error() {
            errors += 1;
            writeln!(
                out,
                "error: {}: cannot index it: {e}",
                g.source.name().display()
            )?;
        }
    }
    // Checks of whole archives beyond their members (a seekable archive's index must
    // agree with the tar stream it describes), entries refused and conflicts, in every
    // generation the walk went through.
    let cache = IndexCache::default_dir().map(IndexCache::new);
    let cx = OpenContext {
        index_cache: cache.as_ref(),
        ..OpenContext::default()
    };
    let mut conflicts = 0;
    for v in &views {
        let name = |i: u32| {
            if Arc::ptr_eq(v, &top) {
                display_archive(&report.layers, i)
            } else {
                v.layers
                    .get(i as usize)
                    .map_or_else(String::new, |l| l.archive.path.display().to_string())
            }
        };
        for s in &v.tree.skipped {
            errors += 1;
            writeln!(
                out,
                "error: {}: entry {:?} skipped: {}",
                name(s.archive),
                String::from_utf8_lossy(&s.path),
                s.reason
            )?;
        }
        for c in &v.tree.conflicts {
            conflicts += 1;
            writeln!(
                out,
                "conflict: {}: {} wins over {} ({})",
                String::from_utf8_lossy(&c.path),
                name(c.winner),
                name(c.loser),
                c.reason
            )?;
        }
        for a in v.layers.iter().map(|l| &l.archive) {
            let problems = a
                .package
                .verify(a, &cx)
                .unwrap_or_else(|e| vec![e.to_string()]);
            for p in problems {
                errors += 1;
                writeln!(out, "error: {}: {p}", a.path.display())?;
            }
        }
    }
    let mut w = |s: String| out.write_all(s.as_bytes());
    w(format!(
        "{} archives ({} skipped, {} ignored), {files} files and symlinks, {bytes} bytes verified, {} conflicts, {errors} errors\n",
        report.layers.len() + top.grafts.len(),
        report.skipped.len(),
        report.ignored.len(),
        conflicts,
    ))?;
    Ok(errors == 0)
}

/// Read a member whole and compare its size and its CRC-32 (where its format records
/// one) with the index: the bytes read.
fn check_member(
    fs: &PkgFs,
    ino: u64,
    v: &View,
    member: &crate::tree::Member,
) -> Result<u64, String> {
    let mut crc = crc32fast::Hasher::new();
    let n = stream(fs, ino, |c| {
        crc.update(c);
        true
    })
    .map_err(|e| e.to_string())?;
    let sum = crc.finalize();
    if n != member.size {
        return Err(format!("read {n} bytes, directory says {}", member.size));
    }
    let recorded = v
        .layers
        .get(member.archive as usize)
        .and_then(|l| l.archive.package.crc32(&member.loc));
    match recorded {
        Some(crc) if sum != crc => Err(format!("CRC-32 {sum:08x}, directory says {crc:08x}")),
        // Seekable frames carry zstd checksums, verified as they decode.
        _ => Ok(n),
    }
}
