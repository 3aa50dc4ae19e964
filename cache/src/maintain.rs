//! The maintenance operations behind `neuron-pc cache`: listing, totals, verification,
//! removal and least-recently-used eviction.

use std::collections::{BTreeMap, HashSet};

use crate::cache::{
    exe_name, failure_name, key_of, record_name, Cache, EntryInfo, Stats, VerifyReport,
};
use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::record::{EntryRecord, FailureRecord};
use crate::store::{Store, Tier};

impl Cache {
    /// The failure record of `key`, whichever compiler wrote it (for `cache show`).
    pub fn failure(&self, key: &CacheKey) -> Option<FailureRecord> {
        self.live_tiers().find_map(|t| {
            let b = t.store.get(&failure_name(key)).ok().flatten()?;
            FailureRecord::parse(key, &b).ok()
        })
    }

    /// Why the entry of `key` is not served: the first tier's verification error, if any.
    pub fn check(&self, key: &CacheKey) -> Result<()> {
        for tier in self.live_tiers() {
            match self.read_entry(tier, key) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every entry (from the first tier that has it).
    pub fn list(&self) -> Result<Vec<EntryInfo>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for tier in self.live_tiers() {
            for obj in tier.store.list("entries/")? {
                let Some(k) = obj
                    .name
                    .rsplit('/')
                    .next()
                    .and_then(|f| f.strip_suffix(".json"))
                else {
                    continue;
                };
                let Ok(key) = CacheKey::parse(k) else {
                    continue;
                };
                if !seen.insert(key.clone()) {
                    continue;
                }
                let Some(b) = tier.store.get(&obj.name).ok().flatten() else {
                    continue;
                };
                let Ok(r) = EntryRecord::parse(&key, &b) else {
                    continue;
                };
                out.push(EntryInfo {
                    key: r.key,
                    tier: tier.store.tier(),
                    executable_size: r.executable_size,
                    program_size: r.program_size,
                    compile_ms: r.compile_ms,
                    created_at: r.created_at,
                    tool_version: r.tool_version,
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Counts over the first live tier.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = Stats::default();
        if let Some(t) = self.live_tiers().next() {
            for o in t.store.list("entries/")? {
                s.bytes += o.size;
                if o.name.ends_with(".json") {
                    s.entries += 1;
                }
            }
            s.failures = t.store.list("failures/")?.len();
            s.locks = t.store.list("locks/")?.len();
        }
        Ok(s)
    }

    /// Checks every entry's digest (and signature); with `fix`, removes the bad ones and the
    /// leftovers of writers that died (temporary files, executables no record names, stale
    /// compile locks).
    pub fn verify(&self, fix: bool) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let fix = fix && !self.opts.read_only;
        for tier in self.live_tiers() {
            let objects = tier.store.list("entries/")?;
            let mut by_key: BTreeMap<CacheKey, Vec<String>> = BTreeMap::new();
            for o in &objects {
                if let Some(k) = key_of(&o.name) {
                    by_key.entry(k).or_default().push(o.name.clone());
                }
            }
            for (key, names) in by_key {
                let has_record = names.iter().any(|n| n.ends_with(".json"));
                let problem = match self.read_entry(tier, &key) {
                    Ok(Some(hit)) => {
                        let keep = exe_name(&key, &hit.record.executable_sha256);
                        for orphan in names.iter().filter(|n| n.ends_with(".exe") && **n != keep) {
                            if fix && tier.store.delete(orphan).is_ok() {
                                report.leftovers += 1;
                            }
                        }
                        None
                    }
                    Ok(None) if !has_record => {
                        Some("executable without record (incomplete write)".to_string())
                    }
                    Ok(None) => None, // removed while we looked
                    Err(e) => Some(e.to_string()),
                };
                report.checked += usize::from(has_record);
                if let Some(p) = problem {
                    report.bad.push((
                        key.to_string(),
                        format!("{} ({})", p, tier.store.describe()),
                    ));
                    if fix {
                        remove_entry(tier.store.as_ref(), &key)?;
                        report.removed += 1;
                    }
                }
            }
            if fix {
                report.leftovers += tier.store.clean_leftovers();
                for lock in tier.store.list("locks/")? {
                    let stale = match tier.store.get(&lock.name) {
                        Ok(Some(b)) => serde_json::from_slice::<crate::lease::Lease>(&b)
                            .map_or(true, |l| l.is_stale()),
                        _ => false,
                    };
                    if stale && tier.store.delete(&lock.name).is_ok() {
                        report.leftovers += 1;
                    }
                }
            }
        }
        Ok(report)
    }

    /// Removes `key` (entry and failure record) from every tier.
    pub fn remove(&self, key: &CacheKey) -> Result<()> {
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        for tier in self.live_tiers() {
            remove_entry(tier.store.as_ref(), key)?;
            tier.store.delete(&failure_name(key))?;
        }
        Ok(())
    }

    /// Removes everything, or only failure records.
    pub fn clear(&self, failed_only: bool) -> Result<usize> {
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        let mut n = 0;
        for tier in self.live_tiers() {
            let prefixes: &[&str] = if failed_only {
                &["failures/"]
            } else {
                &["entries/", "failures/", "locks/"]
            };
            for p in prefixes {
                for o in tier.store.list(p)? {
                    tier.store.delete(&o.name)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Evicts least recently used entries of the local tier until it holds at most
    /// `max_bytes`; returns how many entries went. Objects that vanish meanwhile (another
    /// process evicting too) are simply skipped.
    pub fn prune(&self, max_bytes: u64) -> Result<usize> {
        let Some(tier) = self.live_tiers().find(|t| t.store.tier() == Tier::Local) else {
            return Ok(0);
        };
        let objects = tier.store.list("entries/")?;
        let mut total: u64 = objects.iter().map(|o| o.size).sum();
        if total <= max_bytes {
            return Ok(0);
        }
        let mut sizes: BTreeMap<CacheKey, u64> = BTreeMap::new();
        for o in &objects {
            if let Some(k) = key_of(&o.name) {
                *sizes.entry(k).or_default() += o.size;
            }
        }
        // Recency is the record's modification time (hits touch it); entries without a
        // record (incomplete) sort first.
        let mut order: Vec<(std::time::SystemTime, CacheKey)> = sizes
            .keys()
            .map(|k| {
                let t = objects
                    .iter()
                    .find(|o| o.name == record_name(k))
                    .map_or(std::time::SystemTime::UNIX_EPOCH, |o| o.modified);
                (t, k.clone())
            })
            .collect();
        order.sort();
        let mut removed = 0;
        for (_, key) in order {
            if total <= max_bytes {
                break;
            }
            remove_entry(tier.store.as_ref(), &key)?;
            total = total.saturating_sub(sizes.get(&key).copied().unwrap_or(0));
            removed += 1;
        }
        Ok(removed)
    }

    pub(crate) fn enforce_bound(&self) {
        if let Some(max) = self.opts.max_local_bytes {
            if let Err(e) = self.prune(max) {
                self.warn_once("prune", &format!("evicting old entries failed: {e}"));
            }
        }
    }
}

/// Deletes an entry, record first so no reader sees a record without its executable.
fn remove_entry(store: &dyn Store, key: &CacheKey) -> Result<()> {
    store.delete(&record_name(key))?;
    for o in store.list(&format!("entries/{}/{key}.", key.shard()))? {
        store.delete(&o.name)?;
    }
    Ok(())
}
