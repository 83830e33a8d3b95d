//! The index cache: indexes that cost a pass over an archive's data to make (a seekable
//! tar.zst without a pkgfs index), kept on disk so the next mount reads them instead.
//! Layouts keep what else a mount would have to learn again there too: a package's
//! digest (`layout::cached_digest`), what a Python interpreter answered
//! (`layout::python::interp`, through [`IndexCache::key_for`]).
//!
//! An entry is keyed by the format, the blob's version ([`Blob::version`]: device, inode,
//! size and modification time of a local file) and whatever else the format wants to
//! match (a hash of the seek table): a changed archive has another key and is never
//! served from a stale index. The key is also written inside the file and checked on
//! load, so a collision of file names can only cost a rebuild. Files are written to a
//! temporary name and renamed, so concurrent mounts never read half of one; the cache
//! is best effort (a read-only or full disk costs speed, not service).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::blob::Blob;

/// First line of every cache file.
const MAGIC: &[u8] = b"PKGFS-INDEX-CACHE 2\n";

/// Where indexes are kept.
#[derive(Clone, Debug)]
pub struct IndexCache {
    dir: PathBuf,
}

/// One entry's place in the cache.
#[derive(Clone, Debug)]
pub struct CacheKey {
    path: PathBuf,
    key: String,
}

impl CacheKey {
    /// The file it is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// FNV-1a, 64 bits: stable across builds and machines (unlike `DefaultHasher`).
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl IndexCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: PathBuf) -> Self {
        IndexCache { dir }
    }

    /// The default location: `$XDG_CACHE_HOME/pkgfs/index`, else `~/.cache/pkgfs/index`.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
        Some(base.join("pkgfs").join("index"))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the index of `blob` in `format` is kept; `extra` must match too.
    pub fn key(&self, format: &str, blob: &dyn Blob, extra: &str) -> CacheKey {
        self.key_for(format, blob.version(), extra)
    }

    /// Where what was learnt of something other than a blob is kept: `version` names
    /// the thing's state (a file's identity), `extra` the question.
    pub fn key_for(&self, format: &str, version: &str, extra: &str) -> CacheKey {
        let key = format!("{format}\n{version}\n{extra}");
        let name = format!(
            "{format}-{:016x}-{:08x}.idx",
            fnv64(key.as_bytes()),
            crc32fast::hash(key.as_bytes())
        );
        CacheKey {
            path: self.dir.join(name),
            key,
        }
    }

    /// The cached bytes, if there is a valid entry.
    pub fn load(&self, k: &CacheKey) -> Option<Vec<u8>> {
        use std::io::Read as _;
        let mut f = std::fs::File::open(&k.path).ok()?;
        let head_len = MAGIC.len() + k.key.len() + 1;
        let mut head = vec![0u8; head_len];
        f.read_exact(&mut head).ok()?;
        if !head.starts_with(MAGIC)
            || &head[MAGIC.len()..head_len - 1] != k.key.as_bytes()
            || head[head_len - 1] != b'\n'
        {
            return None;
        }
        // The rest straight into a buffer of its size (entries run to megabytes: no
        // second copy to drop the header).
        let len = f.metadata().ok()?.len().checked_sub(head_len as u64)?;
        let mut bytes = crate::io::memory::bulk_vec(usize::try_from(len).ok()?);
        f.read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Store `bytes` under `k` (best effort: the caller logs a failure).
    pub fn store(&self, k: &CacheKey, bytes: &[u8]) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut out = Vec::with_capacity(MAGIC.len() + k.key.len() + 1 + bytes.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(k.key.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(bytes);
        let tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::fs::write(tmp.path(), &out)?;
        tmp.persist(&k.path).map_err(|e| Error::Io(e.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::blob::Bytes;

    #[test]
    fn entries_round_trip_and_never_answer_for_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let c = IndexCache::new(dir.path().join("idx"));
        let a = Bytes::new("a", b"one".to_vec());
        let b = Bytes::new("b", b"two".to_vec());
        let ka = c.key("tar.gz", &a, "");
        assert!(c.load(&ka).is_none());
        c.store(&ka, b"index of a").unwrap();
        assert_eq!(c.load(&ka).unwrap(), b"index of a");
        // Another version, another format, another extra: other keys.
        assert!(c.load(&c.key("tar.gz", &b, "")).is_none());
        assert!(c.load(&c.key("zip", &a, "")).is_none());
        assert!(c.load(&c.key("tar.gz", &a, "x")).is_none());
        // A file under the right name with another key inside is not used.
        let kb = c.key("tar.gz", &b, "");
        std::fs::copy(ka.path(), kb.path()).unwrap();
        assert!(c.load(&kb).is_none());
        // Nor a damaged one.
        std::fs::write(ka.path(), b"PKGFS").unwrap();
        assert!(c.load(&ka).is_none());
    }
}
