//! `nn::scan`: one loop in the step graph whose values and gradients are the unrolled loop's,
//! for every policy of what the backward loop keeps, forward and in reverse, with stacked
//! outputs, invariants and integer operands; bad loops are one error naming the shapes.

use neuron_pc::compile::CacheConfig;
use neuron_pc::nn::{scan, Remat, ScanOptions};
use neuron_pc::{grad, DeviceConfig, HostTensor, LazyDevice, Tensor};

fn device() -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    })
    .unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

fn random(dev: &LazyDevice, dims: &[usize], seed: u64) -> Tensor {
    let mut rng = neuron_pc::nn::HostRng::new(seed);
    let n: usize = dims.iter().product();
    let v = rng.uniform_vec(n, 1.0);
    dev.tensor(&HostTensor::from_slice(&v, dims).unwrap())
        .unwrap()
}

/// One layer: `h' = tanh(p + b) * sigmoid(p) * scale + h` with `p = h . w`, and the per-layer
/// output `sum(h')`. The backward loop reads `p` back and computes `sigmoid(p)` again rather
/// than reading a stacked copy (a function of one kept value), as SwiGLU's gate.
fn layer(h: &Tensor, w: &Tensor, b: &Tensor, scale: &Tensor) -> (Tensor, Tensor) {
    let p = h.matmul(w).unwrap();
    let y = p.add(b).unwrap().tanh().unwrap();
    let y = y.mul(&p.sigmoid().unwrap()).unwrap();
    let next = y.mul(scale).unwrap().add(h).unwrap();
    let s = next.sum_all().unwrap();
    (next, s)
}

struct Case {
    h: Tensor,
    w: Tensor,
    b: Tensor,
    scale: Tensor,
}

fn case(dev: &LazyDevice, layers: usize) -> Case {
    Case {
        h: random(dev, &[3, 8], 1),
        w: random(dev, &[layers, 8, 8], 2),
        b: random(dev, &[layers, 1, 8], 3),
        scale: random(dev, &[3, 8], 4),
    }
}

/// The loss `sum(final h^2) + sum_i (i + 1) * s_i`, the final `h`, and the gradients with
/// respect to `h`, `w`, `b` and `scale`: by a scan, or (`None`) by a loop unrolled in the
/// same order.
fn loss_and_grads(
    dev: &LazyDevice,
    c: &Case,
    reverse: bool,
    remat: Option<Remat>,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let layers = c.w.dims()[0];
    let (h, sums) = match remat {
        Some(remat) => {
            let options = ScanOptions { reverse, remat };
            let (h, ys) = scan(&[&c.h], &[&c.w, &c.b], options, |h, x| {
                let (next, s) = layer(&h[0], &x[0], &x[1], &c.scale);
                Ok((vec![next], vec![s]))
            })
            .unwrap();
            (h[0].clone(), ys[0].clone())
        }
        None => {
            let mut h = c.h.clone();
            let mut sums = vec![None; layers];
            let order: Vec<usize> = match reverse {
                false => (0..layers).collect(),
                true => (0..layers).rev().collect(),
            };
            for i in order {
                let w = c.w.narrow(0, i, 1).unwrap().reshape(&[8, 8]).unwrap();
                let b = c.b.narrow(0, i, 1).unwrap().reshape(&[1, 8]).unwrap();
                let (next, s) = layer(&h, &w, &b, &c.scale);
                sums[i] = Some(s.reshape(&[1]).unwrap());
                h = next;
            }
            let sums: Vec<Tensor> = sums.into_iter().map(Option::unwrap).collect();
            let refs: Vec<&Tensor> = sums.iter().collect();
            (h, Tensor::cat(&refs, 0).unwrap())
        }
    };
    let weights: Vec<f32> = (0..layers).map(|i| i as f32 + 1.0).collect();
    let weights = dev
        .tensor(&HostTensor::from_slice(&weights, &[layers]).unwrap())
        .unwrap();
    let loss = h
        .mul(&h)
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&sums.mul(&weights).unwrap().sum_all().unwrap())
        .unwrap();
    let grads = grad(&loss, &[&c.h, &c.w, &c.b, &c.scale]).unwrap();
    dev.mark_step().unwrap();
    let mut out = values(&loss);
    out.extend(values(&h));
    (out, grads.iter().map(values).collect())
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{what}: all zero tests nothing");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-6 * scale,
            "{what}: {g} vs {w} (scale {scale})"
        );
    }
}

#[test]
fn a_scan_gives_the_unrolled_values_and_gradients_for_every_policy() {
    let dev = device();
    let c = case(&dev, 5);
    for reverse in [false, true] {
        let (want_v, want_g) = loss_and_grads(&dev, &c, reverse, None);
        for remat in [Remat::None, Remat::Full, Remat::Dots] {
            let (v, g) = loss_and_grads(&dev, &c, reverse, Some(remat));
            let what = format!("reverse={reverse} remat={remat}");
            assert_close(&format!("{what}: loss and h"), &v, &want_v);
            for (k, (got, want)) in g.iter().zip(&want_g).enumerate() {
                assert_close(&format!("{what}: gradient {k}"), got, want);
            }
        }
    }
}

#[test]
fn bad_loops_are_one_error_naming_the_shapes() {
    let dev = device();
    let c = case(&dev, 3);
    let message = |r: neuron_pc::Result<(Vec<Tensor>, Vec<Tensor>)>| match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    let empty = random(&dev, &[0, 8], 5);
    let m = message(scan(&[&c.h], &[&empty], ScanOptions::default(), |h, _| {
        Ok((h.to_vec(), vec![]))
    }));
    assert!(m.contains("trip count of 0"), "{m}");
    let m = message(scan(&[&c.h], &[&c.w], ScanOptions::default(), |h, w| {
        Ok((vec![h[0].matmul(&w[0])?.narrow(0, 0, 2)?], vec![]))
    }));
    assert!(
        m.contains("changes carry 0 from f32[3,8] to f32[2,8]"),
        "{m}"
    );
    let short = random(&dev, &[2, 8], 6);
    let m = message(scan(
        &[&c.h],
        &[&c.w, &short],
        ScanOptions::default(),
        |h, _| Ok((h.to_vec(), vec![])),
    ));
    assert!(
        m.contains("scanned operand 1 is f32[2,8], not 3 slices"),
        "{m}"
    );
    assert!(!m.contains('\n'), "one line: {m}");
}

/// A scan over integer slices (token ids looked up in a table): no gradient flows into the
/// ids, the table's is the unrolled one.
#[test]
fn integer_slices_take_no_gradient_and_the_table_gets_the_unrolled_one() {
    let dev = device();
    let table = random(&dev, &[10, 8], 7);
    let ids: Vec<i32> = vec![3, 1, 4, 1, 5, 9];
    let ids = dev
        .tensor(&HostTensor::from_slice(&ids, &[3, 2]).unwrap())
        .unwrap();
    let h = random(&dev, &[2, 8], 8);
    let step = |h: &Tensor, ids: &Tensor| -> Tensor {
        let e = table.index_select_rows(ids).unwrap();
        h.mul(&e).unwrap().add(&e).unwrap().sin().unwrap()
    };
    let (out, _) = scan(&[&h], &[&ids], ScanOptions::default(), |h, x| {
        Ok((vec![step(&h[0], &x[0])], vec![]))
    })
    .unwrap();
    let loss = out[0].sum_all().unwrap();
    let g = grad(&loss, &[&table, &h]).unwrap();
    let mut want_h = h.clone();
    for i in 0..3 {
        let row = ids.narrow(0, i, 1).unwrap().reshape(&[2]).unwrap();
        want_h = step(&want_h, &row);
    }
    let want = grad(&want_h.sum_all().unwrap(), &[&table, &h]).unwrap();
    dev.mark_step().unwrap();
    assert_close("output", &values(&out[0]), &values(&want_h));
    assert_close("table gradient", &values(&g[0]), &values(&want[0]));
    assert_close("h gradient", &values(&g[1]), &values(&want[1]));
}

/// A tensor computed inside the body and kept outside it has no value of its own: the step
/// that would compute it is one error saying so, and the device goes on once it is dropped.
#[test]
fn a_tensor_kept_from_inside_the_body_is_one_error_at_the_step() {
    let dev = device();
    let c = case(&dev, 3);
    let mut kept = None;
    let (out, _) = scan(&[&c.h], &[&c.w], ScanOptions::default(), |h, w| {
        let y = h[0].matmul(&w[0])?;
        kept = Some(y.clone());
        Ok((vec![y], vec![]))
    })
    .unwrap();
    let e = dev.mark_step().unwrap_err().to_string();
    assert!(e.contains("inside a loop body"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    drop(kept);
    dev.mark_step().unwrap();
    assert_eq!(out[0].dims(), &[3, 8]);
}
