//! Compile locks as leases: an object created only if absent, holding the holder's pid, host
//! and expiry. A lease whose holder died (same host, pid gone) or that expired is broken by the
//! next process, so a killed compiler never blocks a fleet and needs no manual clean-up. While
//! the holder compiles, a background thread renews the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
}

/// A held lease; released (deleted) on drop.
pub(crate) struct LeaseGuard {
    store: Arc<dyn Store>,
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
        if let Err(e) = self.store.delete(&self.name) {
            tracing::warn!("releasing compile lock {}: {e}", self.name);
        }
    }
}

/// What an attempt to take a lease found.
pub(crate) enum Attempt {
    Acquired(LeaseGuard),
    /// Someone else holds a live lease.
    Held,
}

/// Tries to take the lease `name`, breaking a stale one.
pub(crate) fn try_acquire(store: &Arc<dyn Store>, name: &str, secs: u64) -> crate::Result<Attempt> {
    for _ in 0..2 {
        let lease = Lease::mine(secs);
        let bytes = serde_json::to_vec(&lease).expect("lease serializes");
        if store.put(name, &bytes, PutMode::CreateOnly)? {
            return Ok(Attempt::Acquired(guard(store, name, secs)));
        }
        let Some(seen) = store.get(name)? else {
            continue;
        }; // released meanwhile
           // Leases are written whole (create-only), so an unreadable one is debris, not a
           // holder.
        match serde_json::from_slice::<Lease>(&seen) {
            Ok(l) if !l.is_stale() => return Ok(Attempt::Held),
            Ok(l) => tracing::info!(
                "breaking stale compile lock {name} (pid {} on {})",
                l.pid,
                l.host
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
    Ok(Attempt::Held)
}

fn guard(store: &Arc<dyn Store>, name: &str, secs: u64) -> LeaseGuard {
    let stop = Arc::new(AtomicBool::new(false));
    let (s, n, st) = (store.clone(), name.to_string(), stop.clone());
    let renewer = std::thread::Builder::new()
        .name("neuron-pc-lease".into())
        .spawn(move || {
            let every = Duration::from_secs((secs / 3).max(1));
            while !st.load(Ordering::Relaxed) {
                std::thread::park_timeout(every);
                if st.load(Ordering::Relaxed) {
                    break;
                }
                let bytes = serde_json::to_vec(&Lease::mine(secs)).expect("lease serializes");
                if let Err(e) = s.put(&n, &bytes, PutMode::Overwrite) {
                    tracing::warn!("renewing compile lock {n}: {e}");
                }
            }
        })
        .ok();
    LeaseGuard {
        store: store.clone(),
        name: name.to_string(),
        stop,
        renewer,
    }
}
