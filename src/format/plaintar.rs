//! Uncompressed tar archives read in place: the layers of a `docker save` archive,
//! `.tar` files in a package directory, the decompressed copy of a layer that cannot be
//! entered in the middle (see [`super::zstdtar`]).
//!
//! A tar archive has no index, but it needs no pass either: its headers are read where
//! they are, one positional read each, and the data between them is skipped without
//! being read ([`super::floor::tar::walk_blob`]). An archive of many entries keeps that index
//! in the index cache, so a second mount reads one file instead of one header per
//! entry. A file's bytes are the archive's bytes: reads go straight to the blob, and the
//! kernel's page cache of the archive does the rest (nothing is copied into pkgfs's
//! cache). Nothing checks those bytes: an image layer's digest is checked by the source
//! that names it (see [`super::open_layer`]).

use std::sync::Arc;

use log::warn;

use super::floor::plain;
use super::{
    Checked, Entry, Format, IndexOrigin, Loc, OpenContext, Opened, Package, Probe, Reading,
};
use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::{ReadData, Span};

/// Archives with at least this many entries keep their index in the index cache (fewer
/// cost fewer reads than the cache file would).
const CACHE_FROM: usize = 256;

/// The uncompressed tar format.
pub struct Tar;

/// Whether `probe` starts with a tar header (not an end-of-archive block: an empty
/// archive, like a file of zeros, is not mounted).
fn is_tar(probe: &Probe) -> bool {
    probe.head.len() == 512
        && probe.head.iter().any(|&b| b != 0)
        && super::floor::tar::is_header(&probe.head)
}

impl Format for Tar {
    fn name(&self) -> &'static str {
        "tar"
    }

    fn open(
        &self,
        blob: &Arc<dyn Blob>,
        probe: &Probe,
        cx: &OpenContext,
    ) -> Result<Option<Opened>> {
        if !is_tar(probe) {
            return Ok(None);
        }
        let (entries, origin) = index(&**blob, cx)?;
        Ok(Some(Opened {
            package: Box::new(TarPackage),
            entries,
            origin,
            checked: Checked::Nothing,
        }))
    }
}

/// The entries of `blob`: from the cache, else from its headers.
fn index(blob: &dyn Blob, cx: &OpenContext) -> Result<(Vec<Entry>, IndexOrigin)> {
    let key = cx.index_cache.map(|c| (c, c.key("tar", blob, "")));
    if let Some((c, k)) = &key
        && let Some(bytes) = c.load(k)
    {
        match super::floor::codec::decode_index(&bytes, blob.size()) {
            Ok(entries) => return Ok((entries, IndexOrigin::Cache)),
            Err(e) => log::debug!("{}: cached index unusable: {e}", k.path().display()),
        }
    }
    let entries = scan(blob)?;
    if let Some((c, k)) = &key
        && entries.len() >= CACHE_FROM
    {
        let stored = super::floor::codec::encode_index(&entries, 3)
            .map_err(Error::Io)
            .and_then(|b| c.store(k, &b));
        if let Err(e) = stored {
            warn!(
                "cannot store the index of {} in {}: {e}",
                blob.name().display(),
                k.path().display()
            );
        }
    }
    Ok((entries, IndexOrigin::Archive))
}

/// Read the headers. An archive whose headers break off part way is served as far as
/// they went, with a warning; one whose first header is bad is an error.
pub fn scan(blob: &dyn Blob) -> Result<Vec<Entry>> {
    let mut capped = super::floor::Capped::default();
    let mut problem = None;
    let walked = super::floor::tar::walk_blob(blob, |te| capped.push(te));
    let entries = capped.entries;
    if let Err(e) = walked {
        if entries.is_empty() {
            return Err(Error::Format(format!("not a usable tar archive: {e}")));
        }
        problem = Some(e.to_string());
    }
    if let Some(p) = problem {
        warn!(
            "{}: the tar archive is unusable after {} entries ({p}); they are served",
            blob.name().display(),
            entries.len()
        );
    }
    let size = blob.size();
    if let Some(e) = entries.iter().find(
        |e| matches!(e.data, Loc::Stream(o) if o.checked_add(e.size).is_none_or(|end| end > size)),
    ) {
        warn!(
            "{}: {:?} runs past the end of the archive: it reads as EIO",
            blob.name().display(),
            String::from_utf8_lossy(&e.path)
        );
    }
    Ok(entries)
}

/// The read path: a member's bytes are the blob's ([`plain`]).
#[derive(Debug)]
pub struct TarPackage;

impl Package for TarPackage {
    fn format(&self) -> &'static str {
        "tar"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn entries(&self, blob: &Arc<dyn Blob>, cx: &OpenContext) -> Result<Vec<Entry>> {
        index(&**blob, cx).map(|(e, _)| e)
    }

    fn read(&self, r: &Reading<'_>, offset: u64, end: u64, _span: Span) -> Result<ReadData> {
        plain::read_from(r.blob, r, offset, end)
    }

    fn extent(&self, r: &Reading<'_>) -> Option<(u64, u64)> {
        plain::extent(r)
    }

    fn delivered(&self, _r: &Reading<'_>, _start: u64, _end: u64) {}
}
