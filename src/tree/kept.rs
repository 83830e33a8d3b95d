//! A frozen [`Tree`] as bytes and back, so that a mount whose packages have not changed
//! since an earlier one can load the merged tree whole instead of reading every index
//! and folding them again (`source::kept` decides when; docs/SEMANTICS.md, "A kept
//! tree").
//!
//! The encoding is the tree's own flat arrays, little-endian, field by field: no
//! pointers, nothing to fix up, so decoding is one pass. A decoded tree is checked
//! before it is used (every name inside the name table, every parent, child range,
//! member and alias inside its table): a damaged file is refused, never a panic
//! later in a request handler. [`Enc`] and [`Dec`] are the writer and bounds-checked
//! reader the scan's record (`source::kept`) shares.

use std::collections::HashMap;

use super::{Conflict, Extra, Kind, Member, Node, ROOT_INO, Skipped, Tree};
use crate::format::Loc;

/// Why a kept record could not be read.
#[derive(Debug)]
pub struct Damaged(pub &'static str);

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "damaged kept tree: {}", self.0)
    }
}

/// A reader's result.
pub type Decoded<T> = std::result::Result<T, Damaged>;

/// Appends values little-endian.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// Two bytes.
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Four bytes.
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Eight bytes.
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Eight bytes, signed.
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A length, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
    }
}

/// Reads what [`Enc`] wrote; every read is bounds-checked.
pub struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Decoded<&'a [u8]> {
        if self.0.len() < n {
            return Err(Damaged("cut short"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    /// One byte.
    pub fn u8(&mut self) -> Decoded<u8> {
        Ok(self.take(1)?[0])
    }
    /// Two bytes.
    pub fn u16(&mut self) -> Decoded<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| Damaged("u16"))?,
        ))
    }
    /// Four bytes.
    pub fn u32(&mut self) -> Decoded<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| Damaged("u32"))?,
        ))
    }
    /// Eight bytes.
    pub fn u64(&mut self) -> Decoded<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| Damaged("u64"))?,
        ))
    }
    /// Eight bytes, signed.
    pub fn i64(&mut self) -> Decoded<i64> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| Damaged("i64"))?,
        ))
    }
    /// A count of things each at least `min` bytes long: refused if the rest cannot
    /// hold them (so a damaged count never makes a huge allocation).
    pub fn count(&mut self, min: usize) -> Decoded<usize> {
        let n = usize::try_from(self.u64()?).map_err(|_| Damaged("count"))?;
        if n.saturating_mul(min.max(1)) > self.0.len() {
            return Err(Damaged("count beyond the end"));
        }
        Ok(n)
    }
    /// A length, then the bytes.
    pub fn bytes(&mut self) -> Decoded<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }
    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Every reason a [`Conflict`] can give (the field is `&'static str`).
pub(super) const CONFLICT_REASONS: [&str; 5] = [
    "a directory replaces a file",
    "a directory hides a later file",
    "a later file replaces an earlier one",
    "hidden by an opaque directory whiteout",
    "removed by a whiteout",
];

const KINDS: [Kind; 7] = [
    Kind::File,
    Kind::Dir,
    Kind::Symlink,
    Kind::CharDev,
    Kind::BlockDev,
    Kind::Fifo,
    Kind::Socket,
];

/// Bytes of one node as [`Tree::encode`] writes it: fixed, so the table can be cut
/// anywhere between nodes.
const NODE_BYTES: usize = 71;

/// Nodes from which a second thread decodes half of them: a kept tree is loaded while
/// a mount waits (the Linux tree's 83,731 nodes took 4-5 ms on one thread).
const PARALLEL_NODES: usize = 8192;

/// The node table: fixed-size records, decoded on two threads when large.
fn decode_nodes(raw: &[u8]) -> Decoded<Vec<Node>> {
    let n = raw.len() / NODE_BYTES;
    let mut nodes: Vec<Node> = Vec::with_capacity(n);
    let halves = (n >= PARALLEL_NODES).then(|| {
        let (a, b) = nodes.spare_capacity_mut()[..n].split_at_mut(n / 2);
        let (ra, rb) = raw.split_at(n / 2 * NODE_BYTES);
        std::thread::scope(|s| {
            let helper = std::thread::Builder::new()
                .name("pkgfs-kept-nodes".into())
                .spawn_scoped(s, || fill_nodes(a, ra))
                .ok()?;
            let second = fill_nodes(b, rb);
            Some(
                helper
                    .join()
                    .unwrap_or(Err(Damaged("node decoder")))
                    .and(second),
            )
        })
    });
    match halves.flatten() {
        Some(both) => both?,
        // Few nodes, or no thread to share them with.
        None => fill_nodes(&mut nodes.spare_capacity_mut()[..n], raw)?,
    }
    // SAFETY: `fill_nodes` returned Ok for every part, so each of the first `n`
    // elements was written.
    unsafe { nodes.set_len(n) };
    Ok(nodes)
}

/// Decode `raw` (whole nodes) into `out`, one node per slot; every slot is written
/// when it returns `Ok`.
fn fill_nodes(out: &mut [std::mem::MaybeUninit<Node>], raw: &[u8]) -> Decoded<()> {
    if out.len() * NODE_BYTES != raw.len() {
        return Err(Damaged("node table"));
    }
    for (slot, c) in out.iter_mut().zip(raw.chunks_exact(NODE_BYTES)) {
        let u32_at = |at: usize| u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&c[at..at + 8]);
            u64::from_le_bytes(b)
        };
        slot.write(Node {
            name_off: u32_at(0),
            name_len: u32_at(4),
            parent: u64_at(8),
            kind: *KINDS.get(usize::from(c[16])).ok_or(Damaged("node kind"))?,
            perm: u16::from_le_bytes([c[17], c[18]]),
            nlink: u32_at(19),
            uid: u32_at(23),
            gid: u32_at(27),
            mtime: u64_at(31) as i64,
            size: u64_at(39),
            archive: u32_at(47),
            a: u64_at(51),
            b: u32_at(59),
            alias: u64_at(63),
        });
    }
    Ok(())
}

/// A member's place as bytes.
pub fn encode_loc(e: &mut Enc, loc: &Loc) {
    match loc {
        Loc::None => e.u8(0),
        Loc::Inline(b) => {
            e.u8(1);
            e.bytes(b);
        }
        Loc::Stream(o) => {
            e.u8(2);
            e.u64(*o);
        }
        Loc::Record(r) => {
            e.u8(3);
            e.u32(*r);
        }
    }
}

/// What [`encode_loc`] wrote.
pub fn decode_loc(d: &mut Dec) -> Decoded<Loc> {
    Ok(match d.u8()? {
        0 => Loc::None,
        1 => Loc::Inline(d.bytes()?.into()),
        2 => Loc::Stream(d.u64()?),
        3 => Loc::Record(d.u32()?),
        _ => return Err(Damaged("member place")),
    })
}

impl Tree {
    /// The tree as bytes ([`Tree::decode`] reads them).
    pub fn encode(&self, e: &mut Enc) {
        e.0.reserve(self.nodes.len() * 72 + self.names.len() + self.members.len() * 14);
        e.u64(self.nodes.len() as u64);
        for n in &self.nodes {
            e.u32(n.name_off);
            e.u32(n.name_len);
            e.u64(n.parent);
            e.u8(KINDS.iter().position(|k| *k == n.kind).unwrap_or(0) as u8);
            e.u16(n.perm);
            e.u32(n.nlink);
            e.u32(n.uid);
            e.u32(n.gid);
            e.i64(n.mtime);
            e.u64(n.size);
            e.u32(n.archive);
            e.u64(n.a);
            e.u32(n.b);
            e.u64(n.alias);
        }
        e.bytes(&self.names);
        e.u64(self.members.len() as u64);
        for m in &self.members {
            e.u32(m.archive);
            e.u64(m.size);
            encode_loc(e, &m.loc);
        }
        e.u64(self.conflicts.len() as u64);
        for c in &self.conflicts {
            e.bytes(&c.path);
            e.u32(c.winner);
            e.u32(c.loser);
            e.u8(CONFLICT_REASONS
                .iter()
                .position(|r| *r == c.reason)
                .unwrap_or(CONFLICT_REASONS.len()) as u8);
        }
        e.u64(self.skipped.len() as u64);
        for s in &self.skipped {
            e.u32(s.archive);
            e.bytes(&s.path);
            e.bytes(s.reason.as_bytes());
        }
        e.u64(self.total_bytes);
        let mut extras: Vec<_> = self.extras.iter().collect();
        extras.sort_by_key(|(ino, _)| **ino);
        e.u64(extras.len() as u64);
        for (ino, x) in extras {
            e.u64(*ino);
            e.u64(x.rdev);
            e.u64(x.xattrs.len() as u64);
            for (k, v) in &x.xattrs {
                e.bytes(k);
                e.bytes(v);
            }
        }
        let mut grafts: Vec<_> = self.grafts.iter().collect();
        grafts.sort();
        e.u64(grafts.len() as u64);
        for (ino, g) in grafts {
            e.u64(*ino);
            e.u32(*g);
        }
    }

    /// A tree [`Tree::encode`] wrote, checked whole (see the module documentation);
    /// `layers` is how many archives its nodes may name.
    pub fn decode(d: &mut Dec, layers: u32) -> Decoded<Tree> {
        let n = d.count(NODE_BYTES)?;
        let nodes = decode_nodes(d.take(n * NODE_BYTES)?)?;
        let names = d.bytes()?.to_vec();
        let m = d.count(13)?;
        let mut members = Vec::with_capacity(m);
        for _ in 0..m {
            members.push(Member {
                archive: d.u32()?,
                size: d.u64()?,
                loc: decode_loc(d)?,
            });
        }
        let c = d.count(17)?;
        let mut conflicts = Vec::with_capacity(c);
        for _ in 0..c {
            conflicts.push(Conflict {
                path: d.bytes()?.to_vec(),
                winner: d.u32()?,
                loser: d.u32()?,
                reason: CONFLICT_REASONS
                    .get(usize::from(d.u8()?))
                    .copied()
                    .unwrap_or("a later entry replaces an earlier one"),
            });
        }
        let s = d.count(20)?;
        let mut skipped = Vec::with_capacity(s);
        for _ in 0..s {
            skipped.push(Skipped {
                archive: d.u32()?,
                path: d.bytes()?.to_vec(),
                reason: String::from_utf8_lossy(d.bytes()?).into_owned(),
            });
        }
        let total_bytes = d.u64()?;
        let x = d.count(24)?;
        let mut extras = HashMap::with_capacity(x);
        for _ in 0..x {
            let ino = d.u64()?;
            let rdev = d.u64()?;
            let k = d.count(16)?;
            let mut xattrs = Vec::with_capacity(k);
            for _ in 0..k {
                xattrs.push((d.bytes()?.to_vec(), d.bytes()?.to_vec()));
            }
            extras.insert(ino, Box::new(Extra { rdev, xattrs }));
        }
        let g = d.count(12)?;
        let mut grafts = HashMap::with_capacity(g);
        for _ in 0..g {
            grafts.insert(d.u64()?, d.u32()?);
        }
        let has_xattrs = extras.values().any(|x| !x.xattrs.is_empty());
        let tree = Tree {
            nodes,
            names,
            members,
            conflicts,
            skipped,
            total_bytes,
            extras,
            has_xattrs,
            grafts,
        };
        tree.check(layers)?;
        Ok(tree)
    }

    /// Whether every index in the tree points inside its table (what the accessors
    /// assume of a tree the builder made).
    fn check(&self, layers: u32) -> Decoded<()> {
        let len = self.nodes.len() as u64;
        let root = self.nodes.first().ok_or(Damaged("no root"))?;
        if root.kind != Kind::Dir || root.parent != ROOT_INO {
            return Err(Damaged("root"));
        }
        let in_tree = |ino: u64| (1..=len).contains(&ino);
        for n in &self.nodes {
            let end = u64::from(n.name_off) + u64::from(n.name_len);
            if end > self.names.len() as u64 || !in_tree(n.parent) {
                return Err(Damaged("node name or parent"));
            }
            if n.archive >= layers && !(n.kind == Kind::Dir && n.archive == u32::MAX) {
                return Err(Damaged("node archive"));
            }
            if n.alias != 0 && !in_tree(n.alias) {
                return Err(Damaged("hard link"));
            }
            match n.kind {
                Kind::Dir => {
                    if n.b > 0 && (!in_tree(n.a) || n.a + u64::from(n.b) - 1 > len) {
                        return Err(Damaged("children"));
                    }
                }
                _ => {
                    if n.a >= self.members.len() as u64 {
                        return Err(Damaged("member"));
                    }
                }
            }
        }
        if self.members.iter().any(|m| m.archive >= layers) {
            return Err(Damaged("member archive"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Entry, EntryKind};
    use crate::tree::{Ownership, TreeBuilder};

    fn entry(path: &str, kind: EntryKind, data: Loc) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            perm: 0o644,
            mtime: 7,
            uid: Some(3),
            gid: None,
            size: 5,
            data,
            link: Vec::new(),
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    fn sample() -> Tree {
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        let mut x = entry("d/x", EntryKind::File, Loc::Record(0));
        x.xattrs = vec![(b"user.a".to_vec(), b"1".to_vec())];
        b.add_layer(
            0,
            5,
            &[
                x,
                entry("d/y", EntryKind::File, Loc::Inline(b"hello"[..].into())),
                entry("e", EntryKind::File, Loc::Stream(99)),
            ],
        );
        b.add_layer(1, 6, &[entry("e", EntryKind::File, Loc::Record(4))]);
        b.finish()
    }

    /// Every node, name, member, conflict and extra comes back as it was.
    #[test]
    fn a_tree_comes_back_as_it_was_encoded() {
        let t = sample();
        let mut e = Enc::default();
        t.encode(&mut e);
        let u = Tree::decode(&mut Dec(&e.0), 2).unwrap();
        assert_eq!(u.len(), t.len());
        for ino in 1..=t.len() as u64 {
            let (a, b) = (t.node(ino).unwrap(), u.node(ino).unwrap());
            assert_eq!(t.path_of(ino), u.path_of(ino));
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert_eq!(t.member(a), u.member(b));
            assert_eq!(t.extra(ino), u.extra(ino));
        }
        assert_eq!(t.conflicts, u.conflicts);
        assert_eq!(u.conflicts.len(), 1);
        assert_eq!(t.total_bytes, u.total_bytes);
        assert!(u.has_xattrs);
        assert_eq!(u.resolve(b"d/y"), t.resolve(b"d/y"));
    }

    /// A record cut anywhere, or naming an archive the mount does not have, is refused.
    #[test]
    fn a_damaged_tree_is_refused_not_trusted() {
        let t = sample();
        let mut e = Enc::default();
        t.encode(&mut e);
        for cut in 0..e.0.len() {
            assert!(
                Tree::decode(&mut Dec(&e.0[..cut]), 2).is_err(),
                "cut at {cut}"
            );
        }
        assert!(
            Tree::decode(&mut Dec(&e.0), 1).is_err(),
            "layer 1 is not there"
        );
        // A child range past the end.
        let mut bad = e.0.clone();
        let first_a = 8 + 4 + 4 + 8 + 1 + 2 + 4 + 4 + 4 + 8 + 8 + 4;
        bad[first_a..first_a + 8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(Tree::decode(&mut Dec(&bad), 2).is_err());
    }

    /// A tree large enough for its nodes to be decoded on two threads comes back node
    /// for node, and a damaged node in either half is refused.
    #[test]
    fn a_large_tree_decoded_on_two_threads_is_the_tree_encoded() {
        let entries: Vec<Entry> = (0..PARALLEL_NODES + 3000)
            .map(|i| {
                let mut x = entry(
                    &format!("d{}/f{i}", i % 97),
                    EntryKind::File,
                    Loc::Record(i as u32),
                );
                x.mtime = i as i64;
                x.size = i as u64 * 3;
                x.perm = (i % 0o777) as u16;
                x
            })
            .collect();
        let mut b = TreeBuilder::new(Ownership::defaults(0, 0));
        b.add_layer(0, 5, &entries);
        let t = b.finish();
        assert!(t.len() >= PARALLEL_NODES);
        let mut e = Enc::default();
        t.encode(&mut e);
        let u = Tree::decode(&mut Dec(&e.0), 1).unwrap();
        assert_eq!(u.len(), t.len());
        for ino in 1..=t.len() as u64 {
            let (a, b) = (t.node(ino).unwrap(), u.node(ino).unwrap());
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "node {ino}");
            assert_eq!(t.path_of(ino), u.path_of(ino));
            assert_eq!(t.member(a), u.member(b));
        }
        // A node kind no tree has, in the first half (the helper's) and in the last node.
        for node in [1, t.len() - 1] {
            let mut bad = e.0.clone();
            bad[8 + node * NODE_BYTES + 16] = 200;
            assert!(
                Tree::decode(&mut Dec(&bad), 1).is_err(),
                "kind of node {node}"
            );
        }
    }
}
