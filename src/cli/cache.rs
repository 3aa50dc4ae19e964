//! `neuron-pc cache ...`: look after the persistent compile cache.
//!
//! Data goes to stdout (a table, or JSON with `--json`); logs go to stderr. The cache is the
//! one named by `--cache`, else `NEURON_COMPILE_CACHE_URL`, else `NEURON_CC_FLAGS`'
//! `--cache_dir`, else the local default (see `neuron_pc::compile::CacheConfig::resolve`).

use std::collections::BTreeSet;

use anyhow::{bail, Context};
use neuron_pc::compile::CacheConfig;
use neuron_pc_cache::{parse_size, Cache, EntryKey, ExecutableCheck, Lookup, Tier, READ_ONLY_ENV};
use neuron_pc_compiler::flags::CompilerFlags;

/// `neuron-pc cache <command>`.
#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

/// Options every cache command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The cache: a directory, file:///dir or s3://bucket/prefix (over
    /// NEURON_COMPILE_CACHE_URL and NEURON_CC_FLAGS' --cache_dir).
    #[arg(long = "cache", value_name = "URL")]
    pub cache: Option<String>,
}

/// The cache commands.
#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// List the entries.
    Ls(Common),
    /// Entry, failure and byte counts.
    Stats(Common),
    /// One entry's record and key inputs; with a second key, the inputs that differ.
    Show {
        key: String,
        /// Another key to compare key inputs with.
        other: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Check every entry's digest (and signature when NEURON_PC_CACHE_SIGNING_KEY is set);
    /// exits 1 when any entry is bad.
    Verify {
        /// Remove bad entries and what interrupted writers left behind.
        #[arg(long)]
        fix: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Evict least recently used entries of the local tier down to a size (like 10G, 500M).
    Prune {
        #[arg(long, value_name = "SIZE")]
        max_size: String,
        #[command(flatten)]
        common: Common,
    },
    /// Remove one entry (and its failure record).
    Rm {
        key: String,
        #[command(flatten)]
        common: Common,
    },
    /// Remove every entry, or with --failed only the failure records. A shared (s3://) cache
    /// asks for confirmation, or needs --yes when stdin is not a terminal.
    Clear {
        #[arg(long)]
        failed: bool,
        /// Do not ask before clearing a shared cache.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        common: Common,
    },
}

fn open(common: &Common) -> anyhow::Result<Cache> {
    let flags = CompilerFlags::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let config = CacheConfig::resolve(common.cache.as_deref(), &flags)?;
    let cache = config.open(None).context("opening the compile cache")?;
    // A command about a cache it cannot reach would report an empty or partial cache.
    if let Some(down) = cache.disabled_tiers().first() {
        bail!(
            "cannot reach {down} (see the warning above); check the endpoint and network, or \
             raise NEURON_PC_CACHE_S3_TIMEOUT"
        )
    }
    tracing::debug!("compile cache: {}", cache.describe());
    Ok(cache)
}

/// A whole key, or a unique prefix of one (as `compile`'s table prints them).
fn parse_key(cache: &Cache, s: &str) -> anyhow::Result<EntryKey> {
    Ok(cache.resolve(s)?)
}

fn tier_names(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|t| match t {
            Tier::Local => "local",
            Tier::Remote => "remote",
        })
        .collect::<Vec<_>>()
        .join("+")
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Runs a cache command; returns the process exit code. `check` lets `verify` judge each
/// executable against its stored program (the binary passes one that loads executables with
/// the plugin; the cache crate's tests pass none).
pub fn run_with(args: CacheArgs, check: Option<ExecutableCheck<'_>>) -> anyhow::Result<i32> {
    match args.command {
        CacheCommand::Ls(common) => {
            let entries = open(&common)?.list()?;
            if common.json {
                print_json(&entries)?;
            } else {
                println!(
                    "{:<64}  {:<12}  {:>12}  {:>10}  {:>9}",
                    "KEY", "TIER", "BYTES", "COMPILE_MS", "AGE"
                );
                for e in &entries {
                    let tiers = tier_names(&e.tiers);
                    match &e.problem {
                        Some(p) => println!("{:<64}  {tiers:<12}  BAD: {p}", e.key),
                        None => println!(
                            "{:<64}  {tiers:<12}  {:>12}  {:>10.1}  {:>9}",
                            e.key,
                            e.executable_size,
                            e.compile_ms,
                            age(e.created_at)
                        ),
                    }
                }
            }
            Ok(0)
        }
        CacheCommand::Stats(common) => {
            let cache = open(&common)?;
            let s = cache.stats()?;
            if common.json {
                print_json(&serde_json::json!({"cache": cache.describe(), "stats": s}))?;
            } else {
                println!("cache     {}", cache.describe());
                println!("entries   {}", s.entries);
                println!("failures  {}", s.failures);
                println!("bytes     {}", s.bytes);
                println!("locks     {}", s.locks);
                if s.tiers.len() > 1 {
                    for t in &s.tiers {
                        println!(
                            "  {}: {} entries, {} failures, {} bytes, {} locks",
                            t.store, t.entries, t.failures, t.bytes, t.locks
                        );
                    }
                }
                println!(
                    "signing   {}",
                    match (s.signed, s.shared) {
                        (true, _) => "on (unsigned or mis-signed entries are refused)",
                        (false, true) => {
                            "OFF on a shared cache: whoever can write the bucket can plant \
                             executables; set NEURON_PC_CACHE_SIGNING_KEY"
                        }
                        (false, false) => "off",
                    }
                );
            }
            Ok(0)
        }
        CacheCommand::Show { key, other, common } => show(&key, other.as_deref(), &common),
        CacheCommand::Verify { fix, common } => {
            let cache = open(&common)?;
            if fix && cache.options().read_only {
                bail!(
                    "verify --fix would repair a read-only cache ({READ_ONLY_ENV} is set); run \
                     without --fix to report only"
                )
            }
            let r = cache.verify_with(fix, check)?;
            // With --fix, success means what is left is sound.
            let unfixed = if fix {
                r.bad.len().saturating_sub(r.removed)
            } else {
                r.bad.len()
            };
            if common.json {
                print_json(&r)?;
            } else {
                for (k, problem) in &r.bad {
                    println!("bad {k}: {problem}");
                }
                for item in &r.removed_items {
                    println!("removed {item}");
                }
                println!(
                    "checked {} entries: {} loaded ({} also against their programs), {} by \
                     digest only; {} bad, {} removed, {} leftovers cleaned",
                    r.checked,
                    r.loaded,
                    r.programs_checked,
                    r.digest_only,
                    r.bad.len(),
                    r.removed,
                    r.leftovers
                );
                for (why, n) in &r.not_loaded {
                    println!("  not loaded ({why}): {n}");
                }
            }
            Ok(i32::from(unfixed > 0))
        }
        CacheCommand::Prune { max_size, common } => {
            let Some(max) = parse_size(&max_size) else {
                bail!("--max-size {max_size:?}: expected a size like 500M or 10G")
            };
            let removed = open(&common)?.prune(max)?;
            if common.json {
                print_json(&serde_json::json!({"removed": removed, "max_size": max}))?;
            } else {
                println!("removed {removed} entries");
            }
            Ok(0)
        }
        CacheCommand::Rm { key, common } => {
            let cache = open(&common)?;
            let k = parse_key(&cache, &key)?;
            cache.remove(&k)?;
            if common.json {
                print_json(&serde_json::json!({"removed": k.as_str()}))?;
            } else {
                println!("removed {k}");
            }
            Ok(0)
        }
        CacheCommand::Clear {
            failed,
            yes,
            common,
        } => {
            let cache = open(&common)?;
            if !yes && cache.stats().is_ok_and(|s| s.shared) {
                confirm_clear(&cache.describe(), failed)?;
            }
            let n = cache.clear(failed)?;
            if common.json {
                print_json(&serde_json::json!({"removed_objects": n, "failed_only": failed}))?;
            } else {
                println!("removed {n} objects");
            }
            Ok(0)
        }
    }
}

/// Asks on the terminal before clearing a shared cache; without a terminal, refuses.
fn confirm_clear(what: &str, failed: bool) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let objects = if failed { "failure records" } else { "entries" };
    if !std::io::stdin().is_terminal() {
        bail!(
            "refusing to clear the {objects} of the shared cache {what} without confirmation; \
             pass --yes"
        )
    }
    eprint!("clear every {objects} of the shared cache {what}? type yes: ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if answer.trim() != "yes" {
        bail!("not cleared")
    }
    Ok(())
}

/// `created_at` (unix seconds) as a short age like `42s`, `7m`, `3h`, `12d`.
fn age(created_at: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let s = now.saturating_sub(created_at);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn show(key: &str, other: Option<&str>, common: &Common) -> anyhow::Result<i32> {
    let cache = open(common)?;
    let k = parse_key(&cache, key)?;
    let record = cache.record(&k);
    let failure = cache.failure(&k);
    if record.is_none() && failure.is_none() {
        eprintln!("no entry for {k} in {}", cache.describe());
        return Ok(1);
    }
    let verified = match cache.get(&k) {
        Lookup::Hit(_) => Ok(()),
        _ => Err(cache
            .check(&k)
            .err()
            .map_or_else(|| "not served".to_string(), |e| e.to_string())),
    };
    let diff = match other {
        Some(o) => {
            let ok = parse_key(&cache, o)?;
            let Some((orec, _)) = cache.record(&ok) else {
                bail!("no entry for {ok}")
            };
            let mine = record
                .as_ref()
                .map(|(r, _)| r.key_inputs.clone())
                .unwrap_or_default();
            let names: BTreeSet<&String> = mine.keys().chain(orec.key_inputs.keys()).collect();
            names
                .into_iter()
                .filter(|n| mine.get(*n) != orec.key_inputs.get(*n))
                .map(|n| {
                    let (this, other) = (mine.get(n), orec.key_inputs.get(n));
                    serde_json::json!({"input": n, "this": this, "other": other})
                })
                .collect::<Vec<_>>()
        }
        None => Vec::new(),
    };
    if common.json {
        print_json(&serde_json::json!({
            "key": k.as_str(),
            "record": record.as_ref().map(|(r, _)| r),
            "tier": record.as_ref().map(|(_, t)| t),
            "verified": verified.is_ok(),
            "problem": verified.as_ref().err(),
            "failure": failure,
            "differs_from_other": other.map(|_| &diff),
        }))?;
        return Ok(0);
    }
    println!("key            {k}");
    if let Some((r, tier)) = &record {
        println!(
            "tier           {}",
            serde_json::to_value(tier)?.as_str().unwrap_or("?")
        );
        match &verified {
            Ok(()) => println!("verified       yes"),
            Err(p) => println!("verified       NO: {p}"),
        }
        println!(
            "executable     {} bytes, sha256 {}",
            r.executable_size, r.executable_sha256
        );
        println!("program        {} bytes", r.program_size);
        println!("compile        {:.1} ms", r.compile_ms);
        println!("tool version   {}", r.tool_version);
        println!(
            "created        {} ago (unix time {})",
            age(r.created_at),
            r.created_at
        );
        println!("format         {}", r.format_version);
        println!(
            "signed         {}",
            if r.signature.is_some() { "yes" } else { "no" }
        );
        println!("key inputs:");
        for (name, value) in &r.key_inputs {
            println!("  {name:<22} {value}");
        }
    }
    if let Some(f) = &failure {
        println!("failed compile by {}: {}", f.compiler_version, f.message);
    }
    if let Some(o) = other {
        if diff.is_empty() {
            println!("key inputs equal to {o}'s");
        } else {
            println!("key inputs that differ from {o}:");
            for d in &diff {
                println!(
                    "  {:<22} {} vs {}",
                    d["input"].as_str().unwrap_or("?"),
                    d["this"],
                    d["other"]
                );
            }
        }
    }
    Ok(0)
}
