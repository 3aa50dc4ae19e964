//! Trains a small decoder of the Llama family (`models::llama`: Llama 2/3, Mistral, Qwen2/2.5,
//! Qwen3) on the lazy device: a synthetic sequence-reversal task by default, or byte-level
//! tokens of a text file.
//!
//! ```sh
//! cargo run --release --example train_llama -- --steps 300
//! cargo run --release --example train_llama -- --text README.md --steps 500 --save out/llama
//! cargo run --release --example train_llama -- --init-from tests/data/llama-tiny --steps 50
//! cargo run --release --example train_llama -- --init-from tests/data/families/qwen2 --steps 50
//! neuron-pc compile -- target/release/examples/train_llama --steps 3
//! CPU_NUM_DEVICES=4 cargo run --release --example train_llama -- --fsdp 2 --tp 2
//! ```
//!
//! The model comes from `--init-from DIR` (a `save_pretrained` directory: its config and
//! weights, the family from its `model_type`), `--config config.json` (a Hugging Face config,
//! random weights), or the size flags (`--family` picks the architecture). `--save DIR` writes
//! a directory `transformers`' `AutoModelForCausalLM.from_pretrained` loads as the same family.
//! One step graph holds forward, backward, the gradient all-reduce (`--devices N`) and the
//! AdamW update, so the run compiles it once (plus the matmul that measures the peak).
//! `--buckets 16,32,64` trains on rows of random length padded to length buckets (one graph per
//! bucket), `--grad-accum K` takes K micro-batches per update (a micro-batch graph and an
//! update graph), `--zero1` shards AdamW's moments over the replicas (over the processes, with a
//! mesh in each). `--fsdp F --tp T` lays a mesh of F x T devices: FSDP over its `data` axis,
//! tensor parallelism (the Megatron layout) over its `model` axis, each step one program
//! partitioned by XLA's SPMD partitioner.
//! `--remat full|dots` checkpoints every decoder layer, `--precision bf16` computes the matrix
//! products in bfloat16 over float32 master weights, `--loss-chunk N` computes the head and
//! the loss N tokens at a time: the three trade step time for memory at long context.
//! `--data corpus.jsonl` trains on documents (JSON lines with `text`, or `prompt` and
//! `completion`; a `datasets.save_to_disk` directory, `.arrow` or `.parquet` files with those
//! columns; other files: paragraphs) tokenized with the model directory's `tokenizer.json`
//! and packed into rows of `--seq-len` (`--document-masks`: no attention across documents);
//! `--val-data val.jsonl` reports the validation loss and perplexity every `--val-every` steps
//! and after the last.
//! `--scan-layers` stacks the decoder layers and runs them as one loop: the step graph, and its
//! compile, stop growing with `--layers`; checkpoints and `--save` directories are unchanged.
//! `--step-fn` runs each step as a step function (`LazyDevice::step_fn`): traced on its first
//! calls, then replayed without tracing (the GPU kit's `llama-stepfn` row).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use neuron_pc::amp::Precision;
use neuron_pc::data::{
    load_packed_with_progress, CacheOutcome, DeviceLoader, LastBatch, LengthBuckets, PackedCache,
    PackedRows, TokenShard, Tokenizer,
};
use neuron_pc::models::llama::{LlamaForCausalLM, LlamaSharding, LoadOptions};
use neuron_pc::nn::{Module, Remat, VarBuilder};
use neuron_pc::optim::{
    average_gradients, grad_norm, AdamW, AdamWConfig, GradAccumulator, WarmupCosine,
};
use neuron_pc::sharding::{ShardingPlan, DATA_AXIS, EXPERT_AXIS, MODEL_AXIS};
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

mod ckpt;
mod model;
mod monitor;
mod replay;
mod task;

use task::{batch_split, rows, Task};

/// Train a small Llama.
#[derive(Parser, Debug)]
struct Args {
    /// Training steps (in total, counting steps done before a resume).
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// The global batch (sequences): split over the replicas (`--devices`).
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 24)]
    seq_len: usize,
    /// Data-parallel replicas (devices of this process); default `NEURON_PC_DEVICES`, else 1.
    #[arg(long)]
    devices: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Start from this `save_pretrained` directory (config.json + model.safetensors).
    #[arg(long, conflicts_with = "config")]
    init_from: Option<PathBuf>,
    /// A Hugging Face `config.json` for a randomly initialised model.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The model's sizes and family when neither `--init-from` nor `--config` is given.
    #[command(flatten)]
    model: model::ModelArgs,
    /// Train on the bytes of this file (one token per byte) instead of the synthetic task.
    #[arg(long)]
    text: Option<PathBuf>,
    /// Train on the documents of this file (JSON lines with "text", or "prompt" and
    /// "completion"; a `datasets.save_to_disk` directory, .arrow or .parquet files with those
    /// columns; other files: paragraphs), tokenized with the model directory's
    /// tokenizer.json and packed into rows of --seq-len; or on a pre-tokenized llm.c shard
    /// (`.bin`, uint16 or uint32 tokens, memory-mapped) cut into rows.
    #[arg(long, conflicts_with_all = ["text", "buckets"])]
    data: Option<PathBuf>,
    /// Held-out documents (as --data): validation loss and perplexity every --val-every steps
    /// and after the last.
    #[arg(long, requires = "data")]
    val_data: Option<PathBuf>,
    #[arg(long, default_value_t = 0, requires = "val_data")]
    val_every: u64,
    /// Keep attention inside each packed document (position ids restart per document).
    #[arg(long, requires = "data")]
    document_masks: bool,
    /// Where the tokenized and packed rows of --data and --val-data are kept, so a corpus is
    /// tokenized once per machine and each process maps the rows (default: NEURON_PC_DATA_CACHE,
    /// else ~/.cache/neuron-pc/packed); `off` tokenizes on every run.
    #[arg(long, requires = "data")]
    data_cache: Option<PathBuf>,
    /// The directory whose tokenizer.json tokenizes --data (default: --init-from's).
    #[arg(long, requires = "data")]
    tokenizer: Option<PathBuf>,
    /// Symbols of the synthetic reversal task (tokens 2 .. 2 + alphabet).
    #[arg(long, default_value_t = 16)]
    alphabet: usize,
    #[arg(long, default_value_t = 1e-2)]
    lr: f64,
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f64,
    /// Write the trained model as a `save_pretrained` directory.
    #[arg(long)]
    save: Option<PathBuf>,
    /// The dtype `--save` writes: f32 or bf16.
    #[arg(long, default_value = "f32")]
    save_dtype: String,
    /// Where training checkpoints go: a directory or s3://bucket/prefix, one `step-<N>/` per
    /// checkpoint, written in the background; none: no checkpoints.
    #[arg(long)]
    ckpt_dir: Option<String>,
    /// Save a checkpoint every M steps (0: only at the end).
    #[arg(long, default_value_t = 100)]
    ckpt_every: u64,
    /// Keep the newest K complete checkpoints, deleting older ones once a newer one is saved
    /// (default: keep all).
    #[arg(long)]
    keep_checkpoints: Option<usize>,
    /// Save checkpoints in the training loop's time instead of the background.
    #[arg(long)]
    ckpt_sync: bool,
    /// The largest checkpoint file (like 2G or 500M); larger states are several files.
    #[arg(long, default_value = "2G")]
    ckpt_shard_size: String,
    /// Continue from the newest complete checkpoint in --ckpt-dir (`auto`, what `--resume`
    /// alone means) or from the named one (`step-00000100`); none there yet: start at step 0.
    #[arg(long, num_args = 0..=1, default_missing_value = "auto")]
    resume: Option<String>,
    /// Let --resume continue a checkpoint of another run: one whose run id is not this run's
    /// NEURON_PC_RUN_ID (without it, that resume is refused).
    #[arg(long)]
    adopt_run: bool,
    #[arg(long, default_value_t = 50)]
    log_every: u64,
    /// Write TensorBoard event files and metrics.jsonl into DIR (loss, learning rate, gradient
    /// norm, tokens/s, step time, memory per device, compile-cache hits, checkpoint times)
    /// every --log-every steps.
    #[arg(long, env = "NEURON_PC_TENSORBOARD")]
    tensorboard: Option<PathBuf>,
    /// Print each step's loss as a JSON line (for tests and scripts).
    #[arg(long)]
    loss_log: bool,
    /// Print the metrics summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Side of the square f32 matmul that measures the device's peak (0: skip).
    #[arg(long, default_value_t = 1024)]
    peak_matmul: usize,
    /// Variable-length sequences padded to these length buckets (`16,32,64` or `64..512`;
    /// the largest must be at most `--seq-len`): each row of the reversal task gets a random
    /// length, each batch the smallest bucket that holds it, and a mask and -100 labels.
    #[arg(long)]
    buckets: Option<String>,
    /// Gradient accumulation: each optimizer step takes K micro-batches of
    /// `batch-size / K` sequences (the same update as one batch of `batch-size`).
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// ZeRO-1: shard AdamW's moments over the replicas (each keeps 1/N of them); with
    /// `--fsdp`/`--tp` in a launch of several processes, over the processes.
    #[arg(long)]
    zero1: bool,
    /// FSDP (ZeRO-3) over F devices: parameters, gradients and AdamW's moments split over the
    /// mesh's `data` axis, the batch too. With `--tp T` the mesh is F x T devices.
    #[arg(long)]
    fsdp: Option<usize>,
    /// Tensor parallelism over T devices (the mesh's `model` axis): the Megatron layout.
    #[arg(long)]
    tp: Option<usize>,
    /// Expert parallelism over E devices (the mesh's `expert` axis): a mixture's experts split
    /// over them. The mesh is F x T x E devices.
    #[arg(long)]
    ep: Option<usize>,
    /// Activation checkpointing of every decoder layer: none (keep every activation), full
    /// (keep each layer's input, recompute the rest in the backward pass) or dots (keep the
    /// projections, recompute the attention and the elementwise work).
    #[arg(long, default_value = "none")]
    remat: Remat,
    /// f32, or bf16: matrix products in bfloat16 (autocast) with float32 master weights,
    /// gradients and AdamW state; norms, softmax and the loss in float32.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Compute the head and the loss this many tokens at a time (no more than one chunk's
    /// logits at once); 0: all at once.
    #[arg(long, default_value_t = 0)]
    loss_chunk: usize,
    /// Stack the decoder layers and run them as one loop (`LlamaConfig::scan_layers`): the step
    /// graph and its compile time do not grow with depth.
    #[arg(long)]
    scan_layers: bool,
    /// Run each step as a step function (`LazyDevice::step_fn`): traced on its first calls,
    /// then replayed without tracing (one update per batch: not with --grad-accum > 1).
    #[arg(long)]
    step_fn: bool,
}

fn main() -> anyhow::Result<()> {
    let process_start = Instant::now();
    let args = Args::parse();
    let mut device_config = DeviceConfig::from_env()?;
    if let Some(n) = args.devices {
        device_config.replicas = n;
    }
    let (fsdp, tp, ep) = (
        args.fsdp.unwrap_or(1),
        args.tp.unwrap_or(1),
        args.ep.unwrap_or(1),
    );
    let mesh = args.fsdp.is_some() || args.tp.is_some() || args.ep.is_some();
    if mesh {
        if fsdp == 0 || tp == 0 || ep == 0 {
            bail!("--fsdp {fsdp} --tp {tp} --ep {ep}: each needs at least 1 device");
        }
        if args.devices.is_some_and(|n| n > 1) {
            bail!("--fsdp/--tp/--ep lay a mesh over the devices: its data axis replaces --devices");
        }
        // with a mesh in each process, ZeRO-1 shards the moments over the processes (its
        // replicas); inside one process FSDP shards what it would
        if args.zero1 && !device_config.topology.is_multi_process() {
            bail!(
                "--zero1 with --fsdp/--tp shards AdamW's moments over the processes of a \
                 multi-process launch; in one process, --fsdp shards them over the devices"
            );
        }
        device_config.replicas = 1;
        let mut axes = vec![(DATA_AXIS, fsdp), (MODEL_AXIS, tp)];
        if args.ep.is_some() {
            axes.push((EXPERT_AXIS, ep));
        }
        device_config = device_config.with_mesh(&axes);
    }
    // Checked before the device is opened: every rank refuses the same flags, and none leaves
    // the others connecting their collectives to a process that is gone.
    let planned = device_config.replicas.max(1) * device_config.topology.world_size.max(1);
    let (split, over) = batch_split(mesh, (fsdp, ep), planned);
    if !args.batch_size.is_multiple_of(split) {
        bail!(
            "--batch-size {} does not split over {over}: use a multiple of {split}",
            args.batch_size
        );
    }
    let device = LazyDevice::new(device_config)?;
    let plan: Option<Arc<dyn ShardingPlan>> =
        mesh.then(|| Arc::new(LlamaSharding { fsdp: fsdp > 1 }) as Arc<dyn ShardingPlan>);
    let replicas = device.global_replicas();
    let (split, over) = batch_split(mesh, (fsdp, ep), replicas);
    let save_dtype = match args.save_dtype.as_str() {
        "f32" | "float32" => DType::F32,
        "bf16" | "bfloat16" => DType::BF16,
        other => bail!("--save-dtype {other:?}: use f32 or bf16"),
    };
    let autocast = args.precision.autocast();
    let extracting = device.is_trial_run();
    let not_real = if extracting {
        "  (the trial run: not real)"
    } else {
        ""
    };
    let peak = monitor::measure_peak(&device, args.peak_matmul, args.seed)?;

    let model = match &args.init_from {
        Some(dir) => {
            let options = LoadOptions {
                dtype: Some(DType::F32),
                plan: plan.clone(),
                scan_layers: args.scan_layers,
            };
            LlamaForCausalLM::from_pretrained_with(&device, dir, &options)
                .with_context(|| format!("--init-from {}", dir.display()))?
        }
        None => {
            let vb = VarBuilder::random(&device, args.seed);
            let vb = match &plan {
                Some(plan) => vb.with_sharding(plan.clone()),
                None => vb,
            };
            let mut config =
                model::model_config(&args.model, args.config.as_deref(), args.seq_len)?;
            config.scan_layers = args.scan_layers;
            LlamaForCausalLM::from_vb(&vb, &config)?
        }
    };
    let mut model = model;
    model.set_remat(args.remat);
    model.loss_chunk = (args.loss_chunk > 0).then_some(args.loss_chunk);
    let config = model.config.clone();
    let seq = args.seq_len;
    let shard = args
        .data
        .as_deref()
        .filter(|p| p.extension().is_some_and(|e| e == "bin"));
    let tokenizer = match (
        &args.data,
        args.tokenizer.as_ref().or(args.init_from.as_ref()),
    ) {
        (None, _) => None,
        // pre-tokenized: no tokenizer
        _ if shard.is_some() => None,
        (Some(_), None) => bail!("--data needs a tokenizer: --init-from DIR or --tokenizer DIR"),
        (Some(_), Some(dir)) => {
            let t = Tokenizer::from_dir(dir)?;
            if t.vocab_size() > config.vocab_size {
                bail!(
                    "{}: a tokenizer of {} pieces for a model of {} (--vocab {1} or more)",
                    dir.display(),
                    t.vocab_size(),
                    config.vocab_size
                );
            }
            Some(t)
        }
    };
    let cache = match args.data_cache.as_deref() {
        Some(p) if p == Path::new("off") => None,
        Some(p) => Some(PackedCache::new(p)),
        None => Some(PackedCache::from_env()),
    };
    let rank0 = neuron_pc::topology::Topology::from_env().map_or(true, |t| t.rank == 0);
    let packed = |path: &Path| -> anyhow::Result<PackedRows> {
        let t = tokenizer.as_ref().expect("--data gave a tokenizer");
        let started = Instant::now();
        let masks = args.document_masks;
        let (rows, outcome) = monitor::tokenizing(path, rank0 && !extracting, |p| match &cache {
            Some(c) => c
                .load_with_progress(path, t, seq, masks, p)
                .map(|(r, o)| (r, Some(o))),
            None => load_packed_with_progress(path, t, seq, masks, p).map(|r| (r, None)),
        })?;
        let what = format!("{}: {} rows of {seq} tokens", path.display(), rows.rows());
        let rate = rows.rows() as f64 * seq as f64 / started.elapsed().as_secs_f64();
        match outcome {
            Some(CacheOutcome::Hit(entry)) => {
                println!(
                    "{what}, read from the packed-rows cache {}",
                    entry.display()
                )
            }
            Some(CacheOutcome::Built(entry)) => println!(
                "{what}, tokenized and packed at {rate:.0} tokens/s (cached in {})",
                entry.display()
            ),
            None => println!("{what}, tokenized and packed at {rate:.0} tokens/s"),
        }
        Ok(rows)
    };
    let val_rows = match args.val_data.as_deref() {
        Some(path) if path.extension().is_some_and(|e| e == "bin") => {
            Some(TokenShard::open(path)?.to_rows(seq))
        }
        Some(path) if shard.is_some() => bail!(
            "--val-data {}: with a pre-tokenized --data, give a pre-tokenized (.bin) one too",
            path.display()
        ),
        Some(path) => Some(packed(path)?),
        None => None,
    };
    let task = match (&args.data, &args.text) {
        (Some(path), _) if shard.is_some() => {
            let shard = TokenShard::open(path)?;
            if shard.rows(seq) == 0 {
                bail!("--data {}: fewer than {seq} tokens", path.display());
            }
            // an id past the vocabulary would be clamped by the gather, silently
            let largest = shard.max_token().unwrap_or(0);
            if largest as usize >= config.vocab_size {
                bail!(
                    "--data {}: token {largest} is outside the model's vocabulary of {}",
                    path.display(),
                    config.vocab_size
                );
            }
            println!(
                "{}: {} tokens, {} rows of {seq}",
                path.display(),
                shard.len(),
                shard.rows(seq)
            );
            Task::Shard(Arc::new(shard))
        }
        (Some(path), _) => Task::Packed(Arc::new(packed(path)?)),
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("--text {}", path.display()))?;
            if bytes.len() < seq {
                bail!(
                    "--text {}: {} bytes, fewer than one sequence of {seq}",
                    path.display(),
                    bytes.len()
                );
            }
            if config.vocab_size < 256 {
                bail!(
                    "--text needs a vocabulary of at least 256 (bytes), the model has {}",
                    config.vocab_size
                );
            }
            Task::Bytes(bytes.into())
        }
        (None, None) => {
            if seq < 4 {
                bail!("--seq-len {seq}: the reversal task needs at least 4 tokens");
            }
            if config.vocab_size < 2 + args.alphabet {
                bail!(
                    "--alphabet {} needs a vocabulary of at least {}, the model has {}",
                    args.alphabet,
                    2 + args.alphabet,
                    config.vocab_size
                );
            }
            Task::Reverse {
                alphabet: args.alphabet,
            }
        }
    };

    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let adamw = AdamWConfig {
        betas: (0.9, 0.95),
        weight_decay: args.weight_decay,
        zero1: args.zero1,
        ..Default::default()
    };
    let opt = RefCell::new(AdamW::with_config(&device, &params, adamw)?);
    let schedule = WarmupCosine {
        base_lr: args.lr,
        min_lr: args.lr * 0.1,
        warmup_steps: args.warmup,
        total_steps: args.steps,
    };
    let mut ckpts = ckpt::open(&args)?;
    let start_step = ckpt::resume(
        ckpts.as_ref(),
        args.resume.as_deref(),
        &model,
        &opt.borrow(),
    )?;
    println!(
        "{}: {} parameters, {} layers{}, hidden {}, {} heads over {} kv heads, vocab {}",
        config.family.model_type(),
        config.num_parameters(),
        config.num_hidden_layers,
        if config.scan_layers { " (scanned)" } else { "" },
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size
    );
    if let Some(moe) = &config.moe {
        println!(
            "experts: {} per sparse layer, {} per token, {} wide; {} parameters active per token",
            moe.num_experts,
            moe.experts_per_token,
            moe.expert_intermediate_size,
            config.active_parameters()
        );
    }

    let (batch_size, seed) = (args.batch_size, args.seed);
    let k = args.grad_accum.max(1);
    let micro = batch_size / k;
    if !batch_size.is_multiple_of(k) || !micro.is_multiple_of(split) {
        bail!(
            "--batch-size {batch_size} with --grad-accum {k}: micro-batches of {} sequences \
             must split over {over}",
            batch_size as f64 / k as f64
        );
    }
    // Micro-batch `m` of step `i` is rows `m * micro ..` of batch `i`: the same data as one
    // batch of `batch_size`, whatever K.
    let stream = task.clone();
    let micro_batches = (start_step..args.steps).flat_map(move |i| (0..k).map(move |m| (i, m)));
    let loader = match &args.buckets {
        // packed text and token shards: this process builds only its rows of each micro-batch
        None if matches!(task, Task::Packed(_) | Task::Shard(_)) => {
            let mine = device.local_rows(micro)?;
            let batches = micro_batches.map(move |(i, m)| {
                let start = i as usize * batch_size + m * micro + mine.start;
                stream
                    .rows(start, mine.len(), seq)
                    .expect("a packed or shard task")
            });
            DeviceLoader::for_local_rows(&device, batches, micro, 2)
        }
        None => {
            let batches = micro_batches.map(move |(i, m)| {
                let whole = stream.batch(seed, i, batch_size, seq);
                whole.iter().map(|t| rows(t, m * micro, micro)).collect()
            });
            DeviceLoader::new(&device, batches, micro, LastBatch::Drop, 2)
        }
        Some(spec) => {
            let buckets = LengthBuckets::parse(spec)?;
            if buckets.max() > seq {
                bail!("--buckets {spec}: the largest exceeds --seq-len {seq}");
            }
            let rows = micro_batches.map(move |(i, m)| {
                let mut all = stream.ragged_rows(seed, i, batch_size, seq);
                all.drain(m * micro..(m + 1) * micro).collect::<Vec<_>>()
            });
            let batches = buckets.batches(rows, micro, 0).accumulating(k);
            DeviceLoader::for_tokens(&device, batches, micro, LastBatch::Drop, 2)
        }
    };
    let mut monitor = monitor::Monitor::new(
        args.tensorboard.as_ref(),
        start_step,
        args.steps,
        args.log_every,
        rank0 && !extracting,
    )?;
    let mut tokens_counted = 0usize;
    let mut accumulator = (k > 1)
        .then(|| GradAccumulator::new(&device, &params, k))
        .transpose()?;
    if args.step_fn && k > 1 {
        bail!("--step-fn runs one update per batch: it does not take --grad-accum {k}");
    }
    let settings = replay::Settings {
        packed: matches!(task, Task::Packed(_) | Task::Shard(_)),
        autocast,
        zero1: args.zero1,
        norm: args.tensorboard.is_some() && !args.zero1,
    };
    let mut replay =
        (args.step_fn).then(|| replay::step_fn(&device, &model, &params, &opt, settings));
    let mut loss_sum: Option<Tensor> = None;
    let mut first_step_at = None;
    // validation's time, left out of the throughput (the figure is the training step's)
    let mut val_time = std::time::Duration::ZERO;
    let mut last_loss = f64::NAN;
    let mut real_tokens = 0usize;
    for (n, batch) in loader.enumerate() {
        let batch = batch?;
        let step = start_step + (n / k) as u64;
        let (ids, mask, labels) = match &batch.tensors[..] {
            [ids, labels] => (ids, None, labels),
            [ids, mask, labels] => (ids, Some(mask), labels),
            _ => bail!("a batch has two or three tensors"),
        };
        // packed rows: the middle tensor is the position ids
        let (mask, positions) = match &task {
            Task::Packed(_) | Task::Shard(_) => (None, mask),
            _ => (mask, None),
        };
        real_tokens += batch.tokens.unwrap_or(ids.elem_count() * replicas);
        // each replica's mean over its shard's scored tokens; the reversal task scores the same
        // number of tokens in every row, so averaging the replicas' gradients gives the global
        // batch's (with ragged -100 labels, as with --buckets, it weights each micro-batch
        // and replica equally rather than each token)
        let (loss, norm) = if let Some(f) = &mut replay {
            // the same step, replayed: the batch and the learning rate are its arguments
            let mut a = vec![ids.clone()];
            a.extend(mask.or(positions).cloned());
            a.push(labels.clone());
            a.push(device.scalar(schedule.lr(step), DType::F32)?);
            let mut out = f.call(&a)?.into_iter();
            let loss = out.next().context("the step function returned no loss")?;
            (loss, out.next())
        } else {
            let loss = device.autocast(autocast, || match positions {
                Some(p) => model.loss_packed(ids, p, labels),
                None => model.loss(ids, mask, labels),
            })?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let grads = grad(&loss, &refs)?;
            let loss = loss.all_reduce(Reduction::Mean)?;
            let loss = match loss_sum.take() {
                Some(sum) => sum.add(&loss)?,
                None => loss,
            };
            // A tensor still held at `mark_step` is one of the step's outputs: each set of
            // gradients is dropped once used, or every step would write it out (a second copy of
            // the parameters' size, which also counts against the in-flight byte budget).
            let grads = match &mut accumulator {
                Some(acc) => {
                    let summed = acc.accumulate(&grads)?;
                    drop(grads);
                    match summed {
                        Some(mean) => mean,
                        None => {
                            // a micro-batch: its gradients are summed on the device
                            loss_sum = Some(loss);
                            device.mark_step()?;
                            continue;
                        }
                    }
                }
                None => grads,
            };
            // ZeRO-1 reduce-scatters each replica's own gradients inside its step
            let grads = if args.zero1 {
                grads
            } else {
                let averaged = average_gradients(&grads)?;
                drop(grads);
                averaged
            };
            // in every process and in the trial run too, so all run one step graph; ZeRO-1's
            // replicas hold their own gradients: no whole averaged one to take it of
            let norm = (args.tensorboard.is_some() && !args.zero1)
                .then(|| grad_norm(&grads))
                .transpose()?;
            let lr = device.scalar(schedule.lr(step), DType::F32)?;
            opt.borrow_mut().step(&params, &grads, &lr)?;
            drop(grads);
            let loss = if k > 1 {
                loss.mul_scalar(1.0 / k as f64)?
            } else {
                loss
            };
            device.mark_step()?;
            (loss, norm)
        };
        let log_due = (step + 1).is_multiple_of(args.log_every) || step + 1 == args.steps;
        let loss_value = if args.loss_log || log_due || first_step_at.is_none() {
            loss.item()?
        } else {
            f64::NAN
        };
        if first_step_at.is_none() {
            first_step_at = Some(process_start.elapsed());
        }
        monitor.step(
            step + 1,
            (real_tokens - tokens_counted) as u64,
            Some(loss_value),
        );
        tokens_counted = real_tokens;
        if args.loss_log {
            monitor.println(&format!(
                "{{\"step\": {}, \"loss\": {loss_value:.9e}}}",
                step + 1
            ));
        }
        if log_due {
            monitor.println(&format!(
                "step {:>5}  loss {loss_value:.4}{not_real}",
                step + 1
            ));
            last_loss = loss_value;
            let grad_norm = norm.map(|n| n.item()).transpose()?;
            let lr = schedule.lr(step);
            let logged = monitor::Logged {
                step: step + 1,
                loss: loss_value,
                lr,
                grad_norm,
            };
            monitor.log(&device, logged)?;
        }
        if let Some(rows) = &val_rows {
            let due = args.val_every > 0 && (step + 1).is_multiple_of(args.val_every);
            if due || step + 1 == args.steps {
                let val_start = Instant::now();
                let loss = model.eval_loss(rows, batch_size)?;
                val_time += val_start.elapsed();
                monitor.println(&format!(
                    "step {:>5}  val loss {loss:.4}  perplexity {:.2}{not_real}",
                    step + 1,
                    loss.exp()
                ));
                if args.loss_log {
                    monitor.println(&format!(
                        "{{\"val_step\": {}, \"val_loss\": {loss:.9e}}}",
                        step + 1
                    ));
                }
                monitor.log_val(step + 1, loss)?;
            }
        }
        let ckpt_due = args.ckpt_every > 0 && (step + 1).is_multiple_of(args.ckpt_every);
        if let (true, Some(c)) = (ckpt_due || step + 1 == args.steps, &mut ckpts) {
            c.save(&model, &*opt.borrow(), step + 1)?;
        }
        if let Some(c) = &mut ckpts {
            monitor.checkpoint(c);
        }
    }
    // The training clock stops when every step is done (the last loss was read, so this waits
    // for nothing more); what follows (the final checkpoint's wait, --save) is not training.
    device.synchronize()?;
    let train_end = process_start.elapsed();
    if let Some(f) = &replay {
        match f.why_traced() {
            None if f.is_replaying() => println!("step function: replayed"),
            why => println!("step function: traced ({})", why.unwrap_or("no plan yet")),
        }
    }
    monitor.finish();
    if let Some(c) = &mut ckpts {
        c.wait()?;
        monitor.checkpoint(c);
    }
    if let Some(dir) = &args.save {
        model
            .save_pretrained(dir, save_dtype)
            .with_context(|| format!("--save {}", dir.display()))?;
        // the tokenizer beside the weights, as transformers' Trainer saves it
        if let Some(t) = &tokenizer {
            t.save_pretrained(dir)
                .with_context(|| format!("--save {}", dir.display()))?;
        }
        if !extracting {
            println!("saved {} ({})", dir.display(), args.save_dtype);
        }
    }

    let m = device.metrics();
    if args.json {
        println!("{}", m.to_json());
        return Ok(());
    }
    let trained = args.steps.saturating_sub(start_step);
    let train_s = first_step_at.map_or(0.0, |t| {
        (train_end.as_secs_f64() - t.as_secs_f64() - val_time.as_secs_f64()).max(1e-9)
    });
    if mesh {
        println!(
            "mesh: fsdp {fsdp} x tp {tp} x ep {ep}{}, global batch {batch_size} x {seq} tokens, \
             {} per data-axis shard",
            if replicas > 1 {
                format!(" in each of {replicas} processes")
            } else {
                String::new()
            },
            batch_size / (fsdp * ep * replicas)
        );
    } else {
        println!(
            "data-parallel: {replicas} replica(s), global batch {batch_size} x {seq} tokens, {} \
             per replica",
            batch_size / replicas
        );
    }
    if trained > 1 && train_s > 0.0 {
        // after the first step (compilation or a cache load excluded), validation excluded
        let steps_per_s = (trained - 1) as f64 / train_s;
        // real tokens (padding excluded with --buckets) per optimizer step, on average
        let per_step = real_tokens as f64 / trained as f64;
        let tokens = steps_per_s * per_step;
        println!("throughput {tokens:.0} tokens/s (after step 1){not_real}");
        let achieved = steps_per_s * config.training_flops(batch_size, seq);
        if let Some(peak) = peak {
            println!(
                "model FLOPs utilisation {:.1}% ({:.2} GFLOP/s of a measured {}x{} f32 matmul \
                 peak of {:.2} GFLOP/s){not_real}",
                100.0 * achieved / peak,
                achieved / 1e9,
                args.peak_matmul,
                args.peak_matmul,
                peak / 1e9
            );
        }
    }
    if !extracting && last_loss.is_finite() {
        println!("final loss {last_loss:.4}");
    }
    if let Some(t) = first_step_at {
        println!("time to first step {:.3} s", t.as_secs_f64());
    }
    print!("{}", m.report());
    Ok(())
}
