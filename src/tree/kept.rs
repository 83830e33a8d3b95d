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

/// One column of a table ([`Tree::encode`]'s nodes and members): every value is
/// `base` plus a delta of `width` bytes (0: every value is `base`). A column is as
/// wide as its values' range needs, so the Linux tree's nodes take 24 bytes each
/// instead of 71, and a kept mount reads less than half the record from a cold disk.
struct Column<'a> {
    width: usize,
    base: u64,
    data: &'a [u8],
}

/// Write one column of `values` (visited twice: for their range, then their bytes),
/// at least `min_width` bytes a value.
fn encode_column<I>(e: &mut Enc, values: I, min_width: usize)
where
    I: Iterator<Item = u64> + Clone,
{
    let (lo, hi) = values
        .clone()
        .fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = lo.min(hi);
    let width = (8 - (hi - lo).leading_zeros() as usize / 8).max(min_width);
    e.u8(width as u8);
    e.u64(lo);
    if width > 0 {
        e.0.reserve(width * values.size_hint().0);
        for v in values {
            e.0.extend_from_slice(&(v - lo).to_le_bytes()[..width]);
        }
    }
}

impl<'a> Column<'a> {
    /// A column of `rows` values.
    fn parse(d: &mut Dec<'a>, rows: usize) -> Decoded<Self> {
        let width = usize::from(d.u8()?);
        if width > 8 {
            return Err(Damaged("column width"));
        }
        let base = d.u64()?;
        let data = d.take(rows.checked_mul(width).ok_or(Damaged("column"))?)?;
        Ok(Column { width, base, data })
    }

    /// Rows `first..first + out.len()` into `out`.
    fn read(&self, first: usize, out: &mut [u64]) -> Decoded<()> {
        let (w, base) = (self.width, self.base);
        if w == 0 {
            out.fill(base);
            return Ok(());
        }
        let raw = first
            .checked_add(out.len())
            .and_then(|end| self.data.get(first * w..end * w))
            .ok_or(Damaged("column rows"))?;
        match w {
            1 => read_deltas::<1>(raw, base, out),
            2 => read_deltas::<2>(raw, base, out),
            3 => read_deltas::<3>(raw, base, out),
            4 => read_deltas::<4>(raw, base, out),
            5 => read_deltas::<5>(raw, base, out),
            6 => read_deltas::<6>(raw, base, out),
            7 => read_deltas::<7>(raw, base, out),
            _ => read_deltas::<8>(raw, base, out),
        }
        Ok(())
    }
}

/// `base` plus each `W`-byte delta of `raw`, into `out` (a width known when compiled:
/// the bytes move as one load, not a copy call per value).
fn read_deltas<const W: usize>(raw: &[u8], base: u64, out: &mut [u64]) {
    for (o, b) in out.iter_mut().zip(raw.chunks_exact(W)) {
        let mut x = [0u8; 8];
        x[..W].copy_from_slice(b);
        *o = base.wrapping_add(u64::from_le_bytes(x));
    }
}

/// Columns of the node table, in the order [`Tree::encode`] writes them.
const NODE_COLUMNS: usize = 14;

/// A node table column as [`Tree::encode`] writes it: the field, and the least
/// width.
type NodeColumn = (fn(&Node) -> u64, usize);

/// The kind column's index: written a byte a node at least, so that the table's
/// length bounds its count (a damaged count never makes a huge allocation).
const KIND_COLUMN: usize = 3;

/// Rows decoded a column at a time before they are put together (14 x 256 values on
/// the stack).
const BLOCK: usize = 256;

/// Nodes from which a second thread decodes half of them and the members: a kept tree
/// is loaded while a mount waits (the Linux tree's 83,731 nodes and 78,635 members take
/// about 4 ms on one thread).
const PARALLEL_NODES: usize = 8192;

/// The node and member tables as [`Tree::encode`] wrote them, not yet decoded.
struct Tables<'a> {
    nodes: usize,
    node_cols: [Column<'a>; NODE_COLUMNS],
    names: &'a [u8],
    members: usize,
    member_cols: [Column<'a>; 4],
    /// The bytes of each inline place, in member order.
    inline: &'a [u8],
}

impl<'a> Tables<'a> {
    fn parse(d: &mut Dec<'a>) -> Decoded<Self> {
        // The kind column holds a byte a node at least.
        let nodes = d.count(1)?;
        let node_cols = columns(d, nodes)?;
        let names = d.bytes()?;
        let members = d.count(1)?;
        let member_cols = columns(d, members)?;
        let inline = d.bytes()?;
        Ok(Tables {
            nodes,
            node_cols,
            names,
            members,
            member_cols,
            inline,
        })
    }
}

/// `N` columns of `rows` values.
fn columns<'a, const N: usize>(d: &mut Dec<'a>, rows: usize) -> Decoded<[Column<'a>; N]> {
    let mut cols = Vec::with_capacity(N);
    for _ in 0..N {
        cols.push(Column::parse(d, rows)?);
    }
    cols.try_into().map_err(|_| Damaged("columns"))
}

/// The node, name and member tables, decoded on two threads when large: the second
/// thread takes the first half of the nodes and the members, this one the rest of the
/// nodes and the names (the Linux tree: 1.6 ms of nodes, 0.5 ms of names and 2 ms of
/// members, most of it faulting in fresh memory, which both cores can do at once).
fn decode_tables(t: &Tables) -> Decoded<(Vec<Node>, Vec<u8>, Vec<Member>)> {
    let n = t.nodes;
    let mut nodes: Vec<Node> = crate::io::memory::bulk_vec(n);
    let both = (n >= PARALLEL_NODES).then(|| {
        let (a, b) = nodes.spare_capacity_mut()[..n].split_at_mut(n / 2);
        std::thread::scope(|s| {
            let helper = std::thread::Builder::new()
                .name("pkgfs-kept-nodes".into())
                .spawn_scoped(s, || {
                    fill_nodes(a, &t.node_cols, 0)?;
                    decode_members(t)
                })
                .ok()?;
            let second = fill_nodes(b, &t.node_cols, n / 2);
            let names = t.names.to_vec();
            let members = helper.join().unwrap_or(Err(Damaged("node decoder")));
            Some(second.and(members).map(|m| (names, m)))
        })
    });
    let (names, members) = match both.flatten() {
        Some(both) => both?,
        // Few nodes, or no thread to share them with.
        None => {
            fill_nodes(&mut nodes.spare_capacity_mut()[..n], &t.node_cols, 0)?;
            (t.names.to_vec(), decode_members(t)?)
        }
    };
    // SAFETY: `fill_nodes` returned Ok for every part, so each of the first `n`
    // elements was written.
    unsafe { nodes.set_len(n) };
    Ok((nodes, names, members))
}

/// Decode rows `first..first + out.len()` into `out`, one node per slot; every slot
/// is written when it returns `Ok`.
fn fill_nodes(
    out: &mut [std::mem::MaybeUninit<Node>],
    cols: &[Column; NODE_COLUMNS],
    first: usize,
) -> Decoded<()> {
    let mut v = [[0u64; BLOCK]; NODE_COLUMNS];
    let narrow = |x: u64| u32::try_from(x).map_err(|_| Damaged("node field"));
    for (k, slots) in out.chunks_mut(BLOCK).enumerate() {
        for (col, vals) in cols.iter().zip(v.iter_mut()) {
            col.read(first + k * BLOCK, &mut vals[..slots.len()])?;
        }
        for (i, slot) in slots.iter_mut().enumerate() {
            slot.write(Node {
                name_off: narrow(v[0][i])?,
                name_len: narrow(v[1][i])?,
                parent: v[2][i],
                kind: usize::try_from(v[KIND_COLUMN][i])
                    .ok()
                    .and_then(|k| KINDS.get(k))
                    .copied()
                    .ok_or(Damaged("node kind"))?,
                perm: u16::try_from(v[4][i]).map_err(|_| Damaged("node mode"))?,
                nlink: narrow(v[5][i])?,
                uid: narrow(v[6][i])?,
                gid: narrow(v[7][i])?,
                mtime: v[8][i] as i64,
                size: v[9][i],
                archive: narrow(v[10][i])?,
                a: v[11][i],
                b: narrow(v[12][i])?,
                alias: v[13][i],
            });
        }
    }
    Ok(())
}

/// Tags of a member's place ([`Loc`]) in the member table.
const LOC_NONE: u64 = 0;
const LOC_INLINE: u64 = 1;
const LOC_STREAM: u64 = 2;
const LOC_RECORD: u64 = 3;

/// The member table as columns (archive, size, place's tag, place's number), then the
/// bytes of each inline place in order.
fn encode_members(e: &mut Enc, members: &[Member]) {
    e.u64(members.len() as u64);
    encode_column(e, members.iter().map(|m| u64::from(m.archive)), 0);
    encode_column(e, members.iter().map(|m| m.size), 0);
    let tag = |m: &Member| match m.loc {
        Loc::None => LOC_NONE,
        Loc::Inline(_) => LOC_INLINE,
        Loc::Stream(_) => LOC_STREAM,
        Loc::Record(_) => LOC_RECORD,
    };
    // At least a byte a member (see `KIND_COLUMN`).
    encode_column(e, members.iter().map(tag), 1);
    let number = |m: &Member| match m.loc {
        Loc::None | Loc::Inline(_) => 0,
        Loc::Stream(o) => o,
        Loc::Record(r) => u64::from(r),
    };
    encode_column(e, members.iter().map(number), 0);
    // The inline places as one run, so that a reader can step over them undecoded.
    let mut inline = Enc::default();
    for m in members {
        if let Loc::Inline(b) = &m.loc {
            inline.bytes(b);
        }
    }
    e.bytes(&inline.0);
}

/// The members [`encode_members`] wrote.
fn decode_members(t: &Tables) -> Decoded<Vec<Member>> {
    let m = t.members;
    let [archive, size, tag, number] = &t.member_cols;
    let mut inline = Dec(t.inline);
    let mut members = crate::io::memory::bulk_vec(m);
    let mut v = [[0u64; BLOCK]; 4];
    for first in (0..m).step_by(BLOCK) {
        let rows = BLOCK.min(m - first);
        for (col, vals) in [archive, size, tag, number].iter().zip(v.iter_mut()) {
            col.read(first, &mut vals[..rows])?;
        }
        let [archives, sizes, tags, numbers] = &v;
        let rows = archives.iter().zip(sizes).zip(tags).zip(numbers).take(rows);
        for (((&archive, &size), &tag), &n) in rows {
            members.push(Member {
                archive: u32::try_from(archive).map_err(|_| Damaged("member archive"))?,
                size,
                loc: match tag {
                    LOC_NONE => Loc::None,
                    LOC_INLINE => Loc::Inline(inline.bytes()?.into()),
                    LOC_STREAM => Loc::Stream(n),
                    LOC_RECORD => Loc::Record(u32::try_from(n).map_err(|_| Damaged("record"))?),
                    _ => return Err(Damaged("member place")),
                },
            });
        }
    }
    if !inline.is_empty() {
        return Err(Damaged("inline places"));
    }
    Ok(members)
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
        let nodes = &self.nodes;
        e.0.reserve(nodes.len() * 32 + self.names.len() + self.members.len() * 12);
        e.u64(nodes.len() as u64);
        let kind = |n: &Node| KINDS.iter().position(|k| *k == n.kind).unwrap_or(0) as u64;
        let columns: [NodeColumn; NODE_COLUMNS] = [
            (|n| u64::from(n.name_off), 0),
            (|n| u64::from(n.name_len), 0),
            (|n| n.parent, 0),
            (kind, 1),
            (|n| u64::from(n.perm), 0),
            (|n| u64::from(n.nlink), 0),
            (|n| u64::from(n.uid), 0),
            (|n| u64::from(n.gid), 0),
            (|n| n.mtime as u64, 0),
            (|n| n.size, 0),
            (|n| u64::from(n.archive), 0),
            (|n| n.a, 0),
            (|n| u64::from(n.b), 0),
            (|n| n.alias, 0),
        ];
        for (field, min_width) in columns {
            encode_column(e, nodes.iter().map(field), min_width);
        }
        e.bytes(&self.names);
        encode_members(e, &self.members);
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
        let (nodes, names, members) = decode_tables(&Tables::parse(d)?)?;
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

    /// Where column `col` of an encoded tree's node table starts, and its width.
    fn node_column(tree: &[u8], col: usize) -> (usize, usize) {
        let mut d = Dec(tree);
        let n = d.count(1).unwrap();
        for _ in 0..col {
            Column::parse(&mut d, n).unwrap();
        }
        let at = tree.len() - d.0.len() + 9;
        (at, Column::parse(&mut d, n).unwrap().width)
    }

    /// Where column `col` of an encoded tree's member table starts (after its width and
    /// base).
    fn member_column(tree: &[u8], nodes: usize, col: usize) -> usize {
        let mut d = Dec(tree);
        let n = d.count(1).unwrap();
        for _ in 0..NODE_COLUMNS {
            Column::parse(&mut d, n).unwrap();
        }
        d.bytes().unwrap();
        let m = d.count(1).unwrap();
        assert_eq!(n, nodes);
        for _ in 0..col {
            Column::parse(&mut d, m).unwrap();
        }
        tree.len() - d.0.len() + 9
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
        // A child range past the end: the root's first child as far as its column's
        // width reaches.
        let mut bad = e.0.clone();
        let (at, width) = node_column(&e.0, 11);
        assert!(width > 0);
        bad[at..at + width].fill(0xff);
        assert!(Tree::decode(&mut Dec(&bad), 2).is_err());
        // A member's place of a kind no tree has.
        let mut bad = e.0.clone();
        let tags = member_column(&e.0, t.nodes.len(), 2);
        bad[tags] = 9;
        assert!(Tree::decode(&mut Dec(&bad), 2).is_err());
    }

    /// A tree large enough for its nodes to be decoded on two threads comes back node
    /// for node, and a damaged node in either half is refused.
    #[test]
    fn a_large_tree_decoded_on_two_threads_is_the_tree_encoded() {
        let entries: Vec<Entry> = (0..PARALLEL_NODES + 3000)
            .map(|i| {
                // Some places inline (a tar symlink's target), read by the helper.
                let data = if i % 1000 == 7 {
                    Loc::Inline(format!("target {i}").into_bytes().into())
                } else {
                    Loc::Record(i as u32)
                };
                let mut x = entry(&format!("d{}/f{i}", i % 97), EntryKind::File, data);
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
        // The columns take what their values need: a byte for the kind, none for the
        // group every node shares.
        assert_eq!(node_column(&e.0, KIND_COLUMN).1, 1);
        assert_eq!(node_column(&e.0, 7).1, 0);
        assert!(e.0.len() < t.len() * 40, "{} bytes", e.0.len());
        // A node kind no tree has, in the first half (the helper's) and in the last node.
        for node in [1, t.len() - 1] {
            let mut bad = e.0.clone();
            bad[node_column(&e.0, KIND_COLUMN).0 + node] = 200;
            assert!(
                Tree::decode(&mut Dec(&bad), 1).is_err(),
                "kind of node {node}"
            );
        }
    }
}
