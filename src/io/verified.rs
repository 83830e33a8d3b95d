//! Reads checked against a seal (`--verify`): a [`Blob`] over another whose every byte is
//! hashed, block by block, and compared with the block hashes a signed seal gives,
//! before any of it is returned, so nothing unchecked reaches a decoder, the block cache
//! or the kernel. Below it the bytes may come from anywhere (a local file, a server, the
//! disk cache of fetched ranges): all are read through it, so a byte read back from the
//! disk cache is checked again.
//!
//! A read is widened to whole blocks; the blocks checked are kept (trusted memory, a
//! least-recently-used set of [`KEPT_BYTES`] shared by a source's archives), so the
//! small reads formats make one after another (a ZIP's local header, then its name,
//! then its data), and those of readers and read-ahead interleaved, hash a block once. The block hashes themselves are
//! loaded on first read (a remote store's tree file is fetched then) and checked
//! against the tree root by the loader.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use sha2::{Digest as _, Sha256};

use super::blob::Blob;
use super::cache::{Block, BlockCache};
use crate::error::{Error, Result};

/// A block hash.
pub type Hash = [u8; 32];

/// Bytes of checked blocks kept in memory, per sealed source: enough for the archives
/// being read at once by the readers and the walk's read-ahead. Measured on the 609
/// packages' read-all: with the last four blocks kept per archive, 886 MB were hashed
/// for 267 MB of archives (3.3x); with 32 MiB shared by all, 284 MB (1.06x).
pub const KEPT_BYTES: u64 = 32 << 20;

/// What the blobs of one sealed source share: the counts `pkgfs status` shows, and the
/// blocks checked and kept in memory: reads come in pieces smaller than a block and not
/// in order (a ZIP's local header, its name, then its data; readers and the read-ahead
/// at once), and a block kept (in trusted memory, by (blob, block), least recently used
/// out past [`KEPT_BYTES`]) is neither read nor hashed again.
pub struct Checks {
    /// The counts.
    pub stats: VerifyStats,
    kept: BlockCache<(u64, u64)>,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            stats: VerifyStats::default(),
            kept: BlockCache::new(KEPT_BYTES),
        }
    }
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checks")
            .field("stats", &self.stats)
            .field("kept_bytes", &self.kept.bytes())
            .finish()
    }
}

impl Checks {
    /// Keep block `block` of blob `blob`, checked, unless it is kept already.
    fn keep(&self, blob: u64, block: u64, bytes: &[u8]) {
        if !self.kept.contains(&(blob, block)) {
            self.kept
                .insert((blob, block), Arc::new(Block::new(bytes.to_vec())));
        }
    }
}

/// The version of the bytes of a blob of version `inner` read through the tree of root
/// `tree` (hex): indexes cached from checked bytes are never taken for unchecked ones.
pub fn sealed_version(inner: &str, tree: &str) -> String {
    format!("{inner} sealed:{tree}")
}

/// Ids of verified blobs, unique in the process (the key of their kept blocks).
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the checks of one store came to (shown by `pkgfs status`).
#[derive(Debug, Default)]
pub struct VerifyStats {
    /// Blocks hashed and found right.
    pub blocks: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Blocks that did not match their seal.
    pub failures: AtomicU64,
}

/// Loads an archive's block hashes (checked against its tree root).
pub type LoadTree = Box<dyn Fn() -> Result<Vec<Hash>> + Send + Sync>;

/// A blob whose reads are checked against block hashes.
pub struct VerifiedBlob {
    inner: Arc<dyn Blob>,
    version: String,
    block: u64,
    tree: Arc<Tree>,
    /// Its key among the kept blocks.
    id: u64,
    checks: Arc<Checks>,
}

/// An archive's block hashes, loaded once (concurrent callers wait for the one that
/// loads); shared with the gate of what its remote blob may keep.
struct Tree {
    name: std::path::PathBuf,
    size: u64,
    block: u64,
    load: LoadTree,
    leaves: Mutex<Option<Arc<Vec<Hash>>>>,
    loading: Mutex<()>,
}

impl Tree {
    fn loaded(&self) -> Option<Arc<Vec<Hash>>> {
        crate::sync::lock(&self.leaves).clone()
    }

    fn get(&self) -> Result<Arc<Vec<Hash>>> {
        if let Some(l) = self.loaded() {
            return Ok(l);
        }
        let _one = crate::sync::lock(&self.loading);
        if let Some(l) = self.loaded() {
            return Ok(l);
        }
        let l = Arc::new((self.load)()?);
        let want = self.size.div_ceil(self.block) as usize;
        if l.len() != want {
            return Err(Error::Corrupt(format!(
                "{}: its seal has {} blocks, it has {want}",
                self.name.display(),
                l.len()
            )));
        }
        *crate::sync::lock(&self.leaves) = Some(l.clone());
        Ok(l)
    }

    /// How much of `bytes`, fetched at `start`, is whole blocks that match: what the
    /// blob below may keep (in memory, in the disk cache). A range that does not start
    /// on a block, or a block cut short (but the blob's last), stops it.
    fn vouch(&self, start: u64, bytes: &[u8], can_wait: bool) -> usize {
        let leaves = match (self.loaded(), can_wait) {
            (Some(l), _) => l,
            (None, true) => match self.get() {
                Ok(l) => l,
                Err(_) => return 0,
            },
            (None, false) => return 0,
        };
        if !start.is_multiple_of(self.block) {
            return 0;
        }
        let mut ok = 0usize;
        for chunk in bytes.chunks(self.block as usize) {
            let at = start + ok as u64;
            if (chunk.len() as u64) < self.block && at + chunk.len() as u64 != self.size {
                break;
            }
            let want = leaves.get((at / self.block) as usize);
            let got: Hash = Sha256::digest(chunk).into();
            if want != Some(&got) {
                break;
            }
            ok += chunk.len();
        }
        ok
    }
}

impl std::fmt::Debug for VerifiedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedBlob")
            .field("inner", &self.inner.name())
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl VerifiedBlob {
    /// `ranges` widened to whole blocks (a block is checked whole).
    fn whole_blocks(&self, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let b = self.block;
        ranges
            .iter()
            .map(|&(s, e)| (s / b * b, e.div_ceil(b).saturating_mul(b).min(self.size())))
            .collect()
    }

    /// `inner` checked in blocks of `block` bytes against the hashes `load` gives;
    /// `tree` (the tree root, hex) is part of its version, so that indexes cached from
    /// checked bytes are never taken for unchecked ones or the reverse.
    pub fn new(
        inner: Arc<dyn Blob>,
        block: u64,
        tree: &str,
        load: LoadTree,
        checks: Arc<Checks>,
    ) -> VerifiedBlob {
        let t = Arc::new(Tree {
            name: inner.name().to_path_buf(),
            size: inner.size(),
            block,
            load,
            leaves: Mutex::new(None),
            loading: Mutex::new(()),
        });
        let id = NEXT_ID.fetch_add(1, Relaxed);
        // Whatever the blob below fetches is kept (memory, disk cache) only once checked;
        // the blocks that pass are kept as checked here too, so the read that wants them
        // (or the read-ahead's fetch of them) neither reads nor hashes them again.
        let (gate, vouched) = (t.clone(), checks.clone());
        inner.set_keep_gate(Arc::new(move |start, bytes, can_wait| {
            let ok = gate.vouch(start, bytes, can_wait);
            for (i, c) in bytes[..ok].chunks(block as usize).enumerate() {
                vouched.stats.blocks.fetch_add(1, Relaxed);
                vouched.stats.bytes.fetch_add(c.len() as u64, Relaxed);
                vouched.keep(id, start / block + i as u64, c);
            }
            ok
        }));
        VerifiedBlob {
            version: sealed_version(inner.version(), tree),
            inner,
            block,
            tree: t,
            id,
            checks,
        }
    }

    fn leaves(&self) -> Result<Arc<Vec<Hash>>> {
        self.tree.get()
    }

    /// Run `read` (bytes of the blob) and return the block hashes: the first time, from
    /// a server, both at once (a remote store's tree file and the archive's first bytes
    /// in one round trip, not two).
    fn with_leaves(&self, read: impl FnOnce() -> Result<()> + Send) -> Result<Arc<Vec<Hash>>> {
        if self.tree.loaded().is_some() || !self.inner.round_trips() {
            read()?;
            return self.leaves();
        }
        std::thread::scope(|s| {
            let tree = s.spawn(|| self.leaves());
            let data = read();
            let tree = tree
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("loading a tree panicked".into())));
            data.and(tree)
        })
    }

    fn kept(&self, b: u64) -> Option<Arc<Block>> {
        self.checks.kept.get(&(self.id, b))
    }

    /// The aligned range of blocks covering `[off, off + len)`.
    fn span(&self, off: u64, len: usize) -> (u64, u64) {
        let first = off / self.block;
        let end = (off + len as u64).min(self.inner.size());
        let last = end.saturating_sub(1) / self.block;
        (first, last)
    }

    /// Make `data`, blocks `first..` of the blob as read from below, checked bytes: a
    /// block the blob below's keep gate checked as it fetched it (kept since) is taken
    /// from what was kept, not hashed again; the others are checked and kept.
    fn settle(&self, first: u64, data: &mut [u8], leaves: &[Hash]) -> Result<()> {
        for (i, chunk) in data.chunks_mut(self.block as usize).enumerate() {
            let b = first + i as u64;
            match self.kept(b) {
                Some(k) if k.len() == chunk.len() => chunk.copy_from_slice(&k),
                _ => {
                    self.check(b, chunk, leaves)?;
                    self.checks.keep(self.id, b, chunk);
                }
            }
        }
        Ok(())
    }

    /// [`Self::settle`], and for a blob that fetches (whose copies below, in memory or in
    /// the disk cache, a failed check has just forgotten) once more from the source:
    /// a damaged cached copy costs a fetch, not an EIO, and a source fixed since is read.
    fn settle_or_refetch(
        &self,
        first: u64,
        start: u64,
        data: &mut [u8],
        leaves: &[Hash],
    ) -> Result<()> {
        match self.settle(first, data, leaves) {
            Err(Error::Corrupt(_)) if self.inner.round_trips() => {
                log::info!(
                    "{}: fetching bytes {start}..{} again",
                    self.inner.name().display(),
                    start + data.len() as u64
                );
                self.inner.read_exact_at(data, start)?;
                self.settle(first, data, leaves)
            }
            r => r,
        }
    }

    /// Check `data`, blocks `first..` of the blob, against the seal.
    fn check(&self, first: u64, data: &[u8], leaves: &[Hash]) -> Result<()> {
        for (i, chunk) in data.chunks(self.block as usize).enumerate() {
            let b = first + i as u64;
            let want = leaves.get(b as usize).ok_or_else(|| {
                Error::Corrupt(format!(
                    "{}: block {b} beyond its seal",
                    self.inner.name().display()
                ))
            })?;
            let got: Hash = Sha256::digest(chunk).into();
            if &got != want {
                self.checks.stats.failures.fetch_add(1, Relaxed);
                // Whatever copy those bytes came from must not serve them again.
                self.inner.forget();
                let e = Error::Corrupt(format!(
                    "{}: block {b} (bytes {}..{}) does not match its seal",
                    self.inner.name().display(),
                    b * self.block,
                    b * self.block + chunk.len() as u64
                ));
                log::warn!("{e}");
                return Err(e);
            }
            self.checks.stats.blocks.fetch_add(1, Relaxed);
            self.checks
                .stats
                .bytes
                .fetch_add(chunk.len() as u64, Relaxed);
        }
        Ok(())
    }

    /// Aligned buffer for blocks `first..=last`.
    fn aligned(&self, first: u64, last: u64) -> (u64, Vec<u8>) {
        let start = first * self.block;
        let end = ((last + 1) * self.block).min(self.inner.size());
        (start, vec![0u8; (end - start) as usize])
    }
}

/// Copy the part of `data` (bytes from `data_start` of the blob) that falls in the
/// read `[offset, end)` into `buf` (the read's buffer).
fn copy_block(buf: &mut [u8], offset: u64, end: u64, data_start: u64, data: &[u8]) {
    let a = offset.max(data_start);
    let b = end.min(data_start + data.len() as u64);
    if a < b {
        buf[(a - offset) as usize..(b - offset) as usize]
            .copy_from_slice(&data[(a - data_start) as usize..(b - data_start) as usize]);
    }
}

impl Blob for VerifiedBlob {
    fn name(&self) -> &Path {
        self.inner.name()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if offset + buf.len() as u64 > self.size() {
            return Err(Error::Format(format!(
                "{}: read past its end",
                self.name().display()
            )));
        }
        let (first, last) = self.span(offset, buf.len());
        // The blocks kept from earlier reads serve as they are (a read that starts in
        // the block where the last one ended hashes that block once); each run of the
        // others is read in one piece and checked.
        let end = offset + buf.len() as u64;
        let mut b = first;
        while b <= last {
            if let Some(bytes) = self.kept(b) {
                copy_block(buf, offset, end, b * self.block, &bytes);
                b += 1;
                continue;
            }
            let mut run_end = b;
            while run_end < last && self.kept(run_end + 1).is_none() {
                run_end += 1;
            }
            let (start, mut data) = self.aligned(b, run_end);
            let leaves = self.with_leaves(|| self.inner.read_exact_at(&mut data, start))?;
            self.settle_or_refetch(b, start, &mut data, &leaves)?;
            copy_block(buf, offset, end, start, &data);
            b = run_end + 1;
        }
        Ok(())
    }

    fn round_trips(&self) -> bool {
        self.inner.round_trips()
    }

    fn first_tail(&self) -> u64 {
        self.inner.first_tail()
    }

    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<()> {
        if reads.iter().all(|(b, off)| {
            let (first, last) = self.span(*off, b.len().max(1));
            (first..=last).all(|x| self.kept(x).is_some())
        }) {
            for (buf, off) in reads.iter_mut() {
                self.read_exact_at(buf, *off)?;
            }
            return Ok(());
        }
        let mut spans: Vec<(u64, u64, Vec<u8>)> = reads
            .iter()
            .map(|(b, off)| {
                let (first, last) = self.span(*off, b.len().max(1));
                let (start, data) = self.aligned(first, last);
                (first, start, data)
            })
            .collect();
        // The first read of an archive (a format's probe of its head and tail) is also
        // where its tree is loaded: a remote store's tree file and the bytes are fetched
        // at once, one round trip instead of two.
        let leaves = {
            let mut inner: Vec<(&mut [u8], u64)> = spans
                .iter_mut()
                .map(|(_, start, d)| (d.as_mut_slice(), *start))
                .collect();
            self.with_leaves(|| self.inner.read_many(&mut inner))?
        };
        for ((buf, off), (first, start, data)) in reads.iter_mut().zip(spans.iter_mut()) {
            self.settle_or_refetch(*first, *start, data, &leaves)?;
            let at = (*off - *start) as usize;
            buf.copy_from_slice(&data[at..at + buf.len()]);
        }
        Ok(())
    }

    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.inner.will_need(&self.whole_blocks(ranges));
    }

    fn fetch_in_order(&self, ranges: &[(u64, u64)]) {
        self.inner.fetch_in_order(&self.whole_blocks(ranges));
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn mtime(&self) -> i64 {
        self.inner.mtime()
    }

    fn pin(&self) {
        self.inner.pin();
    }

    fn fetch_sparingly(&self, sequential: u64) {
        self.inner.fetch_sparingly(sequential);
    }

    fn fetch_in_background(&self) {
        self.inner.fetch_in_background();
    }

    fn forget(&self) {
        // The blocks kept were checked: only the copies below are in doubt.
        self.inner.forget();
    }

    fn fetched(&self) -> Option<u64> {
        self.inner.fetched()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::blob::Bytes;

    fn leaves(data: &[u8], block: u64) -> Vec<Hash> {
        data.chunks(block as usize)
            .map(|c| Sha256::digest(c).into())
            .collect()
    }

    fn blob(data: Vec<u8>, sealed: &[u8], block: u64) -> (VerifiedBlob, Arc<Checks>) {
        let l = leaves(sealed, block);
        let stats = Arc::new(Checks::default());
        let inner: Arc<dyn Blob> = Arc::new(Bytes::new("a.zip", data));
        (
            VerifiedBlob::new(
                inner,
                block,
                "t",
                Box::new(move || Ok(l.clone())),
                stats.clone(),
            ),
            stats,
        )
    }

    /// Bytes in memory as the ranges of a remote blob.
    #[derive(Debug)]
    struct Served(Arc<Vec<u8>>);

    impl crate::io::remote::Ranges for Served {
        fn get(
            &self,
            start: u64,
            end: u64,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
            let b = bytes::Bytes::copy_from_slice(&self.0[start as usize..end as usize]);
            Box::pin(async move { Ok(b) })
        }
    }

    #[test]
    fn a_remote_blob_under_a_seal_keeps_only_checked_blocks() {
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
        let l = leaves(&data, 1024);
        let mut served = data.clone();
        served[2500] ^= 1; // block 2
        let dir = tempfile::tempdir().unwrap();
        let remote = crate::io::remote::Remote::new(crate::io::remote::RemoteConfig {
            disk_cache: Some((dir.path().to_path_buf(), 1 << 30)),
            ..Default::default()
        })
        .unwrap();
        let inner = Arc::new(crate::io::remote::RemoteBlob::of(
            "a.zip".into(),
            Arc::new(Served(Arc::new(served))),
            data.len() as u64,
            "v1".into(),
            0,
            remote.clone(),
        ));
        let v = VerifiedBlob::new(
            inner.clone(),
            1024,
            "t",
            Box::new(move || Ok(l.clone())),
            Arc::default(),
        );
        // The blob below fetches blocks 0-4 (a read of its own, as read-ahead would):
        // only blocks 0 and 1, before the tampered one, are kept on disk.
        inner.read_exact_at(&mut vec![0u8; 5 * 1024], 0).unwrap();
        let disk = remote.disk.as_ref().unwrap();
        disk.flush();
        let key = crate::io::diskcache::DiskCache::key("v1");
        assert_eq!(disk.holes(&key, 0, 5 * 1024), [(2048, 5 * 1024)]);
        // Read through the seal: block 1 passes, block 2 fails.
        assert!(v.read_exact_at(&mut [0u8; 10], 1500).is_ok());
        assert!(v.read_exact_at(&mut [0u8; 10], 2500).is_err());
    }

    /// Bytes in memory as the ranges of a remote blob, replaceable (a server fixed).
    #[derive(Debug)]
    struct Fixable(Mutex<Vec<u8>>);

    impl crate::io::remote::Ranges for Fixable {
        fn get(
            &self,
            start: u64,
            end: u64,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes>> {
            let b = bytes::Bytes::copy_from_slice(
                &crate::sync::lock(&self.0)[start as usize..end as usize],
            );
            Box::pin(async move { Ok(b) })
        }
    }

    #[test]
    fn a_bad_cached_block_is_fetched_again_and_a_fixed_source_read() {
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + i / 700) as u8).collect();
        let l = leaves(&data, 1024);
        let mut bad = data.clone();
        bad[2500] ^= 1; // block 2
        let dir = tempfile::tempdir().unwrap();
        let remote = crate::io::remote::Remote::new(crate::io::remote::RemoteConfig {
            disk_cache: Some((dir.path().to_path_buf(), 1 << 30)),
            ..Default::default()
        })
        .unwrap();
        // A damaged copy in the disk cache (another mount's, unsealed); the server right.
        let disk = remote.disk.as_ref().unwrap();
        let key = crate::io::diskcache::DiskCache::key("v1");
        disk.store(&key, 0, &bad).unwrap();
        let served = Arc::new(Fixable(Mutex::new(data.clone())));
        let open = |version: &str| {
            let inner = Arc::new(crate::io::remote::RemoteBlob::of(
                "a.zip".into(),
                served.clone(),
                data.len() as u64,
                version.into(),
                0,
                remote.clone(),
            ));
            let l = l.clone();
            let checks = Arc::new(Checks::default());
            let v = VerifiedBlob::new(
                inner,
                1024,
                "t",
                Box::new(move || Ok(l.clone())),
                checks.clone(),
            );
            (v, checks)
        };
        let (v, checks) = open("v1");
        let mut buf = vec![0u8; 100];
        v.read_exact_at(&mut buf, 2450).unwrap();
        assert_eq!(buf, data[2450..2550], "read back from the server");
        assert_eq!(
            checks.stats.failures.load(Relaxed),
            1,
            "the cached copy failed"
        );
        // The damaged copy is gone; what the disk cache holds of block 2 now is right.
        disk.flush();
        let mut cached = vec![0u8; 1024];
        if disk.read(&key, &mut cached, 2048) {
            assert_eq!(cached, data[2048..3072]);
        }
        // A server serving tampered bytes: EIO; fixed: the next read is right.
        *crate::sync::lock(&served.0) = bad.clone();
        let (v, checks) = open("v2");
        assert!(matches!(
            v.read_exact_at(&mut buf, 2450),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(checks.stats.failures.load(Relaxed), 2, "fetched once more");
        *crate::sync::lock(&served.0) = data.clone();
        v.read_exact_at(&mut buf, 2450).unwrap();
        assert_eq!(buf, data[2450..2550]);
    }

    #[test]
    fn only_whole_matching_blocks_may_be_kept() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let l = leaves(&data, 1024);
        let t = Tree {
            name: "a.zip".into(),
            size: data.len() as u64,
            block: 1024,
            load: Box::new(move || Ok(l.clone())),
            leaves: Mutex::new(None),
            loading: Mutex::new(()),
        };
        // Not loaded and may not wait: nothing.
        assert_eq!(t.vouch(0, &data[..2048], false), 0);
        assert_eq!(t.vouch(0, &data[..2048], true), 2048);
        // Cut short: the whole blocks before it; the blob's last block counts whole.
        assert_eq!(t.vouch(1024, &data[1024..3000], false), 1024);
        assert_eq!(t.vouch(9216, &data[9216..], false), 784);
        // Not on a block: nothing. A block that does not match stops it.
        assert_eq!(t.vouch(100, &data[100..3000], false), 0);
        let mut bad = data[..4096].to_vec();
        bad[2500] ^= 1;
        assert_eq!(t.vouch(0, &bad, false), 2048);
    }

    #[test]
    fn reads_of_sealed_bytes_pass_and_tampered_blocks_fail_alone() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let (v, stats) = blob(data.clone(), &data, 4096);
        let mut buf = vec![0u8; 5000];
        v.read_exact_at(&mut buf, 3000).unwrap();
        assert_eq!(buf, data[3000..8000]);
        let mut one = [0u8; 10];
        v.read_exact_at(&mut one, 9990).unwrap();
        assert_eq!(one, data[9990..]);
        // Several reads at once.
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 100]);
        v.read_many(&mut [(&mut a, 0), (&mut b, 9000)]).unwrap();
        assert_eq!((&a[..], &b[..]), (&data[..100], &data[9000..9100]));
        assert_eq!(stats.stats.failures.load(Relaxed), 0);
        assert!(v.version().ends_with("sealed:t"));
        // Reads in order, not aligned to blocks: each block hashed once.
        let (v, stats) = blob(data.clone(), &data, 1024);
        let mut at = 100u64;
        while at < 9_000 {
            let mut b = vec![0u8; 700];
            v.read_exact_at(&mut b, at).unwrap();
            assert_eq!(b, data[at as usize..at as usize + 700]);
            at += 700;
        }
        assert_eq!(
            stats.stats.blocks.load(Relaxed),
            9,
            "each block hashed once"
        );
        // One byte flipped in the second block: reads touching it fail, others pass.
        let mut bad = data.clone();
        bad[5000] ^= 1;
        let (v, stats) = blob(bad, &data, 4096);
        assert!(matches!(
            v.read_exact_at(&mut [0u8; 10], 4990),
            Err(Error::Corrupt(_))
        ));
        assert!(v.read_exact_at(&mut [0u8; 10], 100).is_ok());
        assert!(v.read_exact_at(&mut [0u8; 10], 9000).is_ok());
        assert_eq!(stats.stats.failures.load(Relaxed), 1);
        // A seal of another length is refused at the first read.
        let (v, _) = blob(data[..5000].to_vec(), &data, 4096);
        assert!(v.read_exact_at(&mut [0u8; 10], 0).is_err());
    }

    #[test]
    fn blocks_are_hashed_once_whatever_the_order_of_reads_across_archives() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let l = leaves(&data, 1024);
        let checks = Arc::new(Checks::default());
        let blob = |name: &str| {
            let l = l.clone();
            VerifiedBlob::new(
                Arc::new(Bytes::new(name, data.clone())),
                1024,
                "t",
                Box::new(move || Ok(l.clone())),
                checks.clone(),
            )
        };
        let (a, b) = (blob("a.zip"), blob("b.zip"));
        // Two archives read at once, each backwards in small pieces, then again.
        for _ in 0..2 {
            for at in (0..9_900u64).rev().step_by(300) {
                for v in [&a, &b] {
                    let mut buf = vec![0u8; 100];
                    v.read_exact_at(&mut buf, at).unwrap();
                    assert_eq!(buf, data[at as usize..at as usize + 100]);
                }
            }
        }
        // A probe's head and tail at once, kept too.
        let (mut h, mut t) = (vec![0u8; 10], vec![0u8; 10]);
        a.read_many(&mut [(&mut h, 0), (&mut t, 9_990)]).unwrap();
        assert_eq!((&h[..], &t[..]), (&data[..10], &data[9_990..]));
        assert_eq!(
            checks.stats.blocks.load(Relaxed),
            2 * 10,
            "each block of each archive hashed once"
        );
    }
}
