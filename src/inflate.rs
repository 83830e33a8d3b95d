//! A raw-deflate decoder whose state can be copied: the basis of checkpoints.
//!
//! Random access into a large deflate member would otherwise mean decoding from the
//! member's start. zlib's `inflateCopy` duplicates a decoder mid-stream (its 32 KiB window
//! and bit buffer included), so the read path keeps copies every few MiB of output and
//! resumes the nearest one (the approach of zlib's `zran.c`, without its bit-level
//! priming: a copy can be taken anywhere, not only at deflate block boundaries).
//! `flate2` does not expose `inflateCopy`; `libz-rs-sys` (the zlib API of `zlib-rs`, the
//! same implementation `flate2` uses here) does. All `unsafe` of this module is the use
//! of that C-style API on a boxed `z_stream` that never moves.

use std::ffi::c_int;

use libz_rs_sys::{Z_BUF_ERROR, Z_NO_FLUSH, Z_OK, Z_STREAM_END, z_stream};

use crate::error::{Error, Result};

/// A raw (headerless) deflate decoder.
pub struct Inflater {
    strm: Box<z_stream>,
}

// SAFETY: the stream's pointers refer only to memory the stream owns (its state) or to
// buffers passed for the duration of one `step`; nothing is shared between threads.
unsafe impl Send for Inflater {}

/// One decoding step's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Input bytes consumed.
    pub consumed: usize,
    /// Output bytes produced.
    pub produced: usize,
    /// The deflate stream ended.
    pub ended: bool,
}

fn failure(what: &str, code: c_int) -> Error {
    Error::Corrupt(format!("bad deflate stream ({what}: zlib error {code})"))
}

impl Inflater {
    /// A decoder at the start of a raw deflate stream.
    pub fn new() -> Result<Self> {
        let mut strm = Box::new(z_stream::default());
        // SAFETY: `strm` is a default-initialised z_stream with the allocator set; the
        // version string and size are the library's own.
        let r = unsafe {
            libz_rs_sys::inflateInit2_(
                &mut *strm,
                -15,
                libz_rs_sys::zlibVersion(),
                std::mem::size_of::<z_stream>() as c_int,
            )
        };
        if r != Z_OK {
            return Err(Error::Io(std::io::Error::other(format!(
                "cannot start a deflate decoder (zlib error {r})"
            ))));
        }
        Ok(Inflater { strm })
    }

    /// Decode from `input` into `output`.
    pub fn step(&mut self, input: &[u8], output: &mut [u8]) -> Result<Progress> {
        let s = &mut *self.strm;
        s.next_in = input.as_ptr();
        s.avail_in = input.len().min(u32::MAX as usize) as u32;
        s.next_out = output.as_mut_ptr();
        s.avail_out = output.len().min(u32::MAX as usize) as u32;
        let (in0, out0) = (s.avail_in, s.avail_out);
        // SAFETY: next_in/next_out point into the live slices for their stated lengths.
        let r = unsafe { libz_rs_sys::inflate(s, Z_NO_FLUSH) };
        let progress = Progress {
            consumed: (in0 - s.avail_in) as usize,
            produced: (out0 - s.avail_out) as usize,
            ended: r == Z_STREAM_END,
        };
        // The slices end with this call: leave no pointer into them behind.
        s.next_in = std::ptr::null();
        s.avail_in = 0;
        s.next_out = std::ptr::null_mut();
        s.avail_out = 0;
        match r {
            Z_OK | Z_STREAM_END => Ok(progress),
            // No progress possible with this input and output: the caller decides.
            Z_BUF_ERROR => Ok(progress),
            code => Err(failure("inflate", code)),
        }
    }

    /// An independent copy of this decoder, at the same point of the stream.
    pub fn try_clone(&mut self) -> Result<Self> {
        // inflateCopy refuses a source without an output pointer: lend it a harmless one.
        let mut dummy = [0u8; 1];
        self.strm.next_out = dummy.as_mut_ptr();
        self.strm.avail_out = 0;
        let mut dest = Box::new(z_stream::default());
        // SAFETY: `dest` is writable; `self.strm` is a live inflate stream.
        let r = unsafe { libz_rs_sys::inflateCopy(&mut *dest, &*self.strm) };
        self.strm.next_out = std::ptr::null_mut();
        dest.next_out = std::ptr::null_mut();
        if r != Z_OK {
            // Dropping `dest` ends it, which is a no-op for a stream without state.
            return Err(Error::Io(std::io::Error::other(format!(
                "cannot copy a deflate decoder (zlib error {r})"
            ))));
        }
        Ok(Inflater { strm: dest })
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        // SAFETY: the stream was initialised by inflateInit2_ or inflateCopy.
        unsafe { libz_rs_sys::inflateEnd(&mut *self.strm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_copy_resumes_exactly_where_the_original_was() {
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 % 17)
            .collect();
        let packed = deflate(&data);
        let mut d = Inflater::new().unwrap();
        let mut out = vec![0u8; 1_000_003];
        let mut used = 0;
        let mut made = 0;
        while made < out.len() {
            let p = d.step(&packed[used..], &mut out[made..]).unwrap();
            used += p.consumed;
            made += p.produced;
        }
        assert_eq!(out, data[..1_000_003]);
        let mut copy = d.try_clone().unwrap();
        // Both decode the rest identically and independently.
        for dec in [&mut d, &mut copy] {
            let mut rest = vec![0u8; data.len() - 1_000_003];
            let (mut u, mut m) = (used, 0);
            let mut ended = false;
            while !ended {
                let p = dec.step(&packed[u..], &mut rest[m..]).unwrap();
                u += p.consumed;
                m += p.produced;
                ended = p.ended;
            }
            assert_eq!(rest, data[1_000_003..]);
            assert_eq!(u, packed.len());
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_crash() {
        let mut d = Inflater::new().unwrap();
        let mut out = [0u8; 64];
        let r = d.step(&[0xff; 64], &mut out);
        assert!(r.is_err(), "{r:?}");
    }
}
