//! Continues prompts with a Llama-family model of a `save_pretrained` directory, decoding with
//! the directory's own tokenizer: `generate DIR --prompt "..." [--prompt "..."]`.
//!
//! ```sh
//! cargo run --release --example generate -- out-dir --prompt "The compiler" --max-new-tokens 32
//! cargo run --release --example generate -- out-dir --prompt "Q: why?" --temperature 0.8 \
//!     --top-p 0.9 --seed 7
//! neuron-pc compile -- target/release/examples/generate out-dir --prompt "warm up"
//! ```
//!
//! The prompts run as one batch, left-padded to the smallest of `--buckets` that holds the
//! longest: one prefill graph per bucket and one decode graph, which `neuron-pc compile`
//! precompiles like training graphs. Greedy unless `--temperature` is given; a row stops at the
//! tokenizer's end token.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use neuron_pc::data::Tokenizer;
use neuron_pc::models::llama::{GenerateOptions, LlamaForCausalLM, Sampling};
use neuron_pc::LazyDevice;

/// Continue prompts with a save_pretrained model and its tokenizer.
#[derive(Parser)]
struct Args {
    /// A save_pretrained directory with tokenizer.json.
    dir: PathBuf,
    /// A prompt (repeat for a batch).
    #[arg(long, required = true)]
    prompt: Vec<String>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Sample at this temperature instead of greedy decoding.
    #[arg(long)]
    temperature: Option<f64>,
    #[arg(long, requires = "temperature")]
    top_k: Option<usize>,
    #[arg(long, requires = "temperature")]
    top_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompt lengths compiled for (comma-separated).
    #[arg(long, default_value = "64,256,1024", value_delimiter = ',')]
    buckets: Vec<usize>,
    /// Print the device's metrics (compiles, cache hits, ...) as JSON at the end.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    neuron_pc::logging::init_default();
    let args = Args::parse();
    let device = LazyDevice::from_env()?;
    let dir = &args.dir;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let model = LlamaForCausalLM::from_pretrained(&device, dir)
        .with_context(|| format!("loading {}", dir.display()))?;
    let prompts = args
        .prompt
        .iter()
        .map(|p| tokenizer.encode(p))
        .collect::<neuron_pc::Result<Vec<_>>>()?;
    let mut options = GenerateOptions::greedy(args.max_new_tokens);
    options.buckets = args.buckets.clone();
    options.eos_token_ids = tokenizer.eos_token_id().into_iter().collect();
    if let Some(temperature) = args.temperature {
        options.sampling = Sampling::Sample {
            temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        };
    }
    let outputs = model.generate(&prompts, &options)?;
    for (prompt, new) in args.prompt.iter().zip(&outputs) {
        let text = tokenizer.decode(new, true)?;
        println!("{prompt}{text}");
        println!("  ({} new tokens: {new:?})", new.len());
    }
    if args.json {
        println!("{}", device.metrics().to_json());
    }
    Ok(())
}
