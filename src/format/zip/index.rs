//! The ZIP index: the end-of-central-directory record (ZIP64 included) and the central
//! directory, nothing else.
//!
//! pkgfs parses ZIP itself rather than through the `zip` crate because mounting must cost
//! only the size of the central directory: the crate's per-member API reads each local
//! header, one seek per entry, and does not expose the Unix owner field. The parsers here
//! are pure functions over byte slices so they can be fuzzed and tested without files.
//!
//! What is taken from each central-directory record (APPNOTE 4.3.12):
//! - type and permissions from the external attributes: the high 16 bits are a Unix
//!   `st_mode` when the "made by" host is Unix (3) or OS X (19); otherwise the DOS
//!   directory (0x10) and read-only (0x01) bits are used;
//! - mtime from the extended-timestamp field (0x5455), else the NTFS field (0x000a), else
//!   the DOS date and time read as local time, as Info-ZIP's `unzip` does;
//! - owner from the Info-ZIP "ux" field (0x7875);
//! - ZIP64 sizes and offsets from field 0x0001; the UTF-8 name from the Info-ZIP Unicode
//!   path field (0x7075) when its CRC matches the stored name.
//!
//! Archives with data prepended (self-extracting archives) are handled as `unzip` does:
//! the distance between where the central directory says it ends and where the end record
//! really is becomes an offset added to every position.

use crate::error::Error;
use crate::format::{Entry, EntryKind, Loc};
use crate::io::blob::Blob;

/// Where a member's bytes are and how they are encoded: a central-directory record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZipData {
    /// Absolute offset of the member's local file header in the archive file.
    pub header_offset: u64,
    /// Size of the (possibly compressed) data.
    pub compressed_size: u64,
    /// CRC-32 of the uncompressed data, from the central directory.
    pub crc32: u32,
    /// The ZIP compression method number (0 stored, 8 deflate, 93 zstd, …).
    pub method: u16,
    /// The member is encrypted (general purpose flag bit 0).
    pub encrypted: bool,
    /// Length and CRC-32 of the name stored in the central directory: the local header
    /// must carry the same name, or the entry overlaps another (a zip-bomb trick).
    pub name_len: u16,
    /// See `name_len`.
    pub name_crc: u32,
    /// The external attributes as stored (an installer's rules may read them: pip
    /// marks a member executable only if their high half is a regular file's mode with
    /// an execute bit, whatever the host).
    pub external: u32,
}

/// A parsed central directory: the entries, and the records of those with data
/// (`Loc::Record(n)` is `records[n]`).
#[derive(Debug, Default)]
pub struct Index {
    /// The entries in directory order.
    pub entries: Vec<Entry>,
    /// The records of the entries that have data.
    pub records: Vec<ZipData>,
}

const EOCD_SIG: &[u8; 4] = b"PK\x05\x06";
const EOCD_LEN: usize = 22;
const ZIP64_LOCATOR_SIG: &[u8; 4] = b"PK\x06\x07";
const ZIP64_LOCATOR_LEN: usize = 20;
const ZIP64_EOCD_SIG: &[u8; 4] = b"PK\x06\x06";
const ZIP64_EOCD_LEN: usize = 56;
const CDFH_SIG: &[u8; 4] = b"PK\x01\x02";
const CDFH_LEN: usize = 46;
const LFH_SIG: &[u8; 4] = b"PK\x03\x04";
/// Length of the fixed part of a local file header.
pub const LFH_LEN: usize = 30;
/// The end record sits within the last `EOCD_LEN + 65535` bytes (the comment is at most
/// 65535 bytes); a ZIP64 locator and record may precede it.
const MAX_TAIL: usize = EOCD_LEN + 65535 + ZIP64_LOCATOR_LEN + ZIP64_EOCD_LEN;

/// Compression methods pkgfs decodes.
pub const METHOD_STORED: u16 = 0;
/// Deflate.
pub const METHOD_DEFLATE: u16 = 8;
/// Zstandard (APPNOTE 4.4.5, method 93).
pub const METHOD_ZSTD: u16 = 93;

/// Why an index could not be read.
#[derive(Debug)]
pub enum IndexError {
    /// No end-of-central-directory record: not a ZIP file.
    NotZip,
    /// A ZIP file whose index is unusable.
    Bad(Error),
}

impl From<Error> for IndexError {
    fn from(e: Error) -> Self {
        IndexError::Bad(e)
    }
}

fn bad(msg: impl Into<String>) -> IndexError {
    IndexError::Bad(Error::Format(msg.into()))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Where the central directory is, as read from the end records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locator {
    /// Absolute offset of the central directory in the file.
    pub cd_offset: u64,
    /// Its size in bytes.
    pub cd_size: u64,
    /// Bytes of data prepended to the archive (added to every recorded offset).
    pub shift: u64,
}

/// Find the end-of-central-directory record in `tail` (the last bytes of the file):
/// the last signature whose comment length reaches exactly the end of the file, or
/// failing that (trailing junk), the last signature with a whole record after it.
pub fn find_eocd(tail: &[u8]) -> Option<usize> {
    if tail.len() < EOCD_LEN {
        return None;
    }
    let mut lax = None;
    for pos in (0..=tail.len() - EOCD_LEN).rev() {
        if &tail[pos..pos + 4] != EOCD_SIG {
            continue;
        }
        let comment = u16_at(tail, pos + 20) as usize;
        if pos + EOCD_LEN + comment == tail.len() {
            return Some(pos);
        }
        lax.get_or_insert(pos);
    }
    lax
}

/// The last bytes of an archive, holding its end record.
pub struct Tail {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their offset in the file.
    pub start: u64,
    /// Position of the end record within `bytes`.
    pub eocd: usize,
}

/// Read the last [`Blob::first_tail`] bytes of a file (the first read of every
/// archive). Most archives have no comment, so the end record is in the last 22 bytes,
/// and a small archive's whole central directory usually fits in this first read too.
pub fn first_tail(blob: &dyn Blob, size: u64) -> Result<(Vec<u8>, u64), Error> {
    let want = size.min(blob.first_tail()) as usize;
    let start = size - want as u64;
    let mut bytes = vec![0u8; want];
    blob.read_exact_at(&mut bytes, start)?;
    Ok((bytes, start))
}

/// Find the end record in `first` (the file's last bytes, from [`first_tail`]); for
/// archives with a long comment, read the largest tail that can hold it.
pub fn find_tail(blob: &dyn Blob, size: u64, first: Vec<u8>) -> Result<Tail, IndexError> {
    if let Some(eocd) = find_eocd(&first) {
        return Ok(Tail {
            start: size - first.len() as u64,
            bytes: first,
            eocd,
        });
    }
    let max = size.min(MAX_TAIL as u64) as usize;
    if max <= first.len() {
        return Err(IndexError::NotZip);
    }
    let start = size - max as u64;
    let mut bytes = vec![0u8; max];
    blob.read_exact_at(&mut bytes, start)?;
    let eocd = find_eocd(&bytes).ok_or(IndexError::NotZip)?;
    Ok(Tail { bytes, start, eocd })
}

/// Locate the central directory from the end records in `tail`.
pub fn locate(blob: &dyn Blob, size: u64, tail: &Tail) -> Result<Locator, IndexError> {
    let (tail_start, pos) = (tail.start, tail.eocd);
    let tail = &tail.bytes;
    let eocd = &tail[pos..pos + EOCD_LEN];
    let eocd_abs = tail_start + pos as u64;
    if u16_at(eocd, 4) != 0 || u16_at(eocd, 6) != 0 {
        return Err(IndexError::Bad(Error::Unsupported(
            "multi-disk (spanned) archives".into(),
        )));
    }
    let mut cd_size = u64::from(u32_at(eocd, 12));
    let mut cd_offset = u64::from(u32_at(eocd, 16));
    let mut cd_end = eocd_abs;

    // A ZIP64 locator sits right before the end record.
    if eocd_abs >= ZIP64_LOCATOR_LEN as u64 {
        let mut loc = [0u8; ZIP64_LOCATOR_LEN];
        let loc_abs = eocd_abs - ZIP64_LOCATOR_LEN as u64;
        if pos >= ZIP64_LOCATOR_LEN {
            loc.copy_from_slice(&tail[pos - ZIP64_LOCATOR_LEN..pos]);
        } else {
            blob.read_exact_at(&mut loc, loc_abs)?;
        }
        if &loc[0..4] == ZIP64_LOCATOR_SIG {
            let recorded = u64_at(&loc, 8);
            // The record normally ends right at the locator; with prepended data the
            // recorded offset is short by the prefix, so look there first.
            let expected = loc_abs
                .checked_sub(ZIP64_EOCD_LEN as u64)
                .ok_or_else(|| bad("ZIP64 locator too close to the start"))?;
            let mut rec = [0u8; ZIP64_EOCD_LEN];
            let mut found = None;
            for at in [expected, recorded] {
                if at
                    .checked_add(ZIP64_EOCD_LEN as u64)
                    .is_some_and(|e| e <= size)
                {
                    blob.read_exact_at(&mut rec, at)?;
                    if &rec[0..4] == ZIP64_EOCD_SIG {
                        found = Some(at);
                        break;
                    }
                }
            }
            let at = found.ok_or_else(|| bad("ZIP64 end record not found"))?;
            cd_size = u64_at(&rec, 40);
            cd_offset = u64_at(&rec, 48);
            cd_end = at;
        }
    }
    let recorded_end = cd_offset
        .checked_add(cd_size)
        .ok_or_else(|| bad("central directory size overflows"))?;
    if recorded_end > cd_end {
        return Err(bad(format!(
            "central directory ({cd_size} bytes at {cd_offset}) runs past its end record at {cd_end}"
        )));
    }
    let shift = cd_end - recorded_end;
    Ok(Locator {
        cd_offset: cd_offset + shift,
        cd_size,
        shift,
    })
}

/// Read the whole index of a ZIP file.
pub fn read_index(blob: &dyn Blob) -> Result<Index, IndexError> {
    let size = blob.size();
    let (first, _) = first_tail(blob, size)?;
    read_index_from(blob, size, first)
}

/// Read the whole index of a ZIP file whose last bytes (`first`) were already read.
pub fn read_index_from(blob: &dyn Blob, size: u64, first: Vec<u8>) -> Result<Index, IndexError> {
    let tail = find_tail(blob, size, first)?;
    let loc = locate(blob, size, &tail)?;
    let len = usize::try_from(loc.cd_size).map_err(|_| bad("central directory too large"))?;
    // The directory is often inside the tail already read.
    if let Some(rel) = loc.cd_offset.checked_sub(tail.start)
        && let Some(cd) = tail.bytes.get(rel as usize..rel as usize + len)
    {
        return parse_central_directory(cd, loc.shift, size).map_err(IndexError::Bad);
    }
    let mut cd = vec![0u8; len];
    blob.read_exact_at(&mut cd, loc.cd_offset)?;
    parse_central_directory(&cd, loc.shift, size).map_err(IndexError::Bad)
}

/// Parse every record of a central directory. `shift` is added to local header offsets;
/// `archive_size` bounds them. A malformed record fails the whole archive: a directory
/// that cannot be trusted in one place cannot be trusted elsewhere.
pub fn parse_central_directory(cd: &[u8], shift: u64, archive_size: u64) -> Result<Index, Error> {
    let mut entries = Vec::with_capacity(cd.len() / (CDFH_LEN + 16));
    let mut records = Vec::with_capacity(entries.capacity());
    let mut pos = 0usize;
    while pos < cd.len() {
        let rest = &cd[pos..];
        if rest.len() < CDFH_LEN || &rest[0..4] != CDFH_SIG {
            // Some writers pad the directory; a digital signature record (PK\x05\x05)
            // may follow the last header. Anything else is damage.
            if rest.len() >= 4 && &rest[0..4] == b"PK\x05\x05" {
                break;
            }
            return Err(Error::Format(format!(
                "bad central directory record at byte {pos} of the directory"
            )));
        }
        let name_len = u16_at(rest, 28) as usize;
        let extra_len = u16_at(rest, 30) as usize;
        let comment_len = u16_at(rest, 32) as usize;
        let total = CDFH_LEN + name_len + extra_len + comment_len;
        if rest.len() < total {
            return Err(Error::Format(format!(
                "central directory record at byte {pos} is truncated"
            )));
        }
        let name = &rest[CDFH_LEN..CDFH_LEN + name_len];
        let extra = &rest[CDFH_LEN + name_len..CDFH_LEN + name_len + extra_len];
        let (mut entry, record) = parse_record(rest, name, extra, shift, archive_size)?;
        if let Some(r) = record {
            entry.data = Loc::Record(records.len() as u32);
            records.push(r);
        }
        entries.push(entry);
        pos += total;
    }
    Ok(Index { entries, records })
}

fn parse_record(
    rec: &[u8],
    name: &[u8],
    extra: &[u8],
    shift: u64,
    archive_size: u64,
) -> Result<(Entry, Option<ZipData>), Error> {
    let host = rec[5];
    let flags = u16_at(rec, 8);
    let method = u16_at(rec, 10);
    let dos_time = u16_at(rec, 12);
    let dos_date = u16_at(rec, 14);
    let crc32 = u32_at(rec, 16);
    let mut compressed_size = u64::from(u32_at(rec, 20));
    let mut size = u64::from(u32_at(rec, 24));
    let external = u32_at(rec, 38);
    let mut header_offset = u64::from(u32_at(rec, 42));

    let x = Extras::read(
        extra,
        name,
        [&mut size, &mut compressed_size, &mut header_offset],
    );
    let (uid, gid) = (x.uid, x.gid);
    let path = x.unicode_name.unwrap_or_else(|| name.to_vec());
    let mtime = x
        .mtime
        .or(x.ntfs_mtime)
        .unwrap_or_else(|| dos_to_unix(dos_date, dos_time));
    let (kind, perm) = kind_and_perm(host, external, &path);
    let header_offset = header_offset
        .checked_add(shift)
        .filter(|off| off.saturating_add(LFH_LEN as u64) <= archive_size)
        .ok_or_else(|| {
            Error::Format(format!(
                "member {:?} has a local header offset outside the file",
                String::from_utf8_lossy(&path)
            ))
        })?;
    let record = match kind {
        EntryKind::Dir => None,
        _ => Some(ZipData {
            header_offset,
            compressed_size,
            crc32,
            method,
            encrypted: flags & 1 != 0,
            name_len: name.len() as u16,
            name_crc: crc32fast::hash(name),
            external,
        }),
    };
    let entry = Entry {
        path,
        kind,
        perm,
        mtime,
        uid,
        gid,
        size: if kind == EntryKind::Dir { 0 } else { size },
        data: Loc::None,
        link: Vec::new(),
        rdev: 0,
        xattrs: Vec::new(),
    };
    Ok((entry, record))
}

/// What a central directory record's extra fields say.
#[derive(Default)]
struct Extras {
    /// Modification time (UT).
    mtime: Option<i64>,
    /// Modification time (NTFS).
    ntfs_mtime: Option<i64>,
    /// Owner (ux).
    uid: Option<u32>,
    gid: Option<u32>,
    /// The path in UTF-8 (Unicode path), if it belongs to this `name`.
    unicode_name: Option<Vec<u8>>,
}

impl Extras {
    /// Read the extra fields `extra` of the record of `name`. A ZIP64 field replaces
    /// the saturated ones of `sizes` (size, compressed size, local header offset).
    fn read(extra: &[u8], name: &[u8], mut sizes: [&mut u64; 3]) -> Extras {
        let mut x = Extras::default();
        for (id, data) in ExtraFields(extra) {
            match id {
                0x0001 => {
                    // ZIP64: only the fields whose 32-bit value is saturated, in this order.
                    let mut at = 0;
                    for v in &mut sizes {
                        if **v == 0xFFFF_FFFF && data.len() >= at + 8 {
                            **v = u64_at(data, at);
                            at += 8;
                        }
                    }
                }
                0x5455 if !data.is_empty() && data[0] & 1 != 0 && data.len() >= 5 => {
                    x.mtime = Some(i64::from(u32_at(data, 1)));
                }
                0x000a => x.ntfs_mtime = parse_ntfs_mtime(data),
                0x7875 => {
                    if let Some((u, g)) = parse_unix_owner(data) {
                        x.uid = Some(u);
                        x.gid = Some(g);
                    }
                }
                0x7075
                    if data.len() >= 5
                        && data[0] == 1
                        && u32_at(data, 1) == crc32fast::hash(name) =>
                {
                    x.unicode_name = Some(data[5..].to_vec());
                }
                _ => {}
            }
        }
        x
    }
}

/// The kind and permissions of a member from its host system, external attributes
/// (Unix mode from Unix hosts; MS-DOS directory and read-only bits) and path.
fn kind_and_perm(host: u8, external: u32, path: &[u8]) -> (EntryKind, u16) {
    let unix_mode = if matches!(host, 3 | 19) {
        external >> 16
    } else {
        0
    };
    let ends_with_slash = matches!(path.last(), Some(b'/' | b'\\'));
    let kind = match unix_mode & libc::S_IFMT {
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        libc::S_IFREG => {
            if ends_with_slash {
                EntryKind::Dir
            } else {
                EntryKind::File
            }
        }
        0 if ends_with_slash || external & 0x10 != 0 => EntryKind::Dir,
        0 => EntryKind::File,
        _ => EntryKind::Special,
    };
    let perm = if unix_mode != 0 {
        (unix_mode & 0o7777) as u16
    } else {
        match kind {
            EntryKind::Dir => 0o755,
            _ if external & 1 != 0 => 0o444,
            _ => 0o644,
        }
    };
    (kind, perm)
}

/// Iterator over the `(id, data)` pairs of an extra field; stops at the first field that
/// does not fit (some writers leave padding at the end).
struct ExtraFields<'a>(&'a [u8]);

impl<'a> Iterator for ExtraFields<'a> {
    type Item = (u16, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        if self.0.len() < 4 {
            return None;
        }
        let id = u16_at(self.0, 0);
        let len = u16_at(self.0, 2) as usize;
        if self.0.len() < 4 + len {
            self.0 = &[];
            return None;
        }
        let data = &self.0[4..4 + len];
        self.0 = &self.0[4 + len..];
        Some((id, data))
    }
}

/// NTFS extra field: 4 reserved bytes, then tagged attributes; tag 1 holds the three
/// FILETIMEs (100 ns since 1601), modification time first.
fn parse_ntfs_mtime(data: &[u8]) -> Option<i64> {
    let mut rest = data.get(4..)?;
    while rest.len() >= 4 {
        let tag = u16_at(rest, 0);
        let len = u16_at(rest, 2) as usize;
        let body = rest.get(4..4 + len)?;
        if tag == 1 && len >= 8 {
            let ft = u64_at(body, 0) as i64;
            return Some((ft - 116_444_736_000_000_000).div_euclid(10_000_000));
        }
        rest = &rest[4 + len..];
    }
    None
}

/// Info-ZIP "ux" field: version 1, then uid and gid as (size, little-endian value).
fn parse_unix_owner(data: &[u8]) -> Option<(u32, u32)> {
    if data.first() != Some(&1) {
        return None;
    }
    let mut at = 1;
    let mut take = || -> Option<u32> {
        let n = *data.get(at)? as usize;
        let bytes = data.get(at + 1..at + 1 + n)?;
        at += 1 + n;
        if n == 0 || n > 8 {
            return None;
        }
        let mut v = 0u64;
        for (i, b) in bytes.iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        u32::try_from(v).ok()
    };
    let uid = take()?;
    let gid = take()?;
    Some((uid, gid))
}

/// MS-DOS date and time (local time, 2-second resolution) to seconds since the epoch,
/// read in the daemon's time zone as Info-ZIP `unzip` and Python's `zipfile` write them.
///
/// `mktime` is slow in bulk (glibc re-checks `/etc/localtime` with a `stat` and takes a
/// global lock on every call: a million entries cost seconds of system time and lock
/// contention between indexing threads), so it is called once per distinct date and hour
/// and the minutes and seconds are added to that; a per-thread cache keeps the results.
pub fn dos_to_unix(date: u16, time: u16) -> i64 {
    thread_local! {
        static HOURS: std::cell::RefCell<std::collections::HashMap<(u16, u16), i64>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    let hour = time >> 11;
    let rest = i64::from((time >> 5) & 0x3f) * 60 + i64::from(time & 0x1f) * 2;
    let base = HOURS.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(&b) = c.get(&(date, hour)) {
            return b;
        }
        if c.len() >= 65536 {
            c.clear();
        }
        let b = mktime_local(date, hour);
        c.insert((date, hour), b);
        b
    });
    if base == -1 { 0 } else { base + rest }
}

/// `mktime` of a DOS date at the start of `hour` (-1 if it cannot be represented).
fn mktime_local(date: u16, hour: u16) -> i64 {
    // SAFETY: `tm` is plain data, zero-initialised and then filled in; mktime only reads
    // and normalises it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = i32::from(date >> 9) + 80;
    tm.tm_mon = (i32::from((date >> 5) & 0xf) - 1).max(0);
    tm.tm_mday = i32::from(date & 0x1f).max(1);
    tm.tm_hour = i32::from(hour);
    tm.tm_isdst = -1;
    // SAFETY: a valid, initialised `tm`; mktime is thread-safe in glibc.
    unsafe { libc::mktime(&mut tm) }
}

/// Given a local file header and the name after it (`LFH_LEN + name_len` bytes), the
/// offset of the member's data relative to the header's start. The name must be the one
/// the central directory gave (`name_len`, `name_crc`): entries whose local header names
/// another file overlap it, the trick of overlapping zip bombs, and are refused.
pub fn local_data_offset(lfh: &[u8], name_len: u16, name_crc: u32) -> Result<u64, Error> {
    if lfh.len() < LFH_LEN || &lfh[0..4] != LFH_SIG {
        return Err(Error::Format("bad local file header signature".into()));
    }
    let local_len = u16_at(lfh, 26);
    let name = lfh.get(LFH_LEN..LFH_LEN + usize::from(local_len));
    if local_len != name_len || name.is_none_or(|n| crc32fast::hash(n) != name_crc) {
        return Err(Error::Corrupt(
            "the local header names another file than the central directory (overlapping entries)"
                .into(),
        ));
    }
    Ok(LFH_LEN as u64 + u64::from(local_len) + u64::from(u16_at(lfh, 28)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cached_dos_times_equal_mktime_of_every_field() {
        // Dates away from any zone's DST changes; every minute and second, odd ones too.
        for (y, m, d) in [
            (1980, 1, 1),
            (2001, 1, 10),
            (2024, 6, 20),
            (2037, 8, 5),
            (2099, 12, 1),
        ] {
            let date = ((y - 1980) << 9 | m << 5 | d) as u16;
            for hour in [0u16, 7, 13, 23] {
                for minute in (0u16..64).step_by(7) {
                    for sec2 in [0u16, 1, 29, 31] {
                        let time = hour << 11 | minute << 5 | sec2;
                        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
                        tm.tm_year = y - 1900;
                        tm.tm_mon = m - 1;
                        tm.tm_mday = d;
                        tm.tm_hour = i32::from(hour);
                        tm.tm_min = i32::from(minute);
                        tm.tm_sec = i32::from(sec2) * 2;
                        tm.tm_isdst = -1;
                        let want = unsafe { libc::mktime(&mut tm) };
                        assert_eq!(dos_to_unix(date, time), want, "{y}-{m}-{d} {time:#x}");
                        // Again, from the cache.
                        assert_eq!(dos_to_unix(date, time), want);
                    }
                }
            }
        }
    }

    use super::*;

    fn cdfh(name: &[u8], host: u8, external: u32, extra: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(CDFH_SIG);
        r.extend_from_slice(&[20, host, 20, 0]); // made by, needed
        r.extend_from_slice(&0u16.to_le_bytes()); // flags
        r.extend_from_slice(&8u16.to_le_bytes()); // method
        r.extend_from_slice(&0u16.to_le_bytes()); // time
        r.extend_from_slice(&((45u16 << 9) | (1 << 5) | 1).to_le_bytes()); // 2025-01-01
        r.extend_from_slice(&0xdead_beefu32.to_le_bytes()); // crc
        r.extend_from_slice(&10u32.to_le_bytes()); // csize
        r.extend_from_slice(&20u32.to_le_bytes()); // usize
        r.extend_from_slice(&(name.len() as u16).to_le_bytes());
        r.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        r.extend_from_slice(&0u16.to_le_bytes()); // comment
        r.extend_from_slice(&0u16.to_le_bytes()); // disk
        r.extend_from_slice(&0u16.to_le_bytes()); // internal
        r.extend_from_slice(&external.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes()); // offset
        r.extend_from_slice(name);
        r.extend_from_slice(extra);
        r
    }

    #[test]
    fn unix_modes_and_extra_fields() {
        let mut extra = Vec::new();
        extra.extend_from_slice(&[0x55, 0x54, 5, 0, 1]);
        extra.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        extra.extend_from_slice(&[0x75, 0x78, 11, 0, 1, 4]);
        extra.extend_from_slice(&1000u32.to_le_bytes());
        extra.push(4);
        extra.extend_from_slice(&100u32.to_le_bytes());
        let mut cd = cdfh(b"bin/tool", 3, (0o100755) << 16, &extra);
        cd.extend(cdfh(b"link", 3, (0o120777) << 16, &[]));
        cd.extend(cdfh(b"dir/", 0, 0x10, &[]));
        cd.extend(cdfh(b"ro.txt", 0, 0x01, &[]));
        cd.extend(cdfh(b"dev", 3, (0o020644) << 16, &[]));
        let idx = parse_central_directory(&cd, 0, 1000).unwrap();
        let e = &idx.entries;
        assert_eq!(e.len(), 5);
        assert_eq!(e[0].kind, EntryKind::File);
        assert_eq!(e[0].perm, 0o755);
        assert_eq!(e[0].mtime, 1_700_000_000);
        assert_eq!((e[0].uid, e[0].gid), (Some(1000), Some(100)));
        assert_eq!(e[0].size, 20);
        assert_eq!(e[1].kind, EntryKind::Symlink);
        assert_eq!(e[2].kind, EntryKind::Dir);
        assert_eq!(e[2].perm, 0o755);
        assert_eq!(e[2].data, Loc::None);
        assert_eq!(e[3].data, Loc::Record(2), "directories have no record");
        assert_eq!(idx.records.len(), 4);
        assert_eq!((e[3].kind, e[3].perm), (EntryKind::File, 0o444));
        assert_eq!(e[4].kind, EntryKind::Special);
    }

    #[test]
    fn zip64_extra_replaces_saturated_fields_only() {
        let mut rec = cdfh(b"big", 3, 0o100644 << 16, &[]);
        rec[24..28].copy_from_slice(&u32::MAX.to_le_bytes()); // usize saturated
        let mut extra = vec![0x01, 0x00, 8, 0];
        extra.extend_from_slice(&(5u64 << 32).to_le_bytes());
        rec.truncate(rec.len() - 3);
        rec[30..32].copy_from_slice(&(extra.len() as u16).to_le_bytes());
        rec.extend_from_slice(b"big");
        rec.extend_from_slice(&extra);
        let idx = parse_central_directory(&rec, 0, 1000).unwrap();
        assert_eq!(idx.entries[0].size, 5 << 32);
        assert_eq!(idx.entries[0].data, Loc::Record(0));
        assert_eq!(
            idx.records[0],
            (ZipData {
                header_offset: 0,
                compressed_size: 10,
                crc32: 0xdead_beef,
                method: 8,
                encrypted: false,
                name_len: 3,
                name_crc: crc32fast::hash(b"big"),
                external: 0o100644 << 16,
            })
        );
    }

    #[test]
    fn damaged_directories_are_errors_not_panics() {
        let rec = cdfh(b"name", 3, 0, &[]);
        for cut in 1..rec.len() {
            assert!(parse_central_directory(&rec[..cut], 0, 1000).is_err());
        }
        // An offset past the end of the file is refused.
        assert!(parse_central_directory(&rec, 0, 10).is_err());
        // Extra fields that overrun their record are ignored, not trusted.
        let e = parse_central_directory(&cdfh(b"x", 3, 0, &[0x55, 0x54, 200, 0, 1]), 0, 100);
        assert!(e.is_ok());
    }

    #[test]
    fn eocd_search_prefers_an_exact_comment_length() {
        let mut tail = vec![0u8; 10];
        let mut eocd = vec![0u8; EOCD_LEN];
        eocd[..4].copy_from_slice(EOCD_SIG);
        eocd[20..22].copy_from_slice(&3u16.to_le_bytes());
        tail.extend_from_slice(&eocd);
        tail.extend_from_slice(b"abc");
        assert_eq!(find_eocd(&tail), Some(10));
        assert_eq!(find_eocd(b"PK\x05\x06"), None);
        tail.extend_from_slice(b"junk");
        assert_eq!(
            find_eocd(&tail),
            Some(10),
            "trailing junk still finds the record"
        );
    }

    #[test]
    fn owner_field_sizes() {
        assert_eq!(parse_unix_owner(&[1, 2, 0xe8, 0x03, 1, 5]), Some((1000, 5)));
        assert_eq!(parse_unix_owner(&[1, 2, 0xe8]), None);
        assert_eq!(parse_unix_owner(&[2, 1, 1, 1, 1]), None);
    }
}
