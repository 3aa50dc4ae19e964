//! Which job writes a checkpoint location: a lease object (`.lease.json` at its root) naming the
//! process that holds it. Two jobs writing one location would commit over each other and one
//! would resume the other's state; the lease makes the second one stop before step 1 instead.
//!
//! Taken when the location is opened (by rank 0 of a run of several processes: the others only
//! write parts that rank 0 commits), renewed every [`RENEW_EVERY`] by a thread while the job
//! runs, checked before each commit, given back when the [`super::Checkpoints`] is dropped.
//! A holder is alive when it is a live process of this host, or, on another host (whose
//! processes this host cannot see), when it renewed the lease within [`STALE_AFTER`]. A live
//! holder is an error naming it; a gone one (killed, its lease left behind) is taken over with
//! a warning. A free lease is taken by a create-only write, so two jobs opening one location at
//! the same instant cannot both take it. Hosts' clocks are compared (the renewal time is the
//! holder's): they must agree within a minute, as NTP keeps them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use neuron_pc_cache::hostname;

use crate::state::Location;
use crate::state_dict::CheckpointError;

/// The lease's object: a dot name, so local listings skip it; outside every step directory,
/// so no checkpoint's listing or deletion sees it.
pub(super) const LEASE: &str = ".lease.json";

/// How often the holder renews its lease.
pub(super) const RENEW_EVERY: Duration = Duration::from_secs(30);

/// A lease of another host not renewed for this long is a gone job's.
pub(super) const STALE_AFTER: Duration = Duration::from_secs(120);

/// Who holds a lease.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Holder {
    host: String,
    pid: u32,
    /// Seconds since the Unix epoch when it was taken.
    since: u64,
    /// When it was last renewed, by the holder's clock (leases written before renewals: 0).
    #[serde(default)]
    renewed: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Holder {
    fn me() -> Holder {
        Holder {
            host: hostname(),
            pid: std::process::id(),
            since: now_secs(),
            renewed: now_secs(),
        }
    }

    fn is_me(&self) -> bool {
        self.host == hostname() && self.pid == std::process::id()
    }

    /// Seconds since it was last renewed (or taken).
    fn silent_for(&self) -> u64 {
        now_secs().saturating_sub(self.renewed.max(self.since))
    }

    /// Whether the job holding it still runs, as far as this host can tell.
    fn alive(&self) -> bool {
        if self.host == hostname() {
            alive(self.pid)
        } else {
            self.silent_for() < STALE_AFTER.as_secs()
        }
    }

    fn describe(&self) -> String {
        format!(
            "pid {} on {} since {} (Unix time), renewed {} s ago",
            self.pid,
            self.host,
            self.since,
            self.silent_for()
        )
    }
}

/// Whether process `pid` of this host is alive.
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The lease's holder, if any (an unreadable lease is nobody's).
fn holder(loc: &Location) -> Result<Option<Holder>, CheckpointError> {
    Ok(loc
        .get(LEASE)?
        .and_then(|b| serde_json::from_slice::<Holder>(&b).ok()))
}

/// Takes the lease of `loc` for this process (see the module documentation). A free lease is
/// taken with a write that fails if another job wrote it first, so of two jobs opening one
/// location at once, one holds it and the other sees it held.
pub(super) fn acquire(loc: &Location) -> Result<(), CheckpointError> {
    let me = serde_json::to_vec(&Holder::me()).expect("a holder is JSON");
    let current = match loc.get(LEASE)? {
        None if loc.put_new(LEASE, &me)? => return Ok(()),
        // another job wrote it between the read and the write
        None => holder(loc)?,
        Some(b) => serde_json::from_slice::<Holder>(&b).ok(),
    };
    match current {
        Some(h) if h.is_me() => return Ok(()),
        Some(h) if h.alive() => {
            let how = if h.host == hostname() {
                String::new()
            } else {
                format!(
                    " (a job of another host that stopped holds it {} s after its last renewal)",
                    STALE_AFTER.as_secs()
                )
            };
            return Err(CheckpointError::Storage {
                location: loc.describe(),
                message: format!(
                    "another job writes checkpoints here ({}): stop it, or give this one \
                     another checkpoint location{how}",
                    h.describe()
                ),
            });
        }
        Some(h) => tracing::warn!(
            "checkpoints in {}: taking them over from a job that is gone ({})",
            loc.describe(),
            h.describe()
        ),
        None => {}
    }
    loc.put(LEASE, &me)
}

/// Before a commit: an error when another job has taken the lease over since.
pub(super) fn check(loc: &Location) -> Result<(), CheckpointError> {
    match holder(loc)? {
        Some(h) if !h.is_me() => Err(CheckpointError::Storage {
            location: loc.describe(),
            message: format!(
                "another job took these checkpoints over ({}): this save is not committed",
                h.describe()
            ),
        }),
        _ => Ok(()),
    }
}

/// Renews this process's lease every [`RENEW_EVERY`] until dropped, so that jobs of other
/// hosts see it alive. A lease found taken over is no longer renewed, said once; the next
/// commit then fails its check.
pub(super) struct Renewer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Renewer {
    pub(super) fn start(loc: Arc<Location>, every: Duration) -> Renewer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("checkpoint-lease".into())
            .spawn(move || loop {
                std::thread::park_timeout(every);
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match renew(&loc) {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            "checkpoints in {}: another job took the lease over; this job's \
                             saves will not be committed",
                            loc.describe()
                        );
                        return;
                    }
                    // the store's trouble: tried again at the next renewal
                    Err(e) => {
                        tracing::warn!("checkpoints in {}: renewing the lease: {e}", loc.describe())
                    }
                }
            })
            .ok();
        Renewer { stop, thread }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Writes the lease again with this moment as its renewal, if this process still holds it;
/// `false` when it does not.
fn renew(loc: &Location) -> Result<bool, CheckpointError> {
    match holder(loc)? {
        Some(mut h) if h.is_me() => {
            h.renewed = now_secs();
            loc.put(LEASE, &serde_json::to_vec(&h).expect("a holder is JSON"))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Gives the lease back, if this process holds it.
pub(super) fn release(loc: &Location) {
    if let Ok(Some(h)) = holder(loc) {
        if h.is_me() {
            let _ = loc.delete(LEASE, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_lease_is_taken_once_a_live_holder_refuses_and_a_gone_one_is_taken_over() {
        let root = std::env::temp_dir().join(format!("npc-lease-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let loc = Location::Local(root.clone());
        acquire(&loc).unwrap();
        acquire(&loc).unwrap(); // ours already
                                // a create-only write over it fails and changes nothing
        assert!(!loc.put_new(LEASE, b"another job").unwrap());
        assert!(holder(&loc).unwrap().unwrap().is_me());
        // another live process of this host holds it
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let theirs = Holder {
            pid: other.id(),
            ..Holder::me()
        };
        loc.put(LEASE, &serde_json::to_vec(&theirs).unwrap())
            .unwrap();
        let e = acquire(&loc).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", other.id())), "{e}");
        assert!(check(&loc).is_err());
        release(&loc); // not ours: stays
        assert_eq!(holder(&loc).unwrap(), Some(theirs));
        // gone: taken over
        other.kill().unwrap();
        other.wait().unwrap();
        acquire(&loc).unwrap();
        assert!(holder(&loc).unwrap().unwrap().is_me());
        check(&loc).unwrap();
        release(&loc);
        assert_eq!(holder(&loc).unwrap(), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn another_hosts_lease_is_alive_while_renewed_and_a_renewer_renews_ours() {
        let root = std::env::temp_dir().join(format!("npc-lease-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let loc = Arc::new(Location::Local(root.clone()));
        let theirs = |silent: u64| Holder {
            host: "another-host".into(),
            pid: 1,
            since: now_secs() - 3600,
            renewed: now_secs() - silent,
        };
        let put = |h: &Holder| loc.put(LEASE, &serde_json::to_vec(h).unwrap()).unwrap();
        // renewed 5 s ago: alive, so refused, and named
        put(&theirs(5));
        let e = acquire(&loc).unwrap_err().to_string();
        // 5 s when planted; a second boundary may pass before it is read
        assert!(
            e.contains("pid 1 on another-host")
                && (e.contains("renewed 5 s ago") || e.contains("renewed 6 s ago")),
            "{e}"
        );
        // silent past STALE_AFTER: a gone job's, taken over
        put(&theirs(STALE_AFTER.as_secs() + 1));
        acquire(&loc).unwrap();
        let mut ours = holder(&loc).unwrap().unwrap();
        assert!(ours.is_me());
        // ours, renewed by the renewer
        ours.renewed = now_secs() - 100;
        put(&ours);
        let renewer = Renewer::start(loc.clone(), Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(400));
        drop(renewer);
        let renewed = holder(&loc).unwrap().unwrap();
        assert!(renewed.is_me() && renewed.silent_for() <= 2, "{renewed:?}");
        // taken over meanwhile: not renewed, not overwritten
        let other = theirs(200);
        put(&other);
        assert!(!renew(&loc).unwrap());
        assert_eq!(holder(&loc).unwrap(), Some(other));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
