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
