//! Seekable-zstd package archives: opening them, from their embedded pkgfs index or a
//! scan of their tar headers.
//!
//! A seekable zstd file (facebook/zstd `contrib/seekable_format`) is a run of independent
//! zstd frames followed by a skippable frame holding a *seek table* (each frame's
//! compressed and decompressed size) that ends with a 9-byte footer and the magic number
//! `0x8F92EAB1`. Any frame can be decoded alone, so a byte range of the decompressed
//! stream costs only the frames that cover it (the seek table and the frames' read path
//! are the floor's: [`super::floor::frames`]).
//!
//! pkgfs packages (`pkgfs pack`, docs/FORMAT.md) are a POSIX tar stream stored this way,
//! with one more skippable frame between the last data frame and the seek table: the
//! *pkgfs index* ([`super::floor::codec`]), which lists every entry with its metadata and
//! the offset of its data in the decompressed tar stream. Mounting reads the seek table
//! and the index from the end of the file and nothing else.
//!
//! Seekable tar.zst files written by other tools have no pkgfs index. They are indexed
//! once by scanning their tar headers (which decompresses the stream once), and the
//! result is kept in an index cache (see [`super::IndexCache`]) so later mounts cost the same as
//! for a packed archive.

use std::sync::Arc;

use super::floor::codec::{MAX_INDEX_SIZE, decode_index, encode_index};
use super::floor::frames::{FrameReader, SeekTable, StreamReader, read_table};
use super::{
    Archive, Entry, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe, Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::{ReadData, Span};

fn bad(msg: impl Into<String>) -> Error {
    Error::Format(msg.into())
}

/// Read the pkgfs index between the last data frame and the seek table, if present.
pub fn read_embedded_index(
    blob: &dyn Blob,
    table: &SeekTable,
    probe: &Probe,
) -> Result<Option<Vec<Entry>>> {
    let gap = table.table_start - table.data_end;
    if gap == 0 {
        return Ok(None);
    }
    if gap > MAX_INDEX_SIZE {
        return Err(bad(format!(
            "{gap} bytes between the frames and the seek table"
        )));
    }
    let tail_start = probe.tail_start();
    let frame = if table.data_end >= tail_start {
        let at = (table.data_end - tail_start) as usize;
        probe.tail[at..at + gap as usize].to_vec()
    } else {
        let mut buf = vec![0u8; gap as usize];
        blob.read_exact_at(&mut buf, table.data_end)?;
        buf
    };
    decode_index(&frame, table.total).map(Some)
}

/// The seekable-zstd format: pkgfs packages, and seekable tar.zst written by other tools
/// (t2sz, pyzstd, zeekstd), whose index is made once by scanning their tar headers and
/// kept in the index cache.
pub struct SeekableZstd;

impl Format for SeekableZstd {
    fn name(&self) -> &'static str {
        "seekable-zstd"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        let Some(mut table) = read_table(&**blob, probe)? else {
            return Ok(None);
        };
        let (entries, origin) = entries_of(&**blob, &table, Some(probe), cx)?;
        table.count_file_bytes(&entries);
        Ok(Some(Opened {
            package: Box::new(SeekablePackage {
                frames: FrameReader { table },
            }),
            entries,
            origin,
            checked: super::Checked::Nothing,
        }))
    }
}

/// A hash of a seek table, which the index cache's key must match too.
fn table_hash(table: &SeekTable) -> String {
    let mut h = crc32fast::Hasher::new();
    for f in &table.frames {
        h.update(&f.csize.to_le_bytes());
        h.update(&f.dsize.to_le_bytes());
    }
    format!("{:08x}", h.finalize())
}

/// The entries of a seekable archive: its pkgfs index, else a cached index, else a scan
/// of its tar headers (stored in the cache for next time).
fn entries_of(
    blob: &dyn Blob,
    table: &SeekTable,
    probe: Option<&Probe>,
    cx: &OpenContext,
) -> Result<(Vec<Entry>, IndexOrigin)> {
    let read;
    let probe = match probe {
        Some(p) => p,
        None => {
            read = Probe::read(blob)?;
            &read
        }
    };
    if let Some(entries) = read_embedded_index(blob, table, probe)? {
        return Ok((entries, IndexOrigin::Archive));
    }
    let key = cx
        .index_cache
        .map(|c| (c, c.key("seekable-zstd", blob, &table_hash(table))));
    if let Some((c, k)) = &key
        && let Some(entries) = c.load(k).and_then(|b| decode_index(&b, table.total).ok())
    {
        log::debug!(
            "{}: index from cache {}",
            blob.name().display(),
            k.path().display()
        );
        return Ok((entries, IndexOrigin::Cache));
    }
    log::warn!(
        "{}: seekable archive without a pkgfs index: scanning its tar headers (once{})",
        blob.name().display(),
        if key.is_some() {
            "; the index is cached"
        } else {
            "; no index cache"
        }
    );
    let entries = scan(blob, table).map_err(|e| Error::Format(format!("tar stream: {e}")))?;
    for e in &entries {
        if let Loc::Stream(offset) = e.data
            && offset
                .checked_add(e.size)
                .is_none_or(|end| end > table.total)
        {
            return Err(Error::Format(
                "a tar entry runs past the end of the stream".into(),
            ));
        }
    }
    if let Some((c, k)) = &key {
        let stored = encode_index(&entries, 3)
            .map_err(Error::Io)
            .and_then(|b| c.store(k, &b));
        if let Err(e) = stored {
            log::warn!(
                "cannot store the index of {} in {}: {e}",
                blob.name().display(),
                k.path().display()
            );
        }
    }
    Ok((entries, IndexOrigin::Pass))
}

/// The entries of the tar stream of a seekable archive, by decoding it all.
fn scan(blob: &dyn Blob, table: &SeekTable) -> std::result::Result<Vec<Entry>, String> {
    super::floor::tar::scan(StreamReader::new(blob, table))
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|t| t.into_entry(Loc::Stream))
        .collect()
}

/// An open seekable archive: the frames' read path, and its index from the archive (or
/// the index cache).
#[derive(Debug)]
pub struct SeekablePackage {
    /// The frames and their seek table.
    pub frames: FrameReader,
}

impl Package for SeekablePackage {
    fn format(&self) -> &'static str {
        "seekable-zstd"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        entries_of(&**blob, &self.frames.table, None, cx).map(|(e, _)| e)
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, span: Span) -> Result<ReadData> {
        self.frames.read(r, offset, end, span)
    }

    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        self.frames.extent(r)
    }

    fn delivered(&self, r: &Reading<'_>, start: u64, end: u64) {
        self.frames.delivered(r, start, end);
    }

    /// Decode every frame (verifying the zstd checksums), scan the tar stream, and
    /// compare it with the index the mount uses.
    fn verify(&self, archive: &Archive, cx: &OpenContext) -> Result<Vec<String>> {
        let index = self.entries(&archive.blob, cx)?;
        let scanned = scan(&*archive.blob, &self.frames.table).map_err(Error::Corrupt)?;
        Ok(compare(&index, &scanned))
    }
}

/// The differences between an index and the entries of the tar stream it describes.
pub fn compare(index: &[Entry], scanned: &[Entry]) -> Vec<String> {
    let mut problems = Vec::new();
    if scanned.len() != index.len() {
        problems.push(format!(
            "the index lists {} entries, the tar stream has {}",
            index.len(),
            scanned.len()
        ));
    }
    let trim = |p: &[u8]| -> Vec<u8> {
        let p = p.strip_prefix(b"./").unwrap_or(p);
        p.strip_suffix(b"/").unwrap_or(p).to_vec()
    };
    for (i, s) in index.iter().zip(scanned) {
        let same = trim(&i.path) == trim(&s.path)
            && i.kind == s.kind
            && i.size == s.size
            && i.data == s.data
            && i.link == s.link;
        if !same {
            problems.push(format!(
                "index entry {:?} disagrees with the tar stream ({:?})",
                String::from_utf8_lossy(&i.path),
                String::from_utf8_lossy(&s.path)
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::EntryKind;
    use crate::format::floor::frames::*;
    use crate::format::floor::{SKIPPABLE_HEADER, le32};

    fn entry(path: &str, kind: EntryKind, size: u64, offset: u64) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            perm: 0o640,
            mtime: -5,
            uid: Some(1000),
            gid: Some(7),
            size,
            data: if kind == EntryKind::File {
                Loc::Stream(offset)
            } else {
                Loc::None
            },
            link: if kind == EntryKind::Symlink {
                b"target".to_vec()
            } else {
                Vec::new()
            },
            rdev: 0,
            xattrs: Vec::new(),
        }
    }

    #[test]
    fn seek_table_round_trip_and_lookup() {
        let t = encode_seek_table(&[(10, 100), (20, 50), (5, 1)]);
        let size = 35 + t.len() as u64;
        assert_eq!(probe(&t, size).unwrap(), TableProbe::NeedTail(t.len()));
        let s = parse_seek_table(&t, size).unwrap();
        assert_eq!(s.total, 151);
        assert_eq!(s.data_end, 35);
        assert_eq!(
            s.frames[1],
            Frame {
                coff: 10,
                csize: 20,
                doff: 100,
                dsize: 50
            }
        );
        assert_eq!(s.frame_at(0), Some(0));
        assert_eq!(s.frame_at(99), Some(0));
        assert_eq!(s.frame_at(100), Some(1));
        assert_eq!(s.frame_at(150), Some(2));
        assert_eq!(s.frame_at(151), None);
        // A table that claims more frame bytes than the file holds is refused.
        assert!(parse_seek_table(&t, 20 + t.len() as u64).is_err());
    }

    #[test]
    fn damaged_seek_tables_are_errors() {
        let t = encode_seek_table(&[(10, 100)]);
        let size = 10 + t.len() as u64;
        for cut in 0..t.len() {
            // Truncations either lose the footer (absent) or fail; never panic.
            let _ = probe(&t[cut..], size);
            let _ = parse_seek_table(&t[cut..], size);
        }
        let mut lying = t.clone();
        let n = lying.len();
        lying[n - 9..n - 5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(probe(&lying, size).is_err());
        assert_eq!(
            probe(b"not a seekable file", 100).unwrap(),
            TableProbe::Absent
        );
    }

    #[test]
    fn index_round_trip_and_bounds() {
        let entries = vec![
            entry("dir", EntryKind::Dir, 0, 0),
            entry("dir/f", EntryKind::File, 10, 512),
            entry("dir/l", EntryKind::Symlink, 6, 0),
        ];
        let frame = encode_index(&entries, 3).unwrap();
        assert_eq!(decode_index(&frame, 522).unwrap(), entries);
        let e = decode_index(&frame, 521).unwrap_err();
        assert!(e.to_string().contains("outside the stream"), "{e}");
        let mut bad_crc = frame.clone();
        let at = SKIPPABLE_HEADER + 20;
        bad_crc[at] ^= 1;
        assert!(decode_index(&bad_crc, 522).is_err());
        for cut in 0..frame.len() {
            assert!(decode_index(&frame[..cut], 522).is_err());
        }
    }

    #[test]
    fn version_2_carries_devices_and_extended_attributes_and_version_1_stays_as_it_was() {
        let plain = vec![entry("f", EntryKind::File, 10, 0)];
        let v1 = encode_index(&plain, 3).unwrap();
        assert_eq!(
            le32(&v1, SKIPPABLE_HEADER + 8),
            1,
            "nothing needs version 2"
        );
        let mut dev = entry("null", EntryKind::CharDev, 0, 0);
        dev.rdev = libc::makedev(1, 3);
        let mut f = entry("cap", EntryKind::File, 10, 0);
        f.xattrs = vec![
            (b"security.capability".to_vec(), vec![1, 0, 0, 2, 0, 32]),
            (b"user.x".to_vec(), b"with = and \n\0 inside".to_vec()),
        ];
        let all = vec![dev, f, entry("pipe", EntryKind::Fifo, 0, 0)];
        let v2 = encode_index(&all, 3).unwrap();
        assert_eq!(le32(&v2, SKIPPABLE_HEADER + 8), 2);
        assert_eq!(decode_index(&v2, 100).unwrap(), all);
        for cut in 0..v2.len() {
            assert!(decode_index(&v2[..cut], 100).is_err());
        }
    }

    #[test]
    fn fuzz_regressions_fail_cleanly() {
        // Found by `cargo fuzz run seekable_index`: an index frame claiming a 2 GiB body
        // made the decoder allocate it up front.
        let oom = include_bytes!("../../fuzz/regressions/seekable_index_oom.bin");
        assert!(decode_index(oom, 1 << 30).is_err());
    }
}
