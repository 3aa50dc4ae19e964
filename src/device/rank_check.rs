//! The rank-agreement check: before the first execution of every new graph, each rank of a
//! multi-process run publishes the graph's key in the run's store ([`crate::store`]) and waits
//! for every other rank's.
//!
//! The classic multi-process failure is a hang: one rank traces another graph (a
//! rank-dependent branch, another batch shape) and the collectives wait forever. Here the
//! ranks compare keys first. Every rank reads the same records, so a mismatch is the same
//! error on every rank, naming the step, the ranks on each side and the first differing input
//! (the recompile warning's diff); a rank that never publishes is an error once the wait
//! (`NEURON_PC_RANK_CHECK_TIMEOUT`) is over, naming the missing ranks.
//!
//! Keys, in the attempt's namespace: `graphs/<n>/rank<r>` holds rank `r`'s record of its
//! `n`-th new graph (0-based, counted per process), one JSON [`GraphNote`].
//!
//! The wait, from the variables (how a launcher's environment is read):
//!
//! ```
//! use std::time::Duration;
//! use neuron_pc::device::rank_check::{wait_from_vars, DEFAULT_WAIT_SECS};
//! # fn main() -> neuron_pc::Result<()> {
//! let vars = |name: &str| (name == "NEURON_PC_RANK_CHECK_TIMEOUT").then(|| "60".to_string());
//! let wait = wait_from_vars(vars)?;
//! assert_eq!(wait, Duration::from_secs(60));
//! assert_eq!(wait_from_vars(|_| None)?, Duration::from_secs_f64(DEFAULT_WAIT_SECS));
//! # Ok(()) }
//! ```

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use neuron_pc_compiler::ir::Graph;

use super::diagnose::{explain, Summary};
use crate::error::{Error, Result};
use crate::store::{self, KvStore, ScopedStore};
use crate::topology::Topology;

/// Seconds a rank waits for the others' records of a new graph.
pub const RANK_CHECK_TIMEOUT_ENV: &str = "NEURON_PC_RANK_CHECK_TIMEOUT";
/// Default for [`RANK_CHECK_TIMEOUT_ENV`]: ranks reach a new graph within a step of each
/// other, but the first one may wait for a slow rank's data loading and tracing.
pub const DEFAULT_WAIT_SECS: f64 = 300.0;
/// Op descriptions kept in a record, so a huge graph stays far below etcd's 1.5 MiB request
/// limit; the key decides agreement, the ops only explain a difference.
pub const MAX_OPS: usize = 4096;

/// One rank's record of one new graph.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GraphNote {
    /// The graph's cache key (hex): equal keys are the same program.
    pub key: String,
    /// The rank's `mark_step` count, this step included (1 for the first step).
    pub step: u64,
    /// The `mark_step` (or implicit sync) line that cut the graph.
    pub site: String,
    /// Parameter types, in order.
    pub params: Vec<String>,
    /// Parameter tensor names, `""` when unnamed.
    pub names: Vec<String>,
    /// Op descriptions, at most [`MAX_OPS`].
    pub ops: Vec<String>,
}

impl GraphNote {
    /// The record of `graph` with cache key `key`.
    pub fn of(
        graph: &Graph,
        names: &[String],
        key: &str,
        step: u64,
        site: &Location<'_>,
    ) -> GraphNote {
        let s = Summary::of(graph, names);
        GraphNote {
            key: key.to_string(),
            step,
            site: site.to_string(),
            params: s.params,
            names: s.names,
            ops: s.ops.into_iter().take(MAX_OPS).collect(),
        }
    }

    fn summary(&self) -> Summary {
        Summary {
            params: self.params.clone(),
            names: self.names.clone(),
            ops: self.ops.clone(),
        }
    }
}

/// This rank's side of the check.
pub struct RankCheck {
    store: ScopedStore,
    rank: usize,
    world: usize,
    wait: Duration,
    /// New graphs this process has published.
    published: AtomicU64,
}

impl RankCheck {
    /// The check of rank `rank` among `world` processes, through `store`; [`RankCheck::agree`]
    /// waits at most `wait` for the other ranks' records of each new graph.
    pub fn new(store: ScopedStore, rank: usize, world: usize, wait: Duration) -> RankCheck {
        RankCheck {
            store,
            rank,
            world,
            wait,
            published: AtomicU64::new(0),
        }
    }

    /// The check for a device of `topology`: `None` for one process, in a trial run (nothing
    /// runs, so nothing can hang) or without `NEURON_PC_STORE`.
    pub fn from_env(topology: &Topology, extracting: bool) -> Result<Option<RankCheck>> {
        if !topology.is_multi_process() || extracting {
            return Ok(None);
        }
        let Some(store) = store::from_env()? else {
            return Ok(None);
        };
        let wait = wait_from_vars(|n| std::env::var(n).ok())?;
        Ok(Some(RankCheck::new(
            store,
            topology.rank,
            topology.world_size,
            wait,
        )))
    }

    /// The run's store the check goes through (the attempt's namespace).
    pub(crate) fn store(&self) -> &ScopedStore {
        &self.store
    }

    /// Publishes this rank's record of its next new graph and returns once every rank has
    /// published the same key; an error when one differs or is missing after the wait.
    pub fn agree(&self, note: &GraphNote) -> Result<()> {
        let n = self.published.fetch_add(1, Ordering::Relaxed);
        let key = |r: usize| format!("graphs/{n}/rank{r}");
        let json = serde_json::to_vec(note).map_err(|e| Error::Config(e.to_string()))?;
        self.store.set(&key(self.rank), &json)?;
        let mut notes: Vec<Option<GraphNote>> = vec![None; self.world];
        notes[self.rank] = Some(note.clone());
        let deadline = Instant::now() + self.wait;
        let mut pause = Duration::from_millis(5);
        loop {
            for (r, slot) in notes.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                if let Some(bytes) = self.store.try_get(&key(r))? {
                    let other = serde_json::from_slice(&bytes).map_err(|e| {
                        Error::Config(format!(
                            "rank check: {} {}: not a graph record: {e}",
                            self.store.describe(),
                            self.store.full_key(&key(r))
                        ))
                    })?;
                    *slot = Some(other);
                }
            }
            let missing: Vec<usize> = (0..self.world).filter(|&r| notes[r].is_none()).collect();
            if missing.is_empty() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::RanksDiverged(format!(
                    "ranks diverged or stopped: rank(s) {} did not reach new graph {n} within \
                     {:.0} s; this rank {} reached it at step {} ({}); ranks {} did too",
                    list(&missing),
                    self.wait.as_secs_f64(),
                    self.rank,
                    note.step,
                    note.site,
                    list(
                        &(0..self.world)
                            .filter(|r| !missing.contains(r))
                            .collect::<Vec<_>>()
                    ),
                )));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
        let notes: Vec<GraphNote> = notes.into_iter().flatten().collect();
        compare(&notes, n)
    }
}

/// `Ok` when every rank has rank 0's key; else the one message every rank prints.
fn compare(notes: &[GraphNote], n: u64) -> Result<()> {
    let reference = &notes[0];
    let (same, other): (Vec<usize>, Vec<usize>) =
        (0..notes.len()).partition(|&r| notes[r].key == reference.key);
    let Some(&first) = other.first() else {
        return Ok(());
    };
    let odd = &notes[first];
    let diff = explain(&[reference.summary()], &odd.summary());
    Err(Error::RanksDiverged(format!(
        "ranks diverged at step {} (new graph {n}): rank {first}'s graph ({}) differs from rank \
         0's ({}) in {diff}; ranks with rank 0's graph: {}; with another: {}. Every rank must \
         trace the same graphs: look for a branch on the rank or a batch shape that differs",
        reference.step,
        odd.site,
        reference.site,
        list(&same),
        list(&other),
    )))
}

fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The wait: `NEURON_PC_RANK_CHECK_TIMEOUT` seconds or the default.
pub fn wait_from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Duration> {
    match get(RANK_CHECK_TIMEOUT_ENV).filter(|v| !v.trim().is_empty()) {
        None => Ok(Duration::from_secs_f64(DEFAULT_WAIT_SECS)),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e7 => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Config(format!(
                "{RANK_CHECK_TIMEOUT_ENV}={v:?}: expected seconds, a positive number"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(key: &str, params: &[&str]) -> GraphNote {
        GraphNote {
            key: key.into(),
            step: 3,
            site: "train.rs:10:5".into(),
            params: params.iter().map(|p| p.to_string()).collect(),
            names: vec!["".into(), "labels".into()],
            ops: vec!["dot".into()],
        }
    }

    #[test]
    fn equal_keys_agree_and_a_differing_rank_is_named_with_its_input() {
        let a = note("aa", &["f32[4,8]", "i32[4]"]);
        let b = note("bb", &["f32[4,8]", "i32[3]"]);
        assert!(compare(&[a.clone(), a.clone(), a.clone()], 0).is_ok());
        let e = compare(&[a.clone(), a.clone(), b, a], 2)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "ranks diverged at step 3 (new graph 2): rank 2's graph (train.rs:10:5) differs \
             from rank 0's (train.rs:10:5) in its inputs (input 1 (labels): i32[3] vs i32[4]); \
             ranks with rank 0's graph: 0, 1, 3; with another: 2. Every rank must trace the same \
             graphs: look for a branch on the rank or a batch shape that differs"
        );
    }

    #[test]
    fn waits() {
        let w = |v: Option<&str>| wait_from_vars(|_| v.map(String::from));
        assert_eq!(w(None).unwrap(), Duration::from_secs(300));
        assert_eq!(w(Some("2.5")).unwrap(), Duration::from_millis(2500));
        assert!(w(Some("0"))
            .unwrap_err()
            .to_string()
            .contains(RANK_CHECK_TIMEOUT_ENV));
    }
}
