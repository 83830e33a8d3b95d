//! Layers that carry their own table of contents: **zstd:chunked** (containers/storage,
//! `skopeo --dest-compress-format zstd:chunked`, stargz-snapshotter's `--zstdchunked`)
//! and **eStargz** (stargz-snapshotter's `ctr-remote image convert --estargz`). Both are
//! valid compressed tar streams whose writers started a new zstd frame or gzip member at
//! every file (and every chunk of a large file), and appended a JSON table of contents
//! naming each entry's metadata and where its compressed chunks start. The table is all
//! a mount reads: no pass over the layer.
//!
//! - **Finding the table.** zstd:chunked ends with a skippable frame (magic
//!   `0x184D2A50`) holding the table's offset, compressed and uncompressed length and
//!   type, and `GnUlInUx` (or, with a tar-split stream too, `GNUlInUx`); the table is one
//!   zstd frame of JSON. eStargz ends with an empty gzip member whose extra field holds
//!   the table's offset in hex and `STARGZ`; the table is the file `stargz.index.json` of
//!   a tar in one gzip member there.
//! - **Trust.** An image manifest names the table's digest in the layer's annotations
//!   (zstd:chunked: `…zstd-chunked.manifest-checksum`, the sha256 of the compressed
//!   table; eStargz: `containerd.io/snapshot/stargz/toc.digest`, of the JSON). When it
//!   does ([`super::LayerCheck::toc_blob`], [`super::LayerCheck::toc_json`]) the table is
//!   checked against it, and every chunk against the table's digest for it whenever it
//!   is decoded: no byte is served that the manifest does not vouch for, without reading
//!   the whole layer. Without a table digest
//!   an image layer is checked whole instead (see [`super::open_layer`]).
//! - **Reads** decode one chunk (a cache unit of at most [`MAX_CHUNK`] bytes): from its
//!   compressed offset until it has its size, input bounded by where the next chunk
//!   starts.
//! - The landmark files of eStargz (`.prefetch.landmark`, `.no.prefetch.landmark`) and
//!   the table's own tar entry are not part of the image and are not listed.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use log::warn;
use zstd::zstd_safe;

use super::{
    Checked, Entry, EntryKind, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe,
    Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::cache::Block;
use crate::io::digest::Digest;
use crate::io::inflate::Inflater;
use crate::io::{BlockKey, ReadData, Span, gather};

/// Largest chunk served (a read decodes a whole chunk).
pub const MAX_CHUNK: u64 = 64 << 20;
/// Largest table of contents accepted, uncompressed.
pub const MAX_TOC: u64 = 512 << 20;
/// Most entries a table may list.
const MAX_TOC_ENTRIES: usize = super::floor::MAX_ENTRIES;
/// Compressed input is read in pieces of this size while decoding a chunk.
const READ_CHUNK: usize = 256 * 1024;
/// How far ahead of a chunk read from a server the rest of its file is fetched (in the
/// background, not past the file's last chunk). A read-ahead by layer offset ran into
/// the files next in the layer: python's start in a zstd:chunked image 40 ms away
/// fetched 19.5 % of the layers' bytes with 1 MiB of it, 6.9 % with none (in 11.7 s),
/// and 7.0 % with this instead, as fast as the first (2.7-3.0 s against 3.0-3.1 s); 8
/// MiB gave the same.
const FILE_AHEAD: u64 = 1 << 20;
/// Skippable frame magic of zstd:chunked's footer.
const SKIPPABLE_FOOTER: u32 = 0x184D_2A50;
/// The eStargz entry that ends the prioritized files.
const PREFETCH_LANDMARK: &str = ".prefetch.landmark";
/// Names at the root of an eStargz layer that are the format's, not the image's.
const FORMAT_FILES: &[&str] = &[
    PREFETCH_LANDMARK,
    ".no.prefetch.landmark",
    "stargz.index.json",
];

/// Which kind of table, and how its chunks are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// zstd frames.
    ZstdChunked,
    /// gzip members.
    Estargz,
}

impl Flavour {
    fn name(self) -> &'static str {
        match self {
            Flavour::ZstdChunked => "zstd:chunked",
            Flavour::Estargz => "estargz",
        }
    }
}

/// Where a layer's table is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Footer {
    flavour: Flavour,
    /// Offset of the table (zstd:chunked: its zstd frame; eStargz: its gzip member).
    offset: u64,
    /// Compressed length (zstd:chunked; eStargz: up to the footer).
    len: u64,
    /// Uncompressed length (zstd:chunked; eStargz: unknown, 0).
    ulen: u64,
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// The footer of a zstd:chunked or eStargz layer, if `probe`'s tail ends with one.
fn footer(probe: &Probe) -> Result<Option<Footer>> {
    let t = &probe.tail;
    let size = probe.size;
    let bad = |m: &str| Error::Format(format!("zstd:chunked footer: {m}"));
    // zstd:chunked: [skippable magic][u32 len][payload], payload 40 or 64 bytes ending
    // with the magic string.
    for (payload, magic) in [(40usize, b"GnUlInUx"), (64, b"GNUlInUx")] {
        let n = payload + 8;
        if t.len() < n || &t[t.len() - 8..] != magic {
            continue;
        }
        let f = &t[t.len() - n..];
        if u32::from_le_bytes([f[0], f[1], f[2], f[3]]) != SKIPPABLE_FOOTER
            || u32::from_le_bytes([f[4], f[5], f[6], f[7]]) as usize != payload
        {
            return Err(bad("not a skippable frame"));
        }
        let (offset, len, ulen, kind) = (le64(f, 8), le64(f, 16), le64(f, 24), le64(f, 32));
        if kind != 1 {
            return Err(Error::Unsupported(format!(
                "zstd:chunked table of type {kind}"
            )));
        }
        if offset.checked_add(len).is_none_or(|e| e > size - n as u64) || len == 0 {
            return Err(bad("the table lies outside the layer"));
        }
        if ulen > MAX_TOC {
            return Err(bad("the table is too large"));
        }
        return Ok(Some(Footer {
            flavour: Flavour::ZstdChunked,
            offset,
            len,
            ulen,
        }));
    }
    // eStargz: an empty gzip member with FEXTRA: subfield 'S' 'G' of 22 bytes (51-byte
    // footer), or the bare 22 bytes (legacy stargz, 47 bytes): "%016x" offset + "STARGZ".
    for (n, extra_at) in [(51usize, 16usize), (47, 12)] {
        if t.len() < n {
            continue;
        }
        let f = &t[t.len() - n..];
        if f[..4] != [0x1f, 0x8b, 8, 4] || f.get(extra_at + 16..extra_at + 22) != Some(b"STARGZ") {
            continue;
        }
        if n == 51 && f[12..16] != [b'S', b'G', 22, 0] {
            continue;
        }
        let hex = std::str::from_utf8(&f[extra_at..extra_at + 16]).ok();
        let offset = hex
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .filter(|&o| o < size - n as u64)
            .ok_or_else(|| Error::Format("eStargz footer: bad table offset".into()))?;
        return Ok(Some(Footer {
            flavour: Flavour::Estargz,
            offset,
            len: size - n as u64 - offset,
            ulen: 0,
        }));
    }
    Ok(None)
}

/// The table as JSON.
#[derive(serde::Deserialize)]
struct TocJson {
    #[serde(default)]
    version: u32,
    entries: Vec<TocEntry>,
}

/// One entry of a table (the fields both formats share).
#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct TocEntry {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    modtime: String,
    link_name: String,
    dev_major: u32,
    dev_minor: u32,
    xattrs: BTreeMap<String, String>,
    digest: String,
    offset: u64,
    end_offset: u64,
    chunk_offset: u64,
    chunk_size: u64,
    chunk_digest: String,
    chunk_type: String,
}

/// A stretch of a file: its own compressed frame(s) or gzip member(s).
#[derive(Clone, Debug)]
struct Chunk {
    /// Offset in the file.
    at: u64,
    /// Bytes of the file it holds.
    len: u64,
    /// Where its compressed data starts in the layer.
    coff: u64,
    /// Where its compressed data must end by (the next chunk's start, or the table's).
    cend: u64,
    /// What its bytes must hash to.
    digest: Option<Digest>,
}

/// A regular file: its chunks, in order.
#[derive(Clone, Debug)]
struct File {
    chunks: std::ops::Range<u32>,
    /// Why it cannot be read, if it cannot.
    broken: Option<String>,
}

/// The read path of a layer with a table of contents.
#[derive(Debug)]
pub struct TocPackage {
    flavour: Flavour,
    files: Vec<File>,
    chunks: Vec<Chunk>,
    /// eStargz's prioritized files: the layer's bytes before `.prefetch.landmark`.
    prioritized: Option<u64>,
}

/// The table-of-contents formats.
pub struct Toc;

impl Format for Toc {
    fn name(&self) -> &'static str {
        "toc"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        let Some(f) = footer(probe)? else {
            return Ok(None);
        };
        let (json, checked) = read_toc(&**blob, &f, cx.layer)?;
        let (entries, package) = parse(&json, &f, blob.size())?;
        Ok(Some(Opened {
            package: Box::new(package),
            entries,
            origin: IndexOrigin::Archive,
            checked,
        }))
    }
}

/// The table's JSON, checked against the digest `layer` gives for it, if it gives one.
fn read_toc(
    blob: &dyn Blob,
    f: &Footer,
    layer: Option<&super::LayerCheck>,
) -> Result<(Vec<u8>, Checked)> {
    let (want_blob, want_json) = (
        layer.and_then(|l| l.toc_blob.as_ref()),
        layer.and_then(|l| l.toc_json.as_ref()),
    );
    let what = format!("the table of contents of {}", blob.name().display());
    if f.len > MAX_TOC {
        return Err(Error::Format(format!("{what} is too large")));
    }
    let mut raw = vec![0u8; f.len as usize];
    blob.read_exact_at(&mut raw, f.offset)?;
    match f.flavour {
        Flavour::ZstdChunked => {
            if let Some(d) = want_blob {
                d.check(&raw, &what)?;
            }
            let mut out = Vec::with_capacity(f.ulen as usize);
            let n = zstd::bulk::Decompressor::new()?
                .decompress_to_buffer(raw.as_slice(), &mut out)
                .map_err(|e| Error::Corrupt(format!("{what} does not decompress: {e}")))?;
            if n as u64 != f.ulen {
                return Err(Error::Corrupt(format!(
                    "{what} holds {n} bytes, its footer says {}",
                    f.ulen
                )));
            }
            match (want_blob, want_json) {
                (Some(_), _) => Ok((out, Checked::Toc)),
                (None, Some(d)) => {
                    d.check(&out, &what)?;
                    Ok((out, Checked::Toc))
                }
                (None, None) => Ok((out, Checked::Nothing)),
            }
        }
        Flavour::Estargz => {
            let tar = gunzip(&raw, MAX_TOC + 64 * 1024)
                .map_err(|e| Error::Corrupt(format!("{what}: {e}")))?;
            let mut json = None;
            super::floor::tar::each(&tar[..], |te, data| {
                if te.path == b"stargz.index.json" && json.is_none() {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(data, &mut v)
                        .map_err(super::floor::tar::TarError::Io)?;
                    json = Some(v);
                }
                Ok(())
            })
            .map_err(|e| Error::Corrupt(format!("{what}: {e}")))?;
            let json =
                json.ok_or_else(|| Error::Corrupt(format!("{what}: no stargz.index.json")))?;
            match want_json {
                Some(d) => {
                    d.check(&json, &what)?;
                    Ok((json, Checked::Toc))
                }
                None => Ok((json, Checked::Nothing)),
            }
        }
    }
}

/// Decompress the gzip members of `raw` (at most `limit` bytes of output).
fn gunzip(raw: &[u8], limit: u64) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    while at < raw.len() {
        let Some(h) = super::floor::gzip::gzip_header(&raw[at..])? else {
            return Err("truncated gzip header".into());
        };
        at += h;
        let mut d = Inflater::new().map_err(|e| e.to_string())?;
        loop {
            let p = d.step(&raw[at..], &mut buf).map_err(|e| e.to_string())?;
            at += p.consumed;
            out.extend_from_slice(&buf[..p.produced]);
            if out.len() as u64 > limit {
                return Err("too large".into());
            }
            if p.ended {
                break;
            }
            if p.consumed == 0 && p.produced == 0 {
                return Err("truncated gzip member".into());
            }
        }
        at += 8; // CRC-32 and size
    }
    Ok(out)
}

/// Parse an RFC 3339 time (`2024-05-01T12:00:00Z`, `…+02:00`, fractions dropped) to
/// seconds since the epoch.
pub fn rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" | "z" => 0,
        r if r.len() == 6 && (r.starts_with('+') || r.starts_with('-')) => {
            let oh: i64 = r.get(1..3)?.parse().ok()?;
            let om: i64 = r.get(4..6)?.parse().ok()?;
            let o = oh * 3600 + om * 60;
            if r.starts_with('-') { -o } else { o }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

/// The end of a file's chunks: they must follow each other and hold its size, else the
/// file is broken (reads fail, the rest of the layer is served).
fn close_file(open: &mut Option<(usize, usize, u64)>, files: &mut [File], chunks: &[Chunk]) {
    let Some((_, fi, size)) = open.take() else {
        return;
    };
    let f = &mut files[fi];
    let mut at = 0u64;
    for c in &chunks[f.chunks.start as usize..f.chunks.end as usize] {
        if c.at != at {
            f.broken.get_or_insert_with(|| {
                format!(
                    "its chunks do not follow each other (one starts at {}, not {at})",
                    c.at
                )
            });
        }
        at = c.at.saturating_add(c.len);
    }
    if at != size {
        f.broken
            .get_or_insert_with(|| format!("its chunks hold {at} bytes, not its size {size}"));
    }
}

/// The kind of a table entry.
fn entry_kind(kind: &str) -> EntryKind {
    match kind {
        "reg" => EntryKind::File,
        "dir" => EntryKind::Dir,
        "symlink" => EntryKind::Symlink,
        "hardlink" => EntryKind::HardLink,
        "char" => EntryKind::CharDev,
        "block" => EntryKind::BlockDev,
        "fifo" => EntryKind::Fifo,
        _ => EntryKind::Special,
    }
}

/// The extended attributes of a table entry (values in base64), at most as many as a tar
/// header may carry.
fn xattrs_of(e: &TocEntry) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut xattrs = Vec::with_capacity(e.xattrs.len());
    for (k, v) in &e.xattrs {
        let value = base64::engine::general_purpose::STANDARD
            .decode(v)
            .map_err(|_| {
                Error::Corrupt(format!(
                    "table of contents: xattr {k:?} of {:?} is not base64",
                    e.name
                ))
            })?;
        xattrs.push((k.as_bytes().to_vec(), value));
    }
    if xattrs.len() > super::floor::tar::MAX_XATTRS {
        return Err(Error::Corrupt(format!(
            "{:?}: too many extended attributes",
            e.name
        )));
    }
    Ok(xattrs)
}

/// The [`Entry`] of a table entry, its data at `data`.
fn entry_of(
    e: &TocEntry,
    kind: EntryKind,
    data: Loc,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Entry> {
    Ok(Entry {
        path: e.name.as_bytes().to_vec(),
        kind,
        perm: (e.mode & 0o7777) as u16,
        mtime: if e.modtime.is_empty() {
            0
        } else {
            rfc3339(&e.modtime).ok_or_else(|| {
                Error::Corrupt(format!("{:?}: bad modtime {:?}", e.name, e.modtime))
            })?
        },
        uid: Some(e.uid),
        gid: Some(e.gid),
        size: match kind {
            EntryKind::File => e.size,
            EntryKind::Symlink => e.link_name.len() as u64,
            _ => 0,
        },
        data,
        link: e.link_name.as_bytes().to_vec(),
        rdev: if matches!(kind, EntryKind::CharDev | EntryKind::BlockDev) {
            libc::makedev(e.dev_major, e.dev_minor)
        } else {
            0
        },
        xattrs,
    })
}

/// Entries and read path from the table's JSON.
fn parse(json: &[u8], f: &Footer, blob_size: u64) -> Result<(Vec<Entry>, TocPackage)> {
    let toc: TocJson = serde_json::from_slice(json)
        .map_err(|e| Error::Corrupt(format!("table of contents: {e}")))?;
    if toc.version != 1 {
        return Err(Error::Unsupported(format!(
            "{} table of contents version {}",
            f.flavour.name(),
            toc.version
        )));
    }
    if toc.entries.len() > MAX_TOC_ENTRIES {
        return Err(Error::Format(format!(
            "table of contents lists more than {MAX_TOC_ENTRIES} entries"
        )));
    }
    // Compressed data ends where the table starts; every chunk starts before.
    let data_end = f.offset;
    let starts = chunk_starts(&toc.entries);
    let next_start = |coff: u64| -> u64 {
        let i = starts.partition_point(|&s| s <= coff);
        starts.get(i).copied().unwrap_or(data_end).min(data_end)
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(toc.entries.len());
    let mut files: Vec<File> = Vec::new();
    let mut chunks: Vec<Chunk> = Vec::new();
    // The file the next `chunk` entries belong to: its entry, file index and size.
    let mut open: Option<(usize, usize, u64)> = None;
    let mut prioritized = None;
    let close = close_file;
    for e in &toc.entries {
        if e.kind == "chunk" {
            let Some((ei, fi, size)) = open else {
                return Err(Error::Corrupt(format!(
                    "table of contents: a chunk of {:?} follows no file",
                    e.name
                )));
            };
            if e.name.as_bytes() != entries[ei].path.as_slice() {
                return Err(Error::Corrupt(format!(
                    "table of contents: a chunk of {:?} follows {:?}",
                    e.name,
                    String::from_utf8_lossy(&entries[ei].path)
                )));
            }
            // A chunk without a size runs to the end of its file (stargz-snapshotter's
            // writer leaves the last chunk's size out).
            let len = match e.chunk_size {
                0 => size.saturating_sub(e.chunk_offset),
                n => n,
            };
            chunks.push(chunk(
                e,
                e.chunk_offset,
                len,
                &e.chunk_digest,
                &next_start,
                blob_size,
            )?);
            files[fi].chunks.end = chunks.len() as u32;
            continue;
        }
        close(&mut open, &mut files, &chunks);
        let name = e.name.trim_start_matches("./");
        if FORMAT_FILES.contains(&name) {
            // The files an image's build found its start reading come first, up to the
            // landmark (eStargz's "prioritized files"; `ctr-remote image optimize`).
            if name == PREFETCH_LANDMARK && e.offset > 0 {
                prioritized = Some(e.offset.min(data_end));
            }
            continue;
        }
        let kind = entry_kind(&e.kind);
        let xattrs = xattrs_of(e)?;
        let data = if kind == EntryKind::File && e.size > 0 {
            let fi = files.len();
            let first = chunks.len() as u32;
            chunks.push(first_chunk(e, &next_start, blob_size)?);
            files.push(File {
                chunks: first..chunks.len() as u32,
                broken: None,
            });
            open = Some((entries.len(), fi, e.size));
            Loc::Record(fi as u32)
        } else {
            Loc::None
        };
        entries.push(entry_of(e, kind, data, xattrs)?);
    }
    close(&mut open, &mut files, &chunks);
    warn_broken(&files, &entries);
    Ok((
        entries,
        TocPackage {
            flavour: f.flavour,
            files,
            chunks,
            prioritized,
        },
    ))
}

/// Where the table's chunks start in the layer, sorted, each once.
fn chunk_starts(entries: &[TocEntry]) -> Vec<u64> {
    let mut starts: Vec<u64> = entries
        .iter()
        .filter(|e| e.kind == "chunk" || (e.kind == "reg" && e.size > 0))
        .map(|e| e.offset)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// The first chunk of file `e`, which its own entry describes (without `chunkSize`, the
/// whole file).
fn first_chunk(e: &TocEntry, next_start: &dyn Fn(u64) -> u64, blob_size: u64) -> Result<Chunk> {
    let len = if e.chunk_size > 0 {
        e.chunk_size
    } else {
        e.size
    };
    let digest = if !e.chunk_digest.is_empty() {
        &e.chunk_digest
    } else if len == e.size {
        &e.digest
    } else {
        &e.chunk_digest
    };
    let mut c = chunk(e, 0, len, digest, next_start, blob_size)?;
    if e.end_offset > e.offset && len == e.size {
        c.cend = c.cend.min(e.end_offset);
    }
    Ok(c)
}

/// A warning for each file whose chunks cannot serve it.
fn warn_broken(files: &[File], entries: &[Entry]) {
    for (fi, file) in files.iter().enumerate() {
        if let Some(why) = &file.broken {
            let path = entries
                .iter()
                .find(|e| e.data == Loc::Record(fi as u32))
                .map(|e| String::from_utf8_lossy(&e.path).into_owned())
                .unwrap_or_default();
            warn!("{path:?} cannot be read: {why}");
        }
    }
}

/// A chunk from a table entry.
fn chunk(
    e: &TocEntry,
    at: u64,
    len: u64,
    digest: &str,
    next_start: &dyn Fn(u64) -> u64,
    blob_size: u64,
) -> Result<Chunk> {
    if e.offset >= blob_size {
        return Err(Error::Corrupt(format!(
            "table of contents: {:?} starts outside the layer",
            e.name
        )));
    }
    Ok(Chunk {
        at,
        len,
        coff: e.offset,
        cend: next_start(e.offset),
        digest: if digest.is_empty() {
            None
        } else {
            Some(Digest::parse(digest)?)
        },
    })
}

impl TocPackage {
    fn file(&self, r: &Reading<'_>) -> Result<&File> {
        let Loc::Record(i) = r.loc else {
            return Err(Error::Format(format!("not a table entry: {:?}", r.loc)));
        };
        let f = self
            .files
            .get(*i as usize)
            .ok_or_else(|| Error::Corrupt(format!("file {i} is not in the table")))?;
        match &f.broken {
            Some(why) => Err(Error::Corrupt(why.clone())),
            None => Ok(f),
        }
    }

    /// Chunk `ci`, decoded and checked, through the cache; when it is not cached, the
    /// chunks that follow it in its file, up to `file_end` (the end of the file's last
    /// chunk in the layer) and [`FILE_AHEAD`] bytes, are asked for in the background.
    fn chunk(&self, r: &Reading<'_>, ci: u32, file_end: u64) -> Result<Arc<Block>> {
        let key = BlockKey {
            archive: r.key,
            unit: u64::from(ci),
            block: 0,
        };
        r.io.block(key, |_| {
            let c = &self.chunks[ci as usize];
            if c.len > MAX_CHUNK {
                return Err(Error::Unsupported(format!(
                    "a chunk of {} MiB (pkgfs decodes chunks of at most {} MiB)",
                    c.len >> 20,
                    MAX_CHUNK >> 20
                )));
            }
            let Some(digest) = &c.digest else {
                return Err(Error::Corrupt(
                    "the table of contents gives no digest for this chunk".into(),
                ));
            };
            if c.cend < file_end && r.blob.round_trips() {
                r.blob
                    .will_need(&[(c.cend, file_end.min(c.cend + FILE_AHEAD))]);
            }
            let data = match self.flavour {
                Flavour::ZstdChunked => unzstd(r.blob, c)?,
                Flavour::Estargz => ungzip(r.blob, c)?,
            };
            if let Err(e) = digest.check(&data, &format!("chunk at {} of the layer", c.coff)) {
                // Not kept for the next read: it may come right from the source.
                r.blob.forget();
                return Err(e);
            }
            r.io.count_read((c.cend - c.coff) as usize);
            r.io.count_decoded(data.len());
            let block = Arc::new(Block::new(data));
            r.io.cache().insert(key, block.clone());
            Ok(block)
        })
    }
}

/// Compressed input of chunk `c`, a piece at a time.
struct Input<'a> {
    blob: &'a dyn Blob,
    at: u64,
    end: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(blob: &'a dyn Blob, c: &Chunk) -> Self {
        let end = c.cend.min(blob.size());
        // A chunk of several pieces (a file without chunkSize is one chunk): all of it
        // asked for at once, or each piece waits its own round trip (python3.11, one
        // 2 MiB chunk, took nine 40 ms round trips one after the other).
        if blob.round_trips() && end - c.coff.min(end) > READ_CHUNK as u64 {
            blob.will_need(&[(c.coff, end)]);
        }
        Input {
            blob,
            at: c.coff,
            end,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// The unconsumed input, refilled when empty; empty at the bound.
    fn bytes(&mut self) -> Result<&[u8]> {
        if self.pos == self.buf.len() && self.at < self.end {
            let n = (self.end - self.at).min(READ_CHUNK as u64) as usize;
            self.buf.resize(n, 0);
            self.blob.read_exact_at(&mut self.buf, self.at)?;
            self.at += n as u64;
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..])
    }
}

fn short(c: &Chunk, got: usize) -> Error {
    Error::Corrupt(format!(
        "the chunk at {} of the layer ends after {got} of its {} bytes",
        c.coff, c.len
    ))
}

/// Decode zstd frames from the chunk's start until it has its size.
fn unzstd(blob: &dyn Blob, c: &Chunk) -> Result<Vec<u8>> {
    let mut out = vec![0u8; c.len as usize];
    let mut d = zstd_safe::DCtx::create();
    let mut input = Input::new(blob, c);
    let mut got = 0usize;
    while got < out.len() {
        let bytes = input.bytes()?;
        if bytes.is_empty() {
            return Err(short(c, got));
        }
        let mut inb = zstd_safe::InBuffer::around(bytes);
        let mut outb = zstd_safe::OutBuffer::around_pos(&mut out[..], got);
        d.decompress_stream(&mut outb, &mut inb).map_err(|code| {
            Error::Corrupt(format!(
                "the chunk at {} of the layer does not decompress: {}",
                c.coff,
                zstd_safe::get_error_name(code)
            ))
        })?;
        let (consumed, produced) = (inb.pos, outb.pos());
        if consumed == 0 && produced == got {
            return Err(short(c, got));
        }
        input.pos += consumed;
        got = produced;
    }
    Ok(out)
}

/// Inflate gzip members from the chunk's start until it has its size.
fn ungzip(blob: &dyn Blob, c: &Chunk) -> Result<Vec<u8>> {
    let mut out = vec![0u8; c.len as usize];
    let mut input = Input::new(blob, c);
    let mut got = 0usize;
    let mut d: Option<Inflater> = None;
    let mut header = Vec::new();
    while got < out.len() {
        match &mut d {
            None => {
                // A member header (it may straddle two reads of input).
                let bytes = input.bytes()?;
                if bytes.is_empty() {
                    return Err(short(c, got));
                }
                let take = bytes.len().min(64 * 1024 - header.len());
                header.extend_from_slice(&bytes[..take]);
                match super::floor::gzip::gzip_header(&header).map_err(Error::Corrupt)? {
                    Some(h) => {
                        // Give back what is past the header.
                        let extra = header.len() - h;
                        input.pos += take - extra;
                        header.clear();
                        d = Some(Inflater::new()?);
                    }
                    None => input.pos += take,
                }
            }
            Some(inf) => {
                let bytes = input.bytes()?;
                let p = inf.step(bytes, &mut out[got..])?;
                input.pos += p.consumed;
                got += p.produced;
                if p.ended {
                    d = None;
                    // Skip the trailer (CRC-32 and size): up to 8 bytes across reads.
                    let mut left = 8;
                    while left > 0 {
                        let b = input.bytes()?.len();
                        if b == 0 {
                            break;
                        }
                        let k = b.min(left);
                        input.pos += k;
                        left -= k;
                    }
                } else if p.consumed == 0 && p.produced == 0 {
                    return Err(short(c, got));
                }
            }
        }
    }
    Ok(out)
}

impl Package for TocPackage {
    fn format(&self) -> &'static str {
        self.flavour.name()
    }

    fn read_first(&self) -> Option<(u64, u64)> {
        self.prioritized.map(|end| (0, end))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        let probe = Probe::read(&**blob)?;
        let f = footer(&probe)?
            .ok_or_else(|| Error::Corrupt("the table of contents is gone".into()))?;
        let (json, _) = read_toc(&**blob, &f, cx.layer)?;
        parse(&json, &f, blob.size()).map(|(e, _)| e)
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        let f = self.file(r)?;
        let chunks = &self.chunks[f.chunks.start as usize..f.chunks.end as usize];
        gather(offset, end, span, |pos| {
            let i = chunks.partition_point(|c| c.at + c.len <= pos);
            let c = chunks
                .get(i)
                .ok_or_else(|| Error::Corrupt(format!("offset {pos} is in no chunk")))?;
            let file_end = chunks.last().map_or(c.cend, |l| l.cend);
            Ok((c.at, self.chunk(r, f.chunks.start + i as u32, file_end)?))
        })
    }

    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        let f = self.file(r).ok()?;
        let first = self.chunks.get(f.chunks.start as usize)?;
        let last = self.chunks.get(f.chunks.end.checked_sub(1)? as usize)?;
        Some((first.coff, last.cend))
    }

    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        let Ok(f) = self.file(r) else {
            return;
        };
        for ci in f.chunks.clone() {
            let c = &self.chunks[ci as usize];
            if c.at < end && c.at + c.len > start {
                let given = (c.at + c.len).min(end) - c.at.max(start);
                let key = BlockKey {
                    archive: r.key,
                    unit: u64::from(ci),
                    block: 0,
                };
                r.io.cache().delivered_bytes(&key, given, c.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_parse_to_epoch_seconds() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339("2026-11-24T14:55:48Z"), Some(1_795_532_148));
        assert_eq!(
            rfc3339("2026-11-24T16:55:48.123456789+02:00"),
            Some(1_795_532_148)
        );
        assert_eq!(rfc3339("1969-12-31T23:59:59Z"), Some(-1));
        assert_eq!(rfc3339("0001-01-01T00:00:00Z"), Some(-62_135_596_800));
        for bad in [
            "",
            "2026-11-24",
            "2026-13-01T00:00:00Z",
            "2026-11-24T14:55:48",
            "x026-11-24T14:55:48Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad:?}");
        }
    }
}
