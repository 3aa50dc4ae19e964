//! Whether this process is a trial run (as `neuron-pc compile` runs a job), and
//! the rule that follows from it: a trial run writes none of the user's files.
//!
//! A trial run executes nothing: every value it reads is a zero-filled stand-in. A checkpoint
//! saved from it would be zeros under a real name, and a later `--resume` would train on from
//! them, so every checkpoint or state dict saved through [`crate::state_dict::StateDict::save`]
//! is skipped with one line naming it, and the timeline (`NEURON_PC_TRACE`) is written only to
//! a new file, never over an existing one (`neuron-pc compile --trace` gives the trial job a
//! fresh path and merges what it writes).
//! Reading is allowed: a trial run's `--resume` loads the real checkpoint, so it traces the
//! graphs the real resumed run will use. A job's own outputs (metrics files, logs, uploads)
//! should ask [`crate::LazyDevice::is_trial_run`] or [`is_trial_run`] the same way.
//!
//! ```
//! # fn main() -> neuron_pc::Result<()> {
//! let path = std::env::temp_dir().join(format!("metrics-{}.json", std::process::id()));
//! if !neuron_pc::trial::is_trial_run() {
//!     std::fs::write(&path, "{}")?; // a trial run's numbers would be zeros
//! }
//! # let _ = std::fs::remove_file(&path);
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Directory that puts devices of a trial run (set by `neuron-pc compile`).
pub const EXTRACT_DIR_ENV: &str = "NEURON_PC_EXTRACT_DIR";

/// Set once a device of a trial run exists in this process.
static TRIAL: AtomicBool = AtomicBool::new(false);

/// Paths already reported as skipped (one line each, however often the job saves).
static SKIPPED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// True when this process is a trial run: `NEURON_PC_EXTRACT_DIR` is set (as `neuron-pc
/// compile` sets it for the job), or a device of a trial run was created.
pub fn is_trial_run() -> bool {
    TRIAL.load(Ordering::Relaxed)
        || std::env::var_os(EXTRACT_DIR_ENV).is_some_and(|v| !v.is_empty())
}

/// Called when a device of a trial run is created.
pub(crate) fn mark_trial_run() {
    TRIAL.store(true, Ordering::Relaxed);
}

/// In a trial run, says once per path that `what` at `path` is not written, and returns true
/// (the caller skips the write); otherwise false.
pub(crate) fn skip_write(what: &str, path: &Path) -> bool {
    if !is_trial_run() {
        return false;
    }
    report_skip(what, path);
    true
}

/// Like [`skip_write`], but a trial run may create `path` when no file is there yet.
pub(crate) fn skip_overwrite(what: &str, path: &Path) -> bool {
    if !is_trial_run() || !path.exists() {
        return false;
    }
    report_skip(what, path);
    true
}

fn report_skip(what: &str, path: &Path) {
    let mut skipped = SKIPPED.lock().unwrap_or_else(|p| p.into_inner());
    if skipped
        .get_or_insert_with(HashSet::new)
        .insert(path.to_path_buf())
    {
        let state = if path.exists() {
            "the file on disk is left as it was"
        } else {
            "no file is created"
        };
        tracing::warn!(
            "the trial run: not writing {what} {}: a trial run's values are zero-filled \
             stand-ins ({state})",
            path.display()
        );
    }
}
