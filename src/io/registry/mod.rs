//! Container registries (the OCI distribution API), as podman and skopeo reach them:
//! manifests by tag or digest, blobs by HTTP range, with the credentials, certificates
//! and TLS settings those tools read.
//!
//! - [`Reference`]: `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]` parsed as skopeo does (no
//!   host: `docker.io`, and `library/` before a one-component name).
//! - [`Registry`]: one per host. The first request (no ping of `/v2/` first: one round
//!   trip less) learns the scheme (`https`; plain `http` only with
//!   `--tls-verify=false`, after HTTPS could not be spoken) and, by its 401, the
//!   challenge. Requests then carry `Basic` credentials or a bearer token for the
//!   repository's `pull` scope (fetched from the challenge's realm, with the credentials
//!   if there are any; cached until it expires; renewed once on a 401). Failed requests
//!   (resets, timeouts, 5xx) are retried with backoff, 429 and 503 after their
//!   `Retry-After` when it fits in the caller's bound; every request is counted.
//! - Blobs: a range is asked of `/v2/REPO/blobs/DIGEST`; a redirect to blob storage is
//!   followed (at most [`MAX_REDIRECTS`] hops, never with the registry's
//!   `Authorization`) and remembered per blob, so later ranges go straight there; a
//!   401/403 from the storage host (an expired signed URL) asks the registry again.
//!   `206` answers must name the range asked for; a `200` (a server that ignores ranges)
//!   is read up to the range's end and cut.
//! - [`auth`]: where credentials come from (`--creds`, `auth.json` files, docker's
//!   `config.json`) and the `WWW-Authenticate` challenge.
//!
//! Nothing here checks digests: the image resolver checks every document, and the
//! formats check layers (a pass hashes the blob; a table of contents and its chunks are
//! checked against their digests), as for images on disk.

pub mod auth;
pub mod keychain;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};
use serde::Deserialize;

use self::auth::{Challenge, Credentials};
use self::keychain::{Keychain, Secret};
use super::digest::Digest;
use super::remote::{LazyClient, Ranges, Remote, describe};
use crate::error::{Error, Result};

/// Most redirects followed for one request.
pub const MAX_REDIRECTS: usize = 5;
/// Most ranges asked in one request.
const MAX_RANGES: usize = 32;
/// Largest token answer read.
const MAX_TOKEN_ANSWER: usize = 1 << 20;
/// Largest error body read (for its message).
const MAX_ERROR_BODY: usize = 64 << 10;
/// A token is renewed this long before the expiry its server gave.
const TOKEN_MARGIN: Duration = Duration::from_secs(10);

/// The media types asked for in `Accept` when a manifest is fetched.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// How long a start is recorded by default: python's takes under a second, a JVM's
/// service some seconds; what is read later is fetched by the background fetch.
pub const DEFAULT_START_WINDOW: Duration = Duration::from_secs(30);

/// Registry settings, from the command line (skopeo's and podman's flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// `--creds USER[:PASS]`: used for every registry, before any auth file.
    pub creds: Option<String>,
    /// `--authfile FILE`: the one auth file read (otherwise `$REGISTRY_AUTH_FILE`, then
    /// the default places, see [`auth::auth_files`]).
    pub auth_file: Option<PathBuf>,
    /// `--tls-verify=false`: certificates unverified, and plain HTTP allowed.
    pub tls_verify: bool,
    /// `--cert-dir DIR`: CA certificates (`*.crt`) and a client key pair (`*.cert`,
    /// `*.key`) for every registry, instead of `/etc/containers/certs.d/HOST:PORT/`.
    pub cert_dir: Option<PathBuf>,
    /// Fetch the rest of a lazily read layer (a table of contents, a zTOC) in the
    /// background once it is mounted (`--no-background-fetch`: only what is read).
    pub background_fetch: bool,
    /// How long after a lazily read layer opens its reads are recorded as its image's
    /// start, to be fetched ahead of the next start (`io::starts`; `--start-window`,
    /// zero: never).
    pub start_window: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            creds: None,
            auth_file: None,
            tls_verify: true,
            cert_dir: None,
            background_fetch: true,
            start_window: DEFAULT_START_WINDOW,
        }
    }
}

/// An image in a registry, as `docker://` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry as named (`docker.io`, `127.0.0.1:5000`): the key of credentials
    /// and certificate directories.
    pub host: String,
    /// The repository (`library/debian`).
    pub repo: String,
    /// The tag (`latest` when neither tag nor digest is given).
    pub tag: Option<String>,
    /// The digest, when pinned by one.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parse what follows `docker://`.
    pub fn parse(s: &str) -> Result<Reference> {
        let bad = |why: &str| Error::Format(format!("docker://{s}: {why}"));
        if s.is_empty() || s.len() > 4096 {
            return Err(bad("not an image reference"));
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(Digest::parse(d).map_err(|e| bad(&e.to_string()))?)),
            None => (s, None),
        };
        // A tag is after the last ':' that follows the last '/' (a port comes before).
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
            None => (name, None),
        };
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(bad(&format!("{t:?} is not a valid tag")));
        }
        let (host, repo) = match name.split_once('/') {
            Some((h, r)) if h.contains('.') || h.contains(':') || h == "localhost" => {
                (h.to_string(), r.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let host = if host == "index.docker.io" {
            "docker.io".to_string()
        } else {
            host
        };
        let repo = if host == "docker.io" && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        if !valid_repo(&repo) {
            return Err(bad(&format!(
                "{repo:?} is not a valid repository name (lower case letters, digits, \
                 separators . _ - and /)"
            )));
        }
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(bad(&format!("{host:?} is not a host name")));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            host,
            repo,
            tag,
            digest,
        })
    }

    /// What a manifest is fetched by: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "docker://{}/{}", self.host, self.repo)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"_.-".contains(&c))
}

fn valid_repo(r: &str) -> bool {
    r.len() <= 255
        && r.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        })
}

/// The registries of a process, one client each, made on first use.
#[derive(Debug)]
pub struct Registries {
    remote: Arc<Remote>,
    config: RegistryConfig,
    hosts: Mutex<HashMap<String, Arc<Registry>>>,
    /// Secrets handed over at run time, per repository (empty unless something feeds
    /// it: `pkgfs store --cri-image-proxy`).
    keychain: Arc<Keychain>,
}

impl Registries {
    /// Registries reached through `remote`'s runtime, with `config`.
    pub fn new(remote: Arc<Remote>, config: RegistryConfig) -> Registries {
        Registries {
            remote,
            config,
            hosts: Mutex::default(),
            keychain: Arc::default(),
        }
    }

    /// The secrets every host's client tries first for their repositories.
    pub fn keychain(&self) -> &Arc<Keychain> {
        &self.keychain
    }

    /// The client of `host` (made, with its certificates and credentials, on first use).
    pub fn get(&self, host: &str) -> Result<Arc<Registry>> {
        let mut hosts = crate::sync::lock(&self.hosts);
        if let Some(r) = hosts.get(host) {
            return Ok(r.clone());
        }
        let mut r = Registry::new(host, &self.config, self.remote.clone())?;
        r.keychain = Some(self.keychain.clone());
        let r = Arc::new(r);
        hosts.insert(host.to_string(), r.clone());
        Ok(r)
    }

    /// The runtime requests run on.
    pub fn remote(&self) -> &Arc<Remote> {
        &self.remote
    }
}

/// A token for one scope, and when to stop using it.
#[derive(Debug, Clone)]
struct Token {
    value: String,
    until: Instant,
}

/// What a registry client learns as it goes.
#[derive(Debug, Default)]
struct State {
    /// `https://HOST` or `http://HOST`, once pinged.
    base: Option<String>,
    /// `base` is plain HTTP as an earlier process found it (`plain_http_hint`), not
    /// yet confirmed by this one: a connection refused then probes again.
    remembered: bool,
    /// The challenge of the last 401 (`None`: anonymous access so far).
    challenge: Option<Challenge>,
    /// Bearer tokens by scope.
    tokens: HashMap<String, Token>,
    /// Where each blob was redirected to (digest → URL).
    locations: HashMap<String, reqwest::Url>,
}

/// One registry host.
#[derive(Debug)]
pub struct Registry {
    /// As named (`docker.io`, `127.0.0.1:5000`).
    host: String,
    /// Where this host is remembered to speak plain HTTP (with `--tls-verify=false`
    /// and a disk cache), so that the next process does not try HTTPS first.
    hint: Option<PathBuf>,
    /// Where its API answers (`registry-1.docker.io` for `docker.io`).
    api_host: String,
    /// The HTTPS client.
    client: LazyClient,
    /// The plain HTTP client (no TLS roots loaded).
    plain: LazyClient,
    remote: Arc<Remote>,
    creds: Option<Credentials>,
    /// Secrets per repository, tried before `creds` ([`Registries::keychain`]).
    keychain: Option<Arc<Keychain>>,
    insecure: bool,
    background_fetch: bool,
    start_window: Duration,
    state: Mutex<State>,
    /// Whether several ranges go in one request: 0 not known yet, 1 yes, 2 no (the
    /// server answered such a request otherwise than with a 206).
    multi: std::sync::atomic::AtomicU8,
}

/// A registry's error body: `{"errors": [{"code", "message"}]}`.
#[derive(Deserialize, Debug, Default)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<ErrorItem>,
}

#[derive(Deserialize, Debug)]
struct ErrorItem {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// A token server's answer.
#[derive(Deserialize, Debug)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// A fetched manifest (or index).
#[derive(Debug)]
pub struct Manifest {
    /// Its bytes, at most the limit asked.
    pub bytes: Vec<u8>,
    /// `Content-Type`.
    pub media_type: String,
    /// `Docker-Content-Digest`, if the registry sent it.
    pub digest: Option<String>,
}

/// Where `host` is remembered to speak plain HTTP: a file named after it in the disk
/// cache's directory (`plain-http/HOST`), if there is a disk cache.
fn plain_http_hint(remote: &Remote, host: &str) -> Option<PathBuf> {
    let name: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".:-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(remote.disk.as_ref()?.dir().join("plain-http").join(name))
}

fn not_found(msg: String) -> Error {
    Error::Io(std::io::Error::new(std::io::ErrorKind::NotFound, msg))
}

fn io_error(msg: String) -> Error {
    Error::Io(std::io::Error::other(msg))
}

impl Registry {
    fn new(host: &str, config: &RegistryConfig, remote: Arc<Remote>) -> Result<Registry> {
        let api_host = if host == "docker.io" {
            "registry-1.docker.io".to_string()
        } else {
            host.to_string()
        };
        let certs = match &config.cert_dir {
            Some(d) => Some(d.clone()),
            None => ["/etc/containers/certs.d", "/etc/docker/certs.d"]
                .iter()
                .map(|d| PathBuf::from(d).join(host))
                .find(|d| d.is_dir()),
        };
        // Made on first use: a warm mount pinned by digest sends no request.
        let (connect, timeout) = (
            remote.config.connect_timeout,
            remote.config.read_timeout / 3,
        );
        let (who, insecure) = (host.to_string(), !config.tls_verify);
        // Two clients, each made on first use: one for HTTPS, with the system's roots
        // and the host's certificates, and one for plain HTTP, which needs neither:
        // loading the roots reads every file of /etc/ssl/certs (45 ms from a cold page
        // cache here), which a mount of a registry remembered to speak plain HTTP would
        // otherwise wait for before its first request.
        let make = move |tls: bool| {
            let mut b = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(connect)
                .timeout(timeout)
                .user_agent(concat!("pkgfs/", env!("CARGO_PKG_VERSION")));
            if !tls {
                b = b.tls_built_in_root_certs(false);
            } else {
                if insecure {
                    b = b.danger_accept_invalid_certs(true);
                }
                if let Some(dir) = &certs {
                    b = auth::add_certificates(b, dir).map_err(|e| e.to_string())?;
                }
            }
            b.build()
                .map_err(|e| format!("HTTP client for {who}: {}", describe(&e)))
        };
        let make = Arc::new(make);
        let m = make.clone();
        let client = LazyClient::new(move || m(true));
        let plain = LazyClient::new(move || make(false));
        let creds = auth::credentials(host, config)?;
        let mut state = State::default();
        let hint = insecure.then(|| plain_http_hint(&remote, host)).flatten();
        if hint.as_ref().is_some_and(|h| h.exists()) {
            state.base = Some(format!("http://{api_host}"));
            state.remembered = true;
        }
        Ok(Registry {
            host: host.to_string(),
            hint,
            api_host,
            client,
            plain,
            remote,
            creds,
            keychain: None,
            insecure: !config.tls_verify,
            background_fetch: config.background_fetch,
            start_window: config.start_window,
            state: Mutex::new(state),
            multi: Default::default(),
        })
    }

    /// The HTTP client for `url` (made on first use): the plain one for `http:`.
    fn http(&self, url: &str) -> Result<&reqwest::Client> {
        match url.starts_with("http:") {
            true => &self.plain,
            false => &self.client,
        }
        .get()
        .map_err(|e| io_error(format!("registry {}: {e}", self.host)))
    }

    /// Whether lazily read layers are fetched whole in the background.
    pub fn background_fetch(&self) -> bool {
        self.background_fetch
    }

    /// How long a lazily read layer's start is recorded (zero: never).
    pub fn start_window(&self) -> Duration {
        self.start_window
    }

    /// The host as named.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The runtime requests run on.
    pub fn remote(&self) -> &Arc<Remote> {
        &self.remote
    }

    fn count(&self) {
        self.remote
            .stats
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn count_failure(&self) {
        self.remote
            .stats
            .failed_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `Authorization` header for requests about `repo`, fetching a token if the
    /// registry wants one and none is held.
    async fn authorization(&self, repo: &str) -> Result<Option<String>> {
        // A secret handed over for this repository comes before the node's.
        let secret = self.keychain.as_ref().and_then(|k| k.get(&self.host, repo));
        let creds = match secret {
            Some(Secret::Bearer(t)) => return Ok(Some(format!("Bearer {t}"))),
            Some(Secret::Basic(c)) => Some(c),
            None => self.creds.clone(),
        };
        let challenge = crate::sync::lock(&self.state).challenge.clone();
        match challenge {
            None => Ok(None),
            Some(Challenge::Basic { .. }) => match &creds {
                Some(c) => Ok(Some(c.basic())),
                None => Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "registry {} asks for a user name and password: give --creds \
                         USER:PASS, or log in with podman login / skopeo login",
                        self.host
                    ),
                ))),
            },
            Some(Challenge::Bearer { realm, service, .. }) => {
                let scope = format!("repository:{repo}:pull");
                if let Some(t) = crate::sync::lock(&self.state).tokens.get(&scope)
                    && t.until > Instant::now()
                {
                    return Ok(Some(format!("Bearer {}", t.value)));
                }
                let token = self
                    .token(&realm, service.as_deref(), &scope, creds.as_ref())
                    .await?;
                let value = format!("Bearer {}", token.value);
                crate::sync::lock(&self.state).tokens.insert(scope, token);
                Ok(Some(value))
            }
        }
    }

    /// A token for `scope` from the token server at `realm`.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        creds: Option<&Credentials>,
    ) -> Result<Token> {
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            Error::Format(format!(
                "registry {}: token realm {realm:?} is not a URL: {e}",
                self.host
            ))
        })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            q.append_pair("scope", scope);
        }
        if url.scheme() != "https" && !self.insecure {
            return Err(Error::Format(format!(
                "registry {}: token realm {realm} is not HTTPS (allowed with --tls-verify=false)",
                self.host
            )));
        }
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        let r = loop {
            let mut req = self.http(url.as_str())?.get(url.clone());
            if let Some(c) = creds {
                req = req.header(header::AUTHORIZATION, c.basic());
            }
            self.count();
            match req.send().await {
                Ok(r) if !r.status().is_server_error() => break r,
                Ok(r) if attempt >= self.remote.config.retries => {
                    return Err(io_error(format!(
                        "token server {realm} answers {}",
                        r.status()
                    )));
                }
                Err(e) if attempt >= self.remote.config.retries || !transient(&e) => {
                    return Err(io_error(format!("token server {realm}: {}", describe(&e))));
                }
                _ => {
                    self.count_failure();
                    attempt += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        };
        let status = r.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                match creds {
                    Some(c) => format!(
                        "registry {}: the token server refused user {:?} ({status}): wrong \
                         user name or password?",
                        self.host, c.user
                    ),
                    None => format!(
                        "registry {}: the token server refused anonymous access ({status}): \
                         give --creds USER:PASS or log in",
                        self.host
                    ),
                },
            )));
        }
        if !status.is_success() {
            return Err(io_error(format!("token server {realm} answers {status}")));
        }
        let body = read_limited(r, MAX_TOKEN_ANSWER, realm).await?;
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| Error::Format(format!("token server {realm}: not a token answer: {e}")))?;
        let value = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::Format(format!("token server {realm}: no token in its answer"))
            })?;
        // The distribution spec: 60 s when the server says nothing.
        let life = Duration::from_secs(answer.expires_in.unwrap_or(60).max(1));
        Ok(Token {
            value,
            until: Instant::now()
                + life
                    .saturating_sub(TOKEN_MARGIN)
                    .max(Duration::from_secs(1)),
        })
    }

    /// Send a request about `repo` to the registry (path after the base), with
    /// authorization; retried on transient failures, 429/503 after `Retry-After`, once
    /// more with a new token on a 401.
    async fn send(
        &self,
        repo: &str,
        path: &str,
        headers: HeaderMap,
        head: bool,
    ) -> Result<reqwest::Response> {
        // The first request finds the scheme (HTTPS; plain HTTP when allowed and HTTPS
        // cannot be spoken) and, by its 401, the challenge: no ping of /v2/ first, one
        // round trip less before a mount.
        let (known, mut remembered) = {
            let st = crate::sync::lock(&self.state);
            (st.base.clone(), st.remembered)
        };
        let (mut base, mut probing) = match known {
            Some(b) => (b, false),
            None => (format!("https://{}", self.api_host), true),
        };
        let mut renewed = false;
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            let url = format!("{base}{path}");
            let auth = self.authorization(repo).await?;
            let mut req = if head {
                self.http(&url)?.head(&url)
            } else {
                self.http(&url)?.get(&url)
            }
            .headers(headers.clone());
            if let Some(a) = auth {
                req = req.header(header::AUTHORIZATION, a);
            }
            self.count();
            let t0 = std::time::Instant::now();
            let sent = req.send().await;
            log::trace!(
                "{} {url} {:?}: {} in {:?}",
                if head { "HEAD" } else { "GET" },
                headers.get(header::RANGE),
                sent.as_ref().map_or(0, |r| r.status().as_u16()),
                t0.elapsed()
            );
            if remembered {
                remembered = false;
                // Plain HTTP no more (a registry given TLS since: refused, or Go's
                // "400 Client sent an HTTP request to an HTTPS server"): ask again.
                let gone = match &sent {
                    Ok(r) => r.status() == StatusCode::BAD_REQUEST,
                    Err(e) => !e.is_timeout(),
                };
                if !gone {
                    crate::sync::lock(&self.state).remembered = false;
                } else {
                    self.count_failure();
                    log::debug!("{}: plain HTTP no more", self.host);
                    if let Some(h) = &self.hint {
                        let _ = std::fs::remove_file(h);
                    }
                    let mut st = crate::sync::lock(&self.state);
                    (st.base, st.remembered) = (None, false);
                    drop(st);
                    base = format!("https://{}", self.api_host);
                    probing = true;
                    continue;
                }
            }
            if probing {
                match &sent {
                    Ok(_) => {
                        probing = false;
                        crate::sync::lock(&self.state).base = Some(base.clone());
                        if base.starts_with("http:")
                            && let Some(h) = &self.hint
                        {
                            // Best effort: without it the next process probes again.
                            let _ = h.parent().map(std::fs::create_dir_all);
                            let _ = std::fs::write(h, b"");
                        }
                    }
                    Err(e) if !e.is_timeout() && base.starts_with("https:") && self.insecure => {
                        self.count_failure();
                        log::debug!("{}: no HTTPS ({}); plain HTTP", self.host, describe(e));
                        base = format!("http://{}", self.api_host);
                        continue;
                    }
                    Err(e) if !e.is_timeout() => {
                        self.count_failure();
                        return Err(io_error(format!(
                            "registry {}: {}{}",
                            self.host,
                            describe(e),
                            if base.starts_with("https:")
                                && (self.host.contains(':') || self.host == "localhost")
                            {
                                " (a registry without TLS needs --tls-verify=false)"
                            } else {
                                ""
                            }
                        )));
                    }
                    Err(_) => {}
                }
            }
            let wait = match sent {
                Ok(r) if r.status() == StatusCode::UNAUTHORIZED && !renewed => {
                    // An expired token, or a scope the first challenge did not name.
                    renewed = true;
                    let fresh = r
                        .headers()
                        .get(header::WWW_AUTHENTICATE)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| Challenge::parse(v).ok());
                    let mut st = crate::sync::lock(&self.state);
                    st.tokens.clear();
                    if let Some(c) = fresh {
                        st.challenge = Some(c);
                    }
                    continue;
                }
                Ok(r)
                    if r.status() == StatusCode::TOO_MANY_REQUESTS
                        || r.status().is_server_error() =>
                {
                    self.count_failure();
                    if attempt >= self.remote.config.retries {
                        return Err(io_error(format!(
                            "{url} answers {} ({} attempts)",
                            r.status(),
                            attempt + 1
                        )));
                    }
                    match retry_after(r.headers()) {
                        Some(d) if d > self.remote.config.read_timeout => {
                            return Err(io_error(format!(
                                "{url} answers {} and asks to wait {} s, more than the \
                                 {} s a read may take",
                                r.status(),
                                d.as_secs(),
                                self.remote.config.read_timeout.as_secs()
                            )));
                        }
                        Some(d) => d,
                        None => backoff,
                    }
                }
                Ok(r) => return Ok(r),
                Err(e) if attempt < self.remote.config.retries && transient(&e) => {
                    self.count_failure();
                    backoff
                }
                Err(e) => return Err(io_error(format!("{url}: {}", describe(&e)))),
            };
            attempt += 1;
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// The error a failed answer stands for, with the registry's own message.
    async fn failure(&self, r: reqwest::Response, repo: &str, what: &str) -> Error {
        let status = r.status();
        let body = read_limited(r, MAX_ERROR_BODY, what)
            .await
            .unwrap_or_default();
        let errors: ErrorBody = serde_json::from_slice(&body).unwrap_or_default();
        let message = errors
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; ");
        let codes: Vec<&str> = errors.errors.iter().map(|e| e.code.as_str()).collect();
        let detail = if message.is_empty() {
            String::new()
        } else {
            format!(" ({message})")
        };
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{}/{repo}: access denied{detail}: wrong user name or password, or no \
                     right to pull this repository",
                    self.host
                ),
            )),
            StatusCode::NOT_FOUND if codes.contains(&"NAME_UNKNOWN") => {
                not_found(format!("{}/{repo}: no such repository{detail}", self.host))
            }
            StatusCode::NOT_FOUND => not_found(format!("{}/{repo}: no {what}{detail}", self.host)),
            s => io_error(format!("{}/{repo}: {what}: {s}{detail}", self.host)),
        }
    }

    /// The manifest (or index) `reference` (a tag or digest) of `repo`: at most `limit`
    /// bytes.
    pub async fn manifest(&self, repo: &str, reference: &str, limit: usize) -> Result<Manifest> {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            header::HeaderValue::from_static(MANIFEST_ACCEPT),
        );
        let what = format!("manifest {reference}");
        let r = self
            .send(repo, &format!("/v2/{repo}/manifests/{reference}"), h, false)
            .await?;
        if r.status() == StatusCode::NOT_FOUND && !reference.contains(':') {
            // Some registries (distribution 2.8) say MANIFEST_UNKNOWN of a repository
            // that does not exist: its tag list tells the two apart, and what there is.
            return Err(match self.tags(repo).await {
                Ok(Some(tags)) => not_found(format!(
                    "{}/{repo}: no image tagged {reference} (tags: {})",
                    self.host,
                    if tags.is_empty() {
                        "none".to_string()
                    } else if tags.len() > 20 {
                        format!("{}, … {} in all", tags[..20].join(", "), tags.len())
                    } else {
                        tags.join(", ")
                    }
                )),
                Ok(None) => not_found(format!("{}/{repo}: no such repository", self.host)),
                Err(_) => self.failure(r, repo, &what).await,
            });
        }
        if !r.status().is_success() {
            return Err(self.failure(r, repo, &what).await);
        }
        let media_type = r
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
            .unwrap_or_default();
        let digest = r
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if r.content_length().is_some_and(|n| n > limit as u64) {
            return Err(Error::Format(format!(
                "{}/{repo}: {what} has {} bytes: more than the {} MiB pkgfs reads",
                self.host,
                r.content_length().unwrap_or(0),
                limit >> 20
            )));
        }
        let bytes = read_limited(r, limit, &what).await.map_err(|e| match e {
            Error::Format(m) => Error::Format(format!("{}/{repo}: {m}", self.host)),
            e => e,
        })?;
        Ok(Manifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// The referrers of manifest `digest` of `repo` (OCI distribution 1.1), as an image
    /// index: from the referrers API (`/v2/REPO/referrers/DIGEST`, filtered by
    /// `artifact_type`), and from the referrers tag schema's fallback tag
    /// (`sha256-HEX`, what clients push where the registry has no referrers API, as
    /// distribution 2.8 has not), both asked at once. The API's answer if it lists any;
    /// else the tag's; `None` when neither has one.
    pub async fn referrers(
        &self,
        repo: &str,
        digest: &Digest,
        artifact_type: &str,
        limit: usize,
    ) -> Result<Option<Vec<u8>>> {
        let index = "application/vnd.oci.image.index.v1+json";
        let api_path = format!("/v2/{repo}/referrers/{digest}?artifactType={artifact_type}");
        let api = self.document(repo, &api_path, index, limit, "referrers");
        let tag_path = format!(
            "/v2/{repo}/manifests/{}-{}",
            digest.algorithm_name(),
            digest.hex()
        );
        let fallback = self.document(repo, &tag_path, index, limit, "referrers tag");
        let (api, fallback) = futures::join!(api, fallback);
        let lists_any = |b: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(b)
                .ok()
                .and_then(|v| v["manifests"].as_array().map(|m| !m.is_empty()))
                .unwrap_or(false)
        };
        match api {
            Ok(Some(b)) if lists_any(&b) => Ok(Some(b)),
            _ => fallback,
        }
    }

    /// A JSON document at `path` of at most `limit` bytes; `None` if the registry has
    /// none there (any 4xx but 401/403/429: an unknown route is a 404 or a 400).
    async fn document(
        &self,
        repo: &str,
        path: &str,
        accept: &'static str,
        limit: usize,
        what: &str,
    ) -> Result<Option<Vec<u8>>> {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, header::HeaderValue::from_static(accept));
        let r = self.send(repo, path, h, false).await?;
        let status = r.status();
        if status.is_client_error()
            && ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status)
        {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.failure(r, repo, what).await);
        }
        if r.content_length().is_some_and(|n| n > limit as u64) {
            return Err(Error::Format(format!(
                "{}/{repo}: {what} has more than {limit} bytes",
                self.host
            )));
        }
        Ok(Some(read_limited(r, limit, what).await?))
    }

    /// The tags of `repo` (`None`: no such repository).
    async fn tags(&self, repo: &str) -> Result<Option<Vec<String>>> {
        #[derive(Deserialize)]
        struct Tags {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let r = self
            .send(
                repo,
                &format!("/v2/{repo}/tags/list"),
                HeaderMap::new(),
                false,
            )
            .await?;
        if r.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !r.status().is_success() {
            return Err(self.failure(r, repo, "tag list").await);
        }
        let body = read_limited(r, MAX_TOKEN_ANSWER, "tag list").await?;
        let t: Tags = serde_json::from_slice(&body)
            .map_err(|e| Error::Format(format!("{}/{repo}: tag list: {e}", self.host)))?;
        let mut tags = t.tags.unwrap_or_default();
        tags.sort();
        Ok(Some(tags))
    }

    /// Bytes `start..end` of blob `digest` of `repo`.
    pub async fn blob_range(
        &self,
        repo: &str,
        digest: &str,
        start: u64,
        end: u64,
    ) -> Result<Bytes> {
        let what = format!("{}/{repo} blob {digest}", self.host);
        let known = crate::sync::lock(&self.state)
            .locations
            .get(digest)
            .cloned();
        if let Some(url) = known {
            match self.fetch_at(url, start, end, &what).await {
                Ok(b) => return Ok(b),
                // A signed URL that expired: ask the registry again.
                Err(Refused::Again) => {
                    crate::sync::lock(&self.state).locations.remove(digest);
                }
                Err(Refused::Error(e)) => return Err(e),
            }
        }
        // A fresh location refused too (storage whose signed URLs take a moment to be
        // valid everywhere, a CDN edge that has not seen the key yet): the registry is
        // asked again, a few times and a moment apart (STORAGE_PAUSE, doubled each
        // time), before the read fails.
        for ask in 1..=STORAGE_ASKS {
            if ask > 1 {
                tokio::time::sleep(STORAGE_PAUSE * (1 << (ask - 2))).await;
            }
            let mut h = HeaderMap::new();
            h.insert(header::RANGE, range_header(start, end));
            let r = self
                .send(repo, &format!("/v2/{repo}/blobs/{digest}"), h, false)
                .await?;
            if !r.status().is_redirection() {
                if !r.status().is_success() {
                    return Err(self.failure(r, repo, &format!("blob {digest}")).await);
                }
                return range_body(r, start, end, &what).await;
            }
            let to = location(&r, &what)?;
            crate::sync::lock(&self.state)
                .locations
                .insert(digest.to_string(), to.clone());
            match self.fetch_at(to, start, end, &what).await {
                Ok(b) => return Ok(b),
                Err(Refused::Again) if ask < STORAGE_ASKS => {
                    crate::sync::lock(&self.state).locations.remove(digest);
                }
                Err(Refused::Again) => break,
                Err(Refused::Error(e)) => return Err(e),
            }
        }
        Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{what}: the blob storage the registry sent us to refused the request \
                 ({STORAGE_ASKS} fresh locations)"
            ),
        )))
    }

    /// The ranges `ranges` (sorted, apart) of blob `digest`: several in one request
    /// (`multipart/byteranges`) where the server takes that, else one each.
    pub async fn blob_ranges(
        &self,
        repo: &str,
        digest: &str,
        ranges: &[(u64, u64)],
    ) -> Result<Vec<Bytes>> {
        use std::sync::atomic::Ordering::Relaxed;
        if ranges.len() < 2 || self.multi.load(Relaxed) == 2 {
            let jobs = ranges
                .iter()
                .map(|&(s, e)| self.blob_range(repo, digest, s, e));
            return futures::future::try_join_all(jobs).await;
        }
        let mut out = Vec::with_capacity(ranges.len());
        for group in ranges.chunks(MAX_RANGES) {
            match self.multi_range(repo, digest, group).await {
                Ok(Some(got)) => {
                    self.multi.store(1, Relaxed);
                    self.remote.stats.multi_range.fetch_add(1, Relaxed);
                    out.extend(got);
                }
                // Not answered as asked (or the connection dropped: some servers and
                // proxies do that to a multi-range request): one by one, which reports
                // any real failure itself.
                not => {
                    log::debug!(
                        "{}: no multi-range answer ({}); one range per request from now",
                        self.host,
                        match not {
                            Err(e) => e.to_string(),
                            _ => "another status than 206".into(),
                        }
                    );
                    self.multi.store(2, Relaxed);
                    let jobs = group
                        .iter()
                        .map(|&(s, e)| self.blob_range(repo, digest, s, e));
                    out.extend(futures::future::try_join_all(jobs).await?);
                }
            }
        }
        Ok(out)
    }

    /// One request for several ranges; `None` if the server does not answer them so.
    async fn multi_range(
        &self,
        repo: &str,
        digest: &str,
        ranges: &[(u64, u64)],
    ) -> Result<Option<Vec<Bytes>>> {
        let what = format!("{}/{repo} blob {digest}", self.host);
        let spec = ranges
            .iter()
            .map(|(s, e)| format!("{s}-{}", e - 1))
            .collect::<Vec<_>>()
            .join(",");
        let value = header::HeaderValue::from_str(&format!("bytes={spec}"))
            .map_err(|e| Error::Format(format!("{what}: range header: {e}")))?;
        let mut url = crate::sync::lock(&self.state)
            .locations
            .get(digest)
            .cloned();
        let mut r = match &url {
            Some(u) => {
                self.count();
                self.http(u.as_str())?
                    .get(u.clone())
                    .header(header::RANGE, value.clone())
                    .send()
                    .await
                    .map_err(|e| io_error(format!("{what}: {}", describe(&e))))?
            }
            None => {
                let mut h = HeaderMap::new();
                h.insert(header::RANGE, value.clone());
                self.send(repo, &format!("/v2/{repo}/blobs/{digest}"), h, false)
                    .await?
            }
        };
        for _ in 0..MAX_REDIRECTS {
            if !r.status().is_redirection() {
                break;
            }
            let to = location(&r, &what)?;
            if url.is_none() {
                crate::sync::lock(&self.state)
                    .locations
                    .insert(digest.to_string(), to.clone());
            }
            url = Some(to.clone());
            self.count();
            r = self
                .http(to.as_str())?
                .get(to)
                .header(header::RANGE, value.clone())
                .send()
                .await
                .map_err(|e| io_error(format!("{what}: {}", describe(&e))))?;
        }
        if r.status() != StatusCode::PARTIAL_CONTENT {
            // The whole blob (200), a refusal (400, 416), an expired storage URL: not
            // this way; each range by itself says what is wrong, if anything is.
            return Ok(None);
        }
        let ctype = r
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let want: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        let boundary = ctype
            .split(';')
            .map(str::trim)
            .find_map(|p| p.strip_prefix("boundary="))
            .map(|b| b.trim_matches('"').to_string());
        let parts = match boundary {
            Some(b) if ctype.starts_with("multipart/byteranges") => {
                let limit = want as usize + 1024 * (ranges.len() + 1);
                let body = read_limited(r, limit, &what).await?;
                byteranges(&body, &b, &what)?
            }
            // One part: the server merged the ranges into one.
            _ => {
                let cr = r
                    .headers()
                    .get(header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range)
                    .ok_or_else(|| Error::Corrupt(format!("{what}: a 206 without a range")))?;
                let body = read_limited(r, (cr.1 - cr.0) as usize, &what).await?;
                vec![(cr.0, Bytes::from(body))]
            }
        };
        let mut out = Vec::with_capacity(ranges.len());
        for &(s, e) in ranges {
            let part = parts
                .iter()
                .find(|(ps, b)| *ps <= s && e <= ps + b.len() as u64)
                .ok_or_else(|| {
                    Error::Corrupt(format!(
                        "{what}: bytes {s}-{} missing from the answer",
                        e - 1
                    ))
                })?;
            let at = (s - part.0) as usize;
            out.push(part.1.slice(at..at + (e - s) as usize));
        }
        Ok(Some(out))
    }

    /// Bytes `start..end` from blob storage at `url` (no `Authorization`: it is another
    /// host's), following its own redirects.
    async fn fetch_at(
        &self,
        mut url: reqwest::Url,
        start: u64,
        end: u64,
        what: &str,
    ) -> std::result::Result<Bytes, Refused> {
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0;
        let mut hops = 0;
        loop {
            self.count();
            let t0 = std::time::Instant::now();
            let sent = self
                .http(url.as_str())
                .map_err(Refused::Error)?
                .get(url.clone())
                .header(header::RANGE, range_header(start, end))
                .send()
                .await;
            log::trace!("GET {url} {start}-{end}: in {:?}", t0.elapsed());
            let r = match sent {
                Ok(r) => r,
                Err(e) if attempt < self.remote.config.retries && transient(&e) => {
                    self.count_failure();
                    attempt += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
                Err(e) => {
                    return Err(Refused::Error(io_error(format!(
                        "{what}: {}",
                        describe(&e)
                    ))));
                }
            };
            let s = r.status();
            if s.is_redirection() {
                hops += 1;
                if hops > MAX_REDIRECTS {
                    return Err(Refused::Error(Error::Format(format!(
                        "{what}: more than {MAX_REDIRECTS} redirects"
                    ))));
                }
                url = location(&r, what).map_err(Refused::Error)?;
                continue;
            }
            if s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN {
                return Err(Refused::Again);
            }
            if s.is_server_error() && attempt < self.remote.config.retries {
                self.count_failure();
                attempt += 1;
                tokio::time::sleep(retry_after(r.headers()).unwrap_or(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
            if !s.is_success() {
                return Err(Refused::Error(io_error(format!(
                    "{what}: {url} answers {s}"
                ))));
            }
            return range_body(r, start, end, what)
                .await
                .map_err(Refused::Error);
        }
    }

    /// Manifest `digest` of `repo` as a blob of `size` bytes, kept in the disk cache
    /// like any blob (a manifest named by digest never changes): a warm mount of an
    /// image needs no request for it. Its bytes are the caller's to check.
    pub fn manifest_blob(
        self: &Arc<Self>,
        repo: &str,
        digest: &Digest,
        size: u64,
    ) -> Arc<dyn super::blob::Blob> {
        let version = manifest_version(digest);
        Arc::new(super::remote::RemoteBlob::of(
            format!("{}/{repo}@{digest} (manifest)", self.host),
            Arc::new(ManifestRanges {
                registry: self.clone(),
                repo: repo.to_string(),
                digest: digest.to_string(),
            }),
            size,
            version,
            0,
            self.remote.clone(),
        ))
    }

    /// Keep manifest `digest` (fetched by tag, its bytes checked) in the disk cache, for
    /// a later mount by digest.
    pub fn keep_manifest(&self, digest: &Digest, bytes: &[u8]) {
        if let Some(disk) = &self.remote.disk {
            let key = super::diskcache::DiskCache::key(&manifest_version(digest));
            if let Err(e) = disk.store(&key, 0, bytes) {
                log::warn!("disk cache: keeping manifest {digest}: {e}");
            }
        }
    }

    /// The size of manifest `digest` if the disk cache holds it whole.
    pub fn cached_manifest_size(&self, digest: &Digest) -> Option<u64> {
        let disk = self.remote.disk.as_ref()?;
        disk.head_len(&super::diskcache::DiskCache::key(&manifest_version(digest)))
    }

    /// The layers' ranges source: blob `digest` of `repo`.
    pub fn blob(self: &Arc<Self>, repo: &str, digest: &Digest) -> Arc<dyn Ranges> {
        Arc::new(BlobRanges {
            registry: self.clone(),
            repo: repo.to_string(),
            digest: digest.to_string(),
        })
    }

    /// Run `f` on the runtime, bounded as every remote read is.
    pub fn run<T>(&self, what: &str, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.remote.run(what, f)
    }
}

/// How many times a read asks the registry for a blob's location when the storage it
/// is sent to refuses it (401/403).
const STORAGE_ASKS: u32 = 4;

/// The pause before the second ask for a fresh location, doubled before each next one
/// (50, 100, 200 ms): storage whose new URLs take a moment to be valid gets the moment.
const STORAGE_PAUSE: Duration = Duration::from_millis(50);

/// Why blob storage did not give the bytes.
enum Refused {
    /// 401/403: the redirect is stale, ask the registry for a new one.
    Again,
    Error(Error),
}

/// `bytes A-B/TOTAL` as `(A, B + 1)`.
fn content_range(v: &str) -> Option<(u64, u64)> {
    let (range, _) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b) = (a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?);
    (a <= b).then_some((a, b + 1))
}

/// The parts of a `multipart/byteranges` body: (start, bytes) each, the length of each
/// part taken from its own `Content-Range` (a part's bytes may look like a boundary).
fn byteranges(body: &[u8], boundary: &str, what: &str) -> Result<Vec<(u64, Bytes)>> {
    let bad = |m: &str| Error::Corrupt(format!("{what}: multipart answer: {m}"));
    let delim = format!("--{boundary}");
    let find = |hay: &[u8], needle: &[u8], from: usize| -> Option<usize> {
        hay.get(from..)?
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|i| i + from)
    };
    let mut parts = Vec::new();
    let mut at = find(body, delim.as_bytes(), 0).ok_or_else(|| bad("no boundary"))?;
    loop {
        at += delim.len();
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        let head_end = find(body, b"\r\n\r\n", at).ok_or_else(|| bad("a part without headers"))?;
        let head = std::str::from_utf8(&body[at..head_end]).map_err(|_| bad("headers"))?;
        let range = head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-range"))
            .and_then(|(_, v)| content_range(v.trim()))
            .ok_or_else(|| bad("a part without a Content-Range"))?;
        let start = head_end + 4;
        let end = start
            .checked_add((range.1 - range.0) as usize)
            .filter(|&e| e <= body.len())
            .ok_or_else(|| bad("a part shorter than its range"))?;
        parts.push((range.0, Bytes::copy_from_slice(&body[start..end])));
        if parts.len() > MAX_RANGES {
            return Err(bad("more parts than ranges asked"));
        }
        at = find(body, delim.as_bytes(), end).ok_or_else(|| bad("no closing boundary"))?;
    }
}

fn range_header(start: u64, end: u64) -> header::HeaderValue {
    header::HeaderValue::from_str(&format!("bytes={start}-{}", end - 1))
        .unwrap_or(header::HeaderValue::from_static("bytes=0-"))
}

/// The `Location` of a redirect, resolved against the request's URL.
fn location(r: &reqwest::Response, what: &str) -> Result<reqwest::Url> {
    let loc = r
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::Format(format!("{what}: a redirect without a Location")))?;
    r.url()
        .join(loc)
        .map_err(|e| Error::Format(format!("{what}: redirect to {loc:?}: {e}")))
}

/// `Retry-After` in seconds, if given so.
fn retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Whether a failed request is worth trying again.
fn transient(e: &reqwest::Error) -> bool {
    e.is_timeout() || e.is_connect() || e.is_request() || e.is_body()
}

/// The body of `r`, failing past `limit` bytes.
async fn read_limited(mut r: reqwest::Response, limit: usize, what: &str) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| io_error(format!("{what}: {}", describe(&e))))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > limit {
            return Err(Error::Format(format!(
                "{what}: more than {limit} bytes in the answer"
            )));
        }
    }
    Ok(body)
}

/// The bytes `start..end` of an answer to a range request: a `206` must be that range
/// (`Content-Range`); a `200` is the whole blob, read to `end` and cut.
async fn range_body(mut r: reqwest::Response, start: u64, end: u64, what: &str) -> Result<Bytes> {
    let want = (end - start) as usize;
    let skip = match r.status() {
        StatusCode::PARTIAL_CONTENT => {
            let cr = r
                .headers()
                .get(header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let ok = cr
                .strip_prefix("bytes ")
                .and_then(|v| v.split_once('/'))
                .and_then(|(range, _)| range.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                .is_some_and(|(a, b)| a == start && b + 1 == end);
            if !ok {
                return Err(Error::Corrupt(format!(
                    "{what}: asked for bytes {start}-{}, got {cr:?}",
                    end - 1
                )));
            }
            0
        }
        StatusCode::OK => start as usize,
        s => return Err(io_error(format!("{what}: answer {s} to a range request"))),
    };
    let mut out = Vec::with_capacity(want);
    let mut seen = 0usize;
    while out.len() < want {
        let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| io_error(format!("{what}: {}", describe(&e))))?
        else {
            break;
        };
        let from = skip.saturating_sub(seen).min(chunk.len());
        seen += chunk.len();
        let take = (chunk.len() - from).min(want - out.len());
        out.extend_from_slice(&chunk[from..from + take]);
    }
    if out.len() != want {
        return Err(Error::Corrupt(format!(
            "{what}: the answer ended after {} of {want} bytes",
            out.len()
        )));
    }
    Ok(Bytes::from(out))
}

/// The disk cache's name for manifest `digest`.
fn manifest_version(digest: &Digest) -> String {
    format!("oci-manifest\0{digest}")
}

/// A manifest by digest, as a [`Ranges`] source: fetched whole, cut to the range.
#[derive(Debug)]
struct ManifestRanges {
    registry: Arc<Registry>,
    repo: String,
    digest: String,
}

impl Ranges for ManifestRanges {
    fn get(&self, start: u64, end: u64) -> futures::future::BoxFuture<'static, Result<Bytes>> {
        let (registry, repo, digest) = (
            self.registry.clone(),
            self.repo.clone(),
            self.digest.clone(),
        );
        Box::pin(async move {
            let m = registry.manifest(&repo, &digest, MANIFEST_LIMIT).await?;
            let b = Bytes::from(m.bytes);
            let (s, e) = (start as usize, end as usize);
            if e > b.len() || s > e {
                return Err(Error::Corrupt(format!(
                    "{}/{repo}: manifest {digest} has {} bytes, {end} wanted",
                    registry.host,
                    b.len()
                )));
            }
            Ok(b.slice(s..e))
        })
    }
}

/// Largest manifest fetched as a blob.
const MANIFEST_LIMIT: usize = 4 << 20;

/// A blob of a repository, as a [`Ranges`] source for a `RemoteBlob`.
#[derive(Debug)]
struct BlobRanges {
    registry: Arc<Registry>,
    repo: String,
    digest: String,
}

impl Ranges for BlobRanges {
    fn get(&self, start: u64, end: u64) -> futures::future::BoxFuture<'static, Result<Bytes>> {
        let (registry, repo, digest) = (
            self.registry.clone(),
            self.repo.clone(),
            self.digest.clone(),
        );
        Box::pin(async move { registry.blob_range(&repo, &digest, start, end).await })
    }

    fn get_many(
        &self,
        ranges: &[(u64, u64)],
    ) -> futures::future::BoxFuture<'static, Result<Vec<Bytes>>> {
        let (registry, repo, digest) = (
            self.registry.clone(),
            self.repo.clone(),
            self.digest.clone(),
        );
        let ranges = ranges.to_vec();
        Box::pin(async move { registry.blob_ranges(&repo, &digest, &ranges).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_skopeo_names_them() {
        let r = Reference::parse("127.0.0.1:5000/pkgfs/debian:v1").unwrap();
        assert_eq!(
            (r.host.as_str(), r.repo.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "pkgfs/debian", Some("v1"))
        );
        assert_eq!(r.to_string(), "docker://127.0.0.1:5000/pkgfs/debian:v1");
        let r = Reference::parse("debian").unwrap();
        assert_eq!(
            (r.host.as_str(), r.repo.as_str()),
            ("docker.io", "library/debian")
        );
        assert_eq!(r.tag.as_deref(), Some("latest"));
        let r = Reference::parse("quay.io/a/b/c").unwrap();
        assert_eq!((r.host.as_str(), r.repo.as_str()), ("quay.io", "a/b/c"));
        let r = Reference::parse("user/app:1.0").unwrap();
        assert_eq!(
            (r.host.as_str(), r.repo.as_str()),
            ("docker.io", "user/app")
        );
        let r = Reference::parse("localhost/app").unwrap();
        assert_eq!(r.host, "localhost");
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = Reference::parse(&format!("localhost:5000/app@{d}")).unwrap();
        assert_eq!(
            (r.tag.as_deref(), r.manifest_reference()),
            (None, d.clone())
        );
        let r = Reference::parse(&format!("localhost:5000/app:v2@{d}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.manifest_reference(), d, "a digest wins over a tag");
        for bad in [
            "",
            "Host/UPPER",
            "localhost:5000/a/../b",
            "localhost:5000/a:bad/tag",
            "localhost:5000/a:",
            "localhost:5000/a@sha256:12",
            "localhost:5000//a",
            "localhost:5000/a:-x",
            "local\u{0}host:5000/a",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn multipart_byteranges_parse_by_their_own_lengths() {
        let body = b"\r\n--XyZ\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 0-3/100\r\n\r\nab\r\n\r\n--XyZ\r\ncontent-range: bytes 50-52/100\r\n\r\n--X\r\n--XyZ--\r\n";
        let parts = byteranges(body, "XyZ", "t").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].0, &parts[0].1[..]), (0, &b"ab\r\n"[..]));
        assert_eq!(
            (parts[1].0, &parts[1].1[..]),
            (50, &b"--X"[..]),
            "a part that looks like a boundary"
        );
        for bad in [
            &b"no boundary at all"[..],
            b"--XyZ\r\nContent-Range: bytes 0-99/100\r\n\r\nshort",
            b"--XyZ\r\nContent-Type: x\r\n\r\nab\r\n--XyZ--",
            b"--XyZ\r\nContent-Range: bytes 0-1/100\r\n\r\nab",
        ] {
            assert!(
                byteranges(bad, "XyZ", "t").is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(content_range("bytes 5-9/10"), Some((5, 10)));
        assert_eq!(content_range("bytes 9-5/10"), None);
        assert_eq!(content_range("bytes */10"), None);
    }

    #[test]
    fn retry_after_takes_seconds() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, header::HeaderValue::from_static(" 3 "));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            header::RETRY_AFTER,
            header::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None, "a date: the backoff instead");
    }
}
