//! Trains a byte-level BPE tokenizer (GPT-2's kind) on text files and writes it as a
//! `save_pretrained` tokenizer directory (`tokenizer.json`, `tokenizer_config.json`) that
//! `train_llama --tokenizer DIR`, `generate` and `transformers`' `AutoTokenizer` read.
//!
//! ```sh
//! cargo run --release --example train_tokenizer -- --vocab 2048 --out out/tok docs/*.md
//! ```
//!
//! Each file is split into paragraphs (blank lines), as `train_llama --data` splits a text
//! file into documents.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use neuron_pc::data::Tokenizer;

/// Train a byte-level BPE tokenizer on text files.
#[derive(Parser)]
struct Args {
    /// Text files to learn from.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Pieces in the vocabulary (the 256 bytes and the end token included).
    #[arg(long, default_value_t = 2048)]
    vocab: usize,
    /// The end-of-text token.
    #[arg(long, default_value = "<|endoftext|>")]
    eos: String,
    /// The directory to write.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    neuron_pc::logging::init_default();
    let args = Args::parse();
    let started = Instant::now();
    let mut docs = Vec::new();
    for f in &args.files {
        let text = std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?;
        docs.extend(
            text.split("\n\n")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string),
        );
    }
    if docs.is_empty() {
        bail!("no text in {} file(s)", args.files.len());
    }
    let bytes: usize = docs.iter().map(String::len).sum();
    let t = Tokenizer::train_bpe(docs.iter(), args.vocab, &args.eos)?;
    let tokens: usize = t
        .encode_batch(&docs.iter().map(String::as_str).collect::<Vec<_>>())?
        .iter()
        .map(Vec::len)
        .sum();
    t.save_pretrained(&args.out)
        .with_context(|| format!("--out {}", args.out.display()))?;
    println!(
        "trained a byte-level BPE of {} pieces on {} paragraphs of {} files ({:.1} KiB) in \
         {:.1} s: {:.2} bytes a token; wrote {}",
        t.vocab_size(),
        docs.len(),
        args.files.len(),
        bytes as f64 / 1024.0,
        started.elapsed().as_secs_f64(),
        bytes as f64 / tokens.max(1) as f64,
        args.out.display()
    );
    Ok(())
}
