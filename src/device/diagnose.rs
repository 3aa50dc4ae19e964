//! Recompilation diagnostics: when a mark_step site that has already run produces a graph not
//! seen before, say once what differs from the most similar graph seen there (an input shape,
//! a dtype, a constant, an op) and where, so users can fix the cause (usually a last partial
//! batch) instead of paying for a compile every few steps.

use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::sync::Arc;

use neuron_pc_compiler::ir::Graph;

use super::trace::{Node, Value};
use super::{lock, DeviceInner};
use crate::error::{Error, Result};

/// What is remembered of a graph to explain differences.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub params: Vec<String>,
    /// The tensor name of each parameter, `""` when unnamed.
    pub names: Vec<String>,
    pub ops: Vec<String>,
}

impl Summary {
    pub(crate) fn of(graph: &Graph, names: &[String]) -> Summary {
        Summary {
            params: graph
                .parameter_types()
                .iter()
                .map(|t| t.to_string())
                .collect(),
            names: names.to_vec(),
            ops: graph.op_descriptions(),
        }
    }

    /// `input 3 (mlp.0.weight)`, or `input 3` when the tensor has no name.
    fn input(&self, i: usize) -> String {
        match self.names.get(i).filter(|n| !n.is_empty()) {
            Some(n) => format!("input {i} ({n})"),
            None => format!("input {i}"),
        }
    }
}

#[derive(Default)]
struct Site {
    steps: u64,
    graphs: Vec<Summary>,
    reported: HashSet<String>,
    /// The lines that recorded the ops of the site's first graph, kept until its second step
    /// (see [`made_before_the_loop`]).
    first_lines: Option<HashSet<&'static Location<'static>>>,
}

/// Per-site history of one device.
#[derive(Default)]
pub(crate) struct Sites {
    by_site: HashMap<&'static Location<'static>, Site>,
    /// Lines whose implicit sync the debug mode has already named.
    implicit_sync_reported: HashSet<&'static Location<'static>>,
}

impl Sites {
    /// True the first time `site` is passed.
    pub(crate) fn first_implicit_sync(&mut self, site: &'static Location<'static>) -> bool {
        self.implicit_sync_reported.insert(site)
    }
}

/// Called for every graph not found in memory, before it is compiled. `explicit`: the graph
/// was cut by `mark_step` at `site`; otherwise by a read of a value there (an implicit sync).
pub(crate) fn check_new_graph(
    dev: &Arc<DeviceInner>,
    site: &'static Location<'static>,
    explicit: bool,
    graph: &Graph,
    names: &[String],
    roots: &[Arc<Node>],
) -> Result<()> {
    let summary = Summary::of(graph, names);
    let mut sites = lock(&dev.sites);
    let entry = sites.by_site.entry(site).or_default();
    made_before_the_loop(entry, site, explicit, roots, &summary);
    let after_warmup = entry.steps >= dev.config.warmup_steps;
    let cause = (after_warmup && !entry.graphs.is_empty()).then(|| cause(&entry.graphs, &summary));
    let step = entry.steps;
    entry.graphs.push(summary);
    let Some(cause) = cause else { return Ok(()) };
    lock(&dev.metrics).recompiles_after_warmup += 1;
    let cut = if explicit {
        format!("mark_step {site}")
    } else {
        format!("the read at {site} (an implicit sync)")
    };
    let message = match &cause {
        Cause::Grows(counts) => format!(
            "new graph at {cut} after warm-up (step {step} there): the graph cut here grows step \
             after step ({counts} ops), so each one is compiled again. Values computed in one \
             step feed the next with no mark_step between them: a missing mark_step. Call \
             device.mark_step() once per training step (after the optimizer update); the read \
             at {site} then only waits for a value"
        ),
        Cause::Inputs(diff) => format!(
            "new graph at {cut} after warm-up (step {step} there): it differs from a graph \
             seen at the same place in {diff}: shapes vary between steps, and each new shape \
             is compiled again. Use fixed-size batches (drop or pad the last partial \
             batch; pad sequences to a few lengths)"
        ),
        Cause::Ops(diff) => format!(
            "new graph at {cut} after warm-up (step {step} there): it differs from a graph seen \
             at the same place in {diff}, and each new graph is compiled again. A value baked \
             into the graph changed (a plain number in an op, a branch taken): values that \
             change every step belong in device tensors (device.scalar), not constants"
        ),
    };
    if dev.config.fail_on_new_graph_after_warmup {
        return Err(Error::NewGraphAfterWarmup(message));
    }
    let key = match cause {
        // a growing graph is one problem, however many sizes it reaches
        Cause::Grows(_) => "grows".to_string(),
        Cause::Inputs(d) | Cause::Ops(d) => d,
    };
    if entry.reported.insert(key) {
        tracing::warn!("{message}");
    }
    Ok(())
}

/// A value made before a training loop and still pending when the loop's first `mark_step`
/// cuts it is computed by step 0's graph, so step 0 and every step after it are two graphs,
/// each compiled (a whole step's compile, for one `arange`). Seen at step 1: when step 1's
/// graph reads every input step 0's did (of the same types; it reads the values step 0 made
/// besides), the lines that recorded ops of step 0's graph that step 1's does not hold are
/// named, once per site, provided step 1 recorded nothing on a line step 0 did not (the loop's
/// body is in both). Two steps that differ otherwise (a prefill, then one token at a time; one
/// helper's `mark_step` after two different models) are not this.
fn made_before_the_loop(
    entry: &mut Site,
    site: &'static Location<'static>,
    explicit: bool,
    roots: &[Arc<Node>],
    new: &Summary,
) {
    match entry.steps {
        0 if entry.graphs.is_empty() => entry.first_lines = Some(lines_of(roots)),
        1 => {
            let Some(first) = entry.first_lines.take() else {
                return;
            };
            if !entry.graphs.first().is_some_and(|g| reads_as_much(new, g)) {
                return;
            }
            let now = lines_of(roots);
            if !now.is_subset(&first) {
                return;
            }
            let mut only_first: Vec<_> = first.difference(&now).copied().collect();
            if only_first.is_empty() {
                return;
            }
            only_first.sort_by_key(|l| (l.file(), l.line(), l.column()));
            let shown: Vec<String> = only_first.iter().take(3).map(|l| l.to_string()).collect();
            let more = match only_first.len() {
                n if n > 3 => format!(" (and {} more lines)", n - 3),
                _ => String::new(),
            };
            let cut = if explicit { "mark_step" } else { "the read" };
            tracing::warn!(
                "step 1 at {cut} {site} is a new graph, compiled again: step 0's graph also \
                 computed ops recorded at {}{more}, which step 1's does not. A value made \
                 before the loop was still pending when step 0 was cut, so step 0 computed it \
                 and compiled as a graph of its own. Call device.mark_step() after making it, \
                 before the loop (or make it inside the step)",
                shown.join(", ")
            );
        }
        _ => entry.first_lines = None,
    }
}

/// Whether `new` has an input of each type `old` has, as many of each.
fn reads_as_much(new: &Summary, old: &Summary) -> bool {
    let mut left: HashMap<&str, usize> = HashMap::new();
    for t in &new.params {
        *left.entry(t.as_str()).or_default() += 1;
    }
    old.params.iter().all(|t| match left.get_mut(t.as_str()) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    })
}

/// The lines that recorded the ops below `roots`.
fn lines_of(roots: &[Arc<Node>]) -> HashSet<&'static Location<'static>> {
    let mut lines = HashSet::new();
    let mut seen: HashSet<*const Node> = HashSet::new();
    let mut stack: Vec<&Arc<Node>> = roots.iter().collect();
    while let Some(node) = stack.pop() {
        if !seen.insert(Arc::as_ptr(node)) {
            continue;
        }
        lines.extend(node.site);
        stack.extend(node.operands.iter().filter_map(|v| match v {
            Value::Node(n) => Some(n),
            Value::Data(_) => None,
        }));
    }
    lines
}

/// Why a site produced a new graph.
#[derive(Debug, PartialEq)]
enum Cause {
    /// Each graph at the site has more ops than the one before (the op counts, oldest first).
    Grows(String),
    /// The inputs differ from the closest graph seen there (what differs).
    Inputs(String),
    /// The ops differ (a constant, an op).
    Ops(String),
}

/// How many graphs in a row, the new one included, must each be larger than the one before
/// for the site to count as growing (two could be a second code path).
const GROWTH_RUN: usize = 3;

fn cause(seen: &[Summary], new: &Summary) -> Cause {
    let recent: Vec<usize> = seen
        .iter()
        .rev()
        .take(GROWTH_RUN - 1)
        .rev()
        .map(|s| s.ops.len())
        .chain([new.ops.len()])
        .collect();
    if recent.len() == GROWTH_RUN && recent.windows(2).all(|w| w[1] > w[0]) {
        let shown: Vec<String> = seen
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(|s| s.ops.len())
            .chain([new.ops.len()])
            .map(|n| n.to_string())
            .collect();
        return Cause::Grows(shown.join(", "));
    }
    let diff = explain(seen, new);
    if diff.starts_with("its inputs") || diff.starts_with("its number of inputs") {
        Cause::Inputs(diff)
    } else {
        Cause::Ops(diff)
    }
}

/// Counts a completed step at `site`.
pub(crate) fn step_done(dev: &DeviceInner, site: &'static Location<'static>) {
    lock(&dev.sites).by_site.entry(site).or_default().steps += 1;
}

/// Names what differs between `new` and the most similar of `seen` (also the rank-agreement
/// check's diff, `crate::device::rank_check`).
pub(crate) fn explain(seen: &[Summary], new: &Summary) -> String {
    let distance = |s: &Summary| {
        let p = s.params.len().abs_diff(new.params.len())
            + s.params
                .iter()
                .zip(&new.params)
                .filter(|(a, b)| a != b)
                .count();
        let o = s.ops.len().abs_diff(new.ops.len())
            + s.ops.iter().zip(&new.ops).filter(|(a, b)| a != b).count();
        p + o
    };
    let closest = seen
        .iter()
        .min_by_key(|s| distance(s))
        .expect("seen is not empty");
    let param_diffs: Vec<String> = closest
        .params
        .iter()
        .zip(&new.params)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| format!("{}: {b} vs {a}", new.input(i)))
        .collect();
    if !param_diffs.is_empty() {
        let more = if param_diffs.len() > 3 {
            format!(" (+{} more)", param_diffs.len() - 3)
        } else {
            String::new()
        };
        return format!(
            "its inputs ({}{more})",
            param_diffs[..param_diffs.len().min(3)].join(", ")
        );
    }
    if closest.params.len() != new.params.len() {
        return format!(
            "its number of inputs ({} vs {})",
            new.params.len(),
            closest.params.len()
        );
    }
    match closest
        .ops
        .iter()
        .zip(&new.ops)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        Some((i, (a, b))) => format!("op {i}: {b} vs {a}"),
        None => format!(
            "its number of ops ({} vs {})",
            new.ops.len(),
            closest.ops.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(params: &[&str], ops: &[&str]) -> Summary {
        Summary {
            params: params.iter().map(|x| x.to_string()).collect(),
            names: Vec::new(),
            ops: ops.iter().map(|x| x.to_string()).collect(),
        }
    }

    #[test]
    fn names_the_differing_input_shape() {
        let seen = vec![
            s(&["f32[32,128]", "f32[128,10]"], &["dot", "tanh"]),
            s(&["f32[4]"], &["neg"]),
        ];
        let new = s(&["f32[31,128]", "f32[128,10]"], &["dot", "tanh"]);
        assert_eq!(
            explain(&seen, &new),
            "its inputs (input 0: f32[31,128] vs f32[32,128])"
        );
    }

    #[test]
    fn names_inputs_by_tensor_name_when_known() {
        let seen = vec![s(&["f32[32,128]", "i32[32]"], &["dot"])];
        let mut new = s(&["f32[31,128]", "i32[31]"], &["dot"]);
        new.names = vec!["".into(), "labels".into()];
        assert_eq!(
            explain(&seen, &new),
            "its inputs (input 0: f32[31,128] vs f32[32,128], input 1 (labels): i32[31] vs i32[32])"
        );
    }

    #[test]
    fn tells_a_growing_graph_from_varying_shapes() {
        let ops = |n: usize| -> Vec<String> { (0..n).map(|i| format!("op{i}")).collect() };
        let sized = |n: usize| Summary {
            params: vec!["f32[4]".into()],
            names: Vec::new(),
            ops: ops(n),
        };
        // 2, 12, 22 ops: three graphs, each larger than the one before
        let seen = vec![sized(2), sized(12)];
        assert_eq!(cause(&seen, &sized(22)), Cause::Grows("2, 12, 22".into()));
        // two sizes are not yet growth (a second code path looks the same)
        assert!(matches!(cause(&[sized(2)], &sized(12)), Cause::Ops(_)));
        // a smaller graph after larger ones is not growth
        assert!(matches!(cause(&seen, &sized(5)), Cause::Ops(_)));
        // a batch of another size: the inputs differ, the op count does not grow
        let shapes = vec![
            s(&["f32[32,128]"], &["dot", "tanh"]),
            s(&["f32[31,128]"], &["dot", "tanh"]),
        ];
        let new = s(&["f32[30,128]"], &["dot", "tanh"]);
        assert_eq!(
            cause(&shapes, &new),
            Cause::Inputs("its inputs (input 0: f32[30,128] vs f32[32,128])".into())
        );
    }

    #[test]
    fn names_the_differing_op_or_constant() {
        let seen = vec![s(&["f32[4]"], &["constant f32[] 0.5", "multiply f32[4]"])];
        let new = s(&["f32[4]"], &["constant f32[] 0.25", "multiply f32[4]"]);
        assert_eq!(
            explain(&seen, &new),
            "op 0: constant f32[] 0.25 vs constant f32[] 0.5"
        );
    }
}
