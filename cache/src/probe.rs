//! A round trip through every tier (write an entry, read it back verified, delete it), for a
//! preflight such as `neuron-pc doctor`. Unlike lookups and puts, which step around trouble so
//! that a job goes on, the probe reports the first failing step of each tier.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::cache::{failure_name, record_name, Cache};
use crate::error::Error;
use crate::key::EntryKey;
use crate::maintain::remove_entry;
use crate::store::Tier;

/// The program text stored with a probe entry.
const PROBE_PROGRAM: &str = "neuron-pc cache probe";

/// One step of a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStep {
    /// Writing the entry (executable, program, record).
    Write,
    /// Reading it back: found, digest (and signature) verified, the same bytes.
    ReadBack,
    /// Deleting it, and finding it gone.
    Delete,
}

impl std::fmt::Display for ProbeStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProbeStep::Write => "write",
            ProbeStep::ReadBack => "read back",
            ProbeStep::Delete => "delete",
        })
    }
}

/// Milliseconds each step of a successful probe took.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ProbeTimes {
    /// Writing the entry.
    pub write_ms: f64,
    /// Reading and verifying it.
    pub read_ms: f64,
    /// Deleting it and checking that it is gone.
    pub delete_ms: f64,
}

/// What probing one tier found.
#[derive(Debug)]
pub struct TierProbe {
    /// `/path` or `s3://bucket/prefix`.
    pub store: String,
    /// Which tier.
    pub tier: Tier,
    /// The step times, or the first step that failed and why.
    pub result: std::result::Result<ProbeTimes, (ProbeStep, Error)>,
    /// Whether the store honours create-only writes atomically (S3: `If-None-Match: *`);
    /// `None` when not asked (a read-only cache, or a failed probe).
    pub conditional_put: Option<bool>,
}

impl Cache {
    /// Writes an entry of `executable` under `key` into each tier in turn, reads it back
    /// (verified as every read is: size, SHA-256, signature when a signing key is set), checks
    /// the bytes, deletes it and checks that it is gone. Tiers this process has switched off
    /// are probed too (the probe is how to learn why). A read-only cache fails at the write
    /// step without writing. Pick a key no real entry has (a digest of something unique).
    pub fn probe(&self, key: &EntryKey, executable: &[u8]) -> Vec<TierProbe> {
        let inputs = BTreeMap::from([("probe".to_string(), PROBE_PROGRAM.to_string())]);
        let record = self.new_record(key, executable, PROBE_PROGRAM, &inputs, 0.0);
        self.tiers
            .iter()
            .map(|tier| {
                let store = tier.store.as_ref();
                let result = if self.opts.read_only {
                    Err((ProbeStep::Write, Error::ReadOnly))
                } else {
                    let mut times = ProbeTimes::default();
                    let t = Instant::now();
                    let written = self.write_entry(
                        tier,
                        key,
                        executable,
                        PROBE_PROGRAM.as_bytes(),
                        &record,
                        true,
                    );
                    times.write_ms = ms(t);
                    let t = Instant::now();
                    let read = written.map_err(|e| (ProbeStep::Write, e)).and_then(|()| {
                        match self.read_entry(tier, key) {
                            Ok(Some(hit)) if hit.executable == executable => Ok(()),
                            Ok(Some(_)) => Err(corrupt(key, "read back other bytes than written")),
                            Ok(None) => Err(corrupt(key, "written, then not found")),
                            Err(e) => Err(e),
                        }
                        .map_err(|e| (ProbeStep::ReadBack, e))
                    });
                    times.read_ms = ms(t);
                    // Delete whatever was written, even after a failed step; a server that
                    // does not answer is not asked again.
                    let reachable = !matches!(read, Err((_, Error::Unavailable { .. })));
                    let t = Instant::now();
                    let deleted = if reachable {
                        remove_entry(store, key)
                            .and_then(|()| store.delete(&failure_name(key)))
                            .and_then(|()| match store.get(&record_name(key))? {
                                Some(_) => Err(corrupt(key, "still there after deleting it")),
                                None => Ok(()),
                            })
                    } else {
                        Ok(())
                    };
                    times.delete_ms = ms(t);
                    read.and(deleted.map_err(|e| (ProbeStep::Delete, e)))
                        .map(|()| times)
                };
                let conditional_put = match (&result, self.opts.read_only) {
                    (Ok(_), false) => store.conditional_put().ok(),
                    _ => None,
                };
                TierProbe {
                    store: store.describe(),
                    tier: store.tier(),
                    result,
                    conditional_put,
                }
            })
            .collect()
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn corrupt(key: &EntryKey, message: &str) -> Error {
    Error::Corrupt {
        key: key.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::CacheOptions;

    fn key() -> EntryKey {
        EntryKey::parse(&crate::record::sha256_hex(b"probe test")).unwrap()
    }

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("npc-probe-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn walk(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path().display().to_string());
            }
        }
        out
    }

    #[test]
    fn a_probe_leaves_nothing_behind_and_keeps_other_entries() {
        let dir = tmp("local");
        let c = Cache::open(dir.to_str().unwrap(), CacheOptions::default()).unwrap();
        let other = EntryKey::parse(&"ab".repeat(32)).unwrap();
        c.put(&other, &[1, 2, 3], "p", &BTreeMap::new(), 1.0);
        let probes = c.probe(&key(), &[9; 4096]);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].tier, Tier::Local);
        assert_eq!(probes[0].store, dir.display().to_string());
        assert!(probes[0].result.is_ok(), "{:?}", probes[0].result);
        let keys: Vec<String> = c.list().unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, [other.to_string()]);
        let left: Vec<_> = walk(&dir)
            .into_iter()
            .filter(|p| p.contains(key().as_str()))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_read_only_cache_fails_at_the_write_and_writes_nothing() {
        let dir = tmp("ro");
        std::fs::create_dir_all(&dir).unwrap();
        let opts = CacheOptions {
            read_only: true,
            ..CacheOptions::default()
        };
        let c = Cache::open(dir.to_str().unwrap(), opts).unwrap();
        let probes = c.probe(&key(), b"x");
        match &probes[0].result {
            Err((ProbeStep::Write, Error::ReadOnly)) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
