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
        match self.rate() {
            Some(tps) => format!("{loss} | {tps:.0} tokens/s"),
            None => loss,
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
