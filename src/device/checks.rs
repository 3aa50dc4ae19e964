//! Index checks (`NEURON_PC_CHECK_INDICES=1`, [`super::DeviceConfig::check_indices`]): an
//! out-of-range class label, embedding row or gather index is an error naming the op and the
//! line that called it, as PyTorch raises, instead of XLA's silent clamping.
//!
//! The check runs in the step graph: each checked op adds a small `i64[3]` output (how many
//! values are out of range, and the smallest and largest value looked at). Reading it would
//! wait for the step, so it is read only where the host waits anyway: once its step has
//! finished, at the next `mark_step`, and at every read of a value and `synchronize()`.
//! Trial runs record the same outputs, so their graphs are the real run's, and
//! read none of them.

use std::panic::Location;
use std::sync::Arc;

use super::trace::{Cell, Value};
use super::{lock, DeviceInner};
use crate::error::{Error, Result};

/// What a pending check is about.
pub(crate) struct IndexCheck {
    /// `i64[3]`: count out of range, smallest value, largest value (ignored values excluded).
    pub stats: Arc<Cell>,
    /// The user-facing op (`embedding`, `cross_entropy`, `gather`).
    pub op: &'static str,
    /// What the values are, plural (`labels`, `indices`).
    pub what: &'static str,
    /// Valid values are `0..upper`.
    pub upper: usize,
    /// How many values were checked (per replica).
    pub count: usize,
    pub site: &'static Location<'static>,
    /// The step the check was recorded in (the count of `mark_step` calls before it).
    pub step: u64,
}

impl DeviceInner {
    /// Registers a check: its statistics join the next step's outputs.
    pub(crate) fn add_index_check(&self, check: IndexCheck) {
        lock(&self.index_checks).push(check);
    }

    /// Adds the statistics of the checks not computed yet to `cells` (an implicit sync's).
    pub(crate) fn pending_check_cells(&self, cells: &mut Vec<Arc<Cell>>) {
        let checks = lock(&self.index_checks);
        cells.extend(
            checks
                .iter()
                .filter(|c| lock(&c.stats.value).is_pending())
                .map(|c| c.stats.clone()),
        );
    }

    /// Reads the checks whose step has finished (every check, waiting for them, when `wait`),
    /// and reports the first one that found an index out of range. Checks still pending or
    /// still running stay for a later call.
    pub(crate) fn poll_index_checks(&self, wait: bool) -> Result<()> {
        if self.config.extract_dir.is_some() {
            lock(&self.index_checks).clear();
            return Ok(());
        }
        let ready: Vec<IndexCheck> = {
            let mut checks = lock(&self.index_checks);
            if checks.is_empty() {
                return Ok(());
            }
            let (ready, waiting) = std::mem::take(&mut *checks).into_iter().partition(|c| {
                match &*lock(&c.stats.value) {
                    Value::Node(_) => false,
                    Value::Data(d) => {
                        wait || d.is_placed() && d.producer().is_none_or(|p| p.is_finished())
                    }
                }
            });
            *checks = waiting;
            ready
        };
        for check in ready {
            let data = match &*lock(&check.stats.value) {
                Value::Data(d) => d.clone(),
                Value::Node(_) => unreachable!("only computed checks are ready"),
            };
            let (mut bad, mut lo, mut hi) = (0i64, i64::MAX, i64::MIN);
            // each replica checked its own indices; on a mesh the one program checked them all
            // and every device holds the same counts
            let copies = if self.mesh.is_some() {
                1
            } else {
                self.devices.len()
            };
            for r in 0..copies {
                let host = self.download_quietly(&data, r)?;
                let v = host.to_vec::<i64>().map_err(Error::Compiler)?;
                bad += v[0];
                lo = lo.min(v[1]);
                hi = hi.max(v[2]);
            }
            if bad > 0 {
                return Err(Error::IndexOutOfRange {
                    site: check.site,
                    op: check.op,
                    step: check.step,
                    message: format!(
                        "{bad} of {} {} outside [0, {}) (smallest {lo}, largest {hi})",
                        check.count * copies,
                        check.what,
                        check.upper
                    ),
                });
            }
        }
        Ok(())
    }
}
