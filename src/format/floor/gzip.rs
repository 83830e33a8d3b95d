//! gzip member headers (RFC 1952), for the formats that read gzip: tar.gz tarballs and
//! eStargz layers.

/// The longest gzip header accepted (a file name or comment is unbounded in the format).
pub const MAX_HEADER: usize = 64 * 1024;

/// Parse the gzip member header at the start of `b`: its length, or `None` if `b` ends
/// before the header does. An error if it is not a gzip header of a deflate member.
pub fn gzip_header(b: &[u8]) -> std::result::Result<Option<usize>, String> {
    if b.len() >= 2 && b[..2] != [0x1f, 0x8b] || b.len() == 1 && b[0] != 0x1f {
        return Err("not a gzip member".into());
    }
    if b.len() < 10 {
        return Ok(None);
    }
    if b[2] != 8 {
        return Err(format!("gzip compression method {} (only deflate)", b[2]));
    }
    let flags = b[3];
    if flags & 0xe0 != 0 {
        return Err("reserved gzip header flags set".into());
    }
    let mut at = 10usize;
    if flags & 4 != 0 {
        let Some(x) = b.get(at..at + 2) else {
            return Ok(None);
        };
        at += 2 + usize::from(u16::from_le_bytes([x[0], x[1]]));
    }
    for flag in [8u8, 16] {
        if flags & flag != 0 {
            match b.get(at..).and_then(|r| r.iter().position(|&c| c == 0)) {
                Some(n) => at += n + 1,
                None if b.len() >= MAX_HEADER => {
                    return Err("gzip header name or comment too long".into());
                }
                None => return Ok(None),
            }
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    if at > MAX_HEADER {
        return Err("gzip header too long".into());
    }
    Ok((b.len() >= at).then_some(at))
}
