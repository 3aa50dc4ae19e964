//! The storage checks of `neuron-pc doctor`: the compile cache a job would use takes a write, a
//! verified read and a delete in every tier, and the disks it writes to have room.
//!
//! A job treats a cache it cannot use as a warning and compiles everything itself; here every
//! such problem (a missing bucket, refused or missing credentials, a read-only cache, a full or
//! unwritable directory, an unreachable server) is a FAIL, named in one line.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use neuron_pc::compile::{CacheConfig, CACHE_STRICT_ENV, USE_CACHE_ENV};
use neuron_pc_cache::{EntryKey, ProbeStep, Tier, READ_ONLY_ENV};
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::key::sha256_hex;
use neuron_pc_compiler::rng::SplitMix64;
use serde_json::json;

use super::{Check, Status};

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes of the probe entry's executable.
const PROBE_BYTES: usize = 64 << 10;

/// The cache checks (one per tier) and the disk checks.
pub fn checks(cache_flag: Option<&str>, flags: &CompilerFlags, min_free_gib: f64) -> Vec<Check> {
    let config = match CacheConfig::resolve(cache_flag, flags) {
        Ok(c) => c,
        Err(e) => {
            return vec![
                Check::fail("cache", e.to_string()),
                disk("disk/temp", &std::env::temp_dir(), min_free_gib),
            ]
        }
    };
    let mut out = cache(&config);
    if config.enabled {
        if let Some(dir) = config.local_dir() {
            out.push(disk("disk/cache", &dir, min_free_gib));
        }
    }
    out.push(disk("disk/temp", &std::env::temp_dir(), min_free_gib));
    out
}

fn tier_check_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Local => "cache/local",
        Tier::Remote => "cache/remote",
    }
}

/// Opens the configured cache and probes each tier.
fn cache(config: &CacheConfig) -> Vec<Check> {
    if !config.enabled {
        return vec![Check::new(
            "cache",
            Status::Warn,
            format!(
                "the persistent compile cache is off ({USE_CACHE_ENV}=0): every job compiles \
                 every graph itself"
            ),
        )];
    }
    let location = config.location();
    let name = if location.starts_with("s3://") {
        "cache/remote"
    } else {
        "cache/local"
    };
    let cache = match config.open(None) {
        Ok(c) => c,
        Err(e) => {
            let detail = format!("cannot open {location}: {e}");
            return vec![Check::fail(name, detail).with_data(json!({ "store": location }))];
        }
    };
    let signed = cache.options().signing_key.is_some();
    let (key, payload) = match probe_entry() {
        Ok(p) => p,
        Err(e) => return vec![Check::fail(name, format!("a probe key: {e}"))],
    };
    let strict = std::env::var(CACHE_STRICT_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    cache
        .probe(&key, &payload)
        .into_iter()
        .flat_map(|p| {
            let conditional = match (p.tier, p.conditional_put) {
                (Tier::Remote, Some(honoured)) => Some(conditional_put(&p.store, honoured, strict)),
                _ => None,
            };
            let name = tier_check_name(p.tier);
            let probe = match p.result {
                Ok(t) => {
                    let detail = format!(
                        "{}: probe entry written, read back and verified{}, deleted (write \
                         {:.1} ms, read {:.1} ms, delete {:.1} ms)",
                        p.store,
                        if signed { " (signed)" } else { "" },
                        t.write_ms,
                        t.read_ms,
                        t.delete_ms
                    );
                    let data = json!({
                        "store": p.store,
                        "signed": signed,
                        "write_ms": t.write_ms,
                        "read_ms": t.read_ms,
                        "delete_ms": t.delete_ms,
                    });
                    Check::ok(name, detail).with_data(data)
                }
                Err((step, e)) => {
                    let why = e.to_string();
                    let detail = match (step, &e) {
                        (ProbeStep::Write, neuron_pc_cache::Error::ReadOnly) => format!(
                            "{}: read-only ({READ_ONLY_ENV} is set): jobs would store nothing \
                             they compile",
                            p.store
                        ),
                        // Store errors often name the store already.
                        _ if why.starts_with(&p.store) => format!("{step} failed: {why}"),
                        _ => format!("{}: {step} failed: {why}", p.store),
                    };
                    let data = json!({ "store": p.store, "step": step, "error": why });
                    Check::fail(name, detail).with_data(data)
                }
            };
            std::iter::once(probe).chain(conditional)
        })
        .collect()
}

/// Whether the shared store refuses a second `If-None-Match: *` PUT of one object: what
/// compile leases and first-writer-wins rest on. A server that ignores it works through the
/// compare-after-write fallback (a WARN), or is refused in strict mode (a FAIL).
fn conditional_put(store: &str, honoured: bool, strict: bool) -> Check {
    let name = "cache/conditional-put";
    let data = json!({ "store": store, "honoured": honoured });
    if honoured {
        let detail = format!("{store}: a second If-None-Match: * PUT is refused, as it must be");
        return Check::ok(name, detail).with_data(data);
    }
    let detail = format!(
        "{store} ignores If-None-Match: * on PUT: compile leases and first-writer-wins use \
         compare-after-write{}",
        if strict {
            format!(" ({CACHE_STRICT_ENV} is set: jobs refuse this cache)")
        } else {
            format!(" (a narrow race remains; {CACHE_STRICT_ENV}=1 refuses such a server)")
        }
    );
    let status = if strict { Status::Fail } else { Status::Warn };
    Check::new(name, status, detail).with_data(data)
}

/// A key no real entry has (a digest of this host, process and instant) and some bytes.
fn probe_entry() -> Result<(EntryKey, Vec<u8>), neuron_pc_cache::Error> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let pid = std::process::id();
    let digest = sha256_hex(format!("neuron-pc doctor probe {host} {pid} {nanos}").as_bytes());
    let key = EntryKey::parse(&digest)?;
    let mut rng = SplitMix64::new(nanos as u64 ^ u64::from(pid));
    let payload = (0..PROBE_BYTES / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    Ok((key, payload))
}

/// Free space where `dir` is (or, when it does not exist yet, would be created).
fn disk(name: &str, dir: &Path, min_free_gib: f64) -> Check {
    let Some(existing) = dir.ancestors().find(|a| a.exists()).map(PathBuf::from) else {
        let detail = format!("{}: neither it nor any parent exists", dir.display());
        return Check::fail(name, detail);
    };
    let st = match rustix::fs::statvfs(&existing) {
        Ok(st) => st,
        Err(e) => {
            let detail = format!("{}: cannot read the free space: {e}", existing.display());
            return Check::fail(name, detail);
        }
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let total = st.f_blocks.saturating_mul(st.f_frsize);
    let min_free = (min_free_gib * GIB) as u64;
    let place = if existing == dir {
        dir.display().to_string()
    } else {
        format!(
            "{} (not created yet; on the file system of {})",
            dir.display(),
            existing.display()
        )
    };
    let data = json!({
        "path": dir,
        "checked": existing,
        "free_bytes": free,
        "total_bytes": total,
        "min_free_bytes": min_free,
    });
    let figures = format!(
        "{:.1} GiB free of {:.1} GiB",
        free as f64 / GIB,
        total as f64 / GIB
    );
    if free < min_free {
        let detail = format!("{place}: only {figures}, below --min-free-gib {min_free_gib}");
        Check::fail(name, detail).with_data(data)
    } else {
        Check::ok(name, format!("{place}: {figures}")).with_data(data)
    }
}
