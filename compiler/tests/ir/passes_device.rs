//! Optimized graphs through lowering and the real CPU plugin: at every level (and with
//! auto-cast) the step graph compiles with the level's backend options and its outputs match
//! the reference evaluator on the unoptimized graph. Also the shapes passes create that a
//! hand-built graph rarely has: outputs that are parameters or splat constants.
//!
//! Tolerance: float32 results within 1e-4 relative (XLA may fuse and reorder float
//! arithmetic, and its exp/log/tanh differ from the f64-based reference in the last bits);
//! with bf16 auto-cast, 0.05 on the loss.

use crate::passes_util;

use std::sync::OnceLock;

use neuron_pc_compiler::flags::{CompilerFlags, OptLevel};
use neuron_pc_compiler::ir::{BinaryOp, Graph, Literal, Op, TensorType};
use neuron_pc_compiler::lower::to_stablehlo;
use neuron_pc_compiler::passes::{compile_options, run_pipeline};
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, Target};
use neuron_pc_compiler::{DType, HostTensor};
use passes_util::step::{build_step, StepConfig};
use passes_util::{assert_close, eval, random_inputs, step_inputs};

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let plugin =
            Plugin::load(&find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup"))
                .unwrap();
        Client::new(&plugin, &ClientOptions::cpu_devices(1)).unwrap()
    })
}

fn run(g: &Graph, flags: &CompilerFlags, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let optimized = run_pipeline(g, flags).unwrap();
    let text = to_stablehlo(&optimized).unwrap();
    let exe = client()
        .compile(&text, &compile_options(flags))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    exe.execute_host(inputs).unwrap()
}

#[test]
fn step_graph_at_every_level_matches_the_reference() {
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let inputs = step_inputs(c, 9, &g);
    let want = eval(&g, &inputs);
    for &level in OptLevel::ALL {
        let flags = CompilerFlags {
            opt_level: level,
            ..CompilerFlags::default()
        };
        assert_close(&want, &run(&g, &flags, &inputs), 1e-4, &format!("{level}"));
    }
    let cast = CompilerFlags::parse("--auto-cast matmult").unwrap();
    let got = run(&g, &cast, &inputs);
    assert_close(&want[..1], &got[..1], 0.05, "matmult loss");
}

#[test]
fn outputs_that_passes_turn_into_parameters_and_splats() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![2, 3]));
    let one = g
        .push(Op::Constant(Literal::splat(DType::F32, 1.0, &[2, 3])), &[])
        .unwrap();
    let same = g.push(Op::Binary(BinaryOp::Mul), &[x, one]).unwrap(); // becomes x itself
    let two = g.push(Op::Binary(BinaryOp::Add), &[one, one]).unwrap(); // becomes a splat 2
    let sum = g.push(Op::Binary(BinaryOp::Add), &[same, two]).unwrap();
    g.set_outputs(&[same, two, sum, same]).unwrap();
    let inputs = random_inputs(&g, 4);
    let want = eval(&g, &inputs);
    for &level in OptLevel::ALL {
        let flags = CompilerFlags {
            opt_level: level,
            ..CompilerFlags::default()
        };
        assert_close(&want, &run(&g, &flags, &inputs), 0.0, &format!("{level}"));
    }
}
