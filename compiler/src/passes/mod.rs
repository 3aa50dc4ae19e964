//! Graph passes and the pipeline that runs them per optimization level.
//!
//! Every pass maps a [`Graph`] to a new graph that computes the same outputs, in the same
//! order and with the same types, from the same parameters (unused ones included, since the
//! caller passes inputs by position). Which passes run at which level is decided in one table,
//! [`crate::optlevel::plan`]; auto-cast is not a level decision but the user's
//! `--auto-cast` flag.
//!
//! | pass | what it does |
//! | --- | --- |
//! | [`simplify`] | identities, transpose/reshape chains, splat broadcasts, no-op converts |
//! | [`constant_fold`] | ops on constants become constants (size-limited) |
//! | [`cse`] | one node per distinct (op, operands) |
//! | [`dce`] | drops nodes no output needs |
//! | [`auto_cast`] | matmuls (and with `all`, safe elementwise ops) in bf16/f16 |
//! | [`half_products_in_f32`] | cpu only, last: bf16/f16 products computed in f32, rounded once |

mod autocast;
mod cross_process;
mod cse;
mod dce;
mod fold;
mod half_dots;
mod rewrite;
mod simplify;

use std::time::Instant;

pub use autocast::{auto_cast, cast_dtype};
pub use cross_process::{cross_process, ProcessLayout};
pub use cse::cse;
pub use dce::dce;
pub use fold::constant_fold;
pub use half_dots::half_products_in_f32;
pub use simplify::simplify;

use crate::error::Result;
use crate::flags::{is_neuron, AutoCast, CompilerFlags};
use crate::ir::{Graph, Op};
use crate::optlevel::{plan, GraphPass, LevelPlan};
use crate::pjrt::{CompileOptions, Target};

/// One pass application, for reports and benchmarks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassRun {
    /// The pass's name ([`GraphPass::name`], or `auto-cast`).
    pub pass: &'static str,
    /// Non-parameter nodes before the pass ([`Graph::op_count`]).
    pub ops_before: usize,
    /// Non-parameter nodes after the pass.
    pub ops_after: usize,
    /// Wall time of the pass, in microseconds.
    pub micros: u128,
}

/// Runs the passes `flags` asks for: the level's passes (repeated while they still change the
/// graph, up to the level's round limit), then auto-cast with a clean-up (simplify, CSE, DCE)
/// when `--auto-cast` is not `none` and the target is not a Neuron one (Neuron's compiler
/// applies `--auto-cast` itself; casting here too would cast twice under different rules);
/// on `cpu`, last, half-precision products computed in float32 ([`half_products_in_f32`]).
pub fn run_pipeline(graph: &Graph, flags: &CompilerFlags) -> Result<Graph> {
    Ok(run_pipeline_report(graph, flags)?.0)
}

/// [`run_pipeline`], also returning every pass run with node counts and time.
pub fn run_pipeline_report(graph: &Graph, flags: &CompilerFlags) -> Result<(Graph, Vec<PassRun>)> {
    let level = plan(flags.opt_level);
    let mut runs = Vec::new();
    // the passes and the lowering see the ops a call stands for
    let mut g = crate::ir::expand_calls(graph)?.into_owned();
    for _ in 0..level.max_rounds {
        let before = g.clone();
        for &pass in level.passes {
            g = timed(&mut runs, pass.name(), &g, |g| run_pass(g, pass, &level))?;
        }
        if g == before {
            break;
        }
    }
    if flags.auto_cast != AutoCast::None && !is_neuron(flags.target) {
        let (mode, to) = (flags.auto_cast, flags.auto_cast_type);
        if g.nodes().iter().any(|n| matches!(n.op, Op::Scan { .. })) {
            warn_loops_not_cast();
        }
        g = timed(&mut runs, "auto-cast", &g, |g| auto_cast(g, mode, to))?;
        g = timed(&mut runs, "simplify", &g, simplify)?;
        g = timed(&mut runs, "cse", &g, cse)?;
        g = timed(&mut runs, "dce", &g, dce)?;
    }
    if flags.target == Target::Cpu {
        // last: no pass of ours may fold the round trip through f32 away
        g = timed(&mut runs, "half products in f32", &g, half_products_in_f32)?;
    }
    Ok((g, runs))
}

/// Said once per process: the passes see a loop as one op, so `--auto-cast` leaves the
/// products inside a loop body (scanned layers) in float32 while it casts those outside.
fn warn_loops_not_cast() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "--auto-cast does not reach inside loops (nn::scan, scanned layers): their products \
             stay float32; LazyDevice::autocast casts them (it acts as the step is traced)"
        );
    });
}

/// Applies one pass with the parameters of `level`.
pub fn run_pass(graph: &Graph, pass: GraphPass, level: &LevelPlan) -> Result<Graph> {
    match pass {
        GraphPass::Simplify => simplify(graph),
        GraphPass::ConstantFold => constant_fold(graph, level.fold_limit),
        GraphPass::Cse => cse(graph),
        GraphPass::Dce => dce(graph),
    }
}

/// The compile options for `flags`: XLA's defaults plus the level's backend options
/// ([`crate::optlevel::backend_options`]).
pub fn compile_options(flags: &CompilerFlags) -> CompileOptions {
    crate::optlevel::compile_options(flags, CompileOptions::default())
}

fn timed(
    runs: &mut Vec<PassRun>,
    pass: &'static str,
    g: &Graph,
    f: impl FnOnce(&Graph) -> Result<Graph>,
) -> Result<Graph> {
    let t = Instant::now();
    let out = f(g)?;
    runs.push(PassRun {
        pass,
        ops_before: g.op_count(),
        ops_after: out.op_count(),
        micros: t.elapsed().as_micros(),
    });
    Ok(out)
}
