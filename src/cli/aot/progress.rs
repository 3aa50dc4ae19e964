//! The progress bar on stderr while graphs are found and compiled (indicatif). On a terminal it
//! redraws in place; elsewhere (CI logs, `2>file`) it prints a plain line every 2 s when the
//! counts changed, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::jobs::{Outcome, PoolSummary};

/// The counts after the bar: `found .. | compiled .. | cached .. | failed .. | ...`.
pub fn counts(s: &PoolSummary, queued: usize, running: usize) -> String {
    let found = s.graphs.len() + queued + running;
    let mut text = format!(
        "found {found} | compiled {} | cached {} | failed {}",
        s.count(Outcome::Compiled),
        s.count(Outcome::Cached),
        s.count(Outcome::Failed),
    );
    let read_only = s.count(Outcome::ReadOnly);
    if read_only > 0 {
        text.push_str(&format!(" | not stored (read-only) {read_only}"));
    }
    text.push_str(&format!(" | running {running} | queued {queued}"));
    text
}

/// The bar of one run.
pub struct Progress {
    bar: Option<ProgressBar>,
    last: Instant,
    last_text: String,
}

impl Progress {
    /// A bar on stderr; none for a dry run (nothing is compiled).
    pub fn new(dry_run: bool) -> Progress {
        let bar = (std::io::stderr().is_terminal() && !dry_run).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("[{bar:24}] {pos}/{len} | {msg} ({elapsed})")
                    .expect("the template is valid")
                    .progress_chars("#>-"),
            );
            bar
        });
        Progress {
            bar,
            last: Instant::now(),
            last_text: String::new(),
        }
    }

    /// Shows the current counts; `last` ends the bar.
    pub fn show(&mut self, s: &PoolSummary, queued: usize, running: usize, last: bool) {
        let text = counts(s, queued, running);
        let done = s.graphs.len() as u64;
        let found = done + (queued + running) as u64;
        if let Some(bar) = &self.bar {
            bar.set_length(found);
            bar.set_position(done);
            bar.set_message(text.clone());
            if last {
                bar.finish();
            }
        } else if text != self.last_text && (last || self.last.elapsed() >= Duration::from_secs(2))
        {
            let _ = writeln!(
                std::io::stderr(),
                "[neuron-pc compile] {done}/{found} | {text}"
            );
            self.last = Instant::now();
        }
        self.last_text = text;
    }
}

#[cfg(test)]
mod tests {
    use super::super::jobs::{GraphJob, GraphReport};
    use super::*;

    #[test]
    fn the_counts_cover_settled_running_and_queued_graphs() {
        let job = GraphJob {
            key: neuron_pc_cache::EntryKey::parse(&"ab".repeat(32)).unwrap(),
            mlir: Default::default(),
            nodes: 0,
            origin: String::new(),
            replicas: Vec::new(),
            partitioned: false,
        };
        let g = |o| GraphReport::new(&job, o, 0.0, None);
        let mut s = PoolSummary {
            graphs: vec![g(Outcome::Compiled), g(Outcome::Cached), g(Outcome::Failed)],
            ..PoolSummary::default()
        };
        // 3 settled, 2 running, 1 queued: 6 found.
        assert_eq!(
            counts(&s, 1, 2),
            "found 6 | compiled 1 | cached 1 | failed 1 | running 2 | queued 1"
        );
        s.graphs.push(g(Outcome::ReadOnly));
        assert_eq!(
            counts(&s, 0, 0),
            "found 4 | compiled 1 | cached 1 | failed 1 | not stored (read-only) 1 | \
             running 0 | queued 0"
        );
    }
}
