//! What each optimization level does: the one table that maps `--optlevel` to graph passes and
//! to XLA backend options. Everything else (the pass pipeline, the compile options) reads it.
//!
//! Measured on the XLA CPU plugin (xla-cpu-pjrt 0.0.1, 2 shared cores; `examples/optlevels.rs`
//! on the example model's 540-op training step, figures in `docs/guide/compiler-flags.md`):
//! - `xla_backend_optimization_level=0` is the one backend option that clearly moves compile
//!   time: 35-50% less, for a step 3x slower (LLVM leaves kernels unvectorized). That is O1: a
//!   real choice for quick iteration, short runs and graphs that run a few times, and the wrong
//!   one for long training runs, which is why O2 stays the default.
//! - Levels 1-3, `xla_llvm_disable_expensive_passes`, `xla_cpu_enable_fast_math`,
//!   `xla_cpu_use_xnnpack`, vector width, codegen split count and multi-threaded Eigen all stayed
//!   within run-to-run noise (±20% on this shared machine) for both compile and step time; fast
//!   math also changes results, which no level may do silently. So O2 and O3 use XLA's defaults
//!   and differ in graph passes only, and the graph passes change XLA's times little (XLA runs
//!   its own CSE, DCE and simplifier): their value is smaller programs and stable keys.
//! - Re-measured on the small Llama's step (`bench_llama`, `XLA_FLAGS` A/B in alternating
//!   processes, 2026-11-25, `lammps-jax-pjrt-cpu`): `xla_cpu_prefer_vector_width=512` stepped
//!   1-1.5% faster by the medians of 4 rounds (one round the other way), too little to justify
//!   changing every kernel's vectorization. Adding YNNPACK fusion types changed nothing
//!   measurable (`dot` with that plugin; `eltwise` and `reduce` with `fastatomstruct-xla-cpu`),
//!   and with `fastatomstruct-xla-cpu` the oneDNN options left the optimized program as it was.
//! - The plugin refuses option names it does not know (`xla_cpu_use_thunk_runtime`,
//!   `xla_cpu_disable_loop_unrolling`, `xla_cpu_optimize_for_size`, ...), so the table holds
//!   only names this plugin accepted; `tests/ir/passes_optlevel_backend.rs` checks each level
//!   compiles.

use crate::flags::{CompilerFlags, OptLevel, Target};
use crate::pjrt::{CompileOptions, OverrideValue};

/// A graph pass, by name; `crate::passes` holds the implementations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphPass {
    /// Algebraic identities (x*1, x+0, double transpose, reshape chains, ...).
    Simplify,
    /// Evaluate ops whose operands are all constants (up to [`LevelPlan::fold_limit`]).
    ConstantFold,
    /// Merge nodes that compute the same thing from the same operands.
    Cse,
    /// Drop nodes no output depends on.
    Dce,
}

impl GraphPass {
    /// The pass's name in logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            GraphPass::Simplify => "simplify",
            GraphPass::ConstantFold => "constant-fold",
            GraphPass::Cse => "cse",
            GraphPass::Dce => "dce",
        }
    }
}

/// A backend option value that can live in a `const` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendValue {
    /// A boolean option (`xla_cpu_enable_fast_math=false`).
    Bool(bool),
    /// An integer option (`xla_backend_optimization_level=0`).
    Int(i64),
}

impl From<BackendValue> for OverrideValue {
    fn from(v: BackendValue) -> OverrideValue {
        match v {
            BackendValue::Bool(b) => OverrideValue::Bool(b),
            BackendValue::Int(i) => OverrideValue::Int(i),
        }
    }
}

/// What one optimization level runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelPlan {
    /// Graph passes of one round, in order.
    pub passes: &'static [GraphPass],
    /// Rounds of `passes` at most; the pipeline stops early once a round changes nothing
    /// (one pass's result often enables another's: folding exposes identities, simplifying
    /// exposes duplicates).
    pub max_rounds: usize,
    /// Largest constant (in elements) constant folding may create; bigger results stay ops so
    /// that a fold never bloats the program text or the executable.
    pub fold_limit: usize,
    /// `DebugOptions` overrides for the XLA backends (cpu and cuda). Neuron targets get the
    /// level as `--optlevel` instead (see [`CompilerFlags::to_neuron_args`]).
    pub xla: &'static [(&'static str, BackendValue)],
}

use GraphPass::{ConstantFold, Cse, Dce, Simplify};

/// The table. Keep every per-level decision here.
pub const fn plan(level: OptLevel) -> LevelPlan {
    match level {
        // Fast compile: only the two linear-time passes that shrink what XLA must compile, and
        // LLVM at level 0 (35-50% less compile time, 3x slower steps on cpu).
        OptLevel::O1 => LevelPlan {
            passes: &[Cse, Dce],
            max_rounds: 1,
            fold_limit: 0,
            xla: &[("xla_backend_optimization_level", BackendValue::Int(0))],
        },
        // Default: every graph pass, two rounds, XLA's own defaults.
        OptLevel::O2 => LevelPlan {
            passes: &[Simplify, ConstantFold, Cse, Dce],
            max_rounds: 2,
            fold_limit: 1 << 16,
            xla: &[],
        },
        // Everything: graph passes to a fixed point (bounded), bigger folds.
        OptLevel::O3 => LevelPlan {
            passes: &[Simplify, ConstantFold, Cse, Dce],
            max_rounds: 8,
            fold_limit: 1 << 20,
            xla: &[],
        },
    }
}

/// The XLA backend option overrides for `flags`, by `DebugOptions` field name. Empty on Neuron
/// targets, whose compiler is not XLA's backend and takes `--optlevel` instead.
///
/// On cpu, XLA may not drop a half-precision rounding the program asks for
/// (`xla_allow_excess_precision` off): the float32 products of
/// [`crate::passes::half_products_in_f32`] must be rounded where a bf16 kernel's are. And
/// copy insertion runs by region analysis (`xla_cpu_copy_insertion_use_region_analysis`, off
/// by XLA's default on cpu): without it XLA copies a `while` loop's carried values once per
/// iteration (a scanned Llama's hidden state and its cotangent, each layer forward and back),
/// and the scanned 32-layer step's program ran 2-4% slower at batch 4 (the same at batch 8;
/// `hlo_steptime`, 2026-11-30). Programs without loops are unchanged, and the
/// scanned-against-unrolled tests pass as before on the three pinned plugins.
///
/// On cuda, XLA's sharded autotuning is off: with it, the processes of a multi-process run
/// must compile each program together (each autotunes a share of the fusions and waits for
/// the others' through the key-value store), while here one rank compiles under the cache's
/// lease and the others load its executable, so rank 0 waited forever (seen on an H200 with
/// two ranks under mocked NCCL). A rank that hits the cache while another misses would hang
/// the same way.
pub fn backend_options(flags: &CompilerFlags) -> Vec<(String, OverrideValue)> {
    let level = plan(flags.opt_level)
        .xla
        .iter()
        .map(|&(name, value)| (name.to_string(), value.into()));
    match flags.target {
        // every bf16 rounding the program asks for is kept (`passes::half_products_in_f32`)
        Target::Cpu => level
            .chain([
                (
                    "xla_allow_excess_precision".to_string(),
                    OverrideValue::Bool(false),
                ),
                (
                    "xla_cpu_copy_insertion_use_region_analysis".to_string(),
                    OverrideValue::Bool(true),
                ),
            ])
            .collect(),
        Target::Cuda => level
            .chain([(
                "xla_gpu_shard_autotuning".to_string(),
                OverrideValue::Bool(false),
            )])
            .collect(),
        Target::Trn1 | Target::Trn2 => Vec::new(),
    }
}

/// Compile options for `flags`: `base` with [`backend_options`] added (overriding any option of
/// the same name already in `base`, since the level is the user's explicit choice).
pub fn compile_options(flags: &CompilerFlags, base: CompileOptions) -> CompileOptions {
    backend_options(flags)
        .into_iter()
        .fold(base, |opts, (name, value)| opts.with_override(&name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_by_effort() {
        let [o1, o2, o3] = [OptLevel::O1, OptLevel::O2, OptLevel::O3].map(plan);
        assert!(o1.passes.len() < o2.passes.len());
        assert!(o1.max_rounds <= o2.max_rounds && o2.max_rounds < o3.max_rounds);
        assert!(o1.fold_limit < o2.fold_limit && o2.fold_limit < o3.fold_limit);
        // DCE ends every level: whatever the other passes orphan is gone before lowering.
        for p in [o1, o2, o3] {
            assert_eq!(p.passes.last(), Some(&GraphPass::Dce));
        }
    }

    #[test]
    fn backend_options_per_target() {
        let o1_cpu = CompilerFlags::parse("--optlevel 1").unwrap();
        let names: Vec<String> = backend_options(&o1_cpu)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "xla_backend_optimization_level",
                "xla_allow_excess_precision",
                "xla_cpu_copy_insertion_use_region_analysis"
            ]
        );
        assert_eq!(
            backend_options(&CompilerFlags::default()),
            [
                (
                    "xla_allow_excess_precision".to_string(),
                    OverrideValue::Bool(false)
                ),
                (
                    "xla_cpu_copy_insertion_use_region_analysis".to_string(),
                    OverrideValue::Bool(true)
                )
            ]
        );
        let o1_trn = CompilerFlags::parse("--optlevel 1 --target trn1").unwrap();
        assert!(backend_options(&o1_trn).is_empty());
        let cuda = CompilerFlags::parse("--target cuda").unwrap();
        assert_eq!(
            backend_options(&cuda),
            [(
                "xla_gpu_shard_autotuning".to_string(),
                OverrideValue::Bool(false)
            )]
        );
        let opts = compile_options(&o1_cpu, CompileOptions::default());
        assert_eq!(
            opts.xla_overrides.get("xla_backend_optimization_level"),
            Some(&OverrideValue::Int(0))
        );
        assert_ne!(opts.to_proto(), CompileOptions::default().to_proto());
    }
}
