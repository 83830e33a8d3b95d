//! How requests from the kernel reach the filesystem, and how its answers go back.
//!
//! [`ops`] is the operation layer: what every FUSE operation does, which are refused and
//! with which error, and the access rule, in the crate's own [`crate::error::Error`]. The
//! two transports are codecs over it: [`fuse`] (the `fuser` crate's `/dev/fuse` loop)
//! and [`uring`] (FUSE over io_uring). [`session`] mounts and unmounts, and adopts a
//! connection handed over by a keeper; [`device`] is the little of the protocol a keeper
//! speaks itself on the raw descriptor (keep INIT, ask for a resend, refuse with `EIO`).
//! [`host`] reads the host's kernel settings that decide what a round trip costs.

pub mod device;
pub mod fuse;
pub mod host;
pub mod ops;
pub mod session;
pub mod uring;
