//! A training run's progress (indicatif): on a terminal, a bar on stderr that redraws in place
//! (step, loss, tokens/s, time left); elsewhere (CI logs, `2>file`) a plain line on stderr
//! every few steps, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress of steps `start..total`.
pub struct Progress {
    what: String,
    bar: Option<ProgressBar>,
    total: u64,
    every: u64,
    /// When the first step after `start` was counted, and the tokens since.
    since: Option<(Instant, u64)>,
    tokens: u64,
    loss: Option<f64>,
    note: Option<String>,
}

impl Progress {
    /// Progress of `what` (`train`) from step `start` (a resumed run's) to `total`: a bar when
    /// stderr is a terminal; otherwise plain lines, every `total / 20` steps unless
    /// [`Progress::plain_every`] says otherwise.
    pub fn new(what: &str, start: u64, total: u64) -> Progress {
        Self::with_terminal(what, start, total, std::io::stderr().is_terminal())
    }

    fn with_terminal(what: &str, start: u64, total: u64, terminal: bool) -> Progress {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} | {msg} | {elapsed} elapsed, {eta} left",
                )
                .expect("the template is valid")
                .progress_chars("#>-"),
            );
            bar.set_prefix(what.to_string());
            bar.set_position(start);
            bar
        });
        Progress {
            what: what.to_string(),
            bar,
            total,
            every: (total.saturating_sub(start) / 20).max(1),
            since: None,
            tokens: 0,
            loss: None,
            note: None,
        }
    }

    /// Plain lines every `every` steps (0: none) where there is no terminal.
    pub fn plain_every(mut self, every: u64) -> Progress {
        self.every = every;
        self
    }

    /// Whether it draws a bar (stderr is a terminal).
    pub fn is_bar(&self) -> bool {
        self.bar.is_some()
    }

    /// Step `step` (counted from 1) is done; it trained on `tokens` tokens; `loss`, when it was
    /// read back (a loss is read only every few steps: the last one stays shown).
    pub fn step(&mut self, step: u64, tokens: u64, loss: Option<f64>) {
        if loss.is_some() {
            self.loss = loss;
        }
        match self.since {
            // the first step's time is mostly compiling: the rate counts from its end
            None => self.since = Some((Instant::now(), step)),
            Some(_) => self.tokens += tokens,
        }
        let msg = self.message();
        match &self.bar {
            Some(bar) => {
                bar.set_position(step);
                bar.set_message(msg);
            }
            None if self.every > 0 && (step.is_multiple_of(self.every) || step == self.total) => {
                let left = self
                    .left(step)
                    .map_or_else(String::new, |s| format!(" | {s} left"));
                let _ = writeln!(
                    std::io::stderr(),
                    "[{}] step {step}/{} | {msg}{left}",
                    self.what,
                    self.total
                );
            }
            None => {}
        }
    }

    /// A note the bar shows after its numbers until it is replaced or cleared (`None`): what
    /// runs beside the steps, such as a checkpoint being written. Plain lines leave it out.
    pub fn note(&mut self, note: Option<String>) {
        if note == self.note {
            return;
        }
        self.note = note;
        if let Some(bar) = &self.bar {
            bar.set_message(self.message());
        }
    }

    /// Tokens per second since the first step counted.
    fn rate(&self) -> Option<f64> {
        let (at, _) = self.since?;
        let secs = at.elapsed().as_secs_f64();
        (secs > 0.0 && self.tokens > 0).then(|| self.tokens as f64 / secs)
    }

    fn message(&self) -> String {
        let loss = self
            .loss
            .map_or_else(|| "loss -".to_string(), |l| format!("loss {l:.4}"));
        let shown = match self.rate() {
            Some(tps) => format!("{loss} | {tps:.0} tokens/s"),
            None => loss,
        };
        match (&self.note, &self.bar) {
            (Some(note), Some(_)) => format!("{shown} | {note}"),
            _ => shown,
        }
    }

    /// The time left at `step`, from the steps timed so far.
    fn left(&self, step: u64) -> Option<String> {
        let (at, from) = self.since?;
        let timed = step.saturating_sub(from);
        if timed == 0 {
            return None;
        }
        let per_step = at.elapsed().as_secs_f64() / timed as f64;
        let secs = (per_step * self.total.saturating_sub(step) as f64).round() as u64;
        Some(format!("{}:{:02}", secs / 60, secs % 60))
    }

    /// Prints `line` on stdout without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    /// Ends the bar (leaving it drawn at its last state).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// The progress of one piece of work of known size in bytes (tokenizing a corpus, writing a
/// checkpoint): a bar on a terminal; elsewhere, once the work has run for a few seconds, a
/// plain line on stderr at each quarter (short work says nothing: its caller's summary line is
/// enough).
pub struct Work {
    what: String,
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    /// The next quarter a plain line is due at (1..=4).
    quarter: u64,
}

/// How long work runs before plain lines report it.
const PLAIN_AFTER_SECS: f64 = 2.0;

impl Work {
    /// Work on `total` bytes, named `what` (`tokenize docs.jsonl`).
    pub fn new(what: &str, total: u64) -> Work {
        Self::with_terminal(what, total, std::io::stderr().is_terminal())
    }

    fn with_terminal(what: &str, total: u64, terminal: bool) -> Work {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} | \
                     {decimal_bytes_per_sec} | {eta} left",
                )
                .expect("the template is valid")
                .progress_chars("#>-"),
            );
            bar.set_prefix(what.to_string());
            bar
        });
        Work {
            what: what.to_string(),
            bar,
            total,
            started: Instant::now(),
            quarter: 1,
        }
    }

    /// `done` bytes of the total are done.
    pub fn set(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let secs = self.started.elapsed().as_secs_f64();
        if let Some(line) = self.due(done, secs) {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }

    /// The plain line due at `done` bytes after `secs`: the last quarter passed since the last
    /// call, once the work has run [`PLAIN_AFTER_SECS`].
    fn due(&mut self, done: u64, secs: f64) -> Option<String> {
        let mut line = None;
        while self.quarter <= 4 && done * 4 >= self.quarter * self.total {
            self.quarter += 1;
            if secs >= PLAIN_AFTER_SECS {
                line = Some(self.plain(done, secs));
            }
        }
        line
    }

    /// `[tokenize x.jsonl] 50% | 12.3 of 24.6 MB | 6.1 MB/s`.
    fn plain(&self, done: u64, secs: f64) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        format!(
            "[{}] {}% | {:.1} of {:.1} MB | {:.1} MB/s",
            self.what,
            (100 * done).checked_div(self.total).unwrap_or(100),
            mb(done),
            mb(self.total),
            mb(done) / secs.max(1e-9)
        )
    }

    /// Ends the work: the bar is cleared (the caller says what was done).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_says_each_quarter_once_and_only_when_it_takes_a_while() {
        let mut w = Work::with_terminal("tokenize a.jsonl", 4_000_000, false);
        // quick work: quarters pass silently
        assert_eq!(w.due(1_000_000, 0.5), None);
        // then slow: the last quarter passed is said, once
        assert_eq!(
            w.due(2_600_000, 4.0).as_deref(),
            Some("[tokenize a.jsonl] 65% | 2.6 of 4.0 MB | 0.7 MB/s")
        );
        assert_eq!(w.due(2_900_000, 5.0), None);
        assert!(w
            .due(4_000_000, 6.0)
            .unwrap()
            .contains("100% | 4.0 of 4.0 MB"));
        assert_eq!(w.due(4_000_000, 7.0), None);
        // a bar's template is valid (it would panic here otherwise)
        let bar = Work::with_terminal("write", 10, true);
        assert!(bar.bar.is_some());
        bar.finish();
    }
}
