//! Reverse-mode differentiation over the recorded (lazy) graph.
//!
//! `grad(loss, params)` walks the nodes below `loss`, then applies each op's vector-Jacobian
//! product in reverse order, recording the gradient computation as more lazy ops. Forward,
//! backward and the optimizer update therefore land in one step graph at the next `mark_step`.
//! Every op has an arm in `vjp` (no wildcard): a new primitive cannot be forgotten here, and a
//! non-differentiable one returns an error naming it. The arms dispatch to one file per op
//! family (`pointwise`, `shape`, `reduce`, `linalg`, `window`, `index`, `collective`), which
//! hold the math; a new primitive's rule goes in its family's file.
//!
//! [`checkpoint`] trades memory for time (a block's activations recomputed backward), and
//! [`scan`] records a stack of identical layers as one loop; both differentiate as usual.
//!
//! ```no_run
//! use neuron_pc::autodiff::{grad, remat, scan, Remat, ScanOptions};
//! use neuron_pc::{DType, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let w = device.from_slice(&[0.5f32, -1.0, 2.0, 0.1], &[2, 2])?;
//! let layers = device.from_slice(&[0.1f32; 3 * 2 * 2], &[3, 2, 2])?; // 3 layers of [2, 2]
//! let x = device.ones(&[4, 2], DType::F32)?;
//! let h = remat(Remat::Full, &[&x], |xs| Ok(vec![xs[0].matmul(&w)?.tanh()?]))?;
//! let (h, _) = scan(&[&h[0]], &[&layers], ScanOptions::default(), |h, l| {
//!     Ok((vec![h[0].matmul(&l[0])?.tanh()?], vec![]))
//! })?;
//! let loss = h[0].mul(&h[0])?.mean_all()?;
//! let g = grad(&loss, &[&w, &layers])?; // f32 [2, 2] and [3, 2, 2]
//! device.mark_step()?; // forward and backward: one step graph
//! println!("{:?}", g[0].to_vec::<f32>()?);
//! # Ok(()) }
//! ```

mod collective;
mod index;
mod linalg;
mod pointwise;
mod reduce;
mod remat;
mod scan;
mod shape;
mod window;

use std::panic::Location;
use std::sync::{Arc, Weak};

use neuron_pc_compiler::ir::{Op, ReplicaRule, TensorType};
// Keyed by node addresses and only looked up, never iterated: the fast hash cannot change a
// graph, and SipHash with growth from empty was a tenth of tracing a Llama step (callgrind).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::device::trace::{post_order, value_key as key, Value};
use crate::device::DeviceInner;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[allow(deprecated)]
pub use remat::checkpoint;
pub use remat::{remat, Remat};
pub use scan::{scan, ScanOptions};

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
    // The backward pass runs in the dtypes the forward pass chose, autocast or not (as
    // PyTorch's backward ignores the autocast state it is called in): a product's gradient
    // products take its operands' dtypes.
    let autocast = dev.set_autocast(None);
    let seed = loss
        .constant_like(1.0)
        .and_then(|one| one.reshape(loss.dims()));
    let result = seed.and_then(|seed| grad_of(&dev, &[(loss, seed)], wrt, location));
    dev.set_autocast(autocast);
    let grads = result?;
    // A mesh in each of several processes: each gradient keeps its parameter's layout, so that
    // its mean over the processes (`average_gradients`) runs on every device's block.
    if dev.mesh().is_some() && dev.global_replicas() > 1 {
        return grads
            .into_iter()
            .zip(wrt)
            .map(|(g, p)| match p.sharding() {
                Some(s) if s.dims() == g.dims() => g.with_sharding_constraint(&s),
                _ => Ok(g),
            })
            .collect();
    }
    Ok(grads)
}

/// The vector-Jacobian product: the gradients with respect to `wrt` of the sum of each root
/// times its cotangent (`(loss, 1)` for [`grad`]). Runs with autocast off.
fn grad_of(
    dev: &Arc<DeviceInner>,
    seeds: &[(&Tensor, Tensor)],
    wrt: &[&Tensor],
    location: &'static Location<'static>,
) -> Result<Vec<Tensor>> {
    let dev = dev.clone();
    let roots: Vec<Value> = seeds.iter().map(|(r, _)| r.value()).collect();
    let order = post_order(&roots, &HashSet::default());

    // Values that some `wrt` tensor flows into; only these need cotangents.
    let targets: HashSet<usize> = wrt.iter().map(|t| key(&t.value())).collect();
    let mut needed: HashSet<usize> =
        HashSet::with_capacity_and_hasher(order.len(), Default::default());
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

    // Checkpointed blocks a gradient flows through: inside one, gradient rules read
    // recomputed values.
    let mut blocks = remat::Blocks::collect(&dev, &needed);

    // Cotangents by value identity; values are kept alive by `order`.
    let mut cot: HashMap<usize, Tensor> =
        HashMap::with_capacity_and_hasher(order.len(), Default::default());
    for ((_, seed), root) in seeds.iter().zip(&roots) {
        let sum = match cot.remove(&key(root)) {
            Some(prev) => prev.add(seed)?,
            None => seed.clone(),
        };
        cot.insert(key(root), sum);
    }
    for v in order.iter().rev() {
        let Value::Node(node) = v else { continue };
        if !node.operands.iter().any(|o| needed.contains(&key(o))) {
            continue;
        }
        let Some(g) = cot.remove(&key(v)) else {
            continue;
        };
        let (op, ty, operand_types) = dev.op_view(node);
        blocks.finished(v, &g);
        let block = blocks.block_of(v);
        if let Some(b) = block {
            blocks.enter(b, &dev, &g, location)?;
        }
        let read = |u: &Value, ty: &Arc<TensorType>| match block.and_then(|b| blocks.primal(b, u)) {
            Some(t) => t.clone(),
            None => Tensor {
                cell: dev.detached_cell_of(u.clone(), ty.clone()),
            },
        };
        let y = read(v, &ty);
        let xs: Vec<Tensor> = (node.operands.iter().zip(&operand_types))
            .map(|(o, t)| read(o, t))
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
        Value::Node(n) => dev.op_of(n.op_id).1,
        Value::Data(d) => d.ty(),
    }
}

fn non_diff(op: &Op, location: &'static Location<'static>) -> Error {
    let reason = match op.replicas() {
        ReplicaRule::Groups { .. } => "a product over replicas has no gradient rule",
        ReplicaRule::Local | ReplicaRule::FirstOperand | ReplicaRule::Distinct => {
            "it has no derivative on the float path to the loss"
        }
    };
    Error::NotDifferentiable {
        location,
        op: op.name(),
        reason,
    }
}

/// The gradient contributions of one op application, per operand (`None`: no gradient flows,
/// as into integer or pred operands). One arm per op, no wildcard.
fn vjp(
    op: &Op,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    match op {
        // leaves, or (random bits) an integer function of an integer key
        Op::Parameter { .. }
        | Op::Constant(_)
        | Op::Iota { .. }
        | Op::RandomBits { .. }
        | Op::ReplicaId
        | Op::ProcessIndex => Ok(vec![None; x.len()]),
        // made after differentiation, when a program is lowered for several processes
        Op::ProcessCollective { .. } | Op::ProcessBucket { .. } => Err(crate::error::Error::Op {
            location,
            source: neuron_pc_compiler::Error::Shape {
                op: op.name(),
                operands: y.ty().to_string(),
                message: "a collective between processes is made when lowering, after \
                          differentiation"
                    .into(),
            },
        }),
        // d/dx u(x) = u'(x) g, by UnaryOp
        Op::Unary(u) => Ok(vec![Some(pointwise::unary(u, op, &x[0], y, g, location)?)]),
        // d b(a, c) = (db/da g, db/dc g), by BinaryOp
        Op::Binary(b) => {
            let (da, dc) = pointwise::binary(b, op, x, y, g, location)?;
            Ok(vec![Some(da), Some(dc)])
        }
        // pred result: no gradient flows back
        Op::Compare(_) => Ok(vec![None, None]),
        // d select(p, t, f) = dt where p, df elsewhere (none into the pred)
        Op::Select => pointwise::select(&x[0], g),
        // d/dx convert(x) = g converted back (float to float only; integers get none)
        Op::Convert(_) => pointwise::convert(&x[0], y, g),
        // d/dx broadcast(x) = g summed over the new and stretched dimensions
        Op::BroadcastInDim {
            dims,
            broadcast_dimensions,
        } => shape::broadcast_in_dim(x, g, dims, broadcast_dimensions),
        // d/dx reshape(x) = reshape back
        Op::Reshape { .. } => Ok(vec![Some(g.reshape(x[0].dims())?)]),
        // d/dx transpose(x, perm) = transpose(g, perm^-1)
        Op::Transpose { perm } => shape::transpose(g, perm),
        // d/dx slice(x) = g placed back at start + i * stride, zeros elsewhere
        Op::Slice { start, stride, .. } => shape::slice(x, g, start, stride),
        // d/dx dynamic_slice(x, s) = g written into zeros at the same (clamped) offsets
        Op::DynamicSlice { .. } => shape::dynamic_slice(x, g),
        // d/dx update(x, u, s) = g with the window cleared; d/du = the window of g
        Op::DynamicUpdateSlice => shape::dynamic_update_slice(x, g),
        // d/dx_k concat(x) = the k-th block of g
        Op::Concatenate { dim } => shape::concatenate(x, g, dim),
        // d/dx pad(x, v) = g at the operand's positions; d/dv = g summed over the padding
        Op::Pad {
            low,
            high,
            interior,
        } => shape::pad(x, g, low, high, interior),
        // d/dx reduce(x), by ReduceOp (sum: 1; max/min: at the extreme; prod: the others)
        Op::Reduce(r, dims) => reduce::reduce(r, dims, x, y, g),
        // integer result: no gradient flows back
        Op::ArgMax { .. } | Op::ArgMin { .. } | Op::ArgSort { .. } | Op::TopK { .. } => {
            Ok(vec![None])
        }
        // d/dx stop_gradient(x) = 0 by definition (detach): nothing flows back
        Op::StopGradient => Ok(vec![None]),
        // d/dx constrain(x) = g, laid out as x was asked to be (JAX transposes
        // with_sharding_constraint into the same constraint on the cotangent)
        Op::ShardingConstraint { .. } => Ok(vec![Some(Tensor::apply(op.clone(), &[g])?)]),
        // d/dx after(x, deps) = g: the deps only order the computation
        Op::After => Ok(std::iter::once(Some(g.clone()))
            .chain(std::iter::repeat(None))
            .take(x.len())
            .collect()),
        // d(l . r) = g . r over r's free dims (for l), l . g over l's free dims (for r)
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => linalg::dot_general(
            &x[0],
            &x[1],
            g,
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
            location,
        ),
        // d conv(x, w): the vjp of the same convolution written as pad + strided slices +
        // dot_general (im2col), whose rules are above
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let geometry = (&stride[..], &padding[..], &dilation[..]);
            let (dx, dw) = window::convolution(&x[0], &x[1], g, geometry, *groups, location)?;
            Ok(vec![Some(dx), Some(dw)])
        }
        // d reduce_window(x): the vjp of the same windows gathered by strided slices and reduced
        // with `reduce` (max: to the window's maximum; sum: to every element of the window)
        Op::ReduceWindow {
            op: r,
            window,
            stride,
            padding,
        } => {
            let geometry = (&window[..], &stride[..], &padding[..]);
            let dx = window::reduce_window(&x[0], g, *r, geometry, location)?;
            Ok(vec![Some(dx)])
        }
        // d/dtable gather(table, i) = g scattered (summed) into the rows that were read
        Op::Gather => index::gather(x, g),
        // d/dtable scatter_add = g; d/dupdates = the rows of g they were added to
        Op::ScatterAdd => index::scatter_add(x, g),
        // x̄_k = what every replica's result received from x_k, by ReduceOp (prod: an error)
        Op::AllReduce {
            op: r,
            replica_groups,
        } => collective::all_reduce(op, r, replica_groups, x, y, g, location),
        // x̄_k = block k of the group's sum of ȳ (a reduce-scatter)
        Op::AllGather {
            dim,
            replica_groups,
        } => collective::all_gather(*dim, replica_groups, g, location),
        // x̄_k gathers every replica's ȳ_j, by ReduceOp (prod: an error)
        Op::ReduceScatter {
            op: r,
            dim,
            replica_groups,
        } => collective::reduce_scatter(op, r, *dim, replica_groups, x, y, g, location),
        // d scan: a scan the other way over the body's vector-Jacobian product
        Op::Scan { .. } => scan::vjp(op, x, g),
        // a traced function (an optimizer's update) is applied outside what is differentiated
        Op::Call { .. } => Err(Error::NotDifferentiable {
            location,
            op: op.name(),
            reason: "a traced function's call has no gradient rule",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_pc_compiler::ir::ReduceOp;

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
                // the call of `grad` above, in this file
                assert_eq!(location.file(), file!(), "{location}");
            }
            other => panic!("expected NotDifferentiable, got {other:?}"),
        }
    }
}
