//! Shared by the op tests: one PJRT client per test binary, seeded random inputs, and the
//! `check_op` helper that runs one op on the cpu plugin and in the reference evaluator.

#![allow(dead_code)]

use std::sync::OnceLock;

use neuron_pc_compiler::ir::{Graph, Op, TensorType};
use neuron_pc_compiler::pjrt::{
    find_plugin, Client, ClientOptions, CompileOptions, Plugin, Target,
};
use neuron_pc_compiler::{lower, reference, DType, HostTensor};

/// The cpu client, created once (loading the plugin is the expensive part).
pub fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let path = find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup");
        let plugin = Plugin::load(&path).expect("load the cpu plugin");
        Client::new(&plugin, &ClientOptions::default()).expect("cpu client")
    })
}

pub use neuron_pc_compiler::rng::SplitMix64 as Rng;

/// Where random operand values come from.
#[derive(Clone, Copy, Debug)]
pub enum Domain {
    /// Floats uniform in `[lo, hi)`; integers are the same range rounded (unsigned clipped at 0).
    Range(f64, f64),
    /// Like `Range` but never within 0.5 of zero (divisors).
    NonZero(f64, f64),
}

pub fn random_tensor(rng: &mut Rng, ty: &TensorType, domain: Domain) -> HostTensor {
    let n = ty.element_count();
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            let (lo, hi, nonzero) = match domain {
                Domain::Range(lo, hi) => (lo, hi, false),
                Domain::NonZero(lo, hi) => (lo, hi, true),
            };
            let lo = if ty.dtype.is_unsigned_int() {
                lo.max(0.0)
            } else {
                lo
            };
            loop {
                let mut v = rng.uniform(lo, hi);
                if ty.dtype.is_int() {
                    v = v.round();
                }
                if ty.dtype == DType::Pred {
                    v = (rng.next_u64() & 1) as f64;
                }
                if !nonzero || v.abs() >= 0.5 {
                    break v;
                }
            }
        })
        .collect();
    HostTensor::from_f64s(ty.dtype, &vals, &ty.dims).expect("sizes match")
}

/// Allowed difference `atol + rtol * |want|` per dtype. XLA computes bf16/f16 math in f32
/// and rounds, and uses its own approximations of transcendental functions, while the
/// reference computes in f64 and rounds once: one ulp of the dtype plus a little.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (1e-6, 1e-5),
        DType::F16 => (1e-3, 2e-3),
        DType::BF16 => (1e-2, 1.6e-2),
        DType::I32 | DType::I64 | DType::U32 | DType::U8 | DType::Pred => (0.0, 0.0),
    }
}

/// Compares element by element with the dtype's tolerance; NaN matches NaN.
pub fn assert_close(what: &str, got: &HostTensor, want: &HostTensor, scale: f64) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: dims");
    let (atol, rtol) = tolerance(want.dtype());
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    if !want.dtype().is_float() && got.bytes() != want.bytes() {
        panic!("{what}: got {g:?}, want {w:?}");
    }
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan())
            || a == b
            || (a - b).abs() <= scale * (atol + rtol * b.abs());
        assert!(
            ok,
            "{what}: element {i}: got {a}, want {b} (atol {atol}, rtol {rtol}, x{scale})\n \
             got {g:?}\nwant {w:?}"
        );
    }
}

/// Compiles and runs `graph` on the cpu plugin.
pub fn run_device(graph: &Graph, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let text = lower::to_stablehlo(graph).expect("lower");
    let exe = client()
        .compile(&text, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{text}"));
    exe.execute_host(inputs)
        .unwrap_or_else(|e| panic!("execute failed: {e}\n{text}"))
}

/// Runs `graph` on the device and in the reference evaluator and compares every output.
pub fn check_graph(what: &str, graph: &Graph, inputs: &[HostTensor], scale: f64) {
    let want =
        reference::evaluate(graph, inputs).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let got = run_device(graph, inputs);
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("{what} (output {k})"), g, w, scale);
    }
}

/// One op on random operands (one parameter each), checked device vs reference
/// (tinygrad's `helper_test_op`). Returns the graph for further checks.
pub fn check_op(op: Op, operands: &[TensorType], domains: &[Domain], seed: u64) -> Graph {
    check_op_scaled(op, operands, domains, seed, 1.0)
}

pub fn check_op_scaled(
    op: Op,
    operands: &[TensorType],
    domains: &[Domain],
    seed: u64,
    scale: f64,
) -> Graph {
    let mut g = Graph::new();
    let params: Vec<_> = operands.iter().map(|t| g.parameter(t.clone())).collect();
    let what = format!(
        "{op} on {}",
        operands
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let out = g
        .push(op, &params)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    g.set_outputs(&[out]).expect("outputs");
    let mut rng = Rng::new(seed);
    let inputs: Vec<HostTensor> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| random_tensor(&mut rng, t, domains[i.min(domains.len() - 1)]))
        .collect();
    check_graph(&what, &g, &inputs, scale);
    g
}

pub fn ty(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}
