//! Which job writes a checkpoint location: a lease object (`.lease.json` at its root) naming the
//! process that holds it. Two jobs writing one location would commit over each other and one
//! would resume the other's state; the lease makes the second one stop before step 1 instead.
//!
//! Taken when the location is opened (by rank 0 of a run of several processes: the others only
//! write parts that rank 0 commits), checked before each commit, given back when the
//! [`super::Checkpoints`] is dropped. Another live process on this host holding it is an error
//! naming that process; one that is gone (killed, its lease left behind) is taken over with a
//! warning, as is one held from another host, whose liveness this host cannot see: that warning
//! says that both would write here if it still runs. A free lease is taken by a create-only
//! write, so two jobs opening one location at the same instant cannot both take it.

use crate::checkpoint::{CheckpointError, Location};

/// The lease's object: a dot name, so local listings skip it; outside every step directory,
/// so no checkpoint's listing or deletion sees it.
pub(super) const LEASE: &str = ".lease.json";

/// Who holds a lease.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Holder {
    host: String,
    pid: u32,
    /// Seconds since the Unix epoch when it was taken.
    since: u64,
}

impl Holder {
    fn me() -> Holder {
        Holder {
            host: host(),
            pid: std::process::id(),
            since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    fn is_me(&self) -> bool {
        self.host == host() && self.pid == std::process::id()
    }

    fn describe(&self) -> String {
        format!(
            "pid {} on {} since {} (Unix time)",
            self.pid, self.host, self.since
        )
    }
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
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
        Some(h) if h.host == host() && alive(h.pid) => {
            return Err(CheckpointError::Storage {
                location: loc.describe(),
                message: format!(
                    "another job writes checkpoints here ({}): stop it, or give this one \
                     another checkpoint location",
                    h.describe()
                ),
            });
        }
        Some(h) if h.host == host() => tracing::warn!(
            "checkpoints in {}: taking them over from a job that is gone ({})",
            loc.describe(),
            h.describe()
        ),
        Some(h) => tracing::warn!(
            "checkpoints in {}: taking them over from a job of another host ({}); if it still \
             runs, both jobs write here and each may resume the other's state",
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
}
