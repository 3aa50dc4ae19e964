//! Compile locks as leases: an object created only if absent, holding the holder's pid, host
//! and expiry. A lease whose holder died (same host, pid gone) or that expired is broken by the
//! next process, so a killed compiler never blocks a fleet and needs no manual clean-up. While
//! the holder compiles, a background thread renews the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::Health;
use crate::record::now_secs;
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
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_default())
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

/// Tries to take the lease `name`, breaking a stale one.
pub(crate) fn try_acquire(
    store: &Arc<dyn Store>,
    health: &Arc<Health>,
    name: &str,
    secs: u64,
) -> crate::Result<Attempt> {
    for _ in 0..2 {
        let lease = Lease::mine(secs);
        let bytes = serde_json::to_vec(&lease).expect("lease serializes");
        if store.put(name, &bytes, PutMode::CreateOnly)? {
            return Ok(Attempt::Acquired(guard(store, health, name, secs)));
        }
        let Some(seen) = store.get(name)? else {
            continue;
        }; // released meanwhile
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
