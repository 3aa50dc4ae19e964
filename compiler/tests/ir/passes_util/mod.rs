//! Helpers shared by the pass tests: seeded random inputs, evaluation with the reference
//! evaluator, comparisons.
#![allow(dead_code)]

pub mod step;

use neuron_pc_compiler::ir::{Graph, Op, TensorType};
use neuron_pc_compiler::reference::evaluate;
use neuron_pc_compiler::{DType, HostTensor};

pub use neuron_pc_compiler::rng::SplitMix64 as Rng;

/// Random values of `ty`: floats in [-1, 1), integers in 0..4, pred either way.
pub fn random_tensor(rng: &mut Rng, ty: &TensorType) -> HostTensor {
    let n = ty.element_count();
    let vals: Vec<f64> = (0..n)
        .map(|_| match ty.dtype {
            d if d.is_float() => rng.uniform(-1.0, 1.0),
            DType::Pred => (rng.next_u64() & 1) as f64,
            _ => (rng.next_u64() % 4) as f64,
        })
        .collect();
    HostTensor::from_f64s(ty.dtype, &vals, &ty.dims).expect("values match dims")
}

/// Random inputs for every parameter of `g`.
pub fn random_inputs(g: &Graph, seed: u64) -> Vec<HostTensor> {
    let mut rng = Rng::new(seed);
    g.parameter_types()
        .iter()
        .map(|t| random_tensor(&mut rng, t))
        .collect()
}

/// Inputs for [`step::build_step`]: token ids below the vocabulary, a 0/1 mask with at least
/// one token per row, labels below the class count, a small learning rate, step 3, weights
/// scaled like PyTorch's default init, first moments in [-0.01, 0.01) and small non-negative
/// second moments.
pub fn step_inputs(c: step::StepConfig, seed: u64, g: &Graph) -> Vec<HostTensor> {
    let mut rng = Rng::new(seed);
    let types = g.parameter_types();
    let mut out = Vec::with_capacity(types.len());
    let ints = |rng: &mut Rng, n: usize, below: usize| -> Vec<i32> {
        (0..n)
            .map(|_| (rng.next_u64() % below as u64) as i32)
            .collect()
    };
    out.push(
        HostTensor::from_slice(&ints(&mut rng, c.batch * c.seq, c.vocab), &[c.batch, c.seq])
            .unwrap(),
    );
    let mask: Vec<f32> = (0..c.batch * c.seq)
        .map(|i| {
            if i % c.seq == 0 || rng.uniform(-1.0, 1.0) > -0.4 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    out.push(HostTensor::from_slice(&mask, &[c.batch, c.seq]).unwrap());
    out.push(HostTensor::from_slice(&ints(&mut rng, c.batch, c.classes), &[c.batch]).unwrap());
    out.push(HostTensor::from_slice(&[1e-3f32], &[]).unwrap());
    out.push(HostTensor::from_slice(&[3.0f32], &[]).unwrap());
    for (i, ty) in types.iter().enumerate().skip(5) {
        // Weights as PyTorch initializes them (uniform, bound 1/sqrt(fan_in)), so activations
        // and the loss have realistic magnitudes at any size.
        let fan_in = ty.dims.first().copied().unwrap_or(1).max(1);
        let scale = match (i - 5) % 3 {
            0 if i == 5 => 1.0,
            0 => 1.0 / (fan_in as f64).sqrt(),
            1 => 0.01,
            _ => 0.0,
        };
        let vals: Vec<f64> = (0..ty.element_count())
            .map(|_| {
                if scale == 0.0 {
                    rng.uniform(-1.0, 1.0).abs() * 1e-4
                } else {
                    rng.uniform(-1.0, 1.0) * scale
                }
            })
            .collect();
        out.push(HostTensor::from_f64s(DType::F32, &vals, &ty.dims).unwrap());
    }
    out
}

/// Evaluates `g` on `inputs` with the reference evaluator.
pub fn eval(g: &Graph, inputs: &[HostTensor]) -> Vec<HostTensor> {
    evaluate(g, inputs).unwrap_or_else(|e| panic!("reference evaluation failed: {e}\n{g}"))
}

/// Asserts the two result lists are equal element by element (numerically: `-0.0 == 0.0`,
/// NaN equals NaN), with the same dtypes and shapes.
pub fn assert_same(a: &[HostTensor], b: &[HostTensor], what: &str) {
    assert_close(a, b, 0.0, what);
}

/// Asserts `|a - b| <= tol * (1 + |a|)` for every element, with equal dtypes and shapes.
pub fn assert_close(a: &[HostTensor], b: &[HostTensor], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: output count");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            (x.dtype(), x.dims()),
            (y.dtype(), y.dims()),
            "{what}: output {k} type"
        );
        for (i, (p, q)) in x.to_f64_vec().into_iter().zip(y.to_f64_vec()).enumerate() {
            let ok = (p.is_nan() && q.is_nan()) || (p - q).abs() <= tol * (1.0 + p.abs());
            assert!(ok, "{what}: output {k} element {i}: {p} vs {q} (tol {tol})");
        }
    }
}

/// Non-parameter nodes whose op satisfies `f`.
pub fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| f(&n.op)).count()
}
