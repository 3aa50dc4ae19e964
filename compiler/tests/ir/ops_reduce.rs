//! Reductions, argmax/argmin and dot_general on the cpu plugin against the reference.

use crate::ops_common;

use neuron_pc_compiler::ir::{Graph, Op, ReduceOp};
use neuron_pc_compiler::{reference, DType, HostTensor};
use ops_common::{check_graph, check_op, check_op_scaled, ty, Domain};

fn numeric() -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| *d != DType::Pred)
        .collect()
}

#[test]
fn reduce_every_op_and_dtype() {
    for r in ReduceOp::ALL {
        for d in numeric() {
            // Products stay near 1 so floats keep their relative precision.
            let dom = match r {
                ReduceOp::Prod if d.is_float() => Domain::Range(0.5, 1.5),
                ReduceOp::Prod => Domain::Range(-3.0, 3.0),
                ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => Domain::Range(-10.0, 10.0),
            };
            // bf16/f16 sums: XLA accumulates in the narrow type on some paths; allow a few ulps.
            let scale = if matches!(d, DType::BF16 | DType::F16) {
                4.0
            } else {
                1.0
            };
            for dims in [vec![1], vec![0, 2], vec![], vec![0, 1, 2]] {
                check_op_scaled(Op::Reduce(r, dims), &[ty(d, &[3, 4, 5])], &[dom], 10, scale);
            }
        }
    }
}

#[test]
fn reduce_max_propagates_nan() {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[2, 3]));
    let m = g.push(Op::Reduce(ReduceOp::Max, vec![1]), &[x]).unwrap();
    g.set_outputs(&[m]).unwrap();
    let input = HostTensor::from_slice(&[1f32, f32::NAN, 3.0, -1.0, -2.0, -0.5], &[2, 3]).unwrap();
    check_graph("reduce_max with NaN", &g, std::slice::from_ref(&input), 1.0);
    let out = reference::evaluate(&g, &[input]).unwrap()[0]
        .to_vec::<f32>()
        .unwrap();
    assert!(out[0].is_nan() && out[1] == -0.5);
}

#[test]
fn argmax_argmin_every_dtype_and_index_type() {
    for d in numeric() {
        for index_dtype in [DType::I32, DType::I64, DType::U32] {
            for dim in 0..2 {
                // A narrow integer range makes ties common: the first index must win.
                let dom = Domain::Range(-3.0, 3.0);
                check_op(
                    Op::ArgMax { dim, index_dtype },
                    &[ty(d, &[6, 7])],
                    &[dom],
                    11,
                );
                check_op(
                    Op::ArgMin { dim, index_dtype },
                    &[ty(d, &[6, 7])],
                    &[dom],
                    12,
                );
            }
        }
    }
}

#[test]
fn argmax_ties_nan_and_infinities() {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[4, 4]));
    let a = g
        .push(
            Op::ArgMax {
                dim: 1,
                index_dtype: DType::I32,
            },
            &[x],
        )
        .unwrap();
    let b = g
        .push(
            Op::ArgMin {
                dim: 1,
                index_dtype: DType::I32,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[a, b]).unwrap();
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    #[rustfmt::skip]
    let v = [
        1.0, 3.0, 3.0, 0.0,
        -inf, -inf, -inf, -inf,
        2.0, nan, 5.0, nan,
        inf, 1.0, inf, -inf,
    ];
    let inputs = [HostTensor::from_slice(&v, &[4, 4]).unwrap()];
    let want_max = [1, 0, 1, 0];
    let want_min = [3, 0, 1, 3];
    let r = reference::evaluate(&g, &inputs).unwrap();
    assert_eq!(r[0].to_vec::<i32>().unwrap(), want_max);
    // NaN also wins argmin (it is "smaller than any number").
    assert_eq!(r[1].to_vec::<i32>().unwrap(), want_min);
    check_graph("argmax/argmin special values", &g, &inputs, 1.0);
}

#[test]
fn dot_general_shapes_and_dtypes() {
    type Dims = &'static [usize];
    let cases: [(Dims, Dims, [Dims; 4]); 6] = [
        // matmul
        (&[3, 4], &[4, 5], [&[], &[], &[1], &[0]]),
        // x @ w^T with a [out, in] weight
        (&[2, 3, 4], &[5, 4], [&[], &[], &[2], &[1]]),
        // batched
        (&[2, 3, 4], &[2, 4, 5], [&[0], &[0], &[2], &[1]]),
        // two contracting dims
        (&[3, 4, 2], &[2, 4, 5], [&[], &[], &[1, 2], &[1, 0]]),
        // outer product
        (&[3], &[4], [&[], &[], &[], &[]]),
        // vector dot
        (&[6], &[6], [&[], &[], &[0], &[0]]),
    ];
    for d in numeric() {
        for (l, r, [lb, rb, lc, rc]) in cases {
            let op = Op::DotGeneral {
                lhs_batch: lb.to_vec(),
                rhs_batch: rb.to_vec(),
                lhs_contract: lc.to_vec(),
                rhs_contract: rc.to_vec(),
            };
            let dom = if d == DType::U8 {
                Domain::Range(0.0, 6.0)
            } else {
                Domain::Range(-3.0, 3.0)
            };
            // Narrow floats: the plugin may round partial sums; scale the tolerance by the
            // contraction length.
            let scale = if matches!(d, DType::BF16 | DType::F16) {
                4.0
            } else {
                1.0
            };
            check_op_scaled(op, &[ty(d, l), ty(d, r)], &[dom], 13, scale);
        }
    }
}

#[test]
fn argsort_every_dtype_both_directions_with_ties() {
    for d in numeric() {
        for index_dtype in [DType::I32, DType::I64] {
            for dim in 0..2 {
                for descending in [false, true] {
                    // A narrow range makes ties common: equal elements must keep their order.
                    check_op(
                        Op::ArgSort {
                            dim,
                            descending,
                            index_dtype,
                        },
                        &[ty(d, &[6, 7])],
                        &[Domain::Range(-3.0, 3.0)],
                        13,
                    );
                }
            }
        }
    }
}

/// The permutation a stable sort of the host values by `f32::total_cmp` gives: the plain
/// Rust answer the device and the reference evaluator must both give.
fn host_argsort(row: &[f32], descending: bool) -> Vec<i32> {
    let mut perm: Vec<usize> = (0..row.len()).collect();
    perm.sort_by(|&a, &b| {
        let o = row[a].total_cmp(&row[b]);
        if descending {
            o.reverse()
        } else {
            o
        }
    });
    perm.into_iter().map(|p| p as i32).collect()
}

#[test]
fn argsort_orders_nan_infinities_and_signed_zeros_totally() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    #[rustfmt::skip]
    let v = [
        1.0, nan, -0.0, 0.0, -inf, 2.0, 0.0, -1.0,
        inf, 3.0, 3.0, -nan, 3.0, -inf, 0.5, nan,
    ];
    for descending in [false, true] {
        let mut g = Graph::new();
        let x = g.parameter(ty(DType::F32, &[2, 8]));
        let s = g
            .push(
                Op::ArgSort {
                    dim: 1,
                    descending,
                    index_dtype: DType::I32,
                },
                &[x],
            )
            .unwrap();
        g.set_outputs(&[s]).unwrap();
        let inputs = [HostTensor::from_slice(&v, &[2, 8]).unwrap()];
        let want: Vec<i32> = v
            .chunks(8)
            .flat_map(|row| host_argsort(row, descending))
            .collect();
        let r = reference::evaluate(&g, &inputs).unwrap();
        assert_eq!(
            r[0].to_vec::<i32>().unwrap(),
            want,
            "descending {descending}"
        );
        check_graph("argsort special values", &g, &inputs, 1.0);
    }
}

#[test]
fn top_k_is_the_first_k_of_a_descending_stable_sort() {
    for d in numeric() {
        for k in [1, 3, 7] {
            check_op(
                Op::TopK { k },
                &[ty(d, &[5, 7])],
                &[Domain::Range(-3.0, 3.0)],
                14,
            );
        }
    }
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    #[rustfmt::skip]
    let v = [
        1.0, nan, -0.0, 0.0, -inf, 2.0, 0.0, -1.0,
        inf, 3.0, 3.0, -2.0, 3.0, -inf, 0.5, nan,
    ];
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[2, 8]));
    let t = g.push(Op::TopK { k: 4 }, &[x]).unwrap();
    g.set_outputs(&[t]).unwrap();
    let inputs = [HostTensor::from_slice(&v, &[2, 8]).unwrap()];
    let want: Vec<i32> = v
        .chunks(8)
        .flat_map(|row| host_argsort(row, true)[..4].to_vec())
        .collect();
    assert_eq!(
        reference::evaluate(&g, &inputs).unwrap()[0]
            .to_vec::<i32>()
            .unwrap(),
        want
    );
    check_graph("top_k special values", &g, &inputs, 1.0);
}
