//! `--shard I/N` and `--shard auto[/N]`: which slice of the graphs this process compiles.
//!
//! `auto` reads the index (and, where the scheduler exports it, the count) from the array-job
//! variables of the scheduler that started the process:
//!
//! - Slurm job array: `(SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP`
//!   of `SLURM_ARRAY_TASK_COUNT` (so `--array=1-4` and `--array=0-12:4` work as `0-3` does);
//! - AWS Batch array job: `AWS_BATCH_JOB_ARRAY_INDEX` of the `N` in `--shard auto/N`;
//! - Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` of the `N` in `--shard auto/N`.
//!
//! AWS Batch and Kubernetes do not export the array size to the task, so it is given on the
//! command line (the same number as the job's `arrayProperties.size` or `completions`). Under
//! Slurm `auto/N` is optional and must agree with the array. Every inconsistency is an error
//! naming the variable, never a guess: a wrong shard silently leaves graphs uncompiled.

use std::fmt;

/// The Slurm array variables (Slurm exports MIN, MAX, STEP and COUNT to every array task).
pub const SLURM_ID: &str = "SLURM_ARRAY_TASK_ID";
pub const SLURM_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
pub const SLURM_MIN: &str = "SLURM_ARRAY_TASK_MIN";
pub const SLURM_MAX: &str = "SLURM_ARRAY_TASK_MAX";
pub const SLURM_STEP: &str = "SLURM_ARRAY_TASK_STEP";
/// AWS Batch's array child index.
pub const AWS_BATCH_INDEX: &str = "AWS_BATCH_JOB_ARRAY_INDEX";
/// A Kubernetes Indexed Job's completion index.
pub const K8S_INDEX: &str = "JOB_COMPLETION_INDEX";

/// Shard `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
    /// The variable the index came from (`--shard auto`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<&'static str>,
}

impl Shard {
    /// The `(index, count)` pair the scheduler filters keys with.
    pub fn pair(&self) -> (u64, u64) {
        (self.index, self.count)
    }
}

/// What `--shard` was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardArg {
    /// `I/N`.
    Fixed { index: u64, count: u64 },
    /// `auto` or `auto/N`: from the scheduler's array-job variables.
    Auto { count: Option<u64> },
}

/// Parses `I/N`, `auto` or `auto/N` (clap's value parser for `--shard`).
pub fn parse(s: &str) -> Result<ShardArg, String> {
    let s = s.trim();
    if s == "auto" {
        return Ok(ShardArg::Auto { count: None });
    }
    if let Some(n) = s.strip_prefix("auto/") {
        let n: u64 = n.trim().parse().map_err(|_| "auto/N: N must be a number")?;
        if n == 0 {
            return Err("auto/N: N must be at least 1".into());
        }
        return Ok(ShardArg::Auto { count: Some(n) });
    }
    let (i, n) = s
        .split_once('/')
        .ok_or("expected I/N (e.g. 0/4), auto, or auto/N")?;
    let i: u64 = i.trim().parse().map_err(|_| "I must be a number")?;
    let n: u64 = n.trim().parse().map_err(|_| "N must be a number")?;
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= I < N"));
    }
    Ok(ShardArg::Fixed { index: i, count: n })
}

/// Why `--shard auto` found no shard. Each message names the variable to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardError {
    /// No scheduler's index variable is set.
    NoScheduler,
    /// Two schedulers' index variables are set.
    Several(&'static str, &'static str),
    /// `var` is unset although `because` is set.
    Missing {
        var: &'static str,
        because: &'static str,
    },
    /// The scheduler does not export the array size.
    NeedCount { var: &'static str },
    /// `var` holds a value that cannot be used.
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
}

impl fmt::Display for ShardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--shard auto: ")?;
        match self {
            ShardError::NoScheduler => write!(
                f,
                "none of {SLURM_ID}, {AWS_BATCH_INDEX}, {K8S_INDEX} is set (not an array job?); \
                 give --shard I/N"
            ),
            ShardError::Several(a, b) => {
                write!(f, "both {a} and {b} are set; give --shard I/N")
            }
            ShardError::Missing { var, because } => {
                write!(f, "{var} is not set, though {because} is")
            }
            ShardError::NeedCount { var } => write!(
                f,
                "{var} gives the index only; give the array size as --shard auto/N"
            ),
            ShardError::Invalid { var, value, why } => write!(f, "{var}={value}: {why}"),
        }
    }
}

impl std::error::Error for ShardError {}

/// The shard `arg` names; `var` reads an environment variable (empty counts as unset).
pub fn resolve(arg: ShardArg, var: impl Fn(&str) -> Option<String>) -> Result<Shard, ShardError> {
    let given = match arg {
        ShardArg::Fixed { index, count } => {
            return Ok(Shard {
                index,
                count,
                from: None,
            })
        }
        ShardArg::Auto { count } => count,
    };
    let get = |name: &'static str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let set: Vec<(&'static str, String)> = [SLURM_ID, AWS_BATCH_INDEX, K8S_INDEX]
        .into_iter()
        .filter_map(|v| get(v).map(|value| (v, value)))
        .collect();
    match &set[..] {
        [] => Err(ShardError::NoScheduler),
        [(SLURM_ID, id)] => slurm(parse_number(SLURM_ID, id)?, &get, given),
        [(var, index)] => {
            let index = parse_number(var, index)?;
            let count = given.ok_or(ShardError::NeedCount { var })?;
            check_below(var, index, index, count)?;
            Ok(Shard {
                index,
                count,
                from: Some(var),
            })
        }
        [(a, _), (b, _), ..] => Err(ShardError::Several(a, b)),
    }
}

fn parse_number(var: &'static str, value: &str) -> Result<u64, ShardError> {
    value.parse().map_err(|_| ShardError::Invalid {
        var,
        value: value.to_string(),
        why: "not a non-negative integer".into(),
    })
}

/// The variable as a number; `None` when unset.
fn number(
    get: &impl Fn(&'static str) -> Option<String>,
    var: &'static str,
) -> Result<Option<u64>, ShardError> {
    get(var).map(|v| parse_number(var, &v)).transpose()
}

fn check_below(var: &'static str, value: u64, index: u64, count: u64) -> Result<(), ShardError> {
    if index < count {
        return Ok(());
    }
    Err(ShardError::Invalid {
        var,
        value: value.to_string(),
        why: format!("shard index {index} is not below the array size {count}"),
    })
}

/// Slurm: the task's position in the array `MIN, MIN + STEP, ..., MAX` of COUNT tasks.
fn slurm(
    id: u64,
    get: &impl Fn(&'static str) -> Option<String>,
    given: Option<u64>,
) -> Result<Shard, ShardError> {
    let count = match (number(get, SLURM_COUNT)?, given) {
        (Some(c), Some(g)) if c != g => {
            return Err(ShardError::Invalid {
                var: SLURM_COUNT,
                value: c.to_string(),
                why: format!("the array has {c} tasks, but --shard auto/{g} says {g}"),
            })
        }
        (Some(c), _) | (None, Some(c)) => c,
        (None, None) => {
            return Err(ShardError::Missing {
                var: SLURM_COUNT,
                because: SLURM_ID,
            })
        }
    };
    if count == 0 {
        return Err(ShardError::Invalid {
            var: SLURM_COUNT,
            value: "0".into(),
            why: "an array has at least one task".into(),
        });
    }
    let min = number(get, SLURM_MIN)?.unwrap_or(0);
    let step = number(get, SLURM_STEP)?.unwrap_or(1);
    if step == 0 {
        return Err(ShardError::Invalid {
            var: SLURM_STEP,
            value: "0".into(),
            why: "the step must be at least 1".into(),
        });
    }
    // A list with gaps (--array=1,5,8) exports MIN=1 MAX=8 STEP=1 COUNT=3: its task ids are
    // not MIN + k * STEP, so no index can be derived from them.
    if let Some(max) = number(get, SLURM_MAX)? {
        let last = (count - 1)
            .checked_mul(step)
            .and_then(|d| d.checked_add(min));
        if last != Some(max) {
            return Err(ShardError::Invalid {
                var: SLURM_MAX,
                value: max.to_string(),
                why: format!(
                    "{count} tasks from {min} in steps of {step} do not end there (an \
                     index list with gaps?); submit a range, e.g. --array=0-{}",
                    count - 1
                ),
            });
        }
    }
    let offset = id.checked_sub(min).filter(|d| d % step == 0);
    let Some(offset) = offset else {
        return Err(ShardError::Invalid {
            var: SLURM_ID,
            value: id.to_string(),
            why: format!("not {SLURM_MIN} ({min}) plus a multiple of {SLURM_STEP} ({step})"),
        });
    };
    let index = offset / step;
    check_below(SLURM_ID, id, index, count)?;
    Ok(Shard {
        index,
        count,
        from: Some(SLURM_ID),
    })
}

/// `--shard` resolved against this process's environment.
pub fn from_env(arg: Option<ShardArg>) -> Result<Option<Shard>, ShardError> {
    arg.map(|a| resolve(a, |name| std::env::var(name).ok()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn auto(count: Option<u64>, pairs: &[(&str, &str)]) -> Result<(u64, u64), ShardError> {
        resolve(ShardArg::Auto { count }, env(pairs)).map(|s| s.pair())
    }

    /// What Slurm exports to task `id` of an array.
    fn slurm_task(
        id: &str,
        min: &str,
        max: &str,
        step: &str,
        count: &str,
    ) -> Vec<(&'static str, String)> {
        vec![
            (SLURM_ID, id.to_string()),
            (SLURM_MIN, min.to_string()),
            (SLURM_MAX, max.to_string()),
            (SLURM_STEP, step.to_string()),
            (SLURM_COUNT, count.to_string()),
        ]
    }

    fn as_refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        v.iter().map(|(k, s)| (*k, s.as_str())).collect()
    }

    #[test]
    fn parses_fixed_and_auto() {
        let cases: &[(&str, Result<ShardArg, ()>)] = &[
            ("1/4", Ok(ShardArg::Fixed { index: 1, count: 4 })),
            (" 0/1 ", Ok(ShardArg::Fixed { index: 0, count: 1 })),
            ("auto", Ok(ShardArg::Auto { count: None })),
            ("auto/8", Ok(ShardArg::Auto { count: Some(8) })),
            ("3/3", Err(())),
            ("1/0", Err(())),
            ("auto/0", Err(())),
            ("auto/x", Err(())),
            ("automatic", Err(())),
            ("4", Err(())),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s).map_err(|_| ()), *want, "{s:?}");
        }
    }

    #[test]
    fn slurm_tasks_map_onto_0_to_count() {
        // (--array, task ids in order): every task gets its position in the array.
        let arrays: &[(&str, &str, &str, &[&str])] = &[
            ("0", "3", "1", &["0", "1", "2", "3"]),
            ("1", "4", "1", &["1", "2", "3", "4"]),
            ("2", "10", "4", &["2", "6", "10"]),
        ];
        for (min, max, step, ids) in arrays {
            let count = ids.len().to_string();
            for (want, id) in ids.iter().enumerate() {
                let vars = slurm_task(id, min, max, step, &count);
                let got = auto(None, &as_refs(&vars));
                assert_eq!(got, Ok((want as u64, ids.len() as u64)), "{vars:?}");
                // auto/N that agrees changes nothing.
                assert_eq!(auto(Some(ids.len() as u64), &as_refs(&vars)), got);
            }
        }
        let from = resolve(
            ShardArg::Auto { count: None },
            env(&as_refs(&slurm_task("2", "0", "3", "1", "4"))),
        )
        .unwrap()
        .from;
        assert_eq!(from, Some(SLURM_ID));
        // Only ID and COUNT (an older Slurm): the array starts at 0.
        assert_eq!(
            auto(None, &[(SLURM_ID, "3"), (SLURM_COUNT, "5")]),
            Ok((3, 5))
        );
    }

    #[test]
    fn index_only_schedulers_take_the_count_from_the_flag() {
        for var in [AWS_BATCH_INDEX, K8S_INDEX] {
            assert_eq!(auto(Some(4), &[(var, "0")]), Ok((0, 4)));
            assert_eq!(auto(Some(4), &[(var, " 3\n")]), Ok((3, 4)));
            let e = auto(None, &[(var, "1")]).unwrap_err();
            assert_eq!(e, ShardError::NeedCount { var });
            assert!(e.to_string().contains(var), "{e}");
            assert!(e.to_string().contains("--shard auto/N"), "{e}");
            let e = auto(Some(4), &[(var, "4")]).unwrap_err();
            assert!(
                e.to_string().contains(&format!("{var}=4")) && e.to_string().contains("below"),
                "{e}"
            );
        }
        let e = resolve(ShardArg::Auto { count: Some(2) }, env(&[(K8S_INDEX, "1")])).unwrap();
        assert_eq!(e.from, Some(K8S_INDEX));
    }

    #[test]
    fn missing_or_contradictory_variables_are_named() {
        // (variables, --shard auto/N, text the one error line must hold)
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Vars<'_>, Option<u64>, &str)] = &[
            (&[], None, SLURM_ID),
            (&[(SLURM_ID, "")], Some(4), AWS_BATCH_INDEX),
            (
                &[(SLURM_ID, "1")],
                None,
                "SLURM_ARRAY_TASK_COUNT is not set",
            ),
            (
                &[(SLURM_ID, "x"), (SLURM_COUNT, "4")],
                None,
                "SLURM_ARRAY_TASK_ID=x",
            ),
            (
                &[(SLURM_ID, "1"), (SLURM_COUNT, "4")],
                Some(8),
                "SLURM_ARRAY_TASK_COUNT=4",
            ),
            (
                &[(SLURM_ID, "0"), (SLURM_COUNT, "0")],
                None,
                "SLURM_ARRAY_TASK_COUNT=0",
            ),
            (
                &[(SLURM_ID, "4"), (SLURM_COUNT, "4")],
                None,
                "SLURM_ARRAY_TASK_ID=4",
            ),
            (
                &[(SLURM_ID, "1"), (SLURM_MIN, "2"), (SLURM_COUNT, "4")],
                None,
                "SLURM_ARRAY_TASK_ID=1",
            ),
            (
                &[
                    (SLURM_ID, "3"),
                    (SLURM_MIN, "2"),
                    (SLURM_STEP, "4"),
                    (SLURM_COUNT, "3"),
                ],
                None,
                "SLURM_ARRAY_TASK_ID=3",
            ),
            (
                &[(SLURM_ID, "1"), (SLURM_STEP, "0"), (SLURM_COUNT, "2")],
                None,
                "STEP=0",
            ),
            // --array=1,5,8
            (
                &[
                    (SLURM_ID, "5"),
                    (SLURM_MIN, "1"),
                    (SLURM_MAX, "8"),
                    (SLURM_STEP, "1"),
                    (SLURM_COUNT, "3"),
                ],
                None,
                "SLURM_ARRAY_TASK_MAX=8",
            ),
            (
                &[(SLURM_ID, "0"), (K8S_INDEX, "0")],
                Some(2),
                "both SLURM_ARRAY_TASK_ID and JOB",
            ),
            (
                &[(AWS_BATCH_INDEX, "-1")],
                Some(2),
                "AWS_BATCH_JOB_ARRAY_INDEX=-1",
            ),
        ];
        for (vars, count, want) in cases {
            let e = auto(*count, vars).unwrap_err().to_string();
            assert!(e.contains(want), "{vars:?}: {e}");
            assert!(e.starts_with("--shard auto: "), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn a_fixed_shard_ignores_the_environment() {
        let vars = [(SLURM_ID, "3"), (SLURM_COUNT, "4")];
        let s = resolve(ShardArg::Fixed { index: 1, count: 2 }, env(&vars)).unwrap();
        assert_eq!((s.pair(), s.from), ((1, 2), None));
    }
}
