//! The maintenance operations behind `neuron-pc cache`: listing, totals, verification,
//! removal and least-recently-used eviction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::cache::{
    exe_name, failure_name, key_of, program_name, record_name, Cache, EntryInfo, Stats, TierStats,
    VerifyReport,
};
use crate::error::{Error, Result};
use crate::key::EntryKey;
use crate::record::{EntryRecord, FailureRecord, MAX_RECORD_BYTES};

/// A caller's judgement of one verified executable, given its record and its stored program
/// text (empty when none is stored): `Err(why)` when it is bad (it does not load, or does not
/// take and return what its program does). The cache knows nothing of programs or plugins;
/// the compiler side does.
pub type ExecutableCheck<'a> =
    &'a dyn Fn(&EntryKey, &EntryRecord, &str, &[u8]) -> std::result::Result<Judged, String>;

/// How a checker judged an executable it did not refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    /// Loaded by the caller's plugin; `against_program` when its interface was also checked
    /// against the stored program's signature.
    Loaded {
        /// The program's signature was compared with the executable's.
        against_program: bool,
    },
    /// Not loaded here, and why (written by another compiler, no plugin): only its digest
    /// (and signature) were checked.
    NotLoaded(String),
}
use crate::store::{Store, Tier};

impl Cache {
    /// The failure record of `key`, whichever compiler wrote it (for `cache show`).
    pub fn failure(&self, key: &EntryKey) -> Option<FailureRecord> {
        self.live_tiers().find_map(|t| {
            let b = t.store.get(&failure_name(key)).ok().flatten()?;
            FailureRecord::parse(key, &b).ok()
        })
    }

    /// Why the entry of `key` is not served: the first tier's verification error, if any.
    pub fn check(&self, key: &EntryKey) -> Result<()> {
        for tier in self.live_tiers() {
            match self.read_entry(tier, key) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every entry, with the tiers holding it; an entry whose record cannot be read is listed
    /// with its problem (never hidden).
    pub fn list(&self) -> Result<Vec<EntryInfo>> {
        let mut out: BTreeMap<EntryKey, EntryInfo> = BTreeMap::new();
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
                let Ok(key) = EntryKey::parse(k) else {
                    continue;
                };
                let t = tier.store.tier();
                if let Some(e) = out.get_mut(&key) {
                    e.tiers.push(t);
                    continue;
                }
                let read = tier
                    .store
                    .get_max(&obj.name, MAX_RECORD_BYTES as u64)
                    .and_then(|b| match b {
                        Some(b) => EntryRecord::parse(&key, &b),
                        None => Err(Error::Corrupt {
                            key: key.to_string(),
                            message: "record removed while listing".into(),
                        }),
                    });
                let info = match read {
                    Ok(r) => EntryInfo {
                        key: r.key,
                        tier: t,
                        tiers: vec![t],
                        problem: None,
                        executable_size: r.executable_size,
                        program_size: r.program_size,
                        compile_ms: r.compile_ms,
                        created_at: r.created_at,
                        tool_version: r.tool_version,
                    },
                    Err(e) => EntryInfo {
                        key: key.to_string(),
                        tier: t,
                        tiers: vec![t],
                        problem: Some(format!("unreadable record: {e}")),
                        executable_size: 0,
                        program_size: 0,
                        compile_ms: 0.0,
                        created_at: 0,
                        tool_version: String::new(),
                    },
                };
                out.insert(key, info);
            }
        }
        Ok(out.into_values().collect())
    }

    /// The key an unambiguous prefix (or a whole key) names, among entries and failure
    /// records of every tier.
    pub fn resolve(&self, prefix: &str) -> Result<EntryKey> {
        let prefix = prefix.trim();
        if let Ok(k) = EntryKey::parse(prefix) {
            return Ok(k);
        }
        if prefix.is_empty()
            || prefix.len() > 64
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::InvalidKey {
                key: prefix.chars().take(80).collect(),
            });
        }
        let mut found: BTreeSet<EntryKey> = BTreeSet::new();
        for tier in self.live_tiers() {
            let shard = if prefix.len() >= 2 {
                format!("entries/{}/", &prefix[..2])
            } else {
                "entries/".to_string()
            };
            for o in tier
                .store
                .list(&shard)?
                .into_iter()
                .chain(tier.store.list("failures/")?)
            {
                if let Some(k) = key_of(&o.name).filter(|k| k.as_str().starts_with(prefix)) {
                    found.insert(k);
                }
            }
        }
        let mut found: Vec<EntryKey> = found.into_iter().collect();
        match found.len() {
            0 => Err(Error::NotFound {
                key: prefix.to_string(),
                store: self.describe(),
            }),
            1 => Ok(found.remove(0)),
            _ => Err(Error::Ambiguous {
                prefix: prefix.to_string(),
                candidates: found.iter().map(|k| k.to_string()).collect(),
            }),
        }
    }

    /// Counts per tier, and over all of them.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = Stats {
            shared: self.tiers.iter().any(|t| t.store.tier() == Tier::Remote),
            signed: self.opts.signing_key.is_some(),
            ..Stats::default()
        };
        let (mut entries, mut failures) = (BTreeSet::new(), BTreeSet::new());
        for t in self.live_tiers() {
            let mut ts = TierStats {
                store: t.store.describe(),
                ..TierStats::default()
            };
            for o in t.store.list("entries/")? {
                ts.bytes += o.size;
                if o.name.ends_with(".json") {
                    ts.entries += 1;
                    entries.extend(key_of(&o.name));
                }
            }
            let f = t.store.list("failures/")?;
            ts.failures = f.len();
            failures.extend(f.iter().filter_map(|o| key_of(&o.name)));
            ts.locks = t.store.list("locks/")?.len();
            s.bytes += ts.bytes;
            s.locks += ts.locks;
            s.tiers.push(ts);
        }
        s.entries = entries.len();
        s.failures = failures.len();
        Ok(s)
    }

    /// Checks every entry's digest (and signature); with `fix`, removes the bad ones and the
    /// leftovers of writers that died (temporary files, executables no record names, stale
    /// compile locks).
    pub fn verify(&self, fix: bool) -> Result<VerifyReport> {
        self.verify_with(fix, None)
    }

    /// Like [`Cache::verify`]; `check`, when given, also judges each verified executable
    /// against its stored program text (for example: does the executable's signature match
    /// the program's), and an executable it refuses is bad. A read-only cache only reports
    /// (`fix` is ignored; the command line refuses `--fix` outright).
    pub fn verify_with(
        &self,
        fix: bool,
        check: Option<ExecutableCheck<'_>>,
    ) -> Result<VerifyReport> {
        let fix = fix && !self.opts.read_only;
        let mut report = VerifyReport::default();
        for tier in self.live_tiers() {
            let here = tier.store.describe();
            // Special files and symlinks first: reading them is what must never happen.
            for (name, what) in tier.store.foreign_objects() {
                report.bad.push((name.clone(), format!("{what} ({here})")));
                if fix && tier.store.delete(&name).is_ok() {
                    report.removed += 1;
                    report.removed_items.push(format!("{name} ({what})"));
                }
            }
            let objects = tier.store.list("entries/")?;
            let mut by_key: BTreeMap<EntryKey, Vec<String>> = BTreeMap::new();
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
                                report
                                    .removed_items
                                    .push(format!("{orphan} (executable no record names)"));
                            }
                        }
                        match check {
                            Some(check) => {
                                let program = tier
                                    .store
                                    .get(&program_name(&key))
                                    .ok()
                                    .flatten()
                                    .unwrap_or_default();
                                let program = String::from_utf8_lossy(&program);
                                match check(&key, &hit.record, &program, &hit.executable) {
                                    Ok(Judged::Loaded { against_program }) => {
                                        report.loaded += 1;
                                        report.programs_checked += usize::from(against_program);
                                        None
                                    }
                                    Ok(Judged::NotLoaded(why)) => {
                                        report.digest_only += 1;
                                        *report.not_loaded.entry(why).or_default() += 1;
                                        None
                                    }
                                    Err(why) => Some(why),
                                }
                            }
                            None => {
                                report.digest_only += 1;
                                None
                            }
                        }
                    }
                    Ok(None) if !has_record => {
                        Some("executable without record (incomplete write)".to_string())
                    }
                    Ok(None) => None, // removed while we looked
                    Err(e) => Some(e.to_string()),
                };
                report.checked += usize::from(has_record);
                if let Some(p) = problem {
                    report.bad.push((key.to_string(), format!("{p} ({here})")));
                    if fix {
                        delete_listed(tier.store.as_ref(), &key, &names)?;
                        report.removed += 1;
                        report.removed_items.push(format!("entry {key} ({p})"));
                    }
                }
            }
            if fix {
                let n = tier.store.clean_leftovers();
                if n > 0 {
                    report.leftovers += n;
                    report
                        .removed_items
                        .push(format!("{n} temporary files of interrupted writers"));
                }
                for lock in tier.store.list("locks/")? {
                    let stale = match tier.store.get(&lock.name) {
                        Ok(Some(b)) => serde_json::from_slice::<crate::lease::Lease>(&b)
                            .map_or(true, |l| l.is_invalid(self.opts.lease_secs)),
                        _ => false,
                    };
                    if stale && tier.store.delete(&lock.name).is_ok() {
                        report.leftovers += 1;
                        report
                            .removed_items
                            .push(format!("{} (stale or invalid lock)", lock.name));
                    }
                }
            }
        }
        Ok(report)
    }

    /// Removes `key` (entry and failure record) from every tier; [`Error::NotFound`] when no
    /// tier had anything of it.
    pub fn remove(&self, key: &EntryKey) -> Result<()> {
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        let mut found = false;
        for tier in self.live_tiers() {
            found |= !tier
                .store
                .list(&format!("entries/{}/{key}.", key.shard()))?
                .is_empty()
                || tier
                    .store
                    .get(&failure_name(key))
                    .is_ok_and(|f| f.is_some())
                || tier
                    .store
                    .foreign_objects()
                    .iter()
                    .any(|(n, _)| n == &record_name(key));
            remove_entry(tier.store.as_ref(), key)?;
            tier.store.delete(&failure_name(key))?;
        }
        if !found {
            return Err(Error::NotFound {
                key: key.to_string(),
                store: self.describe(),
            });
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
                &["entries/", "failures/", "locks/", "hints/"]
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
    /// process evicting too) are simply skipped. One listing, then work linear in the number
    /// of objects: entries are grouped by key in one pass, and evicted by the names listed.
    pub fn prune(&self, max_bytes: u64) -> Result<usize> {
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        self.evict(max_bytes, max_bytes, usize::MAX)
            .map(|e| e.removed)
    }

    /// The eviction behind [`Cache::prune`] and a put's bound: when the local tier holds more
    /// than `max_bytes`, evicts least recently used entries until it holds at most
    /// `target_bytes`, or until `max_entries` went.
    pub(crate) fn evict(
        &self,
        max_bytes: u64,
        target_bytes: u64,
        max_entries: usize,
    ) -> Result<Eviction> {
        let Some(tier) = self.live_tiers().find(|t| t.store.tier() == Tier::Local) else {
            return Ok(Eviction::default());
        };
        let objects = tier.store.list("entries/")?;
        let mut total: u64 = objects.iter().map(|o| o.size).sum();
        if total <= max_bytes {
            return Ok(Eviction { removed: 0, total });
        }
        let mut groups: HashMap<EntryKey, Group> = HashMap::with_capacity(objects.len() / 3 + 1);
        for o in objects {
            let Some(k) = key_of(&o.name) else { continue };
            let g = groups.entry(k).or_default();
            g.bytes += o.size;
            // Recency is the record's modification time (hits touch it); entries without a
            // record (incomplete) sort first.
            if o.name.ends_with(".json") {
                g.used = Some(o.modified);
            }
            g.names.push(o.name);
        }
        let mut order: Vec<(EntryKey, Group)> = groups.into_iter().collect();
        order.sort_by(|(ka, a), (kb, b)| {
            let at = a.used.unwrap_or(std::time::SystemTime::UNIX_EPOCH);
            let bt = b.used.unwrap_or(std::time::SystemTime::UNIX_EPOCH);
            at.cmp(&bt).then_with(|| ka.cmp(kb))
        });
        let mut removed = 0;
        for (key, group) in order {
            if total <= target_bytes || removed >= max_entries {
                break;
            }
            delete_listed(tier.store.as_ref(), &key, &group.names)?;
            total = total.saturating_sub(group.bytes);
            removed += 1;
        }
        Ok(Eviction { removed, total })
    }

    /// Keeps the local tier within `NEURON_PC_CACHE_MAX_SIZE` after a put of `added` bytes,
    /// with bounded work per put: the tier's size is learned by one listing and then tracked
    /// in this process (refreshed every [`RESCAN_AFTER`]), so most puts list nothing; when it
    /// is over the bound, at most [`EVICT_PER_PUT`] entries go, down to 90% of the bound so
    /// that the next puts have room. `neuron-pc cache prune` does any larger job at once.
    pub(crate) fn enforce_bound(&self, added: u64) {
        let Some(max) = self.opts.max_local_bytes else {
            return;
        };
        let mut usage = self.local_usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((bytes, at)) = usage.as_mut() {
            if at.elapsed() < RESCAN_AFTER && bytes.saturating_add(added) <= max {
                *bytes += added;
                return;
            }
        }
        match self.evict(max, max - max / 10, EVICT_PER_PUT) {
            Ok(e) => *usage = Some((e.total, std::time::Instant::now())),
            Err(e) => {
                *usage = None;
                self.warn_once("prune", &format!("evicting old entries failed: {e}"));
            }
        }
    }
}

/// The most entries one put evicts.
pub(crate) const EVICT_PER_PUT: usize = 32;
/// How long a process trusts its own tally of the local tier's bytes (other processes write
/// too) before listing the tier again.
pub(crate) const RESCAN_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What an eviction did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Eviction {
    /// Entries removed.
    pub(crate) removed: usize,
    /// Bytes under `entries/` afterwards.
    pub(crate) total: u64,
}

/// The objects of one key, from one listing.
#[derive(Default)]
struct Group {
    bytes: u64,
    used: Option<std::time::SystemTime>,
    names: Vec<String>,
}

/// Deletes an entry by the names a listing found, record first so no reader sees a record
/// without its executable.
pub(crate) fn delete_listed(store: &dyn Store, key: &EntryKey, names: &[String]) -> Result<()> {
    let record = record_name(key);
    store.delete(&record)?;
    for n in names.iter().filter(|n| **n != record) {
        store.delete(n)?;
    }
    Ok(())
}

/// Deletes an entry, record first so no reader sees a record without its executable.
pub(crate) fn remove_entry(store: &dyn Store, key: &EntryKey) -> Result<()> {
    store.delete(&record_name(key))?;
    for o in store.list(&format!("entries/{}/{key}.", key.shard()))? {
        store.delete(&o.name)?;
    }
    Ok(())
}
