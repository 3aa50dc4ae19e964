//! Ops that create or move elements (iota, broadcast, reshape, transpose, slices, concatenate,
//! pad, gather, scatter-add) on the cpu plugin against the reference evaluator.

use crate::ops_common;

use neuron_pc_compiler::ir::{Graph, Op};
use neuron_pc_compiler::{reference, DType, HostTensor};
use ops_common::{check_graph, check_op, ty, Domain};

const ALL_RANGE: Domain = Domain::Range(-50.0, 50.0);

#[test]
fn iota_every_numeric_dtype() {
    for d in DType::ALL.into_iter().filter(|d| *d != DType::Pred) {
        for dim in 0..3 {
            let mut g = Graph::new();
            let x = g
                .push(
                    Op::Iota {
                        dims: vec![2, 3, 4],
                        dim,
                        dtype: d,
                    },
                    &[],
                )
                .unwrap();
            g.set_outputs(&[x]).unwrap();
            check_graph(&format!("iota {d} dim {dim}"), &g, &[], 1.0);
        }
    }
    // The reference's own answer, so both sides are pinned.
    let mut g = Graph::new();
    let x = g
        .push(
            Op::Iota {
                dims: vec![2, 3],
                dim: 1,
                dtype: DType::I32,
            },
            &[],
        )
        .unwrap();
    g.set_outputs(&[x]).unwrap();
    let out = reference::evaluate(&g, &[]).unwrap();
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn broadcast_in_dim() {
    let cases: [(&[usize], &[usize], &[usize]); 5] = [
        (&[3], &[2, 3], &[1]),
        (&[3], &[3, 2], &[0]),
        (&[3, 1], &[3, 4], &[0, 1]),
        (&[], &[2, 2], &[]),
        (&[2, 3], &[3, 4, 2], &[2, 0]),
    ];
    for d in DType::ALL {
        for (from, to, bd) in cases {
            let op = Op::BroadcastInDim {
                dims: to.to_vec(),
                broadcast_dimensions: bd.to_vec(),
            };
            check_op(op, &[ty(d, from)], &[ALL_RANGE], 1);
        }
    }
}

#[test]
fn reshape_and_transpose() {
    for d in DType::ALL {
        check_op(
            Op::Reshape { dims: vec![4, 6] },
            &[ty(d, &[2, 3, 4])],
            &[ALL_RANGE],
            2,
        );
        check_op(
            Op::Reshape { dims: vec![] },
            &[ty(d, &[1, 1])],
            &[ALL_RANGE],
            2,
        );
        check_op(
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            &[ty(d, &[2, 3, 4])],
            &[ALL_RANGE],
            3,
        );
        check_op(
            Op::Transpose { perm: vec![1, 0] },
            &[ty(d, &[5, 3])],
            &[ALL_RANGE],
            3,
        );
    }
}

#[test]
fn stop_gradient_passes_the_value() {
    for d in DType::ALL {
        check_op(Op::StopGradient, &[ty(d, &[2, 3])], &[ALL_RANGE], 5);
        check_op(Op::StopGradient, &[ty(d, &[])], &[ALL_RANGE], 5);
    }
}

#[test]
fn after_passes_its_first_operand() {
    for d in DType::ALL {
        // the other operands, of any types, only order it
        let others = [ty(d, &[4]), ty(DType::F32, &[2, 2]), ty(d, &[2, 3])];
        check_op(
            Op::After,
            &[ty(d, &[2, 3]), others[0].clone()],
            &[ALL_RANGE],
            5,
        );
        check_op(
            Op::After,
            &[[ty(d, &[2, 3])].as_slice(), &others].concat(),
            &[ALL_RANGE],
            6,
        );
        check_op(Op::After, &[ty(d, &[])], &[ALL_RANGE], 7);
    }
}

#[test]
fn static_slices() {
    for d in DType::ALL {
        let op = Op::Slice {
            start: vec![1, 0, 2],
            limit: vec![3, 3, 7],
            stride: vec![1, 2, 3],
        };
        check_op(op, &[ty(d, &[4, 3, 8])], &[ALL_RANGE], 4);
        let empty = Op::Slice {
            start: vec![2],
            limit: vec![2],
            stride: vec![1],
        };
        check_op(empty, &[ty(d, &[4])], &[ALL_RANGE], 4);
    }
}

/// Dynamic slices with start indices given as inputs, including ones that need clamping.
#[test]
fn dynamic_slice_and_update_clamp_their_starts() {
    for (idx_dtype, starts) in [
        (DType::I32, [1i64, 2]),
        (DType::I64, [3, -2]),
        (DType::U32, [9, 0]),
    ] {
        for d in DType::ALL {
            let mut g = Graph::new();
            let x = g.parameter(ty(d, &[4, 5]));
            let u = g.parameter(ty(d, &[2, 2]));
            let i0 = g.parameter(ty(idx_dtype, &[]));
            let i1 = g.parameter(ty(idx_dtype, &[]));
            let ds = g
                .push(Op::DynamicSlice { sizes: vec![2, 3] }, &[x, i0, i1])
                .unwrap();
            let dus = g.push(Op::DynamicUpdateSlice, &[x, u, i0, i1]).unwrap();
            g.set_outputs(&[ds, dus]).unwrap();
            let mut rng = ops_common::Rng::new(5);
            let mut inputs = vec![
                ops_common::random_tensor(&mut rng, &ty(d, &[4, 5]), ALL_RANGE),
                ops_common::random_tensor(&mut rng, &ty(d, &[2, 2]), ALL_RANGE),
            ];
            for &s in &starts {
                inputs.push(HostTensor::from_f64s(idx_dtype, &[s as f64], &[]).unwrap());
            }
            check_graph(
                &format!("dynamic slices {d} starts {starts:?} ({idx_dtype})"),
                &g,
                &inputs,
                1.0,
            );
        }
    }
}

#[test]
fn concatenate_along_each_dim() {
    for d in DType::ALL {
        check_op(
            Op::Concatenate { dim: 0 },
            &[ty(d, &[2, 3]), ty(d, &[1, 3]), ty(d, &[4, 3])],
            &[ALL_RANGE],
            6,
        );
        check_op(
            Op::Concatenate { dim: 1 },
            &[ty(d, &[2, 3]), ty(d, &[2, 1])],
            &[ALL_RANGE],
            6,
        );
        check_op(Op::Concatenate { dim: 0 }, &[ty(d, &[5])], &[ALL_RANGE], 6);
    }
}

#[test]
fn pad_with_edges_interior_and_negative_crops() {
    for d in DType::ALL {
        let op = Op::Pad {
            low: vec![1, -1],
            high: vec![2, 0],
            interior: vec![1, 2],
        };
        check_op(op, &[ty(d, &[3, 4]), ty(d, &[])], &[ALL_RANGE], 7);
        let op = Op::Pad {
            low: vec![0],
            high: vec![-2],
            interior: vec![0],
        };
        check_op(op, &[ty(d, &[5]), ty(d, &[])], &[ALL_RANGE], 7);
    }
}

/// Embedding lookups: rows of a table by integer indices of any shape; out-of-range indices
/// clamp (the inputs include some).
#[test]
fn gather_rows() {
    for idx in [DType::I32, DType::I64, DType::U32, DType::U8] {
        for d in DType::ALL {
            check_op(
                Op::Gather,
                &[ty(d, &[6, 4]), ty(idx, &[2, 3])],
                &[ALL_RANGE, Domain::Range(-2.0, 8.0)],
                8,
            );
            check_op(
                Op::Gather,
                &[ty(d, &[5]), ty(idx, &[4])],
                &[ALL_RANGE, Domain::Range(0.0, 4.0)],
                8,
            );
            check_op(
                Op::Gather,
                &[ty(d, &[4, 2, 3]), ty(idx, &[])],
                &[ALL_RANGE, Domain::Range(0.0, 3.0)],
                8,
            );
        }
    }
}

/// The gradient of the lookup: repeated indices sum into the same row.
#[test]
fn scatter_add_rows() {
    for idx in [DType::I32, DType::I64, DType::U32] {
        for d in DType::ALL.into_iter().filter(|d| *d != DType::Pred) {
            let domains = [
                Domain::Range(-3.0, 3.0),
                Domain::Range(0.0, 5.0),
                Domain::Range(-3.0, 3.0),
            ];
            check_op(
                Op::ScatterAdd,
                &[ty(d, &[6, 4]), ty(idx, &[3, 5]), ty(d, &[3, 5, 4])],
                &domains,
                9,
            );
            check_op(
                Op::ScatterAdd,
                &[ty(d, &[6]), ty(idx, &[7]), ty(d, &[7])],
                &domains,
                9,
            );
        }
    }
    // Pinned by hand: rows 1 and 1 and 0.
    let mut g = Graph::new();
    let t = g.parameter(ty(DType::F32, &[3, 2]));
    let i = g.parameter(ty(DType::I32, &[3]));
    let u = g.parameter(ty(DType::F32, &[3, 2]));
    let s = g.push(Op::ScatterAdd, &[t, i, u]).unwrap();
    g.set_outputs(&[s]).unwrap();
    let inputs = [
        HostTensor::from_slice(&[0f32; 6], &[3, 2]).unwrap(),
        HostTensor::from_slice(&[1i32, 1, 0], &[3]).unwrap(),
        HostTensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[3, 2]).unwrap(),
    ];
    let want = [5f32, 6., 4., 6., 0., 0.];
    assert_eq!(
        reference::evaluate(&g, &inputs).unwrap()[0]
            .to_vec::<f32>()
            .unwrap(),
        want
    );
    assert_eq!(
        ops_common::run_device(&g, &inputs)[0]
            .to_vec::<f32>()
            .unwrap(),
        want
    );
}

/// Constants of every dtype, splat and dense, with values that need care in text (infinities,
/// NaN, -0.0, integer extremes, non-representable decimals) come back bit for bit.
#[test]
fn constants_round_trip_exactly() {
    use neuron_pc_compiler::ir::Literal;
    let specials = [
        0.1,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-30,
        65504.0,
        -3.5,
    ];
    let ints = [
        0.0,
        -1.0,
        2147483647.0,
        -2147483648.0,
        255.0,
        4294967295.0,
        7.0,
        1.0,
    ];
    for d in DType::ALL {
        let vals = if d.is_float() { specials } else { ints };
        let dense = HostTensor::from_f64s(d, &vals, &[2, 4]).unwrap();
        let mut g = Graph::new();
        let a = g.push(Op::Constant(Literal::dense(&dense)), &[]).unwrap();
        let mut outs = vec![a];
        for v in vals {
            outs.push(
                g.push(Op::Constant(Literal::splat(d, v, &[3])), &[])
                    .unwrap(),
            );
        }
        outs.push(
            g.push(Op::Constant(Literal::splat(d, 1.0, &[0, 2])), &[])
                .unwrap(),
        );
        g.set_outputs(&outs).unwrap();
        let got = ops_common::run_device(&g, &[]);
        let want = reference::evaluate(&g, &[]).unwrap();
        assert_eq!(got, want, "{d}");
        assert_eq!(want[0], dense, "{d}");
    }
}
