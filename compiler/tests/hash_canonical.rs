//! The canonical form and its SHA-256: stable across processes, sensitive to every change of
//! op, attribute, shape, dtype, constant, parameter signature and outputs.

use std::collections::HashMap;
use std::process::Command;

use neuron_pc_compiler::ir::{
    BinaryOp, Graph, Literal, Op, ReduceOp, TensorType, UnaryOp, CANONICAL_VERSION,
};
use neuron_pc_compiler::{DType, HostTensor};

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

/// What to vary in the base graph.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    None,
    ParamDims,
    ParamDtype,
    ExtraParam,
    SwapParams,
    UnaryOp,
    OperandOrder,
    ConstantValue,
    ConstantNegativeZero,
    ConstantDense,
    ReduceDims,
    ReduceKind,
    DotContract,
    TransposePerm,
    ConvertDtype,
    ArgmaxIndexDtype,
    RandomDims,
    ReplicaGroups,
    SliceStride,
    PadLow,
    OutputOrder,
    ExtraOutput,
}

const CHANGES: [Change; 22] = [
    Change::None,
    Change::ParamDims,
    Change::ParamDtype,
    Change::ExtraParam,
    Change::SwapParams,
    Change::UnaryOp,
    Change::OperandOrder,
    Change::ConstantValue,
    Change::ConstantNegativeZero,
    Change::ConstantDense,
    Change::ReduceDims,
    Change::ReduceKind,
    Change::DotContract,
    Change::TransposePerm,
    Change::ConvertDtype,
    Change::ArgmaxIndexDtype,
    Change::RandomDims,
    Change::ReplicaGroups,
    Change::SliceStride,
    Change::PadLow,
    Change::OutputOrder,
    Change::ExtraOutput,
];

/// A small graph touching many ops, with exactly one thing changed.
fn build(c: Change) -> Graph {
    let mut g = Graph::new();
    let n = if c == Change::ParamDims { 5 } else { 4 };
    let dt = if c == Change::ParamDtype {
        DType::BF16
    } else {
        DType::F32
    };
    let (a, b) = if c == Change::SwapParams {
        let b = g.parameter(t(dt, &[n, n]));
        let a = g.parameter(t(dt, &[n, 4]));
        (a, b)
    } else {
        let a = g.parameter(t(dt, &[n, 4]));
        let b = g.parameter(t(dt, &[n, n]));
        (a, b)
    };
    let key = g.parameter(t(DType::U32, &[2]));
    if c == Change::ExtraParam {
        g.parameter(t(DType::F32, &[]));
    }
    let u = if c == Change::UnaryOp {
        UnaryOp::Exp
    } else {
        UnaryOp::Tanh
    };
    let x = g.push(Op::Unary(u), &[a]).unwrap();
    let lit = match c {
        Change::ConstantValue => Literal::splat(dt, 2.0, &[n, 4]),
        Change::ConstantNegativeZero => Literal::splat(dt, -0.0, &[n, 4]),
        Change::ConstantDense => {
            Literal::dense(&HostTensor::from_f64s(dt, &vec![0.0; n * 4], &[n, 4]).unwrap())
        }
        _ => Literal::splat(dt, 0.0, &[n, 4]),
    };
    let k = g.push(Op::Constant(lit), &[]).unwrap();
    let (l, r) = if c == Change::OperandOrder {
        (k, x)
    } else {
        (x, k)
    };
    let s = g.push(Op::Binary(BinaryOp::Sub), &[l, r]).unwrap();
    let contract = if c == Change::DotContract { 1 } else { 0 };
    let d = g
        .push(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![0],
                rhs_contract: vec![contract],
            },
            &[s, b],
        )
        .unwrap();
    let perm = if c == Change::TransposePerm {
        vec![0, 1]
    } else {
        vec![1, 0]
    };
    let tr = g.push(Op::Transpose { perm }, &[d]).unwrap();
    let rk = if c == Change::ReduceKind {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let rd = if c == Change::ReduceDims {
        vec![0]
    } else {
        vec![1]
    };
    let red = g.push(Op::Reduce(rk, rd), &[tr]).unwrap();
    let to = if c == Change::ConvertDtype {
        DType::F64
    } else {
        DType::F16
    };
    let cv = g.push(Op::Convert(to), &[red]).unwrap();
    let idx = if c == Change::ArgmaxIndexDtype {
        DType::I64
    } else {
        DType::I32
    };
    let am = g
        .push(
            Op::ArgMax {
                dim: 1,
                index_dtype: idx,
            },
            &[d],
        )
        .unwrap();
    let rdims = if c == Change::RandomDims {
        vec![3, 2]
    } else {
        vec![2, 3]
    };
    let bits = g.push(Op::RandomBits { dims: rdims }, &[key]).unwrap();
    let groups = if c == Change::ReplicaGroups {
        vec![vec![1], vec![0]]
    } else {
        vec![vec![0], vec![1]]
    };
    let ar = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: groups,
            },
            &[cv],
        )
        .unwrap();
    let stride = if c == Change::SliceStride { 2 } else { 1 };
    let sl = g
        .push(
            Op::Slice {
                start: vec![0, 0],
                limit: vec![2, 2],
                stride: vec![1, stride],
            },
            &[bits],
        )
        .unwrap();
    let zero = g
        .push(Op::Constant(Literal::splat(DType::U32, 0.0, &[])), &[])
        .unwrap();
    let low = if c == Change::PadLow { 1 } else { 0 };
    let pd = g
        .push(
            Op::Pad {
                low: vec![low, 0],
                high: vec![1, 0],
                interior: vec![0, 0],
            },
            &[sl, zero],
        )
        .unwrap();
    let outs = match c {
        Change::OutputOrder => vec![am, ar, pd],
        Change::ExtraOutput => vec![ar, am, pd, pd],
        _ => vec![ar, am, pd],
    };
    g.set_outputs(&outs).unwrap();
    g
}

#[test]
fn every_change_changes_the_fingerprint() {
    let mut seen: HashMap<[u8; 32], Change> = HashMap::new();
    for c in CHANGES {
        let g = build(c);
        assert_eq!(
            g.fingerprint(),
            build(c).fingerprint(),
            "{c:?}: rebuilding gives the same hash"
        );
        if let Some(prev) = seen.insert(g.fingerprint(), c) {
            panic!("{c:?} and {prev:?} hash the same");
        }
    }
    assert_eq!(seen.len(), CHANGES.len());
}

#[test]
fn canonical_bytes_are_versioned_and_hash_with_sha256() {
    let g = build(Change::None);
    let bytes = g.canonical_bytes();
    assert_eq!(&bytes[..4], b"NPCG");
    assert_eq!(
        u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        CANONICAL_VERSION
    );
    use sha2::Digest;
    let want: [u8; 32] = sha2::Sha256::digest(&bytes).into();
    assert_eq!(g.fingerprint(), want);
    assert_eq!(g.fingerprint_hex(), hex::encode(want));
}

/// Pinned so that any change to the encoding shows up here (and comes with a bump of
/// `CANONICAL_VERSION`); it also holds on every machine, since the encoding is fixed-width
/// little-endian.
#[test]
fn fingerprint_is_pinned() {
    assert_eq!(build(Change::None).fingerprint_hex(), PINNED);
}

const PINNED: &str = "c12b32f1fe101313c22230141c902fe66ad747bcdc3cad4a28cfc78d1d7676ab";

/// The child half of `same_hash_in_another_process`: prints the fingerprint when asked.
#[test]
fn child_prints_fingerprint() {
    if std::env::var("NEURON_PC_HASH_CHILD").is_ok() {
        println!("FINGERPRINT={}", build(Change::None).fingerprint_hex());
    }
}

#[test]
fn same_hash_in_another_process() {
    let exe = std::env::current_exe().unwrap();
    let mut hashes = Vec::new();
    for _ in 0..2 {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "child_prints_fingerprint",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("NEURON_PC_HASH_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let line = stdout
            .lines()
            .find_map(|l| l.split("FINGERPRINT=").nth(1))
            .map(|s| s.trim().to_string());
        hashes.push(line.unwrap_or_else(|| panic!("no fingerprint in child output:\n{stdout}")));
    }
    let here = build(Change::None).fingerprint_hex();
    assert_eq!(hashes, vec![here.clone(), here]);
}

/// Timing of the per-step host work on a 600-node graph (build with inference, canonical bytes
/// and SHA-256, lowering). Run with `cargo test --release --test hash_canonical -- --ignored
/// --nocapture`; prints figures, asserts nothing about time.
#[test]
#[ignore]
fn timing_600_nodes() {
    use std::time::Instant;
    let build_600 = || {
        let mut g = Graph::with_capacity(610);
        let x = g.parameter(t(DType::F32, &[64, 128]));
        let w = g.parameter(t(DType::F32, &[128, 128]));
        let mut h = x;
        while g.len() < 600 {
            let d = g
                .push(
                    Op::DotGeneral {
                        lhs_batch: vec![],
                        rhs_batch: vec![],
                        lhs_contract: vec![1],
                        rhs_contract: vec![0],
                    },
                    &[h, w],
                )
                .unwrap();
            let c = g
                .push(Op::Constant(Literal::splat(DType::F32, 0.5, &[])), &[])
                .unwrap();
            let b = g
                .push(
                    Op::BroadcastInDim {
                        dims: vec![64, 128],
                        broadcast_dimensions: vec![],
                    },
                    &[c],
                )
                .unwrap();
            let m = g.push(Op::Binary(BinaryOp::Mul), &[d, b]).unwrap();
            h = g.push(Op::Unary(UnaryOp::Tanh), &[m]).unwrap();
        }
        g.set_outputs(&[h]).unwrap();
        g
    };
    let reps = 200;
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(build_600());
    }
    let build = t0.elapsed() / reps;
    let g = build_600();
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(g.fingerprint());
    }
    let hash = t0.elapsed() / reps;
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(neuron_pc_compiler::lower::to_stablehlo(&g).unwrap());
    }
    let lower = t0.elapsed() / reps;
    println!(
        "600 nodes: build+infer {build:?} ({:?}/node), canonical bytes {} B, fingerprint {hash:?}, lowering {lower:?}",
        build / 600,
        g.canonical_bytes().len()
    );
}
