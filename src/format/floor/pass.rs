//! What the index passes of compressed tarballs share (gzip in `targz`, zstd in
//! `zstdtar`): the pass's decoder read as a tar stream by the header walk
//! ([`PassReader`]), and an image layer's digest checked on the way ([`PassDigest`]).

use std::io::{self, Read};

use crate::error::Result;
use crate::io::blob::Blob;
use crate::io::digest::{Digest, Hasher, mismatch};

/// What a layer's digest covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestOf {
    /// The blob as stored (OCI descriptors).
    Blob,
    /// The uncompressed tar stream (a docker archive's `diff_ids`).
    Tar,
}

/// An index pass's decoder: it makes the tar stream a stretch at a time into a buffer of
/// its own, which the header walk reads through [`PassReader`].
pub trait Produce {
    /// Decode the next stretch (the one before has been read whole); `Ok(false)` at the
    /// end of the stream.
    fn produce(&mut self) -> Result<bool>;
    /// The output decoded and not read yet.
    fn unread(&self) -> &[u8];
    /// The first `n` bytes of [`Produce::unread`] have been read.
    fn consume(&mut self, n: usize);
}

/// A pass's decoder as the `Read` of its tar stream; a decoding error reaches the reader
/// as an I/O error that carries it.
pub struct PassReader<'p, P>(pub &'p mut P);

impl<P: Produce> Read for PassReader<'_, P> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.0.unread().is_empty() {
            match self.0.produce() {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(e) => return Err(io::Error::other(e)),
            }
        }
        let unread = self.0.unread();
        let n = buf.len().min(unread.len());
        buf[..n].copy_from_slice(&unread[..n]);
        self.0.consume(n);
        Ok(n)
    }
}

/// The digest an image layer must have, hashed as an index pass reads the blob (a digest
/// of the blob) or decodes it (a digest of the tar stream).
pub struct PassDigest<'a> {
    want: &'a Digest,
    of: DigestOf,
    hasher: Hasher,
    /// Bytes of the blob hashed so far (a digest of the blob).
    hashed: u64,
}

impl<'a> PassDigest<'a> {
    /// A digest `want` of `of` to check.
    pub fn new(want: &'a Digest, of: DigestOf) -> Self {
        PassDigest {
            want,
            of,
            hasher: want.hasher(),
            hashed: 0,
        }
    }

    /// The pass read `bytes` of the blob at offset `at`: hashed if the digest is of the
    /// blob and they follow the bytes hashed so far.
    pub fn blob(&mut self, at: u64, bytes: &[u8]) {
        if self.of == DigestOf::Blob && at == self.hashed {
            self.hasher.update(bytes);
            self.hashed += bytes.len() as u64;
        }
    }

    /// The pass decoded `bytes`, the next of the tar stream.
    pub fn tar(&mut self, bytes: &[u8]) {
        if self.of == DigestOf::Tar {
            self.hasher.update(bytes);
        }
    }

    /// After the pass: the bytes of `blob` it did not read (garbage after the end of the
    /// stream) are hashed too, then the digest is compared.
    pub fn check(mut self, blob: &dyn Blob) -> Result<()> {
        if self.of == DigestOf::Blob {
            const CHUNK: u64 = 1 << 20;
            let size = blob.size();
            let mut buf = Vec::new();
            while self.hashed < size {
                let n = (size - self.hashed).min(CHUNK) as usize;
                buf.resize(n, 0);
                blob.read_exact_at(&mut buf, self.hashed)?;
                self.hasher.update(&buf);
                self.hashed += n as u64;
            }
        }
        let got = self.hasher.finish();
        if got != *self.want {
            return Err(mismatch("the layer", self.want, &got));
        }
        Ok(())
    }
}
