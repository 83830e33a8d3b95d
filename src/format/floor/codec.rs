//! The pkgfs index encoding (docs/FORMAT.md): every entry of a tar stream with its
//! metadata and the offset of its data, zstd-compressed in a skippable frame. pkgfs
//! packages embed it between their last data frame and the seek table; the index cache
//! keeps it for tarballs indexed by a pass (gzip, zstd, plain tar). Pure functions over
//! bytes: every range checked, every truncation an error.

use std::cell::RefCell;

use zstd::zstd_safe::{DCtx, InBuffer, OutBuffer, ResetDirective};

use super::{Cursor, Entry, EntryKind, Loc, SKIPPABLE_HEADER, le32};
use crate::error::{Error, Result};

/// Skippable-frame magic of the pkgfs index (any of 0x184D2A50..5F is skippable).
pub const INDEX_FRAME_MAGIC: u32 = 0x184D_2A5B;
/// First bytes of the pkgfs index payload.
pub const INDEX_MAGIC: &[u8; 8] = b"PKGFSIDX";
/// Version of the index encoding: 1, or 2 when some entry is a device, FIFO or socket,
/// or has extended attributes (docs/FORMAT.md).
pub const INDEX_VERSION: u32 = 2;
/// Largest index accepted, decompressed (about ten million entries).
pub const MAX_INDEX_SIZE: u64 = 1 << 30;
/// An index body may claim at most this many times its compressed size (real indexes
/// compress 5-20×): a tiny frame cannot claim a huge body.
const MAX_INDEX_RATIO: u64 = 256;

fn bad(msg: impl Into<String>) -> Error {
    Error::Format(msg.into())
}

thread_local! {
    /// One zstd decompression context per thread. A fresh context per index cost 8 % of a
    /// mount of 609 packages (its allocation: page faults and TLB-flush IPIs), and each
    /// indexing thread decodes many indexes.
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// Decompress the zstd frames of `src` with this thread's context, into a buffer that
/// grows as output really comes (never to a claimed size) and stops one byte past
/// `limit`: a caller that expects `limit` bytes sees a longer stream as longer. Input
/// that ends mid-frame, or trailing bytes that are not a frame, are errors.
pub fn inflate_bounded(src: &[u8], limit: u64) -> std::io::Result<Vec<u8>> {
    let zerr = |code| std::io::Error::other(zstd::zstd_safe::get_error_name(code));
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let dctx = slot.get_or_insert_with(DCtx::create);
        // An earlier error may have left the context mid-frame.
        dctx.reset(ResetDirective::SessionOnly).map_err(zerr)?;
        let cap = limit.saturating_add(1);
        let mut out: Vec<u8> = Vec::new();
        let mut input = InBuffer::around(src);
        let mut frame_done = true;
        while input.pos() < src.len() && (out.len() as u64) < cap {
            if out.len() == out.capacity() {
                let room = cap - out.len() as u64;
                let grow = out.capacity().clamp(64 << 10, 64 << 20) as u64;
                out.reserve_exact(grow.min(room) as usize);
            }
            let (in_before, out_before) = (input.pos(), out.len());
            // The vector's length follows what the call wrote.
            let hint = dctx
                .decompress_stream(&mut OutBuffer::around_pos(&mut out, out_before), &mut input)
                .map_err(zerr)?;
            frame_done = hint == 0;
            if input.pos() == in_before && out.len() == out_before && out.len() < out.capacity() {
                break;
            }
        }
        // Flush what the context still holds of the last frame (its input all taken).
        while !frame_done && (out.len() as u64) < cap {
            if out.len() == out.capacity() {
                let room = cap - out.len() as u64;
                out.reserve_exact(room.min(64 << 10) as usize);
            }
            let out_before = out.len();
            let hint = dctx
                .decompress_stream(
                    &mut OutBuffer::around_pos(&mut out, out_before),
                    &mut InBuffer::around(&[]),
                )
                .map_err(zerr)?;
            frame_done = hint == 0;
            if out.len() == out_before {
                break;
            }
        }
        if !frame_done && (out.len() as u64) < cap {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the zstd stream ends mid-frame",
            ));
        }
        Ok(out)
    })
}

/// Kinds in the index encoding (5 and up: version 2 only).
fn kind_code(k: EntryKind) -> u8 {
    match k {
        EntryKind::File => 0,
        EntryKind::Dir => 1,
        EntryKind::Symlink => 2,
        EntryKind::HardLink => 3,
        EntryKind::Special => 4,
        EntryKind::CharDev => 5,
        EntryKind::BlockDev => 6,
        EntryKind::Fifo => 7,
        EntryKind::Socket => 8,
    }
}

/// Whether an entry needs index version 2.
fn needs_v2(e: &Entry) -> bool {
    kind_code(e.kind) >= 5 || e.rdev != 0 || !e.xattrs.is_empty()
}

/// Encode a pkgfs index frame for `entries` (their `data` must be `Seekable` or `None`,
/// symlink and hard-link targets in `link`).
pub fn encode_index(entries: &[Entry], level: i32) -> std::io::Result<Vec<u8>> {
    // Version 1 whenever it can say everything: packages stay readable by older readers
    // (and byte for byte what they were).
    let version = if entries.iter().any(needs_v2) {
        2u32
    } else {
        1
    };
    let mut body = Vec::with_capacity(entries.len() * 64);
    body.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        body.push(kind_code(e.kind));
        body.extend_from_slice(&u32::from(e.perm).to_le_bytes());
        body.extend_from_slice(&e.uid.unwrap_or(0).to_le_bytes());
        body.extend_from_slice(&e.gid.unwrap_or(0).to_le_bytes());
        body.extend_from_slice(&e.mtime.to_le_bytes());
        body.extend_from_slice(&e.size.to_le_bytes());
        let off = match e.data {
            Loc::Stream(offset) => offset,
            _ => 0,
        };
        body.extend_from_slice(&off.to_le_bytes());
        body.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.path);
        body.extend_from_slice(&(e.link.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.link);
        if version >= 2 {
            body.extend_from_slice(&e.rdev.to_le_bytes());
            body.extend_from_slice(&(e.xattrs.len() as u32).to_le_bytes());
            for (name, value) in &e.xattrs {
                body.extend_from_slice(&(name.len() as u32).to_le_bytes());
                body.extend_from_slice(name);
                body.extend_from_slice(&(value.len() as u32).to_le_bytes());
                body.extend_from_slice(value);
            }
        }
    }
    let compressed = zstd::bulk::compress(&body, level)?;
    let mut payload = Vec::with_capacity(compressed.len() + 28);
    payload.extend_from_slice(INDEX_MAGIC);
    payload.extend_from_slice(&version.to_le_bytes());
    payload.extend_from_slice(&(body.len() as u64).to_le_bytes());
    payload.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    payload.extend_from_slice(&compressed);
    let mut frame = Vec::with_capacity(payload.len() + SKIPPABLE_HEADER);
    frame.extend_from_slice(&INDEX_FRAME_MAGIC.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Decode a pkgfs index frame (skippable header included). Every data range is checked
/// against `stream_size`, the decompressed size of the tar stream.
pub fn decode_index(frame: &[u8], stream_size: u64) -> Result<Vec<Entry>> {
    if frame.len() < SKIPPABLE_HEADER + 24 || le32(frame, 0) != INDEX_FRAME_MAGIC {
        return Err(bad("not a pkgfs index frame"));
    }
    if le32(frame, 4) as usize != frame.len() - SKIPPABLE_HEADER {
        return Err(bad("index frame size is wrong"));
    }
    let p = &frame[SKIPPABLE_HEADER..];
    if &p[0..8] != INDEX_MAGIC {
        return Err(bad("index frame lacks the pkgfs magic"));
    }
    let version = le32(p, 8);
    if !(1..=INDEX_VERSION).contains(&version) {
        return Err(Error::Unsupported(format!("pkgfs index version {version}")));
    }
    let mut c = Cursor::new(&p[12..], "pkgfs index entry");
    let body_len = c.u64()?;
    let crc = c.u32()?;
    let ratio_cap = (c.rest().len() as u64).saturating_mul(MAX_INDEX_RATIO) + (1 << 20);
    if body_len > MAX_INDEX_SIZE || body_len > ratio_cap {
        return Err(bad(format!(
            "index claims {body_len} bytes from {} compressed",
            c.rest().len()
        )));
    }
    let body = inflate_bounded(c.rest(), body_len)
        .map_err(|e| Error::Corrupt(format!("index does not decompress: {e}")))?;
    if body.len() as u64 != body_len || crc32fast::hash(&body) != crc {
        return Err(Error::Corrupt("index checksum mismatch".into()));
    }
    let mut c = Cursor::new(&body, "pkgfs index entry");
    let n = c.u64()?;
    // Each entry takes at least 45 bytes: a count beyond that is a lie.
    if n > body.len() as u64 / 45 {
        return Err(bad(format!("index claims {n} entries")));
    }
    let mut entries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let kind = match c.u8()? {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            3 => EntryKind::HardLink,
            4 => EntryKind::Special,
            5 if version >= 2 => EntryKind::CharDev,
            6 if version >= 2 => EntryKind::BlockDev,
            7 if version >= 2 => EntryKind::Fifo,
            8 if version >= 2 => EntryKind::Socket,
            k => return Err(bad(format!("unknown entry kind {k}"))),
        };
        let perm = (c.u32()? & 0o7777) as u16;
        let uid = c.u32()?;
        let gid = c.u32()?;
        let mtime = c.u64()? as i64;
        let size = c.u64()?;
        let offset = c.u64()?;
        let plen = c.u32()? as usize;
        let path = c.take(plen)?.to_vec();
        let llen = c.u32()? as usize;
        let link = c.take(llen)?.to_vec();
        let (rdev, xattrs) = if version >= 2 {
            let rdev = c.u64()?;
            let n = c.u32()? as usize;
            if n > super::tar::MAX_XATTRS {
                return Err(bad(format!("{n} extended attributes")));
            }
            let mut xattrs = Vec::with_capacity(n);
            for _ in 0..n {
                let len = c.u32()? as usize;
                let name = c.take(len)?.to_vec();
                let len = c.u32()? as usize;
                xattrs.push((name, c.take(len)?.to_vec()));
            }
            (rdev, xattrs)
        } else {
            (0, Vec::new())
        };
        let data = match kind {
            EntryKind::File => {
                if offset.checked_add(size).is_none_or(|end| end > stream_size) {
                    return Err(bad(format!(
                        "entry {:?} points outside the stream",
                        String::from_utf8_lossy(&path)
                    )));
                }
                Loc::Stream(offset)
            }
            _ => Loc::None,
        };
        entries.push(Entry {
            path,
            kind,
            perm,
            mtime,
            uid: Some(uid),
            gid: Some(gid),
            size: match kind {
                EntryKind::File => size,
                EntryKind::Symlink => link.len() as u64,
                _ => 0,
            },
            data,
            link,
            rdev,
            xattrs,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_context_per_thread_decodes_after_a_failure() {
        let a: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let b = b"another index, decoded by the same context".repeat(100);
        let za = zstd::bulk::compress(&a, 3).unwrap();
        let zb = zstd::bulk::compress(&b, 3).unwrap();
        assert_eq!(inflate_bounded(&za, a.len() as u64).unwrap(), a);
        // Cut mid-frame: an error, and the context must not carry its state on.
        assert!(inflate_bounded(&za[..za.len() / 2], a.len() as u64).is_err());
        assert_eq!(inflate_bounded(&zb, b.len() as u64).unwrap(), b);
        // Trailing bytes that are not a frame are refused; two frames are one stream.
        let mut trailing = zb.clone();
        trailing.extend_from_slice(b"garbage!");
        assert!(inflate_bounded(&trailing, b.len() as u64).is_err());
        let mut two = za.clone();
        two.extend_from_slice(&zb);
        let both = [a.clone(), b.to_vec()].concat();
        assert_eq!(inflate_bounded(&two, both.len() as u64).unwrap(), both);
    }

    #[test]
    fn output_stops_one_byte_past_the_limit() {
        let data = vec![7u8; 10 << 20];
        let z = zstd::bulk::compress(&data, 3).unwrap();
        let out = inflate_bounded(&z, 1000).unwrap();
        assert_eq!(
            out.len(),
            1001,
            "a longer stream shows as longer, and no more"
        );
        assert!(out.capacity() <= 1001);
        // The same context then decodes the whole of it.
        assert_eq!(inflate_bounded(&z, data.len() as u64).unwrap(), data);
    }
}
