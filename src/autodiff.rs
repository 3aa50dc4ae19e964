//! Reverse-mode differentiation over the recorded (lazy) graph.
//!
//! `grad(loss, params)` walks the nodes below `loss`, then applies each op's vector-Jacobian
//! product in reverse order, recording the gradient computation as more lazy ops. Forward,
//! backward and the optimizer update therefore land in one step graph at the next `mark_step`.
//! Every op has an arm in [`vjp`] (no wildcard): a new primitive cannot be forgotten here, and a
//! non-differentiable one returns an error naming it.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

use neuron_pc_compiler::ir::{BinaryOp, CompareOp, Literal, Op, ReduceOp, TensorType, UnaryOp};
use neuron_pc_compiler::DType;

use crate::device::trace::{Node, Value};
use crate::device::{lock, DeviceInner};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn key(v: &Value) -> usize {
    match v {
        Value::Node(n) => Arc::as_ptr(n) as *const u8 as usize,
        Value::Data(d) => Arc::as_ptr(d) as *const u8 as usize,
    }
}

/// Gradients of the scalar `loss` with respect to each tensor of `wrt` (zeros where `loss`
/// does not depend on it). Recorded lazily.
#[track_caller]
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let location = Location::caller();
    if loss.elem_count() != 1 || !loss.dtype().is_float() {
        return Err(Error::Op {
            location,
            source: neuron_pc_compiler::Error::Shape {
                op: "grad",
                operands: loss.ty().to_string(),
                message: "the loss must be a float tensor with one element".into(),
            },
        });
    }
    let dev = loss.device_inner()?;
    let root = loss.value();
    let order = topo_order(&root);

    // Cotangents by value identity; values are kept alive by `order`.
    let mut cot: HashMap<usize, Tensor> = HashMap::new();
    cot.insert(key(&root), loss.constant_like(1.0)?.reshape(loss.dims())?);
    for v in order.iter().rev() {
        let Value::Node(node) = v else { continue };
        let Some(g) = cot.get(&key(v)).cloned() else { continue };
        let (op, ty) = lock(&dev.interner).op_of(node.op_id).clone();
        let y = dev.detached(v.clone(), ty);
        let xs: Vec<Tensor> = node.operands.iter().map(|o| dev.detached(o.clone(), value_type(&dev, o))).collect();
        let grads = vjp(&op, &xs, &y, &g, location)?;
        for (operand, gi) in node.operands.iter().zip(grads) {
            let Some(gi) = gi else { continue };
            let k = key(operand);
            let sum = match cot.remove(&k) {
                Some(prev) => prev.add(&gi)?,
                None => gi,
            };
            cot.insert(k, sum);
        }
    }
    wrt.iter()
        .map(|t| match cot.get(&key(&t.value())) {
            Some(g) => Ok(g.clone()),
            None => t.zeros_like(),
        })
        .collect()
}

fn value_type(dev: &DeviceInner, v: &Value) -> TensorType {
    match v {
        Value::Node(n) => lock(&dev.interner).op_of(n.op_id).1.clone(),
        Value::Data(d) => d.ty(),
    }
}

/// Values below `root` in post-order (operands before users).
fn topo_order(root: &Value) -> Vec<Value> {
    let mut order = Vec::new();
    let mut seen: HashMap<usize, ()> = HashMap::new();
    let mut stack: Vec<(Value, usize)> = vec![(root.clone(), 0)];
    seen.insert(key(root), ());
    while let Some((v, i)) = stack.last_mut() {
        let operands: &[Value] = match v {
            Value::Node(n) => &n.operands,
            Value::Data(_) => &[],
        };
        if *i < operands.len() {
            let c = operands[*i].clone();
            *i += 1;
            if seen.insert(key(&c), ()).is_none() {
                stack.push((c, 0));
            }
            continue;
        }
        let (v, _) = stack.pop().expect("not empty");
        order.push(v);
    }
    order
}

fn non_diff(op: &Op, location: &'static Location<'static>) -> Error {
    Error::Op {
        location,
        source: neuron_pc_compiler::Error::Shape {
            op: "grad",
            operands: op.name().to_string(),
            message: format!("{} is not differentiable", op.name()),
        },
    }
}

/// The gradient contributions of one op application, per operand (`None`: no gradient flows,
/// as into integer or pred operands).
fn vjp(op: &Op, x: &[Tensor], y: &Tensor, g: &Tensor, location: &'static Location<'static>) -> Result<Vec<Option<Tensor>>> {
    let float = |t: &Tensor| t.dtype().is_float();
    Ok(match op {
        Op::Parameter { .. } | Op::Constant(_) | Op::Iota { .. } | Op::RandomBits { .. } => vec![None; x.len()],
        Op::Unary(u) => {
            let a = &x[0];
            let d = match u {
                // d/dx -x = -1
                UnaryOp::Neg => g.neg()?,
                // d/dx |x| = sign(x)
                UnaryOp::Abs => g.mul(&a.sign()?)?,
                // piecewise constant: zero almost everywhere
                UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil => g.zeros_like()?,
                // d/dx e^x = e^x
                UnaryOp::Exp => g.mul(y)?,
                // d/dx ln x = 1/x
                UnaryOp::Log => g.div(a)?,
                // d/dx ln(1+x) = 1/(1+x)
                UnaryOp::Log1p => g.div(&a.add_scalar(1.0)?)?,
                // d/dx tanh x = 1 - tanh(x)^2
                UnaryOp::Tanh => g.mul(&y.mul(y)?.neg()?.add_scalar(1.0)?)?,
                // d/dx s(x) = s(x)(1 - s(x))
                UnaryOp::Logistic => g.mul(&y.mul(&y.neg()?.add_scalar(1.0)?)?)?,
                // d/dx sqrt x = 1/(2 sqrt x)
                UnaryOp::Sqrt => g.div(&y.mul_scalar(2.0)?)?,
                // d/dx x^-1/2 = -1/2 x^-3/2 = -y/(2x)
                UnaryOp::Rsqrt => g.mul(&y.div(a)?.mul_scalar(-0.5)?)?,
                // d/dx sin x = cos x
                UnaryOp::Sin => g.mul(&a.cos()?)?,
                // d/dx cos x = -sin x
                UnaryOp::Cos => g.mul(&a.sin()?.neg()?)?,
                // d/dx erf x = 2/sqrt(pi) e^(-x^2)
                UnaryOp::Erf => g.mul(&a.mul(a)?.neg()?.exp()?.mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?)?,
                UnaryOp::Not => return Err(non_diff(op, location)),
            };
            vec![Some(d)]
        }
        Op::Binary(b) => {
            let (a, c) = (&x[0], &x[1]);
            if !float(a) {
                return Err(non_diff(op, location));
            }
            let (da, dc) = match b {
                BinaryOp::Add => (g.clone(), g.clone()),
                BinaryOp::Sub => (g.clone(), g.neg()?),
                // d(ac) = c da + a dc
                BinaryOp::Mul => (g.mul(c)?, g.mul(a)?),
                // d(a/c) = da/c - a/c^2 dc
                BinaryOp::Div => (g.div(c)?, g.mul(y)?.div(c)?.neg()?),
                // rem(a, c) = a - c trunc(a/c): da = 1, dc = -trunc(a/c)
                BinaryOp::Rem => {
                    let q = a.sub(y)?.div(c)?;
                    (g.clone(), g.mul(&q)?.neg()?)
                }
                // d(a^c) = c a^(c-1) da + a^c ln(a) dc
                BinaryOp::Pow => {
                    let da = g.mul(c)?.mul(&a.pow(&c.add_scalar(-1.0)?)?)?;
                    let dc = g.mul(y)?.mul(&a.log()?)?;
                    (da, dc)
                }
                // the larger operand gets the gradient; ties go to the left one
                BinaryOp::Max | BinaryOp::Min => {
                    let pick_a = if *b == BinaryOp::Max { a.ge(c)? } else { a.le(c)? };
                    let zero = g.zeros_like()?;
                    (Tensor::where_cond(&pick_a, g, &zero)?, Tensor::where_cond(&pick_a, &zero, g)?)
                }
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return Err(non_diff(op, location)),
            };
            vec![Some(da), Some(dc)]
        }
        Op::Compare(_) => vec![None, None],
        Op::Select => {
            let zero = g.zeros_like()?;
            vec![None, Some(Tensor::where_cond(&x[0], g, &zero)?), Some(Tensor::where_cond(&x[0], &zero, g)?)]
        }
        Op::Convert(_) => {
            if float(&x[0]) && float(y) {
                vec![Some(g.to_dtype(x[0].dtype())?)]
            } else {
                vec![None]
            }
        }
        Op::BroadcastInDim { dims, broadcast_dimensions } => {
            // Sum over the new dimensions and over dimensions that were stretched from 1.
            let src = x[0].dims();
            let mut summed: Vec<isize> = (0..dims.len()).filter(|d| !broadcast_dimensions.contains(d)).map(|d| d as isize).collect();
            for (i, &d) in broadcast_dimensions.iter().enumerate() {
                if src[i] == 1 && dims[d] != 1 {
                    summed.push(d as isize);
                }
            }
            let s = if summed.is_empty() { g.clone() } else { g.sum(&summed, false)? };
            vec![Some(s.reshape(src)?)]
        }
        Op::Reshape { .. } => vec![Some(g.reshape(x[0].dims())?)],
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.permute(&inv)?)]
        }
        Op::Slice { start, limit, stride } => {
            let src = x[0].dims();
            let low: Vec<i64> = start.iter().map(|&s| s as i64).collect();
            let high: Vec<i64> = (0..src.len())
                .map(|i| {
                    let n = g.dims()[i];
                    let last = if n == 0 { start[i] } else { start[i] + (n - 1) * stride[i] + 1 };
                    let _ = limit;
                    src[i] as i64 - last as i64
                })
                .collect();
            let interior: Vec<usize> = stride.iter().map(|&s| s - 1).collect();
            vec![Some(g.pad_with_zero(low, high, interior)?)]
        }
        Op::DynamicSlice { .. } => {
            // Scatter the gradient into zeros at the same (clamped) offsets.
            let zeros = x[0].zeros_like()?;
            let mut grads = vec![Some(Tensor::apply_at(Op::DynamicUpdateSlice, &dynamic_args(&zeros, g, &x[1..]), location)?)];
            grads.extend(x[1..].iter().map(|_| None));
            grads
        }
        Op::DynamicUpdateSlice => {
            let update = &x[1];
            let zeros = update.zeros_like()?;
            let cleared = Tensor::apply_at(Op::DynamicUpdateSlice, &dynamic_args(g, &zeros, &x[2..]), location)?;
            let starts: Vec<&Tensor> = x[2..].iter().collect();
            let mut args: Vec<&Tensor> = vec![g];
            args.extend(starts);
            let du = Tensor::apply_at(Op::DynamicSlice { sizes: update.dims().to_vec() }, &args, location)?;
            let mut grads = vec![Some(cleared), Some(du)];
            grads.extend(x[2..].iter().map(|_| None));
            grads
        }
        Op::Concatenate { dim } => {
            let mut at = 0;
            let mut grads = Vec::new();
            for t in x {
                let n = t.dims()[*dim];
                grads.push(Some(g.narrow(*dim as isize, at, n)?));
                at += n;
            }
            grads
        }
        Op::Pad { low, interior, .. } => {
            // The operand's elements sit at low + i * (interior + 1); negative low crops.
            if low.iter().any(|&l| l < 0) {
                return Err(non_diff(op, location));
            }
            let src = x[0].dims();
            let start: Vec<usize> = low.iter().map(|&l| l as usize).collect();
            let stride: Vec<usize> = interior.iter().map(|&i| i + 1).collect();
            let limit: Vec<usize> = (0..src.len())
                .map(|i| if src[i] == 0 { start[i] } else { start[i] + (src[i] - 1) * stride[i] + 1 })
                .collect();
            let dx = Tensor::apply_at(Op::Slice { start, limit, stride }, &[g], location)?;
            let dpad = g.sum_all()?.sub(&dx.sum_all()?)?;
            vec![Some(dx), Some(dpad)]
        }
        Op::Reduce(r, dims) => {
            let a = &x[0];
            let kept: Vec<usize> = (0..a.rank()).map(|i| if dims.contains(&i) { 1 } else { a.dims()[i] }).collect();
            let gk = g.reshape(&kept)?.broadcast_to(a.dims())?;
            let d = match r {
                ReduceOp::Sum => gk,
                // the extreme elements share the gradient equally
                ReduceOp::Max | ReduceOp::Min => {
                    let yk = y.reshape(&kept)?.broadcast_to(a.dims())?;
                    let hit = a.eq(&yk)?.to_dtype(a.dtype())?;
                    let sdims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
                    let count = hit.sum(&sdims, true)?.broadcast_to(a.dims())?;
                    gk.mul(&hit)?.div(&count)?
                }
                // d(prod)/dx_i = prod / x_i
                ReduceOp::Prod => gk.mul(&y.reshape(&kept)?.broadcast_to(a.dims())?)?.div(a)?,
            };
            vec![Some(d)]
        }
        Op::ArgMax { .. } | Op::ArgMin { .. } => vec![None],
        Op::DotGeneral { lhs_batch, rhs_batch, lhs_contract, rhs_contract } => {
            dot_general_vjp(&x[0], &x[1], g, lhs_batch, rhs_batch, lhs_contract, rhs_contract, location)?
        }
        Op::Gather => {
            let zeros = x[0].zeros_like()?;
            vec![Some(zeros.scatter_add_rows(&x[1], g)?), None]
        }
        Op::ScatterAdd => vec![Some(g.clone()), None, Some(g.index_select_rows(&x[1])?)],
        Op::AllReduce { op: ReduceOp::Sum, replica_groups } => {
            vec![Some(Tensor::apply_at(Op::AllReduce { op: ReduceOp::Sum, replica_groups: replica_groups.clone() }, &[g], location)?)]
        }
        Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } => return Err(non_diff(op, location)),
    })
}

fn dynamic_args<'a>(a: &'a Tensor, b: &'a Tensor, starts: &'a [Tensor]) -> Vec<&'a Tensor> {
    let mut v = vec![a, b];
    v.extend(starts.iter());
    v
}

/// Gradients of `dot_general`: contract the output gradient with the other operand over that
/// operand's free dimensions, then put the result's dimensions back in operand order.
#[allow(clippy::too_many_arguments)]
fn dot_general_vjp(
    lhs: &Tensor,
    rhs: &Tensor,
    g: &Tensor,
    lhs_batch: &[usize],
    rhs_batch: &[usize],
    lhs_contract: &[usize],
    rhs_contract: &[usize],
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    let nb = lhs_batch.len();
    let free = |rank: usize, batch: &[usize], contract: &[usize]| -> Vec<usize> {
        (0..rank).filter(|d| !batch.contains(d) && !contract.contains(d)).collect()
    };
    let lhs_free = free(lhs.rank(), lhs_batch, lhs_contract);
    let rhs_free = free(rhs.rank(), rhs_batch, rhs_contract);
    let g_batch: Vec<usize> = (0..nb).collect();
    let g_lhs_free: Vec<usize> = (nb..nb + lhs_free.len()).collect();
    let g_rhs_free: Vec<usize> = (nb + lhs_free.len()..nb + lhs_free.len() + rhs_free.len()).collect();

    // dlhs = g . rhs over rhs's free dims → [batch, lhs_free, rhs's remaining (= its contract
    // dims, in rhs order)].
    let dl = Tensor::apply_at(
        Op::DotGeneral {
            lhs_batch: g_batch.clone(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contract: g_rhs_free.clone(),
            rhs_contract: rhs_free.clone(),
        },
        &[g, rhs],
        location,
    )?;
    // Where each lhs dimension sits in `dl`.
    let mut rhs_remaining: Vec<usize> = rhs_contract.to_vec();
    rhs_remaining.sort_unstable();
    let mut pos_l = vec![0usize; lhs.rank()];
    for (i, &d) in lhs_batch.iter().enumerate() {
        pos_l[d] = i;
    }
    for (i, &d) in lhs_free.iter().enumerate() {
        pos_l[d] = nb + i;
    }
    for (k, &d) in lhs_contract.iter().enumerate() {
        let r = rhs_contract[k];
        pos_l[d] = nb + lhs_free.len() + rhs_remaining.iter().position(|&x| x == r).expect("contract dim");
    }
    let dl = dl.permute(&pos_l)?;

    // drhs = lhs . g over lhs's free dims → [batch, lhs's remaining (its contract dims, in lhs
    // order), rhs_free].
    let dr = Tensor::apply_at(
        Op::DotGeneral {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: g_batch,
            lhs_contract: lhs_free.clone(),
            rhs_contract: g_lhs_free,
        },
        &[lhs, g],
        location,
    )?;
    let mut lhs_remaining: Vec<usize> = lhs_contract.to_vec();
    lhs_remaining.sort_unstable();
    let mut pos_r = vec![0usize; rhs.rank()];
    for (i, &d) in rhs_batch.iter().enumerate() {
        pos_r[d] = i;
    }
    for (k, &d) in rhs_contract.iter().enumerate() {
        let l = lhs_contract[k];
        pos_r[d] = nb + lhs_remaining.iter().position(|&x| x == l).expect("contract dim");
    }
    for (i, &d) in rhs_free.iter().enumerate() {
        pos_r[d] = nb + lhs_remaining.len() + i;
    }
    let dr = dr.permute(&pos_r)?;
    Ok(vec![Some(dl), Some(dr)])
}

impl Tensor {
    /// Zeros of this tensor's type (a constant of the graph).
    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        let dev = self.device_inner()?;
        Tensor::apply_nullary(&dev, Op::Constant(Literal::splat(self.dtype(), 0.0, self.dims())))
    }

    /// Pads with zeros (`low`/`high` before/after each dimension, `interior` between elements).
    #[track_caller]
    pub fn pad_with_zero(&self, low: Vec<i64>, high: Vec<i64>, interior: Vec<usize>) -> Result<Tensor> {
        let zero = self.constant_like(0.0)?;
        Tensor::apply(Op::Pad { low, high, interior }, &[self, &zero])
    }
}

impl DeviceInner {
    /// A tensor over an existing value that is not registered as pending: it never becomes a
    /// step output by itself (used for intermediate values during differentiation).
    pub(crate) fn detached(self: &Arc<Self>, value: Value, ty: TensorType) -> Tensor {
        use crate::tensor::{Cell, State};
        let state = match value {
            Value::Node(n) => State::Pending(n),
            Value::Data(d) => State::Data(d),
        };
        Tensor {
            cell: Arc::new(Cell {
                id: u64::MAX,
                ty,
                device: Arc::downgrade(self),
                state: std::sync::Mutex::new(state),
            }),
        }
    }
}

#[allow(dead_code)]
fn _unused(_: CompareOp, _: DType, _: &Node) {}
