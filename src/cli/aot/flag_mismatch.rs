//! `analyze`'s check that a run's compiler flags match what the cache holds for the same job:
//! after `neuron-pc compile --optlevel O1 -- job`, a run without those flags computes other keys
//! and compiles every graph again. When some of the trial's graphs are missing, the flag sets of
//! the cache's entries (for the same compiler) are collected, the trial is repeated under each
//! other set, and a set under which graphs of this job are cached is reported with the exact
//! `NEURON_CC_FLAGS` to use.

use std::collections::{BTreeMap, BTreeSet};

use neuron_pc_cache::Cache;

use neuron_pc::compile::extract::GraphRecord;
use neuron_pc_cache::EntryKey;

/// At most this many other flag sets are tried (one trial run each).
const MAX_FLAG_SETS: usize = 4;
/// At most this many entry records (the newest) are read to find them: a shared S3 cache may
/// hold many entries, and each record is one request.
const MAX_RECORDS: usize = 256;

/// Graphs of this job found in the cache under other flags than the run's.
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct FlagMismatch {
    /// The run's flags (`NEURON_CC_FLAGS` syntax).
    pub run_flags: String,
    /// The flags under which the cache holds graphs of this job.
    pub cached_flags: String,
    /// `--optlevel 1 (this run: 2)`, one per differing flag.
    pub differences: Vec<String>,
    /// Trial graphs missing from the cache under the run's flags.
    pub missing: usize,
    /// Trial graphs (under `cached_flags`) that are cached.
    pub cached: usize,
    /// Trial graphs under `cached_flags`.
    pub graphs: usize,
}

/// The `flag.*` components of a key (name without the prefix → value).
fn flag_set(components: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    components
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("flag.").map(|n| (n.to_string(), v.clone())))
        .collect()
}

fn compiler_of(components: &BTreeMap<String, String>) -> BTreeMap<&String, &String> {
    components
        .iter()
        .filter(|(k, _)| k.starts_with("compiler.") || *k == "format_version")
        .collect()
}

/// The `NEURON_CC_FLAGS` words that give a flag set back (key field names map to flag names by
/// `_` → `-`; `neuron.*` switches are stored as `on`).
pub fn flags_text(set: &BTreeMap<String, String>) -> String {
    let order = [
        "target",
        "optlevel",
        "auto_cast",
        "auto_cast_type",
        "model_type",
    ];
    let mut words = Vec::new();
    let mut push = |name: &str, value: &str| {
        words.push(format!("--{}", name.replace('_', "-")));
        if value != "on" {
            words.push(value.to_string());
        }
    };
    for name in order {
        if let Some(v) = set.get(name) {
            push(name, v);
        }
    }
    for (name, v) in set {
        if let Some(n) = name.strip_prefix("neuron.") {
            push(n, v);
        }
    }
    words.join(" ")
}

fn differences(run: &BTreeMap<String, String>, other: &BTreeMap<String, String>) -> Vec<String> {
    let names: BTreeSet<&String> = run.keys().chain(other.keys()).collect();
    names
        .into_iter()
        .filter(|n| run.get(*n) != other.get(*n))
        .map(|n| {
            let flag = format!("--{}", n.trim_start_matches("neuron.").replace('_', "-"));
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "unset".into());
            format!(
                "{flag} {} (this run: {})",
                show(other.get(n)),
                show(run.get(n))
            )
        })
        .collect()
}

fn is_cached(cache: &Cache, key: &str) -> bool {
    EntryKey::parse(key).is_ok_and(|k| cache.contains(&k))
}

/// Checks `records` (the trial under the run's flags) against `cache`; `rerun(flags)` repeats
/// the trial under other flags and returns its records.
pub fn check(
    records: &[GraphRecord],
    cache: &Cache,
    mut rerun: impl FnMut(&str) -> anyhow::Result<Vec<GraphRecord>>,
) -> anyhow::Result<Vec<FlagMismatch>> {
    let missing = records.iter().filter(|r| !is_cached(cache, &r.key)).count();
    let Some(first) = records.first() else {
        return Ok(Vec::new());
    };
    if missing == 0 || first.components.is_empty() {
        return Ok(Vec::new());
    }
    let run = flag_set(&first.components);
    let compiler = compiler_of(&first.components);
    let mut others: BTreeSet<BTreeMap<String, String>> = BTreeSet::new();
    let mut entries = cache.list().unwrap_or_default();
    entries.sort_by_key(|e| std::cmp::Reverse(e.created_at));
    entries.truncate(MAX_RECORDS);
    for entry in entries {
        let Ok(k) = EntryKey::parse(&entry.key) else {
            continue;
        };
        let Some((rec, _)) = cache.record(&k) else {
            continue;
        };
        let set = flag_set(&rec.key_inputs);
        if set != run && compiler_of(&rec.key_inputs) == compiler {
            others.insert(set);
        }
        if others.len() >= MAX_FLAG_SETS {
            break;
        }
    }
    let mut out = Vec::new();
    for set in others {
        let text = flags_text(&set);
        let trial = rerun(&text)?;
        let cached = trial.iter().filter(|r| is_cached(cache, &r.key)).count();
        if cached > 0 {
            out.push(FlagMismatch {
                run_flags: flags_text(&run),
                cached_flags: text,
                differences: differences(&run, &set),
                missing,
                cached,
                graphs: trial.len(),
            });
        }
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.cached));
    Ok(out)
}

/// The text report's lines for one mismatch.
pub fn describe(m: &FlagMismatch) -> String {
    format!(
        "flags differ from the cache's: {} of this run's graphs are not cached under its flags, \
         but {} of {} graphs of the same job are cached under {}.\n  \
         Run with NEURON_CC_FLAGS='{}' to use them (or compile again with this run's flags)",
        m.missing,
        m.cached,
        m.graphs,
        m.differences.join(", "),
        m.cached_flags
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn flag_sets_print_as_flags_that_parse_back() {
        let s = set(&[
            ("target", "trn1"),
            ("optlevel", "1"),
            ("auto_cast", "all"),
            ("auto_cast_type", "fp16"),
            ("model_type", "transformer"),
            ("neuron.distribution_strategy", "llm-training"),
            ("neuron.enable_saturate_infinity", "on"),
        ]);
        let text = flags_text(&s);
        assert_eq!(
            text,
            "--target trn1 --optlevel 1 --auto-cast all --auto-cast-type fp16 --model-type \
             transformer --distribution-strategy llm-training --enable-saturate-infinity"
        );
        let parsed = neuron_pc_compiler::flags::CompilerFlags::parse(&text).unwrap();
        let back: BTreeMap<String, String> = parsed
            .key_fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(back, s);
    }

    #[test]
    fn differences_name_each_flag_with_both_values() {
        let run = set(&[("optlevel", "2"), ("target", "cpu")]);
        let other = set(&[("optlevel", "1"), ("target", "cpu")]);
        assert_eq!(
            differences(&run, &other),
            ["--optlevel 1 (this run: 2)".to_string()]
        );
    }
}
