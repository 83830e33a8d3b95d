//! `--verify ALLOWED_SIGNERS`: a source is mounted only under a seal signed by an allowed
//! signer (see [`crate::seal`]), only the archives it lists, each read through an
//! [`io::verified::VerifiedBlob`](crate::io::verified::VerifiedBlob) that checks every
//! byte against the archive's tree before it is used. The newest revision accepted for
//! each source is kept on this machine, and an older one is refused (rollback).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::remote::{self, RemoteRef};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::remote::Remote;
use crate::io::verified::{Checks, VerifiedBlob};
use crate::seal::sign::AllowedSigners;
use crate::seal::{self, Seal, Sealed};

/// How a mount verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyConfig {
    /// The keys it trusts.
    pub signers: Arc<AllowedSigners>,
    /// Where the newest accepted revision of each source is kept (None: nowhere, no
    /// rollback check).
    pub state: Option<PathBuf>,
    /// Take a seal older than the one accepted before.
    pub allow_rollback: bool,
    /// The root file of a local source's seal, when not in the source.
    pub seal_file: Option<PathBuf>,
}

impl VerifyConfig {
    /// Where accepted revisions are kept by default: `$XDG_STATE_HOME/pkgfs/seals`, else
    /// `~/.local/state/pkgfs/seals`.
    pub fn default_state() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
        Some(base.join("pkgfs/seals"))
    }
}

/// A source's seal, checked.
pub struct SealedSource {
    /// The source.
    pub source: String,
    /// The seal.
    pub seal: Arc<Seal>,
    /// Its signer.
    pub signer: String,
    /// Its checks so far.
    pub checks: Arc<Checks>,
    /// Reads a tree file by name (`TREE` hex), at most the given bytes.
    trees: ReadTree,
}

/// Reads a tree file by name (`TREE` hex), at most the given bytes.
type ReadTree = Arc<dyn Fn(&str, u64) -> Result<Vec<u8>> + Send + Sync>;

pub use crate::io::verified::sealed_version;

impl std::fmt::Debug for SealedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSource")
            .field("source", &self.source)
            .field("revision", &self.seal.revision)
            .finish_non_exhaustive()
    }
}

impl SealedSource {
    /// The tree root (hex) of the local archive at `path`, if the seal lists it.
    pub fn tree_of(&self, path: &Path) -> Option<String> {
        let name = path.file_name()?.to_string_lossy();
        self.seal.get(&name).map(|a| seal::hex(&a.tree))
    }

    /// The local archive at `path`, opened as `blob`, checked against the seal.
    pub fn wrap_local(&self, path: &Path, blob: Arc<dyn Blob>) -> Result<Arc<dyn Blob>> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.wrap(&name, blob)
    }

    /// The seal's line for the archive `name`; why there is none.
    pub(super) fn listed(&self, name: &str) -> Result<&Sealed> {
        self.seal.get(name).ok_or_else(|| {
            Error::Corrupt(format!(
                "not in the seal of {} (unsealed archives are not mounted)",
                self.source
            ))
        })
    }

    /// What status shows.
    pub fn row(&self) -> SealRow {
        use std::sync::atomic::Ordering::Relaxed;
        SealRow {
            source: self.source.clone(),
            signer: self.signer.clone(),
            revision: self.seal.revision,
            archives: self.seal.archives.len(),
            blocks_checked: self.checks.stats.blocks.load(Relaxed),
            bytes_checked: self.checks.stats.bytes.load(Relaxed),
            failures: self.checks.stats.failures.load(Relaxed),
        }
    }

    /// `blob` (the archive `name` of the source) checked against the seal, or why it
    /// may not be mounted.
    pub(super) fn wrap(&self, name: &str, blob: Arc<dyn Blob>) -> Result<Arc<dyn Blob>> {
        let a = self.listed(name)?;
        if blob.size() != a.size {
            return Err(Error::Corrupt(format!(
                "{} bytes, its seal says {}",
                blob.size(),
                a.size
            )));
        }
        let block = self.seal.block;
        let tree = seal::hex(&a.tree);
        let a: Sealed = a.clone();
        let trees = self.trees.clone();
        let load = Box::new(move || {
            if !a.has_tree_file(block) {
                return Ok(seal::small_tree(&a, block));
            }
            let bytes = trees(&seal::hex(&a.tree), a.blocks(block) * 32)?;
            seal::parse_tree(&bytes, &a, block)
        });
        Ok(Arc::new(VerifiedBlob::new(
            blob,
            block,
            &tree,
            load,
            self.checks.clone(),
        )))
    }
}

/// The seals of a mount's sources, as the last listing accepted them.
#[derive(Default)]
pub struct Seals(pub std::sync::Mutex<Vec<Arc<SealedSource>>>);

impl std::fmt::Debug for Seals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seals").finish_non_exhaustive()
    }
}

impl SealState for Seals {
    fn seals(&self) -> Vec<SealRow> {
        crate::sync::lock(&self.0).iter().map(|s| s.row()).collect()
    }
}

/// Read a source's seal, check its signature and revision.
fn accept(
    cfg: &VerifyConfig,
    source: &str,
    root: &[u8],
    sig: &[u8],
    trees: ReadTree,
) -> Result<SealedSource> {
    let signer = cfg
        .signers
        .verify(root, sig)
        .map_err(|e| Error::Corrupt(format!("{source}: its seal is refused: {e}")))?;
    let seal = Seal::parse(root).map_err(|e| Error::Corrupt(format!("{source}: {e}")))?;
    if let Some(state) = &cfg.state {
        check_revision(state, source, seal.revision, cfg.allow_rollback)?;
    }
    log::info!(
        "{source}: seal revision {} by {signer}, {} archives",
        seal.revision,
        seal.archives.len()
    );
    Ok(SealedSource {
        source: source.to_string(),
        seal: Arc::new(seal),
        signer,
        checks: Arc::default(),
        trees,
    })
}

/// Refuse a revision older than the newest accepted for `source`; remember a newer one.
///
/// The state file is this check's memory: one that cannot be read or parsed is refused,
/// not taken as "nothing accepted before", which would switch the check off for anyone
/// able to damage it (`allow` takes the seal and writes the file anew).
fn check_revision(state: &Path, source: &str, revision: u64, allow: bool) -> Result<()> {
    let file = state.join(format!("{:016x}", fnv64(source.as_bytes())));
    let damaged = |why: String| {
        Error::Corrupt(format!(
            "{source}: the state file {} of the seal revisions accepted here is {why}: the \
             rollback check cannot be made (remove the file, or mount once with \
             --allow-rollback, to accept this seal's revision {revision} anew)",
            file.display()
        ))
    };
    let before = match std::fs::read_to_string(&file) {
        Ok(t) => {
            let mut l = t.lines();
            match (l.next(), l.next().map(str::parse::<u64>), l.next()) {
                (Some(s), Some(Ok(r)), None) if t.ends_with('\n') => match s == source {
                    true => Ok(Some(r)),
                    false => Err(damaged(format!("of another source ({s:?})"))),
                },
                _ => Err(damaged("damaged".into())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(damaged(format!("unreadable ({e})"))),
    };
    let before = match before {
        Ok(b) => b,
        Err(e) if allow => {
            log::warn!("{e}; taking it (--allow-rollback)");
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(b) = before
        && revision < b
    {
        if !allow {
            return Err(Error::Corrupt(format!(
                "{source}: its seal is revision {revision}, older than revision {b} accepted \
                 on this machine before (a rollback; --allow-rollback takes it)"
            )));
        }
        log::warn!("{source}: taking seal revision {revision}, older than {b} (--allow-rollback)");
        return Ok(());
    }
    if before != Some(revision) {
        std::fs::create_dir_all(state).map_err(|e| Error::Io(e).with_path(state))?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, format!("{source}\n{revision}\n"))
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| Error::Io(e).with_path(&file))?;
    }
    Ok(())
}

fn fnv64(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x100000001b3)
    })
}

/// Read at most `limit` bytes of a local file, refusing a bigger one.
fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io(e).with_path(path))?;
    if meta.len() > limit {
        return Err(Error::Corrupt(format!(
            "{}: {} bytes, more than the {limit} it may have",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| Error::Io(e).with_path(path))
}

/// The seal of local directory `dir`, checked.
pub fn open_local(cfg: &VerifyConfig, dir: &Path) -> Result<SealedSource> {
    let root_path = cfg
        .seal_file
        .clone()
        .unwrap_or_else(|| dir.join(seal::SEAL_FILE));
    let sig_path = seal::with_suffix(&root_path, seal::SIG_SUFFIX);
    let trees_dir = seal::with_suffix(&root_path, seal::TREES_SUFFIX);
    let missing = |p: &Path, e: Error| match e {
        Error::WithPath(_, inner) if matches!(*inner, Error::Io(ref io) if io.kind() == std::io::ErrorKind::NotFound) => {
            Error::Format(format!(
                "{}: no seal ({} is missing)",
                dir.display(),
                p.display()
            ))
        }
        e => e,
    };
    let root = read_limited(&root_path, seal::MAX_ROOT).map_err(|e| missing(&root_path, e))?;
    let sig = read_limited(&sig_path, 64 << 10).map_err(|e| missing(&sig_path, e))?;
    let source = std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string();
    accept(
        cfg,
        &source,
        &root,
        &sig,
        Arc::new(move |name: &str, limit: u64| read_limited(&trees_dir.join(name), limit)),
    )
}

/// The seal of a remote store as fetched, not yet checked (see [`open_remote`]).
pub struct RemoteSeal {
    root: Vec<u8>,
    sig: Vec<u8>,
    objects: remote::Objects,
}

/// Fetch the seal of remote store `r` (the root and its signature in one round trip):
/// by name, without its listing, so that it is fetched while the store is listed.
pub fn fetch_remote(r: &RemoteRef, source: &str, rt: &Arc<Remote>) -> Result<RemoteSeal> {
    let objects = remote::Objects::of(r, rt)?;
    let sig_name = format!("{}{}", seal::SEAL_FILE, seal::SIG_SUFFIX);
    let mut got = objects
        .get_all(&[(seal::SEAL_FILE, seal::MAX_ROOT), (&sig_name, 64 << 10)])?
        .into_iter();
    let mut next = |name: &str| {
        got.next()
            .flatten()
            .ok_or_else(|| Error::Format(format!("{source}: no seal ({name} is missing)")))
    };
    let root = next(seal::SEAL_FILE)?;
    let sig = next(&sig_name)?;
    Ok(RemoteSeal { root, sig, objects })
}

/// The seal of a remote store, fetched by [`fetch_remote`], checked.
pub fn open_remote(cfg: &VerifyConfig, source: &str, fetched: RemoteSeal) -> Result<SealedSource> {
    let RemoteSeal { root, sig, objects } = fetched;
    let trees = Arc::new(move |name: &str, limit: u64| -> Result<Vec<u8>> {
        objects.get(
            &format!("{}{}/{name}", seal::SEAL_FILE, seal::TREES_SUFFIX),
            limit,
        )
    });
    accept(cfg, source, &root, &sig, trees)
}

/// The seals a verified mount took, as `pkgfs status` shows them (kept by [`Seals`]).
pub trait SealState: Send + Sync + std::fmt::Debug {
    /// One row per sealed source.
    fn seals(&self) -> Vec<SealRow>;
}

/// What the report says of a sealed source.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SealRow {
    /// The source.
    pub source: String,
    /// Who signed it (the allowed signer's principals).
    pub signer: String,
    /// Its revision.
    pub revision: u64,
    /// Archives it lists.
    pub archives: usize,
    /// Blocks checked so far.
    pub blocks_checked: u64,
    /// Their bytes.
    pub bytes_checked: u64,
    /// Blocks that did not match the seal.
    pub failures: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_file(state: &Path, source: &str) -> PathBuf {
        state.join(format!("{:016x}", fnv64(source.as_bytes())))
    }

    #[test]
    fn an_accepted_revision_is_kept_and_an_older_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("seals");
        let src = "/srv/store";
        check_revision(&state, src, 5, false).unwrap();
        assert_eq!(
            std::fs::read_to_string(state_file(&state, src)).unwrap(),
            "/srv/store\n5\n"
        );
        // The same and a newer one are taken; the newer one is kept.
        check_revision(&state, src, 5, false).unwrap();
        check_revision(&state, src, 9, false).unwrap();
        assert_eq!(
            std::fs::read_to_string(state_file(&state, src)).unwrap(),
            "/srv/store\n9\n"
        );
        let err = check_revision(&state, src, 8, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("revision 8, older than revision 9") && err.contains("--allow-rollback"),
            "{err}"
        );
        // --allow-rollback takes it and keeps the newest.
        check_revision(&state, src, 8, true).unwrap();
        assert_eq!(
            std::fs::read_to_string(state_file(&state, src)).unwrap(),
            "/srv/store\n9\n"
        );
        // Another source has its own memory.
        check_revision(&state, "/srv/other", 1, false).unwrap();
    }

    #[test]
    fn a_damaged_state_file_is_refused_not_forgotten() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("seals");
        let src = "/srv/store";
        check_revision(&state, src, 9, false).unwrap();
        let file = state_file(&state, src);
        for (what, text) in [
            ("empty", ""),
            ("no revision", "/srv/store\n"),
            ("not a number", "/srv/store\nnine\n"),
            ("truncated", "/srv/store\n9"),
            ("another source", "/srv/other\n9\n"),
            ("garbage", "\u{0}\u{1}\u{2}"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = check_revision(&state, src, 3, false)
                .expect_err(what)
                .to_string();
            assert!(
                err.contains(&file.display().to_string())
                    && err.contains("remove the file")
                    && err.contains("--allow-rollback"),
                "{what}: {err}"
            );
            // Left as it was for its owner to look at.
            assert_eq!(std::fs::read_to_string(&file).unwrap(), text, "{what}");
        }
        // Unreadable: a directory where the file should be.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let err = check_revision(&state, src, 3, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unreadable"), "{err}");
        std::fs::remove_dir(&file).unwrap();
        // --allow-rollback takes the seal and writes the file anew.
        std::fs::write(&file, "garbage").unwrap();
        check_revision(&state, src, 3, true).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "/srv/store\n3\n");
    }
}
