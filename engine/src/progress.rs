//! Progress for people: bars on a terminal, periodic log lines elsewhere.
//!
//! Stages report items done through [`StageProgress`]; the runner reports steps. Whether that
//! becomes an indicatif bar or a `tracing` line every few seconds is decided once, by the
//! binary, when it creates the [`Progress`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Live bars on stderr (a terminal).
    Bars,
    /// A log line per step and, for long stages, every few seconds.
    Lines,
    /// Nothing (tests, benchmarks).
    Hidden,
}

/// The progress display of a run.
#[derive(Clone)]
pub struct Progress {
    mode: ProgressMode,
    bars: MultiProgress,
    steps: Arc<Mutex<Option<ProgressBar>>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Progress({:?})", self.mode)
    }
}

const LINE_INTERVAL: Duration = Duration::from_secs(5);

impl Progress {
    /// A display in `mode`.
    pub fn new(mode: ProgressMode) -> Progress {
        let target = match mode {
            ProgressMode::Bars => ProgressDrawTarget::stderr(),
            _ => ProgressDrawTarget::hidden(),
        };
        Progress { mode, bars: MultiProgress::with_draw_target(target), steps: Arc::default() }
    }

    /// Runs `f` with the bars hidden, so that a log line does not tear them.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bars.suspend(f)
    }

    pub(crate) fn start_steps(&self, total: u64, done: u64) {
        if self.mode != ProgressMode::Bars {
            return;
        }
        let bar = self.bars.add(ProgressBar::new(total));
        bar.set_style(
            ProgressStyle::with_template("steps {bar:30} {pos}/{len} [{elapsed_precise}, eta {eta}] {msg}")
                .expect("the template is valid"),
        );
        bar.set_position(done);
        *self.steps.lock().expect("progress lock") = Some(bar);
    }

    pub(crate) fn step_done(&self, step: u64, message: &str) {
        if let Some(bar) = self.steps.lock().expect("progress lock").as_ref() {
            bar.set_position(step);
            bar.set_message(message.to_string());
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = self.steps.lock().expect("progress lock").take() {
            bar.finish();
        }
    }

    /// A progress display for `total` units of one task (a stage, an index build).
    pub fn task(&self, stage: &str, total: u64) -> StageProgress {
        let bar = (self.mode == ProgressMode::Bars).then(|| {
            let bar = self.bars.add(ProgressBar::new(total));
            bar.set_style(
                ProgressStyle::with_template("  {prefix:>12} {bar:30} {pos}/{len} {per_sec} eta {eta}")
                    .expect("the template is valid"),
            );
            bar.set_prefix(stage.to_string());
            bar
        });
        StageProgress {
            stage: stage.to_string(),
            total,
            done: 0,
            started: Instant::now(),
            last_line: Instant::now(),
            lines: self.mode == ProgressMode::Lines,
            bar,
        }
    }
}

/// Items done out of a total, for one stage. Dropping it removes its bar.
pub struct StageProgress {
    stage: String,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
    lines: bool,
    bar: Option<ProgressBar>,
}

impl StageProgress {
    /// Records `n` more items done.
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
        if self.lines && self.last_line.elapsed() >= LINE_INTERVAL {
            self.last_line = Instant::now();
            let elapsed = self.started.elapsed().as_secs_f64();
            let rate = self.done as f64 / elapsed.max(1e-9);
            let eta = (self.total.saturating_sub(self.done)) as f64 / rate.max(1e-9);
            tracing::info!(
                stage = %self.stage,
                done = self.done,
                total = self.total,
                rate = format!("{rate:.1}/s"),
                eta = format!("{eta:.0}s"),
                "progress"
            );
        }
    }
}

impl Drop for StageProgress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
