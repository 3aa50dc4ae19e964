//! Execution time of StableHLO programs through the PJRT layer, interleaved so machine load hits
//! all alike: `cargo run --release -p neuron-pc-compiler --example hlo_steptime -- A.mlir
//! [B.mlir ...] [--reps N] [--xla name=value ...]`. Inputs are zeros of each parameter's type
//! (integer inputs index row 0), the smallest output is read back; prints the median and 10th
//! percentile per file. Used to compare a program exported by JAX with the one neuron-pc traces
//! for the same step.

use std::time::Instant;

use neuron_pc_compiler::pjrt::{
    find_plugin, Buffer, Client, ClientOptions, CompileOptions, OverrideValue, Plugin, Signature,
    Target,
};
use neuron_pc_compiler::HostTensor;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

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
    let plugin = Plugin::load(&find_plugin(Target::Cpu)?)?;
    let client = Client::new(
        &plugin,
        &ClientOptions {
            cpu_device_count: Some(1),
            ..Default::default()
        },
    )?;
    let device = client.devices()[0];
    let mut progs = Vec::new();
    for (f, (label, opts)) in files
        .iter()
        .flat_map(|f| options.iter().map(move |o| (f, o)))
    {
        let text = std::fs::read_to_string(f)?;
        let sig = Signature::parse(&text).ok_or(format!("{f}: no readable @main signature"))?;
        let exe = client.compile(&text, opts)?;
        let f = format!("{f} ({label})");
        let bufs: Vec<Buffer> = sig
            .params
            .iter()
            .map(|p| client.buffer_from_host(&HostTensor::zeros(p.dtype, &p.dims), device))
            .collect::<Result<_, _>>()?;
        progs.push((f, exe, bufs, Vec::new()));
    }
    for rep in 0..reps + 10 {
        for (_, exe, bufs, times) in progs.iter_mut() {
            let t = Instant::now();
            let out = exe.execute(&bufs.iter().collect::<Vec<_>>())?;
            // Reading the smallest output waits for the execution; large outputs stay put,
            // as a training step's parameters do.
            if let Some(b) = out.iter().min_by_key(|b| b.size_in_bytes()) {
                b.to_host()?;
            }
            if rep >= 10 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    println!("| program | median ms | p10 ms |");
    println!("| --- | --- | --- |");
    for (f, _, _, times) in &mut progs {
        times.sort_by(f64::total_cmp);
        println!(
            "| {f} | {:.2} | {:.2} |",
            times[times.len() / 2],
            times[times.len() / 10]
        );
    }
    Ok(())
}
