//! SOCI's zTOC (awslabs/soci-snapshotter): a table of contents of a gzip (or plain) tar
//! layer, made so that the layer can be read in place from a registry without a pass.
//!
//! A zTOC is a flatbuffer (`ztoc/fbs/ztoc.fbs`): the files of the tar stream (name,
//! type, the offset of their data in the *uncompressed* stream, size, mode, owners,
//! times, link targets, devices, pax records) and the compression info: the zran
//! checkpoints that let a gzip stream be entered every span (a compressed offset, a bit
//! count, the uncompressed offset and the 32 KiB window before it; packed as
//! `ztoc/compression/gzip_zinfo.c` writes them), and the sha256 digest of each span's
//! compressed bytes, to be checked before the span is used.
//!
//! The buffer is verified by the `flatbuffers` crate's verifier before any field is
//! read (the tables below are what `flatc` would generate for the schema: accessors
//! over verified offsets); every count and offset is then bounded again here.

use flatbuffers::{Follow, ForwardsUOffset, Table, VOffsetT, Vector, Verifiable, Verifier};

use super::tar::{MAX_XATTRS, TarEntry, TarKind};
use crate::error::{Error, Result};
use crate::io::digest::Digest;

/// Largest zTOC read (a layer of a million files has a zTOC of about 200 MiB: more is
/// not a layer pkgfs mounts through one).
pub const MAX_ZTOC: u64 = 256 << 20;
/// The window a checkpoint carries.
pub const WINDOW: usize = 32768;
/// A packed checkpoint: in (8), out (8), bits (1), window.
const PACKED: usize = 8 + 8 + 1 + WINDOW;
/// The checkpoints blob's header: count (4), span size (8).
const HEADER: usize = 4 + 8;

/// How the layer is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// gzip: checkpoints with windows.
    Gzip,
    /// An uncompressed tar: spans are plain ranges.
    Uncompressed,
}

/// A place where decoding can start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Offset in the compressed stream of the first full byte.
    pub input: u64,
    /// Offset in the uncompressed stream.
    pub output: u64,
    /// Bits (1–7) of the byte before `input` that belong to the next block, or 0.
    pub bits: u8,
    /// The 32 KiB of output before `output` (unused at the stream's start).
    pub window: Box<[u8]>,
}

impl Checkpoint {
    /// Where decoding resumes, in bits from the start of the blob.
    pub fn bit(&self) -> u64 {
        self.input * 8 - u64::from(self.bits)
    }

    /// The first byte of compressed input a span starting here needs.
    pub fn first_byte(&self) -> u64 {
        self.input - u64::from(self.bits != 0)
    }
}

/// A zTOC, read and checked.
#[derive(Clone, Debug)]
pub struct Ztoc {
    /// `major.minor`.
    pub version: String,
    /// The tool that made it.
    pub build_tool: String,
    /// Size of the layer blob it describes.
    pub compressed_size: u64,
    /// Size of the tar stream.
    pub uncompressed_size: u64,
    /// The files, in stream order, as tar entries (`data_offset` in the tar stream).
    pub files: Vec<TarEntry>,
    /// How the layer is compressed.
    pub algorithm: Algorithm,
    /// Span size the checkpoints were made with.
    pub span_size: u64,
    /// The checkpoints, one per span (the first at the stream's start).
    pub checkpoints: Vec<Checkpoint>,
    /// sha256 of each span's compressed bytes.
    pub span_digests: Vec<Digest>,
}

impl Ztoc {
    /// The compressed bytes `[start, end)` of span `i` (they overlap the next span by a
    /// byte when it starts mid-byte, as SOCI's own digests do).
    pub fn span_input(&self, i: usize) -> (u64, u64) {
        let start = self.checkpoints[i].first_byte();
        let end = self
            .checkpoints
            .get(i + 1)
            .map_or(self.compressed_size, |c| c.input);
        (start, end)
    }
}

macro_rules! table {
    ($name:ident) => {
        struct $name<'a> {
            tab: Table<'a>,
        }
        impl<'a> Follow<'a> for $name<'a> {
            type Inner = $name<'a>;
            unsafe fn follow(buf: &'a [u8], loc: usize) -> Self::Inner {
                // SAFETY: the caller's contract (a verified buffer, a table at loc).
                $name {
                    tab: unsafe { Table::new(buf, loc) },
                }
            }
        }
    };
}

table!(FbZtoc);
table!(FbToc);
table!(FbFile);
table!(FbXattr);
table!(FbCompression);

/// The vtable slot of field `n` of a table.
const fn slot(n: u16) -> VOffsetT {
    4 + 2 * n
}

type Str<'a> = ForwardsUOffset<&'a str>;

impl Verifiable for FbZtoc<'_> {
    fn run_verifier(
        v: &mut Verifier,
        pos: usize,
    ) -> std::result::Result<(), flatbuffers::InvalidFlatbuffer> {
        v.visit_table(pos)?
            .visit_field::<Str>("version", slot(0), false)?
            .visit_field::<Str>("build_tool_identifier", slot(1), false)?
            .visit_field::<i64>("compressed_archive_size", slot(2), false)?
            .visit_field::<i64>("uncompressed_archive_size", slot(3), false)?
            .visit_field::<ForwardsUOffset<FbToc>>("toc", slot(4), false)?
            .visit_field::<ForwardsUOffset<FbCompression>>("compression_info", slot(5), false)?
            .finish();
        Ok(())
    }
}

impl Verifiable for FbToc<'_> {
    fn run_verifier(
        v: &mut Verifier,
        pos: usize,
    ) -> std::result::Result<(), flatbuffers::InvalidFlatbuffer> {
        v.visit_table(pos)?
            .visit_field::<ForwardsUOffset<Vector<ForwardsUOffset<FbFile>>>>(
                "metadata",
                slot(0),
                false,
            )?
            .finish();
        Ok(())
    }
}

impl Verifiable for FbFile<'_> {
    fn run_verifier(
        v: &mut Verifier,
        pos: usize,
    ) -> std::result::Result<(), flatbuffers::InvalidFlatbuffer> {
        v.visit_table(pos)?
            .visit_field::<Str>("name", slot(0), false)?
            .visit_field::<Str>("type", slot(1), false)?
            .visit_field::<i64>("uncompressed_offset", slot(2), false)?
            .visit_field::<i64>("uncompressed_size", slot(3), false)?
            .visit_field::<Str>("linkname", slot(4), false)?
            .visit_field::<i64>("mode", slot(5), false)?
            .visit_field::<u32>("uid", slot(6), false)?
            .visit_field::<u32>("gid", slot(7), false)?
            .visit_field::<Str>("uname", slot(8), false)?
            .visit_field::<Str>("gname", slot(9), false)?
            .visit_field::<Str>("mod_time", slot(10), false)?
            .visit_field::<i64>("devmajor", slot(11), false)?
            .visit_field::<i64>("devminor", slot(12), false)?
            .visit_field::<ForwardsUOffset<Vector<ForwardsUOffset<FbXattr>>>>(
                "xattrs",
                slot(13),
                false,
            )?
            .finish();
        Ok(())
    }
}

impl Verifiable for FbXattr<'_> {
    fn run_verifier(
        v: &mut Verifier,
        pos: usize,
    ) -> std::result::Result<(), flatbuffers::InvalidFlatbuffer> {
        v.visit_table(pos)?
            .visit_field::<Str>("key", slot(0), false)?
            .visit_field::<Str>("value", slot(1), false)?
            .finish();
        Ok(())
    }
}

impl Verifiable for FbCompression<'_> {
    fn run_verifier(
        v: &mut Verifier,
        pos: usize,
    ) -> std::result::Result<(), flatbuffers::InvalidFlatbuffer> {
        v.visit_table(pos)?
            .visit_field::<i8>("compression_algorithm", slot(0), false)?
            .visit_field::<i32>("max_span_id", slot(1), false)?
            .visit_field::<ForwardsUOffset<Vector<Str>>>("span_digests", slot(2), false)?
            .visit_field::<ForwardsUOffset<Vector<u8>>>("checkpoints", slot(3), false)?
            .finish();
        Ok(())
    }
}

// Accessors: each reads a field of a table the verifier has checked (its type is the
// one the verifier was told), which is what makes the `unsafe` calls sound.
impl<'a> FbZtoc<'a> {
    fn str(&self, n: u16) -> &'a str {
        // SAFETY: verified as a string field.
        unsafe { self.tab.get::<Str>(slot(n), None) }.unwrap_or("")
    }
    fn long(&self, n: u16) -> i64 {
        // SAFETY: verified as an i64 field.
        unsafe { self.tab.get::<i64>(slot(n), Some(0)) }.unwrap_or(0)
    }
    fn toc(&self) -> Option<FbToc<'a>> {
        // SAFETY: verified as a TOC table.
        unsafe { self.tab.get::<ForwardsUOffset<FbToc>>(slot(4), None) }
    }
    fn compression(&self) -> Option<FbCompression<'a>> {
        // SAFETY: verified as a CompressionInfo table.
        unsafe {
            self.tab
                .get::<ForwardsUOffset<FbCompression>>(slot(5), None)
        }
    }
}

impl<'a> FbToc<'a> {
    fn files(&self) -> Option<Vector<'a, ForwardsUOffset<FbFile<'a>>>> {
        // SAFETY: verified as a vector of FileMetadata tables.
        unsafe {
            self.tab
                .get::<ForwardsUOffset<Vector<ForwardsUOffset<FbFile>>>>(slot(0), None)
        }
    }
}

impl<'a> FbFile<'a> {
    fn str(&self, n: u16) -> &'a str {
        // SAFETY: verified as a string field.
        unsafe { self.tab.get::<Str>(slot(n), None) }.unwrap_or("")
    }
    fn long(&self, n: u16) -> i64 {
        // SAFETY: verified as an i64 field.
        unsafe { self.tab.get::<i64>(slot(n), Some(0)) }.unwrap_or(0)
    }
    fn uint(&self, n: u16) -> u32 {
        // SAFETY: verified as a u32 field.
        unsafe { self.tab.get::<u32>(slot(n), Some(0)) }.unwrap_or(0)
    }
    fn xattrs(&self) -> Option<Vector<'a, ForwardsUOffset<FbXattr<'a>>>> {
        // SAFETY: verified as a vector of Xattr tables.
        unsafe {
            self.tab
                .get::<ForwardsUOffset<Vector<ForwardsUOffset<FbXattr>>>>(slot(13), None)
        }
    }
}

impl<'a> FbXattr<'a> {
    fn str(&self, n: u16) -> &'a str {
        // SAFETY: verified as a string field.
        unsafe { self.tab.get::<Str>(slot(n), None) }.unwrap_or("")
    }
}

impl<'a> FbCompression<'a> {
    fn algorithm(&self) -> i8 {
        // SAFETY: verified as a byte field; the schema's default is Gzip (1).
        unsafe { self.tab.get::<i8>(slot(0), Some(1)) }.unwrap_or(1)
    }
    fn max_span_id(&self) -> i32 {
        // SAFETY: verified as an i32 field.
        unsafe { self.tab.get::<i32>(slot(1), Some(0)) }.unwrap_or(0)
    }
    fn span_digests(&self) -> Option<Vector<'a, Str<'a>>> {
        // SAFETY: verified as a vector of strings.
        unsafe { self.tab.get::<ForwardsUOffset<Vector<Str>>>(slot(2), None) }
    }
    fn checkpoints(&self) -> &'a [u8] {
        // SAFETY: verified as a vector of bytes.
        unsafe { self.tab.get::<ForwardsUOffset<Vector<u8>>>(slot(3), None) }
            .map_or(&[][..], |v| v.bytes())
    }
}

fn bad(m: impl Into<String>) -> Error {
    Error::Format(format!("zTOC: {}", m.into()))
}

fn offset(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| bad(format!("negative {what} {v}")))
}

/// Read a zTOC.
pub fn parse(bytes: &[u8]) -> Result<Ztoc> {
    let opts = flatbuffers::VerifierOptions {
        max_depth: 8,
        max_tables: super::MAX_ENTRIES * 2 + 16,
        max_apparent_size: bytes.len().saturating_mul(2).max(1 << 20),
        ignore_missing_null_terminator: false,
    };
    let z = flatbuffers::root_with_opts::<FbZtoc>(&opts, bytes)
        .map_err(|e| bad(format!("not a valid flatbuffer: {e}")))?;
    let version = z.str(0).to_string();
    if !version.starts_with("0.") && !version.starts_with("1.") && !version.starts_with("2.") {
        return Err(Error::Unsupported(format!("zTOC version {version:?}")));
    }
    let compressed_size = offset(z.long(2), "compressed size")?;
    let uncompressed_size = offset(z.long(3), "uncompressed size")?;
    let files = match z.toc().and_then(|t| t.files()) {
        Some(v) => v,
        None => return Err(bad("no table of contents")),
    };
    if files.len() > super::MAX_ENTRIES {
        return Err(bad(format!("{} files: more than pkgfs reads", files.len())));
    }
    let mut out = Vec::with_capacity(files.len());
    for f in files.iter() {
        out.push(file(&f, uncompressed_size)?);
    }
    let ci = z.compression().ok_or_else(|| bad("no compression info"))?;
    let algorithm = match ci.algorithm() {
        1 => Algorithm::Gzip,
        2 => Algorithm::Uncompressed,
        a => {
            return Err(Error::Unsupported(format!(
                "zTOC compression algorithm {a}"
            )));
        }
    };
    let spans = usize::try_from(ci.max_span_id())
        .ok()
        .and_then(|m| m.checked_add(1))
        .ok_or_else(|| bad(format!("max span id {}", ci.max_span_id())))?;
    let span_digests = ci
        .span_digests()
        .map(|v| v.iter().map(Digest::parse).collect::<Result<Vec<_>>>())
        .transpose()?
        .unwrap_or_default();
    if span_digests.len() != spans {
        return Err(bad(format!(
            "{} span digests for {spans} spans",
            span_digests.len()
        )));
    }
    let (span_size, checkpoints) = match algorithm {
        Algorithm::Gzip => {
            checkpoints(ci.checkpoints(), spans, compressed_size, uncompressed_size)?
        }
        Algorithm::Uncompressed => (0, Vec::new()),
    };
    Ok(Ztoc {
        version,
        build_tool: z.str(1).to_string(),
        compressed_size,
        uncompressed_size,
        files: out,
        algorithm,
        span_size,
        checkpoints,
        span_digests,
    })
}

/// One file of the table, as a tar entry.
fn file(f: &FbFile<'_>, total: u64) -> Result<TarEntry> {
    let name = f.str(0);
    let kind = match f.str(1) {
        "reg" => TarKind::File,
        "dir" => TarKind::Dir,
        "symlink" => TarKind::Symlink,
        "hardlink" => TarKind::HardLink,
        "char" => TarKind::Other(b'3'),
        "block" => TarKind::Other(b'4'),
        "fifo" => TarKind::Other(b'6'),
        t => return Err(bad(format!("{name:?}: type {t:?}"))),
    };
    let data_offset = offset(f.long(2), "file offset")?;
    let size = offset(f.long(3), "file size")?;
    if kind == TarKind::File && data_offset.checked_add(size).is_none_or(|e| e > total) {
        return Err(bad(format!(
            "{name:?}: {size} bytes at {data_offset} lie past the {total}-byte stream"
        )));
    }
    let mode = u32::try_from(f.long(5) & 0o7777).unwrap_or(0);
    let major = offset(f.long(11), "device major")?;
    let minor = offset(f.long(12), "device minor")?;
    let mut xattrs = Vec::new();
    if let Some(v) = f.xattrs() {
        for x in v.iter() {
            // Raw pax records: the xattrs are the SCHILY.xattr.* ones.
            if let Some(k) = x.str(0).strip_prefix("SCHILY.xattr.") {
                xattrs.push((k.as_bytes().to_vec(), x.str(1).as_bytes().to_vec()));
            }
        }
    }
    if xattrs.len() > MAX_XATTRS {
        return Err(bad(format!(
            "{name:?}: {} extended attributes",
            xattrs.len()
        )));
    }
    Ok(TarEntry {
        path: name.as_bytes().to_vec(),
        kind,
        mode,
        uid: u64::from(f.uint(6)),
        gid: u64::from(f.uint(7)),
        mtime: mtime(f.str(10)),
        size: if kind == TarKind::File { size } else { 0 },
        link: f.str(4).as_bytes().to_vec(),
        header_offset: 0,
        data_offset,
        rdev: if matches!(kind, TarKind::Other(b'3' | b'4')) {
            libc::makedev(
                u32::try_from(major).unwrap_or(0),
                u32::try_from(minor).unwrap_or(0),
            )
        } else {
            0
        },
        xattrs,
    })
}

/// Whole seconds of an RFC 3339 time (0 if it is not one).
fn mtime(s: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s).map_or(0, |t| t.timestamp())
}

/// The checkpoints blob: `spans` checkpoints (a version 1 blob omits the first, which is
/// then the stream's start after a 10-byte gzip header), in order, inside the streams.
fn checkpoints(
    b: &[u8],
    spans: usize,
    compressed: u64,
    uncompressed: u64,
) -> Result<(u64, Vec<Checkpoint>)> {
    if b.len() < HEADER {
        return Err(bad("checkpoints shorter than their header"));
    }
    let count = usize::try_from(super::le32(b, 0)).unwrap_or(usize::MAX);
    let span_size = u64::from_le_bytes(b[4..12].try_into().map_err(|_| bad("header"))?);
    let body = &b[HEADER..];
    let (first, stored) = if count.checked_mul(PACKED) == Some(body.len()) {
        (None, count)
    } else if count.checked_sub(1).and_then(|c| c.checked_mul(PACKED)) == Some(body.len()) {
        let start = Checkpoint {
            input: 10,
            output: 0,
            bits: 0,
            window: vec![0u8; WINDOW].into_boxed_slice(),
        };
        (Some(start), count - 1)
    } else {
        return Err(bad(format!(
            "{} bytes of checkpoints for {count} checkpoints",
            body.len()
        )));
    };
    if count != spans {
        return Err(bad(format!("{count} checkpoints for {spans} spans")));
    }
    let mut out: Vec<Checkpoint> = first.into_iter().collect();
    for i in 0..stored {
        let c = &body[i * PACKED..(i + 1) * PACKED];
        let le = |r: std::ops::Range<usize>| u64::from_le_bytes(c[r].try_into().unwrap_or([0; 8]));
        out.push(Checkpoint {
            input: le(0..8),
            output: le(8..16),
            bits: c[16],
            window: c[17..].to_vec().into_boxed_slice(),
        });
    }
    for (i, c) in out.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| &out[j]);
        let in_order = prev.is_none_or(|p| p.input < c.input && p.output < c.output);
        if c.bits > 7
            || c.input == 0
            || c.input > compressed
            || c.output > uncompressed
            || !in_order
            || (i == 0 && c.output != 0)
        {
            return Err(bad(format!(
                "checkpoint {i} (input {}, output {}, bits {}) is out of place",
                c.input, c.output, c.bits
            )));
        }
    }
    Ok((span_size, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_truncations_are_refused_not_trusted() {
        assert!(parse(b"").is_err());
        assert!(parse(&[0xff; 64]).is_err());
        let mut b = vec![0u8; 64];
        b[0] = 8; // a root offset to a table with no vtable
        assert!(parse(&b).is_err());
    }

    #[test]
    fn checkpoint_blobs_of_both_versions_and_bad_ones() {
        let pack = |input: u64, output: u64, bits: u8| {
            let mut v = input.to_le_bytes().to_vec();
            v.extend(output.to_le_bytes());
            v.push(bits);
            v.extend(std::iter::repeat_n(7u8, WINDOW));
            v
        };
        let mut v2 = 2u32.to_le_bytes().to_vec();
        v2.extend(1_048_576u64.to_le_bytes());
        v2.extend(pack(10, 0, 0));
        v2.extend(pack(5000, 1_100_000, 3));
        let (span, cps) = checkpoints(&v2, 2, 10_000, 3_000_000).unwrap();
        assert_eq!(span, 1_048_576);
        assert_eq!(cps.len(), 2);
        assert_eq!(cps[1].bit(), 5000 * 8 - 3);
        assert_eq!(cps[1].first_byte(), 4999);
        // Version 1: the first checkpoint left out.
        let mut v1 = 2u32.to_le_bytes().to_vec();
        v1.extend(1_048_576u64.to_le_bytes());
        v1.extend(pack(5000, 1_100_000, 0));
        let (_, cps) = checkpoints(&v1, 2, 10_000, 3_000_000).unwrap();
        assert_eq!((cps[0].input, cps[0].output), (10, 0));
        // Out of order, past the end, bad bits, a count that lies.
        for (a, b, bits, spans) in [
            (20u64, 0u64, 0u8, 2usize),
            (5000, 9_000_000, 0, 2),
            (5000, 1_100_000, 9, 2),
            (5000, 1_100_000, 0, 3),
        ] {
            let mut v = 2u32.to_le_bytes().to_vec();
            v.extend(1_048_576u64.to_le_bytes());
            v.extend(pack(10, 0, 0));
            v.extend(pack(a, b, bits));
            if a == 20 {
                v[HEADER..HEADER + 8].copy_from_slice(&30u64.to_le_bytes());
            }
            assert!(
                checkpoints(&v, spans, 10_000, 3_000_000).is_err(),
                "{a} {b} {bits}"
            );
        }
        assert!(checkpoints(&v2[..v2.len() - 1], 2, 10_000, 3_000_000).is_err());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(mtime("2023-01-02T03:04:05Z"), 1_672_628_645);
        assert_eq!(mtime("2023-01-02T03:04:05.5+01:00"), 1_672_625_045);
        assert_eq!(mtime("yesterday"), 0);
    }
}
