//! Reverse-mode differentiation over the recorded (lazy) graph.
//!
//! `grad(loss, params)` walks the nodes below `loss`, then applies each op's vector-Jacobian
//! product in reverse order, recording the gradient computation as more lazy ops. Forward,
//! backward and the optimizer update therefore land in one step graph at the next `mark_step`.
//! Every op has an arm in `vjp` (no wildcard): a new primitive cannot be forgotten here, and a
//! non-differentiable one returns an error naming it.

use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::sync::{Arc, Weak};

use neuron_pc_compiler::ir::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};

use crate::device::trace::Value;
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
///
/// Only ops on a path from a `wrt` tensor to `loss` are differentiated, so a
/// non-differentiable op elsewhere in the graph (or an integer side computation such as
/// `argmax`) does not matter. Gradients never flow into integer or pred operands (indices,
/// conditions); a float path through an op without a gradient rule is an error naming it.
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
    if wrt
        .iter()
        .any(|t| !Weak::ptr_eq(&t.cell.device, &loss.cell.device))
    {
        return Err(Error::DeviceMismatch {
            location,
            op: "grad",
        });
    }
    let dev = loss.device_inner()?;
    let root = loss.value();
    let order = topo_order(&root);

    // Values that some `wrt` tensor flows into; only these need cotangents.
    let targets: HashSet<usize> = wrt.iter().map(|t| key(&t.value())).collect();
    let mut needed: HashSet<usize> = HashSet::new();
    for v in &order {
        let operands: &[Value] = match v {
            Value::Node(n) => &n.operands,
            Value::Data(_) => &[],
        };
        let k = key(v);
        if targets.contains(&k) || operands.iter().any(|o| needed.contains(&key(o))) {
            needed.insert(k);
        }
    }

    // Cotangents by value identity; values are kept alive by `order`.
    let mut cot: HashMap<usize, Tensor> = HashMap::new();
    cot.insert(key(&root), loss.constant_like(1.0)?.reshape(loss.dims())?);
    for v in order.iter().rev() {
        let Value::Node(node) = v else { continue };
        if !node.operands.iter().any(|o| needed.contains(&key(o))) {
            continue;
        }
        let Some(g) = cot.remove(&key(v)) else {
            continue;
        };
        let (op, ty) = {
            let interner = lock(&dev.interner);
            let (op, ty) = interner.op_of(node.op_id);
            (op.clone(), ty.clone())
        };
        let y = Tensor {
            cell: dev.detached_cell(v.clone(), ty),
        };
        let xs: Vec<Tensor> = node
            .operands
            .iter()
            .map(|o| Tensor {
                cell: dev.detached_cell(o.clone(), value_type(&dev, o)),
            })
            .collect();
        let grads = vjp(&op, &xs, &y, &g, location)?;
        for (operand, gi) in node.operands.iter().zip(grads) {
            let k = key(operand);
            let Some(gi) = gi.filter(|_| needed.contains(&k)) else {
                continue;
            };
            let sum = match cot.remove(&k) {
                Some(prev) => prev.add(&gi)?,
                None => gi,
            };
            cot.insert(k, sum);
        }
        // A wrt tensor that is itself an intermediate keeps its cotangent for the answer.
        if targets.contains(&key(v)) {
            cot.insert(key(v), g);
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
    let mut seen: HashSet<usize> = HashSet::new();
    seen.insert(key(root));
    // Iterative, so deep graphs (long training unrolls) cannot overflow the stack.
    let mut stack: Vec<(Value, usize)> = vec![(root.clone(), 0)];
    while let Some((v, i)) = stack.last_mut() {
        let operands: &[Value] = match v {
            Value::Node(n) => &n.operands,
            Value::Data(_) => &[],
        };
        if let Some(c) = operands.get(*i).cloned() {
            *i += 1;
            if seen.insert(key(&c)) {
                stack.push((c, 0));
            }
        } else if let Some((v, _)) = stack.pop() {
            order.push(v);
        }
    }
    order
}

fn non_diff(op: &Op, location: &'static Location<'static>) -> Error {
    let reason = match op {
        Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } => {
            "a product over replicas has no gradient rule"
        }
        _ => "it has no derivative on the float path to the loss",
    };
    Error::NotDifferentiable {
        location,
        op: op.name(),
        reason,
    }
}

/// The gradient contributions of one op application, per operand (`None`: no gradient flows,
/// as into integer or pred operands).
fn vjp(
    op: &Op,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    let float = |t: &Tensor| t.dtype().is_float();
    Ok(match op {
        // leaves, or (random bits) an integer function of an integer key
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RandomBits { .. }
        | Op::ReplicaId => {
            vec![None; x.len()]
        }
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
                UnaryOp::Erf => g.mul(
                    &a.mul(a)?
                        .neg()?
                        .exp()?
                        .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
                )?,
                // logical/bitwise: no derivative
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
                // d(a + c) = da + dc
                BinaryOp::Add => (g.clone(), g.clone()),
                // d(a - c) = da - dc
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
                // d max(a, c) = da where a >= c, else dc (ties go to the left operand; min alike)
                BinaryOp::Max | BinaryOp::Min => {
                    let pick_a = if *b == BinaryOp::Max {
                        a.ge(c)?
                    } else {
                        a.le(c)?
                    };
                    let zero = g.zeros_like()?;
                    (
                        Tensor::where_cond(&pick_a, g, &zero)?,
                        Tensor::where_cond(&pick_a, &zero, g)?,
                    )
                }
                // logical/bitwise: no derivative
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return Err(non_diff(op, location)),
            };
            vec![Some(da), Some(dc)]
        }
        // pred result: no gradient flows back
        Op::Compare(_) => vec![None, None],
        // d select(p, t, f) = dt where p, df elsewhere (none into the pred)
        Op::Select => {
            let zero = g.zeros_like()?;
            vec![
                None,
                Some(Tensor::where_cond(&x[0], g, &zero)?),
                Some(Tensor::where_cond(&x[0], &zero, g)?),
            ]
        }
        // d/dx convert(x) = g converted back (float to float only; integers get none)
        Op::Convert(_) => {
            if float(&x[0]) && float(y) {
                vec![Some(g.to_dtype(x[0].dtype())?)]
            } else {
                vec![None]
            }
        }
        Op::BroadcastInDim {
            dims,
            broadcast_dimensions,
        } => {
            // d/dx broadcast(x) sums the gradient over the new dimensions and over those
            // stretched from size 1; the remaining ones map back in operand order.
            let src = x[0].dims();
            let mut summed: Vec<isize> = (0..dims.len())
                .filter(|d| !broadcast_dimensions.contains(d))
                .map(|d| d as isize)
                .collect();
            // (result dimension, operand dimension) of the dimensions that survive the sum
            let mut kept: Vec<(usize, usize)> = Vec::new();
            for (i, &d) in broadcast_dimensions.iter().enumerate() {
                if src[i] == 1 && dims[d] != 1 {
                    summed.push(d as isize);
                } else {
                    kept.push((d, i));
                }
            }
            let s = if summed.is_empty() {
                g.clone()
            } else {
                g.sum(&summed, false)?
            };
            // After the sum they sit in result order; broadcast_dimensions need not be sorted.
            kept.sort_unstable();
            let mut perm: Vec<usize> = (0..kept.len()).collect();
            perm.sort_by_key(|&j| kept[j].1);
            let s = if perm.iter().enumerate().all(|(i, &p)| i == p) {
                s
            } else {
                s.permute_dims(&perm)?
            };
            vec![Some(s.reshape(src)?)]
        }
        // d/dx reshape(x) = reshape back
        Op::Reshape { .. } => vec![Some(g.reshape(x[0].dims())?)],
        // d/dx transpose(x, perm) = transpose(g, perm^-1)
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.permute_dims(&inv)?)]
        }
        // d/dx slice(x) = g placed back at start + i * stride, zeros elsewhere
        Op::Slice { start, stride, .. } => {
            let src = x[0].dims();
            let low: Vec<i64> = start.iter().map(|&s| s as i64).collect();
            let high: Vec<i64> = (0..src.len())
                .map(|i| {
                    let n = g.dims()[i];
                    let end = if n == 0 {
                        start[i]
                    } else {
                        start[i] + (n - 1) * stride[i] + 1
                    };
                    src[i] as i64 - end as i64
                })
                .collect();
            let interior: Vec<usize> = stride.iter().map(|&s| s - 1).collect();
            let zero = g.constant_like(0.0)?;
            vec![Some(g.pad(&low, &high, &interior, &zero)?)]
        }
        // d/dx dynamic_slice(x, s) = g written into zeros at the same (clamped) offsets
        Op::DynamicSlice { .. } => {
            let starts: Vec<&Tensor> = x[1..].iter().collect();
            let dx = x[0].zeros_like()?.dynamic_update_slice(g, &starts)?;
            let mut grads = vec![Some(dx)];
            grads.extend(x[1..].iter().map(|_| None));
            grads
        }
        // d/dx update(x, u, s) = g with the window cleared; d/du = the window of g
        Op::DynamicUpdateSlice => {
            let update = &x[1];
            let starts: Vec<&Tensor> = x[2..].iter().collect();
            let cleared = g.dynamic_update_slice(&update.zeros_like()?, &starts)?;
            let du = g.dynamic_slice(&starts, update.dims())?;
            let mut grads = vec![Some(cleared), Some(du)];
            grads.extend(x[2..].iter().map(|_| None));
            grads
        }
        // d/dx_k concat(x) = the k-th block of g
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
        // d/dx pad(x, v) = g at low + i * (interior + 1) (zero where negative low/high cropped
        // x); d/dv = the sum of g over the padding positions
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let src = x[0].dims();
            // Pad g first by what was cropped, so every operand element has a position.
            let pre: Vec<i64> = low.iter().map(|&l| (-l).max(0)).collect();
            let post: Vec<i64> = high.iter().map(|&h| (-h).max(0)).collect();
            let gp = if pre.iter().chain(&post).all(|&p| p == 0) {
                g.clone()
            } else {
                g.pad(&pre, &post, &vec![0; src.len()], &g.constant_like(0.0)?)?
            };
            let start: Vec<usize> = low.iter().map(|&l| l.max(0) as usize).collect();
            let stride: Vec<usize> = interior.iter().map(|&i| i + 1).collect();
            let limit: Vec<usize> = (0..src.len())
                .map(|i| {
                    if src[i] == 0 {
                        start[i]
                    } else {
                        start[i] + (src[i] - 1) * stride[i] + 1
                    }
                })
                .collect();
            let dx = gp.slice_strided(&start, &limit, &stride)?;
            // 1 where the output holds the pad value (exact, unlike sum(g) - sum(dx))
            let is_pad = x[0]
                .zeros_like()?
                .pad(low, high, interior, &g.constant_like(1.0)?)?;
            let dv = g.mul(&is_pad)?.sum_all()?;
            vec![Some(dx), Some(dv)]
        }
        Op::Reduce(r, dims) => {
            let a = &x[0];
            let kept: Vec<usize> = (0..a.rank())
                .map(|i| if dims.contains(&i) { 1 } else { a.dims()[i] })
                .collect();
            let sdims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
            let spread =
                |t: &Tensor| -> Result<Tensor> { t.reshape(&kept)?.broadcast_to(a.dims()) };
            let gk = spread(g)?;
            let d = match r {
                // d/dx_i sum(x) = 1
                ReduceOp::Sum => gk,
                // d/dx_i max(x) = 1 at the maximum; tied extremes share the gradient equally
                ReduceOp::Max | ReduceOp::Min => {
                    let hit = a.eq(&spread(y)?)?.to_dtype(a.dtype())?;
                    let count = hit.sum(&sdims, true)?.broadcast_to(a.dims())?;
                    gk.mul(&hit)?.div(&count)?
                }
                // d/dx_i prod(x) = prod_{j != i} x_j: prod/x_i without zeros; with one zero only
                // that element gets the product of the others; with two or more, all get 0
                ReduceOp::Prod => {
                    let zero = a.constant_like(0.0)?;
                    let is_zero = a.eq(&zero)?;
                    let safe = Tensor::where_cond(&is_zero, &a.constant_like(1.0)?, a)?;
                    let others = spread(&safe.prod(&sdims, false)?)?;
                    let zeros = spread(&is_zero.to_dtype(a.dtype())?.sum(&sdims, false)?)?;
                    let at_zero =
                        Tensor::where_cond(&zeros.eq(&a.constant_like(1.0)?)?, &others, &zero)?;
                    let elsewhere =
                        Tensor::where_cond(&zeros.eq(&zero)?, &others.div(&safe)?, &zero)?;
                    gk.mul(&Tensor::where_cond(&is_zero, &at_zero, &elsewhere)?)?
                }
            };
            vec![Some(d)]
        }
        // integer result: no gradient flows back
        Op::ArgMax { .. } | Op::ArgMin { .. } => vec![None],
        // d/dx stop_gradient(x) = 0 by definition (detach): nothing flows back
        Op::StopGradient => vec![None],
        // d(l . r) = g . r over r's free dims (for l), l . g over l's free dims (for r)
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => dot_general_vjp(
            &x[0],
            &x[1],
            g,
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
            location,
        )?,
        // d conv(x, w): the vjp of the same convolution written as pad + strided slices +
        // dot_general (im2col), whose rules are above
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let (dx, dw) =
                Tensor::convolution_vjp(&x[0], &x[1], g, (stride, padding, dilation), *groups)?;
            vec![Some(dx), Some(dw)]
        }
        // d reduce_window(x): the vjp of the same windows gathered by strided slices and reduced
        // with `reduce` (max: to the window's maximum; sum: to every element of the window)
        Op::ReduceWindow {
            op: r,
            window,
            stride,
            padding,
        } => vec![Some(Tensor::reduce_window_vjp(
            &x[0],
            g,
            *r,
            (window, stride, padding),
        )?)],
        // d/dtable gather(table, i) = g scattered (summed) into the rows that were read, which
        // are the clamped indices
        Op::Gather => {
            let idx = clamp_rows(&x[1], x[0].dims()[0])?;
            vec![Some(x[0].zeros_like()?.scatter_add_rows(&idx, g)?), None]
        }
        // d/dtable scatter_add = g; d/dupdates = the rows of g they were added to (zero for
        // out-of-range rows, which scatter_add skips)
        Op::ScatterAdd => {
            let (table, idx) = (&x[0], &x[1]);
            let rows = table.dims()[0];
            let picked = g.index_select_rows(idx)?;
            let in_range = idx
                .ge(&idx.constant_like(0.0)?)?
                .logical_and(&idx.lt(&idx.constant_like(rows as f64)?)?)?;
            let mut mask_dims = idx.dims().to_vec();
            mask_dims.extend(std::iter::repeat_n(1, table.rank() - 1));
            let du = Tensor::where_cond(
                &in_range.reshape(&mask_dims)?,
                &picked,
                &picked.zeros_like()?,
            )?;
            vec![Some(g.clone()), None, Some(du)]
        }
        // The loss of an SPMD program is the sum of the replicas' losses, so the cotangent of
        // an operand on replica k sums what every replica's result received from it.
        // sum: every replica's result holds x_k, so x̄_k = sum over the group of ȳ
        Op::AllReduce {
            op: ReduceOp::Sum,
            replica_groups,
        } => vec![Some(group_sum(g, replica_groups, location)?)],
        // max/min: x_k reached the result where it equals it (ties share)
        Op::AllReduce {
            op: ReduceOp::Max | ReduceOp::Min,
            replica_groups,
        } => {
            let hit = x[0].eq(y)?.to_dtype(g.dtype())?;
            let count = group_sum(&hit, replica_groups, location)?;
            let total = group_sum(g, replica_groups, location)?;
            vec![Some(total.mul(&hit)?.div(&count)?)]
        }
        // concatenation: x_k is block k of every replica's result
        Op::AllGather {
            dim,
            replica_groups,
        } => vec![Some(Tensor::apply_at(
            Op::ReduceScatter {
                op: ReduceOp::Sum,
                dim: *dim,
                replica_groups: replica_groups.clone(),
            },
            &[g],
            location,
        )?)],
        // block j of the group's sum went to replica j: x̄_k gathers every ȳ_j
        Op::ReduceScatter {
            op: ReduceOp::Sum,
            dim,
            replica_groups,
        } => vec![Some(gather(g, *dim, replica_groups, location)?)],
        Op::ReduceScatter {
            op: ReduceOp::Max | ReduceOp::Min,
            dim,
            replica_groups,
        } => {
            let whole = gather(y, *dim, replica_groups, location)?;
            let hit = x[0].eq(&whole)?.to_dtype(g.dtype())?;
            let count = group_sum(&hit, replica_groups, location)?;
            let total = gather(g, *dim, replica_groups, location)?;
            vec![Some(total.mul(&hit)?.div(&count)?)]
        }
        Op::AllReduce {
            op: ReduceOp::Prod, ..
        }
        | Op::ReduceScatter {
            op: ReduceOp::Prod, ..
        } => return Err(non_diff(op, location)),
    })
}

/// The sum of `t` over each replica group (an all-reduce).
fn group_sum(
    t: &Tensor,
    groups: &[Vec<usize>],
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let op = Op::AllReduce {
        op: ReduceOp::Sum,
        replica_groups: groups.to_vec(),
    };
    Tensor::apply_at(op, &[t], location)
}

/// The group's `t` concatenated along `dim` (an all-gather).
fn gather(
    t: &Tensor,
    dim: usize,
    groups: &[Vec<usize>],
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let op = Op::AllGather {
        dim,
        replica_groups: groups.to_vec(),
    };
    Tensor::apply_at(op, &[t], location)
}

/// Integer `indices` clamped into `0..rows`, as gather reads them.
fn clamp_rows(indices: &Tensor, rows: usize) -> Result<Tensor> {
    let top = rows.saturating_sub(1) as f64;
    indices
        .maximum(&indices.constant_like(0.0)?)?
        .minimum(&indices.constant_like(top)?)
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
        (0..rank)
            .filter(|d| !batch.contains(d) && !contract.contains(d))
            .collect()
    };
    let lhs_free = free(lhs.rank(), lhs_batch, lhs_contract);
    let rhs_free = free(rhs.rank(), rhs_batch, rhs_contract);
    let g_batch: Vec<usize> = (0..nb).collect();
    let g_lhs_free: Vec<usize> = (nb..nb + lhs_free.len()).collect();
    let g_rhs_free: Vec<usize> =
        (nb + lhs_free.len()..nb + lhs_free.len() + rhs_free.len()).collect();

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
        pos_l[d] = nb
            + lhs_free.len()
            + rhs_remaining
                .iter()
                .position(|&x| x == r)
                .expect("contract dim");
    }
    let dl = dl.permute_dims(&pos_l)?;

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
        pos_r[d] = nb
            + lhs_remaining
                .iter()
                .position(|&x| x == l)
                .expect("contract dim");
    }
    for (i, &d) in rhs_free.iter().enumerate() {
        pos_r[d] = nb + lhs_remaining.len() + i;
    }
    let dr = dr.permute_dims(&pos_r)?;
    Ok(vec![Some(dl), Some(dr)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::CacheConfig;
    use crate::{DeviceConfig, LazyDevice};

    #[test]
    fn an_op_without_a_gradient_rule_is_a_typed_error_naming_it() {
        let dev = LazyDevice::new(DeviceConfig {
            cache: CacheConfig::disabled(),
            ..DeviceConfig::default()
        })
        .unwrap();
        let x = dev.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let product = Tensor::apply(
            Op::AllReduce {
                op: ReduceOp::Prod,
                replica_groups: vec![vec![0]],
            },
            &[&x],
        )
        .unwrap();
        let loss = product.sum_all().unwrap();
        match grad(&loss, &[&x]) {
            Err(Error::NotDifferentiable { op, location, .. }) => {
                assert_eq!(op, "all_reduce");
                assert!(location.file().ends_with("autodiff.rs"), "{location}");
            }
            other => panic!("expected NotDifferentiable, got {other:?}"),
        }
    }
}
