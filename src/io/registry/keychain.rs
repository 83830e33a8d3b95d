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
//! older. Kept in memory only (never on disk, never logged). A store's server under a
//! keeper hands each secret to its keeper as it comes ([`Keychain::observe`]), and the
//! keeper hands them all to the server that replaces it (after a death or a reload)
//! before that one grows the tree again (`crate::keeper::wire::HeldSecret`).

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

impl Secret {
    /// Its kind and parts, to cross to the keeper: `("basic", user, password)` or
    /// `("bearer", token, "")`.
    pub fn parts(&self) -> (&'static str, String, String) {
        match self {
            Secret::Basic(c) => ("basic", c.user.clone(), c.password().to_string()),
            Secret::Bearer(t) => ("bearer", t.clone(), String::new()),
        }
    }

    /// The secret [`Secret::parts`] gave; `None` for parts no secret gives.
    pub fn from_parts(kind: &str, first: &str, second: &str) -> Option<Secret> {
        match kind {
            "basic" => Credentials::new(first, second).map(Secret::Basic),
            "bearer" if !first.is_empty() && second.is_empty() => {
                Some(Secret::Bearer(first.to_string()))
            }
            _ => None,
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Basic(c) => write!(f, "Basic({c:?})"),
            Secret::Bearer(_) => f.write_str("Bearer(<hidden>)"),
        }
    }
}

/// Told of each secret [`Keychain::put`] keeps: host, repository, secret.
pub type Observer = Box<dyn Fn(&str, &str, &Secret) + Send + Sync>;

/// Secrets by (host, repository).
#[derive(Default)]
pub struct Keychain {
    /// Each secret with the number of the `put` that gave it.
    held: Mutex<HashMap<(String, String), (Secret, u64)>>,
    puts: std::sync::atomic::AtomicU64,
    observer: std::sync::OnceLock<Observer>,
}

impl std::fmt::Debug for Keychain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keychain")
            .field("held", &self.len())
            .field("observed", &self.observer.get().is_some())
            .finish()
    }
}

impl Keychain {
    /// Keep `secret` for `host`'s `repo` (replacing what was kept for it), and tell the
    /// observer.
    pub fn put(&self, host: &str, repo: &str, secret: Secret) {
        if let Some(o) = self.observer.get() {
            o(host, repo, &secret);
        }
        self.insert(host, repo, secret, true);
    }

    /// Keep `secret` for `host`'s `repo` unless one is kept for it already (a newer
    /// one, given to this process, over one handed over from an earlier); the observer
    /// is not told. Whether it was kept.
    pub fn put_if_absent(&self, host: &str, repo: &str, secret: Secret) -> bool {
        self.insert(host, repo, secret, false)
    }

    /// Tell `observer` of every secret put from now on (once: a second is ignored).
    pub fn observe(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    fn insert(&self, host: &str, repo: &str, secret: Secret, replace: bool) -> bool {
        let mut held = crate::sync::lock(&self.held);
        let key = (host.to_string(), repo.to_string());
        if !replace && held.contains_key(&key) {
            return false;
        }
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
        true
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
    use std::sync::Arc;

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
    fn puts_are_observed_and_handed_over_ones_do_not_replace_kept_ones() {
        let k = Keychain::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        k.put("h", "before", basic("u:p"));
        k.observe(Box::new(move |h, r, secret| {
            s.lock()
                .unwrap()
                .push((h.to_string(), r.to_string(), secret.clone()))
        }));
        k.put("h", "a", basic("u:p1"));
        k.put("h", "b", Secret::Bearer("t".into()));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                ("h".to_string(), "a".to_string(), basic("u:p1")),
                ("h".to_string(), "b".to_string(), Secret::Bearer("t".into()))
            ]
        );
        // Handed over from an earlier server: kept where none is, never over one.
        assert!(!k.put_if_absent("h", "a", basic("u:old")));
        assert!(k.put_if_absent("h", "c", basic("u:p3")));
        assert_eq!(k.get("h", "a"), Some(basic("u:p1")));
        assert_eq!(seen.lock().unwrap().len(), 2, "a hand-over was observed");
        assert_eq!(k.len(), 4);
        assert!(!format!("{k:?}").contains("p1"));
    }

    #[test]
    fn a_secret_crosses_as_parts_and_parts_no_secret_gives_are_refused() {
        for s in [
            basic("user:pa:ss"),
            basic("user:"),
            Secret::Bearer("tok".into()),
        ] {
            let (kind, a, b) = s.parts();
            assert_eq!(Secret::from_parts(kind, &a, &b), Some(s));
        }
        assert_eq!(Secret::from_parts("basic", "", "p"), None);
        assert_eq!(Secret::from_parts("bearer", "", ""), None);
        assert_eq!(Secret::from_parts("bearer", "t", "x"), None);
        assert_eq!(Secret::from_parts("other", "a", "b"), None);
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
