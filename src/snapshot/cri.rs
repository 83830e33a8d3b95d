//! kubelet's image pull secrets for the layer store: a proxy of the CRI image service.
//!
//! kubelet pulls through the CRI `ImageService` (`runtime.v1`), and a pull of a private
//! image carries the pod's pull secret in `PullImageRequest.auth`. containerd's CRI
//! plugin uses it for what containerd itself fetches (manifest, config), but the layers
//! a remote snapshotter reads lazily are fetched by the `pkgfs store` behind
//! `pkgfs snapshotter`, which never sees it. As stargz-snapshotter does, the store
//! serves the image service on a socket of its own (`pkgfs store --cri-image-proxy
//! SOCKET`), kubelet is pointed at it (`--image-service-endpoint unix://SOCKET`), and
//! every call goes on to containerd's socket (`--cri-upstream`) unchanged: HTTP/2
//! requests and answers are passed through as they are, not decoded and encoded
//! again, so a field this code does not know survives. On the way, `PullImage`'s
//! credentials are read and kept in the registries' keychain for the image's
//! repository ([`crate::io::registry::keychain`]) before containerd sees the pull, and
//! so before its unpacker asks the snapshotter for a layer.
//!
//! Only the image service (`runtime.v1` and `runtime.v1alpha2`) is passed on: a call
//! of any other service is answered `UNIMPLEMENTED`, so the socket cannot be used to
//! reach containerd's runtime. The socket is made mode 0600 (a secret passes through
//! it). What cannot be read (a compressed or malformed message, a reference that does
//! not parse, an identity token: an OAuth refresh token, which needs a token exchange
//! this code does not make) is logged and passed on all the same: containerd pulls,
//! and the layers the store cannot read are unpacked by containerd, as
//! `pkgfs status` then says.

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use log::{debug, info, warn};

use crate::io::registry::Reference;
use crate::io::registry::auth::Credentials;
use crate::io::registry::keychain::{Keychain, Secret};

/// The services passed on.
pub const SERVICES: [&str; 2] = ["runtime.v1.ImageService", "runtime.v1alpha2.ImageService"];
/// Largest `PullImage` request read (its image name, annotations, credentials and the
/// pod's sandbox config: kilobytes).
pub const MAX_PULL_REQUEST: usize = 4 << 20;

/// The parts of the CRI's `PullImageRequest` read here (k8s.io/cri-api
/// `pkg/apis/runtime/v1/api.proto`, the same numbers in `v1alpha2`); every other
/// field is skipped when decoding, and passed on untouched since the request is.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageRequest {
    /// `ImageSpec image = 1`.
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    /// `AuthConfig auth = 2`.
    #[prost(message, optional, tag = "2")]
    pub auth: Option<AuthConfig>,
}

/// `ImageSpec`: the image named.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    /// `string image = 1`.
    #[prost(string, tag = "1")]
    pub image: String,
}

/// `AuthConfig`: a pull secret's entry for the image's registry.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthConfig {
    /// `string username = 1`.
    #[prost(string, tag = "1")]
    pub username: String,
    /// `string password = 2`.
    #[prost(string, tag = "2")]
    pub password: String,
    /// `string auth = 3`: base64 of `USER:PASS`.
    #[prost(string, tag = "3")]
    pub auth: String,
    /// `string server_address = 4`.
    #[prost(string, tag = "4")]
    pub server_address: String,
    /// `string identity_token = 5`: an OAuth2 refresh token.
    #[prost(string, tag = "5")]
    pub identity_token: String,
    /// `string registry_token = 6`: a bearer token for the registry.
    #[prost(string, tag = "6")]
    pub registry_token: String,
}

/// What a pull secret gives, if anything usable (its reason otherwise).
pub fn secret_of(auth: &AuthConfig) -> std::result::Result<Option<Secret>, &'static str> {
    if !auth.registry_token.is_empty() {
        return Ok(Some(Secret::Bearer(auth.registry_token.clone())));
    }
    if !auth.username.is_empty() {
        return Credentials::parse(&format!("{}:{}", auth.username, auth.password))
            .map(|c| Some(Secret::Basic(c)))
            .ok_or("a user name that does not parse");
    }
    if !auth.auth.is_empty() {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.auth.trim())
            .map_err(|_| "an `auth` that is not base64")?;
        let text = String::from_utf8(raw).map_err(|_| "an `auth` that is not UTF-8")?;
        return Credentials::parse(&text)
            .map(|c| Some(Secret::Basic(c)))
            .ok_or("an `auth` that is not USER:PASS");
    }
    if !auth.identity_token.is_empty() {
        return Err("an identity token (OAuth refresh token), which the store cannot use");
    }
    Ok(None)
}

/// Read a `PullImage` request's gRPC message (one length-prefixed frame) and keep its
/// credentials in `keychain`; what was done, for the log.
pub fn note_pull(frame: &[u8], keychain: &Keychain) -> String {
    let Some((&flag, rest)) = frame.split_first() else {
        return "an empty request".into();
    };
    if flag != 0 {
        return "a compressed request: its credentials are not read".into();
    }
    let Some(len) = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    else {
        return "a cut request".into();
    };
    let Some(msg) = rest.get(4..4 + len) else {
        return "a cut request".into();
    };
    let req = match <PullImageRequest as prost::Message>::decode(msg) {
        Ok(r) => r,
        Err(e) => return format!("a request that does not decode ({e})"),
    };
    let image = req.image.map(|i| i.image).unwrap_or_default();
    let Some(auth) = req.auth else {
        return format!("{image}: no credentials");
    };
    let r = match Reference::parse(&image) {
        Ok(r) => r,
        Err(e) => return format!("{image:?}: credentials not kept: {e}"),
    };
    match secret_of(&auth) {
        Ok(Some(s)) => {
            keychain.put(&r.host, &r.repo, s);
            format!("{image}: credentials kept for {}/{}", r.host, r.repo)
        }
        Ok(None) => format!("{image}: empty credentials"),
        Err(why) => format!("{image}: credentials not kept: {why}"),
    }
}

/// The body both ways.
type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// A gRPC answer with no message: `code` and `message` in the headers (a
/// "trailers-only" response).
fn status(code: u32, message: &str) -> Response<ProxyBody> {
    let msg: String = message
        .bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    let h = r.headers_mut();
    h.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", code.into());
    if let Ok(v) = hyper::header::HeaderValue::from_str(&msg) {
        h.insert("grpc-message", v);
    }
    r
}

/// gRPC status codes used here.
const UNIMPLEMENTED: u32 = 12;
const UNAVAILABLE: u32 = 14;
const RESOURCE_EXHAUSTED: u32 = 8;
const INVALID_ARGUMENT: u32 = 3;

/// containerd's socket, and one HTTP/2 connection to it (made again when it closes).
struct Upstream {
    path: PathBuf,
    conn: tokio::sync::Mutex<Option<hyper::client::conn::http2::SendRequest<ProxyBody>>>,
}

impl Upstream {
    async fn sender(&self) -> std::io::Result<hyper::client::conn::http2::SendRequest<ProxyBody>> {
        let mut conn = self.conn.lock().await;
        if let Some(s) = conn.as_ref()
            && !s.is_closed()
        {
            return Ok(s.clone());
        }
        let stream = tokio::net::UnixStream::connect(&self.path).await?;
        let (send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!("CRI proxy: containerd's connection ended: {e}");
            }
        });
        *conn = Some(send.clone());
        Ok(send)
    }
}

/// One call: checked, read if it is a pull, passed on.
async fn call(
    req: Request<Incoming>,
    up: Arc<Upstream>,
    keychain: Arc<Keychain>,
) -> std::result::Result<Response<ProxyBody>, Infallible> {
    let path = req.uri().path().to_string();
    let mut parts_of = path.trim_start_matches('/').splitn(2, '/');
    let service = parts_of.next().unwrap_or("");
    let method = parts_of.next().unwrap_or("");
    if !SERVICES.contains(&service) {
        debug!("CRI proxy: {path}: not the image service");
        return Ok(status(
            UNIMPLEMENTED,
            &format!("pkgfs passes on the image service only, not {service}"),
        ));
    }
    let (mut parts, body) = req.into_parts();
    let body: ProxyBody = if method == "PullImage" {
        let bytes = match Limited::new(body, MAX_PULL_REQUEST).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                warn!("CRI proxy: a PullImage request not read: {e}");
                let code = if e.is::<http_body_util::LengthLimitError>() {
                    RESOURCE_EXHAUSTED
                } else {
                    INVALID_ARGUMENT
                };
                return Ok(status(
                    code,
                    &format!("pkgfs: the request could not be read: {e}"),
                ));
            }
        };
        info!("CRI proxy: PullImage of {}", note_pull(&bytes, &keychain));
        Full::new(bytes).map_err(|never| match never {}).boxed()
    } else {
        body.boxed()
    };
    // The answer's own scheme and authority for the next hop (containerd looks at the
    // path only).
    let pq = parts
        .uri
        .path_and_query()
        .map_or_else(|| path.clone(), |p| p.as_str().to_string());
    parts.uri = match format!("http://localhost{pq}").parse() {
        Ok(u) => u,
        Err(_) => return Ok(status(INVALID_ARGUMENT, "pkgfs: a path that is not a URI")),
    };
    let sent = match up.sender().await {
        Ok(mut s) => s.send_request(Request::from_parts(parts, body)).await,
        Err(e) => {
            warn!("CRI proxy: containerd at {}: {e}", up.path.display());
            return Ok(status(
                UNAVAILABLE,
                &format!("pkgfs: containerd at {}: {e}", up.path.display()),
            ));
        }
    };
    match sent {
        Ok(r) => Ok(r.map(|b| b.boxed())),
        Err(e) => {
            warn!("CRI proxy: {path}: containerd: {e}");
            Ok(status(UNAVAILABLE, &format!("pkgfs: containerd: {e}")))
        }
    }
}

/// The proxy, serving until dropped (its socket removed then, if still its own).
pub struct CriProxy {
    listen: PathBuf,
    /// The socket file's (device, inode) as bound: a server that replaced this one may
    /// have bound its own there since.
    bound: (u64, u64),
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CriProxy {
    /// Serve the image service on `listen` (a stale socket there is replaced; one a live
    /// process answers on is waited for to let go, up to `wait`, then refused), passing
    /// it on to containerd at `upstream`, feeding `keychain`; on a thread of its own.
    pub fn start(
        listen: &Path,
        upstream: &Path,
        keychain: Arc<Keychain>,
        wait: Option<std::time::Duration>,
    ) -> std::io::Result<CriProxy> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("pkgfs-cri")
            .enable_all()
            .build()?;
        // A socket file nobody answers on is a stale one (a server that died): replaced.
        // One that answers belongs to a live process, which is not robbed of it: the
        // server this one replaces lets go once this one serves the mount.
        let since = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(listen).is_ok() {
            if since.elapsed() >= wait.unwrap_or_default() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("another process serves {}", listen.display()),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if wait.is_some() && since.elapsed().as_millis() >= 100 {
            info!(
                "CRI proxy: {} let go after {} ms",
                listen.display(),
                since.elapsed().as_millis()
            );
        }
        match std::fs::remove_file(listen) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = {
            let _guard = rt.enter();
            tokio::net::UnixListener::bind(listen)?
        };
        std::fs::set_permissions(listen, std::fs::Permissions::from_mode(0o600))?;
        let bound = file_id(listen)?;
        let up = Arc::new(Upstream {
            path: upstream.to_path_buf(),
            conn: tokio::sync::Mutex::new(None),
        });
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        info!(
            "CRI image service passed on from {} to {}",
            listen.display(),
            upstream.display()
        );
        let thread = std::thread::Builder::new()
            .name("pkgfs-cri".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        let conn = tokio::select! {
                            _ = &mut stopped => break,
                            c = listener.accept() => c,
                        };
                        let (stream, _) = match conn {
                            Ok(c) => c,
                            Err(e) => {
                                warn!("CRI proxy: accept: {e}");
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                                continue;
                            }
                        };
                        let (up, keychain) = (up.clone(), keychain.clone());
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                call(req, up.clone(), keychain.clone())
                            });
                            if let Err(e) =
                                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await
                            {
                                debug!("CRI proxy: a client's connection ended: {e}");
                            }
                        });
                    }
                });
            })?;
        Ok(CriProxy {
            listen: listen.to_path_buf(),
            bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for CriProxy {
    fn drop(&mut self) {
        // The socket file goes first, if it is still this one's, while the listener
        // still answers: a server waiting to replace this one binds its own only once
        // connecting fails, so this never removes the next one's socket.
        if file_id(&self.listen).is_ok_and(|id| id == self.bound) {
            let _ = std::fs::remove_file(&self.listen);
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A file's (device, inode).
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(req: &PullImageRequest) -> Vec<u8> {
        let msg = prost::Message::encode_to_vec(req);
        let mut f = vec![0u8];
        f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        f.extend_from_slice(&msg);
        f
    }

    fn pull(image: &str, auth: AuthConfig) -> PullImageRequest {
        PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
            }),
            auth: Some(auth),
        }
    }

    #[test]
    fn a_pulls_credentials_are_kept_for_its_repository() {
        let k = Keychain::default();
        let auth = AuthConfig {
            username: "u".into(),
            password: "p:w".into(),
            ..AuthConfig::default()
        };
        let said = note_pull(&frame(&pull("127.0.0.1:5000/team/app:1", auth)), &k);
        assert!(said.contains("kept for 127.0.0.1:5000/team/app"), "{said}");
        assert_eq!(
            k.get("127.0.0.1:5000", "team/app"),
            Some(Secret::Basic(Credentials::parse("u:p:w").unwrap()))
        );
        // A one-component name on Docker Hub, with `auth` instead of the two fields.
        use base64::Engine as _;
        let auth = AuthConfig {
            auth: base64::engine::general_purpose::STANDARD.encode("v:q"),
            ..AuthConfig::default()
        };
        note_pull(&frame(&pull("busybox", auth)), &k);
        assert_eq!(
            k.get("docker.io", "library/busybox"),
            Some(Secret::Basic(Credentials::parse("v:q").unwrap()))
        );
        // A registry token is sent as it is.
        let auth = AuthConfig {
            registry_token: "tok".into(),
            ..AuthConfig::default()
        };
        let digest = format!("r.example/x@sha256:{}", "0".repeat(64));
        note_pull(&frame(&pull(&digest, auth)), &k);
        assert_eq!(k.get("r.example", "x"), Some(Secret::Bearer("tok".into())));
    }

    #[test]
    fn a_live_socket_is_refused_a_stale_one_replaced_and_calls_answered() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let absent = dir.path().join("no-containerd.sock");
        // A live listener: refused, and left alone.
        let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = CriProxy::start(&sock, &absent, Arc::default(), None)
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        assert!(sock.exists());
        // Its process gone, the file stays: replaced, mode 0600.
        drop(live);
        let proxy = CriProxy::start(&sock, &absent, Arc::default(), None).unwrap();
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A call of another service is UNIMPLEMENTED; an image call with containerd
        // away is UNAVAILABLE, naming where containerd was looked for.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ask = |path: &'static str| {
            rt.block_on(async {
                let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
                let (mut send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                let req = Request::post(format!("http://localhost{path}"))
                    .header("content-type", "application/grpc")
                    .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
                    .unwrap();
                let r = send.send_request(req).await.unwrap();
                let h = |k: &str| {
                    r.headers()
                        .get(k)
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default()
                };
                (h("grpc-status"), h("grpc-message"))
            })
        };
        let (code, msg) = ask("/runtime.v1.RuntimeService/ListContainers");
        assert_eq!(code, "12", "{msg}");
        let (code, msg) = ask("/runtime.v1.ImageService/ListImages");
        assert_eq!(code, "14", "{msg}");
        assert!(msg.contains("no-containerd.sock"), "{msg}");
        // Dropped: the socket goes.
        drop(proxy);
        assert!(!sock.exists());
    }

    #[test]
    fn a_proxy_that_replaces_another_waits_for_its_socket_and_the_old_leaves_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let absent = dir.path().join("no-containerd.sock");
        let old = CriProxy::start(&sock, &absent, Arc::default(), None).unwrap();
        // Not waiting: refused at once.
        let e = CriProxy::start(&sock, &absent, Arc::default(), None)
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        // Waiting: the old one ends a moment later (as the keeper stops a replaced
        // server), and the new one takes the socket then. (The pause only makes the
        // new one start while the old one serves; the test passes whatever the order.)
        let ender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(old);
        });
        let new = CriProxy::start(
            &sock,
            &absent,
            Arc::default(),
            Some(std::time::Duration::from_secs(20)),
        )
        .unwrap();
        ender.join().unwrap();
        assert_eq!(file_id(&sock).unwrap(), new.bound);
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
        // A proxy whose socket another bound since leaves that one in place.
        std::fs::remove_file(&sock).unwrap();
        let next = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let next_id = file_id(&sock).unwrap();
        drop(new);
        assert_eq!(
            file_id(&sock).unwrap(),
            next_id,
            "the next one's socket went"
        );
        drop(next);
    }

    #[test]
    fn what_cannot_be_read_keeps_nothing_and_says_why() {
        let k = Keychain::default();
        let ident = AuthConfig {
            identity_token: "refresh".into(),
            ..AuthConfig::default()
        };
        let f = frame(&pull("r.example/x:1", ident));
        assert!(note_pull(&f, &k).contains("identity token"));
        let mut compressed = f.clone();
        compressed[0] = 1;
        assert!(note_pull(&compressed, &k).contains("compressed"));
        assert!(note_pull(&f[..f.len() - 1], &k).contains("cut"));
        assert!(note_pull(&[], &k).contains("empty"));
        assert!(note_pull(&[0, 0, 0, 0, 2, 0xff, 0xff], &k).contains("does not decode"));
        let bad = AuthConfig {
            auth: "not base64!".into(),
            ..AuthConfig::default()
        };
        assert!(note_pull(&frame(&pull("r.example/x:1", bad)), &k).contains("base64"));
        let nobody = PullImageRequest {
            image: Some(ImageSpec {
                image: "r.example/x:1".into(),
            }),
            auth: None,
        };
        assert!(note_pull(&frame(&nobody), &k).contains("no credentials"));
        assert!(k.is_empty());
    }
}
