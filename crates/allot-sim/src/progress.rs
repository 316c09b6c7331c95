//! A progress bar for long simulator runs: drawn on stderr only when stderr is a terminal and
//! the run has already taken more than [`SHOW_AFTER`]; silent otherwise (pipes, CI, tests).
//!
//! This is the one place in `allot-sim` that reads the wall clock: a progress bar is about
//! elapsed real time by nature. The simulation itself runs on its virtual clock and never sees
//! this one, so progress cannot change a result.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// A run shorter than this never shows a bar.
pub const SHOW_AFTER: Duration = Duration::from_secs(1);
/// `inc` looks at the clock at least once per this many calls. Small on purpose: one look per
/// 4,096 calls is already negligible, and a loop that turns slow after a fast phase is seen
/// again after at most this many calls.
const STRIDE_MAX: u64 = 1 << 12;
/// Between those bounds the stride adapts so that looks are about this far apart.
const LOOK_GAP_MIN: Duration = Duration::from_millis(10);
const LOOK_GAP_MAX: Duration = Duration::from_millis(100);

/// Progress of `total` steps, labelled. Cheap to [`inc`](Progress::inc) millions of times and
/// from several threads (`&self`, atomics): the count is one atomic add; the clock is read and
/// the bar updated only every `stride` calls (1 to 4,096), the stride doubling while looks come
/// less than 10 ms apart and halving when they come more than 100 ms apart.
///
/// The bar starts hidden and switches to stderr on the first look after [`SHOW_AFTER`], and only
/// if stderr is a terminal. [`finish`](Progress::finish) (or dropping) clears it, so the
/// results printed next stand alone.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    /// stderr is a terminal and the bar is not shown yet.
    may_show: AtomicBool,
    position: AtomicU64,
    /// Calls left before the next look at the clock.
    calls_left: AtomicU64,
    stride: AtomicU64,
    /// Nanoseconds since `started` at the last look.
    last_look_ns: AtomicU64,
}

impl Progress {
    pub fn new(total: u64, label: &str) -> Progress {
        let style = ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden())
            .with_style(style)
            .with_prefix(label.to_owned())
            .with_finish(ProgressFinish::AndClear);
        Progress {
            bar,
            // Wall clock on purpose: see the module comment. The simulation core never reads it.
            #[allow(clippy::disallowed_methods)]
            started: Instant::now(),
            may_show: AtomicBool::new(std::io::stderr().is_terminal()),
            position: AtomicU64::new(0),
            calls_left: AtomicU64::new(1),
            stride: AtomicU64::new(1),
            last_look_ns: AtomicU64::new(0),
        }
    }

    /// `n` more steps done.
    pub fn inc(&self, n: u64) {
        self.position.fetch_add(n, Relaxed);
        // Only the call that takes the countdown from 1 to 0 looks at the clock; a concurrent
        // call that finds it at 0 wraps it, and the look below resets it either way.
        if self.calls_left.fetch_sub(1, Relaxed) != 1 {
            return;
        }
        self.look();
    }

    fn look(&self) {
        let elapsed = self.started.elapsed();
        let now_ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let gap =
            Duration::from_nanos(now_ns.saturating_sub(self.last_look_ns.swap(now_ns, Relaxed)));
        let stride = self.stride.load(Relaxed);
        let stride = if gap < LOOK_GAP_MIN {
            (stride * 2).min(STRIDE_MAX)
        } else if gap > LOOK_GAP_MAX {
            (stride / 2).max(1)
        } else {
            stride
        };
        self.stride.store(stride, Relaxed);
        self.calls_left.store(stride, Relaxed);
        if elapsed >= SHOW_AFTER && self.may_show.swap(false, Relaxed) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.set_position(self.position.load(Relaxed));
    }

    /// Steps counted so far.
    pub fn position(&self) -> u64 {
        self.position.load(Relaxed)
    }

    /// The run is over: clear the bar if it was shown.
    pub fn finish(&self) {
        self.bar.set_position(self.position.load(Relaxed));
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_increment_and_finishes_quietly() {
        let progress = Progress::new(3_000_000, "test");
        for _ in 0..3_000_000 {
            progress.inc(1);
        }
        progress.inc(0);
        assert_eq!(progress.position(), 3_000_000);
        // A fast loop stops reading the clock on every call.
        assert!(progress.stride.load(Relaxed) > 1);
        progress.finish();
    }

    #[test]
    fn counts_across_threads() {
        let progress = Progress::new(0, "");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        progress.inc(2);
                    }
                });
            }
        });
        assert_eq!(progress.position(), 800_000);
        progress.finish();
    }
}
