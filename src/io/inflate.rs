//! The deflate decoders: a streaming one whose state can be copied (the basis of
//! checkpoints), and a one-call one for members decoded whole.
//!
//! Random access into a large deflate member would otherwise mean decoding from the
//! member's start. zlib's `inflateCopy` duplicates a decoder mid-stream (its 32 KiB window
//! and bit buffer included), so the read path keeps copies every few MiB of output and
//! resumes the nearest one (the approach of zlib's `zran.c`, without its bit-level
//! priming: a copy can be taken anywhere, not only at deflate block boundaries).
//! `flate2` does not expose `inflateCopy`; `libz-rs-sys` (the zlib API of `zlib-rs`, the
//! same implementation `flate2` uses here) does. All `unsafe` of this module is the use
//! of that C-style API on a boxed `z_stream` that never moves.
//!
//! Most members of a package are small and decoded whole, in one call, by libdeflate
//! ([`OneShot`]: 1.6–1.7× the speed of streaming zlib-rs on the Linux tree's members).
//! It decodes into a buffer's spare capacity, so the buffer is never zero-filled first
//! (the `libdeflater` wrapper takes only initialised slices: a `memset` of every small
//! file before decoding over it, 3–6% of the decoding threads' time). Its `unsafe` is
//! the allocation of libdeflate's decoder and that one call.

use std::ffi::c_int;

use libz_rs_sys::{Z_BLOCK, Z_BUF_ERROR, Z_NO_FLUSH, Z_OK, Z_STREAM_END, z_stream};

/// The largest distance a deflate stream refers back: the window a resumed decoder needs.
pub const WINDOW: usize = 32 * 1024;

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
        self.run(input, output, Z_NO_FLUSH)
    }

    /// [`Inflater::step`], returning early at the end of a deflate block: then
    /// [`Inflater::boundary`] says where the next block starts.
    pub fn step_to_block(&mut self, input: &[u8], output: &mut [u8]) -> Result<Progress> {
        self.run(input, output, Z_BLOCK)
    }

    /// If the decoder stands between two deflate blocks (after [`Inflater::step_to_block`]
    /// returned there) and the stream does not end with the last one: how many bits of
    /// the input consumed so far it has not used yet. The next block starts that many
    /// bits before the end of the consumed input: a place to resume from with
    /// [`Inflater::resume`], given the last 32 KiB of output ([`Inflater::window`]).
    pub fn boundary(&self) -> Option<u32> {
        let t = self.strm.data_type;
        (t & 128 != 0 && t & 64 == 0).then_some((t & 63) as u32)
    }

    /// The last (up to) 32 KiB the decoder produced: the window a later block may refer
    /// back into.
    pub fn window(&self) -> Result<Vec<u8>> {
        let mut w = vec![0u8; WINDOW];
        let mut len: libz_rs_sys::uInt = 0;
        // SAFETY: `w` has room for 32 KiB, the most a window holds; `len` is a valid
        // place for the count.
        let r = unsafe { libz_rs_sys::inflateGetDictionary(&*self.strm, w.as_mut_ptr(), &mut len) };
        if r != Z_OK {
            return Err(failure("inflateGetDictionary", r));
        }
        w.truncate(len as usize);
        Ok(w)
    }

    /// A decoder at a block boundary found earlier: `prime` is the `(bits, value)` of the
    /// byte before the resumed input that belong to the block (0 to 7 bits, the high
    /// bits of that byte: `value = byte >> (8 - bits)`), and `window` the output before.
    pub fn resume(prime: (u32, u32), window: &[u8]) -> Result<Self> {
        let mut d = Inflater::new()?;
        let (bits, value) = prime;
        if bits > 0 {
            // SAFETY: a live raw inflate stream; at most 7 bits.
            let r =
                unsafe { libz_rs_sys::inflatePrime(&mut *d.strm, bits as c_int, value as c_int) };
            if r != Z_OK {
                return Err(failure("inflatePrime", r));
            }
        }
        if !window.is_empty() {
            let len = window.len().min(WINDOW) as libz_rs_sys::uInt;
            let w = &window[window.len() - len as usize..];
            // SAFETY: `w` is a live slice of `len` bytes; a raw inflate stream takes a
            // dictionary at any point before data.
            let r = unsafe { libz_rs_sys::inflateSetDictionary(&mut *d.strm, w.as_ptr(), len) };
            if r != Z_OK {
                return Err(failure("inflateSetDictionary", r));
            }
        }
        Ok(d)
    }

    fn run(&mut self, input: &[u8], output: &mut [u8], flush: c_int) -> Result<Progress> {
        let s = &mut *self.strm;
        s.next_in = input.as_ptr();
        s.avail_in = input.len().min(u32::MAX as usize) as u32;
        s.next_out = output.as_mut_ptr();
        s.avail_out = output.len().min(u32::MAX as usize) as u32;
        let (in0, out0) = (s.avail_in, s.avail_out);
        // SAFETY: next_in/next_out point into the live slices for their stated lengths.
        let r = unsafe { libz_rs_sys::inflate(s, flush) };
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

/// A saved position inside a deflate stream: a copy of the decoder, where its input
/// resumes (bytes of the compressed stream consumed), its output position, and the
/// CRC-32 of the output so far.
pub struct Checkpoint {
    /// The decoder, as it was.
    pub inflater: Inflater,
    /// Compressed bytes consumed.
    pub in_pos: u64,
    /// Decompressed bytes produced.
    pub out_pos: u64,
    /// CRC-32 of those bytes.
    pub crc: crc32fast::Hasher,
}

impl Checkpoint {
    /// An independent copy, to resume from while this one stays as it is.
    pub fn try_clone(&mut self) -> Result<Checkpoint> {
        Ok(Checkpoint {
            inflater: self.inflater.try_clone()?,
            in_pos: self.in_pos,
            out_pos: self.out_pos,
            crc: self.crc.clone(),
        })
    }
}

/// A one-call deflate decoder (libdeflate): a whole raw deflate stream into a buffer.
pub struct OneShot(std::ptr::NonNull<libdeflate_sys::libdeflate_decompressor>);

// SAFETY: the decoder is libdeflate's private scratch state, used by one thread at a time
// (`decode` takes `&mut self`).
unsafe impl Send for OneShot {}

impl OneShot {
    /// A decoder (an error if libdeflate cannot allocate one).
    pub fn new() -> Result<Self> {
        // SAFETY: no arguments; the result is checked for null.
        let p = unsafe { libdeflate_sys::libdeflate_alloc_decompressor() };
        std::ptr::NonNull::new(p).map(OneShot).ok_or_else(|| {
            Error::Io(std::io::Error::other(
                "cannot allocate a deflate decoder (libdeflate)",
            ))
        })
    }

    /// Decode the raw deflate stream `input`, which must hold exactly `size` bytes, into
    /// `out` (cleared first; it grows to `size` if it is smaller). Nothing is zero-filled:
    /// libdeflate writes into the spare capacity, and `out` holds the bytes it reports
    /// written, only once they are exactly `size`.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>, size: usize) -> Result<()> {
        out.clear();
        self.decode_append(input, out, size)
    }

    /// [`OneShot::decode`], appending the `size` bytes to what `out` already holds.
    pub fn decode_append(&mut self, input: &[u8], out: &mut Vec<u8>, size: usize) -> Result<()> {
        use libdeflate_sys::{
            libdeflate_deflate_decompress,
            libdeflate_result_LIBDEFLATE_INSUFFICIENT_SPACE as NO_ROOM,
            libdeflate_result_LIBDEFLATE_SUCCESS as SUCCESS,
        };
        out.reserve_exact(size);
        let have = out.len();
        let mut written = 0usize;
        // SAFETY: `input` is a live slice for its length; the output pointer, past the
        // bytes `out` holds, has room for `size` bytes (reserved above), which is what
        // libdeflate is told it may write; `written` is a valid place for the count.
        let r = unsafe {
            libdeflate_deflate_decompress(
                self.0.as_ptr(),
                input.as_ptr().cast(),
                input.len(),
                out.as_mut_ptr().add(have).cast(),
                size,
                &mut written,
            )
        };
        match r {
            SUCCESS if written == size => {
                // SAFETY: libdeflate reported `written` (= size, within the capacity)
                // bytes written right after the `have` bytes already there.
                unsafe { out.set_len(have + written) };
                Ok(())
            }
            SUCCESS => Err(Error::Corrupt(format!(
                "stream ends after {written} bytes, directory says {size}"
            ))),
            NO_ROOM => Err(Error::Corrupt(format!(
                "stream holds more than the {size} bytes the directory says"
            ))),
            _ => Err(Error::Corrupt("bad deflate stream".into())),
        }
    }
}

impl Drop for OneShot {
    fn drop(&mut self) {
        // SAFETY: allocated by libdeflate_alloc_decompressor, freed once.
        unsafe { libdeflate_sys::libdeflate_free_decompressor(self.0.as_ptr()) };
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

    /// Decode `packed` with block-boundary stops; at every boundary past `every` bytes of
    /// output since the last, note (bit position, output position, window).
    /// (bit position, output position, window) of a block boundary.
    type Boundary = (u64, usize, Vec<u8>);

    fn boundaries(packed: &[u8], every: usize) -> (Vec<u8>, Vec<Boundary>) {
        let mut d = Inflater::new().unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 7000];
        let mut at = 0usize;
        let mut points = Vec::new();
        let mut last = 0usize;
        loop {
            // Odd input chunks, so boundaries fall anywhere in them.
            let chunk = &packed[at..(at + 3001).min(packed.len())];
            let p = d.step_to_block(chunk, &mut buf).unwrap();
            at += p.consumed;
            out.extend_from_slice(&buf[..p.produced]);
            if p.ended {
                break;
            }
            if let Some(bits) = d.boundary()
                && out.len() - last >= every
            {
                points.push((
                    8 * at as u64 - u64::from(bits),
                    out.len(),
                    d.window().unwrap(),
                ));
                last = out.len();
            }
            assert!(p.consumed > 0 || p.produced > 0 || d.boundary().is_some());
        }
        (out, points)
    }

    #[test]
    fn a_decoder_resumed_at_a_block_boundary_decodes_the_rest_exactly() {
        // Text-like: compressible, with deflate blocks of some tens of KiB.
        let mut x = 1u32;
        let data: Vec<u8> = (0..4_000_000)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                b"abcdefghij klmnop\n"[(x >> 27) as usize % 18]
            })
            .collect();
        let packed = deflate(&data);
        let (out, points) = boundaries(&packed, 300_000);
        assert!(out == data);
        assert!(points.len() >= 5, "{} boundaries", points.len());
        for (bit, out_pos, window) in points {
            assert_eq!(window.len(), WINDOW.min(out_pos));
            assert!(window == data[out_pos - window.len()..out_pos]);
            let (byte, bits) = ((bit / 8) as usize, (bit % 8) as u32);
            // The block starts `bits` bits into byte `byte`: those high bits are primed.
            let (start, prime) = if bits == 0 {
                (byte, (0, 0))
            } else {
                (byte + 1, (8 - bits, u32::from(packed[byte]) >> bits))
            };
            let mut d = Inflater::resume(prime, &window).unwrap();
            let mut rest = vec![0u8; data.len() - out_pos];
            let mut done = 0;
            let mut at = start;
            while done < rest.len() {
                let p = d.step(&packed[at..], &mut rest[done..]).unwrap();
                at += p.consumed;
                done += p.produced;
                assert!(p.consumed > 0 || p.produced > 0);
            }
            assert!(rest == data[out_pos..], "resumed at bit {bit}");
        }
        // Garbage primed in: an error or wrong bytes, never a crash.
        let mut d = Inflater::resume((3, 5), &[]).unwrap();
        let _ = d.step(&packed[packed.len() / 2..], &mut vec![0u8; 100_000]);
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

    #[test]
    fn one_shot_fills_a_reused_buffer_with_exactly_the_stream() {
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let packed = deflate(&data);
        let mut d = OneShot::new().unwrap();
        // A buffer that held something longer, and one with too little room: both come
        // out holding exactly the stream's bytes.
        let mut out = vec![0xAA; 300_000];
        d.decode(&packed, &mut out, data.len()).unwrap();
        assert_eq!(out, data);
        let mut small = Vec::with_capacity(10);
        d.decode(&packed, &mut small, data.len()).unwrap();
        assert_eq!(small, data);
        // The decoder is reusable, and an empty stream is an empty output.
        d.decode(&deflate(b""), &mut out, 0).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn one_shot_refuses_wrong_sizes_and_bad_data_and_exposes_nothing() {
        let data = vec![7u8; 50_000];
        let packed = deflate(&data);
        let mut d = OneShot::new().unwrap();
        let mut out = Vec::new();
        for (size, says) in [
            (data.len() + 1, "ends after"),
            (data.len() - 1, "more than"),
        ] {
            let e = d.decode(&packed, &mut out, size).unwrap_err();
            assert!(e.to_string().contains(says), "{size}: {e}");
            assert!(out.is_empty(), "no bytes are exposed after a failure");
        }
        let e = d.decode(&[0xff; 64], &mut out, 100).unwrap_err();
        assert!(e.to_string().contains("bad deflate"), "{e}");
        let e = d
            .decode(&packed[..packed.len() / 2], &mut out, data.len())
            .unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        assert!(out.is_empty());
    }
}
