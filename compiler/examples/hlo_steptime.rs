//! Execution time of StableHLO programs through the PJRT layer, interleaved so machine load hits
//! all alike: `cargo run --release -p neuron-pc-compiler --example hlo_steptime -- A.mlir
//! [B.mlir ...] [--reps N] [--xla name=value ...] [--no-donate] [--plugin LIB ...]
//! [--compile-only]`. Inputs are zeros of each parameter's type (integer inputs index row 0).
//! `--plugin LIB` (repeatable) runs every program through each plugin library named, all
//! loaded in this one process (one client of one device each) and interleaved with the rest;
//! without it, through the plugin neuron-pc finds (`NEURON_PC_CPU_PLUGIN`, else the
//! environment's). `--compile-only`: only says whether each plugin compiles each file, and in
//! how long (the file need not be a valid program).
//!
//! Run as a training loop runs a step: the parameters the program aliases to an output
//! (`tf.aliasing_output`, as neuron-pc's lowering and JAX's donated arguments write it) are
//! donated and replaced by that output for the next execution, so parameters and optimizer
//! state are updated in place, not copied (`--no-donate`: every input kept and copied). Prints
//! per file and plugin the median and 10th percentile of synced executions (each waited for,
//! the smallest output read back) and the median per execution of pipelined rounds (launched
//! back to back, one wait at the end). Used to compare a program exported by JAX with the one
//! neuron-pc traces for the same step, and to measure the runtime's floor under the lazy
//! device's step (scripts/bench floor: each program through every pinned cpu plugin).

use std::time::Instant;

use neuron_pc_compiler::pjrt::pins::pin_for_library;
use neuron_pc_compiler::pjrt::step_loop::aliased_outputs;
use neuron_pc_compiler::pjrt::{
    find_plugin, Client, ClientOptions, CompileOptions, OverrideValue, Plugin, Signature, StepLoop,
    Target,
};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Executions per pipelined round.
const ROUND: usize = 10;

/// How a plugin library is named in the table: its pinned package, else its file name.
fn plugin_label(path: &std::path::Path) -> String {
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    match pin_for_library(&canonical) {
        Some(pin) => format!("{} {}", pin.package, pin.version),
        None => path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into(),
        ),
    }
}

/// A program through one plugin, and its timings.
struct Prog {
    name: String,
    plugin: String,
    run: StepLoop,
    synced: Vec<f64>,
    pipelined: Vec<f64>,
}

/// `--compile-only`: whether the plugin compiles the file, or the first line of its error.
/// A plugin that crashes on a program it rejects ends the process here (scripts/reject-probe
/// runs each program in a process of its own to count those).
fn compile_outcome(client: &Client, f: &str) -> String {
    let text = match std::fs::read_to_string(f) {
        Ok(t) => t,
        Err(e) => return format!("unreadable: {e}"),
    };
    let t = Instant::now();
    match client.compile(&text, &CompileOptions::default()) {
        Ok(_) => format!("compiled in {:.0} ms", t.elapsed().as_secs_f64() * 1e3),
        Err(e) => {
            let first = e.to_string();
            format!("error: {}", first.lines().next().unwrap_or_default())
        }
    }
}

/// Compiles `f` on `client`, with zero inputs on the client's first device.
fn prepare(
    client: &Client,
    f: &str,
    label: &str,
    opts: &CompileOptions,
    donate: bool,
    plugin: &str,
) -> AnyResult<Prog> {
    let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
    let params = Signature::parse(&text).map_or(0, |s| s.params.len());
    let donate = donate && {
        let readable = aliased_outputs(&text, params).is_some();
        if !readable {
            eprintln!("{f}: cannot read the parameters' aliasing; nothing donated");
        }
        readable
    };
    let run = StepLoop::new(client, &text, opts, donate).map_err(|e| format!("{f}: {e}"))?;
    let (donated, inputs) = run.donated();
    Ok(Prog {
        name: format!("{f} ({label}, {donated} of {inputs} inputs donated)"),
        plugin: plugin.to_string(),
        run,
        synced: Vec::new(),
        pipelined: Vec::new(),
    })
}

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(200), |s| s.parse())?;
    let files: Vec<&String> = args.iter().filter(|a| a.ends_with(".mlir")).collect();
    // `--xla name=true|false|N`: also run every program compiled with these backend options.
    let mut variant = CompileOptions::default();
    let mut has_variant = false;
    for pair in args.windows(2).filter(|w| w[0] == "--xla") {
        let (name, value) = pair[1].split_once('=').ok_or("--xla takes name=value")?;
        let value = match value {
            "true" => OverrideValue::Bool(true),
            "false" => OverrideValue::Bool(false),
            n => OverrideValue::Int(n.parse()?),
        };
        variant = variant.with_override(name, value);
        has_variant = true;
    }
    let mut options = vec![("defaults", CompileOptions::default())];
    if has_variant {
        options.push(("--xla", variant));
    }
    let mut libraries: Vec<std::path::PathBuf> = args
        .windows(2)
        .filter(|w| w[0] == "--plugin")
        .map(|w| w[1].clone().into())
        .collect();
    if libraries.is_empty() {
        libraries.push(find_plugin(Target::Cpu)?);
    }
    let donate = !args.iter().any(|a| a == "--no-donate");
    let compile_only = args.iter().any(|a| a == "--compile-only");
    let mut progs = Vec::new();
    for library in &libraries {
        let plugin = Plugin::load(library)?;
        let client = Client::new(&plugin, &ClientOptions::cpu_devices(1))?;
        let label = plugin_label(library);
        if compile_only {
            for f in &files {
                println!("| {f} | {label} | {} |", compile_outcome(&client, f));
            }
            continue;
        }
        for f in &files {
            for (opts_label, opts) in &options {
                progs.push(prepare(&client, f, opts_label, opts, donate, &label)?);
            }
        }
    }
    if compile_only {
        return Ok(());
    }
    for rep in 0..reps + 10 {
        for p in progs.iter_mut() {
            let t = Instant::now();
            p.run.synced()?;
            if rep >= 10 {
                p.synced.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    for _ in 0..(reps / ROUND).max(3) {
        for p in progs.iter_mut() {
            let t = Instant::now();
            p.run.pipelined(ROUND)?;
            p.pipelined
                .push(t.elapsed().as_secs_f64() * 1e3 / ROUND as f64);
        }
    }
    println!("| program | plugin | synced median ms | synced p10 ms | pipelined median ms |");
    println!("| --- | --- | --- | --- | --- |");
    for p in &mut progs {
        p.synced.sort_by(f64::total_cmp);
        p.pipelined.sort_by(f64::total_cmp);
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            p.name,
            p.plugin,
            p.synced[p.synced.len() / 2],
            p.synced[p.synced.len() / 10],
            p.pipelined[p.pipelined.len() / 2]
        );
    }
    Ok(())
}
