//! Remote sources: `s3://BUCKET/PREFIX/` (the objects directly under PREFIX, listed with
//! ListObjectsV2; credentials, region and endpoint from the standard AWS environment:
//! `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_REGION`…), `http(s)://HOST/PATH/FILE`
//! (one archive) and `http(s)://HOST/DIR/` (the files an HTML index links to: nginx's and
//! Apache's autoindex, PEP 503 simple pages). Each object becomes a candidate whose
//! blob is an [`crate::io::remote::RemoteBlob`] of the version the listing saw; layer
//! order is byte order of the object names, as for a directory.

use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjPath;

use crate::error::{Error, Result};
use crate::io::blob::Blob;
use crate::io::remote::{ObjectVersion, Remote, RemoteBlob, store_error};

/// Most objects one remote source may list.
pub const MAX_OBJECTS: usize = 100_000;
/// HEAD requests in flight while an HTTP directory is listed.
const HEADS_IN_FLIGHT: usize = 256;
/// Largest HTML index read.
const MAX_INDEX_PAGE: usize = 16 << 20;

/// A remote source as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteRef {
    /// `s3://BUCKET/PREFIX` (PREFIX may be empty).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix, ending with `/` unless empty.
        prefix: String,
    },
    /// `http(s)://…/FILE`: one object.
    HttpFile(String),
    /// `http(s)://…/DIR/`: an index page.
    HttpDir(String),
}

impl RemoteRef {
    /// Parse `s3://…`, `http://…`, `https://…`; `None` for anything else.
    pub fn parse(s: &str) -> Option<RemoteRef> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return None;
            }
            let mut prefix = prefix.trim_start_matches('/').to_string();
            if !prefix.is_empty() && !prefix.ends_with('/') {
                prefix.push('/');
            }
            return Some(RemoteRef::S3 {
                bucket: bucket.to_string(),
                prefix,
            });
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            let after = &s[s.find("://")? + 3..];
            if after.is_empty() || after.starts_with('/') {
                return None;
            }
            return Some(if s.ends_with('/') || !after.contains('/') {
                RemoteRef::HttpDir(if s.ends_with('/') {
                    s.to_string()
                } else {
                    format!("{s}/")
                })
            } else {
                RemoteRef::HttpFile(s.to_string())
            });
        }
        None
    }
}

/// The objects of a remote source, in layer order: (name, blob).
pub fn list(r: &RemoteRef, remote: &Arc<Remote>) -> Result<Vec<(String, Arc<dyn Blob>)>> {
    match r {
        RemoteRef::S3 { bucket, prefix } => list_s3(bucket, prefix, remote),
        RemoteRef::HttpFile(url) => {
            let (store, path) = http_store(url, remote)?;
            let meta = head(&store, &path, url, remote)?;
            let blob: Arc<dyn Blob> = Arc::new(RemoteBlob::new(
                url.clone(),
                store,
                path,
                &meta,
                remote.clone(),
            ));
            Ok(vec![(url.clone(), blob)])
        }
        RemoteRef::HttpDir(url) => list_http_dir(url, remote),
    }
}

/// The blob of one version of a store's object, as a listing gave it: asked for again
/// only with that version's ETag (the disk cache holds it under the same key), never
/// listed or HEADed again.
pub fn object(v: &ObjectVersion, remote: &Arc<Remote>) -> Result<Arc<dyn Blob>> {
    let (store, path) = match v.url.strip_prefix("s3://").and_then(|r| r.split_once('/')) {
        Some((bucket, key)) => (
            s3_store(bucket, remote)?,
            ObjPath::parse(key).map_err(|e| Error::Format(format!("{}: {e}", v.url)))?,
        ),
        None if v.url.starts_with("http://") || v.url.starts_with("https://") => {
            http_store(&v.url, remote)?
        }
        None => {
            return Err(Error::Unsupported(format!(
                "{}: not the URL of an object",
                v.url
            )));
        }
    };
    let (secs, nanos) = v.modified;
    let meta = object_store::ObjectMeta {
        location: path.clone(),
        last_modified: chrono::DateTime::from_timestamp(secs, nanos).unwrap_or_default(),
        size: v.size,
        e_tag: v.etag.clone(),
        version: None,
    };
    Ok(Arc::new(RemoteBlob::new(
        v.url.clone(),
        store,
        path,
        &meta,
        remote.clone(),
    )))
}

/// The file name of an object as its listing names it (`s3://B/P/NAME`,
/// `http://H/D/NAME` percent-encoded): `NAME`, decoded.
pub fn object_name(listed: &str) -> String {
    percent_decode(listed.rsplit('/').next().unwrap_or(listed))
}

/// The objects of a remote store by name below its directory or prefix (a seal's files),
/// on one client made once.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    base: ObjPath,
    label: String,
    remote: Arc<Remote>,
}

impl Objects {
    /// The objects of `r` (a directory or prefix).
    pub fn of(r: &RemoteRef, remote: &Arc<Remote>) -> Result<Objects> {
        let (store, base, label) = match r {
            RemoteRef::S3 { bucket, prefix } => (
                s3_store(bucket, remote)?,
                ObjPath::from(prefix.trim_end_matches('/')),
                format!("s3://{bucket}/{prefix}"),
            ),
            RemoteRef::HttpDir(url) => {
                let (store, path) = http_store(url, remote)?;
                (store, path, url.clone())
            }
            RemoteRef::HttpFile(url) => {
                return Err(Error::Unsupported(format!(
                    "{url}: a single file has no store around it"
                )));
            }
        };
        Ok(Objects {
            store,
            base,
            label,
            remote: remote.clone(),
        })
    }

    /// The bytes of object `rel` (a `/`-separated path below the store's directory), in
    /// one request, refusing one of more than `limit` bytes before reading its body.
    pub fn get(&self, rel: &str, limit: u64) -> Result<Vec<u8>> {
        let what = format!("{}{rel}", self.label);
        self.remote
            .run(&what, self.fetch(rel, limit))?
            .ok_or_else(|| Error::Format(format!("{what}: not found")))
    }

    /// The bytes of each object of `objects` (`(rel, limit)` as for [`Objects::get`]),
    /// `None` for one the store does not have: all requests at once, one round trip.
    pub fn get_all(&self, objects: &[(&str, u64)]) -> Result<Vec<Option<Vec<u8>>>> {
        let all = futures::future::join_all(objects.iter().map(|(r, l)| self.fetch(r, *l)));
        self.remote.run(&self.label, async move {
            Ok(all.await.into_iter().collect::<Result<Vec<_>>>())
        })?
    }

    /// Fetch object `rel`, at most `limit` bytes; `None` if it is not there.
    fn fetch(
        &self,
        rel: &str,
        limit: u64,
    ) -> impl std::future::Future<Output = Result<Option<Vec<u8>>>> + use<> {
        let path = rel.split('/').fold(self.base.clone(), |p, c| p.child(c));
        let what = format!("{}{rel}", self.label);
        let store = self.store.clone();
        async move {
            let got = match store.get(&path).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(store_error(&what, e)),
            };
            if got.meta.size > limit {
                return Err(Error::Corrupt(format!(
                    "{what}: {} bytes, more than the {limit} it may have",
                    got.meta.size
                )));
            }
            let bytes = got.bytes().await.map_err(|e| store_error(&what, e))?;
            Ok(Some(bytes.to_vec()))
        }
    }
}

fn list_s3(
    bucket: &str,
    prefix: &str,
    remote: &Arc<Remote>,
) -> Result<Vec<(String, Arc<dyn Blob>)>> {
    let store = s3_store(bucket, remote)?;
    let what = format!("s3://{bucket}/{prefix}");
    let label = what.clone();
    let p = (!prefix.is_empty()).then(|| ObjPath::from(prefix.trim_end_matches('/')));
    let s = store.clone();
    let listed = remote.run(&label, async move {
        s.list_with_delimiter(p.as_ref())
            .await
            .map_err(|e| store_error(&what, e))
    })?;
    let mut objects: Vec<_> = listed
        .objects
        .into_iter()
        .filter(|m| m.location.filename().is_some_and(|n| !n.starts_with('.')))
        .collect();
    if objects.len() > MAX_OBJECTS {
        return Err(Error::Format(format!(
            "s3://{bucket}/{prefix} lists more than {MAX_OBJECTS} objects"
        )));
    }
    objects.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    Ok(objects
        .into_iter()
        .map(|m| {
            let name = format!("s3://{bucket}/{}", m.location);
            let blob: Arc<dyn Blob> = Arc::new(RemoteBlob::new(
                name.clone(),
                store.clone(),
                m.location.clone(),
                &m,
                remote.clone(),
            ));
            (name, blob)
        })
        .collect())
}

/// The S3 client of `bucket`: credentials, region and endpoint from the environment and
/// the AWS shared files, as the AWS CLI finds them.
fn s3_store(bucket: &str, remote: &Arc<Remote>) -> Result<Arc<dyn ObjectStore>> {
    let (opts, retry) = remote.client_options();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut builder = object_store::aws::AmazonS3Builder::from_env();
    // The shared config files fill in what the environment does not say, as for the
    // AWS CLI.
    let profile = aws_profile(&env);
    if env("AWS_ACCESS_KEY_ID").is_none()
        && let (Some(id), Some(secret)) = (&profile.access_key_id, &profile.secret_access_key)
    {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
        if let Some(t) = &profile.session_token {
            builder = builder.with_token(t);
        }
    }
    if env("AWS_REGION").is_none()
        && env("AWS_DEFAULT_REGION").is_none()
        && let Some(r) = &profile.region
    {
        builder = builder.with_region(r);
    }
    if env("AWS_ENDPOINT_URL").is_none()
        && env("AWS_ENDPOINT").is_none()
        && let Some(e) = &profile.endpoint_url
    {
        builder = builder.with_endpoint(e);
    }
    Ok(Arc::new(
        builder
            .with_bucket_name(bucket)
            .with_client_options(opts)
            .with_retry(retry)
            .with_http_connector(remote.connector())
            .build()
            .map_err(|e| Error::Format(format!("s3://{bucket}/: {e}")))?,
    ))
}

/// What the AWS shared config files say for the profile in use (`AWS_PROFILE`, else
/// `default`): keys from the credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
/// `~/.aws/credentials`), and from the config file (`AWS_CONFIG_FILE`, else
/// `~/.aws/config`, section `[profile NAME]` or `[default]`) the region, the endpoint and
/// keys the credentials file lacks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AwsProfile {
    /// `aws_access_key_id`.
    pub access_key_id: Option<String>,
    /// `aws_secret_access_key`.
    pub secret_access_key: Option<String>,
    /// `aws_session_token`.
    pub session_token: Option<String>,
    /// `region`.
    pub region: Option<String>,
    /// `endpoint_url` (an S3-compatible server).
    pub endpoint_url: Option<String>,
}

/// The profile in use, from the files `env` (an environment lookup) points to.
pub fn aws_profile(env: &dyn Fn(&str) -> Option<String>) -> AwsProfile {
    let name = env("AWS_PROFILE")
        .or_else(|| env("AWS_DEFAULT_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let home = env("HOME").unwrap_or_default();
    let read = |var: &str, default: &str| {
        let path = env(var).unwrap_or_else(|| format!("{home}/.aws/{default}"));
        std::fs::read_to_string(path).unwrap_or_default()
    };
    let creds = ini(&read("AWS_SHARED_CREDENTIALS_FILE", "credentials"));
    let config = ini(&read("AWS_CONFIG_FILE", "config"));
    let empty = std::collections::HashMap::new();
    let c = creds.get(&name).unwrap_or(&empty);
    let section = if name == "default" {
        "default".to_string()
    } else {
        format!("profile {name}")
    };
    let f = config.get(&section).unwrap_or(&empty);
    let get = |k: &str| c.get(k).or_else(|| f.get(k)).cloned();
    AwsProfile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: f.get("region").cloned(),
        endpoint_url: f.get("endpoint_url").cloned(),
    }
}

/// The sections of an INI text (`[name]`, `key = value`; `#` and `;` comments;
/// indented lines, the nested settings of the AWS format, are skipped).
fn ini(text: &str) -> std::collections::HashMap<String, std::collections::HashMap<String, String>> {
    let mut out: std::collections::HashMap<_, std::collections::HashMap<_, _>> =
        std::collections::HashMap::new();
    let mut section = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let l = line.trim();
        if l.is_empty() || l.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = l.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            section = Some(name.clone());
            out.entry(name).or_default();
        } else if let (Some(sec), Some((k, v))) = (&section, l.split_once('=')) {
            out.entry(sec.clone())
                .or_default()
                .insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    out
}

/// The store of the server of `url`, and the object's path on it.
fn http_store(url: &str, remote: &Arc<Remote>) -> Result<(Arc<dyn ObjectStore>, ObjPath)> {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let host_end = url[scheme_end..]
        .find('/')
        .map_or(url.len(), |i| scheme_end + i);
    let (base, path) = url.split_at(host_end);
    let (opts, retry) = remote.client_options();
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(opts)
        .with_retry(retry)
        .with_http_connector(remote.connector())
        .build()
        .map_err(|e| Error::Format(format!("{url}: {e}")))?;
    let decoded = percent_decode(path.trim_start_matches('/'));
    let path = ObjPath::parse(&decoded).map_err(|e| Error::Format(format!("{url}: {e}")))?;
    Ok((Arc::new(store), path))
}

fn head(
    store: &Arc<dyn ObjectStore>,
    path: &ObjPath,
    url: &str,
    remote: &Arc<Remote>,
) -> Result<object_store::ObjectMeta> {
    let (s, p, what) = (store.clone(), path.clone(), url.to_string());
    remote.run(url, async move {
        s.head(&p).await.map_err(|e| store_error(&what, e))
    })
}

fn list_http_dir(url: &str, remote: &Arc<Remote>) -> Result<Vec<(String, Arc<dyn Blob>)>> {
    let page = {
        let r = remote.clone();
        let what = url.to_string();
        remote.run(url, async move { r.get_page(&what, MAX_INDEX_PAGE).await })?
    };
    let mut names = links(&String::from_utf8_lossy(&page), url);
    names.sort();
    names.dedup();
    if names.len() > MAX_OBJECTS {
        return Err(Error::Format(format!(
            "{url} links to more than {MAX_OBJECTS} files"
        )));
    }
    let (store, dir) = http_store(url, remote)?;
    // HEAD every file, many in flight.
    let metas = {
        let store = store.clone();
        let dir = dir.clone();
        let names = names.clone();
        let what = url.to_string();
        remote.run(url, async move {
            let all = futures::stream::iter(names.into_iter().map(|n| {
                let store = store.clone();
                let path = dir.child(n.as_str());
                let what = format!("{what}{n}");
                async move { store.head(&path).await.map_err(|e| store_error(&what, e)) }
            }))
            .buffered(HEADS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
            Ok(all)
        })?
    };
    // A file the index links to but the server does not give is skipped, named: the
    // rest of the directory mounts (as a bad archive in a local directory is skipped).
    Ok(names
        .iter()
        .zip(metas)
        .filter_map(|(n, meta)| match meta {
            Ok(m) => Some((n, m)),
            Err(e) => {
                log::warn!("skipping {url}{}: {e}", percent_encode(n));
                None
            }
        })
        .map(|(n, meta)| {
            let name = format!("{url}{}", percent_encode(n));
            let blob: Arc<dyn Blob> = Arc::new(RemoteBlob::new(
                name.clone(),
                store.clone(),
                dir.child(n.as_str()),
                &meta,
                remote.clone(),
            ));
            (name, blob)
        })
        .collect())
}

/// The names of the files directly inside the directory `base` (a URL ending in `/`)
/// that an HTML index page links to, percent-decoded: `href` values that are relative
/// names, or absolute paths or URLs inside `base`; not subdirectories, parents, queries
/// (sort links) or hidden names. Fragments (`#sha256=…` of PEP 503) are dropped.
pub fn links(html: &str, base: &str) -> Vec<String> {
    let base_path = base
        .find("://")
        .and_then(|i| base[i + 3..].find('/').map(|j| &base[i + 3 + j..]))
        .unwrap_or("/");
    let mut out = Vec::new();
    let lower = html.to_ascii_lowercase();
    let mut at = 0;
    while let Some(i) = lower[at..].find("href") {
        let mut p = at + i + 4;
        at = p;
        let rest = &html[p..];
        let trimmed = rest.trim_start();
        if !trimmed.starts_with('=') {
            continue;
        }
        p += rest.len() - trimmed.len() + 1;
        let v = html[p..].trim_start();
        let (value, _) = match v.chars().next() {
            Some(q @ ('"' | '\'')) => match v[1..].find(q) {
                Some(e) => (&v[1..1 + e], ()),
                None => continue,
            },
            _ => (
                v.split(|c: char| c.is_whitespace() || c == '>')
                    .next()
                    .unwrap_or(""),
                (),
            ),
        };
        let value = value.split('#').next().unwrap_or("").replace("&amp;", "&");
        if value.is_empty() || value.contains('?') {
            continue;
        }
        let rel = if let Some(abs) = value.strip_prefix(base) {
            abs.to_string()
        } else if value.contains("://") {
            continue;
        } else if let Some(abs) = value.strip_prefix('/') {
            match format!("/{abs}").strip_prefix(base_path) {
                Some(r) => r.to_string(),
                None => continue,
            }
        } else {
            value.trim_start_matches("./").to_string()
        };
        if rel.is_empty() || rel.contains('/') || rel == ".." {
            continue;
        }
        let name = percent_decode(&rel);
        if name.starts_with('.') || name.contains('/') || name.contains('\0') {
            continue;
        }
        out.push(name);
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|c| {
            if c.is_ascii_alphanumeric() || b"-._~+".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_sources_parse() {
        assert_eq!(
            RemoteRef::parse("s3://b/pkgs"),
            Some(RemoteRef::S3 {
                bucket: "b".into(),
                prefix: "pkgs/".into()
            })
        );
        assert_eq!(
            RemoteRef::parse("s3://b"),
            Some(RemoteRef::S3 {
                bucket: "b".into(),
                prefix: String::new()
            })
        );
        assert_eq!(
            RemoteRef::parse("http://h:8080/d/"),
            Some(RemoteRef::HttpDir("http://h:8080/d/".into()))
        );
        assert_eq!(
            RemoteRef::parse("https://h/d/a.zip"),
            Some(RemoteRef::HttpFile("https://h/d/a.zip".into()))
        );
        assert_eq!(
            RemoteRef::parse("http://h"),
            Some(RemoteRef::HttpDir("http://h/".into()))
        );
        assert_eq!(RemoteRef::parse("/pkgs"), None);
        assert_eq!(RemoteRef::parse("s3://"), None);
    }

    #[test]
    fn aws_profiles_come_from_the_shared_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join(".aws")).unwrap();
        std::fs::write(
            d.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = AKD\naws_secret_access_key = SD\n\n\
             # a comment\n[ci]\naws_access_key_id=AKC\naws_secret_access_key = SC\n\
             aws_session_token = T\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join(".aws/config"),
            "[default]\nregion = eu-west-1\n[profile ci]\nregion = us-east-2\n\
             endpoint_url = http://127.0.0.1:9000\ns3 =\n  addressing_style = path\n\
             [profile keys-here]\naws_access_key_id = AKH\naws_secret_access_key = SH\n",
        )
        .unwrap();
        let home = d.path().to_str().unwrap().to_string();
        let with = |profile: Option<&str>| {
            let home = home.clone();
            let profile = profile.map(String::from);
            aws_profile(&move |k| match k {
                "HOME" => Some(home.clone()),
                "AWS_PROFILE" => profile.clone(),
                _ => None,
            })
        };
        let def = with(None);
        assert_eq!(def.access_key_id.as_deref(), Some("AKD"));
        assert_eq!(def.region.as_deref(), Some("eu-west-1"));
        assert_eq!(def.endpoint_url, None);
        let ci = with(Some("ci"));
        assert_eq!(
            ci,
            AwsProfile {
                access_key_id: Some("AKC".into()),
                secret_access_key: Some("SC".into()),
                session_token: Some("T".into()),
                region: Some("us-east-2".into()),
                endpoint_url: Some("http://127.0.0.1:9000".into()),
            }
        );
        assert_eq!(
            with(Some("keys-here")).access_key_id.as_deref(),
            Some("AKH")
        );
        assert_eq!(with(Some("none")), AwsProfile::default());
    }

    #[test]
    fn index_pages_give_the_files_of_their_directory() {
        // nginx autoindex, Apache (sort links, parent), PEP 503 (fragments, absolute).
        let html = r#"<html><body><h1>Index of /pkgs/</h1>
<a href="../">../</a>
<a href="sub/">sub/</a>
<a href="a.zip">a.zip</a>
<a href="b%20c.whl">b c.whl</a>
<a href="?C=N;O=D">Name</a>
<a href='/pkgs/d.tar.gz#sha256=abc'>d</a>
<A HREF=e.jar>e</A>
<a href="/elsewhere/f.zip">f</a>
<a href="http://other/x.zip">x</a>
<a href="http://h/pkgs/g.zip">g</a>
<a href=".hidden.zip">h</a>
<a href="a.zip">again</a>
</body></html>"#;
        let mut got = links(html, "http://h/pkgs/");
        got.sort();
        got.dedup();
        assert_eq!(got, ["a.zip", "b c.whl", "d.tar.gz", "e.jar", "g.zip"]);
        assert_eq!(percent_encode("b c.whl"), "b%20c.whl");
        assert_eq!(percent_decode("%C3%BC%2"), "ü%2");
    }
}
