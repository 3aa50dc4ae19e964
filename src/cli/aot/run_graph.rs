//! `neuron-pc run-graph FILE --inputs A.npy ... --output-dir DIR`: loads the program's executable
//! from the cache (compiling and storing it on a miss) and runs it once on the cpu device.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail};
use neuron_pc::compile::Source;
use neuron_pc_compiler::pjrt::Signature;

use super::env::AotEnv;
use super::{npy, FlagArgs};

#[derive(clap::Args, Debug)]
pub struct RunGraphArgs {
    /// StableHLO text file.
    pub file: PathBuf,
    /// Inputs in parameter order, as .npy files.
    #[arg(long, num_args = 0..)]
    pub inputs: Vec<PathBuf>,
    /// Where out0.npy, out1.npy, ... are written.
    #[arg(long = "output-dir")]
    pub output_dir: PathBuf,
    #[arg(long)]
    pub cache: Option<String>,
    /// Print what happened as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub flags: FlagArgs,
}

pub fn run(args: RunGraphArgs) -> anyhow::Result<i32> {
    let text =
        std::fs::read_to_string(&args.file).map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let signature = Signature::parse(&text).ok_or_else(|| {
        anyhow!(
            "{}: cannot read the signature of @main",
            args.file.display()
        )
    })?;
    if args.inputs.len() != signature.params.len() {
        bail!(
            "the program takes {} input(s) but {} were given",
            signature.params.len(),
            args.inputs.len()
        );
    }
    let mut inputs = Vec::with_capacity(args.inputs.len());
    for (i, (path, want)) in args.inputs.iter().zip(&signature.params).enumerate() {
        let t = npy::read(path).map_err(|e| anyhow!("input {i}: {e}"))?;
        if t.dtype() != want.dtype || t.dims() != want.dims.as_slice() {
            bail!(
                "input {i} ({}): {}{:?} does not match the program's parameter {i}: {want}",
                path.display(),
                t.dtype(),
                t.dims()
            );
        }
        inputs.push(t);
    }
    let flags = args.flags.effective(false)?;
    flags.warn_unused_neuron_flags();
    let env = AotEnv::open(flags, args.cache.as_deref())?;
    let program = env.compiler.program(text);
    let key = program.key.clone();
    let started = Instant::now();
    let obtained = env
        .compiler
        .obtain(&program)
        .map_err(|e| anyhow!("compiling {}: {e}", args.file.display()))?;
    let how = match obtained.source {
        Source::Compiled => "compiled",
        Source::Disk | Source::Remote => "cached",
        Source::Waited => "compiled by another process",
    };
    let exe = obtained.executable;
    let obtain_ms = started.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let outputs = exe.execute_host(&inputs)?;
    let run_ms = t.elapsed().as_secs_f64() * 1e3;
    std::fs::create_dir_all(&args.output_dir)?;
    let mut written = Vec::new();
    for (i, out) in outputs.iter().enumerate() {
        let path = args.output_dir.join(format!("out{i}.npy"));
        std::fs::write(&path, npy::encode(out))?;
        written.push(format!(
            "{} {}{:?}",
            path.display(),
            out.dtype(),
            out.dims()
        ));
    }
    if args.json {
        let v = serde_json::json!({
            "key": key.hex(),
            "executable": how,
            "obtain_ms": obtain_ms,
            "run_ms": run_ms,
            "outputs": written,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} ({how} in {obtain_ms:.1} ms, ran in {run_ms:.2} ms)",
            key.short()
        );
        for w in written {
            println!("  {w}");
        }
    }
    Ok(0)
}
