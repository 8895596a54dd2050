//! Progress bars with ETA on stderr, for any stage that runs longer than a
//! second. A bar is created hidden; a watcher thread shows it (redrawn every
//! 200 ms) once its stage has run for one second, so quick runs print
//! nothing; when stderr is not a terminal (pipes, CI, tests) nothing is ever
//! drawn and no watcher is started. Bars are cheap to clone and safe to
//! advance from rayon worker threads.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const DELAY: Duration = Duration::from_secs(1);

/// Creates stage bars; disabled when not a TTY or asked to be quiet.
#[derive(Clone)]
pub struct Progress {
    enabled: bool,
}

impl Progress {
    /// Bars on stderr if it is a terminal and `quiet` is false.
    pub fn new(quiet: bool) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Never draws.
    pub fn hidden() -> Progress {
        Progress { enabled: false }
    }

    /// A bar for a stage of `total` units (`bytes`: shown as bytes/s).
    pub fn stage(&self, name: &str, total: u64, bytes: bool) -> Bar {
        let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        let template = if bytes {
            "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}"
        } else {
            "{prefix:>12} [{bar:30}] {pos}/{len} ETA {eta}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_prefix(name.to_string());
        let bar = Bar {
            pb,
            shown: Arc::new(AtomicBool::new(false)),
            finished: Arc::new(AtomicBool::new(false)),
        };
        if self.enabled {
            let b = bar.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                while start.elapsed() < DELAY {
                    if b.finished.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
                if !b.finished.load(Ordering::Relaxed) {
                    b.shown.store(true, Ordering::Relaxed);
                    b.pb.set_draw_target(ProgressDrawTarget::stderr());
                    b.pb.enable_steady_tick(Duration::from_millis(200));
                }
            });
        }
        bar
    }

    /// A one-line note on stderr (only when bars are enabled).
    pub fn note(&self, msg: &str) {
        if self.enabled {
            eprintln!("{msg}");
        }
    }
}

#[derive(Clone)]
pub struct Bar {
    pb: ProgressBar,
    shown: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
}

impl Bar {
    pub fn inc(&self, n: u64) {
        self.pb.inc(n);
    }

    pub fn finish(&self) {
        self.finished.store(true, Ordering::Relaxed);
        if self.shown.load(Ordering::Relaxed) {
            self.pb.finish_and_clear();
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // The last handle (the watcher holds one) going away ends the bar.
        if Arc::strong_count(&self.finished) == 1 {
            self.finished.store(true, Ordering::Relaxed);
        }
    }
}
