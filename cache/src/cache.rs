//! The cache: entry layout, verified reads, commit-last writes, compile-once locking, failure
//! records, eviction and the maintenance operations behind `neuron-pc cache`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::key::CacheKey;
use crate::lease::{try_acquire, Attempt};
use crate::record::{now_secs, sha256_hex, sign, EntryRecord, FailureRecord, ENTRY_FORMAT_VERSION};
use crate::store::{LocalStore, PutMode, Store, Tier};

/// Where the cache is: a directory, `file:///dir` or `s3://bucket/prefix`.
pub const CACHE_URL_ENV: &str = "NEURON_COMPILE_CACHE_URL";
/// A secret; when set, entries are signed when written and unsigned ones are refused.
pub const SIGNING_KEY_ENV: &str = "NEURON_PC_CACHE_SIGNING_KEY";
/// `1`: never write (consumer fleets, read-only mounts or credentials).
pub const READ_ONLY_ENV: &str = "NEURON_PC_CACHE_READ_ONLY";
/// Size bound of the local tier, like `10G` or `500M`.
pub const MAX_SIZE_ENV: &str = "NEURON_PC_CACHE_MAX_SIZE";

/// How a cache is opened.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    pub read_only: bool,
    /// Bound on the local tier's bytes; least recently used entries go first.
    pub max_local_bytes: Option<u64>,
    pub signing_key: Option<Vec<u8>>,
    /// How long to wait for another process compiling the same key.
    pub lock_wait: Duration,
    /// Lease length (renewed while compiling).
    pub lease_secs: u64,
    /// Identity of the compiler, stored in failure records.
    pub compiler_version: String,
    /// neuron-pc version written into records.
    pub tool_version: String,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            read_only: false,
            max_local_bytes: None,
            signing_key: None,
            lock_wait: Duration::from_secs(3600),
            lease_secs: 60,
            compiler_version: String::new(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

impl CacheOptions {
    /// Options from `NEURON_PC_CACHE_READ_ONLY`, `NEURON_PC_CACHE_MAX_SIZE` and
    /// `NEURON_PC_CACHE_SIGNING_KEY`.
    pub fn from_env() -> Result<CacheOptions> {
        let mut o = CacheOptions::default();
        o.read_only = std::env::var(READ_ONLY_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        if let Ok(s) = std::env::var(MAX_SIZE_ENV) {
            o.max_local_bytes = Some(parse_size(&s).ok_or_else(|| Error::InvalidUrl {
                url: s.clone(),
                message: format!("{MAX_SIZE_ENV} must be a size like 500M or 10G"),
            })?);
        }
        o.signing_key = std::env::var(SIGNING_KEY_ENV).ok().filter(|k| !k.is_empty()).map(String::into_bytes);
        Ok(o)
    }
}

/// Parses `123`, `10K`, `500M`, `2G`, `1T` (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// A verified entry.
#[derive(Clone, Debug)]
pub struct Hit {
    pub executable: Vec<u8>,
    pub record: EntryRecord,
    pub tier: Tier,
}

/// What a lookup found.
#[derive(Clone, Debug)]
pub enum Lookup {
    Hit(Hit),
    /// A recorded compile failure of this compiler.
    Failed(FailureRecord),
    Miss,
}

/// The outcome of [`Cache::get_or_compile`].
#[derive(Clone, Debug)]
pub enum Obtained {
    Hit(Hit),
    /// Compiled here (and stored unless read-only).
    Compiled { executable: Vec<u8>, compile_ms: f64 },
    /// Another process compiled it while this one waited.
    Waited(Hit),
}

/// What a put did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    Stored,
    ReadOnly,
    /// Writing failed on every tier (reported, never fatal).
    Failed(String),
}

/// One entry as listed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EntryInfo {
    pub key: String,
    pub tier: Tier,
    pub executable_size: u64,
    pub program_size: u64,
    pub compile_ms: f64,
    pub created_at: u64,
    pub tool_version: String,
}

/// Totals for `neuron-pc cache stats`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub entries: usize,
    pub failures: usize,
    pub bytes: u64,
    pub locks: usize,
}

/// What `verify` found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    pub checked: usize,
    /// `(key, problem)` for each bad entry.
    pub bad: Vec<(String, String)>,
    pub removed: usize,
}

struct TierState {
    store: Arc<dyn Store>,
    /// Set after the tier failed; it is skipped for the rest of the process.
    disabled: AtomicBool,
}

/// A cache over one or two tiers.
pub struct Cache {
    tiers: Vec<TierState>,
    opts: CacheOptions,
    warned: Mutex<HashSet<String>>,
}

fn exe_name(k: &CacheKey) -> String {
    format!("entries/{}/{k}.exe", k.shard())
}
fn program_name(k: &CacheKey) -> String {
    format!("entries/{}/{k}.mlir", k.shard())
}
fn record_name(k: &CacheKey) -> String {
    format!("entries/{}/{k}.json", k.shard())
}
fn failure_name(k: &CacheKey) -> String {
    format!("failures/{k}.json")
}
fn lock_name(k: &CacheKey) -> String {
    format!("locks/{k}.lock")
}

/// The default local cache directory: `$XDG_CACHE_HOME/neuron-pc`, else `~/.cache/neuron-pc`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("neuron-pc");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("neuron-pc")
}

impl Cache {
    /// Opens the cache named by `NEURON_COMPILE_CACHE_URL` (default: [`default_dir`]).
    pub fn from_env(mut opts: CacheOptions) -> Result<Cache> {
        let env = CacheOptions::from_env()?;
        opts.read_only |= env.read_only;
        opts.max_local_bytes = opts.max_local_bytes.or(env.max_local_bytes);
        opts.signing_key = opts.signing_key.or(env.signing_key);
        match std::env::var(CACHE_URL_ENV).ok().filter(|u| !u.is_empty()) {
            Some(url) => Cache::open(&url, opts),
            None => Cache::with_stores(vec![Arc::new(LocalStore::open(&default_dir())?)], opts),
        }
    }

    /// Opens `url`: a path, `file:///path`, or `s3://bucket/prefix`.
    pub fn open(url: &str, opts: CacheOptions) -> Result<Cache> {
        let invalid = |message: &str| Error::InvalidUrl { url: url.to_string(), message: message.to_string() };
        if url.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(invalid("file:// URLs need an absolute path (file:///dir)"));
            }
            return Cache::with_stores(vec![Arc::new(LocalStore::open(Path::new(rest))?)], opts);
        }
        if url.starts_with("s3://") {
            return Err(invalid("S3 support is not built into this binary yet"));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(invalid(&format!(
                "unknown scheme {scheme}://; use a directory, file:///dir or s3://bucket/prefix"
            )));
        }
        if url.trim().is_empty() {
            return Err(invalid("empty"));
        }
        Cache::with_stores(vec![Arc::new(LocalStore::open(Path::new(url))?)], opts)
    }

    /// A cache over `stores`, fastest first (reads try them in order; writes go to all).
    pub fn with_stores(stores: Vec<Arc<dyn Store>>, opts: CacheOptions) -> Result<Cache> {
        let tiers = stores.into_iter().map(|store| TierState { store, disabled: AtomicBool::new(false) }).collect();
        Ok(Cache { tiers, opts, warned: Mutex::new(HashSet::new()) })
    }

    /// Where the cache is, for messages.
    pub fn describe(&self) -> String {
        self.tiers.iter().map(|t| t.store.describe()).collect::<Vec<_>>().join(" -> ")
    }

    pub fn options(&self) -> &CacheOptions {
        &self.opts
    }

    fn live_tiers(&self) -> impl Iterator<Item = &TierState> {
        self.tiers.iter().filter(|t| !t.disabled.load(Ordering::Relaxed))
    }

    /// Logs `message` once per `topic`.
    fn warn_once(&self, topic: &str, message: &str) {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if w.insert(topic.to_string()) {
            tracing::warn!("compile cache: {message}");
        }
    }

    /// A storage error: unreachable tiers are switched off for this process (one warning);
    /// other errors are warned about once per kind.
    fn storage_trouble(&self, tier: &TierState, e: &Error) {
        if matches!(e, Error::Unavailable { .. }) {
            tier.disabled.store(true, Ordering::Relaxed);
            self.warn_once(&format!("down:{}", tier.store.describe()), &format!("{e}; continuing without it"));
        } else {
            self.warn_once(&format!("err:{}:{e}", tier.store.describe()), &e.to_string());
        }
    }

    fn read_entry(&self, tier: &TierState, key: &CacheKey) -> Result<Option<Hit>> {
        let Some(rec_bytes) = tier.store.get(&record_name(key))? else { return Ok(None) };
        let record = EntryRecord::parse(key, &rec_bytes)?;
        let Some(exe) = tier.store.get(&exe_name(key))? else {
            return Err(Error::Corrupt { key: key.to_string(), message: "record without executable".into() });
        };
        record.verify(key, &exe, self.opts.signing_key.as_deref())?;
        tier.store.touch(&record_name(key));
        Ok(Some(Hit { executable: exe, record, tier: tier.store.tier() }))
    }

    /// Looks `key` up in every tier; never fails (trouble is a logged miss).
    pub fn get(&self, key: &CacheKey) -> Lookup {
        for (i, tier) in self.tiers.iter().enumerate() {
            if tier.disabled.load(Ordering::Relaxed) {
                continue;
            }
            match self.read_entry(tier, key) {
                Ok(Some(hit)) => {
                    // Read-through: a remote hit fills the faster tiers.
                    if i > 0 && !self.opts.read_only {
                        let prog = tier.store.get(&program_name(key)).ok().flatten().unwrap_or_default();
                        for front in &self.tiers[..i] {
                            let _ = self.write_entry(front, key, &hit.executable, &prog, &hit.record);
                        }
                    }
                    return Lookup::Hit(hit);
                }
                Ok(None) => {}
                Err(e @ Error::Corrupt { .. }) => {
                    self.warn_once(&format!("corrupt:{key}"), &format!("{e}; treating it as a miss"));
                }
                Err(e) => self.storage_trouble(tier, &e),
            }
        }
        for tier in self.live_tiers() {
            match tier.store.get(&failure_name(key)) {
                Ok(Some(b)) => match FailureRecord::parse(key, &b) {
                    Ok(f) if f.compiler_version == self.opts.compiler_version => return Lookup::Failed(f),
                    _ => {}
                },
                Ok(None) => {}
                Err(e) => self.storage_trouble(tier, &e),
            }
        }
        Lookup::Miss
    }

    /// True when a verified entry for `key` exists.
    pub fn contains(&self, key: &CacheKey) -> bool {
        matches!(self.get(key), Lookup::Hit(_))
    }

    /// The program text stored with `key`, if any.
    pub fn program(&self, key: &CacheKey) -> Option<String> {
        self.live_tiers()
            .find_map(|t| t.store.get(&program_name(key)).ok().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// The record of `key` (unverified executable), for `cache show`.
    pub fn record(&self, key: &CacheKey) -> Option<(EntryRecord, Tier)> {
        self.live_tiers().find_map(|t| {
            let b = t.store.get(&record_name(key)).ok().flatten()?;
            EntryRecord::parse(key, &b).ok().map(|r| (r, t.store.tier()))
        })
    }

    fn write_entry(&self, tier: &TierState, key: &CacheKey, exe: &[u8], program: &[u8], record: &EntryRecord) -> Result<()> {
        // The record goes last: it is the commit point readers look for.
        tier.store.put(&exe_name(key), exe, PutMode::Overwrite)?;
        tier.store.put(&program_name(key), program, PutMode::Overwrite)?;
        let rec = serde_json::to_vec_pretty(record).expect("records serialize");
        tier.store.put(&record_name(key), &rec, PutMode::Overwrite)?;
        Ok(())
    }

    /// Stores an entry in every tier. Never fails the caller.
    pub fn put(&self, key: &CacheKey, executable: &[u8], program: &str, key_inputs: &BTreeMap<String, String>, compile_ms: f64) -> PutOutcome {
        if self.opts.read_only {
            return PutOutcome::ReadOnly;
        }
        let digest = sha256_hex(executable);
        let record = EntryRecord {
            format_version: ENTRY_FORMAT_VERSION,
            key: key.to_string(),
            key_inputs: key_inputs.clone(),
            executable_size: executable.len() as u64,
            signature: self.opts.signing_key.as_deref().map(|sk| sign(sk, key, &digest)),
            executable_sha256: digest,
            program_size: program.len() as u64,
            compile_ms,
            tool_version: self.opts.tool_version.clone(),
            created_at: now_secs(),
        };
        let mut stored = false;
        let mut last_err = String::new();
        for tier in self.live_tiers() {
            match self.write_entry(tier, key, executable, program.as_bytes(), &record) {
                Ok(()) => {
                    stored = true;
                    let _ = tier.store.delete(&failure_name(key));
                }
                Err(e) => {
                    last_err = e.to_string();
                    self.storage_trouble(tier, &e);
                }
            }
        }
        if stored {
            self.enforce_bound();
            PutOutcome::Stored
        } else {
            PutOutcome::Failed(last_err)
        }
    }

    /// Records a failed compilation so other processes do not retry it.
    pub fn put_failure(&self, key: &CacheKey, message: &str) {
        if self.opts.read_only {
            return;
        }
        let rec = FailureRecord {
            format_version: ENTRY_FORMAT_VERSION,
            key: key.to_string(),
            message: message.to_string(),
            compiler_version: self.opts.compiler_version.clone(),
            created_at: now_secs(),
        };
        let bytes = serde_json::to_vec_pretty(&rec).expect("records serialize");
        for tier in self.live_tiers() {
            if let Err(e) = tier.store.put(&failure_name(key), &bytes, PutMode::Overwrite) {
                self.storage_trouble(tier, &e);
            }
        }
    }

    /// The tier whose locks coordinate everyone sharing the cache: the most shared one.
    fn lock_tier(&self) -> Option<&TierState> {
        self.live_tiers().last()
    }

    /// Returns the executable of `key`: from the cache, from another process that is
    /// compiling it (waiting up to the lock bound), or by running `compile` here and storing
    /// the result. A recorded failure of this compiler is returned as `Err` unless
    /// `retry_failed`. Only a compile failure is an error; storage trouble never is.
    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        retry_failed: bool,
        compile: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> Result<Obtained> {
        match self.get(key) {
            Lookup::Hit(h) => return Ok(Obtained::Hit(h)),
            Lookup::Failed(f) if !retry_failed => {
                return Err(Error::Compile(format!("{} (recorded earlier; retry with --retry_failed_compilation)", f.message)))
            }
            _ => {}
        }
        let mut guard = None;
        if let (false, Some(tier)) = (self.opts.read_only, self.lock_tier()) {
            let started = Instant::now();
            loop {
                match try_acquire(&tier.store, &lock_name(key), self.opts.lease_secs) {
                    Ok(Attempt::Acquired(g)) => {
                        guard = Some(g);
                        break;
                    }
                    Ok(Attempt::Held) => {}
                    Err(e) => {
                        self.storage_trouble(tier, &e);
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
                if let Lookup::Hit(h) = self.get(key) {
                    return Ok(Obtained::Waited(h));
                }
                if started.elapsed() > self.opts.lock_wait {
                    self.warn_once(&format!("wait:{key}"), &format!("gave up waiting for another process to compile {key}; compiling here"));
                    break;
                }
            }
            // Someone may have finished between our miss and taking the lock.
            if guard.is_some() {
                if let Lookup::Hit(h) = self.get(key) {
                    return Ok(Obtained::Hit(h));
                }
            }
        }
        let started = Instant::now();
        let result = compile();
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let outcome = match result {
            Ok(executable) => {
                self.put(key, &executable, program, key_inputs, compile_ms);
                Ok(Obtained::Compiled { executable, compile_ms })
            }
            Err(message) => {
                self.put_failure(key, &message);
                Err(Error::Compile(message))
            }
        };
        drop(guard);
        outcome
    }

    /// Every entry (from the first tier that has it).
    pub fn list(&self) -> Result<Vec<EntryInfo>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for tier in self.live_tiers() {
            for obj in tier.store.list("entries/")? {
                let Some(k) = obj.name.rsplit('/').next().and_then(|f| f.strip_suffix(".json")) else { continue };
                let Ok(key) = CacheKey::parse(k) else { continue };
                if !seen.insert(key.clone()) {
                    continue;
                }
                let Some(b) = tier.store.get(&obj.name).ok().flatten() else { continue };
                let Ok(r) = EntryRecord::parse(&key, &b) else { continue };
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

    /// Checks every entry's digest (and signature); with `fix`, removes the bad ones.
    pub fn verify(&self, fix: bool) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        for tier in self.live_tiers() {
            let objects = tier.store.list("entries/")?;
            let mut keys: Vec<CacheKey> = objects
                .iter()
                .filter_map(|o| {
                    let f = o.name.rsplit('/').next()?;
                    let stem = f.rsplit_once('.')?.0;
                    CacheKey::parse(stem).ok()
                })
                .collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                report.checked += 1;
                let problem = match self.read_entry(tier, &key) {
                    Ok(Some(_)) => None,
                    Ok(None) => Some("executable without record (incomplete write)".to_string()),
                    Err(e) => Some(e.to_string()),
                };
                if let Some(p) = problem {
                    report.bad.push((key.to_string(), p));
                    if fix && !self.opts.read_only {
                        remove_entry(tier.store.as_ref(), &key)?;
                        report.removed += 1;
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
            let prefixes: &[&str] = if failed_only { &["failures/"] } else { &["entries/", "failures/", "locks/"] };
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
    /// `max_bytes`; returns how many entries went.
    pub fn prune(&self, max_bytes: u64) -> Result<usize> {
        let Some(tier) = self.live_tiers().find(|t| t.store.tier() == Tier::Local) else { return Ok(0) };
        let objects = tier.store.list("entries/")?;
        let mut total: u64 = objects.iter().map(|o| o.size).sum();
        if total <= max_bytes {
            return Ok(0);
        }
        // Recency is the record's modification time (hits touch it).
        let mut records: Vec<(std::time::SystemTime, CacheKey)> = objects
            .iter()
            .filter_map(|o| {
                let stem = o.name.rsplit('/').next()?.strip_suffix(".json")?;
                Some((o.modified, CacheKey::parse(stem).ok()?))
            })
            .collect();
        records.sort();
        let mut removed = 0;
        for (_, key) in records {
            if total <= max_bytes {
                break;
            }
            let size: u64 = objects.iter().filter(|o| o.name.contains(key.as_str())).map(|o| o.size).sum();
            remove_entry(tier.store.as_ref(), &key)?;
            total = total.saturating_sub(size);
            removed += 1;
        }
        Ok(removed)
    }

    fn enforce_bound(&self) {
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
    store.delete(&exe_name(key))?;
    store.delete(&program_name(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("2K"), Some(2048));
        assert_eq!(parse_size("500M"), Some(500 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999T"), None);
    }
}
