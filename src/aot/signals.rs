//! Ctrl-C: the first SIGINT (or SIGTERM) sets a flag the AOT loops poll, so they can stop the
//! trial job and the workers and still print what was done. Entries already stored stay: the
//! cache writes each one atomically.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

extern "C" {
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn kill(pid: i32, sig: i32) -> i32;
}

extern "C" fn on_signal(_sig: i32) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    for sig in [SIGINT, SIGTERM] {
        // SAFETY: `on_signal` only performs an atomic store, which is async-signal-safe, and
        // `signal` is the C library's; replacing the default disposition has no other effect.
        unsafe {
            signal(sig, on_signal);
        }
    }
}

/// True once SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Sends SIGINT to `pid` (the trial job gets the chance to stop cleanly).
pub fn interrupt(pid: u32) {
    send(pid, SIGINT);
}

/// Sends SIGKILL to `pid`.
pub fn kill_hard(pid: u32) {
    send(pid, SIGKILL);
}

fn send(pid: u32, sig: i32) {
    if let Ok(p) = i32::try_from(pid) {
        // SAFETY: plain syscall wrapper; a pid of a child we still hold (not yet reaped) cannot
        // have been reused, and a failure (already exited) is harmless.
        unsafe {
            kill(p, sig);
        }
    }
}
