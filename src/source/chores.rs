//! The `pkgfs-chores` thread: work layouts ask for once a mount serves
//! ([`crate::layout::Chore`]: python's bytecode), run one at a time, in the order asked,
//! off the scan's and the readers' paths. A chore that fails or panics is logged; the
//! mount is not touched (what a chore makes reaches it as a source would).

use std::sync::Mutex;
use std::sync::mpsc::{Sender, channel};

use log::{debug, info, warn};

use crate::layout::Chore;
use crate::sync::lock;

/// The queue of the `pkgfs-chores` thread (started with the first chore).
#[derive(Default)]
pub struct Chores {
    tx: Mutex<Option<Sender<Box<dyn Chore>>>>,
}

impl Chores {
    /// Queue `list` behind what is queued already.
    pub fn run(&self, list: Vec<Box<dyn Chore>>) {
        if list.is_empty() {
            return;
        }
        let mut tx = lock(&self.tx);
        if tx.is_none() {
            let (t, rx) = channel::<Box<dyn Chore>>();
            let spawned = std::thread::Builder::new()
                .name("pkgfs-chores".into())
                .spawn(move || {
                    for chore in rx {
                        work(chore);
                    }
                });
            match spawned {
                Ok(_) => *tx = Some(t),
                Err(e) => {
                    warn!(
                        "cannot start the chores thread ({e}): {} chore(s) not done",
                        list.len()
                    );
                    return;
                }
            }
        }
        if let Some(t) = tx.as_ref() {
            for c in list {
                let _ = t.send(c);
            }
        }
    }
}

/// Run one chore, its failure or panic logged.
fn work(chore: Box<dyn Chore>) {
    let what = chore.describe();
    let started = std::time::Instant::now();
    debug!("{what}");
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| chore.run())) {
        Ok(Ok(Some(done))) => info!("{done} in {} ms", started.elapsed().as_millis()),
        Ok(Ok(None)) => debug!("nothing left to do: {what}"),
        Ok(Err(e)) => warn!("failed: {what}: {e}"),
        Err(_) => warn!("panicked: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    struct Count(Arc<AtomicUsize>, bool);

    impl Chore for Count {
        fn describe(&self) -> String {
            "counting".into()
        }
        fn run(self: Box<Self>) -> crate::error::Result<Option<String>> {
            if self.1 {
                panic!("a chore that panics");
            }
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
    }

    #[test]
    fn chores_run_in_order_and_a_panic_does_not_stop_the_thread() {
        let n = Arc::new(AtomicUsize::new(0));
        let chores = Chores::default();
        chores.run(vec![
            Box::new(Count(n.clone(), false)),
            Box::new(Count(n.clone(), true)),
        ]);
        chores.run(vec![Box::new(Count(n.clone(), false))]);
        let until = Instant::now() + Duration::from_secs(10);
        while n.load(Ordering::SeqCst) < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }
}
