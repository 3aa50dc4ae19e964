//! The cache: entry layout, verified reads, commit-last writes, compile-once locking and
//! failure records. Maintenance (list, verify, prune, ...) lives in `maintain.rs`; waiting on
//! another process's compile in `wait.rs`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::health::Health;
use crate::key::EntryKey;
use crate::options::{default_dir, CacheOptions, CACHE_URL_ENV};
use crate::record::{
    now_secs, sha256_hex, sign, EntryRecord, FailureRecord, ENTRY_FORMAT_VERSION, MAX_RECORD_BYTES,
};
#[cfg(feature = "s3")]
use crate::s3::S3Store;
use crate::store::{LocalStore, PutMode, Store, Tier};

mod wait;

/// A verified entry.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The verified executable bytes.
    pub executable: Vec<u8>,
    /// The entry's record (key inputs, sizes, digest, ...).
    pub record: EntryRecord,
    /// Which tier served it (local disk or the remote store).
    pub tier: Tier,
}

/// What a lookup found.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// A verified entry.
    Hit(Hit),
    /// A recorded compile failure of this compiler.
    Failed(FailureRecord),
    /// Nothing usable (absent, damaged, or storage trouble: see the warnings).
    Miss,
}

/// The outcome of [`Cache::get_or_compile`].
#[derive(Clone, Debug)]
pub enum Obtained {
    /// Found in the cache.
    Hit(Hit),
    /// Compiled here (and stored unless read-only).
    Compiled {
        /// The freshly compiled executable.
        executable: Vec<u8>,
        /// How long compiling took.
        compile_ms: f64,
        /// Whether it was stored (a read-only cache or failing storage keeps it out).
        stored: PutOutcome,
    },
    /// Another process compiled it while this one waited.
    Waited(Hit),
}

/// What a put did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored in at least one tier.
    Stored,
    /// Not stored: the cache is read-only.
    ReadOnly,
    /// Writing failed on every tier (reported, never fatal).
    Failed(String),
}

/// One entry as listed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EntryInfo {
    /// The key.
    pub key: String,
    /// The first tier holding it.
    pub tier: Tier,
    /// Every tier holding a record for it, fastest first.
    pub tiers: Vec<Tier>,
    /// Why the record could not be read (the other fields are then zero), else `None`.
    pub problem: Option<String>,
    /// Bytes of the executable.
    pub executable_size: u64,
    /// Bytes of the program text.
    pub program_size: u64,
    /// Compile time in milliseconds.
    pub compile_ms: f64,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The neuron-pc version that wrote it.
    pub tool_version: String,
}

/// Totals for `neuron-pc cache stats`: keys counted once over all tiers, bytes and locks
/// summed, and each tier on its own.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Committed entries (records).
    pub entries: usize,
    /// Failure records.
    pub failures: usize,
    /// Bytes of executables, programs and records.
    pub bytes: u64,
    /// Compile leases present (held or stale).
    pub locks: usize,
    /// True when the cache has a shared (remote) tier.
    pub shared: bool,
    /// True when entries are signed and checked (a signing key is set).
    pub signed: bool,
    /// The same counts per tier, fastest first.
    pub tiers: Vec<TierStats>,
}

/// One tier's counts.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierStats {
    /// `/path` or `s3://bucket/prefix`.
    pub store: String,
    /// Committed entries (records).
    pub entries: usize,
    /// Failure records.
    pub failures: usize,
    /// Bytes under `entries/`.
    pub bytes: u64,
    /// Compile leases present.
    pub locks: usize,
}

/// What `verify` found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Entries (records) checked, counted per tier.
    pub checked: usize,
    /// `(key, problem (tier))` for each bad entry; a tiered cache reports each tier.
    pub bad: Vec<(String, String)>,
    /// Bad entries removed by `--fix`.
    pub removed: usize,
    /// What `--fix` removed, one line each (bad entries, leftovers, foreign files, locks).
    pub removed_items: Vec<String>,
    /// Executables the caller's checker loaded (digest verified, then loaded by the plugin).
    pub loaded: usize,
    /// Of those, the ones whose interface was also checked against their stored program.
    pub programs_checked: usize,
    /// Entries whose digest (and signature) were verified but whose executable was not loaded
    /// (no checker, no plugin, or written by another compiler).
    pub digest_only: usize,
    /// Why executables were not loaded, with how many each.
    pub not_loaded: BTreeMap<String, usize>,
    /// Temporary files, unreferenced executables and stale locks removed by `--fix`.
    pub leftovers: usize,
}

pub(crate) struct TierState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) health: Arc<Health>,
}

impl TierState {
    fn is_down(&self) -> bool {
        self.health.is_down()
    }
}

/// A cache over one or two tiers.
pub struct Cache {
    pub(crate) tiers: Vec<TierState>,
    pub(crate) opts: CacheOptions,
    warned: Mutex<HashSet<String>>,
    /// This process's tally of the local tier's bytes and when it was listed (for the size
    /// bound; see `enforce_bound`).
    pub(crate) local_usage: Mutex<Option<(u64, Instant)>>,
    waiting: WaitCounters,
}

/// How this process waited on other processes' leases (see [`Cache::wait_metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WaitMetrics {
    /// Lookups that waited on another process's lease.
    pub waits: u64,
    /// Seconds spent waiting, all waits together.
    pub wait_secs: f64,
    /// Requests to the shared (S3) store made while waiting.
    pub requests: u64,
    /// `requests` per waiter per minute of waiting: what a fleet of waiters costs the store.
    pub requests_per_waiter_minute: f64,
}

#[derive(Default)]
struct WaitCounters {
    inner: Mutex<(u64, Duration, u64)>,
}

impl WaitCounters {
    fn record(&self, waited: Duration, requests: u64) {
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        w.0 += 1;
        w.1 += waited;
        w.2 += requests;
    }
}

/// Executables are named by key and digest, so two writers racing on one key never mix one's
/// record with the other's bytes; the record names the one that won.
pub(crate) fn exe_name(k: &EntryKey, sha256: &str) -> String {
    format!(
        "entries/{}/{k}.{}.exe",
        k.shard(),
        &sha256[..16.min(sha256.len())]
    )
}
/// The key an object under `entries/` belongs to.
pub(crate) fn key_of(name: &str) -> Option<EntryKey> {
    let file = name.rsplit('/').next()?;
    EntryKey::parse(file.split('.').next()?).ok()
}
pub(crate) fn program_name(k: &EntryKey) -> String {
    format!("entries/{}/{k}.mlir", k.shard())
}
pub(crate) fn record_name(k: &EntryKey) -> String {
    format!("entries/{}/{k}.json", k.shard())
}
pub(crate) fn failure_name(k: &EntryKey) -> String {
    format!("failures/{k}.json")
}
pub(crate) fn hint_name(id: &EntryKey) -> String {
    format!("hints/{id}.json")
}
/// A hint is a short note (a list of keys), never an executable.
const MAX_HINT_BYTES: u64 = 64 << 10;
pub(crate) fn lock_name(k: &EntryKey) -> String {
    format!("locks/{k}.lock")
}

impl Cache {
    /// Opens the cache named by `NEURON_COMPILE_CACHE_URL` (default: [`default_dir`]).
    pub fn from_env(mut opts: CacheOptions) -> Result<Cache> {
        let env = CacheOptions::from_env()?;
        opts.read_only |= env.read_only;
        opts.max_local_bytes = opts.max_local_bytes.or(env.max_local_bytes);
        opts.signing_key = opts.signing_key.or(env.signing_key);
        opts.local_tier &= env.local_tier;
        opts.local_dir = opts.local_dir.or(env.local_dir);
        match std::env::var(CACHE_URL_ENV).ok().filter(|u| !u.is_empty()) {
            Some(url) => Cache::open(&url, opts),
            None => {
                let store = local_store(&default_dir(), &opts)?;
                Cache::with_stores(vec![store], opts)
            }
        }
    }

    /// Opens `url`: a path, `file:///path`, or `s3://bucket/prefix`.
    pub fn open(url: &str, opts: CacheOptions) -> Result<Cache> {
        let invalid = |message: &str| Error::InvalidUrl {
            url: url.to_string(),
            message: message.to_string(),
        };
        if url.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(invalid("file:// URLs need an absolute path (file:///dir)"));
            }
            let store = local_store(Path::new(rest), &opts)?;
            return Cache::with_stores(vec![store], opts);
        }
        if url.starts_with("s3://") {
            return Cache::open_s3(url, opts);
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(invalid(&format!(
                "unknown scheme {scheme}://; use a directory, file:///dir or s3://bucket/prefix"
            )));
        }
        if url.trim().is_empty() {
            return Err(invalid("empty"));
        }
        let store = local_store(Path::new(url), &opts)?;
        Cache::with_stores(vec![store], opts)
    }

    /// `s3://...`, behind a local tier unless `opts.local_tier` is off. One listing request
    /// probes the bucket: refused credentials or a missing bucket fail here, loudly; an
    /// unreachable server is warned about once and the cache goes on without it (local tier
    /// only, or no tier: every lookup a miss), because a training job must not stop for it.
    #[cfg(feature = "s3")]
    fn open_s3(url: &str, opts: CacheOptions) -> Result<Cache> {
        let s3 = S3Store::open(url, &opts.s3)?;
        let probed = s3.probe();
        if let Err(e @ (Error::Denied { .. } | Error::InvalidUrl { .. })) = probed {
            return Err(e);
        }
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        if opts.local_tier {
            let dir = opts.local_dir.clone().unwrap_or_else(default_dir);
            stores.push(local_store(&dir, &opts)?);
        }
        stores.push(Arc::new(s3));
        let cache = Cache::with_stores(stores, opts)?;
        if let Err(e) = probed {
            if let Some(t) = cache.tiers.last() {
                cache.storage_trouble(t, &e);
            }
        }
        Ok(cache)
    }

    /// Built without the `s3` feature: an `s3://` URL is one error naming it.
    #[cfg(not(feature = "s3"))]
    fn open_s3(url: &str, _opts: CacheOptions) -> Result<Cache> {
        Err(Error::InvalidUrl {
            url: url.to_string(),
            message: crate::s3::NO_S3.into(),
        })
    }

    /// Names of the tiers this process has switched off after storage trouble.
    pub fn disabled_tiers(&self) -> Vec<String> {
        self.tiers
            .iter()
            .filter(|t| t.is_down())
            .map(|t| t.store.describe())
            .collect()
    }

    /// A cache over `stores`, fastest first (reads try them in order; writes go to all).
    pub fn with_stores(stores: Vec<Arc<dyn Store>>, opts: CacheOptions) -> Result<Cache> {
        let tiers = stores
            .into_iter()
            .map(|store| TierState {
                store,
                health: Arc::new(Health::new(opts.retry_down_after)),
            })
            .collect();
        Ok(Cache {
            tiers,
            opts,
            warned: Mutex::new(HashSet::new()),
            local_usage: Mutex::new(None),
            waiting: WaitCounters::default(),
        })
    }

    /// Where the cache is, for messages.
    pub fn describe(&self) -> String {
        self.tiers
            .iter()
            .map(|t| t.store.describe())
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    /// The shared stores that do not honour create-only writes (an S3-compatible server that
    /// ignores `If-None-Match: *`): leases and first-writer-wins use compare-after-write on
    /// them. Asks each store once per process (a read-only cache asks nothing).
    pub fn without_conditional_put(&self) -> Result<Vec<String>> {
        if self.opts.read_only {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for t in self.live_tiers() {
            if !t.store.conditional_put()? {
                out.push(t.store.describe());
            }
        }
        Ok(out)
    }

    /// How this process has waited on other processes' leases so far.
    pub fn wait_metrics(&self) -> WaitMetrics {
        let (waits, waited, requests) =
            *self.waiting.inner.lock().unwrap_or_else(|p| p.into_inner());
        let minutes = waited.as_secs_f64() / 60.0;
        WaitMetrics {
            waits,
            wait_secs: waited.as_secs_f64(),
            requests,
            requests_per_waiter_minute: if minutes > 0.0 {
                requests as f64 / minutes
            } else {
                0.0
            },
        }
    }

    /// The options the cache was opened with.
    pub fn options(&self) -> &CacheOptions {
        &self.opts
    }

    pub(crate) fn live_tiers(&self) -> impl Iterator<Item = &TierState> {
        self.tiers.iter().filter(|t| !t.is_down())
    }

    /// Logs `message` once per `topic`.
    pub(crate) fn warn_once(&self, topic: &str, message: &str) {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if w.insert(topic.to_string()) {
            tracing::warn!("compile cache: {message}");
        }
    }

    /// A storage error: an unreachable tier is skipped for a while (warned about once); other
    /// errors are warned about once per kind.
    fn storage_trouble(&self, tier: &TierState, e: &Error) {
        if e.is_throttled() {
            // The server is there and busy: this operation missed, the tier stays on.
            self.warn_once(
                &format!("throttled:{}", tier.store.describe()),
                &format!("{e}; slowing down"),
            );
        } else if tier.health.report(e) {
            let how_long = if matches!(
                e,
                Error::Unavailable {
                    timed_out: true,
                    ..
                }
            ) {
                "for the rest of this process"
            } else {
                "for now"
            };
            self.warn_once(
                &format!("down:{}", tier.store.describe()),
                &format!("{e}; continuing without it {how_long}"),
            );
        } else {
            // Once per tier and kind of trouble (a full disk fails every write the same way).
            let kind = match e {
                Error::Io { source, .. } => format!("io:{:?}", source.kind()),
                other => format!("{:?}", std::mem::discriminant(other)),
            };
            self.warn_once(
                &format!("err:{}:{kind}", tier.store.describe()),
                &e.to_string(),
            );
        }
    }

    pub(crate) fn read_entry(&self, tier: &TierState, key: &EntryKey) -> Result<Option<Hit>> {
        let Some(rec_bytes) = tier
            .store
            .get_max(&record_name(key), MAX_RECORD_BYTES as u64)?
        else {
            return Ok(None);
        };
        let record = EntryRecord::parse(key, &rec_bytes)?;
        let Some(exe) = tier.store.get_max(
            &exe_name(key, &record.executable_sha256),
            record.executable_size,
        )?
        else {
            return Err(Error::Corrupt {
                key: key.to_string(),
                message: "record without executable".into(),
            });
        };
        record.verify(key, &exe, self.opts.signing_key.as_deref())?;
        if !self.opts.read_only {
            tier.store.touch(&record_name(key));
        }
        Ok(Some(Hit {
            executable: exe,
            record,
            tier: tier.store.tier(),
        }))
    }

    /// Looks `key` up in every tier; never fails (trouble is a logged miss).
    pub fn get(&self, key: &EntryKey) -> Lookup {
        for (i, tier) in self.tiers.iter().enumerate() {
            if tier.is_down() {
                continue;
            }
            match self.read_entry(tier, key) {
                Ok(Some(hit)) => {
                    // Read-through: a remote hit fills the faster tiers.
                    if i > 0 && !self.opts.read_only {
                        let prog = tier
                            .store
                            .get(&program_name(key))
                            .ok()
                            .flatten()
                            .unwrap_or_default();
                        for front in &self.tiers[..i] {
                            let _ = self.write_entry(
                                front,
                                key,
                                &hit.executable,
                                &prog,
                                &hit.record,
                                true,
                            );
                        }
                    }
                    return Lookup::Hit(hit);
                }
                Ok(None) => {}
                Err(e @ Error::Corrupt { .. }) => {
                    self.warn_once(
                        &format!("corrupt:{key}"),
                        &format!("{e}; treating it as a miss"),
                    );
                }
                Err(e) => self.storage_trouble(tier, &e),
            }
        }
        for tier in self.live_tiers() {
            match tier.store.get(&failure_name(key)) {
                Ok(Some(b)) => match FailureRecord::parse(key, &b) {
                    Ok(f) if f.compiler_version == self.opts.compiler_version => {
                        return Lookup::Failed(f)
                    }
                    _ => {}
                },
                Ok(None) => {}
                Err(e) => self.storage_trouble(tier, &e),
            }
        }
        tracing::debug!("compile cache: miss on {key}");
        Lookup::Miss
    }

    /// The hint stored under `id` on the local tier: a small note a job leaves for its next
    /// run (which entries its first steps loaded, so the next run can load them while it
    /// initialises). A hint is only ever advice: it names entries, which are read and
    /// verified as any other. Trouble reading it is a miss.
    pub fn hint(&self, id: &EntryKey) -> Option<Vec<u8>> {
        let tier = self.live_tiers().find(|t| t.store.tier() == Tier::Local)?;
        tier.store
            .get_max(&hint_name(id), MAX_HINT_BYTES)
            .ok()
            .flatten()
    }

    /// Stores a hint under `id` on the local tier (nothing in a read-only cache or one
    /// without a local tier); failures are ignored.
    pub fn put_hint(&self, id: &EntryKey, bytes: &[u8]) {
        if self.opts.read_only || bytes.len() as u64 > MAX_HINT_BYTES {
            return;
        }
        if let Some(tier) = self.live_tiers().find(|t| t.store.tier() == Tier::Local) {
            let _ = tier.store.put(&hint_name(id), bytes, PutMode::Overwrite);
        }
    }

    /// True when a verified entry for `key` exists.
    pub fn contains(&self, key: &EntryKey) -> bool {
        matches!(self.get(key), Lookup::Hit(_))
    }

    /// The program text stored with `key`, if any.
    pub fn program(&self, key: &EntryKey) -> Option<String> {
        self.live_tiers()
            .find_map(|t| t.store.get(&program_name(key)).ok().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// The record of `key` (unverified executable), for `cache show`.
    pub fn record(&self, key: &EntryKey) -> Option<(EntryRecord, Tier)> {
        self.live_tiers().find_map(|t| {
            let b = t.store.get(&record_name(key)).ok().flatten()?;
            EntryRecord::parse(key, &b)
                .ok()
                .map(|r| (r, t.store.tier()))
        })
    }

    /// The record of a new entry: digest, sizes, signature when a signing key is set.
    pub(crate) fn new_record(
        &self,
        key: &EntryKey,
        executable: &[u8],
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        compile_ms: f64,
    ) -> EntryRecord {
        let digest = sha256_hex(executable);
        EntryRecord {
            format_version: ENTRY_FORMAT_VERSION,
            key: key.to_string(),
            key_inputs: key_inputs.clone(),
            executable_size: executable.len() as u64,
            signature: self
                .opts
                .signing_key
                .as_deref()
                .map(|sk| sign(sk, key, &digest)),
            executable_sha256: digest,
            program_size: program.len() as u64,
            compile_ms,
            tool_version: self.opts.tool_version.clone(),
            created_at: now_secs(),
        }
    }

    /// Writes an entry; the record goes last: it is the commit point readers look for. With
    /// `replace` false the first complete entry wins (a create-only put of the record) and a
    /// loser removes its executable; an entry that does not verify is replaced either way.
    pub(crate) fn write_entry(
        &self,
        tier: &TierState,
        key: &EntryKey,
        exe: &[u8],
        program: &[u8],
        record: &EntryRecord,
        replace: bool,
    ) -> Result<()> {
        let exe_obj = exe_name(key, &record.executable_sha256);
        tier.store.put(&exe_obj, exe, PutMode::Overwrite)?;
        let written = self.write_record(tier, key, &exe_obj, program, record, replace);
        if written.is_err() {
            // an executable no record names would be an orphan (a full disk fails the record
            // after the executable): take it back, unless a record names these bytes
            let named = self
                .read_entry(tier, key)
                .ok()
                .flatten()
                .is_some_and(|e| e.record.executable_sha256 == record.executable_sha256);
            if !named {
                let _ = tier.store.delete(&exe_obj);
            }
        }
        written
    }

    /// [`Cache::write_entry`] once the executable `exe_obj` is written: the program and the
    /// record.
    fn write_record(
        &self,
        tier: &TierState,
        key: &EntryKey,
        exe_obj: &str,
        program: &[u8],
        record: &EntryRecord,
        replace: bool,
    ) -> Result<()> {
        tier.store
            .put(&program_name(key), program, PutMode::Overwrite)?;
        let rec = serde_json::to_vec_pretty(record).map_err(|e| Error::Corrupt {
            key: key.to_string(),
            message: e.to_string(),
        })?;
        if !replace
            && tier
                .store
                .put(&record_name(key), &rec, PutMode::CreateOnly)?
        {
            return Ok(());
        }
        if !replace {
            if let Ok(Some(existing)) = self.read_entry(tier, key) {
                if existing.record.executable_sha256 != record.executable_sha256 {
                    tier.store.delete(exe_obj)?;
                }
                return Ok(());
            }
        }
        let old_bytes = tier.store.get(&record_name(key)).ok().flatten();
        let old = (old_bytes.as_ref()).and_then(|b| EntryRecord::parse(key, b).ok());
        tier.store
            .put(&record_name(key), &rec, PutMode::Overwrite)?;
        match old {
            Some(old) if old.executable_sha256 != record.executable_sha256 => {
                let _ = tier.store.delete(&exe_name(key, &old.executable_sha256));
            }
            Some(_) => {}
            // a record that did not parse names no executable: every other one of this key
            // would be an orphan
            None if old_bytes.is_some() => {
                let prefix = format!("entries/{}/{key}.", key.shard());
                for o in tier.store.list(&prefix).unwrap_or_default() {
                    if o.name.ends_with(".exe") && o.name != exe_obj {
                        let _ = tier.store.delete(&o.name);
                    }
                }
            }
            None => {}
        }
        Ok(())
    }

    /// Stores an entry in every tier; where a verified entry for `key` exists, the first
    /// complete entry wins and this one is dropped. Never fails the caller.
    pub fn put(
        &self,
        key: &EntryKey,
        executable: &[u8],
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        compile_ms: f64,
    ) -> PutOutcome {
        self.store_entry(key, executable, program, key_inputs, compile_ms, false)
    }

    /// Like [`Cache::put`], but overwrites an existing entry (one that verified yet could not
    /// be loaded, for example).
    pub fn replace(
        &self,
        key: &EntryKey,
        executable: &[u8],
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        compile_ms: f64,
    ) -> PutOutcome {
        self.store_entry(key, executable, program, key_inputs, compile_ms, true)
    }

    fn store_entry(
        &self,
        key: &EntryKey,
        executable: &[u8],
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        compile_ms: f64,
        replace: bool,
    ) -> PutOutcome {
        if self.opts.read_only {
            return PutOutcome::ReadOnly;
        }
        let record = self.new_record(key, executable, program, key_inputs, compile_ms);
        tracing::debug!(
            "compile cache: storing {key} ({} bytes), key inputs {:?}",
            executable.len(),
            key_inputs
        );
        let mut stored = false;
        let mut last_err = String::new();
        for tier in self.live_tiers() {
            match self.write_entry(tier, key, executable, program.as_bytes(), &record, replace) {
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
            let record_len = serde_json::to_vec_pretty(&record).map_or(0, |r| r.len());
            self.enforce_bound((executable.len() + program.len() + record_len) as u64);
            PutOutcome::Stored
        } else {
            PutOutcome::Failed(last_err)
        }
    }

    /// Records a failed compilation so other processes do not retry it.
    pub fn put_failure(&self, key: &EntryKey, message: &str) {
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
            if let Err(e) = tier
                .store
                .put(&failure_name(key), &bytes, PutMode::Overwrite)
            {
                self.storage_trouble(tier, &e);
            }
        }
    }
}

/// A local tier at `dir`; a read-only cache creates no directory.
fn local_store(dir: &Path, opts: &CacheOptions) -> Result<Arc<dyn Store>> {
    let store = if opts.read_only {
        LocalStore::open_existing(dir)?
    } else {
        LocalStore::open(dir)?
    };
    Ok(Arc::new(store))
}

/// The error for a compile failure another process recorded.
fn recorded(f: &FailureRecord) -> Error {
    Error::Compile(format!(
        "{} (recorded earlier by {}; retry with --retry_failed_compilation)",
        f.message, f.compiler_version
    ))
}
