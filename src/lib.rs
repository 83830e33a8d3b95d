//! pkgfs: serve a directory of package archives as one merged, read-only tree.
//!
//! The crate is a library with a thin binary on top, in layers (each uses only those
//! below it):
//!
//! ```text
//! daemon, cli, tools      wiring, arguments, offline commands
//! snapshot                a containerd snapshotter (proxy plugin over gRPC); stands alone
//! source, status          finding, indexing, watching archives; the status report
//! layout                  where each package goes (merge, each, npm, cargo)
//! keeper                  holds a mount's connection across its servers' lives
//! transport               the operation layer (ops) and its codecs: fuse, uring
//! fs                      the filesystem operations → Result, directory read-ahead
//! tree                    the merged tree, its generations, path rules
//! format                  one module per archive format, over their shared floor
//! io                      byte sources (local, remote), caches, decoders, read machinery
//! error, sync             errors and the one errno table; poison-tolerant locks
//! ```
//!
//! Only [`transport`] knows the FUSE protocol; the `fuser` crate is used by its `fuse`
//! codec and its `session` module, and by [`daemon`], which holds the
//! `fuser::BackgroundSession` that `session` starts and joins it to learn when the mount
//! ends. Everything else is tested without a mount. `docs/ARCHITECTURE.md` describes the
//! modules, `docs/SEMANTICS.md` what users see.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod app;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod error;
pub mod format;
pub mod fs;
pub mod fstab;
pub mod io;
pub mod keeper;
pub mod layout;
pub mod progress;
pub mod seal;
pub mod snapshot;
pub mod source;
pub mod status;
pub mod sync;
pub mod tools;
pub mod transport;
pub mod tree;
