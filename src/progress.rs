//! Progress on a terminal for long work: the index passes of a first mount (large gzip
//! tarballs), and `pkgfs pack`.
//!
//! Bars are drawn on standard error, only when it is a terminal (`indicatif` hides them
//! otherwise: a log, a pipe, a CI run see nothing), and never with `--quiet`
//! ([`set_quiet`]). A background mount's daemon draws them on the user's terminal until
//! the mount is ready; its standard error then goes to the log, and bars stop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::format::IndexProgress;

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: no progress at all.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

fn target() -> ProgressDrawTarget {
    if quiet() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// One bar per archive being indexed, for as long as its pass lasts.
pub struct IndexBars {
    multi: MultiProgress,
    bars: Mutex<HashMap<PathBuf, ProgressBar>>,
}

impl Default for IndexBars {
    fn default() -> Self {
        IndexBars {
            multi: MultiProgress::with_draw_target(target()),
            bars: Mutex::new(HashMap::new()),
        }
    }
}

impl IndexProgress for IndexBars {
    fn indexing(&self, name: &Path, done: u64, total: u64) {
        let mut bars = crate::sync::lock(&self.bars);
        let bar = bars.entry(name.to_path_buf()).or_insert_with(|| {
            let style = ProgressStyle::with_template(
                "indexing {msg}: {bytes} of {total_bytes} ({bytes_per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let file = name.file_name().unwrap_or(name.as_os_str());
            self.multi.add(
                ProgressBar::new(total)
                    .with_style(style)
                    .with_message(file.to_string_lossy().into_owned()),
            )
        });
        bar.set_position(done);
        if done >= total {
            bar.finish_and_clear();
            bars.remove(name);
        }
    }
}

/// A spinner counting what `pkgfs pack` has written: entries and bytes of data.
pub fn pack_spinner() -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} packing: {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    ProgressBar::with_draw_target(None, target()).with_style(style)
}
