//! [`Checkpoints`]: training checkpoints saved in the background into a local directory or an
//! S3 prefix, the last K kept, and the newest complete one found again on resume.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use neuron_pc_cache::{PartOptions, S3Options};

use super::lease;
use super::meter::{Meter, Meters, SaveProgress};
use super::parts::{attempt_nonce, clear_stale_parts, failed_name, gather_parts};
use super::restore::{load, read_manifest};
use super::run::Run;
use super::snapshot::Snapshot;
use super::tidy::{committed_dirs, remove_failed, tidy, Undeletable};
use crate::error::Result;
use crate::nn::Module;
use crate::optim::OptimizerState;
use crate::state::manifest::{dir_name, Manifest, HF_INDEX, MANIFEST};
use crate::state::Location;
use crate::state_dict::{CheckpointError, StateDict};

/// How [`Checkpoints`] saves.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointOptions {
    /// Complete checkpoints kept (the newest); older ones are deleted once a newer one is
    /// committed. `None` keeps all.
    pub keep: Option<usize>,
    /// Bytes per file at most (a tensor larger than this is a file of its own); Hugging Face's
    /// `max_shard_size`. Default 2 GiB.
    pub shard_size: u64,
    /// Write on a thread of its own while training goes on (the default); `false` writes
    /// before `save` returns.
    pub background: bool,
    /// S3 only: part size, parts in flight and tries per request of the uploads and reads.
    pub parts: PartOptions,
    /// S3 only: the request bounds, endpoint and credentials, overriding the environment's
    /// (`AWS_ENDPOINT_URL`, [`crate::state::CKPT_S3_TIMEOUT_ENV`]); requests are retried by
    /// [`CheckpointOptions::parts`], so `max_retries` is ignored.
    pub s3: Option<S3Options>,
    /// A run of several processes: how long rank 0 waits for the other ranks' files before it
    /// gives up on a save. Default 30 minutes.
    pub rank_timeout: Duration,
    /// S3, one process: how long a save waits for the one before it that is still writing.
    /// Past that, this save is skipped with a warning and training goes on (a slow or
    /// unreachable store costs saves, not the loop); the next due save tries again. Default
    /// 2 s. A local directory, or a run of several processes (whose ranks must save the same
    /// steps), waits for the save before as long as it takes.
    pub busy_wait: Duration,
    /// This run's name, written into every manifest it commits. `None`: `NEURON_PC_RUN_ID`,
    /// else a drawn one, which a resume replaces by the resumed checkpoint's run. A named run
    /// resumes only its own checkpoints (see [`CheckpointOptions::adopt_run`]).
    pub run_id: Option<String>,
    /// Let a named run resume a checkpoint another run wrote (a run id other than its own).
    /// Without it that resume is refused, as `train_llama` refuses it without `--adopt-run`.
    pub adopt_run: bool,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        CheckpointOptions {
            keep: None,
            shard_size: 2 << 30,
            background: true,
            parts: PartOptions::default(),
            s3: None,
            rank_timeout: Duration::from_secs(1800),
            busy_wait: Duration::from_secs(2),
            run_id: None,
            adopt_run: false,
        }
    }
}

/// A complete (committed) checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its directory in the checkpoint location: `step-00000100`.
    pub name: String,
    /// The training steps taken when it was saved.
    pub step: u64,
}

/// What [`Checkpoints::resume`] loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// The checkpoint.
    pub checkpoint: CheckpointInfo,
    /// Where it is, for messages (`/ckpt/step-00000100`, `s3://bucket/run/step-00000100`).
    pub location: String,
    /// Bytes of tensor data this process read: less than [`Resumed::state_bytes`] where it
    /// needs only some of the state (its ZeRO-1 blocks of the optimizer's moments).
    pub read_bytes: u64,
    /// Bytes of tensor data in the checkpoint.
    pub state_bytes: u64,
    /// The run that wrote it (`None`: written before run ids); this run continues it.
    pub run: Option<String>,
}

/// A save on its way.
struct Pending {
    step: u64,
    handle: JoinHandle<Result<CheckpointInfo>>,
}

/// Training checkpoints in a directory or under an S3 prefix: `step-<8 digits>/`, each made
/// of safetensors files and a `manifest.json` written last (the commit point: a directory
/// without it is never read).
///
/// [`Checkpoints::save`] holds the state on the device and returns; a thread writes the files
/// while training goes on; the next save first waits for it. A kill at any moment leaves the
/// checkpoints committed before intact. A failed background save is a warning (the previous
/// checkpoint stays the newest); [`Checkpoints::wait`] returns the last one's outcome.
///
/// ```no_run
/// # use neuron_pc::state::{CheckpointOptions, Checkpoints};
/// # use neuron_pc::{models::{TextEncoder, TextEncoderConfig}, nn::Module, optim::AdamW};
/// # use neuron_pc::{LazyDevice, Tensor};
/// # fn main() -> neuron_pc::Result<()> {
/// let device = LazyDevice::from_env()?;
/// let model = TextEncoder::new(&device, TextEncoderConfig::default(), 0)?;
/// let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
/// let opt = AdamW::new(&device, &params, 0.01)?;
/// let options = CheckpointOptions { keep: Some(2), ..Default::default() };
/// let mut ckpts = Checkpoints::open("s3://my-bucket/runs/42", options)?;
/// let start = match ckpts.resume(&model, &opt)? {
///     Some(r) => r.checkpoint.step,
///     None => 0,
/// };
/// for step in start..1000 {
///     // ... one training step, then mark_step ...
///     if (step + 1) % 100 == 0 {
///         ckpts.save(&model, &opt, step + 1)?; // returns at once; written in the background
///     }
/// }
/// ckpts.wait()?; // the last save's outcome
/// # Ok(()) }
/// ```
pub struct Checkpoints {
    location: Arc<Location>,
    options: CheckpointOptions,
    pending: Option<Pending>,
    /// A run of several processes: this attempt's nonce (agreed at the first save; `None`
    /// inside when there is none to agree on) and the saves made so far.
    nonce: Option<Option<String>>,
    saves: u64,
    /// What this location could not delete, said once each.
    undeletable: Undeletable,
    /// This process holds the location's lease (rank 0, not a trial run; [`lease`]).
    leased: bool,
    /// Renews the lease while this job runs.
    renewer: Option<lease::Renewer>,
    /// Which run this is, and whether it may save yet ([`super::run`]).
    run: std::sync::Mutex<Run>,
    /// The saves not yet handed out by [`Checkpoints::ended`].
    meters: Meters,
}

impl Checkpoints {
    /// Checkpoints in `spec`: a local directory (created at the first save) or
    /// `s3://bucket/prefix`, with the compile cache's credentials and endpoint handling
    /// (`AWS_*` variables, `AWS_PROFILE`, `AWS_ENDPOINT_URL`). An S3 location is asked once
    /// here, so a missing bucket or refused credentials fail before training starts.
    pub fn open(spec: &str, options: CheckpointOptions) -> Result<Checkpoints> {
        if options.keep == Some(0) {
            return Err(storage(spec, "keeping 0 checkpoints would delete every one").into());
        }
        let location = Location::open(spec, &options.parts, options.s3.as_ref())?;
        // the job that writes here: rank 0 (the others' parts are its to commit)
        let rank0 = crate::topology::Topology::from_env().map_or(true, |t| t.rank == 0);
        let leased = rank0 && !crate::trial::is_trial_run();
        if leased {
            lease::acquire(&location)?;
        }
        let location = Arc::new(location);
        Ok(Checkpoints {
            renewer: leased.then(|| lease::Renewer::start(location.clone(), lease::RENEW_EVERY)),
            location,
            leased,
            run: std::sync::Mutex::new(Run::new(options.run_id.clone(), options.adopt_run)),
            meters: Meters::default(),
            options,
            pending: None,
            nonce: None,
            saves: 0,
            undeletable: Undeletable::default(),
        })
    }

    /// The directory or URL.
    pub fn describe(&self) -> String {
        self.location.describe()
    }

    /// This run's id, as its manifests carry it ([`CheckpointOptions::run_id`]); after a
    /// resume by a run without a name, the resumed checkpoint's run.
    pub fn run_id(&self) -> String {
        self.run().id.clone()
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        crate::device::lock(&self.run)
    }

    /// Says that this run starts from scratch, not from a checkpoint: an error when the
    /// location already holds complete checkpoints, whichever run wrote them (a new run never
    /// saves among them; resume them, or give this run another location). The first
    /// [`Checkpoints::save`] of a run that did not resume checks this too; calling it before
    /// the first step fails sooner. A trial run writes nothing and is not refused.
    pub fn start_fresh(&self) -> Result<()> {
        if self.run().started || crate::trial::is_trial_run() {
            return Ok(());
        }
        let done = self.list()?;
        if let Some(newest) = done.last() {
            let theirs = read_manifest(&self.location, &newest.name)
                .ok()
                .and_then(|m| m.run)
                .map_or_else(String::new, |r| format!(" of run {r}"));
            return Err(storage(
                &self.location.describe(),
                &format!(
                    "a run that does not resume would save among {} complete checkpoint(s) \
                     already here (the newest {}{theirs}): resume them (train_llama --resume), \
                     or give this run another checkpoint location",
                    done.len(),
                    newest.name
                ),
            )
            .into());
        }
        self.run().started = true;
        Ok(())
    }

    /// Saves the state of `module` and `opt` (made for `module.parameters()` in that order)
    /// as the checkpoint of `step`. Waits for the save before (a failed one is a warning),
    /// holds the values on the device and returns; a thread writes them (or this call, with
    /// [`CheckpointOptions::background`] off). The time this blocked the loop is in the device
    /// metrics (`checkpoint_blocked_ms`). In a trial run nothing is written.
    pub fn save<M, O>(&mut self, module: &M, opt: &O, step: u64) -> Result<()>
    where
        M: Module + ?Sized,
        O: OptimizerState + ?Sized,
    {
        let started = Instant::now();
        let target = self.location.display_path(&dir_name(step));
        // one line per location, however often the trial saves
        if crate::trial::skip_write("checkpoints in", &self.location.display_path("")) {
            return Ok(());
        }
        self.start_fresh()?;
        if self.still_writing(module, step)? {
            return Ok(());
        }
        if let Err(e) = self.wait() {
            tracing::warn!("{e}");
        }
        let mut snapshot = Snapshot::take(module, opt, step)?;
        if snapshot.processes > 1 {
            self.saves += 1;
            let attempt = match &self.nonce {
                Some(n) => n.clone(),
                None => {
                    let dev = snapshot.device();
                    let store = dev.inner.run_store();
                    let n = attempt_nonce(
                        store,
                        snapshot.rank,
                        snapshot.processes,
                        self.options.rank_timeout,
                    )?;
                    self.nonce = Some(n.clone());
                    n
                }
            };
            snapshot.nonce = attempt.map(|a| format!("{a}.{}", self.saves));
        }
        let location = self.location.clone();
        let options = CheckpointOptions {
            run_id: Some(self.run_id()),
            ..self.options.clone()
        };
        let owner = (self.undeletable.clone(), self.leased);
        let meter = self.meters.start(step);
        let write = move |times| commit(&location, snapshot, &options, &owner, times, &meter);
        if !self.options.background {
            return write((started, None)).map(drop);
        }
        let blocked = started.elapsed();
        let handle = std::thread::Builder::new()
            .name(format!("checkpoint-{step}"))
            .spawn(move || write((Instant::now(), Some(blocked))))
            .map_err(|source| CheckpointError::Io {
                path: target,
                source,
            })?;
        self.pending = Some(Pending { step, handle });
        Ok(())
    }

    /// S3, one process: whether the save before is still writing after
    /// [`CheckpointOptions::busy_wait`], in which case the save of `step` is skipped (one
    /// warning, counted as not saved).
    fn still_writing<M: Module + ?Sized>(&self, module: &M, step: u64) -> Result<bool> {
        let Some(p) = self.pending.as_ref().filter(|_| self.location.is_remote()) else {
            return Ok(false);
        };
        let Some((_, t)) = module.parameters().into_iter().next() else {
            return Ok(false);
        };
        let device = t.device()?;
        if device.config().topology.world_size > 1 {
            return Ok(false);
        }
        let started = Instant::now();
        while !p.handle.is_finished() {
            if started.elapsed() >= self.options.busy_wait {
                tracing::warn!(
                    "checkpoint of step {step} skipped: the save of step {} is still writing to \
                     {} after {:.1} s (a slow or unreachable store); training goes on, and the \
                     next due save tries again",
                    p.step,
                    self.location.describe(),
                    started.elapsed().as_secs_f64()
                );
                let blocked = started.elapsed().as_secs_f64() * 1e3;
                device.record_checkpoint(false, blocked, 0.0, 0);
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(false)
    }

    /// The save a thread is writing, if any (this process's bytes written, of how many).
    pub fn writing(&self) -> Option<SaveProgress> {
        self.meters.writing()
    }

    /// The saves ended since the last call, oldest first (why one failed: the next `wait`).
    pub fn ended(&mut self) -> Vec<SaveProgress> {
        self.meters.ended()
    }

    /// Waits for the save in the background, if any; its checkpoint, or why it failed.
    pub fn wait(&mut self) -> Result<Option<CheckpointInfo>> {
        let Some(p) = self.pending.take() else {
            return Ok(None);
        };
        let outcome = p.handle.join().unwrap_or_else(|_| {
            Err(storage(&self.location.describe(), "the checkpoint writer panicked").into())
        });
        match outcome {
            Ok(info) => Ok(Some(info)),
            Err(e) => Err(storage(
                &self.location.describe(),
                &format!(
                    "the checkpoint of step {} was not saved: {e}; the newest complete one is \
                     still the one before",
                    p.step
                ),
            )
            .into()),
        }
    }

    /// The complete checkpoints, oldest first.
    pub fn list(&self) -> Result<Vec<CheckpointInfo>> {
        Ok(complete(&self.location)?)
    }

    /// Reads checkpoint `info` whole into a state dict (every file checked against the
    /// manifest's size and SHA-256), assembling each tensor from the parts the replicas wrote.
    pub fn load(&self, info: &CheckpointInfo) -> Result<StateDict> {
        Ok(load(&self.location, &info.name)?)
    }

    /// Loads the newest complete checkpoint into `module` and `opt`, and says which; `None`
    /// when there is none (a local directory with only [`LEGACY_FILE`] resumes from it). A
    /// newest one that cannot be read (a damaged file) is reported in a warning and the one
    /// before is tried, and so on. A checkpoint that does not fit the model is an error, not a
    /// fallback.
    pub fn resume<M, O>(&self, module: &M, opt: &O) -> Result<Option<Resumed>>
    where
        M: Module + ?Sized,
        O: OptimizerState + ?Sized,
    {
        if let Some((_, t)) = module.parameters().first() {
            let device = t.device()?;
            let topology = &device.config().topology;
            if topology.world_size > 1 && topology.rank == 0 {
                // before any rank saves again: a killed run's parts must not join a new save
                let names = self.location.list()?;
                let done: Vec<String> = committed(&names).into_iter().map(|c| c.name).collect();
                clear_stale_parts(&self.location, &names, &done)?;
            }
            // what a killed run left below its newest checkpoint (before any rank writes)
            if topology.rank == 0 && !crate::trial::is_trial_run() {
                if let Err(e) = tidy(&self.location, None, &self.undeletable) {
                    tracing::warn!("checkpoints in {}: {e}", self.location.describe());
                }
            }
        }
        let all = self.list()?;
        let mut failed = Vec::new();
        for info in all.iter().rev() {
            match self.restore(info, module, opt) {
                Ok(resumed) => return Ok(Some(resumed)),
                // a checkpoint that does not fit the model, or is another run's, is not
                // damaged: no fallback
                Err(crate::Error::Checkpoint(
                    e @ (CheckpointError::Mismatch { .. }
                    | CheckpointError::Metadata { .. }
                    | CheckpointError::OtherRun { .. }),
                )) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(
                        "checkpoint {} cannot be used ({e}); falling back to the one before",
                        self.location.display_path(&info.name).display()
                    );
                    failed.push(info.name.clone());
                }
            }
        }
        if failed.is_empty() {
            let resumed = self.resume_single_file(module, opt)?;
            self.run().continued(None, "");
            return Ok(resumed);
        }
        Err(storage(
            &self.location.describe(),
            &format!("no checkpoint could be read ({})", failed.join(", ")),
        )
        .into())
    }

    /// Loads checkpoint `info` (at `path`, for messages) into `module` and `opt`: chunk by
    /// chunk, only what this process holds ([`super::restore`]), or, for a checkpoint written
    /// before its chunks had digests, read whole. Another run's checkpoint is refused first
    /// where this run may not continue it ([`super::run`]).
    fn restore<M, O>(&self, info: &CheckpointInfo, module: &M, opt: &O) -> Result<Resumed>
    where
        M: Module + ?Sized,
        O: OptimizerState + ?Sized,
    {
        let path = self.location.display_path(&info.name);
        let shown = path.display().to_string();
        let m = read_manifest(&self.location, &info.name)?;
        let run = m.run.clone();
        self.run().admit(run.as_deref(), &shown)?;
        let (read_bytes, state_bytes) =
            match super::restore::Reader::new(&self.location, &info.name, m) {
                Some(mut reader) => {
                    super::restore::restore(module, opt, &mut reader, &path)?;
                    (reader.read, reader.state_bytes())
                }
                None => {
                    let sd = load(&self.location, &info.name)?;
                    crate::state::load_training(module, opt, &sd, &path)?;
                    let bytes: u64 = sd.tensors.values().map(|t| t.bytes().len() as u64).sum();
                    (bytes, bytes)
                }
            };
        self.run().continued(run.as_deref(), &shown);
        Ok(Resumed {
            checkpoint: info.clone(),
            location: shown,
            read_bytes,
            state_bytes,
            run,
        })
    }

    /// Loads checkpoint `info` (one of [`Checkpoints::list`]) into `module` and `opt`, as
    /// [`Checkpoints::resume`] loads the newest: a tensor at a time, each process reading only
    /// what it holds. No fallback: a damaged checkpoint is an error.
    pub fn resume_from<M, O>(&self, info: &CheckpointInfo, module: &M, opt: &O) -> Result<Resumed>
    where
        M: Module + ?Sized,
        O: OptimizerState + ?Sized,
    {
        self.restore(info, module, opt)
    }

    /// A directory holding no step directory but [`LEGACY_FILE`] (the layout before step
    /// directories, one file rewritten at each save): that file, so such a run resumes too.
    fn resume_single_file<M, O>(&self, module: &M, opt: &O) -> Result<Option<Resumed>>
    where
        M: Module + ?Sized,
        O: OptimizerState + ?Sized,
    {
        #[allow(irrefutable_let_patterns)] // without the `s3` feature, the only location
        let Location::Local(root) = &*self.location
        else {
            return Ok(None);
        };
        let path = root.join(LEGACY_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let sd = StateDict::load(&path)?;
        let bytes: u64 = sd.tensors.values().map(|t| t.bytes().len() as u64).sum();
        let restored = crate::state::load_training(module, opt, &sd, &path)?;
        let step = restored.step.ok_or_else(|| {
            storage(
                &path.display().to_string(),
                "not a training checkpoint (no step)",
            )
        })?;
        tracing::warn!(
            "resuming from {}, a single-file checkpoint; the next save writes a step directory \
             beside it",
            path.display()
        );
        Ok(Some(Resumed {
            checkpoint: CheckpointInfo {
                name: LEGACY_FILE.to_string(),
                step,
            },
            location: path.display().to_string(),
            read_bytes: bytes,
            state_bytes: bytes,
            run: None,
        }))
    }
}

/// The single file a checkpoint directory held before step directories (`--ckpt-dir` of the
/// examples wrote `<dir>/last.safetensors`); [`Checkpoints::resume`] still reads it.
pub const LEGACY_FILE: &str = "last.safetensors";

impl Drop for Checkpoints {
    /// A save still being written is finished first, so a job that ends normally never leaves
    /// its last checkpoint half-written; then the location's lease is given back.
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!("{e}");
        }
        drop(self.renewer.take());
        if self.leased {
            lease::release(&self.location);
        }
    }
}

fn storage(location: &str, message: &str) -> CheckpointError {
    CheckpointError::Storage {
        location: location.to_string(),
        message: message.to_string(),
    }
}

/// Writes the snapshot's files, then (rank 0, once every rank's part is there) the index and
/// the manifest, the commit point; then deletes what `keep` no longer keeps.
fn commit(
    loc: &Location,
    snapshot: Snapshot,
    options: &CheckpointOptions,
    (undeletable, leased): &(Undeletable, bool),
    (started, blocked): (Instant, Option<Duration>),
    meter: &Meter,
) -> Result<CheckpointInfo> {
    let (step, rank, processes) = (snapshot.step, snapshot.rank, snapshot.processes);
    let snapshot_nonce = snapshot.nonce.clone();
    let device = snapshot.device();
    let dir = dir_name(step);
    let info = CheckpointInfo {
        name: dir.clone(),
        step,
    };
    let mut bytes = 0;
    let result = (|| -> Result<()> {
        // A step saved again (after a resume from an older one) withdraws its old commit
        // point before any of its files is replaced.
        // (the directory stays: the other ranks may be writing their files into it)
        loc.delete(&format!("{dir}/{MANIFEST}"), false)?;
        let part = snapshot.write(loc, &dir, options.shard_size, meter)?;
        bytes = part.files.values().map(|f| f.bytes).sum::<u64>();
        let mut manifest = if processes == 1 {
            part
        } else {
            let json = serde_json::to_vec_pretty(&part).expect("a manifest is JSON");
            loc.put(&format!("{dir}/rank-{rank:05}.json"), &json)?;
            if rank != 0 {
                return Ok(());
            }
            gather_parts(
                loc,
                &dir,
                processes,
                part.nonce.as_deref(),
                options.rank_timeout,
            )?
        };
        manifest.run = options.run_id.clone();
        // the manifest covers the index and itself with digests
        let index = manifest.hf_index();
        let json = manifest.seal(index.as_bytes());
        // Never commit a manifest that would not load.
        Manifest::parse(&dir, &json)?;
        if *leased {
            // never commit over another job's checkpoints
            lease::check(loc)?;
        }
        loc.put(&format!("{dir}/{HF_INDEX}"), index.as_bytes())?;
        super::snapshot::test_delay();
        loc.put(&format!("{dir}/{MANIFEST}"), &json)?;
        // what keep-K no longer keeps, and what unfinished saves left below this one
        if let Err(e) = tidy(loc, options.keep, undeletable) {
            tracing::warn!("checkpoints in {}: deleting old ones: {e}", loc.describe());
        }
        Ok(())
    })();
    if let Err(e) = &result {
        // its files go, so that a save that ran out of room leaves the next one that room
        if let Err(cleanup) = remove_failed(loc, &dir, rank, processes) {
            tracing::warn!("checkpoints in {}: {cleanup}", loc.describe());
        }
        if rank != 0 {
            // so that rank 0 stops waiting for this rank's part and says why
            let failed = serde_json::json!({ "nonce": snapshot_nonce, "error": e.to_string() });
            let _ = loc.put(&failed_name(&dir, rank), failed.to_string().as_bytes());
        }
    }
    let total = started.elapsed().as_secs_f64() * 1e3;
    let blocked = blocked.map_or(total, |b| b.as_secs_f64() * 1e3);
    device.record_checkpoint(result.is_ok(), blocked, total, bytes);
    meter.finish(result.is_ok());
    result.map(|()| info)
}

/// The committed checkpoints, oldest first.
fn complete(loc: &Location) -> std::result::Result<Vec<CheckpointInfo>, CheckpointError> {
    Ok(committed(&loc.list()?))
}

/// The committed checkpoints among a location's object names, oldest first.
fn committed(names: &[String]) -> Vec<CheckpointInfo> {
    committed_dirs(names)
        .into_iter()
        .map(|(step, name)| CheckpointInfo { name, step })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::checkpoints::load;
    use crate::state::manifest::{dir_name, MANIFEST};
    use crate::state::manifest::{sha256, Chunk, FileEntry, TensorEntry};
    use crate::state_dict::StateDict;
    use neuron_pc_compiler::HostTensor;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// What rank `rank` of two writes of a 6-element `w` (rank 0) and of its moments (3
    /// elements each): its file, and its part of the manifest.
    fn write_rank(loc: &Location, dir: &str, rank: usize, moments: &[f32], nonce: &str) {
        let file = format!("rank-{rank:05}-model-00001-of-00001.safetensors");
        let mut sd = StateDict::default();
        let mut part = Manifest::new(7, 2, BTreeMap::from([("step".into(), "7".into())]));
        part.nonce = Some(nonce.to_string());
        let chunk = |key: &str, start, len| Chunk {
            block: None,
            file: file.clone(),
            key: key.to_string(),
            start,
            len,
            at: None,
            sha256: None,
        };
        if rank == 0 {
            let w = HostTensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
            sd.tensors.insert("w".into(), w);
            part.tensors.insert(
                "w".into(),
                TensorEntry {
                    dtype: "f32".into(),
                    shape: vec![2, 3],
                    chunks: vec![chunk("w", 0, 6)],
                },
            );
        }
        let key = format!("optimizer.w.exp_avg#{rank}");
        sd.tensors
            .insert(key.clone(), HostTensor::from_slice(moments, &[3]).unwrap());
        part.tensors.insert(
            "optimizer.w.exp_avg".into(),
            TensorEntry {
                dtype: "f32".into(),
                shape: vec![2, 3],
                chunks: vec![chunk(&key, 3 * rank, 3)],
            },
        );
        let path = std::env::temp_dir().join(format!("npc-rank-{}-{rank}", std::process::id()));
        sd.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        loc.put(&format!("{dir}/{file}"), &bytes).unwrap();
        let entry = FileEntry {
            bytes: bytes.len() as u64,
            sha256: sha256(&bytes),
        };
        part.files.insert(file, entry);
        let json = serde_json::to_vec(&part).unwrap();
        loc.put(&format!("{dir}/rank-{rank:05}.json"), &json)
            .unwrap();
    }

    #[test]
    fn rank_zero_merges_every_ranks_part_and_the_whole_tensors_load() {
        let root = std::env::temp_dir().join(format!("npc-ckpt-ranks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let loc = Arc::new(Location::Local(root.clone()));
        let dir = dir_name(7);
        // a killed save of the same step left rank 1's part and file, of another nonce
        write_rank(&loc, &dir, 1, &[9.0, 9.0, 9.0], "killed.1");
        write_rank(&loc, &dir, 0, &[0.1, 0.2, 0.3], "now.1");
        // rank 1 is late: rank 0 waits past the old part for this save's
        let late = loc.clone();
        let d = dir.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            write_rank(&late, &d, 1, &[0.4, 0.5, 0.6], "now.1");
        });
        let nonce = Some("now.1");
        let merged = gather_parts(&loc, &dir, 2, nonce, Duration::from_secs(20)).unwrap();
        writer.join().unwrap();
        let json = serde_json::to_vec(&merged).unwrap();
        Manifest::parse(&dir, &json).unwrap();
        loc.put(&format!("{dir}/{MANIFEST}"), &json).unwrap();
        let sd = load(&loc, &dir).unwrap();
        let m = sd.tensors["optimizer.w.exp_avg"].to_f64_vec();
        let want = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6].map(f64::from);
        assert_eq!(m, want);
        assert_eq!(sd.tensors["w"].dims(), [2, 3]);
        assert_eq!(sd.metadata["step"], "7");
        // a rank that never writes its part fails the save after the timeout
        let err = gather_parts(&loc, &dir, 3, nonce, Duration::from_millis(300)).unwrap_err();
        assert!(
            err.to_string().contains("rank 2 did not write its part"),
            "{err}"
        );
        // ... and one whose only part there is another save's says so
        let next = Some("now.2");
        let err = gather_parts(&loc, &dir, 2, next, Duration::from_millis(300)).unwrap_err();
        let want = concat!(
            "rank 0 did not write its part in 300ms; its part there is of another save ",
            "(nonce now.1, this save's now.2)"
        );
        assert!(err.to_string().contains(want), "{err}");
        // a rank whose save failed says so, and rank 0 stops waiting at once
        let other = dir_name(8);
        write_rank(&loc, &other, 0, &[0.1, 0.2, 0.3], "now.3");
        let failed = serde_json::json!({ "nonce": "now.3", "error": "disk full" });
        loc.put(&failed_name(&other, 1), failed.to_string().as_bytes())
            .unwrap();
        let started = Instant::now();
        let long = Duration::from_secs(600);
        let err = gather_parts(&loc, &other, 2, Some("now.3"), long).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(60));
        assert!(
            err.to_string()
                .contains("rank 1 could not write its part: disk full"),
            "{err}"
        );
        // a killed attempt's part at a later step goes at resume; committed ones stay
        let late = dir_name(9);
        write_rank(&loc, &late, 1, &[0.0; 3], "killed.2");
        let names = loc.list().unwrap();
        let done: Vec<String> = committed(&names).into_iter().map(|c| c.name).collect();
        clear_stale_parts(&loc, &names, &done).unwrap();
        let names = loc.list().unwrap();
        assert!(
            !names.contains(&format!("{late}/rank-00001.json")),
            "{names:?}"
        );
        assert!(
            names.contains(&format!("{dir}/rank-00001.json")),
            "{names:?}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
