//! Whether a tier is usable: shared by the cache's lookups and puts and by the leases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Error;

/// Whether a tier is usable, shared by every operation on it (leases included).
pub(crate) struct Health {
    /// Set when the tier could not be reached: it is skipped until then, so a dead server
    /// costs one timeout per outage window, not one per lookup.
    down_until: Mutex<Option<Instant>>,
    /// Set after a request ran out of time: a hung server is not asked again by this process.
    off: AtomicBool,
    retry_after: Duration,
}

impl Health {
    pub(crate) fn new(retry_after: Duration) -> Health {
        Health {
            down_until: Mutex::new(None),
            off: AtomicBool::new(false),
            retry_after,
        }
    }

    pub(crate) fn is_down(&self) -> bool {
        if self.off.load(Ordering::Relaxed) {
            return true;
        }
        let mut d = self.down_until.lock().unwrap_or_else(|p| p.into_inner());
        match *d {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *d = None;
                false
            }
            None => false,
        }
    }

    /// Takes note of an error: an unreachable tier is skipped for a while, a hung one for
    /// good. Returns true when the error was of that kind. Throttling is not: the server is
    /// there (a holder's throttled lease renewal must not keep its entry out of the tier).
    pub(crate) fn report(&self, e: &Error) -> bool {
        match e {
            Error::Unavailable {
                throttled: false,
                timed_out,
                ..
            } => {
                if *timed_out {
                    self.off.store(true, Ordering::Relaxed);
                }
                *self.down_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Instant::now() + self.retry_after);
                true
            }
            _ => false,
        }
    }
}
