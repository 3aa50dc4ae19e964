//! The protocol of a checkpoint saved by several processes: each rank writes its part of the
//! manifest (`rank-NNNNN.json`, with the save's nonce) or, when its save failed, a note saying
//! why; rank 0 gathers the parts of this save and merges them; a resume clears the parts of
//! unfinished saves. See `docs/design.md`, "Checkpoints at scale".

use std::time::{Duration, Instant};

use super::checkpoints::{committed, storage, CheckpointOptions};
use crate::checkpoint::manifest::{self, Manifest};
use crate::checkpoint::{CheckpointError, Location};
use crate::error::Result;
use crate::store::{KvStore, ScopedStore};

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
    options: &CheckpointOptions,
) -> Result<Option<String>> {
    if let Some(store) = store {
        if rank == 0 {
            let nonce = random_hex();
            store.set(NONCE_KEY, nonce.as_bytes())?;
            return Ok(Some(nonce));
        }
        let value = store.get(NONCE_KEY, options.rank_timeout)?;
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
fn random_hex() -> String {
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

/// Deletes the ranks' parts (`rank-NNNNN.json`) of unfinished saves: what a killed run of
/// several processes left, which a new save of the same step would otherwise merge.
pub(super) fn clear_stale_parts(loc: &Location) -> std::result::Result<(), CheckpointError> {
    let names = loc.list()?;
    let done: Vec<String> = committed(&names).into_iter().map(|c| c.name).collect();
    for n in &names {
        let Some((dir, file)) = n.split_once('/') else {
            continue;
        };
        if file.starts_with("rank-") && file.ends_with(".json") && !done.iter().any(|d| d == dir) {
            loc.delete(n, true)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::manifest::{dir_name, MANIFEST};
    use crate::checkpoint::manifest::{sha256, Chunk, FileEntry, TensorEntry};
    use crate::checkpoint::StateDict;
    use crate::state::checkpoints::load;
    use neuron_pc_compiler::HostTensor;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// What rank `rank` of two writes of a 6-element `w` (rank 0) and of its moments (3
    /// elements each): its file, and its part of the manifest.
    fn write_rank(loc: &Location, dir: &str, rank: usize, moments: &[f32], nonce: &str) {
        let file = format!("rank-{rank:05}-model-00001-of-00001.safetensors");
        let mut sd = StateDict::default();
        let mut part = Manifest::new(7, 2, BTreeMap::from([("step".into(), "7".into())]));
        part.nonce = Some(nonce.to_string());
        let chunk = |key: &str, start, len| Chunk {
            block: None,
            file: file.clone(),
            key: key.to_string(),
            start,
            len,
            at: None,
            sha256: None,
        };
        if rank == 0 {
            let w = HostTensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
            sd.tensors.insert("w".into(), w);
            part.tensors.insert(
                "w".into(),
                TensorEntry {
                    dtype: "f32".into(),
                    shape: vec![2, 3],
                    chunks: vec![chunk("w", 0, 6)],
                },
            );
        }
        let key = format!("optimizer.w.exp_avg#{rank}");
        sd.tensors
            .insert(key.clone(), HostTensor::from_slice(moments, &[3]).unwrap());
        part.tensors.insert(
            "optimizer.w.exp_avg".into(),
            TensorEntry {
                dtype: "f32".into(),
                shape: vec![2, 3],
                chunks: vec![chunk(&key, 3 * rank, 3)],
            },
        );
        let path = std::env::temp_dir().join(format!("npc-rank-{}-{rank}", std::process::id()));
        sd.save(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        loc.put(&format!("{dir}/{file}"), &bytes).unwrap();
        let entry = FileEntry {
            bytes: bytes.len() as u64,
            sha256: sha256(&bytes),
        };
        part.files.insert(file, entry);
        let json = serde_json::to_vec(&part).unwrap();
        loc.put(&format!("{dir}/rank-{rank:05}.json"), &json)
            .unwrap();
    }

    #[test]
    fn rank_zero_merges_every_ranks_part_and_the_whole_tensors_load() {
        let root = std::env::temp_dir().join(format!("npc-ckpt-ranks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let loc = Arc::new(Location::Local(root.clone()));
        let dir = dir_name(7);
        // a killed save of the same step left rank 1's part and file, of another nonce
        write_rank(&loc, &dir, 1, &[9.0, 9.0, 9.0], "killed.1");
        write_rank(&loc, &dir, 0, &[0.1, 0.2, 0.3], "now.1");
        // rank 1 is late: rank 0 waits past the old part for this save's
        let late = loc.clone();
        let d = dir.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            write_rank(&late, &d, 1, &[0.4, 0.5, 0.6], "now.1");
        });
        let nonce = Some("now.1");
        let merged = gather_parts(&loc, &dir, 2, nonce, Duration::from_secs(20)).unwrap();
        writer.join().unwrap();
        let json = serde_json::to_vec(&merged).unwrap();
        Manifest::parse(&dir, &json).unwrap();
        loc.put(&format!("{dir}/{MANIFEST}"), &json).unwrap();
        let sd = load(&loc, &dir).unwrap();
        let m = sd.tensors["optimizer.w.exp_avg"].to_f64_vec();
        let want = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6].map(f64::from);
        assert_eq!(m, want);
        assert_eq!(sd.tensors["w"].dims(), [2, 3]);
        assert_eq!(sd.metadata["step"], "7");
        // a rank that never writes its part fails the save after the timeout
        let err = gather_parts(&loc, &dir, 3, nonce, Duration::from_millis(300)).unwrap_err();
        assert!(
            err.to_string().contains("rank 2 did not write its part"),
            "{err}"
        );
        // ... and one whose only part there is another save's says so
        let next = Some("now.2");
        let err = gather_parts(&loc, &dir, 2, next, Duration::from_millis(300)).unwrap_err();
        let want = concat!(
            "rank 0 did not write its part in 300ms; its part there is of another save ",
            "(nonce now.1, this save's now.2)"
        );
        assert!(err.to_string().contains(want), "{err}");
        // a rank whose save failed says so, and rank 0 stops waiting at once
        let other = dir_name(8);
        write_rank(&loc, &other, 0, &[0.1, 0.2, 0.3], "now.3");
        let failed = serde_json::json!({ "nonce": "now.3", "error": "disk full" });
        loc.put(&failed_name(&other, 1), failed.to_string().as_bytes())
            .unwrap();
        let started = Instant::now();
        let long = Duration::from_secs(600);
        let err = gather_parts(&loc, &other, 2, Some("now.3"), long).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(60));
        assert!(
            err.to_string()
                .contains("rank 1 could not write its part: disk full"),
            "{err}"
        );
        // a killed attempt's part at a later step goes at resume; committed ones stay
        let late = dir_name(9);
        write_rank(&loc, &late, 1, &[0.0; 3], "killed.2");
        clear_stale_parts(&loc).unwrap();
        let names = loc.list().unwrap();
        assert!(
            !names.contains(&format!("{late}/rank-00001.json")),
            "{names:?}"
        );
        assert!(
            names.contains(&format!("{dir}/rank-00001.json")),
            "{names:?}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
