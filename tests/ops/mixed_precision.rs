//! bf16 mixed precision with float32 master weights (`LazyDevice::autocast`) against PyTorch's
//! `torch.autocast("cpu", dtype=torch.bfloat16)` around `transformers`' `LlamaForCausalLM`,
//! float32 parameters and AdamW: `tests/data/torch/llama_bf16.safetensors`, written by
//! `scripts/fixtures/llama_bf16.py` from the model `tests/data/llama-tiny` and the batches of
//! `tests/data/torch/llama.safetensors`.
//!
//! Tolerances: the logits must be nearer PyTorch's autocast logits than a quarter of the gap
//! between PyTorch's autocast and float32 logits (computing in float32, or rounding at other
//! points, lands at that gap), in the mean over the elements (a logit one bf16 step away from
//! PyTorch's is 0.0078 at magnitude 1). Measured: 1.45e-4 against a gap of 1.15e-3 (before
//! `silu` rounded once in float32, as PyTorch's kernel does, 7.8e-4). The rest is not bit for
//! bit: some rounding point still differs, not located yet. The
//! loss within 1%; 20 training losses within 1% each and 0.5% on average (measured 0.77%
//! and 0.19%; since bf16 products run as float32 ones rounded once on cpu, 0.48% and 0.12%),
//! the first step's within 1e-4. bf16 rounding makes training trajectories drift
//! apart: PyTorch's own autocast and float32 runs of these 20 steps differ by up to 0.6%.

use crate::torch_fixture;

use std::path::Path;

use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, Tensor};
use torch_fixture::Fixture;

fn tiny(fx: &Fixture) -> LlamaForCausalLM {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama-tiny");
    LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

/// The mean absolute difference.
fn mean_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / a.len() as f64
}

#[test]
fn autocast_logits_and_loss_match_pytorch_autocast() {
    let fx = Fixture::load("llama_bf16");
    let batch = Fixture::load("llama");
    let model = tiny(&fx);
    let ids = fx.dev.tensor(batch.host("batch.input_ids")).unwrap();
    let mask = fx.dev.tensor(batch.host("batch.attention_mask")).unwrap();
    let labels = fx.dev.tensor(batch.host("batch.labels")).unwrap();
    let (loss, logits) = fx
        .dev
        .autocast(Some(DType::BF16), || {
            model.forward_loss(&ids, None, Some(&mask), &labels)
        })
        .unwrap();
    assert_eq!(fx.dev.autocast_dtype(), None, "restored after the closure");
    let plain = model.forward(&ids, None, Some(&mask)).unwrap();
    fx.dev.mark_step().unwrap();
    assert_eq!(
        logits.dtype(),
        DType::BF16,
        "the head's product is a bf16 result"
    );
    assert_eq!(plain.dtype(), DType::F32);
    let torch_bf16 = fx.host("logits.autocast").to_f64_vec();
    let torch_f32 = fx.host("logits.f32").to_f64_vec();
    let gap = mean_diff(&torch_bf16, &torch_f32);
    let ours = mean_diff(&values(&logits), &torch_bf16);
    let ours_f32 = mean_diff(&values(&plain), &torch_bf16);
    println!("logits vs torch autocast: ours {ours:e}, our f32 {ours_f32:e}, torch's gap {gap:e}");
    assert!(
        gap > 5e-4,
        "the fixture's bf16 and f32 logits differ: {gap}"
    );
    assert!(
        ours <= 0.25 * gap,
        "ours {ours} vs the autocast/f32 gap {gap}"
    );
    // the float32 forward is not within that bound: the test tells the two apart
    assert!(
        ours_f32 > 0.25 * gap,
        "float32 logits {ours_f32} vs gap {gap}"
    );
    let want = fx.host("loss.autocast").to_f64_vec()[0];
    let got = loss.item().unwrap();
    assert!(
        (got - want).abs() <= 1e-2 * want,
        "loss {got} vs torch {want}"
    );
}

#[test]
fn twenty_autocast_adamw_steps_follow_pytorch_with_float32_master_weights() {
    let fx = Fixture::load("llama_bf16");
    let batches = Fixture::load("llama");
    let model = tiny(&fx);
    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let mut opt = AdamW::new(&fx.dev, &params, 0.1).unwrap();
    opt.beta2 = 0.95;
    let lr = fx.dev.scalar(1e-2, DType::F32).unwrap();
    let all = batches.host("train.input_ids");
    let (steps, rows, seq) = (20, all.dims()[1], all.dims()[2]);
    let row_bytes = rows * seq * 4;
    let mut losses = Vec::new();
    for i in 0..steps {
        let bytes = all.bytes()[i * row_bytes..(i + 1) * row_bytes].to_vec();
        let host = HostTensor::from_bytes(DType::I32, &[rows, seq], bytes).unwrap();
        let ids = fx.dev.tensor(&host).unwrap();
        let loss = fx
            .dev
            .autocast(Some(DType::BF16), || model.loss(&ids, None, &ids))
            .unwrap();
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
        for (g, p) in grads.iter().zip(&params) {
            assert_eq!(
                g.dtype(),
                DType::F32,
                "a master weight's gradient is float32"
            );
            assert_eq!(p.dtype(), DType::F32);
        }
        opt.step(&params, &grads, &lr).unwrap();
        drop(grads);
        fx.dev.mark_step().unwrap();
        losses.push(loss.item().unwrap());
    }
    let want = fx.host("train.losses").to_f64_vec();
    let f32_losses = fx.host("train.losses_f32").to_f64_vec();
    let mut worst = 0f64;
    for (i, (got, w)) in losses.iter().zip(&want).enumerate() {
        let rel = (got - w).abs() / w;
        worst = worst.max(rel);
        assert!(rel <= 1e-2, "step {}: {got} vs torch autocast {w}", i + 1);
    }
    // the first step is one forward pass from the same weights: bf16 rounding alone
    let first = (losses[0] - want[0]).abs() / want[0];
    assert!(first <= 1e-4, "step 1: {} vs {}", losses[0], want[0]);
    let mean = losses
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs() / w)
        .sum::<f64>()
        / steps as f64;
    assert!(mean <= 5e-3, "mean relative difference {mean}");
    println!(
        "20 steps: largest relative difference {worst:e}, mean {mean:e}; last loss {} (torch \
         autocast {}, torch f32 {})",
        losses[steps - 1],
        want[steps - 1],
        f32_losses[steps - 1]
    );
    assert!(losses[steps - 1] < 0.8 * losses[0], "it trains: {losses:?}");
}

#[test]
fn autocast_to_a_dtype_that_is_not_lower_precision_is_one_clear_error() {
    let fx = Fixture::load("llama_bf16");
    let e = fx
        .dev
        .autocast(Some(DType::F32), || Ok(()))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "autocast: f32 is not a lower precision to compute in (bf16 or f16)"
    );
    // and a closure's error leaves the setting as it was
    let r: neuron_pc::Result<()> = fx.dev.autocast(Some(DType::BF16), || {
        Err(neuron_pc::Error::Config("inside".into()))
    });
    assert!(r.is_err());
    assert_eq!(fx.dev.autocast_dtype(), None);
}

/// `x` rounded to the nearest bf16 (ties to even), as a float32.
fn bf16(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

/// On cpu a bf16 product runs as a float32 one of the bf16 operands (`half_products_in_f32`);
/// its result must still be rounded to bf16 where a bf16 kernel's is, before the bf16 ops that
/// use it (a gate's product, `silu`): XLA computes those in float32 too, and with excess
/// precision allowed it drops the round trip through bf16 between the two.
#[test]
fn a_bf16_projection_is_rounded_before_the_bf16_ops_that_use_it() {
    let fx = Fixture::load("llama");
    let (b, s, k, n) = (2usize, 4usize, 96usize, 8usize);
    let xs: Vec<f32> = (0..b * s * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 1.37)
        .collect();
    let ws: Vec<f32> = (0..n * k)
        .map(|i| ((i * 104_729 % 997) as f32 / 997.0 - 0.5) * 0.91)
        .collect();
    let up = |v: &[f32], dims: &[usize]| {
        fx.dev
            .tensor(&HostTensor::from_slice(v, dims).unwrap())
            .unwrap()
    };
    let (x, w) = (up(&xs, &[b, s, k]), up(&ws, &[n, k]));
    let y = fx
        .dev
        .autocast(Some(DType::BF16), || x.linear(&w, None))
        .unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    // a bf16 elementwise op of the product: y * y + y, rounded after each op
    let z = y.mul(&y).unwrap().add(&y).unwrap();
    let got = z.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let mut unrounded_differs = 0;
    for r in 0..b * s {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|c| bf16(xs[r * k + c]) as f64 * bf16(ws[j * k + c]) as f64)
                .sum();
            let p = bf16(dot as f32);
            let want = bf16(bf16(p * p) + p);
            assert_eq!(got[r * n + j], want, "row {r} column {j}: product {dot}");
            let d = dot as f32;
            unrounded_differs += usize::from(bf16(d * d + d) != want);
        }
    }
    // the roundings are visible: without them some results differ
    assert!(unrounded_differs > 0, "{unrounded_differs}");
}
