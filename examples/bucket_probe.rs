//! A tiny token model on variable-length data padded to length buckets, for the tests and
//! benchmarks of `neuron-pc compile` and `analyze` with buckets.
//!
//! ```text
//! neuron-pc compile -- target/debug/examples/bucket_probe --buckets 16,32,64 --steps 3
//! target/debug/examples/bucket_probe --buckets 16,32,64 --steps 20 --json
//! ```
//! Each step trains an embedding and an output projection on one batch of 8 sequences of
//! random lengths (2 to the largest bucket) to predict each next token. Prints one
//! `{"step": N, "loss": X, "tokens": T, "length": L}` line per step and, with `--json`, a
//! `METRICS {...}` line. Without `--buckets` every batch is padded to its own longest sequence
//! (one graph per length: what buckets avoid).

use neuron_pc::data::{DeviceLoader, LastBatch, LengthBuckets, PaddedTokens};
use neuron_pc::nn::cross_entropy;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Tensor};

const VOCAB: usize = 32;
const DIM: usize = 16;
const ROWS: usize = 8;

fn main() -> anyhow::Result<()> {
    let mut steps = 10u64;
    let mut buckets = None;
    let mut max_len = 64usize;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--steps" => steps = value()?.parse()?,
            "--buckets" => buckets = Some(LengthBuckets::parse(&value()?)?),
            "--max-len" => max_len = value()?.parse()?,
            "--json" => json = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let max_len = buckets.as_ref().map_or(max_len, LengthBuckets::max);
    let device = LazyDevice::from_env()?;
    let init = |seed: u64, dims: [usize; 2]| -> neuron_pc::Result<Tensor> {
        let v: Vec<f32> = (0..dims[0] * dims[1])
            .map(|i| ((seed * 7919 + i as u64 * 104_729) % 1000) as f32 / 2000.0 - 0.25)
            .collect();
        device.tensor(&HostTensor::from_slice(&v, &dims)?)
    };
    let params = [init(1, [VOCAB, DIM])?, init(2, [DIM, VOCAB])?];
    let mut opt = AdamW::new(&device, &params, 0.0)?;
    let lr = device.scalar(1e-2, DType::F32)?;
    // A reproducible stream: lengths from a small linear congruential generator.
    // splitmix64 of (a, b): reproducible pseudo-random lengths
    let mix = |a: u64, b: u64| {
        let mut z = (a << 20 ^ b).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let stream = (0..steps).map(move |s| {
        // each batch's longest sequence varies, as in real data sorted into batches
        let longest = 2 + (mix(s, 7) as usize) % (max_len - 1);
        (0..ROWS)
            .map(|r| {
                let len = 2 + (mix(s, r as u64 + 11) as usize) % (longest - 1);
                (0..len).map(|t| ((t * 3 + r) % VOCAB) as i32).collect()
            })
            .collect::<Vec<Vec<i32>>>()
    });
    let batches: Box<dyn Iterator<Item = neuron_pc::Result<PaddedTokens>> + Send> = match buckets {
        Some(b) => Box::new(b.batches(stream, ROWS, 0)),
        // every batch padded to its own longest sequence: one bucket per length
        None => {
            let each = LengthBuckets::new(2..=max_len)?;
            Box::new(stream.map(move |batch| each.pad(&batch, 0)))
        }
    };
    let loader = DeviceLoader::for_tokens(&device, batches, ROWS, LastBatch::Drop, 2);
    for (step, batch) in (0..steps).zip(loader) {
        let batch = batch?;
        let [ids, _mask, labels] = &batch.tensors[..] else {
            anyhow::bail!("a token batch has three tensors")
        };
        let length = ids.dims()[1];
        let h = params[0].index_select_rows(ids)?;
        let logits = h.matmul(&params[1])?;
        // predict token t + 1 from token t: logits[:, :-1] against labels[:, 1:]
        let logits = logits.narrow(1, 0, length - 1)?;
        let targets = labels.narrow(1, 1, length - 1)?;
        let loss = cross_entropy(&logits, &targets)?;
        let g = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(&params, &g, &lr)?;
        device.mark_step()?;
        println!(
            "{{\"step\": {}, \"loss\": {:.9e}, \"tokens\": {}, \"length\": {length}}}",
            step + 1,
            loss.item()?,
            batch.tokens.unwrap_or(0)
        );
    }
    if json {
        println!("METRICS {}", serde_json::to_string(&device.metrics())?);
    }
    Ok(())
}
