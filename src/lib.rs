//! pkgfs: serve a directory of package archives as one merged, read-only tree.
//!
//! The crate is a library with a thin binary on top. Data flows one way:
//!
//! ```text
//! source (find archives) → archive (read indexes) → tree (normalise, merge, freeze)
//!                                                       ↓
//!             fuse (kernel adapter)  →  fs (operations)  →  read (cache, decoders)
//! ```
//!
//! Only [`fuse`] knows about the FUSE binding; everything else is tested without a mount.
//! `docs/ARCHITECTURE.md` describes the modules, `docs/SEMANTICS.md` what users see.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
pub mod daemon;
pub mod error;
pub mod format;
pub mod fs;
pub mod read;
pub mod source;
pub mod status;
pub mod tools;
pub mod transport;
pub mod tree;
