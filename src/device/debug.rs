//! The step debug mode (`NEURON_PC_DEBUG_STEPS=1`, or `DeviceConfig::debug_steps`), in the
//! spirit of PyTorch/XLA's `PT_XLA_DEBUG`: every step cut is logged with its site, the graph's
//! key, its op count and where its executable came from, and a read that forces an implicit
//! sync is named once per source line with the reason.
//!
//! The lines go to their own `tracing` target, [`TARGET`], which the default subscriber lets
//! through at info level whenever the mode is on, so nothing else (no `RUST_LOG`, no
//! `NEURON_PC_LOG`) has to be set for them to appear.

use std::panic::Location;
use std::time::Duration;

use super::executables::How;
use super::{lock, DeviceInner};

pub use crate::logging::DEBUG_STEPS_TARGET as TARGET;

/// What one step cut was, for the debug log.
pub(crate) struct StepCut<'a> {
    pub site: &'static Location<'static>,
    /// `mark_step` (true) or a read of a pending value (false).
    pub explicit: bool,
    pub key: &'a str,
    pub ops: usize,
    pub how: How,
    pub elapsed: Duration,
}

/// Logs one step cut (debug mode only).
pub(crate) fn log_step(dev: &DeviceInner, cut: &StepCut<'_>) {
    if !dev.config.debug_steps {
        return;
    }
    let kind = if cut.explicit {
        "mark_step"
    } else {
        "implicit sync"
    };
    tracing::info!(
        target: TARGET,
        "step cut at {} ({kind}): graph {}, {} ops, {}, {:.3} ms",
        cut.site,
        &cut.key[..12.min(cut.key.len())],
        cut.ops,
        cut.how,
        cut.elapsed.as_secs_f64() * 1e3
    );
}

/// Logs a `mark_step` that found nothing pending (debug mode only).
pub(crate) fn log_empty_step(dev: &DeviceInner, site: &'static Location<'static>) {
    if dev.config.debug_steps {
        tracing::info!(target: TARGET, "step cut at {site} (mark_step): nothing pending");
    }
}

/// Warns, once per source line, that a read at `site` forced an implicit sync (debug mode only).
pub(crate) fn warn_implicit_sync(dev: &DeviceInner, site: &'static Location<'static>) {
    if !dev.config.debug_steps || !lock(&dev.sites).first_implicit_sync(site) {
        return;
    }
    tracing::warn!(
        target: TARGET,
        "implicit sync at {site}: a read (to_vec, item, to_host) of a value still pending before \
         mark_step; the work recorded so far for it was cut into a graph of its own and run \
         here. Read after mark_step, or call mark_step first (shown once per line)"
    );
}
