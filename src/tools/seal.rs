//! `pkgfs seal DIR --key KEY`: seal a directory of archives (see [`crate::seal`]): hash
//! every archive in blocks on all cores, write each tree file, then the root and its
//! signature, each by rename. Upload the directory's `pkgfs.seal`, `pkgfs.seal.sig` and
//! `pkgfs.seal.d/` beside the archives to seal a remote store.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::seal::{self, Hash, Seal, Sealed};

/// What `pkgfs seal` is told.
#[derive(Debug, Clone)]
pub struct SealConfig {
    /// The directory of archives.
    pub dir: PathBuf,
    /// The OpenSSH private key that signs.
    pub key: PathBuf,
    /// The revision (default: now, and above the seal there, if any).
    pub revision: Option<u64>,
    /// Where the root goes (default: DIR/pkgfs.seal); its signature and trees beside it.
    pub seal_file: Option<PathBuf>,
    /// Bytes per block.
    pub block: u64,
    /// Hashing threads.
    pub threads: usize,
}

/// What was sealed.
#[derive(Debug)]
pub struct SealReport {
    /// Archives listed.
    pub archives: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The revision written.
    pub revision: u64,
    /// The root file.
    pub path: PathBuf,
}

/// The line `pkgfs seal` prints when it is done.
impl std::fmt::Display for SealReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: revision {}, {} archives, {} bytes sealed",
            self.path.display(),
            self.revision,
            self.archives,
            self.bytes
        )
    }
}

/// Seal `cfg.dir`.
pub fn seal(cfg: &SealConfig) -> Result<SealReport> {
    let root = cfg
        .seal_file
        .clone()
        .unwrap_or_else(|| cfg.dir.join(seal::SEAL_FILE));
    let trees = seal::with_suffix(&root, seal::TREES_SUFFIX);
    let sig_path = seal::with_suffix(&root, seal::SIG_SUFFIX);
    let names = archive_names(&cfg.dir)?;
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Hashed>>> = Mutex::new((0..names.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..cfg.threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = crate::sync::lock(&next);
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(name) = names.get(i) else { break };
                    let r = hash_file(&cfg.dir.join(name), name, cfg.block);
                    crate::sync::lock(&results)[i] = Some(r);
                }
            });
        }
    });
    let mut archives = Vec::with_capacity(names.len());
    let mut bytes = 0;
    std::fs::create_dir_all(&trees).map_err(|e| Error::Io(e).with_path(&trees))?;
    for r in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let (a, leaves) = r.ok_or_else(|| Error::Internal("a file was not hashed".into()))??;
        if a.has_tree_file(cfg.block) {
            let path = trees.join(seal::hex(&a.tree));
            if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(leaves.len() as u64 * 32) {
                write_atomically(&path, &leaves.concat())?;
            }
        }
        bytes += a.size;
        archives.push(a);
    }
    let previous = std::fs::read(&root)
        .ok()
        .and_then(|b| Seal::parse(&b).ok())
        .map(|s| s.revision);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let revision = match (cfg.revision, previous) {
        (Some(r), Some(p)) if r <= p => {
            log::warn!(
                "revision {r} is not above the seal's there ({p}): mounts that accepted {p} refuse it"
            );
            r
        }
        (Some(r), _) => r,
        (None, Some(p)) => now.max(p + 1),
        (None, None) => now,
    };
    let seal = Seal {
        revision,
        block: cfg.block,
        archives,
    };
    let text = seal.to_text();
    let sig = seal::sign::sign(&cfg.key, text.as_bytes())?;
    // The signature first: a reader between the two renames finds a root its signature
    // does not match and refuses it (then tries again), never an unsigned one accepted.
    write_atomically(&sig_path, sig.as_bytes())?;
    write_atomically(&root, text.as_bytes())?;
    Ok(SealReport {
        archives: seal.archives.len(),
        bytes,
        revision,
        path: root,
    })
}

/// An archive hashed: its seal line and block hashes.
type Hashed = Result<(Sealed, Vec<Hash>)>;

/// The archives of `dir` as a mount lists them: files (or links to files) whose names do
/// not start with a dot, less the seal's own files; in byte order.
fn archive_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::Io(e).with_path(dir))? {
        let e = e.map_err(|e| Error::Io(e).with_path(dir))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return Err(Error::Unsupported(format!(
                "{}: a file name that is not UTF-8 cannot be sealed",
                e.path().display()
            )));
        };
        if name.starts_with('.') || name.starts_with(seal::SEAL_FILE) {
            continue;
        }
        if !std::fs::metadata(e.path()).is_ok_and(|m| m.is_file()) {
            continue;
        }
        seal::check_name(name)
            .map_err(|m| Error::Unsupported(format!("{}: {m}", e.path().display())))?;
        names.push(name.to_string());
    }
    names.sort();
    Ok(names)
}

fn hash_file(path: &Path, name: &str, block: u64) -> Result<(Sealed, Vec<Hash>)> {
    let f = std::fs::File::open(path).map_err(|e| Error::Io(e).with_path(path))?;
    let size = f
        .metadata()
        .map_err(|e| Error::Io(e).with_path(path))?
        .len();
    let (leaves, sha256) =
        seal::hash_reader(std::io::BufReader::with_capacity(1 << 20, f), size, block)
            .map_err(|e| e.with_path(path))?;
    Ok((
        Sealed {
            name: name.to_string(),
            size,
            sha256,
            tree: seal::tree_root(block, size, &leaves),
        },
        leaves,
    ))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut t = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::Io(e).with_path(dir))?;
    t.write_all(bytes)
        .map_err(|e| Error::Io(e).with_path(path))?;
    // Served beside the archives (a web server's workers, an S3 upload): readable by
    // all, as a file written under the usual umask is; a temporary file is 0600.
    use std::os::unix::fs::PermissionsExt;
    t.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::Io(e).with_path(path))?;
    t.persist(path)
        .map_err(|e| Error::Io(e.error).with_path(path))?;
    Ok(())
}
