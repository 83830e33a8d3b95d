//! The read path of an uncompressed tar stream: a member's bytes are read in place from
//! the blob that holds the stream (an archive, or a decompressed copy of one), with
//! nothing to decode and nothing cached (the page cache of the blob is the cache).

use super::{Loc, Reading};
use crate::error::{Error, Result};
use crate::io::ReadData;
use crate::io::blob::Blob;
use crate::io::cache::Block;

fn start(r: &Reading<'_>) -> Result<u64> {
    match r.loc {
        Loc::Stream(o) => Ok(*o),
        other => Err(Error::Format(format!("not a tar member: {other:?}"))),
    }
}

/// Bytes `[offset, end)` of the member `r` names, from `blob` (the archive's blob, or a
/// decompressed copy of it).
pub fn read_from(blob: &dyn Blob, r: &Reading<'_>, offset: u64, end: u64) -> Result<ReadData> {
    let start = start(r)?;
    let mut buf = vec![0u8; (end - offset) as usize];
    blob.read_exact_at(&mut buf, start + offset)
        .map_err(|e| match e {
            // The archive is shorter than its headers say.
            Error::Format(m) => Error::Corrupt(m),
            e => e,
        })?;
    r.io.count_read(buf.len());
    Ok(ReadData::Owned(Block::new(buf)))
}

/// The bytes of the blob that reading the member whole reads.
pub fn extent(r: &Reading<'_>) -> Option<(u64, u64)> {
    let start = start(r).ok()?;
    Some((start, start.checked_add(r.size)?))
}
