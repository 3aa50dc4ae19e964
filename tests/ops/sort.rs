//! Ordering along a dimension (`argsort`, `sort`, `topk`, `take_along_dim`, `cumsum`): values
//! on the cpu plugin against plain Rust, gradients against finite differences.

use crate::grad_check;

use grad_check::{device, Check};
use neuron_pc::nn::HostRng;
use neuron_pc::{DType, LazyDevice, Tensor};

fn host_rows(v: &[f64], n: usize, descending: bool) -> (Vec<f64>, Vec<i64>) {
    let (mut vals, mut idx) = (Vec::new(), Vec::new());
    for row in v.chunks(n) {
        let mut perm: Vec<usize> = (0..n).collect();
        perm.sort_by(|&a, &b| {
            let o = row[a].total_cmp(&row[b]);
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        vals.extend(perm.iter().map(|&p| row[p]));
        idx.extend(perm.iter().map(|&p| p as i64));
    }
    (vals, idx)
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.to_host()
        .unwrap()
        .to_f64_vec()
        .iter()
        .map(|v| *v as i64)
        .collect()
}

fn floats(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

/// Values with ties (rounded to quarters) so that stability is exercised.
fn tied(rng: &mut HostRng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| ((rng.uniform() * 8.0).floor() - 4.0) / 4.0)
        .collect()
}

fn upload(dev: &LazyDevice, v: &[f64], dims: &[usize]) -> Tensor {
    dev.from_slice(v, dims).unwrap()
}

#[test]
fn sort_and_topk_match_a_stable_host_sort_along_either_dimension() {
    let dev = device();
    let mut rng = HostRng::new(41);
    let v = tied(&mut rng, 5 * 9);
    let x = upload(&dev, &v, &[5, 9]);
    for descending in [false, true] {
        // along the last dimension
        let (vals, idx) = x.sort(-1, descending).unwrap();
        let (want_v, want_i) = host_rows(&v, 9, descending);
        assert_eq!(idx.dtype(), DType::I64);
        assert_eq!(ints(&idx), want_i, "argsort rows, descending {descending}");
        assert_eq!(floats(&vals), want_v, "sort rows, descending {descending}");
        // along dimension 0: the transpose's rows
        let t: Vec<f64> = (0..9)
            .flat_map(|c| (0..5).map(move |r| (r, c)))
            .map(|(r, c)| v[r * 9 + c])
            .collect();
        let (want_tv, want_ti) = host_rows(&t, 5, descending);
        let (vals0, idx0) = x.sort(0, descending).unwrap();
        let back = |w: &[f64]| -> Vec<f64> {
            (0..5)
                .flat_map(|r| (0..9).map(move |c| (r, c)))
                .map(|(r, c)| w[c * 5 + r])
                .collect()
        };
        assert_eq!(floats(&vals0), back(&want_tv), "sort columns");
        let want_ti: Vec<f64> = want_ti.iter().map(|i| *i as f64).collect();
        assert_eq!(floats(&idx0.to_dtype(DType::F64).unwrap()), back(&want_ti));
    }
    // top 3, largest and smallest: the first k of the stable sort
    for largest in [true, false] {
        let (vals, idx) = x.topk(3, 1, largest).unwrap();
        assert_eq!(vals.dims(), &[5, 3]);
        let (want_v, want_i) = host_rows(&v, 9, largest);
        let first3 =
            |w: &[i64]| -> Vec<i64> { w.chunks(9).flat_map(|r| r[..3].to_vec()).collect() };
        assert_eq!(
            ints(&idx),
            first3(&want_i),
            "topk indices, largest {largest}"
        );
        let firstv: Vec<f64> = want_v.chunks(9).flat_map(|r| r[..3].to_vec()).collect();
        assert_eq!(floats(&vals), firstv, "topk values");
    }
    let err = x.topk(10, 1, true).unwrap_err().to_string();
    assert!(err.contains("topk") && err.contains("k 10"), "{err}");
}

#[test]
fn take_along_dim_picks_per_row_and_refuses_mismatched_indices() {
    let dev = device();
    let v: Vec<f64> = (0..24).map(|i| i as f64 * 0.5).collect();
    let x = upload(&dev, &v, &[2, 3, 4]);
    // along the middle dimension, two picks per (batch, column)
    let idx: Vec<i32> = vec![2, 0, 1, 1, 0, 0, 2, 2, 1, 2, 0, 1, 0, 1, 2, 0];
    let it = dev.from_slice(&idx, &[2, 2, 4]).unwrap();
    let got = floats(&x.take_along_dim(&it, 1).unwrap());
    let mut want = Vec::new();
    for b in 0..2 {
        for j in 0..2 {
            for c in 0..4 {
                let p = idx[b * 8 + j * 4 + c] as usize;
                want.push(v[b * 12 + p * 4 + c]);
            }
        }
    }
    assert_eq!(got, want);
    let bad = dev.from_slice(&[0i32; 6], &[2, 3, 1]).unwrap();
    let err = x.take_along_dim(&bad, 1).unwrap_err().to_string();
    assert!(err.contains("take_along_dim"), "{err}");
}

#[test]
fn cumsum_is_the_running_sum_along_a_dimension() {
    let dev = device();
    let mut rng = HostRng::new(43);
    for n in [1usize, 2, 5, 8, 13] {
        let v: Vec<f64> = (0..3 * n).map(|_| rng.uniform() * 2.0 - 1.0).collect();
        let got = floats(&upload(&dev, &v, &[3, n]).cumsum(1).unwrap());
        let mut want = Vec::new();
        for row in v.chunks(n) {
            let mut s = 0.0;
            for x in row {
                s += x;
                want.push(s);
            }
        }
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "n {n}: {got:?} against {want:?}");
        }
    }
    // integers sum exactly, along dimension 0
    let got = dev
        .from_slice(&[1i32, 2, 3, 4, 5, 6], &[3, 2])
        .unwrap()
        .cumsum(0)
        .unwrap();
    assert_eq!(ints(&got), [1, 2, 4, 6, 9, 12]);
}

#[test]
fn gradients_of_sort_topk_take_along_dim_and_cumsum() {
    let c = Check::new(44);
    // distinct values, so that a small step keeps the order (finite differences need it)
    let x = c.away(&[3, 6], -1.0, 1.0);
    c.op("sort values", std::slice::from_ref(&x), |x| {
        x[0].sort(1, true)?.0.mul_scalar(1.5)?.exp()
    });
    c.op("topk values", std::slice::from_ref(&x), |x| {
        x[0].topk(2, 1, true)?.0.tanh()
    });
    c.op("cumsum", &[c.rand(&[2, 5], -1.0, 1.0)], |x| {
        x[0].cumsum(1)?.sin()
    });
    c.op("take_along_dim", &[c.rand(&[2, 4], -1.0, 1.0)], |x| {
        let dev = x[0].device()?;
        let idx = dev.from_slice(&[3i32, 3, 0, 1, 2, 1], &[2, 3])?;
        x[0].take_along_dim(&idx, 1)?.exp()
    });
    c.finish();
}
