//! Who we are to a registry, and whom we trust: credentials as podman, skopeo and docker
//! keep them, the `WWW-Authenticate` challenge, and certificate directories.
//!
//! Credentials, the first found:
//! 1. `--creds USER:PASS`;
//! 2. `--authfile FILE`, else `$REGISTRY_AUTH_FILE`, else each of
//!    `$XDG_RUNTIME_DIR/containers/auth.json` (`/run/containers/UID/auth.json` without
//!    it), `~/.config/containers/auth.json`, `~/.docker/config.json`: the entry of the
//!    most specific key that matches (`HOST/REPO/…` prefixes are podman's; a key may be
//!    a URL, `https://index.docker.io/v1/` for docker.io), its `auth` field
//!    (base64 of `USER:PASS`). Credential helpers (`credHelpers`, `credsStore`) are not
//!    run: a file that names one for the host is reported, and anonymous access tried.
//!
//! Certificates (podman's `certs.d` layout): in `--cert-dir DIR`, or
//! `/etc/containers/certs.d/HOST:PORT/` (then `/etc/docker/certs.d/`), every `*.crt` is a
//! CA trusted besides the system's roots, and `NAME.cert` with `NAME.key` is the client
//! certificate presented.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::RegistryConfig;
use crate::error::{Error, Result};

/// Largest auth file read.
const MAX_AUTH_FILE: u64 = 4 << 20;

/// A user name and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    pass: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({:?}, <hidden>)", self.user)
    }
}

impl Credentials {
    /// `USER:PASS` (the password may contain colons).
    pub fn parse(s: &str) -> Option<Credentials> {
        let (user, pass) = s.split_once(':')?;
        (!user.is_empty()).then(|| Credentials {
            user: user.to_string(),
            pass: pass.to_string(),
        })
    }

    /// A user name and password, as they are (the user name must not be empty).
    pub fn new(user: &str, pass: &str) -> Option<Credentials> {
        (!user.is_empty()).then(|| Credentials {
            user: user.to_string(),
            pass: pass.to_string(),
        })
    }

    /// The password (to hand it to the keeper; never to be logged).
    pub fn password(&self) -> &str {
        &self.pass
    }

    /// The `Authorization` value for `Basic`.
    pub fn basic(&self) -> String {
        let b = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.user, self.pass));
        format!("Basic {b}")
    }
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm=…`.
    Basic {
        /// The realm, as given.
        realm: Option<String>,
    },
    /// `Bearer realm=…,service=…[,scope=…]`: a token from the realm.
    Bearer {
        /// The token server.
        realm: String,
        /// The service asked for.
        service: Option<String>,
        /// The scope named, if any.
        scope: Option<String>,
    },
}

impl Challenge {
    /// Parse one challenge (`SCHEME k="v", k=v…`).
    pub fn parse(s: &str) -> std::result::Result<Challenge, String> {
        let s = s.trim();
        let (scheme, rest) = s.split_once(' ').unwrap_or((s, ""));
        let params = params(rest);
        let get = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        };
        if scheme.eq_ignore_ascii_case("basic") {
            Ok(Challenge::Basic {
                realm: get("realm"),
            })
        } else if scheme.eq_ignore_ascii_case("bearer") {
            Ok(Challenge::Bearer {
                realm: get("realm")
                    .ok_or_else(|| format!("a Bearer challenge without a realm: {s:?}"))?,
                service: get("service"),
                scope: get("scope"),
            })
        } else {
            Err(format!(
                "an authentication scheme pkgfs does not speak: {s:?}"
            ))
        }
    }
}

/// `k="v", k=v` pairs (quoted strings with backslash escapes).
fn params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            name.push(c);
            chars.next();
        }
        if name.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
    out
}

/// An auth file (`auth.json`, docker's `config.json`): the parts read.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Deserialize, Debug, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
}

/// The auth files looked at, in order.
pub fn auth_files(config: &RegistryConfig) -> Vec<PathBuf> {
    if let Some(f) = &config.auth_file {
        return vec![f.clone()];
    }
    if let Some(f) = std::env::var_os("REGISTRY_AUTH_FILE").filter(|f| !f.is_empty()) {
        return vec![PathBuf::from(f)];
    }
    let mut out = Vec::new();
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => out.push(PathBuf::from(d).join("containers/auth.json")),
        // SAFETY: getuid cannot fail.
        None => out.push(PathBuf::from(format!(
            "/run/containers/{}/auth.json",
            unsafe { libc::getuid() }
        ))),
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let home = PathBuf::from(home);
        out.push(home.join(".config/containers/auth.json"));
        out.push(home.join(".docker/config.json"));
    }
    out
}

/// The credentials for `host`: `--creds`, else the first auth file with an entry.
pub fn credentials(host: &str, config: &RegistryConfig) -> Result<Option<Credentials>> {
    if let Some(c) = &config.creds {
        return Credentials::parse(c)
            .map(Some)
            .ok_or_else(|| Error::Format("--creds wants USER:PASSWORD".into()));
    }
    for file in auth_files(config) {
        match lookup(&file, host) {
            Ok(Some(c)) => {
                log::debug!(
                    "{host}: credentials of {:?} from {}",
                    c.user,
                    file.display()
                );
                return Ok(Some(c));
            }
            Ok(None) => {}
            Err(e) if config.auth_file.is_some() => return Err(e),
            Err(e) => log::warn!("{e}"),
        }
    }
    Ok(None)
}

/// The entry for `host` in auth file `file` (a missing file: none).
fn lookup(file: &Path, host: &str) -> Result<Option<Credentials>> {
    let bytes = match std::fs::metadata(file) {
        Ok(m) if m.len() > MAX_AUTH_FILE => {
            return Err(Error::Format(format!(
                "auth file {}: {} bytes, more than pkgfs reads",
                file.display(),
                m.len()
            )));
        }
        Ok(_) => std::fs::read(file).map_err(|e| Error::Io(e).with_path(file))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Io(e).with_path(file)),
    };
    let parsed: AuthFile = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Format(format!("auth file {}: {e}", file.display())))?;
    lookup_in(&parsed, host, file)
}

fn lookup_in(f: &AuthFile, host: &str, file: &Path) -> Result<Option<Credentials>> {
    // The most specific key: podman's HOST/NAMESPACE/… keys are longer than HOST.
    let best = f
        .auths
        .iter()
        .filter_map(|(k, v)| {
            let key = normalise_key(k);
            (key == host || key.starts_with(&format!("{host}/"))).then_some((key, v))
        })
        // A HOST/REPO key cannot be checked here (the client serves every repository
        // of the host): the host's own key first, else the first namespaced one.
        .min_by_key(|(k, _)| (k != host, k.len()));
    if let Some((_, entry)) = best
        && let Some(auth) = &entry.auth
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| Credentials::parse(&s))
            .ok_or_else(|| {
                Error::Format(format!(
                    "auth file {}: the entry for {host} is not base64 of USER:PASSWORD",
                    file.display()
                ))
            })?;
        return Ok(Some(decoded));
    }
    if let Some(helper) = f.cred_helpers.get(host).or(f.creds_store.as_ref()) {
        log::warn!(
            "{}: credentials for {host} are kept by the helper docker-credential-{helper}, \
             which pkgfs does not run: give --creds, or an auth file with the entry",
            file.display()
        );
    }
    Ok(None)
}

/// An auth file key as a host (and path): scheme and docker's `/v1/` dropped.
fn normalise_key(k: &str) -> String {
    let k = k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
        .unwrap_or(k);
    let k = k.trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    match k {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        k => match k.split_once('/') {
            Some(("index.docker.io", rest)) => format!("docker.io/{rest}"),
            _ => k.to_string(),
        },
    }
}

/// Add the CA certificates and client key pair of a `certs.d` directory to `b`.
pub fn add_certificates(
    mut b: reqwest::ClientBuilder,
    dir: &Path,
) -> Result<reqwest::ClientBuilder> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Io(e).with_path(dir))?;
    let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    let read = |p: &Path| std::fs::read(p).map_err(|e| Error::Io(e).with_path(p));
    for p in &names {
        match p.extension().and_then(|e| e.to_str()) {
            Some("crt") => {
                let pem = read(p)?;
                for c in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    Error::Format(format!("{}: not a PEM certificate: {e}", p.display()))
                })? {
                    b = b.add_root_certificate(c);
                }
            }
            Some("cert") => {
                let key = p.with_extension("key");
                let mut pem = read(p)?;
                pem.push(b'\n');
                pem.extend(read(&key).map_err(|_| {
                    Error::Format(format!(
                        "{}: a client certificate without its key {}",
                        p.display(),
                        key.display()
                    ))
                })?);
                let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    Error::Format(format!("{}: not a client key pair: {e}", p.display()))
                })?;
                b = b.identity(id);
            }
            _ => {}
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            Ok(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Ok(Challenge::Basic {
                realm: Some("Registry Realm".into())
            })
        );
        assert_eq!(
            Challenge::parse(r#"bearer realm=http://x/t, service="a\"b""#),
            Ok(Challenge::Bearer {
                realm: "http://x/t".into(),
                service: Some("a\"b".into()),
                scope: None,
            })
        );
        assert!(Challenge::parse("Bearer service=x").is_err());
        assert!(Challenge::parse("Negotiate").is_err());
    }

    #[test]
    fn auth_files_are_read_as_podman_and_docker_write_them() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let file: AuthFile = serde_json::from_str(&format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "127.0.0.1:5000": {{"auth": "{}"}},
                "127.0.0.1:5000/team": {{"auth": "{}"}},
                "quay.io/org": {{"auth": "{}"}},
                "bad.example": {{"auth": "%%%"}}
            }}, "credHelpers": {{"gcr.io": "gcloud"}}}}"#,
            enc("hub:pw"),
            enc("host:p:w"),
            enc("team:x"),
            enc("org:y")
        ))
        .unwrap();
        let f = Path::new("auth.json");
        let user = |h: &str| lookup_in(&file, h, f).unwrap().map(|c| (c.user, c.pass));
        assert_eq!(user("docker.io"), Some(("hub".into(), "pw".into())));
        assert_eq!(
            user("127.0.0.1:5000"),
            Some(("host".into(), "p:w".into())),
            "the host's own key, a password with a colon"
        );
        assert_eq!(user("quay.io"), Some(("org".into(), "y".into())));
        assert_eq!(user("gcr.io"), None, "a helper is not run");
        assert_eq!(user("127.0.0.1:5001"), None);
        assert!(lookup_in(&file, "bad.example", f).is_err());
        let c = Credentials::parse("u:p").unwrap();
        assert_eq!(c.basic(), "Basic dTpw");
        assert_eq!(format!("{c:?}"), "Credentials(\"u\", <hidden>)");
        assert!(Credentials::parse("nocolon").is_none());
    }
}
