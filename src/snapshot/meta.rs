//! The snapshotter's bookkeeping: one record per snapshot key in a redb database
//! (`ROOT/metadata.redb`), and containerd's rules for changing them.
//!
//! Each change is one write transaction, so a crash leaves either the old state or the
//! new one. What happens on disk in the middle of a change (a directory made, an upper
//! directory measured) is done by the caller in a closure that runs inside the
//! transaction: if it fails, nothing is recorded. This module knows nothing of gRPC
//! nor of where the directories are; [`super::Snapshotter`] puts them together.
//!
//! The rules are those of containerd 1.6's `snapshots/storage` (which its own overlayfs
//! snapshotter uses), so that containerd sees the same answers from this proxy as from
//! its built-in snapshotters:
//!
//! - Prepare and View make an Active or a View snapshot; the key must be new
//!   (`AlreadyExists`), the parent, if any, must exist (`NotFound`) and be Committed
//!   (`InvalidArgument`, as containerd answers).
//! - Commit turns an Active snapshot into a Committed one under a new name, keeping its
//!   id (and so its directory). The name must be new (`AlreadyExists`, checked first), the
//!   key must exist (`NotFound`) and be Active (`FailedPrecondition`). Labels are replaced
//!   by the commit's, not inherited; created and updated are the time of the commit; the
//!   usage of the upper directory is measured and stored.
//! - Remove refuses a snapshot that is the parent of another (`FailedPrecondition`).
//! - Update changes labels only: the field paths `labels` (all of them) and
//!   `labels.KEY` (one; an empty value removes it); no path means `labels`. Anything else
//!   is `InvalidArgument`.
//! - Stat, Update, Usage, Mounts, Commit and Remove of a missing key are `NotFound`.
//!
//! Ids are allocated from a counter kept in the database and never reused once
//! committed; a child→parent link is kept by key, and a parent→children index by id
//! (the `children` table), so Remove finds children without a scan.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::filter::{Fields, FilterError};

/// Labels: arbitrary key/value pairs containerd and its clients attach to snapshots.
pub type Labels = BTreeMap<String, String>;

/// The largest key plus value of one label, as containerd checks it (`labels.Validate`).
pub const MAX_LABEL: usize = 4096;

/// Everything the snapshotter can fail with. The first four are containerd's error
/// classes: the gRPC service answers them with the matching status code, which
/// containerd turns back into its `errdefs` errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No snapshot with that key (or parent).
    #[error("{0}: not found")]
    NotFound(String),
    /// The key (or commit name) is taken.
    #[error("{0}: already exists")]
    AlreadyExists(String),
    /// The snapshot is not in a state that allows this (Commit of a non-Active,
    /// Remove of a parent).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request is malformed (empty key, a field that cannot be updated, a label too
    /// long, a parent that is not committed).
    #[error("{0}")]
    InvalidArgument(String),
    /// A filter of List that does not parse.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// An I/O error on a snapshot's directory (or the socket).
    #[error("{}: {source}", path.display())]
    Io {
        /// The path it happened on.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The database failed (I/O, corruption, another process holding it). Boxed: redb's
    /// error is large, and every result here carries this type.
    #[error("snapshot database: {0}")]
    Store(Box<redb::Error>),
    /// A record that does not decode: the database was written by something else.
    #[error("snapshot database: record {key:?}: {source}")]
    Record {
        /// The snapshot key.
        key: String,
        /// What was wrong with it.
        source: serde_json::Error,
    },
}

/// Shorthand for this module's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

fn db(e: impl Into<redb::Error>) -> Error {
    Error::Store(Box::new(e.into()))
}

/// What a snapshot is, as containerd's `snapshots.Kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A read-only view of a committed parent (`ctr snapshots view`).
    View,
    /// Writable: where a layer is unpacked, or a container's root file system.
    Active,
    /// Immutable: a layer, possibly the parent of others.
    Committed,
}

impl Kind {
    /// The name containerd's filters use: `view`, `active`, `committed`.
    pub fn filter_name(self) -> &'static str {
        match self {
            Kind::View => "view",
            Kind::Active => "active",
            Kind::Committed => "committed",
        }
    }
}

/// Disk usage of a snapshot's own directory, as containerd's `snapshots.Usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Bytes allocated (`st_blocks` × 512, each inode once).
    pub size: i64,
    /// Distinct inodes.
    pub inodes: i64,
}

/// What Stat, Update and List return about a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The key (or, once committed, the name).
    pub name: String,
    /// The parent's name, empty for none.
    pub parent: String,
    /// View, Active or Committed.
    pub kind: Kind,
    /// Its labels.
    pub labels: Labels,
    /// When it was made (for a committed snapshot: when it was committed).
    pub created: SystemTime,
    /// When its labels last changed.
    pub updated: SystemTime,
}

impl Fields for Info {
    fn field(&self, path: &[String]) -> Option<Cow<'_, str>> {
        match path.first().map(String::as_str)? {
            "name" => Some(Cow::Borrowed(&self.name)),
            "parent" => Some(Cow::Borrowed(&self.parent)),
            "kind" => Some(Cow::Borrowed(self.kind.filter_name())),
            "labels" => self
                .labels
                .get(&path[1..].join("."))
                .map(|v| Cow::Borrowed(v.as_str())),
            _ => None,
        }
    }
}

/// What mounts are made from: the snapshot's id and kind and its ancestors' ids,
/// nearest first (containerd's `storage.Snapshot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The snapshot's id: its directory is `ROOT/snapshots/ID`.
    pub id: u64,
    /// Its kind.
    pub kind: Kind,
    /// Parent, grandparent…
    pub parent_ids: Vec<u64>,
}

/// A record as stored (JSON: readable with any redb tool, and fields can be added).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    id: u64,
    kind: Kind,
    parent: String,
    labels: Labels,
    created: Stamp,
    updated: Stamp,
    usage: Usage,
}

/// A time as seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Stamp(u64, u32);

impl Stamp {
    fn now() -> Stamp {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Stamp(d.as_secs(), d.subsec_nanos())
    }

    fn time(self) -> SystemTime {
        UNIX_EPOCH + Duration::new(self.0, self.1)
    }
}

impl Record {
    fn info(&self, name: &str) -> Info {
        Info {
            name: name.to_string(),
            parent: self.parent.clone(),
            kind: self.kind,
            labels: self.labels.clone(),
            created: self.created.time(),
            updated: self.updated.time(),
        }
    }
}

/// Key → record (JSON).
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// (parent id, child id) → child key: who depends on a snapshot.
const CHILDREN: TableDefinition<(u64, u64), &str> = TableDefinition::new("children");
/// Counters: `next_id`.
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");

/// The database of snapshot records.
pub struct Store {
    db: Database,
}

fn decode(key: &str, bytes: &[u8]) -> Result<Record> {
    serde_json::from_slice(bytes).map_err(|source| Error::Record {
        key: key.to_string(),
        source,
    })
}

fn encode(r: &Record) -> Vec<u8> {
    // A struct of strings, numbers and a string map: serialising cannot fail.
    serde_json::to_vec(r).unwrap_or_default()
}

/// Check a request's labels as containerd does: key and value at most 4096 bytes
/// together, no empty key.
pub fn validate_labels(labels: &Labels) -> Result<()> {
    for (k, v) in labels {
        if k.is_empty() {
            return Err(Error::InvalidArgument("label key must not be empty".into()));
        }
        if k.len() + v.len() > MAX_LABEL {
            return Err(Error::InvalidArgument(format!(
                "label {k:?}: key and value together longer than {MAX_LABEL} bytes"
            )));
        }
    }
    Ok(())
}

/// Labels as containerd stores them: an empty value is no label.
fn without_empty(mut labels: Labels) -> Labels {
    labels.retain(|_, v| !v.is_empty());
    labels
}

fn get_record(t: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<Record> {
    match t.get(key).map_err(db)? {
        Some(v) => decode(key, v.value()),
        None => Err(Error::NotFound(format!("snapshot {key}"))),
    }
}

fn exists(t: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<bool> {
    Ok(t.get(key).map_err(db)?.is_some())
}

/// The ids of `parent` and its ancestors, nearest first.
fn ancestors(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    parent: &str,
) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    let mut next = parent.to_string();
    while !next.is_empty() {
        let r = get_record(t, &next)?;
        if ids.contains(&r.id) {
            return Err(Error::FailedPrecondition(format!(
                "snapshot {parent}: its parents form a loop"
            )));
        }
        ids.push(r.id);
        next = r.parent;
    }
    Ok(ids)
}

impl Store {
    /// Open the database at `path`, creating it if needed. A second process opening the
    /// same file fails (redb locks it).
    pub fn open(path: &Path) -> Result<Store> {
        let database = Database::create(path).map_err(db)?;
        let t = database.begin_write().map_err(db)?;
        {
            t.open_table(SNAPSHOTS).map_err(db)?;
            t.open_table(CHILDREN).map_err(db)?;
            t.open_table(COUNTERS).map_err(db)?;
        }
        t.commit().map_err(db)?;
        Ok(Store { db: database })
    }

    /// Record a new View or Active snapshot `key` on `parent` (empty: none) and call
    /// `on_disk` with it before the transaction commits (to make its directories); an
    /// error from `on_disk` records nothing.
    pub fn create(
        &self,
        kind: Kind,
        key: &str,
        parent: &str,
        labels: Labels,
        on_disk: impl FnOnce(&Snapshot) -> Result<()>,
    ) -> Result<Snapshot> {
        if kind == Kind::Committed {
            return Err(Error::InvalidArgument(
                "only Active and View snapshots can be created".into(),
            ));
        }
        if key.is_empty() {
            return Err(Error::InvalidArgument(
                "snapshot key must not be empty".into(),
            ));
        }
        validate_labels(&labels)?;
        let t = self.db.begin_write().map_err(db)?;
        let snap = {
            let mut snaps = t.open_table(SNAPSHOTS).map_err(db)?;
            let mut children = t.open_table(CHILDREN).map_err(db)?;
            let mut counters = t.open_table(COUNTERS).map_err(db)?;
            let mut parent_ids = Vec::new();
            if !parent.is_empty() {
                let p = match get_record(&snaps, parent) {
                    Err(Error::NotFound(_)) => {
                        return Err(Error::NotFound(format!("parent snapshot {parent}")));
                    }
                    r => r?,
                };
                if p.kind != Kind::Committed {
                    return Err(Error::InvalidArgument(format!(
                        "parent {parent:?} is not a committed snapshot"
                    )));
                }
                parent_ids = ancestors(&snaps, parent)?;
            }
            if exists(&snaps, key)? {
                return Err(Error::AlreadyExists(format!("snapshot {key}")));
            }
            let id = counters
                .get("next_id")
                .map_err(db)?
                .map_or(1, |v| v.value());
            counters.insert("next_id", id + 1).map_err(db)?;
            let now = Stamp::now();
            let record = Record {
                id,
                kind,
                parent: parent.to_string(),
                labels: without_empty(labels),
                created: now,
                updated: now,
                usage: Usage::default(),
            };
            snaps.insert(key, encode(&record).as_slice()).map_err(db)?;
            if let Some(&pid) = parent_ids.first() {
                children.insert((pid, id), key).map_err(db)?;
            }
            Snapshot {
                id,
                kind,
                parent_ids,
            }
        };
        on_disk(&snap)?;
        t.commit().map_err(db)?;
        Ok(snap)
    }

    /// The snapshot `key` as mounts need it.
    pub fn get(&self, key: &str) -> Result<Snapshot> {
        let t = self.db.begin_read().map_err(db)?;
        let snaps = t.open_table(SNAPSHOTS).map_err(db)?;
        let r = get_record(&snaps, key)?;
        Ok(Snapshot {
            id: r.id,
            kind: r.kind,
            parent_ids: ancestors(&snaps, &r.parent)?,
        })
    }

    /// What Stat answers about `key`.
    pub fn stat(&self, key: &str) -> Result<Info> {
        let t = self.db.begin_read().map_err(db)?;
        let snaps = t.open_table(SNAPSHOTS).map_err(db)?;
        Ok(get_record(&snaps, key)?.info(key))
    }

    /// The snapshot `key` and the usage recorded for it (zero unless committed).
    pub fn usage(&self, key: &str) -> Result<(Snapshot, Usage)> {
        let t = self.db.begin_read().map_err(db)?;
        let snaps = t.open_table(SNAPSHOTS).map_err(db)?;
        let r = get_record(&snaps, key)?;
        let snap = Snapshot {
            id: r.id,
            kind: r.kind,
            parent_ids: Vec::new(),
        };
        Ok((snap, r.usage))
    }

    /// Change the labels of `info.name` as the field `paths` say (see the module's
    /// rules); the record as it now is.
    pub fn update(&self, info: &Info, paths: &[String]) -> Result<Info> {
        let t = self.db.begin_write().map_err(db)?;
        let updated = {
            let mut snaps = t.open_table(SNAPSHOTS).map_err(db)?;
            let mut r = get_record(&snaps, &info.name)?;
            if paths.is_empty() {
                r.labels = info.labels.clone();
            }
            for path in paths {
                if let Some(k) = path.strip_prefix("labels.") {
                    match info.labels.get(k) {
                        Some(v) => r.labels.insert(k.to_string(), v.clone()),
                        None => r.labels.remove(k),
                    };
                } else if path == "labels" {
                    r.labels = info.labels.clone();
                } else {
                    return Err(Error::InvalidArgument(format!(
                        "cannot update {path:?} field on snapshot {:?}",
                        info.name
                    )));
                }
            }
            r.labels = without_empty(std::mem::take(&mut r.labels));
            validate_labels(&r.labels)?;
            r.updated = Stamp::now();
            snaps
                .insert(info.name.as_str(), encode(&r).as_slice())
                .map_err(db)?;
            r.info(&info.name)
        };
        t.commit().map_err(db)?;
        Ok(updated)
    }

    /// Commit the Active snapshot `key` as `name` with `labels`; `measure` is called with
    /// its id inside the transaction for the usage to record. Returns the id.
    pub fn commit(
        &self,
        key: &str,
        name: &str,
        labels: Labels,
        measure: impl FnOnce(u64) -> Result<Usage>,
    ) -> Result<u64> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "commit name must not be empty".into(),
            ));
        }
        validate_labels(&labels)?;
        let t = self.db.begin_write().map_err(db)?;
        let id = {
            let mut snaps = t.open_table(SNAPSHOTS).map_err(db)?;
            let mut children = t.open_table(CHILDREN).map_err(db)?;
            if exists(&snaps, name)? {
                return Err(Error::AlreadyExists(format!("committed snapshot {name}")));
            }
            let mut r = get_record(&snaps, key)?;
            if r.kind != Kind::Active {
                return Err(Error::FailedPrecondition(format!(
                    "snapshot {key:?} is not active"
                )));
            }
            r.usage = measure(r.id)?;
            r.kind = Kind::Committed;
            r.created = Stamp::now();
            r.updated = r.created;
            // Replaced, not inherited (containerd's rule).
            r.labels = without_empty(labels);
            snaps.remove(key).map_err(db)?;
            snaps.insert(name, encode(&r).as_slice()).map_err(db)?;
            if !r.parent.is_empty() {
                let pid = get_record(&snaps, &r.parent)?.id;
                children.insert((pid, r.id), name).map_err(db)?;
            }
            r.id
        };
        t.commit().map_err(db)?;
        Ok(id)
    }

    /// Forget `key`; its id and kind (the caller removes its directory).
    pub fn remove(&self, key: &str) -> Result<(u64, Kind)> {
        let t = self.db.begin_write().map_err(db)?;
        let removed = {
            let mut snaps = t.open_table(SNAPSHOTS).map_err(db)?;
            let mut children = t.open_table(CHILDREN).map_err(db)?;
            let r = get_record(&snaps, key)?;
            let has_child = children
                .range((r.id, 0)..=(r.id, u64::MAX))
                .map_err(db)?
                .next()
                .is_some();
            if has_child {
                return Err(Error::FailedPrecondition(format!(
                    "cannot remove snapshot {key:?} with child"
                )));
            }
            if !r.parent.is_empty() {
                let pid = get_record(&snaps, &r.parent)?.id;
                children.remove((pid, r.id)).map_err(db)?;
            }
            snaps.remove(key).map_err(db)?;
            (r.id, r.kind)
        };
        t.commit().map_err(db)?;
        Ok(removed)
    }

    /// Every snapshot, in key order.
    pub fn list(&self) -> Result<Vec<Info>> {
        let t = self.db.begin_read().map_err(db)?;
        let snaps = t.open_table(SNAPSHOTS).map_err(db)?;
        let mut out = Vec::new();
        for row in snaps.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            out.push(decode(k.value(), v.value())?.info(k.value()));
        }
        Ok(out)
    }

    /// Call `f` with the ids of every snapshot while holding the write lock, so that no
    /// snapshot is made or removed meanwhile (Cleanup: what is not in the set is
    /// garbage, and stays garbage until `f` returns).
    pub fn with_ids_locked<T>(&self, f: impl FnOnce(&HashSet<u64>) -> Result<T>) -> Result<T> {
        let t = self.db.begin_write().map_err(db)?;
        let ids = {
            let snaps = t.open_table(SNAPSHOTS).map_err(db)?;
            let mut ids = HashSet::new();
            for row in snaps.iter().map_err(db)? {
                let (k, v) = row.map_err(db)?;
                ids.insert(decode(k.value(), v.value())?.id);
            }
            ids
        };
        let out = f(&ids);
        t.abort().map_err(db)?;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("metadata.redb")).unwrap();
        (dir, s)
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ok(_: &Snapshot) -> Result<()> {
        Ok(())
    }

    /// Prepare `key` on `parent` and commit it as `name`.
    fn layer(s: &Store, key: &str, name: &str, parent: &str) -> u64 {
        s.create(Kind::Active, key, parent, Labels::new(), ok)
            .unwrap();
        s.commit(key, name, Labels::new(), |_| Ok(Usage::default()))
            .unwrap()
    }

    #[test]
    fn ids_grow_and_parents_chain_nearest_first() {
        let (_d, s) = store();
        let a = layer(&s, "a-key", "a", "");
        let b = layer(&s, "b-key", "b", "a");
        let c = s.create(Kind::Active, "c", "b", Labels::new(), ok).unwrap();
        assert!(a < b && b < c.id);
        assert_eq!(c.parent_ids, vec![b, a]);
        assert_eq!(s.get("c").unwrap(), c);
        let v = s.create(Kind::View, "v", "a", Labels::new(), ok).unwrap();
        assert_eq!((v.kind, v.parent_ids), (Kind::View, vec![a]));
        assert_eq!(s.stat("b").unwrap().parent, "a");
        assert_eq!(s.stat("b").unwrap().kind, Kind::Committed);
    }

    #[test]
    fn prepare_and_view_follow_containerds_rules() {
        let (_d, s) = store();
        layer(&s, "base-key", "base", "");
        s.create(Kind::Active, "active", "", Labels::new(), ok)
            .unwrap();
        let err = |r: Result<Snapshot>| r.unwrap_err();
        assert!(matches!(
            err(s.create(Kind::Active, "active", "", Labels::new(), ok)),
            Error::AlreadyExists(_)
        ));
        assert!(matches!(
            err(s.create(Kind::View, "base", "", Labels::new(), ok)),
            Error::AlreadyExists(_)
        ));
        assert!(matches!(
            err(s.create(Kind::Active, "x", "missing", Labels::new(), ok)),
            Error::NotFound(_)
        ));
        assert!(matches!(
            err(s.create(Kind::Active, "x", "active", Labels::new(), ok)),
            Error::InvalidArgument(_)
        ));
        assert!(matches!(
            err(s.create(Kind::Committed, "x", "", Labels::new(), ok)),
            Error::InvalidArgument(_)
        ));
        assert!(matches!(
            err(s.create(Kind::Active, "", "", Labels::new(), ok)),
            Error::InvalidArgument(_)
        ));
        let long = "x".repeat(MAX_LABEL);
        assert!(matches!(
            err(s.create(Kind::Active, "x", "", labels(&[("k", &long)]), ok)),
            Error::InvalidArgument(_)
        ));
    }

    #[test]
    fn a_failure_on_disk_records_nothing_and_burns_no_committed_id() {
        let (_d, s) = store();
        let e = s
            .create(Kind::Active, "k", "", Labels::new(), |_| {
                Err(Error::InvalidArgument("disk full".into()))
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        assert!(matches!(s.stat("k").unwrap_err(), Error::NotFound(_)));
        let snap = s.create(Kind::Active, "k", "", Labels::new(), ok).unwrap();
        assert_eq!(snap.id, 1, "the aborted transaction allocated nothing");
    }

    #[test]
    fn commit_rules_and_what_it_records() {
        let (_d, s) = store();
        s.create(Kind::Active, "k", "", labels(&[("inherited", "no")]), ok)
            .unwrap();
        s.create(Kind::View, "v", "", Labels::new(), ok).unwrap();
        layer(&s, "other-key", "taken", "");
        let usage = |_| {
            Ok(Usage {
                size: 4096,
                inodes: 3,
            })
        };
        assert!(matches!(
            s.commit("k", "taken", Labels::new(), usage).unwrap_err(),
            Error::AlreadyExists(_)
        ));
        assert!(matches!(
            s.commit("missing", "n", Labels::new(), usage).unwrap_err(),
            Error::NotFound(_)
        ));
        assert!(matches!(
            s.commit("v", "n", Labels::new(), usage).unwrap_err(),
            Error::FailedPrecondition(_)
        ));
        assert!(matches!(
            s.commit("taken", "n2", Labels::new(), usage).unwrap_err(),
            Error::FailedPrecondition(_)
        ));
        let before = s.stat("k").unwrap();
        let id = s
            .commit("k", "layer", labels(&[("new", "yes")]), usage)
            .unwrap();
        assert!(matches!(s.stat("k").unwrap_err(), Error::NotFound(_)));
        let info = s.stat("layer").unwrap();
        assert_eq!(info.kind, Kind::Committed);
        assert_eq!(info.labels, labels(&[("new", "yes")]));
        assert!(info.created >= before.created);
        let (snap, u) = s.usage("layer").unwrap();
        assert_eq!(snap.id, id);
        assert_eq!((u.size, u.inodes), (4096, 3));
    }

    #[test]
    fn remove_refuses_parents_and_forgets_the_link_of_children() {
        let (_d, s) = store();
        layer(&s, "a-key", "a", "");
        s.create(Kind::Active, "child", "a", Labels::new(), ok)
            .unwrap();
        assert!(matches!(
            s.remove("a").unwrap_err(),
            Error::FailedPrecondition(_)
        ));
        // A child committed under a new name still holds its parent.
        s.commit("child", "child-layer", Labels::new(), |_| {
            Ok(Usage::default())
        })
        .unwrap();
        assert!(matches!(
            s.remove("a").unwrap_err(),
            Error::FailedPrecondition(_)
        ));
        assert_eq!(s.remove("child-layer").unwrap().1, Kind::Committed);
        let (id, kind) = s.remove("a").unwrap();
        assert_eq!((id, kind), (1, Kind::Committed));
        assert!(matches!(s.remove("a").unwrap_err(), Error::NotFound(_)));
        assert!(s.list().unwrap().is_empty());
    }

    #[test]
    fn update_takes_a_field_mask() {
        let (_d, s) = store();
        s.create(Kind::Active, "k", "", labels(&[("a", "1"), ("b", "2")]), ok)
            .unwrap();
        let mut info = s.stat("k").unwrap();
        info.labels = labels(&[("a", "10"), ("c", "3")]);
        // One label, then the removal of another (its value absent from the request).
        let u = s
            .update(&info, &["labels.a".into(), "labels.b".into()])
            .unwrap();
        assert_eq!(u.labels, labels(&[("a", "10")]));
        assert!(u.updated >= u.created);
        // All labels.
        let u = s.update(&info, &["labels".into()]).unwrap();
        assert_eq!(u.labels, info.labels);
        // No mask: the labels.
        info.labels = labels(&[("z", "26"), ("empty", "")]);
        assert_eq!(s.update(&info, &[]).unwrap().labels, labels(&[("z", "26")]));
        assert!(matches!(
            s.update(&info, &["parent".into()]).unwrap_err(),
            Error::InvalidArgument(_)
        ));
        info.name = "missing".into();
        assert!(matches!(
            s.update(&info, &[]).unwrap_err(),
            Error::NotFound(_)
        ));
        assert_eq!(s.stat("k").unwrap().labels, labels(&[("z", "26")]));
    }

    #[test]
    fn records_survive_a_reopen_and_ids_are_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.redb");
        {
            let s = Store::open(&path).unwrap();
            layer(&s, "a-key", "a", "");
            layer(&s, "b-key", "b", "a");
            s.remove("b").unwrap();
        }
        let s = Store::open(&path).unwrap();
        let names: Vec<String> = s.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["a"]);
        let c = s.create(Kind::Active, "c", "a", Labels::new(), ok).unwrap();
        assert_eq!(c.id, 3);
        let ids = s.with_ids_locked(|ids| Ok(ids.clone())).unwrap();
        assert_eq!(ids, HashSet::from([1, 3]));
    }

    #[test]
    fn info_fields_for_filters() {
        let (_d, s) = store();
        layer(&s, "a-key", "a", "");
        s.create(Kind::Active, "k", "a", labels(&[("x.y", "1")]), ok)
            .unwrap();
        let f =
            crate::snapshot::filter::Filters::parse_all(&["kind==active,parent==a,labels.x.y==1"])
                .unwrap();
        let hits: Vec<String> = s
            .list()
            .unwrap()
            .into_iter()
            .filter(|i| f.matches(i))
            .map(|i| i.name)
            .collect();
        assert_eq!(hits, ["k"]);
    }
}
