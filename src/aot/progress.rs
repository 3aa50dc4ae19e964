//! The progress bar on stderr while graphs are found and compiled: redrawn in place on a
//! terminal, else a plain line every 2 s when something changed (logs stay readable).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::pool::PoolSummary;

const WIDTH: usize = 24;

/// Draws `[####----] done/found | found .. | compiled .. | ...`.
pub struct Progress {
    tty: bool,
    last: Instant,
    last_text: String,
}

/// The bar's text for these counts (`done` of `found` graphs settled).
pub fn line(s: &PoolSummary, queued: usize, running: usize) -> String {
    let count = |o: &str| s.graphs.iter().filter(|g| g.outcome == o).count();
    let found = s.graphs.len() + queued + running;
    let done = s.graphs.len();
    let filled = (done * WIDTH).checked_div(found).unwrap_or(0);
    format!(
        "[{}{}] {done}/{found} | found {found} | compiled {} | cached {} | failed {} | running {running} | queued {queued}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        count("compiled"),
        count("cached"),
        count("failed"),
    )
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            last_text: String::new(),
        }
    }

    /// Shows the current counts; `last` ends the bar's line.
    pub fn show(&mut self, s: &PoolSummary, queued: usize, running: usize, last: bool) {
        let text = line(s, queued, running);
        let mut err = std::io::stderr();
        if self.tty {
            if text != self.last_text || last {
                let _ = write!(err, "\r\x1b[2K{text}");
                if last {
                    let _ = writeln!(err);
                }
            }
        } else if text != self.last_text && (last || self.last.elapsed() >= Duration::from_secs(2))
        {
            let _ = writeln!(err, "[neuron-pc compile] {text}");
            self.last = Instant::now();
        } else {
            return;
        }
        self.last_text = text;
    }
}

#[cfg(test)]
mod tests {
    use super::super::pool::GraphReport;
    use super::*;

    #[test]
    fn the_bar_counts_settled_graphs_of_all_found() {
        let g = |outcome| GraphReport {
            key: String::new(),
            nodes: 0,
            origin: String::new(),
            outcome,
            compile_ms: 0.0,
            cpu_ms: 0.0,
            message: None,
        };
        let s = PoolSummary {
            graphs: vec![g("compiled"), g("cached"), g("failed")],
            ..PoolSummary::default()
        };
        // 3 settled, 2 running, 1 queued: half of the 6 found.
        assert_eq!(
            line(&s, 1, 2),
            format!(
                "[{}{}] 3/6 | found 6 | compiled 1 | cached 1 | failed 1 | running 2 | queued 1",
                "#".repeat(12),
                "-".repeat(12)
            )
        );
    }
}
