//! Gradients of the collectives against central finite differences, on 2 and 4 cpu replicas
//! and several replica-group layouts. The loss of an SPMD program is the sum over replicas of
//! each replica's loss, so the finite difference perturbs one element of one replica's input
//! and measures the change of that sum.

use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, HostTensor, LazyDevice, Tensor};

const ROWS: usize = 4;
const COLS: usize = 3;

use crate::common::replicated as device;

/// Distinct values (no ties between replicas), seeded.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 10_000) as f64 / 2_500.0 - 2.0 + i as f64 * 1e-4
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce(Reduction),
    AllGather,
    ReduceScatter(Reduction),
}

fn apply(x: &Tensor, kind: Kind, groups: &[Vec<usize>]) -> Tensor {
    match kind {
        Kind::AllReduce(op) => x.all_reduce_in(op, groups),
        Kind::AllGather => x.all_gather_in(0, groups),
        Kind::ReduceScatter(op) => x.reduce_scatter_in(op, 0, groups),
    }
    .unwrap()
}

fn per_replica(dev: &LazyDevice, blocks: &[Vec<f64>], dims: &[usize]) -> Tensor {
    let hosts: Vec<HostTensor> = blocks
        .iter()
        .map(|b| HostTensor::from_slice(b, dims).unwrap())
        .collect();
    dev.from_replicas(&hosts).unwrap()
}

/// sum over replicas of sum(collective(x) * w_r), with x and w given per replica.
fn objective(
    dev: &LazyDevice,
    xs: &[Vec<f64>],
    ws: &[Vec<f64>],
    wdims: &[usize],
    kind: Kind,
    groups: &[Vec<usize>],
) -> f64 {
    let x = per_replica(dev, xs, &[ROWS, COLS]);
    let w = per_replica(dev, ws, wdims);
    let local = apply(&x, kind, groups).mul(&w).unwrap().sum_all().unwrap();
    let total = local.all_reduce(Reduction::Sum).unwrap();
    dev.mark_step().unwrap();
    total.item().unwrap()
}

fn check(n: usize, kind: Kind, groups: &[Vec<usize>]) {
    let dev = device(n);
    let group = groups[0].len();
    let wdims = match kind {
        Kind::AllReduce(_) => vec![ROWS, COLS],
        Kind::AllGather => vec![ROWS * group, COLS],
        Kind::ReduceScatter(_) => vec![ROWS / group, COLS],
    };
    let xs: Vec<Vec<f64>> = (0..n).map(|r| values(11 + r as u64, ROWS * COLS)).collect();
    let ws: Vec<Vec<f64>> = (0..n)
        .map(|r| values(101 + r as u64, wdims.iter().product()))
        .collect();
    // analytic: grad of this replica's loss, per replica
    let x = per_replica(&dev, &xs, &[ROWS, COLS]);
    let w = per_replica(&dev, &ws, &wdims);
    let loss = apply(&x, kind, groups).mul(&w).unwrap().sum_all().unwrap();
    let g = grad(&loss, &[&x]).unwrap().remove(0);
    dev.mark_step().unwrap();
    let analytic: Vec<Vec<f64>> = g
        .to_host_replicas()
        .unwrap()
        .iter()
        .map(|h| h.to_vec::<f64>().unwrap())
        .collect();
    // finite differences of the sum over replicas, a few elements of every replica
    let h = 1e-3;
    for (s, a) in analytic.iter().enumerate() {
        for e in [0, 5, 11] {
            let mut plus = xs.clone();
            plus[s][e] += h;
            let mut minus = xs.clone();
            minus[s][e] -= h;
            let fd = (objective(&dev, &plus, &ws, &wdims, kind, groups)
                - objective(&dev, &minus, &ws, &wdims, kind, groups))
                / (2.0 * h);
            assert!(
                (fd - a[e]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{kind:?} groups {groups:?}, replica {s} element {e}: analytic {} vs fd {fd}",
                a[e]
            );
        }
    }
}

fn layouts(n: usize) -> Vec<Vec<Vec<usize>>> {
    let mut l = vec![vec![(0..n).collect()], (0..n).map(|r| vec![r]).collect()];
    if n == 4 {
        l.push(vec![vec![0, 1], vec![2, 3]]);
        l.push(vec![vec![0, 2], vec![1, 3]]);
    }
    l
}

#[test]
fn all_reduce_gradients_match_finite_differences() {
    for n in [2, 4] {
        for groups in layouts(n) {
            for op in [
                Reduction::Sum,
                Reduction::Mean,
                Reduction::Max,
                Reduction::Min,
            ] {
                check(n, Kind::AllReduce(op), &groups);
            }
        }
    }
}

#[test]
fn all_gather_and_reduce_scatter_gradients_match_finite_differences() {
    for n in [2, 4] {
        for groups in layouts(n) {
            check(n, Kind::AllGather, &groups);
            for op in [
                Reduction::Sum,
                Reduction::Mean,
                Reduction::Max,
                Reduction::Min,
            ] {
                check(n, Kind::ReduceScatter(op), &groups);
            }
        }
    }
}

#[test]
fn tied_maxima_share_the_gradient() {
    let dev = device(2);
    let x = per_replica(&dev, &[vec![3.0, 1.0], vec![3.0, 2.0]], &[2]);
    let loss = x.all_reduce(Reduction::Max).unwrap().sum_all().unwrap();
    let g = grad(&loss, &[&x]).unwrap().remove(0);
    dev.mark_step().unwrap();
    let got: Vec<Vec<f64>> = g
        .to_host_replicas()
        .unwrap()
        .iter()
        .map(|h| h.to_vec::<f64>().unwrap())
        .collect();
    // both replicas' losses see the max; the tie at element 0 splits it: 2 * 1/2 each
    assert_eq!(got, [[1.0, 0.0], [1.0, 2.0]]);
}

#[test]
fn on_one_device_a_mean_over_replicas_differentiates_as_the_identity() {
    let dev = device(1);
    let x = dev.from_slice(&[1.0f64, 2.0], &[2]).unwrap();
    let loss = x
        .all_reduce(Reduction::Mean)
        .unwrap()
        .mul(&x)
        .unwrap()
        .sum_all()
        .unwrap();
    let g = grad(&loss, &[&x]).unwrap().remove(0);
    assert_eq!(g.to_vec::<f64>().unwrap(), [2.0, 4.0]);
}
