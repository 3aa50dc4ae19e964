//! Lowering a [`Graph`] to StableHLO MLIR text that a PJRT plugin compiles.
//!
//! The text is deterministic: values are named by node position (`%v5`; temporaries of node 5
//! are `%v5_...`), parameters are `%argN` in parameter order, there are no locations, and
//! attributes are written in a fixed order. Equal graphs therefore give equal bytes, which the
//! cache key relies on. Most ops use MLIR's generic form (`"stablehlo.op"(...) {...} : (...) ->
//! ...`), which every StableHLO version parses the same way.
//!
//! A few primitives expand to several StableHLO ops: argmax/argmin are a two-operand reduce
//! over (value, index) pairs, random bits are threefry-2x32 written out in integer ops, and
//! reductions get their init constants here. Float max/min (elementwise and in reductions) add
//! explicit NaN checks: the XLA CPU plugin's default fast min/max drops a NaN in one operand,
//! while StableHLO (and the reference evaluator) propagate it. Collectives keep the bare
//! combiner, since the CPU backend accepts nothing else there. erf is CHLO's `chlo.erf`, which
//! the plugin legalizes.
//!
//! Every op/dtype pair that [`crate::ir::infer`] accepts lowers; the graph is re-validated
//! first, so an unsupported pair in a graph from elsewhere is [`crate::Error::UnsupportedDType`].

mod ops;
pub use ops::{process_reduce_code, process_target, PROCESS_INDEX_TARGET};
pub use scan::{READ_ROWS_TARGET, UNINITIALIZED_TARGET, WRITE_ROWS_TARGET};
mod random;
mod scan;
pub(crate) mod text;

use std::fmt::Write;

use crate::error::Result;
use crate::ir::{Graph, Op};

/// The StableHLO text of `graph`: `module @main { func.func public @main(...) -> (...) }`.
///
/// The graph is validated first (graphs also arrive from files and other frontends).
pub fn to_stablehlo(graph: &Graph) -> Result<String> {
    to_stablehlo_with_aliases(graph, &[])
}

/// Like [`to_stablehlo`], with `(parameter, output)` pairs whose buffers may be shared: the
/// parameter is marked `tf.aliasing_output`, so a donated input buffer is updated in place
/// (an optimizer step then holds one copy of the parameters, not two). Each parameter and each
/// output appears at most once, and the two must have the same type.
pub fn to_stablehlo_with_aliases(graph: &Graph, aliases: &[(usize, usize)]) -> Result<String> {
    lower(graph, aliases, None, LowerOptions::default())
}

/// What the runtime that will run a program offers its lowering. The default asks for nothing
/// beyond StableHLO, so the text runs on any target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LowerOptions {
    /// The runtime registered neuron-pc's own custom-call handlers
    /// ([`crate::pjrt::Client::runs_own_handlers`]: a cpu client whose plugin has the FFI
    /// extension), so a loop's stacked results (`ScanOutput::Stacked`) use them. Each buffer
    /// starts as the runtime allocated it, by a call to [`UNINITIALIZED_TARGET`], instead of
    /// filled with zeros: the loop writes every row before anything reads one, and on cpu the
    /// zero fill (and XLA's copy of a fill shared by several loop states) cost a scanned
    /// 32-layer Llama about a tenth of its step. Each iteration reads its rows of the scanned
    /// operands by a call to [`READ_ROWS_TARGET`] and writes its row of each stack by one to
    /// [`WRITE_ROWS_TARGET`] (in place): one copy of the rows' bytes each, instead of a
    /// `dynamic_slice` or `dynamic_update_slice`, which XLA's cpu backend copies element by
    /// element. A partitioned program keeps the plain ops (the SPMD partitioner would see
    /// custom calls it cannot split).
    pub own_handlers: bool,
}

/// Like [`to_stablehlo_with_aliases`], with what the runtime offers ([`LowerOptions`]).
pub fn to_stablehlo_with_options(
    graph: &Graph,
    aliases: &[(usize, usize)],
    options: LowerOptions,
) -> Result<String> {
    lower(graph, aliases, None, options)
}

/// How a program is partitioned by XLA's SPMD partitioner: the partition count and the
/// `mhlo.sharding` of each parameter and output (`crate::sharding::Sharding::hlo`; `None`
/// leaves one to the partitioner's propagation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partitioning {
    /// The number of partitions (devices), at least 1; written as `mhlo.num_partitions`.
    pub num_partitions: usize,
    /// One `mhlo.sharding` per graph parameter, in parameter order.
    pub params: Vec<Option<String>>,
    /// One `mhlo.sharding` per graph output, in output order.
    pub outputs: Vec<Option<String>>,
}

/// Like [`to_stablehlo_with_aliases`], for a program partitioned as `partitioning` says: the
/// module carries `mhlo.num_partitions`, its arguments and results their `mhlo.sharding`.
pub fn to_stablehlo_partitioned(
    graph: &Graph,
    aliases: &[(usize, usize)],
    partitioning: &Partitioning,
) -> Result<String> {
    lower(graph, aliases, Some(partitioning), LowerOptions::default())
}

fn lower(
    graph: &Graph,
    aliases: &[(usize, usize)],
    partitioning: Option<&Partitioning>,
    options: LowerOptions,
) -> Result<String> {
    graph.validate()?;
    let expanded = crate::ir::expand_calls(graph)?;
    let graph: &Graph = &expanded;
    if let Some(p) = partitioning {
        let (np, no) = (graph.parameters().len(), graph.outputs().len());
        if p.params.len() != np || p.outputs.len() != no || p.num_partitions == 0 {
            return Err(crate::error::Error::InvalidGraph {
                message: format!(
                    "a partitioning of {} partitions with {} parameter and {} output shardings \
                     for a graph of {np} parameters and {no} outputs",
                    p.num_partitions,
                    p.params.len(),
                    p.outputs.len()
                ),
            });
        }
    }
    let sharding_of = |list: Option<&Vec<Option<String>>>, i: usize| -> Option<String> {
        let s = list?.get(i)?.as_ref()?;
        Some(format!("mhlo.sharding = \"{s}\""))
    };
    let param_types = graph.parameter_types();
    let output_types = graph.output_types();
    for (k, &(p, o)) in aliases.iter().enumerate() {
        let ok = p < param_types.len()
            && o < output_types.len()
            && param_types[p] == output_types[o]
            && !aliases[..k].iter().any(|&(q, r)| q == p || r == o);
        if !ok {
            return Err(crate::error::Error::InvalidGraph {
                message: format!(
                    "alias of parameter {p} to output {o} is out of range, repeated or between \
                     different types"
                ),
            });
        }
    }
    let mut e = Emitter::new(
        String::new(),
        graph.len(),
        partitioning.is_some_and(|p| p.num_partitions > 1),
    );
    e.own_handlers = options.own_handlers && partitioning.is_none();
    let params = graph.parameter_types();
    let outputs = graph.output_types();
    match partitioning {
        None => e.out.push_str("module @main {\n"),
        Some(p) => {
            let _ = writeln!(
                e.out,
                "module @main attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = 1 \
                 : i32}} {{",
                p.num_partitions
            );
        }
    }
    e.out.push_str("  func.func public @main(");
    for (i, ty) in params.iter().enumerate() {
        if i > 0 {
            e.out.push_str(", ");
        }
        let _ = write!(e.out, "%arg{i}: {}", text::tensor(ty));
        let mut attrs = Vec::new();
        if let Some(&(_, o)) = aliases.iter().find(|&&(p, _)| p == i) {
            attrs.push(format!("tf.aliasing_output = {o} : i32"));
        }
        attrs.extend(sharding_of(partitioning.map(|p| &p.params), i));
        if !attrs.is_empty() {
            let _ = write!(e.out, " {{{}}}", attrs.join(", "));
        }
    }
    e.out.push(')');
    if !outputs.is_empty() {
        let tys: Vec<String> = outputs
            .iter()
            .enumerate()
            .map(
                |(i, ty)| match sharding_of(partitioning.map(|p| &p.outputs), i) {
                    Some(attr) => format!("{} {{{attr}}}", text::tensor(ty)),
                    None => text::tensor(ty),
                },
            )
            .collect();
        let _ = write!(e.out, " -> ({})", tys.join(", "));
    }
    e.out.push_str(" {\n");
    let args: Vec<String> = (0..params.len()).map(|i| format!("%arg{i}")).collect();
    e.emit_nodes(graph, &args)?;
    if outputs.is_empty() {
        e.out.push_str("    return\n");
    } else {
        let names: Vec<&str> = graph
            .outputs()
            .iter()
            .map(|o| e.names[o.0].as_str())
            .collect();
        let tys: Vec<String> = outputs.iter().map(text::tensor).collect();
        let _ = writeln!(
            e.out,
            "    return {} : {}",
            names.join(", "),
            tys.join(", ")
        );
    }
    e.out.push_str("  }\n}\n");
    Ok(e.out)
}

/// The text being built and the SSA name of every node emitted so far.
pub(crate) struct Emitter {
    pub(crate) out: String,
    pub(crate) names: Vec<String>,
    /// Put before every value name: empty in `main`, `s5_` in the body of the loop of node 5
    /// (`s5_s2_` in a loop inside that), so a loop body's names never shadow the outer ones.
    pub(crate) prefix: String,
    /// The loops emitted so far and the names of the results read from each.
    pub(crate) scans: Vec<scan::Emitted>,
    /// The buckets of process all-reduces emitted so far: tag and base name.
    pub(crate) buckets: Vec<(u32, String)>,
    /// A partitioned program: reductions take the bare combiner, since XLA's SPMD partitioner
    /// turns a reduction over a split dimension into an all-reduce with the same combiner,
    /// and the CPU backend's collectives accept nothing else (so there a float max/min
    /// reduction may drop a NaN, as the plugin's fast min/max does).
    pub(crate) partitioned: bool,
    /// [`LowerOptions::own_handlers`].
    pub(crate) own_handlers: bool,
}

impl Emitter {
    pub(crate) fn new(prefix: String, nodes: usize, partitioned: bool) -> Emitter {
        Emitter {
            out: String::with_capacity(256 + nodes * 120),
            names: Vec::with_capacity(nodes),
            prefix,
            scans: Vec::new(),
            buckets: Vec::new(),
            partitioned,
            own_handlers: false,
        }
    }

    /// Emits every node of `graph`, its parameters named `params`.
    pub(crate) fn emit_nodes(&mut self, graph: &Graph, params: &[String]) -> Result<()> {
        for (i, node) in graph.nodes().iter().enumerate() {
            let name = if let Op::Parameter { index } = &node.op {
                params[*index].clone()
            } else {
                ops::emit(self, graph, i, node)?
            };
            self.names.push(name);
        }
        Ok(())
    }

    /// Appends one indented line of the function body.
    pub(crate) fn line(&mut self, s: &str) {
        self.out.push_str("    ");
        self.out.push_str(s);
        self.out.push('\n');
    }
}
