//! What a training run shows of itself, for any training loop (the examples use these, and so
//! can a user's own): a progress bar on a terminal, plain lines elsewhere ([`Progress`]); and
//! its metrics in files the tools users already read: TensorBoard event files and a
//! JSON-lines log ([`RunLog`]). Feature `monitor` (in `cli`).
//!
//! ```no_run
//! # use neuron_pc::monitor::{metrics_scalars, Progress, RunLog};
//! # fn main() -> neuron_pc::Result<()> {
//! # let device = neuron_pc::LazyDevice::from_env()?;
//! let (steps, tokens_per_step) = (1000, 8 * 512);
//! let mut log = RunLog::create("runs/llama-1")?; // tensorboard --logdir runs
//! let mut progress = Progress::new("train", 0, steps).plain_every(50);
//! for step in 0..steps {
//!     // ... one step, then mark_step; `loss` read back every few steps ...
//!     let loss = 2.0;
//!     progress.step(step + 1, tokens_per_step, Some(loss));
//!     if (step + 1) % 10 == 0 {
//!         let mut values = vec![("train/loss", loss), ("train/learning_rate", 3e-4)];
//!         values.extend(metrics_scalars(&device.metrics()));
//!         log.log(step + 1, &values)?;
//!     }
//! }
//! progress.finish();
//! # Ok(()) }
//! ```

mod progress;
mod tensorboard;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use progress::{Progress, Work};

use crate::error::{Error, Result};
use crate::Metrics;

/// The JSON-lines log beside the event files.
pub const JSONL: &str = "metrics.jsonl";

/// A run's metrics, written as they come into a directory: a TensorBoard event file of its own
/// (`events.out.tfevents.*`; several runs, or a resumed one, each add one, as TensorBoard
/// expects) and `metrics.jsonl`, appended to, one object per logged step (`{"step": 100,
/// "wall_time": ..., "train/loss": 2.31, ...}`; a value that is not finite is `null`).
/// Every [`RunLog::log`] reaches the files, so `tensorboard --logdir` and `tail -f` follow a
/// run as it goes.
pub struct RunLog {
    dir: PathBuf,
    events: tensorboard::EventFile,
    jsonl: std::io::BufWriter<std::fs::File>,
}

impl RunLog {
    /// Starts logging into `dir` (created if needed).
    pub fn create(dir: impl AsRef<Path>) -> Result<RunLog> {
        let dir = dir.as_ref().to_path_buf();
        let at = |p: &Path| {
            let p = p.to_path_buf();
            move |source| Error::Io {
                path: Some(p),
                source,
            }
        };
        let events = tensorboard::EventFile::create(&dir).map_err(at(&dir))?;
        let path = dir.join(JSONL);
        let jsonl = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(at(&path))?;
        Ok(RunLog {
            dir,
            events,
            jsonl: std::io::BufWriter::new(jsonl),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This run's event file.
    pub fn event_file(&self) -> &Path {
        self.events.path()
    }

    /// Logs scalars `values` (TensorBoard tags such as `train/loss`) for `step`, to both files.
    pub fn log(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        let io = |path: PathBuf| {
            move |source| Error::Io {
                path: Some(path),
                source,
            }
        };
        let events = self.events.path().to_path_buf();
        self.events
            .scalars(step, values)
            .map_err(io(events.clone()))?;
        self.events.flush().map_err(io(events))?;
        let mut line = serde_json::Map::new();
        line.insert("step".into(), step.into());
        line.insert("wall_time".into(), tensorboard::now().into());
        for (tag, v) in values {
            // serde_json writes a non-finite number as null
            line.insert(tag.to_string(), (*v).into());
        }
        let jsonl = self.dir.join(JSONL);
        serde_json::to_writer(&mut self.jsonl, &line).map_err(|source| Error::Json {
            path: Some(jsonl.clone()),
            source,
        })?;
        self.jsonl.write_all(b"\n").map_err(io(jsonl.clone()))?;
        self.jsonl.flush().map_err(io(jsonl))
    }
}

/// The device metrics a run logs beside its loss, as TensorBoard tags: memory per device
/// (`memory/step_peak_mib`: the most a step needed at once; `memory/state_mib`: parameters,
/// optimizer state and kept gradients), the compile cache (`cache/hits`: graphs found compiled
/// in memory, on disk or remote; `cache/compiles`), and checkpoints (`checkpoint/saves`,
/// `checkpoint/write_ms` and `checkpoint/blocked_ms` so far).
pub fn metrics_scalars(m: &Metrics) -> Vec<(&'static str, f64)> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    vec![
        ("memory/step_peak_mib", mib(m.step_peak_bytes)),
        (
            "memory/state_mib",
            mib(m.parameter_bytes + m.optimizer_state_bytes + m.gradient_bytes),
        ),
        (
            "cache/hits",
            (m.memory_hits + m.disk_hits + m.remote_hits) as f64,
        ),
        ("cache/compiles", m.compiles as f64),
        ("checkpoint/saves", m.checkpoint_saves as f64),
        ("checkpoint/write_ms", m.checkpoint_write_ms),
        ("checkpoint/blocked_ms", m.checkpoint_blocked_ms),
    ]
}
