//! The LLM building blocks (silu, rotary position embeddings, scaled-dot-product attention with
//! grouped-query heads, RMSNorm / LayerNorm with an explicit eps): values on the cpu plugin
//! against plain Rust loops written from the definitions (sharing no code with the library),
//! gradients against central finite differences in f64 (`grad_check/`), shape errors, and the
//! StableHLO of grouped-query attention (no kv head copied out to the query heads) and of the
//! softmax's backward pass (not through its maximum).
//!
//! Tolerances: f64 ops `1e-12 (1 + |want|)`; anything through the rotary tables, which are
//! float32 as in Hugging Face, `1e-5 (1 + |want|)` (an angle of position 12 carries ~1e-6 of
//! float32 rounding; a wrong convention, such as interleaved pairs instead of rotate-half, is
//! off by O(1)).

use crate::grad_check;
use crate::host_ref;
use neuron_pc_test_support::process::run_alone;

use grad_check::{device, Check};
use host_ref::{assert_close, ravel, unravel};
use neuron_pc::nn::{
    self, scaled_dot_product_attention as sdpa, HostRng, LayerNorm, RMSNorm, RotaryEmbedding,
};
use neuron_pc::{DType, LazyDevice, Tensor};

fn rand_vec(rng: &mut HostRng, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.uniform() * 2.0 - 1.0) * scale)
        .collect()
}

fn host(dev: &LazyDevice, v: &[f64], dims: &[usize]) -> Tensor {
    dev.from_slice(v, dims).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

/// Hugging Face's rotary embedding by its definition: pair `(j, j + d/2)` rotated by the angle
/// `pos * theta^(-2j/d)`. `x [b, h, s, d]`, `pos[b][s]`.
fn rope_ref(x: &[f64], dims: &[usize], pos: &[Vec<i32>], theta: f64) -> Vec<f64> {
    let d = dims[3];
    let half = d / 2;
    (0..x.len())
        .map(|o| {
            let idx = unravel(o, dims);
            let (bi, si, j) = (idx[0], idx[2], idx[3]);
            let i = j % half;
            let angle = pos[bi][si] as f64 / theta.powf((2 * i) as f64 / d as f64);
            let mut partner = idx.clone();
            let rotated = if j < half {
                partner[3] = j + half;
                -x[ravel(&partner, dims)]
            } else {
                partner[3] = j - half;
                x[ravel(&partner, dims)]
            };
            x[o] * angle.cos() + rotated * angle.sin()
        })
        .collect()
}

/// Attention by its definition, query head `h` reading kv head `h / (hq / hkv)`. `keep(b, h,
/// i, j)` false masks a key, `bias(b, h, i, j)` is added to the score.
#[allow(clippy::too_many_arguments)]
fn sdpa_ref(
    q: &[f64],
    qd: &[usize],
    k: &[f64],
    kd: &[usize],
    v: &[f64],
    vd: &[usize],
    keep: &dyn Fn(usize, usize, usize, usize) -> bool,
    bias: &dyn Fn(usize, usize, usize, usize) -> f64,
    scale: f64,
) -> (Vec<f64>, Vec<usize>) {
    let (b, hq, sq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let (hkv, sk, dv) = (kd[1], kd[2], vd[3]);
    let group = hq / hkv;
    let out_dims = vec![b, hq, sq, dv];
    let mut out = vec![0.0; b * hq * sq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..sq {
                let scores: Vec<f64> = (0..sk)
                    .map(|j| {
                        if !keep(bi, h, i, j) {
                            return f64::NEG_INFINITY;
                        }
                        let dot: f64 = (0..d)
                            .map(|c| q[ravel(&[bi, h, i, c], qd)] * k[ravel(&[bi, kh, j, c], kd)])
                            .sum();
                        dot * scale + bias(bi, h, i, j)
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..dv {
                    let acc: f64 = (0..sk)
                        .map(|j| e[j] / z * v[ravel(&[bi, kh, j, c], vd)])
                        .sum();
                    out[ravel(&[bi, h, i, c], &out_dims)] = acc;
                }
            }
        }
    }
    (out, out_dims)
}

#[test]
fn silu_and_norms_follow_their_definitions() {
    let dev = device();
    let mut rng = HostRng::new(5);
    let x = rand_vec(&mut rng, 12, 4.0);
    let want: Vec<f64> = x.iter().map(|v| v / (1.0 + (-v).exp())).collect();
    let t = host(&dev, &x, &[3, 4]);
    assert_close(&values(&t.silu().unwrap()), &want, 1e-12, "silu");
    assert_close(&values(&nn::silu(&t).unwrap()), &want, 1e-12, "nn::silu");

    // inputs of size ~1e-3, where the eps decides the result
    let n = 6;
    let x = rand_vec(&mut rng, 2 * n, 1e-3);
    let t = host(&dev, &x, &[2, n]);
    let rms = |eps: f64| -> Vec<f64> {
        x.chunks(n)
            .flat_map(|row| {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
                row.iter().map(move |v| v / (ms + eps).sqrt())
            })
            .collect()
    };
    let ln = |eps: f64| -> Vec<f64> {
        x.chunks(n)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                row.iter().map(move |v| (v - mean) / (var + eps).sqrt())
            })
            .collect()
    };
    // f64 weights so the whole computation stays in f64
    let f64_weights = |w: &Tensor| w.to_dtype(DType::F64).unwrap();
    for (what, eps, layer) in [
        (
            "RMSNorm::with_eps(1e-6)",
            1e-6,
            RMSNorm::with_eps(&dev, n, 1e-6),
        ),
        // PyTorch's default for an f64 input: the f64 machine epsilon
        ("RMSNorm::new", f64::EPSILON, RMSNorm::new(&dev, n)),
    ] {
        let layer = layer.unwrap();
        let layer = RMSNorm {
            weight: f64_weights(&layer.weight),
            eps: layer.eps,
        };
        assert_close(&values(&layer.forward(&t).unwrap()), &rms(eps), 1e-12, what);
    }
    for (what, eps, layer) in [
        (
            "LayerNorm::with_eps(1e-6)",
            1e-6,
            LayerNorm::with_eps(&dev, n, 1e-6),
        ),
        ("LayerNorm::new (1e-5)", 1e-5, LayerNorm::new(&dev, n)),
    ] {
        let layer = layer.unwrap();
        let layer = LayerNorm {
            weight: f64_weights(&layer.weight),
            bias: f64_weights(&layer.bias),
            eps: layer.eps,
        };
        assert_close(&values(&layer.forward(&t).unwrap()), &ln(eps), 1e-12, what);
    }
    // the two eps give visibly different results at this scale
    assert!((rms(1e-6)[0] - rms(f64::EPSILON)[0]).abs() > 0.1);

    // a last dimension other than the normalised size is an error naming both shapes
    let e = RMSNorm::with_eps(&dev, n + 1, 1e-6)
        .unwrap()
        .forward(&t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rms_norm") && e.contains("f64[2,6]") && e.contains("f32[7]"),
        "{e}"
    );
    let e = LayerNorm::with_eps(&dev, 1, 1e-6)
        .unwrap()
        .forward(&t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layer_norm") && e.contains("normalised size 1"),
        "{e}"
    );
}

#[test]
fn the_rotary_tables_are_the_plain_cosine_and_sine_bit_for_bit() {
    // `cos_sin` multiplies each table by the identity (so that XLA computes it once); the
    // product must leave every bit of the table, in both position-id forms, at a length
    // where any rounding in the product would show
    let dev = device();
    let d = 64;
    let rope = RotaryEmbedding::new(&dev, d, 10_000.0).unwrap();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / 10_000f32.powf((2 * i) as f32 / d as f32))
        .collect();
    let inv = dev.from_slice(&inv, &[d / 2]).unwrap();
    let ids: Vec<i32> = (0..600).map(|i| i * 7 + 3).collect();
    for dims in [vec![600], vec![3, 200]] {
        let ids = dev.from_slice(&ids, &dims).unwrap();
        let (cos, sin) = rope.cos_sin(&ids).unwrap();
        let f = ids
            .to_dtype(DType::F32)
            .unwrap()
            .unsqueeze(-1)
            .unwrap()
            .mul(&inv)
            .unwrap();
        let emb = Tensor::cat(&[&f, &f], -1).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_host()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&cos), bits(&emb.cos().unwrap()), "cos, ids {dims:?}");
        assert_eq!(bits(&sin), bits(&emb.sin().unwrap()), "sin, ids {dims:?}");
    }
}

#[test]
fn rotary_embedding_follows_hugging_face() {
    let dev = device();
    let mut rng = HostRng::new(6);
    let (b, h, s, d) = (2, 3, 4, 8);
    let dims = [b, h, s, d];
    let x = rand_vec(&mut rng, b * h * s * d, 1.0);
    let xt = host(&dev, &x, &dims);
    for theta in [10_000.0, 500_000.0] {
        let rope = RotaryEmbedding::new(&dev, d, theta).unwrap();
        let pos = vec![vec![0, 1, 2, 3], vec![9, 10, 11, 12]];
        let flat: Vec<i32> = pos.concat();
        let ids = dev.from_slice(&flat, &[b, s]).unwrap();
        let want = rope_ref(&x, &dims, &pos, theta);
        let (qr, kr) = rope.forward(&xt, &xt, &ids).unwrap();
        assert_eq!(qr.dims(), &dims);
        assert_close(&values(&qr), &want, 1e-5, &format!("rope q, theta {theta}"));
        assert_close(&values(&kr), &want, 1e-5, &format!("rope k, theta {theta}"));
        // ids of shape [s] are shared by the batch
        let ids = dev.from_slice(&[9, 10, 11, 12], &[s]).unwrap();
        let (cos, sin) = rope.cos_sin(&ids).unwrap();
        assert_eq!((cos.dims(), cos.dtype()), (&[s, d][..], DType::F32));
        let y = nn::apply_rotary_pos_emb(&xt, &cos, &sin).unwrap();
        let shared = rope_ref(&x, &dims, &[pos[1].clone(), pos[1].clone()], theta);
        assert_close(&values(&y), &shared, 1e-5, "rope, ids [s]");
    }
    // position 0 is the identity, and rotate_half is (-x2, x1)
    let half = nn::rotate_half(&host(&dev, &[1.0, 2.0, 3.0, 4.0], &[4])).unwrap();
    assert_eq!(values(&half), [-3.0, -4.0, 1.0, 2.0]);

    // errors name the op and the shapes
    assert!(RotaryEmbedding::new(&dev, 7, 1e4).is_err());
    let rope = RotaryEmbedding::new(&dev, d, 1e4).unwrap();
    let float_ids = host(&dev, &[0.0, 1.0, 2.0, 3.0], &[s]);
    let e = rope.cos_sin(&float_ids).unwrap_err().to_string();
    assert!(
        e.contains("rotary_embedding") && e.contains("f64[4]"),
        "{e}"
    );
    let ids = dev.from_slice(&[0i32, 1, 2], &[3]).unwrap();
    let e = rope.forward(&xt, &xt, &ids).unwrap_err().to_string();
    assert!(
        e.contains("apply_rotary_pos_emb") && e.contains("f64[2,3,4,8]"),
        "{e}"
    );
    assert!(
        e.contains("llm_blocks.rs"),
        "reported at the caller's line: {e}"
    );
}

#[test]
fn a_shifted_window_reuses_the_rotary_graph() {
    let dev = LazyDevice::new(neuron_pc::DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..neuron_pc::DeviceConfig::default()
    })
    .unwrap();
    let mut rng = HostRng::new(7);
    let dims = [1, 2, 5, 4];
    let x = rand_vec(&mut rng, 40, 1.0);
    let rope = RotaryEmbedding::new(&dev, 4, 10_000.0).unwrap();
    let xt = host(&dev, &x, &dims);
    let mut compiles = Vec::new();
    for start in [0, 5, 37] {
        let pos: Vec<i32> = (start..start + 5).collect();
        let ids = dev.from_slice(&pos, &[1, 5]).unwrap();
        let (y, _) = rope.forward(&xt, &xt, &ids).unwrap();
        dev.mark_step().unwrap();
        compiles.push(dev.metrics().compiles);
        let want = rope_ref(&x, &dims, &[pos], 10_000.0);
        assert_close(&values(&y), &want, 1e-5, &format!("window at {start}"));
    }
    assert_eq!(
        compiles,
        [1, 1, 1],
        "new position ids must not make a new graph"
    );
}

#[test]
fn attention_follows_its_definition() {
    let dev = device();
    let mut rng = HostRng::new(8);
    let all = |_: usize, _: usize, _: usize, _: usize| true;
    let zero = |_: usize, _: usize, _: usize, _: usize| 0.0;
    // (q dims, kv heads, keys, value dim)
    for (qd, hkv, sk, dv) in [
        ([2, 4, 5, 3], 2, 5, 3),
        ([1, 6, 3, 4], 2, 5, 2),
        ([2, 3, 4, 2], 3, 4, 2),
        ([1, 4, 2, 4], 1, 6, 3),
    ] {
        let kd = [qd[0], hkv, sk, qd[3]];
        let vd = [qd[0], hkv, sk, dv];
        let n = |d: &[usize]| d.iter().product::<usize>();
        let (q, k, v) = (
            rand_vec(&mut rng, n(&qd), 1.5),
            rand_vec(&mut rng, n(&kd), 1.5),
            rand_vec(&mut rng, n(&vd), 1.0),
        );
        let (qt, kt, vt) = (
            host(&dev, &q, &qd),
            host(&dev, &k, &kd),
            host(&dev, &v, &vd),
        );
        let what = format!("q {qd:?}, k {kd:?}, v {vd:?}");
        let scale = 1.0 / (qd[3] as f64).sqrt();

        let (want, want_dims) = sdpa_ref(&q, &qd, &k, &kd, &v, &vd, &all, &zero, scale);
        let y = sdpa(&qt, &kt, &vt, None, false, None).unwrap();
        assert_eq!(y.dims(), &want_dims[..], "{what}");
        assert_close(&values(&y), &want, 1e-12, &what);

        let causal = |_: usize, _: usize, i: usize, j: usize| j <= i;
        let (want, _) = sdpa_ref(&q, &qd, &k, &kd, &v, &vd, &causal, &zero, 0.7);
        let y = sdpa(&qt, &kt, &vt, None, true, Some(0.7)).unwrap();
        assert_close(
            &values(&y),
            &want,
            1e-12,
            &format!("{what}, causal, scale 0.7"),
        );

        // a boolean padding mask [b, 1, 1, sk]: the last key of batch 0 is padding
        let pad: Vec<u8> = (0..qd[0] * sk).map(|i| u8::from(i != sk - 1)).collect();
        let keep_t = dev.from_slice(&pad, &[qd[0], 1, 1, sk]).unwrap();
        let keep_t = keep_t.ne(&keep_t.zeros_like().unwrap()).unwrap();
        let keep = |bi: usize, _: usize, _: usize, j: usize| pad[bi * sk + j] != 0;
        let (want, _) = sdpa_ref(&q, &qd, &k, &kd, &v, &vd, &keep, &zero, scale);
        let y = sdpa(&qt, &kt, &vt, Some(&keep_t), false, None).unwrap();
        assert_close(&values(&y), &want, 1e-12, &format!("{what}, boolean mask"));

        // an additive mask [sq, sk], broadcast over batch and heads, together with causal
        let bias_v = rand_vec(&mut rng, qd[2] * sk, 2.0);
        let bias_t = host(&dev, &bias_v, &[qd[2], sk]);
        let bias = |_: usize, _: usize, i: usize, j: usize| bias_v[i * sk + j];
        let (want, _) = sdpa_ref(&q, &qd, &k, &kd, &v, &vd, &causal, &bias, scale);
        let y = sdpa(&qt, &kt, &vt, Some(&bias_t), true, None).unwrap();
        assert_close(
            &values(&y),
            &want,
            1e-12,
            &format!("{what}, additive + causal"),
        );
    }
}

#[test]
fn attention_shape_errors_name_the_op_and_shapes() {
    let dev = device();
    let z = |d: &[usize]| dev.zeros(d, DType::F32).unwrap();
    let (q, k, v) = (z(&[1, 4, 3, 2]), z(&[1, 3, 3, 2]), z(&[1, 3, 3, 2]));
    let e = sdpa(&q, &k, &v, None, false, None).unwrap_err().to_string();
    assert!(
        e.contains("scaled_dot_product_attention")
            && e.contains("f32[1,4,3,2], f32[1,3,3,2]")
            && e.contains("3 key/value heads must divide the 4 query heads")
            && e.contains("llm_blocks.rs"),
        "{e}"
    );
    let (k, v) = (z(&[1, 2, 3, 2]), z(&[1, 2, 3, 2]));
    let bad_mask = z(&[2, 3]);
    let e = sdpa(&q, &k, &v, Some(&bad_mask), false, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mask f32[2,3]") && e.contains("broadcast to [1, 4, 3, 3]"),
        "{e}"
    );
    let e = sdpa(&q, &z(&[1, 2, 3, 5]), &v, None, false, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("same head dimension (2 vs 5)"), "{e}");
    let e = sdpa(&z(&[4, 3, 2]), &k, &v, None, false, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("q must have rank 4"), "{e}");
    let int_mask = dev.zeros(&[3, 3], DType::I32).unwrap();
    assert!(sdpa(&q, &k, &v, Some(&int_mask), false, None).is_err());
}

#[test]
fn llm_block_gradients() {
    let c = Check::new(19);
    c.op("silu", &[c.rand(&[3, 4], -4.0, 4.0)], |x| x[0].silu());
    let ids = c.i32s(&[3, 4, 5, 11, 12, 13], &[2, 3]);
    c.op(
        "rotary embedding",
        &[
            c.rand(&[2, 2, 3, 4], -1.0, 1.0),
            c.rand(&[2, 1, 3, 4], -1.0, 1.0),
        ],
        |x| {
            let rope = RotaryEmbedding::new(&x[0].device()?, 4, 10_000.0)?;
            let (q, k) = rope.forward(&x[0], &x[1], &ids)?;
            Tensor::cat(&[&q, &k], 1)
        },
    );
    let qkv = |hq: usize, hkv: usize, sq: usize, sk: usize| {
        vec![
            c.rand(&[1, hq, sq, 3], -1.5, 1.5),
            c.rand(&[1, hkv, sk, 3], -1.5, 1.5),
            c.rand(&[1, hkv, sk, 2], -1.0, 1.0),
        ]
    };
    c.op("attention, gqa, causal", &qkv(4, 2, 3, 3), |x| {
        sdpa(&x[0], &x[1], &x[2], None, true, None)
    });
    let keep = c.i32s(&[1, 1, 0, 1], &[1, 1, 1, 4]);
    let keep = keep.ne(&keep.zeros_like().unwrap()).unwrap();
    c.op("attention, boolean mask, scale", &qkv(2, 1, 2, 4), |x| {
        sdpa(&x[0], &x[1], &x[2], Some(&keep), false, Some(0.4))
    });
    let mut inputs = qkv(3, 3, 2, 3);
    inputs.push(c.rand(&[2, 3], -1.0, 1.0));
    c.op(
        "attention, additive mask (and its gradient)",
        &inputs,
        |x| sdpa(&x[0], &x[1], &x[2], Some(&x[3]), false, None),
    );
    // inputs of size ~0.01 with eps 1e-4, where the eps matters
    c.op(
        "rms norm, eps 1e-4",
        &[c.rand(&[2, 5], -0.01, 0.01), c.rand(&[5], 0.5, 1.5)],
        |x| {
            RMSNorm {
                weight: x[1].clone(),
                eps: Some(1e-4),
            }
            .forward(&x[0])
        },
    );
    c.op(
        "layer norm, eps 1e-4",
        &[
            c.rand(&[2, 5], -0.01, 0.01),
            c.rand(&[5], 0.5, 1.5),
            c.rand(&[5], -0.5, 0.5),
        ],
        |x| {
            LayerNorm {
                weight: x[1].clone(),
                bias: x[2].clone(),
                eps: 1e-4,
            }
            .forward(&x[0])
        },
    );
    c.finish();
}

/// The StableHLO of the step that `record` traces (in a trial run: nothing runs). `record`
/// gets a maker of uploaded zeros (uploads, not constants, which the lowering would fold
/// away) and returns the values the step must compute.
fn step_text(
    name: &str,
    record: impl FnOnce(&dyn Fn(&[usize]) -> Tensor) -> Vec<Tensor>,
) -> String {
    let dir = std::env::temp_dir().join(format!("npc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = LazyDevice::new(neuron_pc::DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        extract_dir: Some(dir.clone()),
        ..neuron_pc::DeviceConfig::default()
    })
    .unwrap();
    let z = |d: &[usize]| {
        dev.tensor(&neuron_pc::HostTensor::zeros(DType::F32, d))
            .unwrap()
    };
    let _pending = record(&z);
    dev.mark_step().unwrap();
    let mlir: String = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "mlir"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    mlir
}

#[test]
fn grouped_query_attention_never_repeats_the_kv_heads() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(
        module_path!(),
        "grouped_query_attention_never_repeats_the_kv_heads",
    ) {
        return;
    }
    // 8 query heads over 2 kv heads, 3 queries, 5 keys, head dim 4
    let mlir = step_text("gqa", |z| {
        vec![sdpa(
            &z(&[1, 8, 3, 4]),
            &z(&[1, 2, 5, 4]),
            &z(&[1, 2, 5, 4]),
            None,
            true,
            None,
        )
        .unwrap()]
    });
    // both products batch over the 2 kv heads, with the 4 query heads of a group stacked
    assert_eq!(mlir.matches("stablehlo.dot_general").count(), 2, "{mlir}");
    assert!(
        mlir.contains("(tensor<1x2x12x4xf32>, tensor<1x2x5x4xf32>)"),
        "{mlir}"
    );
    assert!(
        mlir.contains("(tensor<1x2x12x5xf32>, tensor<1x2x5x4xf32>)"),
        "{mlir}"
    );
    // k or v copied out to the 8 query heads would have one of these types
    for repeated in ["tensor<1x8x5x4xf32>", "tensor<1x2x4x5x4xf32>"] {
        assert!(!mlir.contains(repeated), "{repeated} in\n{mlir}");
    }
}

/// The softmax's backward pass does not go through the maximum it subtracts (the softmax does
/// not depend on it): no equality comparison with the maximum to route a gradient to it. Its
/// values are checked against finite differences in `llm_block_gradients` and the losses.
#[test]
fn the_softmax_gradient_skips_the_shift() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(module_path!(), "the_softmax_gradient_skips_the_shift") {
        return;
    }
    let grad_of = |f: fn(&Tensor, isize) -> neuron_pc::Result<Tensor>| {
        step_text("softmax-grad", |z| {
            let x = z(&[3, 7]);
            let y = f(&x, -1).unwrap();
            let loss = y.mul(&z(&[3, 7])).unwrap().sum_all().unwrap();
            neuron_pc::grad(&loss, &[&x]).unwrap()
        })
    };
    for (name, mlir) in [
        ("softmax", grad_of(nn::softmax)),
        ("log_softmax", grad_of(nn::log_softmax)),
    ] {
        // the maximum's own reduction compares with NE (NaN); the gradient through it with EQ
        assert!(mlir.contains("stablehlo.reduce"), "{name}:\n{mlir}");
        assert!(!mlir.contains("stablehlo.compare EQ"), "{name}:\n{mlir}");
    }
}
