//! What the snapshotter does on disk: a snapshot's directories (`ROOT/snapshots/ID/fs`,
//! the upper directory or the layer itself, and `ROOT/snapshots/ID/work`, overlayfs's work
//! directory for an Active snapshot), made as containerd's overlayfs snapshotter makes
//! them, and the disk usage of a tree, counted as containerd's `fs.DiskUsage` counts it.

use std::collections::HashSet;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::meta::{Error, Kind, Result, Usage};

/// The snapshots directory of a snapshotter root, and the paths in it.
#[derive(Debug, Clone)]
pub struct Dirs {
    snapshots: PathBuf,
}

impl Dirs {
    /// `ROOT/snapshots`, made if missing.
    pub fn open(root: &Path) -> Result<Dirs> {
        let snapshots = root.join("snapshots");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&snapshots)
            .map_err(|e| Error::io(&snapshots, e))?;
        Ok(Dirs { snapshots })
    }

    /// `ROOT/snapshots`.
    pub fn snapshots(&self) -> &Path {
        &self.snapshots
    }

    /// The snapshot's own directory.
    pub fn dir(&self, id: u64) -> PathBuf {
        self.snapshots.join(id.to_string())
    }

    /// Its file system: the layer's contents, or an Active snapshot's upper directory.
    pub fn fs(&self, id: u64) -> PathBuf {
        self.dir(id).join("fs")
    }

    /// overlayfs's work directory of an Active snapshot.
    pub fn work(&self, id: u64) -> PathBuf {
        self.dir(id).join("work")
    }

    /// Make snapshot `id`'s directories: `fs` (0755, owned as the parent's `fs` so that
    /// an image's root directory keeps its owner) and, for an Active snapshot, `work`
    /// (0711). They are made under a temporary name and renamed into place, so that a
    /// crash never leaves a half-made `ID`; whatever is left under another name is
    /// garbage for Cleanup. A directory already at `ID` can only be left from a
    /// transaction that never committed (ids of committed snapshots are not reused): it
    /// is removed first.
    pub fn make(&self, id: u64, kind: Kind, parent: Option<u64>) -> Result<PathBuf> {
        let tmp = self.snapshots.join(format!("new-{id}"));
        let dest = self.dir(id);
        for stale in [&tmp, &dest] {
            remove_all(stale)?;
        }
        let mk = |path: &Path, mode: u32| {
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(path)
                .map_err(|e| Error::io(path, e))
        };
        let made = (|| {
            mk(&tmp, 0o755)?;
            let fs = tmp.join("fs");
            mk(&fs, 0o755)?;
            if kind == Kind::Active {
                mk(&tmp.join("work"), 0o711)?;
            }
            if let Some(pid) = parent {
                let of = self.fs(pid);
                let md = std::fs::metadata(&of).map_err(|e| Error::io(&of, e))?;
                std::os::unix::fs::lchown(&fs, Some(md.uid()), Some(md.gid()))
                    .map_err(|e| Error::io(&fs, e))?;
            }
            std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, e))
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        made.map(|()| dest)
    }
}

/// Remove `path` and everything under it; nothing there is no error.
pub fn remove_all(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotADirectory => {
            std::fs::remove_file(path).map_err(|e| Error::io(path, e))
        }
        r => r.map_err(|e| Error::io(path, e)),
    }
}

/// Whether something is mounted at `path`: it is on another device than its parent
/// directory, or it cannot be looked at for another reason than being missing (a FUSE
/// mount whose server is gone answers `ENOTCONN`).
pub fn is_mount_point(path: &Path) -> bool {
    let Some(parent) = path.parent() else {
        return true;
    };
    match (std::fs::symlink_metadata(path), std::fs::metadata(parent)) {
        (Ok(md), Ok(up)) => md.dev() != up.dev(),
        (Err(e), _) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => false,
        _ => true,
    }
}

/// `path` as the system calls take it.
fn c_path(path: &Path) -> Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::InvalidArgument(format!("{}: a NUL in the path", path.display())))
}

/// Bind-mount the directory `from` on `to`, read-only.
pub fn bind_read_only(from: &Path, to: &Path) -> Result<()> {
    let (src, dst) = (c_path(from)?, c_path(to)?);
    // SAFETY: NUL-terminated paths that live across the calls; no data argument.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(Error::io(to, std::io::Error::last_os_error()));
    }
    // A bind mount takes the flags of the mount it binds; read-only is a remount.
    // SAFETY: as above.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let _ = unmount(to);
        return Err(Error::io(to, e));
    }
    Ok(())
}

/// Detach whatever is mounted at `path` (lazily: readers of it keep what they hold).
pub fn unmount(path: &Path) -> Result<()> {
    let p = c_path(path)?;
    // SAFETY: a NUL-terminated path that lives across the call.
    if unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(Error::io(path, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Remove the snapshot directory `dir`, detaching a layer mounted on its `fs` first (a
/// lazily read layer), so that the removal never reaches into a mount.
pub fn remove_snapshot_dir(dir: &Path) -> Result<()> {
    let fs = dir.join("fs");
    if is_mount_point(&fs) {
        unmount(&fs)?;
    }
    remove_all(dir)
}

/// The disk usage of the tree at `root` (itself included), without following symbolic
/// links: each inode counted once (hard links), its size the blocks allocated to it
/// (`st_blocks` × 512), as containerd's `fs.DiskUsage`. Entries that vanish during the
/// walk are skipped.
pub fn usage(root: &Path) -> Result<Usage> {
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut size: i64 = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let md = match std::fs::symlink_metadata(&path) {
            Ok(md) => md,
            Err(e) if e.kind() == ErrorKind::NotFound && path != root => continue,
            Err(e) => return Err(Error::io(&path, e)),
        };
        if seen.insert((md.dev(), md.ino())) {
            size = size
                .saturating_add(i64::try_from(md.blocks().saturating_mul(512)).unwrap_or(i64::MAX));
        }
        if md.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&path, e))?;
                stack.push(entry.path());
            }
        }
    }
    Ok(Usage {
        size,
        inodes: i64::try_from(seen.len()).unwrap_or(i64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_hard_links_once_and_the_root_itself() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("fs");
        std::fs::create_dir(&root).unwrap();
        assert_eq!(usage(&root).unwrap().inodes, 1);
        std::fs::write(root.join("a"), vec![7u8; 100_000]).unwrap();
        std::fs::hard_link(root.join("a"), root.join("b")).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink("../a", root.join("sub/link")).unwrap();
        let u = usage(&root).unwrap();
        assert_eq!(u.inodes, 4, "root, a=b, sub, link");
        let blocks: u64 = ["", "a", "sub", "sub/link"]
            .iter()
            .map(|p| std::fs::symlink_metadata(root.join(p)).unwrap().blocks() * 512)
            .sum();
        assert_eq!(u.size, blocks as i64);
        assert!(u.size >= 100_000);
        assert!(usage(&d.path().join("missing")).is_err());
    }

    #[test]
    fn make_builds_the_directories_of_each_kind() {
        let d = tempfile::tempdir().unwrap();
        let dirs = Dirs::open(d.path()).unwrap();
        let a = dirs.make(1, Kind::Active, None).unwrap();
        assert!(a.join("fs").is_dir() && a.join("work").is_dir());
        let mode = std::fs::metadata(a.join("work")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o711);
        let v = dirs.make(2, Kind::View, Some(1)).unwrap();
        assert!(v.join("fs").is_dir() && !v.join("work").exists());
        // A leftover at the id is replaced, and no temporary name stays behind.
        std::fs::write(dirs.fs(2).join("stale"), b"x").unwrap();
        dirs.make(2, Kind::View, None).unwrap();
        assert!(!dirs.fs(2).join("stale").exists());
        let names: Vec<_> = std::fs::read_dir(dirs.snapshots())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
