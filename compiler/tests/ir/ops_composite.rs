//! Composites a training step is made of (layer norm, softmax cross-entropy, attention, GELU,
//! dropout), built from primitives with explicit broadcasts, on the cpu plugin against the
//! reference evaluator.

use crate::ops_common;

use neuron_pc_compiler::ir::{BinaryOp, CompareOp, Graph, Literal, NodeId, Op, ReduceOp, UnaryOp};
use neuron_pc_compiler::{DType, HostTensor};
use ops_common::{check_graph, random_tensor, ty, Domain, Rng};

struct B<'a> {
    g: &'a mut Graph,
    dtype: DType,
}

impl B<'_> {
    fn op(&mut self, op: Op, args: &[NodeId]) -> NodeId {
        self.g.push(op, args).unwrap_or_else(|e| panic!("{e}"))
    }
    fn bin(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
        self.op(Op::Binary(b), &[x, y])
    }
    fn un(&mut self, u: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary(u), &[x])
    }
    fn dims(&self, x: NodeId) -> Vec<usize> {
        self.g.node_type(x).dims.clone()
    }
    /// A scalar constant broadcast to `dims`.
    fn full(&mut self, v: f64, dims: &[usize]) -> NodeId {
        let c = self.op(Op::Constant(Literal::splat(self.dtype, v, &[])), &[]);
        self.op(
            Op::BroadcastInDim {
                dims: dims.to_vec(),
                broadcast_dimensions: vec![],
            },
            &[c],
        )
    }
    /// Reduces the last dim and broadcasts back (keepdim + broadcast, like the tensor layer).
    fn reduce_last(&mut self, r: ReduceOp, x: NodeId) -> NodeId {
        let dims = self.dims(x);
        let last = dims.len() - 1;
        let red = self.op(Op::Reduce(r, vec![last]), &[x]);
        let bd: Vec<usize> = (0..last).collect();
        self.op(
            Op::BroadcastInDim {
                dims,
                broadcast_dimensions: bd,
            },
            &[red],
        )
    }
    fn mean_last(&mut self, x: NodeId) -> NodeId {
        let dims = self.dims(x);
        let s = self.reduce_last(ReduceOp::Sum, x);
        let n = self.full(1.0 / dims[dims.len() - 1] as f64, &dims);
        self.bin(BinaryOp::Mul, s, n)
    }
    fn softmax_last(&mut self, x: NodeId) -> NodeId {
        let m = self.reduce_last(ReduceOp::Max, x);
        let d = self.bin(BinaryOp::Sub, x, m);
        let e = self.un(UnaryOp::Exp, d);
        let s = self.reduce_last(ReduceOp::Sum, e);
        self.bin(BinaryOp::Div, e, s)
    }
}

fn inputs(g: &Graph, seed: u64) -> Vec<HostTensor> {
    let mut rng = Rng::new(seed);
    g.parameter_types()
        .iter()
        .map(|t| {
            let dom = if t.dtype.is_int() {
                Domain::Range(0.0, 4.0)
            } else {
                Domain::Range(-2.0, 2.0)
            };
            random_tensor(&mut rng, t, dom)
        })
        .collect()
}

#[test]
fn layer_norm() {
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let mut g = Graph::new();
        let x = g.parameter(ty(dtype, &[4, 16]));
        let w = g.parameter(ty(dtype, &[16]));
        let mut b = B { g: &mut g, dtype };
        let mu = b.mean_last(x);
        let xc = b.bin(BinaryOp::Sub, x, mu);
        let sq = b.bin(BinaryOp::Mul, xc, xc);
        let var = b.mean_last(sq);
        let eps = b.full(1e-5, &[4, 16]);
        let ve = b.bin(BinaryOp::Add, var, eps);
        let r = b.un(UnaryOp::Rsqrt, ve);
        let n = b.bin(BinaryOp::Mul, xc, r);
        let wb = b.op(
            Op::BroadcastInDim {
                dims: vec![4, 16],
                broadcast_dimensions: vec![1],
            },
            &[w],
        );
        let y = b.bin(BinaryOp::Mul, n, wb);
        g.set_outputs(&[y]).unwrap();
        let scale = if dtype == DType::BF16 { 4.0 } else { 1.0 };
        check_graph(&format!("layer norm {dtype}"), &g, &inputs(&g, 1), scale);
    }
}

/// Softmax cross-entropy with integer labels via iota == label (one-hot), mean over the batch.
#[test]
fn softmax_cross_entropy() {
    let mut g = Graph::new();
    let logits = g.parameter(ty(DType::F32, &[8, 5]));
    let labels = g.parameter(ty(DType::I32, &[8]));
    let mut b = B {
        g: &mut g,
        dtype: DType::F32,
    };
    let p = b.softmax_last(logits);
    let logp = b.un(UnaryOp::Log, p);
    let iota = b.op(
        Op::Iota {
            dims: vec![8, 5],
            dim: 1,
            dtype: DType::I32,
        },
        &[],
    );
    let lb = b.op(
        Op::BroadcastInDim {
            dims: vec![8, 5],
            broadcast_dimensions: vec![0],
        },
        &[labels],
    );
    let onehot = b.op(Op::Compare(CompareOp::Eq), &[iota, lb]);
    let zeros = b.full(0.0, &[8, 5]);
    let picked = b.op(Op::Select, &[onehot, logp, zeros]);
    let total = b.op(Op::Reduce(ReduceOp::Sum, vec![0, 1]), &[picked]);
    let k = b.op(
        Op::Constant(Literal::splat(DType::F32, -1.0 / 8.0, &[])),
        &[],
    );
    let loss = b.bin(BinaryOp::Mul, total, k);
    let pred = b.op(
        Op::ArgMax {
            dim: 1,
            index_dtype: DType::I32,
        },
        &[logits],
    );
    g.set_outputs(&[loss, pred]).unwrap();
    check_graph("cross-entropy", &g, &inputs(&g, 2), 1.0);
}

/// One head of scaled dot-product attention over a batch, with a GELU (erf form) after it.
#[test]
fn attention_and_gelu() {
    for dtype in [DType::F32, DType::F16] {
        let (bsz, seq, d) = (2, 5, 8);
        let mut g = Graph::new();
        let q = g.parameter(ty(dtype, &[bsz, seq, d]));
        let k = g.parameter(ty(dtype, &[bsz, seq, d]));
        let v = g.parameter(ty(dtype, &[bsz, seq, d]));
        let mut b = B { g: &mut g, dtype };
        let qk = Op::DotGeneral {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![2],
        };
        let s = b.op(qk, &[q, k]);
        let c = b.full(1.0 / (d as f64).sqrt(), &[bsz, seq, seq]);
        let s = b.bin(BinaryOp::Mul, s, c);
        let p = b.softmax_last(s);
        let pv = Op::DotGeneral {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
        };
        let o = b.op(pv, &[p, v]);
        // gelu(x) = x/2 * (1 + erf(x / sqrt 2))
        let r2 = b.full(std::f64::consts::FRAC_1_SQRT_2, &[bsz, seq, d]);
        let xs = b.bin(BinaryOp::Mul, o, r2);
        let e = b.un(UnaryOp::Erf, xs);
        let one = b.full(1.0, &[bsz, seq, d]);
        let e1 = b.bin(BinaryOp::Add, e, one);
        let half = b.full(0.5, &[bsz, seq, d]);
        let xh = b.bin(BinaryOp::Mul, o, half);
        let y = b.bin(BinaryOp::Mul, xh, e1);
        g.set_outputs(&[y]).unwrap();
        let scale = if dtype == DType::F16 { 4.0 } else { 1.0 };
        check_graph(
            &format!("attention + gelu {dtype}"),
            &g,
            &inputs(&g, 3),
            scale,
        );
    }
}

/// Dropout from random bits: keep where bits < p * 2^32, scale kept values by 1 / (1 - p).
#[test]
fn dropout_from_random_bits() {
    let mut g = Graph::new();
    let key = g.parameter(ty(DType::U32, &[2]));
    let x = g.parameter(ty(DType::F32, &[16, 16]));
    let mut b = B {
        g: &mut g,
        dtype: DType::F32,
    };
    let bits = b.op(Op::RandomBits { dims: vec![16, 16] }, &[key]);
    let t = b.op(
        Op::Constant(Literal::splat(DType::U32, 0.25 * 4294967296.0, &[16, 16])),
        &[],
    );
    let drop = b.op(Op::Compare(CompareOp::Lt), &[bits, t]);
    let zeros = b.full(0.0, &[16, 16]);
    let s = b.full(1.0 / 0.75, &[16, 16]);
    let scaled = b.bin(BinaryOp::Mul, x, s);
    let y = b.op(Op::Select, &[drop, zeros, scaled]);
    g.set_outputs(&[y]).unwrap();
    let ins = inputs(&g, 4);
    check_graph("dropout", &g, &ins, 1.0);
    let out = neuron_pc_compiler::reference::evaluate(&g, &ins).unwrap()[0]
        .to_vec::<f32>()
        .unwrap();
    let dropped = out.iter().filter(|v| **v == 0.0).count();
    assert!(
        (40..90).contains(&dropped),
        "{dropped} of 256 dropped at p = 0.25"
    );
}
