//! `convolution` (PyTorch layouts, stride, padding, dilation, groups) on the cpu plugin
//! against the reference evaluator, and its shape errors.

use crate::ops_common;

use neuron_pc_compiler::ir::{infer, Op, ReduceOp};
use neuron_pc_compiler::DType;
use ops_common::{check_op_scaled, ty, Domain};

fn conv(stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Op {
    Op::Convolution {
        stride: stride.to_vec(),
        padding: padding.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    }
}

#[test]
fn convolution_matches_the_reference() {
    // (input, kernel, op, result dims)
    type Case = (Vec<usize>, Vec<usize>, Op, Vec<usize>);
    let cases: Vec<Case> = vec![
        (
            vec![2, 3, 9],
            vec![4, 3, 3],
            conv(&[1], &[0], &[1], 1),
            vec![2, 4, 7],
        ),
        (
            vec![2, 4, 9],
            vec![6, 2, 3],
            conv(&[2], &[1], &[2], 2),
            vec![2, 6, 4],
        ),
        (
            vec![1, 4, 8],
            vec![4, 1, 2],
            conv(&[1], &[1], &[1], 4),
            vec![1, 4, 9],
        ),
        (
            vec![2, 3, 6, 5],
            vec![4, 3, 3, 2],
            conv(&[1, 1], &[0, 0], &[1, 1], 1),
            vec![2, 4, 4, 4],
        ),
        (
            vec![1, 4, 7, 6],
            vec![6, 2, 3, 3],
            conv(&[2, 1], &[1, 2], &[1, 2], 2),
            vec![1, 6, 4, 6],
        ),
        (
            vec![2, 2, 5, 5],
            vec![2, 1, 2, 2],
            conv(&[2, 2], &[1, 0], &[2, 1], 2),
            vec![2, 2, 3, 2],
        ),
    ];
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (seed, (x, w, op, out)) in cases.iter().enumerate() {
            let got = infer(op, &[&ty(d, x), &ty(d, w)]).unwrap();
            assert_eq!(got, ty(d, out), "{op}");
            // sums of up to 36 products of values in [-1, 1): scale the tolerance with them
            check_op_scaled(
                op.clone(),
                &[ty(d, x), ty(d, w)],
                &[Domain::Range(-1.0, 1.0)],
                seed as u64,
                8.0,
            );
        }
    }
}

#[test]
fn convolution_shape_errors() {
    let f = |dims: &[usize]| ty(DType::F32, dims);
    let cases: Vec<(Op, Vec<_>, &str)> = vec![
        (
            conv(&[1], &[0], &[1], 1),
            vec![f(&[1, 3, 5]), f(&[2, 2, 3])],
            "groups",
        ),
        (
            conv(&[1], &[0], &[1], 2),
            vec![f(&[1, 4, 5]), f(&[3, 2, 3])],
            "groups",
        ),
        (
            conv(&[0], &[0], &[1], 1),
            vec![f(&[1, 3, 5]), f(&[2, 3, 3])],
            "stride",
        ),
        (
            conv(&[1], &[0], &[3], 1),
            vec![f(&[1, 3, 5]), f(&[2, 3, 3])],
            "does not fit",
        ),
        (
            conv(&[1, 1], &[0], &[1], 1),
            vec![f(&[1, 3, 5]), f(&[2, 3, 3])],
            "one entry per",
        ),
        (
            conv(&[1], &[0], &[1], 1),
            vec![f(&[3, 5]), f(&[2, 3])],
            "at least 3",
        ),
        (
            conv(&[1], &[0], &[1], 1),
            vec![f(&[1, 3, 5]), ty(DType::F64, &[2, 3, 3])],
            "same dtype",
        ),
    ];
    for (op, operands, want) in cases {
        let refs: Vec<_> = operands.iter().collect();
        let e = infer(&op, &refs).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("convolution"),
            "{e} (want {want})"
        );
    }
    let ints = infer(
        &conv(&[1], &[0], &[1], 1),
        &[&ty(DType::I32, &[1, 1, 3]), &ty(DType::I32, &[1, 1, 1])],
    );
    assert!(ints.is_err());
}

fn window(op: ReduceOp, window: &[usize], stride: &[usize], padding: &[usize]) -> Op {
    Op::ReduceWindow {
        op,
        window: window.to_vec(),
        stride: stride.to_vec(),
        padding: padding.to_vec(),
    }
}

#[test]
fn reduce_window_matches_the_reference() {
    // (operand, op, result dims)
    type Case = (Vec<usize>, Op, Vec<usize>);
    let cases: Vec<Case> = vec![
        (
            vec![2, 3, 8],
            window(ReduceOp::Max, &[1, 1, 2], &[1, 1, 2], &[0, 0, 0]),
            vec![2, 3, 4],
        ),
        (
            vec![1, 2, 9],
            window(ReduceOp::Sum, &[1, 1, 3], &[1, 1, 2], &[0, 0, 1]),
            vec![1, 2, 5],
        ),
        (
            vec![2, 2, 7, 5],
            window(ReduceOp::Max, &[1, 1, 3, 2], &[1, 1, 2, 1], &[0, 0, 1, 1]),
            vec![2, 2, 4, 6],
        ),
        (
            vec![4, 6],
            window(ReduceOp::Min, &[2, 3], &[2, 3], &[0, 0]),
            vec![2, 2],
        ),
        (
            vec![3, 5],
            window(ReduceOp::Sum, &[3, 2], &[1, 2], &[1, 1]),
            vec![3, 3],
        ),
    ];
    for d in [DType::F32, DType::F64, DType::BF16] {
        for (seed, (x, op, out)) in cases.iter().enumerate() {
            assert_eq!(infer(op, &[&ty(d, x)]).unwrap(), ty(d, out), "{op}");
            check_op_scaled(
                op.clone(),
                &[ty(d, x)],
                &[Domain::Range(-4.0, 4.0)],
                seed as u64,
                4.0,
            );
        }
    }
    let f = |dims: &[usize]| ty(DType::F32, dims);
    for (op, want) in [
        (
            window(ReduceOp::Max, &[2], &[1], &[0]),
            "one entry per dimension",
        ),
        (
            window(ReduceOp::Max, &[1, 7], &[1, 1], &[0, 0]),
            "does not fit",
        ),
        (
            window(ReduceOp::Max, &[1, 2], &[1, 0], &[0, 0]),
            "does not fit",
        ),
    ] {
        let e = infer(&op, &[&f(&[2, 5])]).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("reduce_window"), "{e}");
    }
    assert!(infer(
        &window(ReduceOp::Sum, &[1], &[1], &[0]),
        &[&ty(DType::I32, &[3])]
    )
    .is_err());
}

#[test]
fn every_attribute_enters_the_program_and_so_the_cache_key() {
    use neuron_pc_compiler::ir::Graph;
    let fingerprint = |op: Op, x: &[usize], w: Option<&[usize]>| {
        let mut g = Graph::new();
        let mut params = vec![g.parameter(ty(DType::F32, x))];
        if let Some(w) = w {
            params.push(g.parameter(ty(DType::F32, w)));
        }
        let out = g.push(op, &params).unwrap();
        g.set_outputs(&[out]).unwrap();
        // The lowered text is what the cache key hashes.
        neuron_pc_compiler::lower::to_stablehlo(&g).unwrap()
    };
    let (x, w): (&[usize], &[usize]) = (&[1, 4, 9, 9], &[4, 2, 3, 3]);
    let base = fingerprint(conv(&[1, 1], &[1, 1], &[1, 1], 2), x, Some(w));
    for changed in [
        conv(&[2, 1], &[1, 1], &[1, 1], 2),
        conv(&[1, 1], &[0, 1], &[1, 1], 2),
        conv(&[1, 1], &[1, 1], &[1, 2], 2),
    ] {
        assert_ne!(fingerprint(changed.clone(), x, Some(w)), base, "{changed}");
    }
    let pool =
        |op, k: usize, s: usize, p: usize| window(op, &[1, 1, k, k], &[1, 1, s, s], &[0, 0, p, p]);
    let base = fingerprint(pool(ReduceOp::Max, 3, 2, 1), x, None);
    for changed in [
        pool(ReduceOp::Sum, 3, 2, 1),
        pool(ReduceOp::Max, 2, 2, 1),
        pool(ReduceOp::Max, 3, 1, 1),
        pool(ReduceOp::Max, 3, 2, 0),
    ] {
        assert_ne!(fingerprint(changed.clone(), x, None), base, "{changed}");
    }
}
