//! The per-level pipeline on the realistic step graph: identical results at every level,
//! fewer ops at higher levels, deterministic output, signature kept.

use crate::passes_util;

use neuron_pc_compiler::flags::{CompilerFlags, OptLevel};
use neuron_pc_compiler::ir::Op;
use neuron_pc_compiler::passes::{run_pipeline, run_pipeline_report};
use passes_util::step::{build_step, StepConfig};
use passes_util::{assert_same, count, eval, step_inputs};

fn at(level: OptLevel) -> CompilerFlags {
    CompilerFlags {
        opt_level: level,
        ..CompilerFlags::default()
    }
}

#[test]
fn every_level_preserves_results_and_shrinks_the_graph() {
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let inputs = step_inputs(c, 42, &g);
    let want = eval(&g, &inputs);
    let mut counts = Vec::new();
    for &level in OptLevel::ALL {
        let (out, runs) = run_pipeline_report(&g, &at(level)).unwrap();
        assert_eq!(out.parameter_types(), g.parameter_types(), "{level}");
        assert_eq!(out.output_types(), g.output_types(), "{level}");
        assert_same(&want, &eval(&out, &inputs), &format!("{level}"));
        assert!(!runs.is_empty());
        assert_eq!(
            run_pipeline(&g, &at(level)).unwrap(),
            out,
            "{level}: deterministic"
        );
        assert_eq!(
            run_pipeline(&out, &at(level)).unwrap(),
            out,
            "{level}: a fixed point"
        );
        counts.push(out.op_count());
    }
    let (o1, o2, o3) = (counts[0], counts[1], counts[2]);
    assert!(
        o1 < g.op_count(),
        "O1 drops dead and duplicate nodes: {} -> {o1}",
        g.op_count()
    );
    assert!(o2 < o1, "O2 also simplifies and folds: {o1} -> {o2}");
    assert!(o3 <= o2, "{o2} -> {o3}");
}

#[test]
fn o2_removes_the_traced_redundancy() {
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let out = run_pipeline(&g, &at(OptLevel::O2)).unwrap();
    // Every `scalar * x` traced as broadcast(scalar constant) became a splat constant.
    let bcast_of_const = |g: &neuron_pc_compiler::ir::Graph| {
        g.nodes()
            .iter()
            .filter(|n| {
                matches!(n.op, Op::BroadcastInDim { .. })
                    && matches!(g.node(n.operands[0]).unwrap().op, Op::Constant(_))
            })
            .count()
    };
    assert!(bcast_of_const(&g) > 20);
    assert_eq!(bcast_of_const(&out), 0, "{out}");
    // w.t().t().t() is one transpose; the recomputed exp and GELU terms are shared.
    let transposes =
        |g: &neuron_pc_compiler::ir::Graph| count(g, |o| matches!(o, Op::Transpose { .. }));
    assert_eq!(transposes(&g), 4 * 4);
    assert_eq!(transposes(&out), 4 * 2);
    assert_eq!(
        count(&out, |o| matches!(
            o,
            Op::Unary(neuron_pc_compiler::ir::UnaryOp::Exp)
        )),
        1
    );
    // No constant in the result repeats.
    let consts: Vec<&Op> = out
        .nodes()
        .iter()
        .map(|n| &n.op)
        .filter(|o| matches!(o, Op::Constant(_)))
        .collect();
    for (i, a) in consts.iter().enumerate() {
        assert!(!consts[..i].contains(a), "duplicate constant {a}");
    }
}

#[test]
fn the_example_size_step_runs_through_the_pipeline_quickly() {
    let g = build_step(StepConfig::EXAMPLE).unwrap();
    for &level in OptLevel::ALL {
        let t = std::time::Instant::now();
        let out = run_pipeline(&g, &at(level)).unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(out.op_count() < g.op_count());
        // Generous for debug builds on a loaded machine; release takes well under 1 ms.
        assert!(ms < 2000.0, "{level}: {ms:.1} ms");
    }
}
