//! A realistic training-step graph, written the way a tracing autodiff emits it (a fresh
//! constant for every Rust scalar, recomputed subexpressions, explicit transposes, seeds of
//! one): the example text encoder's forward pass, softmax cross-entropy, backward pass and an
//! AdamW update, in one graph. Shared by the pass tests and `examples/optlevels.rs`.

use neuron_pc_compiler::ir::{
    BinaryOp, CompareOp, Graph, Literal, NodeId, Op, ReduceOp, TensorType, UnaryOp,
};
use neuron_pc_compiler::{DType, Result};

/// Model and batch sizes.
#[derive(Clone, Copy, Debug)]
pub struct StepConfig {
    pub vocab: usize,
    pub embed: usize,
    pub seq: usize,
    /// Hidden widths of the GELU MLP after pooling.
    pub hidden: [usize; 3],
    pub classes: usize,
    pub batch: usize,
}

impl StepConfig {
    /// The example job's default configuration.
    pub const EXAMPLE: StepConfig = StepConfig {
        vocab: 8192,
        embed: 128,
        seq: 32,
        hidden: [512, 512, 256],
        classes: 64,
        batch: 64,
    };
    /// Small enough for the reference evaluator in debug builds.
    pub const TINY: StepConfig = StepConfig {
        vocab: 23,
        embed: 6,
        seq: 5,
        hidden: [8, 7, 5],
        classes: 4,
        batch: 3,
    };
}

/// Thin builder over [`Graph`] with the helpers a traced step uses.
pub struct G {
    pub g: Graph,
}

type R = Result<NodeId>;

impl G {
    fn f32t(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }
    fn dims(&self, x: NodeId) -> Vec<usize> {
        self.g.node_type(x).dims.clone()
    }
    fn op(&mut self, op: Op, args: &[NodeId]) -> R {
        self.g.push(op, args)
    }
    /// A scalar constant broadcast to `x`'s shape (what `x * 0.5` traces to).
    fn scalar_like(&mut self, v: f64, x: NodeId) -> R {
        let c = self.op(Op::Constant(Literal::splat(DType::F32, v, &[])), &[])?;
        let dims = self.dims(x);
        self.op(
            Op::BroadcastInDim {
                dims,
                broadcast_dimensions: vec![],
            },
            &[c],
        )
    }
    fn bin(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> R {
        self.op(Op::Binary(b), &[x, y])
    }
    fn un(&mut self, u: UnaryOp, x: NodeId) -> R {
        self.op(Op::Unary(u), &[x])
    }
    fn add_s(&mut self, x: NodeId, v: f64) -> R {
        let c = self.scalar_like(v, x)?;
        self.bin(BinaryOp::Add, x, c)
    }
    fn mul_s(&mut self, x: NodeId, v: f64) -> R {
        let c = self.scalar_like(v, x)?;
        self.bin(BinaryOp::Mul, x, c)
    }
    fn bcast(&mut self, x: NodeId, dims: &[usize], bd: &[usize]) -> R {
        self.op(
            Op::BroadcastInDim {
                dims: dims.to_vec(),
                broadcast_dimensions: bd.to_vec(),
            },
            &[x],
        )
    }
    fn sum(&mut self, x: NodeId, dims: &[usize]) -> R {
        self.op(Op::Reduce(ReduceOp::Sum, dims.to_vec()), &[x])
    }
    fn t2(&mut self, x: NodeId) -> R {
        self.op(Op::Transpose { perm: vec![1, 0] }, &[x])
    }
    /// `x [m,k] @ y [k,n]`.
    fn matmul(&mut self, x: NodeId, y: NodeId) -> R {
        self.op(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![0],
            },
            &[x, y],
        )
    }
    /// GELU, tanh form: `0.5 x (1 + tanh(c (x + 0.044715 x^3)))`.
    fn gelu(&mut self, x: NodeId) -> R {
        let inner = self.gelu_inner(x)?;
        let t = self.un(UnaryOp::Tanh, inner)?;
        let one_t = self.add_s(t, 1.0)?;
        let hx = self.mul_s(x, 0.5)?;
        self.bin(BinaryOp::Mul, hx, one_t)
    }
    fn gelu_inner(&mut self, x: NodeId) -> R {
        let x2 = self.bin(BinaryOp::Mul, x, x)?;
        let x3 = self.bin(BinaryOp::Mul, x2, x)?;
        let a = self.mul_s(x3, 0.044715)?;
        let s = self.bin(BinaryOp::Add, x, a)?;
        self.mul_s(s, (2.0 / std::f64::consts::PI).sqrt())
    }
    /// d gelu / dx, recomputing the forward terms as a tracer would.
    fn gelu_grad(&mut self, x: NodeId, dy: NodeId) -> R {
        // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3*0.044715 x^2)
        let inner = self.gelu_inner(x)?;
        let t = self.un(UnaryOp::Tanh, inner)?;
        let one_t = self.add_s(t, 1.0)?;
        let left = self.mul_s(one_t, 0.5)?;
        let t2 = self.bin(BinaryOp::Mul, t, t)?;
        let one = self.scalar_like(1.0, t2)?;
        let sech2 = self.bin(BinaryOp::Sub, one, t2)?;
        let x2 = self.bin(BinaryOp::Mul, x, x)?;
        let p = self.mul_s(x2, 3.0 * 0.044715)?;
        let p1 = self.add_s(p, 1.0)?;
        let dinner = self.mul_s(p1, (2.0 / std::f64::consts::PI).sqrt())?;
        let hx = self.mul_s(x, 0.5)?;
        let r = self.bin(BinaryOp::Mul, hx, sech2)?;
        let right = self.bin(BinaryOp::Mul, r, dinner)?;
        let d = self.bin(BinaryOp::Add, left, right)?;
        self.bin(BinaryOp::Mul, d, dy)
    }
    /// One AdamW update of `p` with gradient `g`; returns (p', m', v').
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &mut self,
        p: NodeId,
        g: NodeId,
        m: NodeId,
        v: NodeId,
        lr: NodeId,
        bc1: NodeId,
        bc2: NodeId,
    ) -> Result<[NodeId; 3]> {
        let dims = self.dims(p);
        let (b1, b2, eps, wd) = (0.9, 0.999, 1e-8, 0.01);
        let m1 = self.mul_s(m, b1)?;
        let g1 = self.mul_s(g, 1.0 - b1)?;
        let m_new = self.bin(BinaryOp::Add, m1, g1)?;
        let v1 = self.mul_s(v, b2)?;
        let gg = self.bin(BinaryOp::Mul, g, g)?;
        let g2 = self.mul_s(gg, 1.0 - b2)?;
        let v_new = self.bin(BinaryOp::Add, v1, g2)?;
        let bc1b = self.bcast(bc1, &dims, &[])?;
        let mhat = self.bin(BinaryOp::Div, m_new, bc1b)?;
        let bc2b = self.bcast(bc2, &dims, &[])?;
        let vhat = self.bin(BinaryOp::Div, v_new, bc2b)?;
        let sq = self.un(UnaryOp::Sqrt, vhat)?;
        let den = self.add_s(sq, eps)?;
        let upd = self.bin(BinaryOp::Div, mhat, den)?;
        let decay = self.mul_s(p, wd)?;
        let step = self.bin(BinaryOp::Add, upd, decay)?;
        let lrb = self.bcast(lr, &dims, &[])?;
        let scaled = self.bin(BinaryOp::Mul, lrb, step)?;
        let p_new = self.bin(BinaryOp::Sub, p, scaled)?;
        Ok([p_new, m_new, v_new])
    }
}

/// The parameters of [`build_step`] in order: tokens `i32[B,S]`, mask `f32[B,S]`, labels
/// `i32[B]`, lr `f32[]`, step `f32[]`, then for each weight (embedding, W1, b1, W2, b2, W3,
/// b3, Wp, bp): the weight, its first moment, its second moment.
/// Outputs: loss, then (weight', m', v') per weight.
pub fn build_step(c: StepConfig) -> Result<Graph> {
    let mut g = G { g: Graph::new() };
    let (b, s, e) = (c.batch, c.seq, c.embed);
    let tokens = g.g.parameter(TensorType::new(DType::I32, vec![b, s]));
    let mask = g.g.parameter(G::f32t(&[b, s]));
    let labels = g.g.parameter(TensorType::new(DType::I32, vec![b]));
    let lr = g.g.parameter(G::f32t(&[]));
    let t = g.g.parameter(G::f32t(&[]));
    let mut shapes: Vec<Vec<usize>> = vec![vec![c.vocab, e]];
    let widths = [e, c.hidden[0], c.hidden[1], c.hidden[2], c.classes];
    for w in widths.windows(2) {
        shapes.push(vec![w[0], w[1]]);
        shapes.push(vec![w[1]]);
    }
    let mut weights = Vec::new();
    for sh in &shapes {
        let p = g.g.parameter(G::f32t(sh));
        let m = g.g.parameter(G::f32t(sh));
        let v = g.g.parameter(G::f32t(sh));
        weights.push((p, m, v));
    }
    // Forward: masked mean of token embeddings.
    let emb = g.op(Op::Gather, &[weights[0].0, tokens])?;
    let maskb = g.bcast(mask, &[b, s, e], &[0, 1])?;
    let em = g.bin(BinaryOp::Mul, emb, maskb)?;
    let summed = g.sum(em, &[1])?;
    let cnt = g.sum(mask, &[1])?;
    let cnt = g.add_s(cnt, 1e-6)?;
    let cntb = g.bcast(cnt, &[b, e], &[0])?;
    let mut h = g.bin(BinaryOp::Div, summed, cntb)?;
    let pooled = h;
    // MLP: three GELU layers, then the projection to classes.
    let mut pre = Vec::new();
    let mut ins = Vec::new();
    for layer in 0..4 {
        let (wi, bi) = (weights[1 + 2 * layer].0, weights[2 + 2 * layer].0);
        let z = g.matmul(h, wi)?;
        let n = widths[layer + 1];
        let bb = g.bcast(bi, &[b, n], &[1])?;
        let a = g.bin(BinaryOp::Add, z, bb)?;
        ins.push(h);
        pre.push(a);
        h = if layer < 3 { g.gelu(a)? } else { a };
    }
    let logits = h;
    // Softmax cross-entropy with integer labels.
    let k = c.classes;
    let mx = g.op(Op::Reduce(ReduceOp::Max, vec![1]), &[logits])?;
    let mxb = g.bcast(mx, &[b, k], &[0])?;
    let sh = g.bin(BinaryOp::Sub, logits, mxb)?;
    let ex = g.un(UnaryOp::Exp, sh)?;
    let se = g.sum(ex, &[1])?;
    let lse = g.un(UnaryOp::Log, se)?;
    let lseb = g.bcast(lse, &[b, k], &[0])?;
    let logp = g.bin(BinaryOp::Sub, sh, lseb)?;
    let iota = g.op(
        Op::Iota {
            dims: vec![b, k],
            dim: 1,
            dtype: DType::I32,
        },
        &[],
    )?;
    let lb = g.bcast(labels, &[b, k], &[0])?;
    let hit = g.op(Op::Compare(CompareOp::Eq), &[iota, lb])?;
    let onehot = g.op(Op::Convert(DType::F32), &[hit])?;
    let picked = g.bin(BinaryOp::Mul, onehot, logp)?;
    let nll = g.sum(picked, &[1])?;
    let total = g.sum(nll, &[0])?;
    let loss = g.mul_s(total, -1.0 / b as f64)?;
    // Backward. The seed d(loss)/d(loss) = 1 is traced as a constant multiplied in.
    let seed = g.scalar_like(1.0, loss)?;
    let dtotal = g.mul_s(seed, -1.0 / b as f64)?;
    let dnll = g.bcast(dtotal, &[b], &[])?;
    let dpicked = g.bcast(dnll, &[b, k], &[0])?;
    let dlogp = g.bin(BinaryOp::Mul, dpicked, onehot)?;
    let ex2 = g.un(UnaryOp::Exp, sh)?; // recomputed, as a tracer without memoization does
    let se2 = g.sum(ex2, &[1])?;
    let seb = g.bcast(se2, &[b, k], &[0])?;
    let softmax = g.bin(BinaryOp::Div, ex2, seb)?;
    let sdl = g.sum(dlogp, &[1])?;
    let sdlb = g.bcast(sdl, &[b, k], &[0])?;
    let corr = g.bin(BinaryOp::Mul, softmax, sdlb)?;
    let mut dz = g.bin(BinaryOp::Sub, dlogp, corr)?;
    let mut grads = vec![NodeId(0); weights.len()];
    for layer in (0..4).rev() {
        if layer < 3 {
            dz = g.gelu_grad(pre[layer], dz)?;
        }
        let xin = ins[layer];
        let xt = g.t2(xin)?;
        grads[1 + 2 * layer] = g.matmul(xt, dz)?;
        grads[2 + 2 * layer] = g.sum(dz, &[0])?;
        let wt = g.t2(weights[1 + 2 * layer].0)?;
        let wtt = g.t2(wt)?; // transpose(transpose(w)) from a traced `w.t().t()`
        let wt2 = g.t2(wtt)?;
        dz = g.matmul(dz, wt2)?;
    }
    // Through the masked mean into the embedding table.
    let _ = pooled;
    let dsum = g.bin(BinaryOp::Div, dz, cntb)?;
    let dem = g.bcast(dsum, &[b, s, e], &[0, 2])?;
    let demb = g.bin(BinaryOp::Mul, dem, maskb)?;
    let zeros = g.scalar_like(0.0, weights[0].0)?;
    grads[0] = g.op(Op::ScatterAdd, &[zeros, tokens, demb])?;
    // AdamW with bias corrections 1 - beta^t computed in the graph from the step input.
    let b1 = g.op(Op::Constant(Literal::splat(DType::F32, 0.9, &[])), &[])?;
    let b2 = g.op(Op::Constant(Literal::splat(DType::F32, 0.999, &[])), &[])?;
    let p1 = g.bin(BinaryOp::Pow, b1, t)?;
    let p2 = g.bin(BinaryOp::Pow, b2, t)?;
    let one1 = g.op(Op::Constant(Literal::splat(DType::F32, 1.0, &[])), &[])?;
    let bc1 = g.bin(BinaryOp::Sub, one1, p1)?;
    let one2 = g.op(Op::Constant(Literal::splat(DType::F32, 1.0, &[])), &[])?;
    let bc2 = g.bin(BinaryOp::Sub, one2, p2)?;
    let mut outs = vec![loss];
    for (i, &(p, m, v)) in weights.iter().enumerate() {
        outs.extend(g.adamw(p, grads[i], m, v, lr, bc1, bc2)?);
    }
    // A value computed and then dropped (a metric the loop never read).
    let _unused = g.un(UnaryOp::Abs, loss)?;
    g.g.set_outputs(&outs)?;
    Ok(g.g)
}
