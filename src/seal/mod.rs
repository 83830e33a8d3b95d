//! Seals: a signed list of a store's archives and a hash tree over each one's bytes, so
//! that a mount can check every byte it reads against a root its user trusts (issue 31,
//! docs/SEMANTICS.md "Verified reads", docs/FORMAT.md "Seals").
//!
//! A store holds, beside its archives:
//!
//! - `pkgfs.seal`: the root, text: a header (`pkgfs-seal 1`, the revision, the block
//!   size, the number of archives), then one line per archive: its size, the sha256 of
//!   its bytes, the root of its tree and its name (one path component). Small enough to
//!   fetch whole (about 200 bytes an archive), and what the signature covers.
//! - `pkgfs.seal.sig`: an SSHSIG signature of `pkgfs.seal` (namespace `pkgfs`), checked
//!   by `ssh-keygen -Y verify` as well as by pkgfs ([`sign`]).
//! - `pkgfs.seal.d/TREE`: per archive of more than one block, the sha256 of each block,
//!   concatenated; named by its tree root, which commits to the block size, the archive
//!   size and the hashes ([`tree_root`]). Fetched when that archive is first indexed,
//!   never all at once. An archive of one block has no file there: its one block hash is
//!   the sha256 of its bytes.
//!
//! Everything here is pure: parsing and writing bytes, hashing readers. Where the bytes
//! come from and where checked reads happen (`io::verified`) is elsewhere.

pub mod sign;

use std::io::Read;

use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// The root file's name in a store.
pub const SEAL_FILE: &str = "pkgfs.seal";
/// The signature's name: the root file's with `.sig`.
pub const SIG_SUFFIX: &str = ".sig";
/// The trees' directory: the root file's with `.d`.
pub const TREES_SUFFIX: &str = ".d";
/// The first line of a root file.
const MAGIC: &str = "pkgfs-seal 1";
/// Block size of new seals (chosen by measurement: docs/BENCHMARKS.md "Verified reads";
/// 16 KiB until checked blocks were kept per source instead of four per archive).
pub const DEFAULT_BLOCK: u64 = 64 * 1024;
/// Block sizes a seal may have: 4 KiB to 16 MiB, a power of two.
const BLOCKS: std::ops::RangeInclusive<u32> = 12..=24;
/// Largest root file read (about 300,000 archives at 200 bytes a line).
pub const MAX_ROOT: u64 = 64 << 20;
/// Most archives a seal may list.
const MAX_ARCHIVES: usize = 1_000_000;

/// A sha256.
pub type Hash = [u8; 32];

/// One archive as a seal lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// Its file name in the store.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// The sha256 of its bytes.
    pub sha256: Hash,
    /// The root of its tree ([`tree_root`]).
    pub tree: Hash,
}

impl Sealed {
    /// How many blocks of `block` bytes it has.
    pub fn blocks(&self, block: u64) -> u64 {
        self.size.div_ceil(block)
    }

    /// Whether its tree has a file of its own (more than one block).
    pub fn has_tree_file(&self, block: u64) -> bool {
        self.blocks(block) > 1
    }
}

/// A store's seal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seal {
    /// Higher is newer; a mount refuses one older than it has accepted.
    pub revision: u64,
    /// Bytes per block of every tree.
    pub block: u64,
    /// The archives, by name order.
    pub archives: Vec<Sealed>,
}

impl Seal {
    /// The root file's bytes.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{MAGIC}\nrevision {}\nblock-size {}\narchives {}\n",
            self.revision,
            self.block,
            self.archives.len()
        );
        for a in &self.archives {
            s.push_str(&format!(
                "{} {} {} {}\n",
                a.size,
                hex(&a.sha256),
                hex(&a.tree),
                a.name
            ));
        }
        s
    }

    /// Parse a root file, refusing anything malformed, out of bounds or unsafe (names
    /// that are not one plain path component, duplicates, a tree root that cannot be
    /// right for a one-block archive).
    pub fn parse(bytes: &[u8]) -> Result<Seal> {
        let bad = |m: String| Error::Format(format!("{SEAL_FILE}: {m}"));
        if bytes.len() as u64 > MAX_ROOT {
            return Err(bad(format!("{} bytes: more than {MAX_ROOT}", bytes.len())));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
        if !text.ends_with('\n') {
            return Err(bad("truncated (no final newline)".into()));
        }
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(bad(format!("does not start with {MAGIC:?}")));
        }
        let mut field = |name: &str| -> Result<u64> {
            let line = lines.next().unwrap_or("");
            line.strip_prefix(name)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(format!("expected `{name} N`, found {line:?}")))
        };
        let revision = field("revision")?;
        let block = field("block-size")?;
        let count = field("archives")? as usize;
        if !block.is_power_of_two() || !BLOCKS.contains(&block.trailing_zeros()) {
            return Err(bad(format!(
                "block size {block}: not a power of two from 4 KiB to 16 MiB"
            )));
        }
        if count > MAX_ARCHIVES {
            return Err(bad(format!("{count} archives: more than {MAX_ARCHIVES}")));
        }
        let mut archives = Vec::with_capacity(count);
        for line in lines {
            let mut parts = line.splitn(4, ' ');
            let mut next = |what: &str| {
                parts
                    .next()
                    .ok_or_else(|| bad(format!("line {line:?} has no {what}")))
            };
            let size: u64 = next("size")?
                .parse()
                .map_err(|_| bad(format!("line {line:?}: bad size")))?;
            let sha256 =
                unhex(next("sha256")?).ok_or_else(|| bad(format!("line {line:?}: bad sha256")))?;
            let tree =
                unhex(next("tree")?).ok_or_else(|| bad(format!("line {line:?}: bad tree")))?;
            let name = next("name")?.to_string();
            check_name(&name).map_err(|m| bad(format!("archive {name:?}: {m}")))?;
            let a = Sealed {
                name,
                size,
                sha256,
                tree,
            };
            if !a.has_tree_file(block)
                && a.tree != tree_root(block, size, &[a.sha256][..a.blocks(block) as usize])
            {
                return Err(bad(format!(
                    "archive {:?}: its tree is not its one block's",
                    a.name
                )));
            }
            archives.push(a);
        }
        if archives.len() != count {
            return Err(bad(format!(
                "says {count} archives, lists {}",
                archives.len()
            )));
        }
        archives.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = archives.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(bad(format!("archive {:?} is listed twice", w[0].name)));
        }
        Ok(Seal {
            revision,
            block,
            archives,
        })
    }

    /// The archive named `name`.
    pub fn get(&self, name: &str) -> Option<&Sealed> {
        self.archives
            .binary_search_by(|a| a.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.archives[i])
    }
}

/// Whether `name` may be an archive's name in a seal: one path component, no control
/// characters, not a seal file.
pub fn check_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name == "." || name == ".." {
        return Err("not a file name");
    }
    if name.contains('/') {
        return Err("not one path component");
    }
    if name.chars().any(char::is_control) {
        return Err("control characters in its name");
    }
    if name.starts_with(SEAL_FILE) {
        return Err("the name of a seal file");
    }
    Ok(())
}

/// `path` with `suffix` added to its file name.
pub fn with_suffix(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    std::path::PathBuf::from(s)
}

/// The root of a tree: sha256 over a domain string, the block size, the archive size
/// and the block hashes in order.
pub fn tree_root(block: u64, size: u64, leaves: &[Hash]) -> Hash {
    let mut h = Sha256::new();
    h.update(b"pkgfs-tree 1\0");
    h.update(block.to_be_bytes());
    h.update(size.to_be_bytes());
    for l in leaves {
        h.update(l);
    }
    h.finalize().into()
}

/// The block hashes of a tree file, checked against `a`'s tree root.
pub fn parse_tree(bytes: &[u8], a: &Sealed, block: u64) -> Result<Vec<Hash>> {
    let want = a.blocks(block) as usize;
    if bytes.len() != want * 32 {
        return Err(Error::Corrupt(format!(
            "the tree of {} has {} bytes, not {} ({want} blocks)",
            a.name,
            bytes.len(),
            want * 32
        )));
    }
    let leaves: Vec<Hash> = bytes
        .chunks_exact(32)
        .map(|c| c.try_into().unwrap_or([0; 32]))
        .collect();
    if tree_root(block, a.size, &leaves) != a.tree {
        return Err(Error::Corrupt(format!(
            "the tree of {} does not match its seal",
            a.name
        )));
    }
    Ok(leaves)
}

/// The block hashes of an archive of one block or none: its sha256, or nothing.
pub fn small_tree(a: &Sealed, block: u64) -> Vec<Hash> {
    vec![a.sha256; a.blocks(block) as usize]
}

/// Hash `size` bytes of `r` in blocks of `block`: the block hashes and the sha256 of
/// the whole (one read of the data, both hashes from it).
pub fn hash_reader(mut r: impl Read, size: u64, block: u64) -> Result<(Vec<Hash>, Hash)> {
    let mut whole = Sha256::new();
    let mut leaves = Vec::with_capacity(size.div_ceil(block) as usize);
    let mut buf = vec![0u8; block as usize];
    let mut left = size;
    while left > 0 {
        let n = left.min(block) as usize;
        r.read_exact(&mut buf[..n]).map_err(Error::Io)?;
        whole.update(&buf[..n]);
        leaves.push(Sha256::digest(&buf[..n]).into());
        left -= n as u64;
    }
    let mut extra = [0u8; 1];
    if r.read(&mut extra).map_err(Error::Io)? != 0 {
        return Err(Error::Corrupt("the file grew while it was sealed".into()));
    }
    Ok((leaves, whole.finalize().into()))
}

/// Lower-case hex.
pub fn hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Hash> {
    if s.len() != 64
        || !s
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(name: &str, data: &[u8], block: u64) -> (Sealed, Vec<Hash>) {
        let (leaves, sha256) = hash_reader(data, data.len() as u64, block).unwrap();
        (
            Sealed {
                name: name.into(),
                size: data.len() as u64,
                sha256,
                tree: tree_root(block, data.len() as u64, &leaves),
            },
            leaves,
        )
    }

    #[test]
    fn a_seal_round_trips_and_its_trees_check() {
        let block = 4096;
        let big: Vec<u8> = (0..10_000u32).map(|i| (i * 31) as u8).collect();
        let (a, leaves) = sealed("b.zip", &big, block);
        let (s, _) = sealed("a small.whl", b"tiny", block);
        let (e, _) = sealed("empty.zip", b"", block);
        assert_eq!(leaves.len(), 3);
        let seal = Seal {
            revision: 7,
            block,
            archives: vec![a.clone(), s.clone(), e.clone()],
        };
        let back = Seal::parse(seal.to_text().as_bytes()).unwrap();
        assert_eq!(back.revision, 7);
        assert_eq!(back.get("b.zip"), Some(&a));
        assert_eq!(back.get("a small.whl"), Some(&s));
        assert_eq!(back.get("empty.zip").unwrap().blocks(block), 0);
        let tree: Vec<u8> = leaves.concat();
        assert_eq!(parse_tree(&tree, &a, block).unwrap(), leaves);
        // A tree of other bytes, or of another length, is refused.
        let mut other = tree.clone();
        other[5] ^= 1;
        assert!(parse_tree(&other, &a, block).is_err());
        assert!(parse_tree(&tree[..64], &a, block).is_err());
        assert_eq!(small_tree(&s, block), vec![s.sha256]);
    }

    /// Known answers computed apart from this crate (Python's hashlib, by the formula of
    /// docs/FORMAT.md "Trees"): `hash_reader` and `tree_root` are not their own oracle.
    #[test]
    fn hashes_and_tree_roots_match_an_independent_sha256() {
        let block = 4096;
        let big: Vec<u8> = (0..10_000u32)
            .map(|i| ((i * i * 7 + i / 100) & 0xff) as u8)
            .collect();
        // Fed in small reads, as a file or a socket may give them.
        let reader = std::io::BufReader::with_capacity(1000, &big[..]);
        let (leaves, whole) = hash_reader(reader, big.len() as u64, block).unwrap();
        assert_eq!(
            hex(&whole),
            "428a50c674abd7673957903317d6e6d4706e9536de69d1cff39461ccd158974f"
        );
        let leaves: Vec<String> = leaves.iter().map(hex).collect();
        assert_eq!(
            leaves,
            [
                "cb3f6148e6630cb02ede0a71f0a57a066d67decf9daf869cd8e4433c5ebe84d4",
                "8f2c9196203ead9fc0f356dc5790e9dcb57ef1a8ef3ad335dcc104a8dc858b60",
                "d689c998b9eb980d6cac45dab02fc2faead3b7b0381a077b2096d056634ceae0",
            ]
        );
        let (a, _) = sealed("b.zip", &big, block);
        assert_eq!(
            hex(&a.tree),
            "b2d47fb0526cadafcb995c29d1dfadc03f4508c79bee5c8587e56b8c42cd0af8"
        );
        // One block: the leaf is the file's sha256; none: no leaves.
        let (t, leaves) = sealed("t.whl", b"tiny", block);
        assert_eq!(
            hex(&t.sha256),
            "8950abfda7b727630760dd35bcf5c3daa7631aff223a90f7728c0d2521dde10c"
        );
        assert_eq!(leaves, vec![t.sha256]);
        assert_eq!(
            hex(&t.tree),
            "527b73bb5532b31de84bd6b19b8573caf52d87f20305a4d902f0dec9cf07eba7"
        );
        let (e, leaves) = sealed("e.zip", b"", block);
        assert!(leaves.is_empty());
        assert_eq!(
            hex(&e.sha256),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&e.tree),
            "0f74035f8b25da7e96fbeaaa1d5136d55acc36a1158573846da8250be76d4316"
        );
        // A reader shorter than the size it is said to have is an error, not a hash.
        assert!(hash_reader(&big[..100], 200, block).is_err());
    }

    #[test]
    fn hostile_roots_are_refused() {
        let block = 4096;
        let (a, _) = sealed("a.zip", b"abc", block);
        let good = Seal {
            revision: 1,
            block,
            archives: vec![a.clone()],
        }
        .to_text();
        assert!(Seal::parse(good.as_bytes()).is_ok());
        let line = good.lines().last().unwrap().to_string();
        for (what, text) in [
            ("escape", good.replace(" a.zip", " ../a.zip")),
            ("slash", good.replace(" a.zip", " d/a.zip")),
            ("dot-dot", good.replace(" a.zip", " ..")),
            ("count", good.replace("archives 1", "archives 2")),
            ("block", good.replace("block-size 4096", "block-size 1000")),
            ("truncated", good[..good.len() - 1].to_string()),
            (
                "twice",
                format!("{}{line}\n", good.replace("archives 1", "archives 2")),
            ),
            (
                "one-block tree",
                good.replace(&hex(&a.tree), &hex(&a.sha256)),
            ),
            ("magic", good.replace("pkgfs-seal 1", "pkgfs-seal 2")),
            ("seal name", good.replace(" a.zip", " pkgfs.seal.sig")),
        ] {
            assert!(Seal::parse(text.as_bytes()).is_err(), "{what} was accepted");
        }
        let huge = vec![b'x'; MAX_ROOT as usize + 1];
        assert!(Seal::parse(&huge).is_err());
    }
}
