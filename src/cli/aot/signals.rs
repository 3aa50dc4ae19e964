//! Ctrl-C: the first SIGINT (or SIGTERM) sets a flag the AOT loops poll, so they can stop the
//! trial job and the workers and still print what was done. Entries already stored stay: the
//! cache writes each one atomically.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

fn flag() -> &'static Arc<AtomicBool> {
    INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Sets the flag on SIGINT and SIGTERM (signal-hook's handler is a plain atomic store).
pub fn install() {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, flag().clone()) {
            tracing::warn!("cannot catch signal {sig} ({e}); Ctrl-C will stop without a report");
        }
    }
}

/// True once SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    flag().load(Ordering::SeqCst)
}

/// Sends SIGINT to the child `pid`, so the trial job can stop cleanly.
pub fn interrupt(pid: u32) {
    if let Ok(p) = i32::try_from(pid) {
        // SAFETY: kill(2) has no memory effects; the pid is a child we have not reaped, so it
        // cannot have been reused, and a failure (already exited) is harmless.
        unsafe {
            libc::kill(p, libc::SIGINT);
        }
    }
}
