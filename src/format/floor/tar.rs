//! A small tar reader and writer: POSIX pax and ustar, plus GNU long names.
//!
//! The reader ([`scan`]) walks the headers of a tar stream and records where each entry's
//! data starts, which is all a seekable-zstd package needs to serve files; it reads the
//! data only to skip it (the input is a decompressing stream that cannot seek). Headers
//! are untrusted: checksums are verified, numbers parsed strictly, and extension headers
//! (pax, GNU long names) capped at [`MAX_EXTENSION`] bytes, so hostile input gives an
//! error, never a panic or an unbounded allocation.
//!
//! The writer ([`TarWriter`]) emits plain ustar headers when a field fits and a pax `x`
//! header before them when one does not (long paths or targets, sizes of 8 GiB and more,
//! large ids, times before 1970 or after 2242). It is deterministic: no user or group
//! names, no access times, fixed values in the pax header's own fields.

use std::fmt;
use std::io::{self, Read, Write};

use super::{Entry, EntryKind, Loc, Xattrs};

/// Largest pax extended header or GNU long name accepted.
pub const MAX_EXTENSION: u64 = 1 << 20;
/// Most extended attributes one entry may have.
pub const MAX_XATTRS: usize = 256;
const BLOCK: usize = 512;

/// Kind of a tar entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TarKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Hard link to an earlier entry.
    HardLink,
    /// Anything else (device, FIFO…), with its typeflag.
    Other(u8),
}

/// One entry as read from a tar stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarEntry {
    /// Full path (ustar prefix, GNU long name and pax `path` applied).
    pub path: Vec<u8>,
    /// Kind.
    pub kind: TarKind,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time in whole seconds.
    pub mtime: i64,
    /// Size of the data (0 for links and directories).
    pub size: u64,
    /// Symlink or hard-link target.
    pub link: Vec<u8>,
    /// Stream offset of the entry's first header (extension headers included).
    pub header_offset: u64,
    /// Stream offset of the entry's data.
    pub data_offset: u64,
    /// A device's number (`makedev(devmajor, devminor)`); 0 otherwise.
    pub rdev: u64,
    /// Extended attributes from pax `SCHILY.xattr.NAME` records.
    pub xattrs: Xattrs,
}

impl TarEntry {
    /// The index entry of this tar entry; a regular file's data is at `loc(data_offset)`
    /// (its place in the format holding the tar stream).
    pub fn into_entry(self, loc: impl FnOnce(u64) -> Loc) -> std::result::Result<Entry, String> {
        let kind = match self.kind {
            TarKind::File => EntryKind::File,
            TarKind::Dir => EntryKind::Dir,
            TarKind::Symlink => EntryKind::Symlink,
            TarKind::HardLink => EntryKind::HardLink,
            TarKind::Other(b'3') => EntryKind::CharDev,
            TarKind::Other(b'4') => EntryKind::BlockDev,
            TarKind::Other(b'6') => EntryKind::Fifo,
            TarKind::Other(_) => EntryKind::Special,
        };
        Ok(Entry {
            size: match kind {
                EntryKind::File => self.size,
                EntryKind::Symlink => self.link.len() as u64,
                _ => 0,
            },
            data: if kind == EntryKind::File {
                loc(self.data_offset)
            } else {
                Loc::None
            },
            path: self.path,
            kind,
            perm: (self.mode & 0o7777) as u16,
            mtime: self.mtime,
            uid: u32::try_from(self.uid).ok(),
            gid: u32::try_from(self.gid).ok(),
            link: self.link,
            rdev: self.rdev,
            xattrs: self.xattrs,
        })
    }
}

/// Errors of the tar reader.
#[derive(Debug)]
pub enum TarError {
    /// The underlying stream failed.
    Io(io::Error),
    /// The stream is not a valid tar archive.
    Format(String),
}

impl fmt::Display for TarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TarError::Io(e) => write!(f, "{e}"),
            TarError::Format(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TarError {}

fn format_err(m: impl Into<String>) -> TarError {
    TarError::Format(m.into())
}

/// Parse a numeric header field: octal (space/NUL terminated) or GNU base-256.
fn number(field: &[u8]) -> Result<u64, TarError> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // Base-256: big-endian two's complement; only non-negative values are accepted.
        if field[0] & 0x40 != 0 {
            return Err(format_err("negative base-256 number"));
        }
        let mut v: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| format_err("base-256 number overflows"))?;
        }
        return Ok(v);
    }
    let text: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if text.is_empty() {
        return Ok(0);
    }
    let mut v: u64 = 0;
    for b in text {
        if !(b'0'..=b'7').contains(&b) {
            return Err(format_err(format!(
                "bad octal digit {:?} in header",
                b as char
            )));
        }
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| format_err("octal number overflows"))?;
    }
    Ok(v)
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Verify a header block's checksum (the unsigned sum, or the signed one as old tars
/// computed it, with the checksum field counted as spaces).
fn checksum_ok(h: &[u8; BLOCK]) -> Result<bool, TarError> {
    let stored = number(&h[148..156])?;
    let (mut unsigned, mut signed) = (0u64, 0i64);
    for (i, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    Ok(stored == unsigned || stored as i64 == signed)
}

/// Whether `block` (the first 512 bytes of a stream) starts a tar archive: a header with
/// a valid checksum, or the end-of-archive block of an empty archive.
pub fn is_header(block: &[u8]) -> bool {
    let Ok(h) = <&[u8; BLOCK]>::try_from(block.get(..BLOCK).unwrap_or(&[])) else {
        return false;
    };
    h.iter().all(|&b| b == 0) || checksum_ok(h).unwrap_or(false)
}

/// What a tar walk reads: a stream, which skips by reading, or a blob, which skips by
/// moving on (only the headers of an uncompressed archive are read).
trait Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Skip up to `n` bytes; how many there were.
    fn skip(&mut self, n: u64) -> io::Result<u64>;
}

/// A stream as [`Input`].
struct Stream<R>(R);

impl<R: Read> Input for Stream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        io::copy(&mut (&mut self.0).take(n), &mut io::sink())
    }
}

/// A blob as [`Input`]: positional reads from `pos`.
struct At<'a> {
    blob: &'a dyn crate::io::blob::Blob,
    pos: u64,
}

impl Input for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.blob.size().saturating_sub(self.pos)).min(buf.len() as u64) as usize;
        self.blob
            .read_exact_at(&mut buf[..n], self.pos)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.pos += n as u64;
        Ok(n)
    }
    fn skip(&mut self, n: u64) -> io::Result<u64> {
        let k = n.min(self.blob.size().saturating_sub(self.pos));
        self.pos += k;
        Ok(k)
    }
}

/// An input that counts its position.
struct Counting<I> {
    inner: I,
    pos: u64,
}

impl<I: Input> Counting<I> {
    /// Fill `buf` completely; `Ok(false)` at a clean end of stream before any byte.
    fn block(&mut self, buf: &mut [u8]) -> Result<bool, TarError> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => return Err(format_err("tar stream ends inside a block")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TarError::Io(e)),
            }
        }
        self.pos += buf.len() as u64;
        Ok(true)
    }

    /// Skip up to `n` bytes; how many there were.
    fn skip(&mut self, n: u64) -> Result<u64, TarError> {
        let got = self.inner.skip(n).map_err(TarError::Io)?;
        self.pos += got;
        Ok(got)
    }

    /// Skip `n` bytes.
    fn skip_exact(&mut self, n: u64) -> Result<(), TarError> {
        if self.skip(n)? < n {
            return Err(format_err("tar stream ends inside an entry's data"));
        }
        Ok(())
    }

    /// Read an extension body of `n` bytes (capped) and skip its padding.
    fn extension(&mut self, n: u64) -> Result<Vec<u8>, TarError> {
        if n > MAX_EXTENSION {
            return Err(format_err(format!("extension header of {n} bytes")));
        }
        let padded = n.div_ceil(BLOCK as u64) as usize * BLOCK;
        let mut buf = vec![0u8; padded];
        if !self.block(&mut buf)? {
            return Err(format_err("tar stream ends inside an extension header"));
        }
        buf.truncate(n as usize);
        Ok(buf)
    }
}

/// pax records `"<len> <key>=<value>\n"` into (key, value) pairs.
/// A pax record: key and value.
type PaxRecord = (Vec<u8>, Vec<u8>);

fn pax_records(mut body: &[u8]) -> Result<Vec<PaxRecord>, TarError> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let sp = body
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| format_err("bad pax record"))?;
        let len: usize = std::str::from_utf8(&body[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l > sp + 1 && l <= body.len())
            .ok_or_else(|| format_err("bad pax record length"))?;
        let rec = &body[sp + 1..len];
        let rec = rec
            .strip_suffix(b"\n")
            .ok_or_else(|| format_err("pax record lacks newline"))?;
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| format_err("pax record lacks '='"))?;
        out.push((rec[..eq].to_vec(), rec[eq + 1..].to_vec()));
        body = &body[len..];
    }
    Ok(out)
}

fn pax_number(v: &[u8]) -> Result<u64, TarError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format_err("bad number in pax header"))
}

fn pax_time(v: &[u8]) -> Result<i64, TarError> {
    let s = std::str::from_utf8(v).map_err(|_| format_err("bad pax time"))?;
    let whole = s.split('.').next().unwrap_or("");
    let t: i64 = whole.parse().map_err(|_| format_err("bad pax time"))?;
    // Floor for negative fractional times.
    let frac = s.contains('.')
        && s.split('.')
            .nth(1)
            .is_some_and(|f| f.bytes().any(|b| b != b'0'));
    Ok(if t < 0 || (whole.starts_with('-') && frac) {
        t - i64::from(frac)
    } else {
        t
    })
}

/// Overrides collected from extension headers, applied to the next real entry.
#[derive(Default, Clone)]
struct Overrides {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    mtime: Option<i64>,
    uid: Option<u64>,
    gid: Option<u64>,
    /// A GNU sparse file in pax form (`GNU.sparse.*` keys): its data is a sparse map
    /// followed by the non-hole parts, not the file's bytes.
    sparse: bool,
    /// `SCHILY.xattr.NAME=VALUE` records.
    xattrs: Xattrs,
}

impl Overrides {
    fn apply_pax(&mut self, body: &[u8]) -> Result<(), TarError> {
        for (k, v) in pax_records(body)? {
            match k.as_slice() {
                b"path" => self.path = Some(v),
                b"linkpath" => self.link = Some(v),
                b"size" => self.size = Some(pax_number(&v)?),
                b"mtime" => self.mtime = Some(pax_time(&v)?),
                b"uid" => self.uid = Some(pax_number(&v)?),
                b"gid" => self.gid = Some(pax_number(&v)?),
                k if k.starts_with(b"GNU.sparse.") => self.sparse = true,
                k if k.starts_with(b"SCHILY.xattr.") && k.len() > 13 => {
                    if self.xattrs.len() >= MAX_XATTRS {
                        return Err(format_err("too many extended attributes"));
                    }
                    self.xattrs.push((k[13..].to_vec(), v));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn or(self, global: &Overrides) -> Overrides {
        Overrides {
            path: self.path.or_else(|| global.path.clone()),
            link: self.link.or_else(|| global.link.clone()),
            size: self.size.or(global.size),
            mtime: self.mtime.or(global.mtime),
            uid: self.uid.or(global.uid),
            gid: self.gid.or(global.gid),
            sparse: self.sparse || global.sparse,
            xattrs: if self.xattrs.is_empty() {
                global.xattrs.clone()
            } else {
                self.xattrs
            },
        }
    }
}

/// Read every entry header of a tar stream, skipping the data.
pub fn scan<R: Read>(r: R) -> Result<Vec<TarEntry>, TarError> {
    let mut out = Vec::new();
    each(r, |e, _| {
        out.push(e.clone());
        Ok(())
    })?;
    Ok(out)
}

/// An entry's data as the stream goes by: at most the entry's size.
struct Data<'a, I> {
    r: &'a mut Counting<I>,
    left: u64,
}

impl<I: Input> Read for Data<'_, I> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.r.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar stream ends inside an entry's data",
            ));
        }
        self.r.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Walk a tar stream entry by entry, handing `f` each entry and a reader of its data
/// (files only; empty for other kinds). Whatever `f` leaves unread is skipped.
pub fn each<R: Read>(
    r: R,
    f: impl FnMut(&TarEntry, &mut dyn Read) -> Result<(), TarError>,
) -> Result<(), TarError> {
    walk(
        Counting {
            inner: Stream(r),
            pos: 0,
        },
        f,
    )
}

/// Walk the entry headers of the uncompressed tar archive `blob` in place: one read per
/// header, the data skipped without being read.
pub fn walk_blob(
    blob: &dyn crate::io::blob::Blob,
    mut f: impl FnMut(&TarEntry) -> Result<(), TarError>,
) -> Result<(), TarError> {
    walk(
        Counting {
            inner: At { blob, pos: 0 },
            pos: 0,
        },
        |e, _| f(e),
    )
}

fn walk<I: Input>(
    mut r: Counting<I>,
    mut f: impl FnMut(&TarEntry, &mut dyn Read) -> Result<(), TarError>,
) -> Result<(), TarError> {
    let mut global = Overrides::default();
    let mut local = Overrides::default();
    let mut first_header: Option<u64> = None;
    let mut h = [0u8; BLOCK];
    loop {
        let at = r.pos;
        if !r.block(&mut h)? {
            break; // EOF at a header boundary
        }
        if h.iter().all(|&b| b == 0) {
            break; // end-of-archive marker (the second zero block is optional to us)
        }
        if !checksum_ok(&h)? {
            return Err(format_err(format!("bad header checksum at offset {at}")));
        }
        first_header.get_or_insert(at);
        let size = number(&h[124..136])?;
        if let flag @ (b'x' | b'g' | b'L' | b'K') = h[156] {
            extension(&mut r, flag, size, &mut local, &mut global)?;
            if flag == b'g' {
                first_header = None;
            }
            continue;
        }
        let o = std::mem::take(&mut local).or(&global);
        let mut path = match o.path {
            Some(p) => p,
            None => header_path(&h),
        };
        // Sparse files (GNU `S`, or pax `GNU.sparse.*`) are reported as such: their stored
        // data is not the file's bytes.
        let kind = kind_of(if o.sparse { b'S' } else { h[156] }, &path);
        while path.len() > 1 && path.last() == Some(&b'/') {
            path.pop();
        }
        let size = o.size.unwrap_or(size);
        let data_offset = r.pos;
        let rdev = device_number(&h, kind);
        let entry = TarEntry {
            path,
            kind,
            mode: (number(&h[100..108])? & 0o7777) as u32,
            uid: o.uid.map_or_else(|| number(&h[108..116]), Ok)?,
            gid: o.gid.map_or_else(|| number(&h[116..124]), Ok)?,
            mtime: o
                .mtime
                .map_or_else(|| number(&h[136..148]).map(|t| t as i64), Ok)?,
            size: if matches!(kind, TarKind::File) {
                size
            } else {
                0
            },
            link: o.link.unwrap_or_else(|| cstr(&h[157..257]).to_vec()),
            header_offset: first_header.take().unwrap_or(at),
            data_offset,
            rdev,
            xattrs: o.xattrs,
        };
        let mut data = Data {
            r: &mut r,
            left: entry.size,
        };
        f(&entry, &mut data)?;
        // What `f` left, and the data hard links and directories may still carry in odd
        // archives: skipped, with the padding.
        let read = entry.size - data.left;
        r.skip_exact(size - read)?;
        // An archive may end right after the last entry's data, without padding or end
        // blocks (umoci 0.4's layers): that is its end.
        let pad = size.div_ceil(BLOCK as u64) * BLOCK as u64 - size;
        if r.skip(pad)? < pad {
            break;
        }
    }
    Ok(())
}

/// An extension header of type `flag` (pax `x`, `g`; GNU long name `L`, long link
/// `K`) with a body of `size` bytes: what it says goes to `local` (the next entry) or
/// `global` (every entry after).
fn extension<I: Input>(
    r: &mut Counting<I>,
    flag: u8,
    size: u64,
    local: &mut Overrides,
    global: &mut Overrides,
) -> Result<(), TarError> {
    let mut body = r.extension(size)?;
    match flag {
        b'x' => local.apply_pax(&body)?,
        b'g' => global.apply_pax(&body)?,
        _ => {
            body.truncate(cstr(&body).len());
            if flag == b'L' {
                local.path = Some(body);
            } else {
                local.link = Some(body);
            }
        }
    }
    Ok(())
}

/// The path in header `h`: its name, after its prefix in a POSIX ustar header.
fn header_path(h: &[u8; BLOCK]) -> Vec<u8> {
    let name = cstr(&h[0..100]);
    let prefix = if &h[257..263] == b"ustar\0" {
        cstr(&h[345..500])
    } else {
        &[][..]
    };
    if prefix.is_empty() {
        name.to_vec()
    } else {
        [prefix, b"/", name].concat()
    }
}

/// The kind of an entry of type `typeflag` at `path` (a regular file whose name ends in
/// `/` is a directory, as old tars wrote them).
fn kind_of(typeflag: u8, path: &[u8]) -> TarKind {
    match typeflag {
        b'0' | 0 | b'7' => {
            if path.last() == Some(&b'/') {
                TarKind::Dir
            } else {
                TarKind::File
            }
        }
        b'5' => TarKind::Dir,
        b'2' => TarKind::Symlink,
        b'1' => TarKind::HardLink,
        other => TarKind::Other(other),
    }
}

/// A device's number from header `h` (ustar's octal fields, 8 bytes each at 329 and
/// 337); 0 for anything else.
fn device_number(h: &[u8; BLOCK], kind: TarKind) -> u64 {
    if !matches!(kind, TarKind::Other(b'3' | b'4')) {
        return 0;
    }
    // Undefined before ustar: a field that does not parse is 0, not an error.
    let field = |r: std::ops::Range<usize>| {
        number(&h[r])
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    let (major, minor) = (field(329..337), field(337..345));
    libc::makedev(major, minor)
}

/// What to write for one entry.
#[derive(Clone, Copy, Debug)]
pub struct WriteEntry<'a> {
    /// Path (no leading `/`; a directory's trailing `/` is added).
    pub path: &'a [u8],
    /// Kind.
    pub kind: TarKind,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time.
    pub mtime: i64,
    /// Data size (files only).
    pub size: u64,
    /// Symlink or hard-link target.
    pub link: &'a [u8],
}

/// A deterministic POSIX pax tar writer.
///
/// Use: [`TarWriter::header`] (returns where the data will start), then
/// [`TarWriter::data`] as often as needed with exactly `size` bytes in all, then
/// [`TarWriter::end_entry`]; finally [`TarWriter::finish`].
pub struct TarWriter<W: Write> {
    w: W,
    pos: u64,
    data_left: u64,
    data_len: u64,
}

const OCTAL_MAX_8: u64 = 0o7777777;
const OCTAL_MAX_12: u64 = 0o77777777777;

fn put_octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let s = format!("{v:0digits$o}");
    field[..digits].copy_from_slice(&s.as_bytes()[s.len() - digits..]);
    field[digits] = 0;
}

fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    // The length counts itself: find the fixed point.
    let base = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = base + 1;
    while len != base + len.to_string().len() {
        len = base + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// Split a path into ustar (prefix, name) if it fits.
fn split_ustar(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= 100 {
        return Some((&[], path));
    }
    // The prefix ends at a '/', is at most 155 bytes; the name at most 100.
    (0..path.len())
        .rev()
        .filter(|&i| path[i] == b'/')
        .find(|&i| i <= 155 && path.len() - i - 1 <= 100 && i > 0)
        .map(|i| (&path[..i], &path[i + 1..]))
}

impl<W: Write> TarWriter<W> {
    /// A writer onto `w`.
    pub fn new(w: W) -> Self {
        TarWriter {
            w,
            pos: 0,
            data_left: 0,
            data_len: 0,
        }
    }

    /// Current offset in the stream.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn block(
        &mut self,
        name: &[u8],
        prefix: &[u8],
        e: &WriteEntry,
        typeflag: u8,
        size: u64,
    ) -> io::Result<()> {
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name);
        put_octal(&mut h[100..108], u64::from(e.mode & 0o7777));
        put_octal(&mut h[108..116], e.uid.min(OCTAL_MAX_8));
        put_octal(&mut h[116..124], e.gid.min(OCTAL_MAX_8));
        put_octal(&mut h[124..136], size.min(OCTAL_MAX_12));
        put_octal(
            &mut h[136..148],
            e.mtime.clamp(0, OCTAL_MAX_12 as i64) as u64,
        );
        h[156] = typeflag;
        let link = if e.link.len() <= 100 { e.link } else { &[][..] };
        h[157..157 + link.len()].copy_from_slice(link);
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[345..345 + prefix.len()].copy_from_slice(prefix);
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        put_octal(&mut h[148..155], sum);
        h[155] = b' ';
        self.put(&h)
    }

    /// Write the header(s) of an entry; returns the stream offset of its data.
    pub fn header(&mut self, e: &WriteEntry) -> io::Result<u64> {
        if self.data_left != 0 {
            return Err(io::Error::other("previous entry's data is incomplete"));
        }
        let mut path = e.path.to_vec();
        if e.kind == TarKind::Dir && path.last() != Some(&b'/') {
            path.push(b'/');
        }
        let size = if e.kind == TarKind::File { e.size } else { 0 };
        let mut pax = Vec::new();
        let split = split_ustar(&path);
        if split.is_none() {
            pax_record(&mut pax, "path", &path);
        }
        if e.link.len() > 100 {
            pax_record(&mut pax, "linkpath", e.link);
        }
        if size > OCTAL_MAX_12 {
            pax_record(&mut pax, "size", size.to_string().as_bytes());
        }
        if e.uid > OCTAL_MAX_8 {
            pax_record(&mut pax, "uid", e.uid.to_string().as_bytes());
        }
        if e.gid > OCTAL_MAX_8 {
            pax_record(&mut pax, "gid", e.gid.to_string().as_bytes());
        }
        if e.mtime < 0 || e.mtime > OCTAL_MAX_12 as i64 {
            pax_record(&mut pax, "mtime", e.mtime.to_string().as_bytes());
        }
        if !pax.is_empty() {
            let last = path
                .split(|&b| b == b'/')
                .rev()
                .find(|c| !c.is_empty())
                .unwrap_or(b"x");
            let mut name = b"PaxHeader/".to_vec();
            name.extend_from_slice(&last[..last.len().min(100 - name.len())]);
            let meta = WriteEntry {
                path: &name,
                kind: TarKind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: 0,
                size: pax.len() as u64,
                link: &[],
            };
            self.block(&name, &[], &meta, b'x', pax.len() as u64)?;
            self.put(&pax)?;
            self.pad(pax.len() as u64)?;
        }
        let (prefix, name) = match split {
            Some((p, n)) => (p.to_vec(), n.to_vec()),
            // The pax path wins; put a truncated name in the ustar header.
            None => (Vec::new(), path[path.len() - 100..].to_vec()),
        };
        let typeflag = match e.kind {
            TarKind::File => b'0',
            TarKind::Dir => b'5',
            TarKind::Symlink => b'2',
            TarKind::HardLink => b'1',
            TarKind::Other(t) => t,
        };
        self.block(&name, &prefix, e, typeflag, size)?;
        self.data_left = size;
        self.data_len = size;
        Ok(self.pos)
    }

    /// Write data of the current entry.
    pub fn data(&mut self, chunk: &[u8]) -> io::Result<()> {
        if chunk.len() as u64 > self.data_left {
            return Err(io::Error::other("more data than the header's size"));
        }
        self.data_left -= chunk.len() as u64;
        self.put(chunk)
    }

    fn pad(&mut self, len: u64) -> io::Result<()> {
        let rem = (len % BLOCK as u64) as usize;
        if rem != 0 {
            self.put(&[0u8; BLOCK][..BLOCK - rem])?;
        }
        Ok(())
    }

    /// Pad the current entry's data to a whole block.
    pub fn end_entry(&mut self) -> io::Result<()> {
        if self.data_left != 0 {
            return Err(io::Error::other("entry data is shorter than its size"));
        }
        let len = self.data_len;
        self.data_len = 0;
        self.pad(len)
    }

    /// Write the end-of-archive marker and return the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.put(&[0u8; 2 * BLOCK])?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn entry<'a>(path: &'a [u8], kind: TarKind, size: u64, link: &'a [u8]) -> WriteEntry<'a> {
        WriteEntry {
            path,
            kind,
            mode: 0o754,
            uid: 1000,
            gid: 100,
            mtime: 1_700_000_000,
            size,
            link,
        }
    }

    fn write_all(entries: &[(WriteEntry, &[u8])]) -> (Vec<u8>, Vec<u64>) {
        let mut t = TarWriter::new(Vec::new());
        let mut offs = Vec::new();
        for (e, data) in entries {
            offs.push(t.header(e).unwrap());
            t.data(data).unwrap();
            t.end_entry().unwrap();
        }
        (t.finish().unwrap(), offs)
    }

    #[test]
    fn round_trip_with_long_names_links_and_odd_values() {
        let long = [b"d/".repeat(150), b"file".to_vec()].concat();
        let target = vec![b't'; 200];
        let odd = [0xffu8, 0xfe, b'n'];
        let mut neg = entry(b"neg", TarKind::File, 1, &[]);
        neg.mtime = -12345;
        neg.uid = 1 << 30;
        let (bytes, offs) = write_all(&[
            (entry(b"dir", TarKind::Dir, 0, &[]), b""),
            (entry(&long, TarKind::File, 5, &[]), b"hello"),
            (entry(b"sym", TarKind::Symlink, 0, &target), b""),
            (entry(b"hard", TarKind::HardLink, 0, b"neg"), b""),
            (neg, b"x"),
            (entry(&odd, TarKind::File, 0, &[]), b""),
        ]);
        let got = scan(&bytes[..]).unwrap();
        assert_eq!(got.len(), 6);
        assert_eq!(
            (got[0].path.as_slice(), got[0].kind),
            (&b"dir"[..], TarKind::Dir)
        );
        assert_eq!(got[1].path, long);
        assert_eq!(got[1].data_offset, offs[1]);
        assert_eq!(&bytes[offs[1] as usize..offs[1] as usize + 5], b"hello");
        assert_eq!(
            (got[2].kind, got[2].link.as_slice()),
            (TarKind::Symlink, target.as_slice())
        );
        assert_eq!(
            (got[3].kind, got[3].link.as_slice()),
            (TarKind::HardLink, &b"neg"[..])
        );
        assert_eq!(
            (got[4].mtime, got[4].uid, got[4].mode),
            (-12345, 1 << 30, 0o754)
        );
        assert_eq!(got[5].path, odd);
    }

    #[test]
    fn each_hands_out_data_and_skips_what_is_left_unread() {
        let (bytes, _) = write_all(&[
            (entry(b"a", TarKind::File, 700, &[]), &[b'a'; 700][..]),
            (entry(b"d", TarKind::Dir, 0, &[]), b""),
            (entry(b"b", TarKind::File, 5, &[]), b"bbbbb"),
            (entry(b"c", TarKind::File, 3, &[]), b"ccc"),
        ]);
        let mut got = Vec::new();
        each(&bytes[..], |e, data| {
            // Read all of b, part of a, none of c.
            let want = match e.path.as_slice() {
                b"a" => 10,
                b"b" => 100,
                _ => 0,
            };
            let mut buf = vec![0u8; want];
            let n = data.read(&mut buf).map_err(TarError::Io)?;
            got.push((e.path.clone(), buf[..n].to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            [
                (b"a".to_vec(), vec![b'a'; 10]),
                (b"d".to_vec(), vec![]),
                (b"b".to_vec(), b"bbbbb".to_vec()),
                (b"c".to_vec(), vec![]),
            ]
        );
    }

    #[test]
    fn huge_sizes_go_to_pax() {
        let mut t = TarWriter::new(Vec::new());
        t.header(&entry(b"big", TarKind::File, 9 << 30, &[]))
            .unwrap();
        let bytes = t.w.clone();
        // The stream is truncated inside the data: the header is still read right.
        let err = scan(&bytes[..]).unwrap_err();
        assert!(err.to_string().contains("ends inside"), "{err}");
        let mut r = Counting {
            inner: Stream(&bytes[..]),
            pos: 0,
        };
        let mut h = [0u8; BLOCK];
        r.block(&mut h).unwrap();
        assert_eq!(h[156], b'x');
        let body = r.extension(number(&h[124..136]).unwrap()).unwrap();
        let mut o = Overrides::default();
        o.apply_pax(&body).unwrap();
        assert_eq!(o.size, Some(9 << 30));
    }

    #[test]
    fn hostile_headers_are_errors() {
        assert!(scan(&[0x55u8; 2048][..]).is_err());
        let (mut bytes, _) = write_all(&[(entry(b"a", TarKind::File, 3, &[]), b"abc")]);
        bytes[0] ^= 1; // checksum no longer matches
        assert!(
            scan(&bytes[..])
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        // A pax header that claims an enormous body.
        let mut t = TarWriter::new(Vec::new());
        let e = entry(b"PaxHeader/x", TarKind::File, 1 << 60, &[]);
        t.block(b"PaxHeader/x", &[], &e, b'x', 1 << 60).unwrap();
        assert!(scan(&t.w[..]).is_err());
        // Truncated in the middle of data.
        let (bytes, _) = write_all(&[(entry(b"a", TarKind::File, 3, &[]), b"abc")]);
        assert!(scan(&bytes[..514]).is_err());
        // Cut after the data, without padding or end blocks (umoci 0.4 wrote layers so):
        // the end of the archive, everywhere.
        assert_eq!(scan(&bytes[..515]).unwrap().len(), 1);
        let blob = crate::io::blob::Bytes::new("cut", bytes[..515].to_vec());
        let mut n = 0;
        walk_blob(&blob, |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 1);
        assert!(pax_records(b"99999 path=x\n").is_err());
        assert!(number(b"12x4").is_err());
    }

    #[test]
    fn gnu_tar_archives_scan_and_our_archives_extract() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let long = "n".repeat(120);
        std::fs::create_dir_all(src.join(&long)).unwrap();
        std::fs::write(src.join(&long).join("f.txt"), b"data!").unwrap();
        std::os::unix::fs::symlink("x".repeat(150), src.join("sym")).unwrap();
        std::fs::hard_link(src.join(&long).join("f.txt"), src.join("hard")).unwrap();
        for format in ["pax", "gnu"] {
            let out = dir.path().join(format!("{format}.tar"));
            let ok = Command::new("tar")
                .arg(format!("--format={format}"))
                .args(["--sort=name", "-cf"])
                .arg(&out)
                .arg("-C")
                .arg(&src)
                .arg(".")
                .status()
                .unwrap();
            assert!(ok.success());
            let bytes = std::fs::read(&out).unwrap();
            let got = scan(&bytes[..]).unwrap();
            // Sorted by name, `hard` comes first and holds the data; f.txt links to it.
            let f = got
                .iter()
                .find(|e| e.path.ends_with(b"f.txt"))
                .unwrap_or_else(|| panic!("{format}: no f.txt"));
            assert!(f.path.len() > 120, "{format}: long directory name kept");
            assert_eq!(
                (f.kind, f.link.as_slice()),
                (TarKind::HardLink, &b"./hard"[..])
            );
            let h = got.iter().find(|e| e.path.ends_with(b"hard")).unwrap();
            assert_eq!(
                &bytes[h.data_offset as usize..h.data_offset as usize + 5],
                b"data!"
            );
            let s = got.iter().find(|e| e.path.ends_with(b"sym")).unwrap();
            assert_eq!((s.kind, s.link.len()), (TarKind::Symlink, 150), "{format}");
            assert!(got.iter().any(|e| e.kind == TarKind::HardLink), "{format}");
        }

        // Our own output extracts with GNU tar.
        let long_path = format!("{long}/{long}/g.txt");
        let (bytes, _) = write_all(&[(entry(long_path.as_bytes(), TarKind::File, 3, &[]), b"xyz")]);
        let tarfile = dir.path().join("ours.tar");
        std::fs::write(&tarfile, &bytes).unwrap();
        let x = dir.path().join("x");
        std::fs::create_dir(&x).unwrap();
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&tarfile)
            .arg("-C")
            .arg(&x)
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read(x.join(&long_path)).unwrap(), b"xyz");
    }

    #[test]
    fn devices_fifos_and_schily_xattrs_from_python_s_tarfile() {
        let script = r#"
import io, sys, tarfile
t = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
def add(name, kind, data=b"", pax=None, major=0, minor=0):
    i = tarfile.TarInfo(name); i.type = kind; i.size = len(data)
    i.devmajor, i.devminor = major, minor
    if pax: i.pax_headers = pax
    t.addfile(i, io.BytesIO(data) if data else None)
add("dev/null", tarfile.CHRTYPE, major=1, minor=3)
add("dev/loop9", tarfile.BLKTYPE, major=7, minor=300)
add("run/fifo", tarfile.FIFOTYPE)
add("bin/ping", tarfile.REGTYPE, b"elf", {"SCHILY.xattr.security.capability": "\x01\x00",
    "SCHILY.xattr.user.note": "h\u00e9"})
t.close()
"#;
        let out = Command::new("python3")
            .args(["-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = scan(&out.stdout[..]).unwrap();
        let find = |p: &[u8]| got.iter().find(|e| e.path == p).unwrap();
        let null = find(b"dev/null");
        assert_eq!(
            (null.kind, null.rdev),
            (TarKind::Other(b'3'), libc::makedev(1, 3))
        );
        let lp = find(b"dev/loop9");
        assert_eq!(
            (lp.kind, lp.rdev),
            (TarKind::Other(b'4'), libc::makedev(7, 300))
        );
        assert_eq!(find(b"run/fifo").kind, TarKind::Other(b'6'));
        let ping = find(b"bin/ping");
        // pax values are UTF-8: Python writes U+00E9 as two bytes.
        assert_eq!(
            ping.xattrs,
            vec![
                (b"security.capability".to_vec(), vec![1, 0]),
                (b"user.note".to_vec(), "h\u{e9}".as_bytes().to_vec())
            ]
        );
        let kinds: Vec<_> = got
            .iter()
            .map(|e| e.clone().into_entry(|_| Loc::None).unwrap().kind)
            .collect();
        use EntryKind as K;
        assert_eq!(kinds, [K::CharDev, K::BlockDev, K::Fifo, K::File]);
    }
}
