//! `neuron-pc doctor`: the preflight to run before a long data-parallel job (an AWS Batch or
//! Kubernetes init step). Each check is one line with a verdict and a short detail: the plugin
//! loads, every device computes a matmul right, the collectives give exact results over all
//! devices, the compile cache takes a write, a verified read and a delete in every tier, the
//! disks have room; then a table of collective latency and bandwidth by message size in the
//! layout of nccl-tests. Nothing here stops at the first problem: every failure is a FAIL
//! line and the exit status says whether any check failed.

mod bandwidth;
mod devices;
mod storage;

use neuron_pc_cache::parse_size;
use neuron_pc_compiler::flags::CompilerFlags;

/// The largest message `--max-bytes` accepts: beyond it a mistyped size would exhaust host or
/// device memory rather than measure anything.
const MAX_MESSAGE_BYTES: u64 = 8 << 30;

/// `neuron-pc doctor`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Exit status: 0 when every check passed (warnings allowed), 1 when any check failed, 2 for a \
usage error.\n\
Checks: plugin, compute, all_reduce, all_gather, reduce_scatter, cache/<tier>, disk/cache, \
disk/temp, bandwidth. Verdicts: ok, warn, FAIL, skip (not run: an earlier check failed, \
--skip-bandwidth, or one device).")]
pub struct DoctorArgs {
    /// Devices to check: replicas 0..N run on devices 0..N. Default: every device the client
    /// exposes; on the cpu target the client is created with N devices.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    devices: Option<u32>,
    /// Print one JSON document (every check, and the bandwidth table's rows) instead of lines.
    #[arg(long)]
    json: bool,
    /// The cache to probe: a directory, file:///dir or s3://bucket/prefix (over
    /// NEURON_COMPILE_CACHE_URL and NEURON_CC_FLAGS' --cache_dir).
    #[arg(long = "cache", value_name = "URL")]
    cache: Option<String>,
    /// Smallest message of the bandwidth table: bytes of a rank's larger buffer (like 1K).
    #[arg(long, value_name = "SIZE", default_value = "1K", value_parser = message_size)]
    min_bytes: u64,
    /// Largest message of the bandwidth table (like 16M; at most 8G).
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = message_size)]
    max_bytes: u64,
    /// Each message size of the table is this many times the one before.
    #[arg(long, value_name = "F", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(2..=1024))]
    factor: u32,
    /// Timed runs per message size (the table shows the median).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    iters: u32,
    /// Untimed runs per message size before the timed ones.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    warmup: u32,
    /// Leave out the bandwidth table.
    #[arg(long)]
    skip_bandwidth: bool,
    /// Free space (GiB) below which a disk check fails: at the cache's local tier and in the
    /// temporary directory.
    #[arg(long, value_name = "GIB", default_value_t = 1.0, value_parser = gibibytes)]
    min_free_gib: f64,
}

fn message_size(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Some(n) if (4..=MAX_MESSAGE_BYTES).contains(&n) => Ok(n),
        Some(_) => Err("a message size must be from 4 bytes to 8G".into()),
        None => Err("expected a size like 4096, 64K, 16M or 1G".into()),
    }
}

fn gibibytes(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("expected a number of GiB, like 1 or 0.5".into()),
    }
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    /// Not run (an earlier check failed, or it was turned off or does not apply).
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One check's line: name, verdict, detail, and for JSON what was measured.
#[derive(Debug, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl Check {
    pub fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            detail: detail.into(),
            data: serde_json::Value::Null,
        }
    }

    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Ok, detail)
    }

    pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Fail, detail)
    }

    pub fn skip(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Skip, detail)
    }

    pub fn with_data(mut self, data: serde_json::Value) -> Check {
        self.data = data;
        self
    }
}

/// Collects checks; in text mode prints each line as it comes, so a long run shows progress.
struct Report {
    json: bool,
    checks: Vec<Check>,
}

impl Report {
    fn add(&mut self, check: Check) {
        if !self.json {
            say(&format!(
                "{:<4}  {:<14}  {}",
                check.status.label(),
                check.name,
                one_line(&check.detail)
            ));
        }
        self.checks.push(check);
    }

    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Prints a line to stdout. A closed stdout (`doctor | head`) does not stop the checks: the
/// exit status still reports them.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// `1 device`, `4 devices`.
fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Details are one line whatever an error message holds.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs every check; returns the exit status (see the command's help).
pub fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    if args.min_bytes > args.max_bytes {
        eprintln!(
            "error: --min-bytes {} is larger than --max-bytes {}",
            args.min_bytes, args.max_bytes
        );
        return Ok(2);
    }
    let mut report = Report {
        json: args.json,
        checks: Vec::new(),
    };
    let flags = match CompilerFlags::from_env() {
        Ok(f) => Some(f),
        Err(e) => {
            report.add(Check::fail("flags", e.to_string()));
            None
        }
    };
    let setup = match &flags {
        Some(f) => {
            let (check, setup) = devices::load(f.target, args.devices);
            report.add(check);
            setup
        }
        None => {
            report.add(Check::skip("plugin", "NEURON_CC_FLAGS does not parse"));
            None
        }
    };
    let no_devices = if flags.is_some() {
        "the plugin check failed"
    } else {
        "NEURON_CC_FLAGS does not parse"
    };
    match &setup {
        Some(s) => {
            report.add(devices::matmul(s));
            for check in devices::collectives(s) {
                report.add(check);
            }
        }
        None => {
            for name in ["compute", "all_reduce", "all_gather", "reduce_scatter"] {
                report.add(Check::skip(name, no_devices));
            }
        }
    }
    let default_flags = CompilerFlags::default();
    let storage_flags = flags.as_ref().unwrap_or(&default_flags);
    for check in storage::checks(args.cache.as_deref(), storage_flags, args.min_free_gib) {
        report.add(check);
    }
    let rows = match &setup {
        Some(s) => {
            let (check, rows) = bandwidth::sweep(s, &args, !args.json);
            report.add(check);
            rows
        }
        None => {
            report.add(Check::skip("bandwidth", no_devices));
            Vec::new()
        }
    };

    let failed = report.count(Status::Fail);
    if args.json {
        let doc = serde_json::json!({
            "ok": failed == 0,
            "target": flags.as_ref().map(|f| f.target.name()),
            "devices": setup.as_ref().map(|s| s.devices.len()),
            "checks": report.checks,
            "bandwidth": rows,
        });
        say(&serde_json::to_string_pretty(&doc)?);
    } else {
        let (ok, warn, skip) = (
            report.count(Status::Ok),
            report.count(Status::Warn),
            report.count(Status::Skip),
        );
        let verdict = if failed == 0 { "passed" } else { "FAILED" };
        say(&format!(
            "doctor {verdict}: {ok} ok, {warn} warn, {failed} FAIL, {skip} skipped"
        ));
    }
    Ok(i32::from(failed > 0))
}
