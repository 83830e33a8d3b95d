//! Errors of the pkgfs core, and the one table that maps them to errno values.
//!
//! The library never speaks errno internally: parsers and readers return [`Error`], whose
//! variants say what went wrong in the terms of the archive. Only [`Error::errno`] turns
//! that into the number the kernel sees, so the FUSE adapter has a single place to consult
//! (the approach of mountpoint-s3's `ToErrno`).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything the core can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error from the operating system while reading an archive.
    Io(io::Error),
    /// The archive's structure (end record, central directory, local header) is invalid.
    Format(String),
    /// A member's data does not decode: a bad compressed stream, a CRC mismatch, a size
    /// that disagrees with the directory.
    Corrupt(String),
    /// The member uses something pkgfs cannot read (encryption, an unknown method).
    Unsupported(String),
    /// No such path or inode.
    NotFound,
    /// The operation needs a directory and the inode is not one.
    NotDir,
    /// The operation needs a non-directory and the inode is a directory.
    IsDir,
    /// The inode is not a symbolic link (readlink of anything else).
    NotSymlink,
    /// The filesystem is read-only; every write-type operation fails with this.
    ReadOnly,
    /// An operation pkgfs does not implement (FLUSH, FSYNC, OPEN…): for most of them the
    /// kernel then stops sending it, which is the point (see `transport::ops`).
    Declined,
    /// No ioctl is supported.
    NoIoctl,
    /// The caller may not use the mount (the access rule of `allow_other`/`allow_root`).
    Denied,
    /// No extended attribute of that name.
    NoXattr,
    /// The caller's buffer is too small for the value (or list) asked for.
    Range,
    /// A bug caught at the edge (a panic in a handler): the request fails, the mount lives.
    Internal(String),
    /// Opening an archive needs a long pass over its data, which the caller asked to
    /// defer (see `format::OpenContext::defer_over`); never reaches a request.
    Deferred,
    /// An error tied to one archive file.
    WithPath(PathBuf, Box<Error>),
}

impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            // io::Error is not Clone: keep its kind, OS code and message.
            Error::Io(e) => Error::Io(match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            }),
            Error::Format(m) => Error::Format(m.clone()),
            Error::Corrupt(m) => Error::Corrupt(m.clone()),
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
            Error::NotFound => Error::NotFound,
            Error::NotDir => Error::NotDir,
            Error::IsDir => Error::IsDir,
            Error::NotSymlink => Error::NotSymlink,
            Error::ReadOnly => Error::ReadOnly,
            Error::Declined => Error::Declined,
            Error::NoIoctl => Error::NoIoctl,
            Error::Denied => Error::Denied,
            Error::NoXattr => Error::NoXattr,
            Error::Range => Error::Range,
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::Deferred => Error::Deferred,
            Error::WithPath(p, e) => Error::WithPath(p.clone(), e.clone()),
        }
    }
}

/// Result alias of the core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno this error becomes at the FUSE edge: the single errno table of pkgfs.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(_) | Error::Format(_) | Error::Corrupt(_) | Error::Unsupported(_) => {
                libc::EIO
            }
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotSymlink => libc::EINVAL,
            Error::ReadOnly => libc::EROFS,
            Error::Declined => libc::ENOSYS,
            Error::NoIoctl => libc::ENOTTY,
            Error::Denied => libc::EACCES,
            Error::NoXattr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::Internal(_) | Error::Deferred => libc::EIO,
            Error::WithPath(_, inner) => inner.errno(),
        }
    }

    /// Attach the archive path this error concerns.
    pub fn with_path(self, path: impl Into<PathBuf>) -> Error {
        match self {
            e @ Error::WithPath(..) => e,
            e => Error::WithPath(path.into(), Box::new(e)),
        }
    }

    /// Whether the error says the data is bad (as opposed to a lookup miss).
    pub fn is_data_error(&self) -> bool {
        match self {
            Error::Io(_) | Error::Format(_) | Error::Corrupt(_) | Error::Unsupported(_) => true,
            Error::WithPath(_, inner) => inner.is_data_error(),
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Format(m) => write!(f, "invalid archive: {m}"),
            Error::Corrupt(m) => write!(f, "corrupt data: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::NotFound => f.write_str("no such file or directory"),
            Error::NotDir => f.write_str("not a directory"),
            Error::IsDir => f.write_str("is a directory"),
            Error::NotSymlink => f.write_str("not a symbolic link"),
            Error::ReadOnly => f.write_str("read-only file system"),
            Error::Declined => f.write_str("operation not implemented"),
            Error::NoIoctl => f.write_str("no such ioctl"),
            Error::Denied => f.write_str("permission denied"),
            Error::NoXattr => f.write_str("no such extended attribute"),
            Error::Range => f.write_str("buffer too small"),
            Error::Internal(m) => write!(f, "internal error: {m}"),
            Error::Deferred => f.write_str("needs a pass over its data (deferred)"),
            Error::WithPath(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::WithPath(_, e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        assert_eq!(Error::NotFound.errno(), libc::ENOENT);
        assert_eq!(Error::Corrupt("x".into()).errno(), libc::EIO);
        assert_eq!(Error::ReadOnly.errno(), libc::EROFS);
        assert_eq!(
            Error::NotDir.with_path("/a.zip").errno(),
            libc::ENOTDIR,
            "a path wrapper keeps the inner errno"
        );
        assert!(
            Error::Corrupt("x".into())
                .with_path("/a")
                .to_string()
                .starts_with("/a: corrupt")
        );
    }
}
