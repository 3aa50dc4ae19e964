//! Which run a checkpoint belongs to. Every manifest names the run that wrote it, and a run
//! neither continues another run's state nor starts over among another's checkpoints without
//! being told to.
//!
//! A run's id is [`crate::state::CheckpointOptions::run_id`], else `NEURON_PC_RUN_ID` (both
//! make the run *named*), else one drawn when the location is opened (`run-<16 hex digits>`).
//! - A run without a name that resumes a checkpoint continues that checkpoint's run and takes
//!   its id. A restart by hand, by a launcher, or as the next link of a chain of Slurm jobs
//!   continues the run it resumes, and needs nothing set.
//! - A named run resumes only checkpoints of its own name, or of none (written before run ids,
//!   or without a name). Another run's is refused ([`CheckpointError::OtherRun`]), unless
//!   [`crate::state::CheckpointOptions::adopt_run`] says to continue it; the run keeps its own
//!   name.
//! - A run that does not resume never writes into a location that holds complete checkpoints,
//!   whoever wrote them: its saves would mix with theirs, keep-K would delete across both by
//!   step, and the next `resume` would pick whichever step is highest. It is refused at
//!   [`super::Checkpoints::start_fresh`] (before the first step, where the caller asks) or at
//!   its first save.
//!
//! The lease ([`super::lease`]) stops two jobs writing at once; the run id keeps one job from
//! picking up another's state after the first has stopped.

use crate::state_dict::CheckpointError;

/// This run's identity, as far as the checkpoint location is concerned.
#[derive(Debug)]
pub(super) struct Run {
    /// Written into every manifest this run commits.
    pub id: String,
    /// Given by the user (option or variable), not drawn.
    named: bool,
    /// [`crate::state::CheckpointOptions::adopt_run`].
    adopt: bool,
    /// It has resumed, or checked that there was nothing to resume: its saves may go in.
    pub started: bool,
}

impl Run {
    /// The id given (`run_id`, else the environment's), else a drawn one; `adopt`:
    /// [`crate::state::CheckpointOptions::adopt_run`].
    pub fn new(run_id: Option<String>, adopt: bool) -> Run {
        let given = run_id.or_else(|| {
            std::env::var(crate::store::RUN_ID_ENV)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        });
        Run {
            named: given.is_some(),
            id: given.unwrap_or_else(|| format!("run-{}", super::parts::random_hex())),
            adopt,
            started: false,
        }
    }

    /// Before a checkpoint at `location` written by run `theirs` (`None`: no run id) is
    /// loaded: an error when this is a named run, the checkpoint is another's, and
    /// adopting it was not asked for.
    pub fn admit(&self, theirs: Option<&str>, location: &str) -> Result<(), CheckpointError> {
        match theirs {
            Some(t) if self.named && !self.adopt && t != self.id => {
                Err(CheckpointError::OtherRun {
                    location: location.to_string(),
                    theirs: t.to_string(),
                    ours: self.id.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// After a checkpoint written by run `theirs` was loaded: a run without a name continues
    /// that run (takes its id); a named one that adopted it says so.
    pub fn continued(&mut self, theirs: Option<&str>, location: &str) {
        self.started = true;
        let Some(t) = theirs.filter(|t| *t != self.id) else {
            return;
        };
        if self.named {
            tracing::warn!(
                "run {} continues checkpoint {location} of run {t}, as asked (adopt_run)",
                self.id
            );
        } else {
            self.id = t.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: Option<&str>, adopt: bool) -> Run {
        Run::new(id.map(str::to_string), adopt)
    }

    #[test]
    fn a_named_run_refuses_another_runs_checkpoint_unless_it_adopts_it() {
        let mut named = run(Some("llama-7b"), false);
        named.admit(Some("llama-7b"), "ck/step-1").unwrap();
        named.admit(None, "ck/step-1").unwrap();
        let e = named.admit(Some("other"), "ck/step-1").unwrap_err();
        assert!(matches!(e, CheckpointError::OtherRun { .. }), "{e}");
        let line = e.to_string();
        assert!(
            line.contains("run other") && line.contains("llama-7b") && !line.contains('\n'),
            "{line}"
        );
        let mut adopting = run(Some("llama-7b"), true);
        adopting.admit(Some("other"), "ck/step-1").unwrap();
        adopting.continued(Some("other"), "ck/step-1");
        assert_eq!(adopting.id, "llama-7b");
        assert!(adopting.started);
        named.continued(Some("llama-7b"), "ck/step-1");
        assert_eq!(named.id, "llama-7b");
    }

    #[test]
    fn a_run_without_a_name_continues_the_run_it_resumes() {
        let mut anonymous = run(None, false);
        assert!(anonymous.id.starts_with("run-") && anonymous.id.len() == 20);
        assert_ne!(anonymous.id, run(None, false).id, "drawn afresh");
        assert!(!anonymous.started);
        anonymous.admit(Some("llama-7b"), "ck/step-1").unwrap();
        anonymous.continued(Some("llama-7b"), "ck/step-1");
        assert_eq!(anonymous.id, "llama-7b");
        let mut legacy = run(None, false);
        let drawn = legacy.id.clone();
        legacy.continued(None, "ck/step-1");
        assert_eq!(legacy.id, drawn);
    }
}
