//! `pkgfs snapshotter`: the process around the [`Service`]. It opens the snapshotter
//! root, takes the socket (refusing one another server answers on, replacing a stale
//! file), serves gRPC on it until SIGINT or SIGTERM, and removes the socket on the way
//! out. Beside it, the status channel of `pkgfs status SOCKET` (`crate::status`).
//!
//! A tokio runtime of two worker threads (`pkgfs-grpc`) runs the HTTP/2 connections;
//! each request's work runs on tokio's blocking threads, since the store and the disk
//! block. containerd connects lazily, at its first use of the plugin, and again after
//! this process restarts: nothing here waits for it.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::UnixListenerStream;

use super::api::snapshots::snapshots_server::SnapshotsServer;
use super::service::Service;
use super::{Error, Snapshotter};
use crate::config::SnapshotterConfig;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The snapshotter root could not be opened (or another process holds its database).
    #[error("snapshotter root {}: {source}", root.display())]
    Root {
        /// The root.
        root: PathBuf,
        /// Why.
        source: Error,
    },
    /// Another server answers on the socket.
    #[error("{}: another server is listening on this socket", .0.display())]
    SocketInUse(PathBuf),
    /// Something that is not a socket is where the socket should go.
    #[error("{}: exists and is not a socket; not replacing it", .0.display())]
    NotASocket(PathBuf),
    /// The socket or the runtime could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// Make sure nobody serves on `path`: a live socket is refused, a stale one (nobody
/// answers) removed, anything else left alone and refused.
fn claim_socket(path: &Path) -> Result<(), ServeError> {
    let md = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        r => r.map_err(io(format!("{}", path.display())))?,
    };
    if !md.file_type().is_socket() {
        return Err(ServeError::NotASocket(path.to_path_buf()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServeError::SocketInUse(path.to_path_buf())),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            log::info!("{}: removing a stale socket", path.display());
            std::fs::remove_file(path).map_err(io(format!("remove {}", path.display())))
        }
        Err(e) => Err(io(format!("connect to {}", path.display()))(e)),
    }
}

/// Removes the socket when dropped, if it is still the one this process bound.
struct SocketFile {
    path: PathBuf,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino);
        if ours && let Err(e) = std::fs::remove_file(&self.path) {
            log::warn!("{}: {e}", self.path.display());
        }
    }
}

/// Run `pkgfs snapshotter` until SIGINT or SIGTERM.
pub fn run(cfg: &SnapshotterConfig) -> Result<(), ServeError> {
    // The socket first: a second server on the same root and socket is told that
    // another one serves there, rather than that the database is locked.
    claim_socket(&cfg.address)?;
    let source: Box<dyn super::remote::LayerSource> = match &cfg.store {
        Some(store) => Box::new(super::remote::StoreLayers::new(store.clone())),
        None => Box::new(super::remote::Unpacked),
    };
    let snapshotter =
        Snapshotter::with_source(&cfg.root, source).map_err(|source| ServeError::Root {
            root: cfg.root.clone(),
            source,
        })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("pkgfs-grpc")
        .enable_all()
        .build()
        .map_err(io("tokio runtime"))?;
    rt.block_on(serve(Arc::new(snapshotter), cfg))?;
    // Requests still on blocking threads finish (or are abandoned) within a bound.
    rt.shutdown_timeout(Duration::from_secs(10));
    Ok(())
}

async fn serve(snapshotter: Arc<Snapshotter>, cfg: &SnapshotterConfig) -> Result<(), ServeError> {
    let address = cfg.address.as_path();
    // Signals first: one arriving while the socket is set up still stops the server.
    let mut term = signal(SignalKind::terminate()).map_err(io("SIGTERM handler"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io("SIGINT handler"))?;
    if let Some(dir) = address.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(format!("{}", dir.display())))?;
    }
    // Checked again: a server may have started since.
    claim_socket(address)?;
    let listener =
        UnixListener::bind(address).map_err(io(format!("bind {}", address.display())))?;
    let ino = std::fs::symlink_metadata(address)
        .map_err(io(format!("{}", address.display())))?
        .ino();
    let _socket = SocketFile {
        path: address.to_path_buf(),
        ino,
    };
    // `pkgfs status SOCKET`: what each layer is, lazy or unpacked and why.
    {
        let (s, socket, store) = (
            snapshotter.clone(),
            address.to_path_buf(),
            cfg.store.clone(),
        );
        crate::status::serve_snapshotter(address, move |style| {
            super::report::report(&s, &socket, store.as_deref(), style)
        })
        .map_err(io("status channel"))?;
    }
    log::info!(
        "serving containerd's snapshots API on {} (root {})",
        address.display(),
        snapshotter.snapshots_dir().display()
    );
    let stop = async move {
        tokio::select! {
            _ = term.recv() => log::info!("SIGTERM: stopping"),
            _ = int.recv() => log::info!("SIGINT: stopping"),
        }
    };
    tonic::transport::Server::builder()
        .add_service(SnapshotsServer::new(Service::new(snapshotter)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("s.sock");
        assert!(claim_socket(&sock).is_ok(), "nothing there");
        let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(matches!(
            claim_socket(&sock).unwrap_err(),
            ServeError::SocketInUse(_)
        ));
        drop(live);
        assert!(sock.exists(), "a closed listener leaves its file");
        claim_socket(&sock).unwrap();
        assert!(!sock.exists(), "the stale socket is gone");
        std::fs::write(&sock, b"not a socket").unwrap();
        assert!(matches!(
            claim_socket(&sock).unwrap_err(),
            ServeError::NotASocket(_)
        ));
        assert!(sock.exists());
    }
}
