//! The parallel index pipeline of a scan: [`IndexStream`] opens and indexes archives on
//! worker threads and hands the results out in layer order, at most [`INDEX_WINDOW`]
//! archives ahead of the thread that folds them into the tree; on a live mount,
//! [`Background`] indexes the archives that need a long pass on the `pkgfs-index` thread
//! instead.
//!
//! Indexing waits on the disk (or the network), the tree builder on the CPU: the two
//! overlap, and the builder is the critical path. Nothing here knows of layouts or the
//! tree; the scan says what to index ([`Job`]) and what to do with each result.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use log::info;

use crate::error::{Error, Result};
use crate::format::{Archive, Entry, IndexCache, Indexed, OpenContext, OpenError};

use super::candidate::{Candidate, Stamp};

/// Archives indexed ahead of the tree builder, at most: the raw entries waiting to be
/// folded into the tree are bounded by this many archives, whatever the source holds.
pub(super) const INDEX_WINDOW: usize = 256;

/// Indexing threads when remote archives are opened (each waits on the network).
pub(super) const REMOTE_INDEX_THREADS: usize = 256;

/// Work for an [`IndexStream`]: an archive to open and index, or one kept from the
/// previous scan (unchanged) whose index is read again.
pub(super) enum Job<'a> {
    Open(&'a Candidate),
    /// A kept archive, with what its image promised of it if it is a layer.
    Reindex(&'a Arc<Archive>, Option<&'a Candidate>),
}

/// What an [`IndexStream`] hands out: an archive, its entries, and what the layout
/// learnt of it.
pub(super) type Opened =
    std::result::Result<(Arc<Archive>, Vec<Entry>, crate::layout::Facts), OpenError>;

/// An archive and its entries, or why not.
pub(super) type Entries = std::result::Result<(Arc<Archive>, Vec<Entry>), OpenError>;

/// Archives being opened and indexed on worker threads while the caller folds the ones
/// already indexed into the tree, in order: the workers mostly wait on the disk (reading
/// the indexes) and the builder on the CPU, so the two overlap.
///
/// [`IndexStream::next`] hands the results out in candidate order. At most `window`
/// archives are indexed ahead of the last one handed out. A panic while indexing one
/// archive becomes that archive's error. Dropping the stream stops the workers after
/// the archive each is on.
pub(super) struct IndexStream<'a> {
    shared: &'a StreamState,
}

/// What the workers and the consumer of an [`IndexStream`] share.
pub(super) struct StreamState {
    slots: Mutex<Slots>,
    /// A slot was filled.
    filled: std::sync::Condvar,
    /// The consumer took a slot (room for the workers) or stopped.
    room: std::sync::Condvar,
    window: usize,
}

pub(super) struct Slots {
    results: Vec<Option<Opened>>,
    /// Next candidate to claim.
    pub(super) next: usize,
    /// Results handed out so far.
    taken: usize,
    stopped: bool,
}

impl StreamState {
    /// State for `n` candidates, indexing at most `window` ahead of the consumer.
    pub(super) fn new(n: usize, window: usize) -> Self {
        StreamState {
            slots: Mutex::new(Slots {
                results: (0..n).map(|_| None).collect(),
                next: 0,
                taken: 0,
                stopped: false,
            }),
            filled: std::sync::Condvar::new(),
            room: std::sync::Condvar::new(),
            window: window.max(1),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        crate::sync::lock(&self.slots)
    }
}

/// Open and index a new archive, or re-read the index of a kept one.
pub(super) fn index_job(job: &Job, cx: &OpenContext) -> Entries {
    match *job {
        Job::Open(cand) => {
            let Indexed { archive, entries } = cand.open(cx)?;
            Ok((Arc::new(archive), entries))
        }
        Job::Reindex(archive, cand) => {
            // A kept archive's index costs no pass (it was made once): never deferred.
            // A layer's index is found under the digest that was checked.
            let cx = OpenContext {
                defer_over: None,
                progress: None,
                layer: cand.and_then(|c| c.layer.as_ref()).map(|l| &l.check),
                ..*cx
            };
            match archive.entries(&cx) {
                Ok(entries) => Ok((archive.clone(), entries)),
                Err(e) => Err(OpenError::Bad(e)),
            }
        }
    }
}

impl<'a> IndexStream<'a> {
    /// Start `threads` workers in `scope` doing `work` (normally [`index_job`]) on `jobs`.
    pub(super) fn start<'s>(
        scope: &'s std::thread::Scope<'s, 'a>,
        shared: &'a StreamState,
        jobs: &'a [Job<'a>],
        threads: usize,
        work: &'a (dyn Fn(&Job<'a>) -> Opened + Sync),
    ) -> Self {
        let workers = threads.clamp(1, jobs.len().max(1));
        for _ in 0..workers {
            scope.spawn(move || {
                loop {
                    let i = {
                        let mut s = shared.lock();
                        while !s.stopped && s.next < jobs.len() && s.next >= s.taken + shared.window
                        {
                            s = crate::sync::wait(&shared.room, s);
                        }
                        if s.stopped || s.next >= jobs.len() {
                            return;
                        }
                        s.next += 1;
                        s.next - 1
                    };
                    let r =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&jobs[i])))
                            .unwrap_or_else(|_| {
                                Err(OpenError::Bad(Error::Format(
                                    "internal error while indexing (a bug: please report it)"
                                        .into(),
                                )))
                            });
                    shared.lock().results[i] = Some(r);
                    // One consumer waits on `filled`.
                    shared.filled.notify_one();
                }
            });
        }
        IndexStream { shared }
    }

    /// The next job's result, waiting for it if a worker is still on it.
    pub(super) fn next(&mut self) -> Option<Opened> {
        let mut s = self.shared.lock();
        let i = s.taken;
        if i >= s.results.len() {
            return None;
        }
        let r = loop {
            if let Some(r) = s.results[i].take() {
                break r;
            }
            s = crate::sync::wait(&self.shared.filled, s);
        };
        s.taken += 1;
        drop(s);
        // One slot freed: one worker to take it (waking all of them, hundreds for a
        // remote source, costs more than the indexing).
        self.shared.room.notify_one();
        Some(r)
    }
}

impl Drop for IndexStream<'_> {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.room.notify_all();
    }
}

/// On a live mount, an archive larger than this whose index needs a pass over its data
/// is indexed in the background instead of holding up the rescan (and with it every
/// other change): about half a second of decoding on one core.
pub const BACKGROUND_OVER: u64 = 32 << 20;

/// What a background index pass gave: an archive and its entries, or why not.
pub(super) type Indexing = std::result::Result<(Arc<Archive>, Vec<Entry>), Error>;

/// Archives a rescan left to the background indexer, with their stamps.
pub(super) type Deferred = Vec<(Candidate, Option<Stamp>)>;

/// Archives indexed by the `pkgfs-index` thread, for the next rescan to take.
pub(super) struct Background {
    jobs: std::sync::mpsc::Sender<Candidate>,
    /// Results by path (the archive knows the version it was made of).
    ready: Arc<Mutex<HashMap<PathBuf, Indexing>>>,
    /// Paths queued and not taken yet, with the stamp they were queued at.
    queued: HashMap<PathBuf, Option<Stamp>>,
}

impl Background {
    /// Start the `pkgfs-index` thread: it opens and indexes what it is sent (with
    /// `index_cache`, never deferred) and wakes `waker` each time one is ready.
    pub(super) fn start(
        index_cache: Option<IndexCache>,
        waker: super::watch::Waker,
    ) -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Candidate>();
        let ready: Arc<Mutex<HashMap<PathBuf, Indexing>>> = Arc::default();
        let done = ready.clone();
        std::thread::Builder::new()
            .name("pkgfs-index".into())
            .spawn(move || {
                for cand in rx {
                    let path = cand.path.clone();
                    info!("indexing {} in the background", path.display());
                    let cx = OpenContext {
                        index_cache: index_cache.as_ref(),
                        ..OpenContext::default()
                    };
                    let opened =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cand.open(&cx)));
                    let r = match opened {
                        Ok(Ok(Indexed { archive, entries })) => Ok((Arc::new(archive), entries)),
                        Ok(Err(OpenError::Bad(e))) => Err(e),
                        Ok(Err(OpenError::NotAnArchive)) => {
                            Err(Error::Format("not an archive".into()))
                        }
                        Err(_) => Err(Error::Internal("indexing panicked".into())),
                    };
                    crate::sync::lock(&done).insert(path, r);
                    waker.wake();
                }
            })
            .map_err(Error::Io)?;
        Ok(Background {
            jobs: tx,
            ready,
            queued: HashMap::new(),
        })
    }

    /// What the thread has finished since the last call, taken: those paths are no
    /// longer queued.
    pub(super) fn take_ready(&mut self) -> HashMap<PathBuf, Indexing> {
        let done = std::mem::take(&mut *crate::sync::lock(&self.ready));
        for p in done.keys() {
            self.queued.remove(p);
        }
        done
    }

    /// Whether `path` is queued at stamp `st` (still being indexed).
    pub(super) fn is_queued(&self, path: &Path, st: &Option<Stamp>) -> bool {
        self.queued.get(path).is_some_and(|q| q == st)
    }

    /// Paths queued and not taken yet, in order.
    pub(super) fn pending(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.queued.keys().cloned().collect();
        v.sort();
        v
    }

    /// Queue the archives a rescan deferred, each once for the stamp it has.
    pub(super) fn queue(&mut self, deferred: Deferred) {
        for (cand, st) in deferred {
            let path = cand.path.clone();
            if self.queued.get(&path) != Some(&st) && self.jobs.send(cand).is_ok() {
                self.queued.insert(path, st);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::tests::{candidates, write_zip};
    use std::path::Path;

    fn with_no_facts(r: Entries) -> Opened {
        r.map(|(a, e)| (a, e, crate::layout::Facts::default()))
    }

    /// Package `i` of `packages`: `i % 5 + 1` files, or garbage when `i % 7 == 3`.
    fn packages(dir: &Path, n: usize) -> Vec<PathBuf> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("p{i:02}.zip"));
                if i % 7 == 3 {
                    std::fs::write(&p, b"not an archive at all").unwrap();
                } else {
                    let files: Vec<_> = (0..i % 5 + 1)
                        .map(|j| (format!("p{i}/f{j}"), format!("{i}.{j}").into_bytes()))
                        .collect();
                    write_zip(&p, &files);
                }
                p
            })
            .collect()
    }

    #[test]
    fn the_stream_hands_out_every_archive_in_order_whatever_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 40);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        for window in [1, 2, 5, 64] {
            let shared = StreamState::new(jobs.len(), window);
            let work = |job: &Job| with_no_facts(index_job(job, &OpenContext::default()));
            let got: Vec<Opened> = std::thread::scope(|s| {
                let mut stream = IndexStream::start(s, &shared, &jobs, 4, &work);
                std::iter::from_fn(|| stream.next()).collect()
            });
            assert_eq!(got.len(), paths.len(), "window {window}");
            for (i, r) in got.iter().enumerate() {
                match r {
                    Ok((a, entries, _)) => {
                        assert_eq!(a.path, paths[i], "window {window}");
                        assert_eq!(entries.len(), i % 5 + 1, "window {window}");
                    }
                    Err(_) => assert_eq!(i % 7, 3, "window {window}: {i} failed"),
                }
            }
        }
    }

    #[test]
    fn a_stream_dropped_early_stops_its_workers() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 30);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        let shared = StreamState::new(jobs.len(), 2);
        let work = |job: &Job| with_no_facts(index_job(job, &OpenContext::default()));
        // The scope joins the workers: it returns only if they stop.
        std::thread::scope(|s| {
            let mut stream = IndexStream::start(s, &shared, &jobs, 3, &work);
            assert!(stream.next().is_some());
        });
        let claimed = shared.lock().next;
        assert!(
            claimed <= 3,
            "{claimed} claimed: the window (2) did not hold"
        );
    }

    #[test]
    fn a_panic_while_indexing_is_that_archive_s_error_and_the_rest_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let paths = packages(dir.path(), 12);
        let cands = candidates(&paths);
        let jobs: Vec<Job> = cands.iter().map(Job::Open).collect();
        let shared = StreamState::new(jobs.len(), 3);
        let work = |job: &Job| {
            if let Job::Open(c) = job
                && c.path.ends_with("p05.zip")
            {
                panic!("injected");
            }
            with_no_facts(index_job(job, &OpenContext::default()))
        };
        let got: Vec<Opened> = std::thread::scope(|s| {
            let mut stream = IndexStream::start(s, &shared, &jobs, 2, &work);
            std::iter::from_fn(|| stream.next()).collect()
        });
        assert_eq!(got.len(), 12);
        for (i, r) in got.iter().enumerate() {
            match (i, r) {
                (5, Err(OpenError::Bad(e))) => assert!(e.to_string().contains("internal error")),
                (5, _) => panic!("the panicking archive is not an error"),
                (3 | 10, r) => assert!(r.is_err(), "{i}: garbage"),
                (_, r) => assert!(r.is_ok(), "{i}"),
            }
        }
    }
}
