//! Credentials handed over while the process runs, per repository: what a Kubernetes
//! pull carries (kubelet's image pull secrets, read by the CRI image-service proxy,
//! `crate::snapshot::cri`).
//!
//! The credentials of `--creds`, auth files and `config.json` are the node's, one set
//! per host, read when a host's client is made ([`super::auth::credentials`]). A pull
//! secret belongs to a pod, and so to the images it names: it is kept for the
//! repository of the image it came with (host and repository, any tag or digest), as
//! stargz-snapshotter keeps it for the image reference, and it is tried before the
//! node's for that repository only. A newer secret for a repository replaces the
//! older. Kept in memory only (never on disk, never logged): a server that restarts
//! has none until kubelet pulls again, and reads the node's credentials meanwhile.

use super::auth::Credentials;
use std::collections::HashMap;
use std::sync::Mutex;

/// Most repositories held; the one given longest ago goes first when another comes
/// (a hostile or runaway client cannot grow the process without bound).
pub const MAX_HELD: usize = 4096;

/// A secret for one repository.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A user name and password (kubelet's `username`/`password`, or `auth`).
    Basic(Credentials),
    /// A bearer token to send to the registry as it is (kubelet's `registry_token`).
    Bearer(String),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Basic(c) => write!(f, "Basic({c:?})"),
            Secret::Bearer(_) => f.write_str("Bearer(<hidden>)"),
        }
    }
}

/// Secrets by (host, repository).
#[derive(Debug, Default)]
pub struct Keychain {
    /// Each secret with the number of the `put` that gave it.
    held: Mutex<HashMap<(String, String), (Secret, u64)>>,
    puts: std::sync::atomic::AtomicU64,
}

impl Keychain {
    /// Keep `secret` for `host`'s `repo` (replacing what was kept for it).
    pub fn put(&self, host: &str, repo: &str, secret: Secret) {
        let mut held = crate::sync::lock(&self.held);
        let key = (host.to_string(), repo.to_string());
        if held.len() >= MAX_HELD && !held.contains_key(&key) {
            let oldest = held
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                held.remove(&k);
            }
        }
        let n = self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        held.insert(key, (secret, n));
    }

    /// The secret kept for `host`'s `repo`, if any.
    pub fn get(&self, host: &str, repo: &str) -> Option<Secret> {
        crate::sync::lock(&self.held)
            .get(&(host.to_string(), repo.to_string()))
            .map(|(s, _)| s.clone())
    }

    /// How many repositories have a secret.
    pub fn len(&self) -> usize {
        crate::sync::lock(&self.held).len()
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(s: &str) -> Secret {
        Secret::Basic(Credentials::parse(s).unwrap())
    }

    #[test]
    fn a_secret_is_kept_for_its_repository_only() {
        let k = Keychain::default();
        k.put("r.example:5000", "team/app", basic("u:p"));
        assert_eq!(k.get("r.example:5000", "team/app"), Some(basic("u:p")));
        assert_eq!(k.get("r.example:5000", "team/other"), None);
        assert_eq!(k.get("r.example:5001", "team/app"), None);
        // A newer one replaces it.
        k.put("r.example:5000", "team/app", Secret::Bearer("t".into()));
        assert_eq!(
            k.get("r.example:5000", "team/app"),
            Some(Secret::Bearer("t".into()))
        );
        assert_eq!(k.len(), 1);
    }

    #[test]
    fn the_oldest_goes_when_the_keychain_is_full() {
        let k = Keychain::default();
        for i in 0..MAX_HELD {
            k.put("h", &format!("r{i}"), basic("u:p"));
        }
        assert_eq!(k.len(), MAX_HELD);
        k.put("h", "new", basic("u:p"));
        assert_eq!(k.len(), MAX_HELD);
        assert_eq!(k.get("h", "r0"), None);
        assert!(k.get("h", "new").is_some() && k.get("h", "r1").is_some());
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let shown = format!(
            "{:?} {:?}",
            basic("user:hunter2"),
            Secret::Bearer("tok3n".into())
        );
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok3n"),
            "{shown}"
        );
    }
}
