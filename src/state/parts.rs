//! The protocol of a checkpoint saved by several processes: each rank writes its part of the
//! manifest (`rank-NNNNN.json`, with the save's nonce) or, when its save failed, a note saying
//! why; rank 0 gathers the parts of this save and merges them; a resume clears the parts of
//! unfinished saves. See `docs/design.md`, "Checkpoints at scale".

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::state::manifest::{self, Manifest};
use crate::state::Location;
use crate::state_dict::CheckpointError;
use crate::store::{KvStore, ScopedStore};

fn storage(location: &str, message: &str) -> CheckpointError {
    CheckpointError::Storage {
        location: location.to_string(),
        message: message.to_string(),
    }
}

/// Rank 0 of a run of several processes: waits for every rank's part of the manifest of the
/// save whose nonce is `nonce` (a part of another save, left by a killed run, is not this
/// save's: it is waited past), then merges them.
pub(super) fn gather_parts(
    loc: &Location,
    dir: &str,
    ranks: usize,
    nonce: Option<&str>,
    timeout: Duration,
) -> Result<Manifest> {
    let deadline = Instant::now() + timeout;
    let mut merged: Option<Manifest> = None;
    let mut next = 0;
    let mut stale = None;
    while next < ranks {
        let name = format!("{dir}/rank-{next:05}.json");
        let part = match loc.get(&name)? {
            Some(bytes) => {
                let part: Manifest =
                    serde_json::from_slice(&bytes).map_err(|e| manifest::corrupt(&name, e))?;
                if part.nonce.as_deref() == nonce {
                    Some(part)
                } else {
                    stale = Some(part.nonce.unwrap_or_else(|| "none".into()));
                    None
                }
            }
            None => None,
        };
        match part {
            Some(part) => {
                match &mut merged {
                    None => merged = Some(part),
                    Some(m) => m.merge(part)?,
                }
                next += 1;
                stale = None;
            }
            None => {
                if let Some(why) = failed_part(loc, dir, next, nonce)? {
                    let message = format!("{dir}: rank {next} could not write its part: {why}");
                    return Err(storage(&loc.describe(), &message).into());
                }
                if Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                let found = match stale.take() {
                    Some(other) => format!(
                        "; its part there is of another save (nonce {other}, this save's {})",
                        nonce.unwrap_or("none")
                    ),
                    None => String::new(),
                };
                return Err(storage(
                    &loc.describe(),
                    &format!("{dir}: rank {next} did not write its part in {timeout:?}{found}"),
                )
                .into());
            }
        }
    }
    Ok(merged.expect("at least one rank"))
}

/// What a rank whose save failed leaves for rank 0 instead of its part.
pub(super) fn failed_name(dir: &str, rank: usize) -> String {
    format!("{dir}/rank-{rank:05}.failed.json")
}

/// Why rank `rank` could not write its part of the save whose nonce is `nonce`, if it said so.
fn failed_part(
    loc: &Location,
    dir: &str,
    rank: usize,
    nonce: Option<&str>,
) -> Result<Option<String>> {
    let Some(bytes) = loc.get(&failed_name(dir, rank))? else {
        return Ok(None);
    };
    let said: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if said["nonce"].as_str() != nonce {
        return Ok(None);
    }
    Ok(Some(
        said["error"]
            .as_str()
            .unwrap_or("no reason given")
            .to_string(),
    ))
}

/// Where a run of several processes keeps the nonce of its attempt's saves, in the run's store.
const NONCE_KEY: &str = "checkpoint/nonce";

/// The nonce this attempt's saves are told apart by, agreed by its `processes` ranks: rank 0
/// draws one and sets it in the run's store (the device's, which its rank check uses: the
/// attempt's namespace, so a restart never sees the last attempt's); the others read it.
/// Without a store, the launcher's run id and attempt (a restart has another); without either,
/// none, said once in a warning: a part left by a killed save could then be merged into a new
/// save of the same step.
pub(super) fn attempt_nonce(
    store: Option<&ScopedStore>,
    rank: usize,
    processes: usize,
    rank_timeout: Duration,
) -> Result<Option<String>> {
    if let Some(store) = store {
        if rank == 0 {
            let nonce = random_hex();
            store.set(NONCE_KEY, nonce.as_bytes())?;
            return Ok(Some(nonce));
        }
        let value = store.get(NONCE_KEY, rank_timeout)?;
        return Ok(Some(String::from_utf8_lossy(&value).into_owned()));
    }
    let var = |name: &str| std::env::var(name).ok();
    match crate::store::RunScope::from_vars(var) {
        Ok(scope) => Ok(Some(format!("{}/{}", scope.run_id, scope.attempt))),
        Err(_) => {
            tracing::warn!(
                "checkpoints of this run of {processes} processes carry no nonce: with neither a \
                 store ({}) nor a run id ({}), a part a killed save left could be merged into a \
                 new save of its step",
                crate::store::STORE_ENV,
                crate::store::RUN_ID_ENV
            );
            Ok(None)
        }
    }
}

/// 64 random bits, in hex: from the standard library's randomly keyed hasher, fed the time.
pub(super) fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Deletes the ranks' parts (`rank-NNNNN.json`) of unfinished saves among the location's
/// object `names` (those not in a `done`, committed, directory): what a killed run of several
/// processes left, which a new save of the same step would otherwise merge.
pub(super) fn clear_stale_parts(
    loc: &Location,
    names: &[String],
    done: &[String],
) -> std::result::Result<(), CheckpointError> {
    for n in names {
        let Some((dir, file)) = n.split_once('/') else {
            continue;
        };
        if file.starts_with("rank-") && file.ends_with(".json") && !done.iter().any(|d| d == dir) {
            loc.delete(n, true)?;
        }
    }
    Ok(())
}
