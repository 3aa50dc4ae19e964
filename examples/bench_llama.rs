//! The LLM figures of `scripts/bench`: a small Llama (`models::llama`, fp32) trained with AdamW
//! on one device, the same model and batch shapes as `scripts/reference/llama_torch.py` (PyTorch
//! eager and PyTorch/XLA) and `scripts/reference/llama_jax.py` (JAX `jit`).
//!
//! The default mode prints one `RESULT` line: the step graph's compile time (compile cache
//! off), and the median step time synced (each step waited for) and pipelined (a round of
//! steps with one wait at the end, median over rounds), after warm-up steps.
//! `--first-step` runs one step against the persistent compile cache (`--cache`, else
//! `NEURON_COMPILE_CACHE_URL`) and prints `FIRST_STEP_EPOCH <unix seconds>` when its loss is
//! read back, so the caller can time the whole process, start to first step, as it does the
//! peers'.
//!
//! `--host-only` prints the host's share instead: the median time to trace one step (forward,
//! `grad`, the AdamW update) and of its `mark_step` call (step cut, in-memory lookup, launch),
//! each step waited for outside the timed parts.
//!
//! `--fsdp F --tp T` trains on a mesh of F x T devices (FSDP over `data`, tensor parallelism
//! over `model`, `LlamaSharding`), the batch split over `data`; the RESULT line then also
//! gives the layout and, per device, the bytes of parameters and AdamW state
//! (`device_bytes`) and the step's temporary buffers (`temp_bytes`), as
//! `scripts/reference/llama_jax.py --fsdp F --tp T` prints them for JAX's `NamedSharding`.
//!
//! The memory figures (`scripts/bench memory`): `--remat none|full|dots` checkpoints every decoder
//! layer, `--precision bf16` computes the matrix products in bfloat16 over float32 master weights
//! (autocast) and `--loss-chunk N` computes the head and the loss N tokens at a time, as
//! `examples/train_llama/main.rs` applies them. The RESULT line ends with them and with the
//! process's peak resident memory (`peak_rss_mib`, `VmHWM` of /proc/self/status, read after the
//! last step); `--rounds 0` skips the pipelined rounds (`pipelined_ms=n/a`) and the extra step
//! after them, for models whose step takes seconds.
//!
//! Depth (`scripts/bench depth`): `--scan-layers` stacks the decoder layers and runs them as one
//! loop; the RESULT line gives `program_bytes`, the StableHLO text handed to the compiler.
//!
//! Mixtures of experts (`scripts/bench moe`): `--family qwen3_moe --experts E
//! --experts-per-token K --expert-intermediate W` (the load-balancing loss at 0.001), `--ep N`
//! splitting the experts over a mesh's `expert` axis; `--family qwen3` is the dense model of
//! the same attention. The RESULT line gives the parameters a token uses (`active`).
//!
//! `cargo run --release --example bench_llama [-- --steps 20 --first-step]`

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use clap::Parser;
use neuron_pc::amp::Precision;
use neuron_pc::models::llama::{Family, LlamaConfig, LlamaForCausalLM, LlamaSharding, MoeConfig};
use neuron_pc::nn::{HostRng, Module, Remat, VarBuilder};
use neuron_pc::optim::AdamW;
use neuron_pc::sharding::{DATA_AXIS, EXPERT_AXIS, MODEL_AXIS};
use neuron_pc::{grad, DType, DeviceConfig, HostTensor, LazyDevice, Tensor};

/// Time a small Llama's AdamW training step.
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    #[arg(long, default_value_t = 4)]
    layers: usize,
    #[arg(long, default_value_t = 8)]
    heads: usize,
    #[arg(long, default_value_t = 4)]
    kv_heads: usize,
    #[arg(long, default_value_t = 768)]
    intermediate: usize,
    #[arg(long, default_value_t = 2048)]
    vocab: usize,
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Timed steps, synced; the pipelined figure runs rounds of `steps / 2`.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Run one step with the persistent cache and print when it is done.
    #[arg(long)]
    first_step: bool,
    /// The persistent compile cache for `--first-step` (default `NEURON_COMPILE_CACHE_URL`).
    #[arg(long)]
    cache: Option<String>,
    /// Time only the host's work: tracing a step and its `mark_step` call.
    #[arg(long)]
    host_only: bool,
    /// FSDP over this many devices (the mesh's `data` axis).
    #[arg(long, default_value_t = 1)]
    fsdp: usize,
    /// Tensor parallelism over this many devices (the mesh's `model` axis).
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Rounds of pipelined steps (`steps / 2` each) after the synced ones; 0: none, and no
    /// extra step after them (the loss is the last synced step's).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Activation checkpointing of every decoder layer: none, full or dots.
    #[arg(long, default_value = "none")]
    remat: Remat,
    /// f32, or bf16: matrix products in bfloat16 (autocast) over float32 master weights.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Compute the head and the loss this many tokens at a time; 0: all at once.
    #[arg(long, default_value_t = 0)]
    loss_chunk: usize,
    /// Stack the decoder layers and run them as one loop (`LlamaConfig::scan_layers`).
    #[arg(long)]
    scan_layers: bool,
    /// The model family (`model_type`): llama, qwen3, qwen3_moe, ...
    #[arg(long, default_value = "llama")]
    family: String,
    /// A mixture's experts per layer.
    #[arg(long, default_value_t = 8)]
    experts: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 2)]
    experts_per_token: usize,
    /// Each expert's width (default `--intermediate`).
    #[arg(long)]
    expert_intermediate: Option<usize>,
    /// Expert parallelism over this many devices (the mesh's `expert` axis).
    #[arg(long, default_value_t = 1)]
    ep: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The process's peak resident set (`VmHWM` in /proc/self/status) in MiB, if the kernel says.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let autocast = args.precision.autocast();
    if args.steps == 0 {
        bail!("--steps 0: time at least one step");
    }
    let mut device_config = DeviceConfig::from_env()?;
    if !args.first_step {
        // compile time is measured, so nothing may come from a cache
        device_config.cache = neuron_pc::compile::CacheConfig::disabled();
    } else if let Some(url) = &args.cache {
        device_config.cache = neuron_pc::compile::CacheConfig::at(url.clone());
    }
    let meshed = args.fsdp * args.tp * args.ep > 1;
    if meshed {
        device_config.replicas = 1;
        device_config = device_config.with_mesh(&[
            (DATA_AXIS, args.fsdp),
            (MODEL_AXIS, args.tp),
            (EXPERT_AXIS, args.ep),
        ]);
    }
    let device = LazyDevice::new(device_config)?;
    let mut config = LlamaConfig::new(
        args.vocab,
        args.hidden,
        args.intermediate,
        args.layers,
        args.heads,
        args.kv_heads,
    )?;
    let Some(family) = Family::from_model_type(&args.family) else {
        bail!("--family {}: not a family", args.family);
    };
    config = config.with_family(family);
    if matches!(family, Family::Qwen3Moe | Family::Mixtral) {
        let width = args.expert_intermediate.unwrap_or(args.intermediate);
        let mut moe = MoeConfig::new(args.experts, args.experts_per_token, width);
        moe.output_router_logits = true;
        config = config.with_moe(moe)?;
    }
    config.rms_norm_eps = 1e-5;
    config.scan_layers = args.scan_layers;
    config.max_position_embeddings = args.seq_len.max(config.max_position_embeddings);
    let plan = Arc::new(LlamaSharding {
        fsdp: args.fsdp > 1,
    });
    let mut model =
        LlamaForCausalLM::from_vb(&VarBuilder::random(&device, 0).with_sharding(plan), &config)?;
    model.set_remat(args.remat);
    model.loss_chunk = (args.loss_chunk > 0).then_some(args.loss_chunk);
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    // four batches of uniform random tokens, uploaded once (the peers do the same)
    let (b, s) = (args.batch_size, args.seq_len);
    let mut rng = HostRng::new(1);
    let batches: Vec<Tensor> = (0..4)
        .map(|_| {
            let ids: Vec<i32> = (0..b * s)
                .map(|_| (rng.next_u64() % args.vocab as u64) as i32)
                .collect();
            // split over the mesh's `data` axis; whole on one device
            Ok(device.shard(&HostTensor::from_slice(&ids, &[b, s])?)?)
        })
        .collect::<anyhow::Result<_>>()?;
    let lr = device.scalar(1e-3, DType::F32)?;
    let trace = |i: usize, opt: &mut AdamW| -> anyhow::Result<Tensor> {
        let ids = &batches[i % batches.len()];
        let loss = device.autocast(autocast, || model.loss(ids, None, ids))?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs)?;
        opt.step(&params, &grads, &lr)?;
        Ok(loss)
    };
    let step = |i: usize, opt: &mut AdamW| -> anyhow::Result<Tensor> {
        let loss = trace(i, opt)?;
        device.mark_step()?;
        Ok(loss)
    };
    if args.first_step {
        let loss = step(0, &mut opt)?.item()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        println!("FIRST_STEP_EPOCH {now:.6}");
        eprintln!("loss {loss:.4}");
        return Ok(());
    }
    step(0, &mut opt)?.item()?;
    let compile_ms = device.metrics().compile_ms;
    if args.host_only {
        let (mut traced, mut cut) = (Vec::new(), Vec::new());
        for i in 0..args.warmup + args.steps {
            device.synchronize()?;
            let t = Instant::now();
            let loss = trace(i, &mut opt)?;
            let traced_ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            device.mark_step()?;
            let cut_ms = t.elapsed().as_secs_f64() * 1e3;
            drop(loss);
            if i >= args.warmup {
                traced.push(traced_ms);
                cut.push(cut_ms);
            }
        }
        device.synchronize()?;
        let graphs = device.metrics().graphs_seen;
        anyhow::ensure!(
            graphs == 1,
            "expected the step to be one graph, saw {graphs}"
        );
        println!(
            "HOST neuron-pc trace_ms={:.3} mark_step_ms={:.3} (medians of {})",
            median(traced),
            median(cut),
            args.steps
        );
        return Ok(());
    }
    for i in 1..=args.warmup {
        step(i, &mut opt)?;
        device.synchronize()?;
    }
    let mut synced = Vec::new();
    let mut last_synced = None;
    let before = device.metrics();
    for i in 0..args.steps {
        let t = Instant::now();
        let loss = step(i, &mut opt)?;
        device.synchronize()?;
        synced.push(t.elapsed().as_secs_f64() * 1e3);
        last_synced = Some(loss);
    }
    // launch to completion per synced step: the device's share of `synced`
    let after = device.metrics();
    let execute_ms = (after.execute_ms - before.execute_ms)
        / (after.executions - before.executions).max(1) as f64;
    let round = (args.steps / 2).max(1);
    let mut pipelined = Vec::new();
    for _ in 0..args.rounds {
        let t = Instant::now();
        for i in 0..round {
            step(i, &mut opt)?;
        }
        device.synchronize()?;
        pipelined.push(t.elapsed().as_secs_f64() * 1e3 / round as f64);
    }
    let last = match last_synced {
        Some(loss) if args.rounds == 0 => loss.item()?,
        _ => step(0, &mut opt)?.item()?,
    };
    anyhow::ensure!(last.is_finite(), "the loss diverged: {last}");
    let graphs = device.metrics().graphs_seen;
    anyhow::ensure!(
        graphs == 1,
        "expected the step to be one graph, saw {graphs}"
    );
    let m = device.metrics();
    let pipelined = if pipelined.is_empty() {
        "n/a".to_string()
    } else {
        format!("{:.3}", median(pipelined))
    };
    let peak_rss = peak_rss_mib().map_or("n/a".to_string(), |v| format!("{v:.1}"));
    println!(
        "RESULT neuron-pc synced_ms={:.3} execute_ms={execute_ms:.3} pipelined_ms={pipelined} \
         compile_ms={:.1} params={} \
         active={} loss={last:.4} layout=fsdp{}_tp{}_ep{} device_bytes={} temp_bytes={} \
         remat={} precision={} loss_chunk={} scan_layers={} program_bytes={} \
         peak_rss_mib={peak_rss}",
        median(synced),
        compile_ms,
        config.num_parameters(),
        config.active_parameters(),
        args.fsdp,
        args.tp,
        args.ep,
        m.parameter_bytes + m.optimizer_state_bytes,
        m.step_temp_bytes,
        args.remat,
        args.precision,
        args.loss_chunk,
        args.scan_layers,
        m.last_program_bytes,
    );
    Ok(())
}
