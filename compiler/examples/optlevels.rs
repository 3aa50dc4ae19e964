//! Compile time and step time of the example training step at each opt level, on the cpu
//! target, in one process: `cargo run --release -p neuron-pc-compiler --example optlevels
//! [-- --reps N --steps M --tiny --explore]` (`--explore` measures candidate backend options
//! instead of the levels).
//!
//! The graph is the example text encoder's whole training step (forward, softmax
//! cross-entropy, backward, AdamW) as a tracer emits it (`tests/ir/passes_util/step.rs`).
//! Each repetition runs every configuration once, in turn, so machine load hits all alike;
//! the table shows medians. "compile" = graph passes + lowering + XLA compile; "step" = one
//! execution with inputs already on the device, outputs read back.

#[path = "../tests/ir/passes_util/mod.rs"]
mod passes_util;

use std::time::Instant;

use neuron_pc_compiler::flags::{CompilerFlags, OptLevel};
use neuron_pc_compiler::ir::Graph;
use neuron_pc_compiler::lower::to_stablehlo;
use neuron_pc_compiler::passes::{compile_options, run_pipeline};
use neuron_pc_compiler::pjrt::{
    find_plugin, Buffer, Client, ClientOptions, CompileOptions, OverrideValue, Plugin, Target,
};
use passes_util::step::{build_step, StepConfig};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// One row: a name, whether graph passes run, and the compile options.
struct Config {
    name: &'static str,
    level: Option<OptLevel>,
    options: CompileOptions,
}

fn configs(explore: bool) -> Vec<Config> {
    let at = |l: OptLevel| CompilerFlags {
        opt_level: l,
        ..CompilerFlags::default()
    };
    let o2_with = |name: &'static str, opts: &[(&str, OverrideValue)]| Config {
        name,
        level: Some(OptLevel::O2),
        options: opts.iter().fold(CompileOptions::default(), |o, (k, v)| {
            o.with_override(k, v.clone())
        }),
    };
    if explore {
        // Candidates for the table, each on top of O2's graph passes.
        use OverrideValue::{Bool, Int};
        return vec![
            o2_with("O2 passes, XLA defaults", &[]),
            o2_with(
                "backend level 1",
                &[("xla_backend_optimization_level", Int(1))],
            ),
            o2_with(
                "llvm expensive passes off",
                &[("xla_llvm_disable_expensive_passes", Bool(true))],
            ),
            o2_with(
                "level 1 + expensive off",
                &[
                    ("xla_backend_optimization_level", Int(1)),
                    ("xla_llvm_disable_expensive_passes", Bool(true)),
                ],
            ),
            o2_with(
                "codegen split 1",
                &[("xla_cpu_parallel_codegen_split_count", Int(1))],
            ),
            o2_with("fast math", &[("xla_cpu_enable_fast_math", Bool(true))]),
            o2_with("xnnpack", &[("xla_cpu_use_xnnpack", Bool(true))]),
            o2_with(
                "backend level 0",
                &[("xla_backend_optimization_level", Int(0))],
            ),
        ];
    }
    vec![
        Config {
            name: "no graph passes, XLA defaults",
            level: None,
            options: CompileOptions::default(),
        },
        Config {
            name: "O1",
            level: Some(OptLevel::O1),
            options: compile_options(&at(OptLevel::O1)),
        },
        Config {
            name: "O2 (default)",
            level: Some(OptLevel::O2),
            options: compile_options(&at(OptLevel::O2)),
        },
        Config {
            name: "O3",
            level: Some(OptLevel::O3),
            options: compile_options(&at(OptLevel::O3)),
        },
        o2_with(
            "rejected for O1: O2 + level 1, expensive LLVM passes off",
            &[
                ("xla_backend_optimization_level", OverrideValue::Int(1)),
                (
                    "xla_llvm_disable_expensive_passes",
                    OverrideValue::Bool(true),
                ),
            ],
        ),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| -> AnyResult<usize> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(args
                .get(i + 1)
                .ok_or(format!("{name} needs a value"))?
                .parse()?),
            None => Ok(default),
        }
    };
    let reps = flag("--reps", 5)?;
    let steps = flag("--steps", 30)?;
    let cfg = if args.iter().any(|a| a == "--tiny") {
        StepConfig::TINY
    } else {
        StepConfig::EXAMPLE
    };

    let graph = build_step(cfg)?;
    let inputs = passes_util::step_inputs(cfg, 1, &graph);
    let plugin = Plugin::load(&find_plugin(Target::Cpu)?)?;
    let client = Client::new(&plugin, &ClientOptions::cpu_devices(1))?;
    let device = client.devices()[0];
    let buffers: Vec<Buffer> = inputs
        .iter()
        .map(|h| client.buffer_from_host(h, device))
        .collect::<Result<_, _>>()?;
    let device_args: Vec<&Buffer> = buffers.iter().collect();

    let configs = configs(args.iter().any(|a| a == "--explore"));
    struct Row {
        ops: usize,
        text_kb: f64,
        passes_ms: Vec<f64>,
        compile_ms: Vec<f64>,
        step_ms: Vec<f64>,
        loss: f32,
    }
    let mut rows: Vec<Row> = Vec::new();
    for c in &configs {
        let g: Graph = match c.level {
            Some(l) => run_pipeline(
                &graph,
                &CompilerFlags {
                    opt_level: l,
                    ..CompilerFlags::default()
                },
            )?,
            None => graph.clone(),
        };
        let text = to_stablehlo(&g)?;
        rows.push(Row {
            ops: g.op_count(),
            text_kb: text.len() as f64 / 1024.0,
            passes_ms: vec![],
            compile_ms: vec![],
            step_ms: vec![],
            loss: f32::NAN,
        });
    }
    for rep in 0..reps {
        for (c, row) in configs.iter().zip(rows.iter_mut()) {
            let t = Instant::now();
            let g = match c.level {
                Some(l) => run_pipeline(
                    &graph,
                    &CompilerFlags {
                        opt_level: l,
                        ..CompilerFlags::default()
                    },
                )?,
                None => graph.clone(),
            };
            let text = to_stablehlo(&g)?;
            let passes = t.elapsed().as_secs_f64() * 1e3;
            let exe = client.compile(&text, &c.options)?;
            row.passes_ms.push(passes);
            row.compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
            for _ in 0..3 {
                exe.execute(&device_args)?;
            }
            let mut times = Vec::with_capacity(steps);
            for _ in 0..steps {
                let t = Instant::now();
                let out = exe.execute(&device_args)?;
                let loss = out[0].to_host()?.to_vec::<f32>()?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                row.loss = loss[0];
            }
            row.step_ms.push(median(times));
        }
        eprintln!("repetition {}/{reps} done", rep + 1);
    }
    println!(
        "step graph: {} ops before passes; batch {}, vocab {}, embed {}, seq {}, mlp {:?}, \
         classes {}",
        graph.op_count(),
        cfg.batch,
        cfg.vocab,
        cfg.embed,
        cfg.seq,
        cfg.hidden,
        cfg.classes
    );
    println!("{reps} repetitions, step = median of {steps} runs each; medians over repetitions\n");
    println!(
        "| level | ops | program KiB | passes+lowering ms | compile ms (total) | step ms | loss |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (c, r) in configs.iter().zip(rows) {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} | {:.2} | {:.5} |",
            c.name,
            r.ops,
            r.text_kb,
            median(r.passes_ms),
            median(r.compile_ms),
            median(r.step_ms),
            r.loss
        );
    }
    Ok(())
}
