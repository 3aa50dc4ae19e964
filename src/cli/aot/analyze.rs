//! `neuron-pc analyze (-- <command> | DIR) [--graph-log FILE]`: what graphs a job makes, which
//! of them differ only in parameter shapes (the sign of dynamic shapes), and which graphs a real
//! run needed that the trial run never produced.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail};

use neuron_pc::compile::extract::{GraphLogLine as LogLine, GraphRecord};
use neuron_pc::compile::{CacheConfig, CACHE_URL_ENV, USE_CACHE_ENV};
use neuron_pc::device::EXTRACT_DIR_ENV;
use neuron_pc_cache::{Cache, EntryKey};
use neuron_pc_compiler::flags::CompilerFlags;

use super::compile_cmd::exit_reason;
use super::temp_dir;

#[derive(clap::Args, Debug)]
pub struct AnalyzeArgs {
    /// An extraction directory (`<key>.json` records), instead of a command.
    pub dir: Option<PathBuf>,
    /// A real run's graph log (written with NEURON_PC_GRAPH_LOG=FILE).
    #[arg(long = "graph-log")]
    pub graph_log: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// Compile cache URL (over NEURON_COMPILE_CACHE_URL): report which graphs it already holds.
    #[arg(long)]
    pub cache: Option<String>,
    /// The job to run as a trial run (after `--`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Graphs that share site, op count and parameter dtypes but not parameter shapes.
#[derive(serde::Serialize, Debug)]
pub struct ShapeGroup {
    pub site: String,
    pub nodes: usize,
    pub keys: Vec<String>,
    /// Per differing parameter: its index and the shapes seen.
    pub differing: Vec<(usize, Vec<String>)>,
    /// The tensor name of each differing parameter (same order), `""` when unnamed.
    pub differing_names: Vec<String>,
    /// When the shapes differ in one dimension (a sequence length): length buckets that would
    /// hold every length seen, and the compiles they would save.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<BucketProposal>,
}

/// Length buckets proposed for a group of graphs whose shapes differ in one dimension.
#[derive(serde::Serialize, Debug, PartialEq)]
pub struct BucketProposal {
    /// The differing dimension of the first differing parameter.
    pub dim: usize,
    /// The lengths seen there, ascending.
    pub lengths: Vec<usize>,
    /// Powers of two holding every length: one graph each.
    pub buckets: Vec<usize>,
    /// Compiles saved: one per length seen, less one per bucket.
    pub compiles_saved: usize,
}

/// The dimensions of a parameter type such as `i32[8,37]`.
fn dims_of_param(p: &str) -> Option<Vec<usize>> {
    let inner = p.split_once('[')?.1.strip_suffix(']')?;
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|d| d.trim().parse().ok()).collect()
}

/// Buckets for shapes that differ in exactly one dimension, the same one in every graph.
pub fn propose_buckets(shapes: &[String]) -> Option<BucketProposal> {
    let dims: Vec<Vec<usize>> = shapes
        .iter()
        .map(|s| dims_of_param(s))
        .collect::<Option<_>>()?;
    let rank = dims.first()?.len();
    if dims.iter().any(|d| d.len() != rank) {
        return None;
    }
    let varying: Vec<usize> = (0..rank)
        .filter(|&i| dims.iter().any(|d| d[i] != dims[0][i]))
        .collect();
    let [dim] = varying[..] else { return None };
    let mut lengths: Vec<usize> = dims.iter().map(|d| d[dim]).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut buckets: Vec<usize> = lengths.iter().map(|l| l.next_power_of_two()).collect();
    buckets.dedup();
    Some(BucketProposal {
        dim,
        compiles_saved: lengths.len().saturating_sub(buckets.len()),
        lengths,
        buckets,
    })
}

#[derive(serde::Serialize, Debug)]
pub struct Analysis {
    pub graphs: usize,
    pub distinct: usize,
    pub nodes: Vec<(String, usize)>,
    pub min_nodes: usize,
    pub max_nodes: usize,
    pub shape_groups: Vec<ShapeGroup>,
    /// Keys of the trial's graphs already in the cache (a later `compile` skips them).
    pub cached: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_graphs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_from_trial: Option<Vec<LogLine>>,
    /// Graphs of this job cached under other compiler flags than the run's.
    pub flag_mismatches: Vec<super::flag_mismatch::FlagMismatch>,
}

fn dtype_of_param(p: &str) -> &str {
    p.split('[').next().unwrap_or(p)
}

/// Groups graphs by (site, op count, parameter dtypes); a group of two or more differs only in
/// shapes.
pub fn shape_groups(records: &[GraphRecord]) -> Vec<ShapeGroup> {
    let mut groups: BTreeMap<(String, usize, Vec<String>), Vec<&GraphRecord>> = BTreeMap::new();
    for r in records {
        let dtypes = r
            .params
            .iter()
            .map(|p| dtype_of_param(p).to_string())
            .collect();
        groups
            .entry((r.site.clone(), r.nodes, dtypes))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .filter(|(_, rs)| rs.len() > 1)
        .map(|((site, nodes, dtypes), rs)| {
            let differing: Vec<(usize, Vec<String>)> = (0..dtypes.len())
                .filter_map(|i| {
                    let mut shapes: Vec<String> = rs.iter().map(|r| r.params[i].clone()).collect();
                    shapes.sort();
                    shapes.dedup();
                    (shapes.len() > 1).then_some((i, shapes))
                })
                .collect();
            let differing_names = differing
                .iter()
                .map(|(i, _)| {
                    rs.iter()
                        .find_map(|r| {
                            r.param_names
                                .get(*i)
                                .filter(|n| !n.is_empty())
                                .map(String::as_str)
                        })
                        .unwrap_or_default()
                        .to_string()
                })
                .collect();
            let buckets = differing
                .first()
                .and_then(|(_, shapes)| propose_buckets(shapes))
                // dimension 0 is the batch: fixed-size batches are the cure there
                .filter(|b| b.dim > 0 && b.compiles_saved > 0);
            ShapeGroup {
                site,
                nodes,
                keys: rs.iter().map(|r| r.key.clone()).collect(),
                differing,
                differing_names,
                buckets,
            }
        })
        .collect()
}

fn read_dir_records(dir: &Path) -> anyhow::Result<Vec<GraphRecord>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    for e in entries {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            out.push(GraphRecord::read(&p).map_err(|e| anyhow!("{}: {e}", p.display()))?);
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Lines of a graph log; a malformed line is an error naming it.
pub fn read_log(path: &Path) -> anyhow::Result<Vec<LogLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Graphs of `log` not among `trial`, each once, at the step it first appeared.
pub fn missing(trial: &HashSet<String>, log: &[LogLine]) -> Vec<LogLine> {
    let mut first: HashMap<String, LogLine> = HashMap::new();
    for l in log.iter().filter(|l| !trial.contains(&l.key)) {
        let e = first.entry(l.key.clone()).or_insert_with(|| l.clone());
        if l.step < e.step {
            *e = l.clone();
        }
    }
    let mut v: Vec<LogLine> = first.into_values().collect();
    v.sort_by(|a, b| (a.step, &a.key).cmp(&(b.step, &b.key)));
    v
}

/// Runs the job as a trial run into a fresh directory (under `flags` instead of the
/// environment's `NEURON_CC_FLAGS` when given); returns the directory and the job's failure.
fn trial(args: &AnalyzeArgs, flags: Option<&str>) -> anyhow::Result<(PathBuf, Option<String>)> {
    let d = temp_dir("analyze")?;
    let (prog, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no command"))?;
    // No persistent cache: every graph is written, cached or not.
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .env(EXTRACT_DIR_ENV, &d)
        .env(USE_CACHE_ENV, "0")
        .stdout(std::process::Stdio::null());
    if let Some(u) = &args.cache {
        cmd.env(CACHE_URL_ENV, u);
    }
    if let Some(f) = flags {
        cmd.env(neuron_pc_compiler::flags::NEURON_CC_FLAGS, f)
            .stderr(std::process::Stdio::null());
    }
    let status = cmd
        .status()
        .map_err(|e| anyhow!("cannot start {prog:?}: {e}"))?;
    Ok((d, exit_reason(status)))
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<i32> {
    let mut trial_error = None;
    let mut temp = None;
    let dir = match (&args.dir, args.command.is_empty()) {
        (Some(d), true) => d.clone(),
        (None, false) => {
            let (d, error) = trial(&args, None)?;
            trial_error = error;
            temp = Some(d.clone());
            d
        }
        _ => bail!("give either an extraction directory or `-- <command>`"),
    };
    let records = read_dir_records(&dir)?;
    if let Some(t) = temp {
        let _ = std::fs::remove_dir_all(t);
    }
    let cache = open_cache(args.cache.as_deref())?;
    // Repeating the trial under other flags needs the command.
    let flag_mismatches = if args.command.is_empty() {
        Vec::new()
    } else {
        super::flag_mismatch::check(&records, &cache, |flags| {
            let (d, _) = trial(&args, Some(flags))?;
            let r = read_dir_records(&d);
            let _ = std::fs::remove_dir_all(&d);
            r
        })?
    };
    let trial: HashSet<String> = records.iter().map(|r| r.key.clone()).collect();
    let (log_graphs, missing_from_trial) = match &args.graph_log {
        Some(p) => {
            let log = read_log(p)?;
            (Some(log.len()), Some(missing(&trial, &log)))
        }
        None => (None, None),
    };
    let cached = records
        .iter()
        .filter(|r| EntryKey::parse(&r.key).is_ok_and(|k| cache.contains(&k)))
        .map(|r| r.key.clone())
        .collect();
    let a = Analysis {
        graphs: records.len(),
        distinct: trial.len(),
        nodes: records.iter().map(|r| (r.key.clone(), r.nodes)).collect(),
        min_nodes: records.iter().map(|r| r.nodes).min().unwrap_or(0),
        max_nodes: records.iter().map(|r| r.nodes).max().unwrap_or(0),
        shape_groups: shape_groups(&records),
        cached,
        log_graphs,
        missing_from_trial,
        flag_mismatches,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&a)?);
    } else {
        print_text(&a, &records);
    }
    if let Some(e) = trial_error {
        eprintln!("error: {e}");
        return Ok(1);
    }
    Ok(0)
}

/// The cache at `url` (or the environment's); only presence is asked of it, so no compiler
/// identity is needed.
/// The first 12 characters of a key as tables show it.
fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

fn open_cache(url: Option<&str>) -> anyhow::Result<Cache> {
    let flags = CompilerFlags::from_env().map_err(|e| anyhow!("{e}"))?;
    CacheConfig::resolve(url, &flags)?
        .open(None)
        .map_err(|e| anyhow!("compile cache: {e}"))
}

fn print_text(a: &Analysis, records: &[GraphRecord]) {
    println!(
        "{} graphs, {} distinct, {}-{} ops, {} already in the cache",
        a.graphs,
        a.distinct,
        a.min_nodes,
        a.max_nodes,
        a.cached.len()
    );
    for r in records {
        let mark = if a.cached.contains(&r.key) {
            "cached"
        } else {
            "new"
        };
        println!(
            "  {} {:>6} ops  {:<6}  {}  [{}]",
            short(&r.key),
            r.nodes,
            mark,
            r.site,
            named_params(&r.params, &r.param_names)
        );
    }
    for g in &a.shape_groups {
        println!(
            "{} graphs at {} differ only in parameter shapes (dynamic shapes):",
            g.keys.len(),
            g.site
        );
        for ((i, shapes), name) in g.differing.iter().zip(&g.differing_names) {
            println!("  {}: {}", param_label(*i, name), shapes.join(" vs "));
        }
        match &g.buckets {
            Some(b) => {
                let list: Vec<String> = b.buckets.iter().map(usize::to_string).collect();
                println!(
                    "  dimension {} takes {} lengths ({}..{}): pad to length buckets {} \
                     (neuron_pc::data::LengthBuckets::parse(\"{}\")) for {} graph(s) instead \
                     of {}, {} compile(s) saved",
                    b.dim,
                    b.lengths.len(),
                    b.lengths[0],
                    b.lengths[b.lengths.len() - 1],
                    list.join(","),
                    list.join(","),
                    b.buckets.len(),
                    b.lengths.len(),
                    b.compiles_saved
                );
            }
            None => println!(
                "  each shape compiles its own graph; \
                 use fixed-size batches (pad or drop the last partial batch)"
            ),
        }
    }
    for m in &a.flag_mismatches {
        println!("{}", super::flag_mismatch::describe(m));
    }
    if let Some(m) = &a.missing_from_trial {
        if m.is_empty() {
            println!("the real run needed no graph the trial run missed");
        } else {
            println!(
                "{} graph(s) the real run needed that the trial run never produced:",
                m.len()
            );
            for l in m {
                println!(
                    "  {} first at step {} ({} ops, {}) [{}]",
                    short(&l.key),
                    l.step,
                    l.nodes,
                    l.site,
                    named_params(&l.params, &l.param_names)
                );
            }
        }
    }
}

/// `parameter 3 (ids)`, or `parameter 3` when the tensor has no name.
fn param_label(i: usize, name: &str) -> String {
    if name.is_empty() {
        format!("parameter {i}")
    } else {
        format!("parameter {i} ({name})")
    }
}

/// `ids: i32[64,32], f32[64]`: each parameter's type, after its tensor name when known.
fn named_params(types: &[String], names: &[String]) -> String {
    types
        .iter()
        .enumerate()
        .map(|(i, t)| match names.get(i).filter(|n| !n.is_empty()) {
            Some(n) => format!("{n}: {t}"),
            None => t.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, site: &str, params: &[&str]) -> GraphRecord {
        GraphRecord {
            key: key.into(),
            nodes: 5,
            params: params.iter().map(|s| s.to_string()).collect(),
            param_names: Vec::new(),
            components: Default::default(),
            site: site.into(),
            ..GraphRecord::default()
        }
    }

    #[test]
    fn groups_name_the_differing_shapes() {
        let rs = [
            rec("a", "s:1", &["f32[32,8]", "f32[8]"]),
            rec("b", "s:1", &["f32[31,8]", "f32[8]"]),
            rec("c", "s:2", &["f32[8]"]),
        ];
        let g = shape_groups(&rs);
        assert_eq!(g.len(), 1);
        assert_eq!(
            g[0].differing,
            vec![(0, vec!["f32[31,8]".to_string(), "f32[32,8]".to_string()])]
        );
    }

    #[test]
    fn buckets_are_proposed_for_one_varying_dimension() {
        let shapes: Vec<String> = [37, 9, 64, 33, 12, 60, 5]
            .iter()
            .map(|l| format!("i32[8,{l}]"))
            .collect();
        let b = propose_buckets(&shapes).unwrap();
        assert_eq!(b.dim, 1);
        assert_eq!(b.lengths, [5, 9, 12, 33, 37, 60, 64]);
        assert_eq!(b.buckets, [8, 16, 64]);
        assert_eq!(b.compiles_saved, 4);
        // two dimensions varying (rows and length): no proposal
        let two = ["i32[8,37]".to_string(), "i32[7,9]".to_string()];
        assert_eq!(propose_buckets(&two), None);
        assert_eq!(dims_of_param("f32[]"), Some(vec![]));
        assert_eq!(dims_of_param("f32[2,x]"), None);
    }

    #[test]
    fn missing_keeps_the_first_step() {
        let l = |k: &str, s| LogLine {
            key: k.into(),
            step: s,
            nodes: 1,
            params: vec![],
            param_names: vec![],
            site: String::new(),
        };
        let trial: HashSet<String> = ["a".to_string()].into();
        let m = missing(&trial, &[l("a", 0), l("b", 7), l("b", 3), l("c", 9)]);
        assert_eq!(
            m.iter()
                .map(|x| (x.key.as_str(), x.step))
                .collect::<Vec<_>>(),
            vec![("b", 3), ("c", 9)]
        );
    }
}
