//! Compile locks as leases: an object created only if absent, holding the holder's pid, host
//! and expiry. A lease whose holder died (same host, pid gone) or that expired is broken by the
//! next process, so a killed compiler never blocks a fleet and needs no manual clean-up. While
//! the holder compiles, a background thread renews the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::health::Health;
use crate::record::{hostname, now_secs};
use crate::store::{PutMode, Store};

/// Lease contents.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// Process id of the holder.
    pub pid: u32,
    /// Host name of the holder.
    pub host: String,
    /// Seconds since the Unix epoch after which the lease is void.
    pub expires_at: u64,
    /// Unique per attempt, so that a writer can tell its lease from another's by the bytes
    /// (compare-after-write on servers without conditional PUT).
    #[serde(default)]
    pub nonce: u64,
}

fn nonce() -> u64 {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 40) ^ N.fetch_add(1, Ordering::Relaxed)
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl Lease {
    fn mine(secs: u64) -> Lease {
        Lease {
            pid: std::process::id(),
            host: hostname(),
            expires_at: now_secs() + secs,
            nonce: nonce(),
        }
    }

    /// True when the holder can no longer be compiling.
    pub fn is_stale(&self) -> bool {
        self.expires_at < now_secs() || (self.host == hostname() && !pid_alive(self.pid))
    }

    /// Like [`Lease::is_stale`], and also true for an expiry further ahead than a lease of
    /// `lease_secs` can reach (holders renew to now + `lease_secs`; twice that allows for
    /// clock skew): such a lease would block everyone for as long as it claims, so it is void.
    pub fn is_invalid(&self, lease_secs: u64) -> bool {
        self.is_stale() || self.expires_at > now_secs() + 2 * lease_secs.max(1)
    }
}

/// A held lease; released (deleted) on drop.
pub(crate) struct LeaseGuard {
    store: Arc<dyn Store>,
    health: Arc<Health>,
    name: String,
    stop: Arc<AtomicBool>,
    renewer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.renewer.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        // A tier that went down (a hung server) is not asked again: the job already paid
        // its one timeout, and a stale lease is broken by the next process anyway.
        if self.health.is_down() {
            return;
        }
        if let Err(e) = self.store.delete(&self.name) {
            self.health.report(&e);
            tracing::warn!("releasing compile lock {}: {e}", self.name);
        }
    }
}

/// What an attempt to take a lease found.
pub(crate) enum Attempt {
    Acquired(LeaseGuard),
    /// Someone else holds a live lease (what it says, when it could be read).
    Held(Option<Lease>),
}

/// Tries to take the lease `name`, breaking a stale one. A waiter polls this, so a live lease
/// costs one read and no write (writes are what an S3 prefix is throttled on first).
pub(crate) fn try_acquire(
    store: &Arc<dyn Store>,
    health: &Arc<Health>,
    name: &str,
    secs: u64,
) -> crate::Result<Attempt> {
    for _ in 0..2 {
        let seen = match store.get(name)? {
            Some(seen) => seen,
            None => {
                let lease = Lease::mine(secs);
                let bytes = serde_json::to_vec(&lease).expect("lease serializes");
                if store.put(name, &bytes, PutMode::CreateOnly)? {
                    return Ok(Attempt::Acquired(guard(store, health, name, secs)));
                }
                match store.get(name)? {
                    Some(seen) => seen,
                    None => continue, // released meanwhile
                }
            }
        };
        // Leases are written whole (create-only), so an unreadable one is debris, not a
        // holder.
        match serde_json::from_slice::<Lease>(&seen) {
            Ok(l) if !l.is_invalid(secs) => return Ok(Attempt::Held(Some(l))),
            Ok(l) => tracing::info!(
                "breaking stale or invalid compile lock {name} (pid {} on {}, expiry {})",
                l.pid,
                l.host,
                l.expires_at
            ),
            Err(_) => tracing::info!("breaking unreadable compile lock {name}"),
        }
        // Delete only the lease we judged (another process may have replaced it since). The
        // delete is not conditional, so a narrow window remains in which two processes both
        // compile; that costs time, never correctness: the first complete entry wins.
        if store.get(name)?.as_deref() == Some(&seen[..]) {
            store.delete(name)?;
        }
    }
    Ok(Attempt::Held(None))
}

fn guard(store: &Arc<dyn Store>, health: &Arc<Health>, name: &str, secs: u64) -> LeaseGuard {
    let stop = Arc::new(AtomicBool::new(false));
    let (s, n, st) = (store.clone(), name.to_string(), stop.clone());
    let h = health.clone();
    let renewer = std::thread::Builder::new()
        .name("neuron-pc-lease".into())
        .spawn(move || {
            let every = Duration::from_secs((secs / 3).max(1));
            while !st.load(Ordering::Relaxed) {
                std::thread::park_timeout(every);
                if st.load(Ordering::Relaxed) {
                    break;
                }
                // The tier's budget is shared with every other operation of this process.
                if h.is_down() {
                    continue;
                }
                let bytes = serde_json::to_vec(&Lease::mine(secs)).expect("lease serializes");
                if let Err(e) = s.put(&n, &bytes, PutMode::Overwrite) {
                    h.report(&e);
                    tracing::warn!("renewing compile lock {n}: {e}");
                }
            }
        })
        .ok();
    LeaseGuard {
        store: store.clone(),
        health: health.clone(),
        name: name.to_string(),
        stop,
        renewer,
    }
}

/// The pauses of a process waiting on another's lease: exponential with jitter up to a cap
/// (as the AWS SDKs back off), so a thousand waiters poll a shared store a few times a minute
/// each instead of tens of times a second, and do not poll in step.
pub(crate) struct Backoff {
    next: Duration,
    cap: Duration,
    rng: u64,
}

impl Backoff {
    pub(crate) fn new(first: Duration, cap: Duration) -> Backoff {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        Backoff::seeded(first, cap, seed)
    }

    pub(crate) fn seeded(first: Duration, cap: Duration, seed: u64) -> Backoff {
        Backoff {
            next: first.min(cap),
            cap,
            rng: seed | 1,
        }
    }

    /// The next pause: uniformly in `[d/2, d]` where `d` doubles each time up to the cap.
    pub(crate) fn pause(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        d.mul_f64(0.5 + 0.5 * frac)
    }

    /// The store is throttling us (503 SlowDown): wait longer, at once at the cap.
    pub(crate) fn slow_down(&mut self) {
        self.next = self.cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_with_jitter_up_to_the_cap() {
        let (first, cap) = (Duration::from_millis(50), Duration::from_secs(2));
        let mut b = Backoff::seeded(first, cap, 7);
        let mut bound = first;
        let mut pauses = Vec::new();
        for _ in 0..12 {
            let p = b.pause();
            assert!(
                p >= bound / 2 && p <= bound,
                "{p:?} outside [{:?}, {bound:?}]",
                bound / 2
            );
            pauses.push(p);
            bound = (bound * 2).min(cap);
        }
        assert!(pauses[8..].iter().all(|p| *p >= cap / 2), "{pauses:?}");
        // Two waiters started together do not poll in step.
        let mut other = Backoff::seeded(first, cap, 8);
        let theirs: Vec<Duration> = (0..12).map(|_| other.pause()).collect();
        assert_ne!(pauses, theirs);
        // Throttling: the next pause is at the cap at once.
        let mut t = Backoff::seeded(first, cap, 9);
        t.pause();
        t.slow_down();
        assert!(t.pause() >= cap / 2);
    }
}
