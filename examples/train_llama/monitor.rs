//! `--tensorboard DIR` and the progress bar: what the run shows of itself while it trains,
//! through the library's `monitor` pieces (rank 0 only; a trial run shows and writes nothing);
//! and the matmul peak its model FLOPs utilisation is measured against.

use std::path::{Path, PathBuf};
use std::time::Instant;

use neuron_pc::monitor::{metrics_scalars, Progress, RunLog, Work};
use neuron_pc::nn::HostRng;
use neuron_pc::state::Checkpoints;
use neuron_pc::{HostTensor, LazyDevice};

/// The run's progress bar (or plain lines) and metrics log.
pub struct Monitor {
    progress: Option<Progress>,
    log: Option<RunLog>,
    /// At the last logged step: when, which step, and the tokens trained by then.
    last: (Instant, u64, u64),
    tokens: u64,
}

/// One logged step's values from the loop.
pub struct Logged {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    /// `None`: not computed (ZeRO-1 keeps no whole averaged gradient to take it of).
    pub grad_norm: Option<f64>,
}

impl Monitor {
    /// For steps `start..total`; plain progress lines every `every` steps without a terminal.
    pub fn new(
        tensorboard: Option<&PathBuf>,
        start: u64,
        total: u64,
        every: u64,
        shown: bool,
    ) -> anyhow::Result<Monitor> {
        let log = match tensorboard.filter(|_| shown) {
            Some(dir) => {
                let log = RunLog::create(dir)?;
                println!(
                    "metrics: {} (TensorBoard) and metrics.jsonl",
                    log.event_file().display()
                );
                Some(log)
            }
            None => None,
        };
        Ok(Monitor {
            progress: shown.then(|| Progress::new("train", start, total).plain_every(every)),
            log,
            last: (Instant::now(), start, 0),
            tokens: 0,
        })
    }

    /// Step `step` (from 1) trained `tokens` tokens; its loss when it was read.
    pub fn step(&mut self, step: u64, tokens: u64, loss: Option<f64>) {
        self.tokens += tokens;
        if self.last.1 + 1 == step && self.last.2 == 0 {
            // the first step's time is mostly compiling: the rates count from its end
            self.last = (Instant::now(), step, self.tokens);
        }
        if let Some(p) = &mut self.progress {
            p.step(step, tokens, loss.filter(|l| l.is_finite()));
        }
    }

    /// Shows checkpoint saves: on the bar while a thread writes one, then a line once each
    /// has ended.
    pub fn checkpoint(&mut self, ckpts: &mut Checkpoints) {
        let Some(p) = &mut self.progress else {
            return;
        };
        p.note(ckpts.writing().map(|s| {
            let pct = (100 * s.written).checked_div(s.total).unwrap_or(0);
            format!("checkpoint {} {pct}%", s.step)
        }));
        for s in ckpts.ended() {
            p.println(&match s.saved {
                true => format!(
                    "checkpoint of step {} saved: {:.2} MiB in {:.2} s",
                    s.step,
                    s.written as f64 / (1 << 20) as f64,
                    s.elapsed.as_secs_f64()
                ),
                false => format!("checkpoint of step {} not saved", s.step),
            });
        }
    }

    /// Prints a line on stdout without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.progress {
            Some(p) => p.println(line),
            None => println!("{line}"),
        }
    }

    /// Logs a step's scalars and the device's metrics.
    pub fn log(&mut self, device: &LazyDevice, v: Logged) -> anyhow::Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let (at, step, tokens) = self.last;
        let secs = at.elapsed().as_secs_f64().max(1e-9);
        let steps = v.step.saturating_sub(step).max(1);
        let mut values = vec![("train/loss", v.loss), ("train/learning_rate", v.lr)];
        if v.step > step {
            values.push(("perf/tokens_per_s", (self.tokens - tokens) as f64 / secs));
            values.push(("perf/step_time_ms", 1e3 * secs / steps as f64));
        }
        if let Some(n) = v.grad_norm {
            values.push(("train/grad_norm", n));
        }
        values.extend(metrics_scalars(&device.metrics()));
        log.log(v.step, &values)?;
        self.last = (Instant::now(), v.step, self.tokens);
        Ok(())
    }

    /// Logs a validation loss.
    pub fn log_val(&mut self, step: u64, loss: f64) -> anyhow::Result<()> {
        if let Some(log) = &mut self.log {
            log.log(step, &[("val/loss", loss)])?;
        }
        Ok(())
    }

    /// Ends the bar.
    pub fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish();
        }
    }
}

/// Runs `load`, which tokenizes `path` reporting its progress to the closure it is given: a
/// bar (or plain lines, for a long corpus) when `shown`.
pub fn tokenizing<T>(
    path: &Path,
    shown: bool,
    load: impl FnOnce(&mut dyn FnMut(u64, u64)) -> T,
) -> T {
    let file = path.file_name().unwrap_or(path.as_os_str());
    let name = format!("tokenize {}", file.to_string_lossy());
    let mut work: Option<Work> = None;
    let out = load(&mut |done, total| {
        if shown {
            work.get_or_insert_with(|| Work::new(&name, total))
                .set(done);
        }
    });
    if let Some(w) = &work {
        w.finish();
    }
    out
}

/// FLOP/s of a `side`-square f32 matmul on every replica: the best of three timed runs after
/// one that compiles (or loads) its graph.
pub fn measure_peak(device: &LazyDevice, side: usize, seed: u64) -> anyhow::Result<Option<f64>> {
    if side == 0 {
        return Ok(None);
    }
    let mut rng = HostRng::new(seed ^ 0xF10F);
    let host = |rng: &mut HostRng| {
        HostTensor::from_slice(&rng.uniform_vec(side * side, 1.0), &[side, side])
    };
    let a = device.tensor(&host(&mut rng)?)?;
    let b = device.tensor(&host(&mut rng)?)?;
    let mut best = f64::INFINITY;
    for i in 0..4 {
        let t = Instant::now();
        let c = a.matmul(&b)?.sum_all()?;
        device.mark_step()?;
        c.item()?;
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    // the matmul runs whole on every device: each replica's, or each mesh position's
    let devices = device.global_replicas() * device.metrics().partitions.max(1);
    let flops = 2.0 * (side as f64).powi(3) * devices as f64;
    Ok(Some(flops / best.max(1e-9)))
}
