//! Loops over stacked operands ([`scan`]) and their gradient: a loop in reverse.
//!
//! [`scan`] calls the body once, on placeholder tensors, and cuts the recorded ops out of the
//! trace as the loop's body graph (`device::subgraph`); the step graph then holds one
//! `Op::Scan` whatever the trip count, so tracing, lowering and compiling cost what one
//! iteration costs.
//!
//! The gradient of a scan result is a scan running the other way. Its body is the forward
//! body's vector-Jacobian product: the body graph replayed as recorded ops on placeholders,
//! differentiated by [`super::grad_of`] and cut out again. Its carries are the carries'
//! cotangents and the invariants' gradient sums; it scans the per-iteration values the forward
//! loop kept ([`Saved`]) and the scanned operands; what it needs and was not kept it
//! recomputes from those. The kept values are stacked results of the forward loop itself
//! (`ScanOutput::Stacked`), which the lowering writes from the same `while`.

use std::panic::Location;
use std::sync::Arc;

use neuron_pc_compiler::ir::{Op, Saved, ScanBody, ScanOutput, TensorType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{grad_of, key, value_type, Remat};
use crate::device::subgraph::{extract, placeholder};
use crate::device::trace::{post_order, Value};
use crate::device::DeviceInner;
use crate::error::Result;
use crate::tensor::{shape_error, Tensor};

/// How [`scan`] runs: in which order, and what its gradient keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanOptions {
    /// Run from the last slice to the first (`lax.scan(reverse=True)`); the stacked outputs
    /// still line up with the slices.
    pub reverse: bool,
    /// What the backward pass keeps of each iteration: everything ([`Remat::None`]), the
    /// iteration's inputs alone ([`Remat::Full`]: one layer's input per layer, the body run
    /// again backward) or its projections too ([`Remat::Dots`]).
    pub remat: Remat,
}

fn saved(remat: Remat) -> Saved {
    match remat {
        Remat::None => Saved::Everything,
        Remat::Full => Saved::Inputs,
        Remat::Dots => Saved::Dots,
    }
}

fn tensor(dev: &Arc<DeviceInner>, v: Value, ty: TensorType) -> Tensor {
    Tensor {
        cell: dev.detached_cell(v, ty),
    }
}

/// Runs `body` once per slice of `xs` along their first dimension, threading `init` through:
/// `body(carries, slices)` returns the next carries (each of its carry's shape and dtype) and
/// the values to stack. Returns the final carries and the stacked values (`[n, ..]`, row `i`
/// from slice `i`): JAX's `lax.scan`, as one loop in the step graph whatever `n` is.
///
/// `body` is called once, to trace it; what it reads besides its arguments (weights, a mask)
/// is read by every iteration. Gradients flow through the loop to `init`, `xs` and whatever
/// the body read ([`crate::grad`]).
///
/// ```no_run
/// # use neuron_pc::{nn::{scan, ScanOptions}, Tensor, Result};
/// # fn f(h: &Tensor, weights: &Tensor) -> Result<Tensor> {
/// // h [b, d] through a stack of weights [layers, d, d]
/// let (h, _) = scan(&[h], &[weights], ScanOptions::default(), |h, w| {
///     Ok((vec![h[0].matmul(&w[0])?.tanh()?], vec![]))
/// })?;
/// # Ok(h[0].clone()) }
/// ```
#[track_caller]
pub fn scan<F>(
    init: &[&Tensor],
    xs: &[&Tensor],
    options: ScanOptions,
    body: F,
) -> Result<(Vec<Tensor>, Vec<Tensor>)>
where
    F: FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
{
    let location = Location::caller();
    let types = || {
        let c: Vec<String> = init.iter().map(|t| t.ty().to_string()).collect();
        let x: Vec<String> = xs.iter().map(|t| t.ty().to_string()).collect();
        format!("carries [{}], xs [{}]", c.join(", "), x.join(", "))
    };
    let err = |message: String| shape_error("scan", types(), message, location);
    let Some(first) = xs.first() else {
        return Err(err("scan needs at least one scanned operand (xs)".into()));
    };
    let length = match first.dims().first() {
        Some(&n) => n,
        None => return Err(err("a scanned operand must have a leading dimension".into())),
    };
    if length == 0 {
        return Err(err("a scan runs at least once (a trip count of 0)".into()));
    }
    if let Some((j, x)) = xs
        .iter()
        .enumerate()
        .find(|(_, x)| x.dims().first() != Some(&length))
    {
        return Err(err(format!(
            "scanned operand {j} is {}, not {length} slices as operand 0",
            x.ty()
        )));
    }
    let dev = first.device_inner()?;
    let (nc, nx) = (init.len(), xs.len());
    let carries: Vec<Tensor> = init
        .iter()
        .enumerate()
        .map(|(k, t)| tensor(&dev, placeholder(&dev, k, t.ty().clone()), t.ty().clone()))
        .collect();
    let slices: Vec<Tensor> = xs
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let ty = TensorType::new(t.dtype(), t.dims()[1..].to_vec());
            tensor(&dev, placeholder(&dev, nc + j, ty.clone()), ty)
        })
        .collect();
    let (next, ys) = body(&carries, &slices)?;
    if next.len() != nc {
        return Err(err(format!(
            "the body returned {} carries for {nc}",
            next.len()
        )));
    }
    for (k, (n, c)) in next.iter().zip(init).enumerate() {
        if n.ty() != c.ty() {
            return Err(err(format!(
                "the body changes carry {k} from {} to {}; a carry keeps its shape and dtype",
                c.ty(),
                n.ty()
            )));
        }
    }
    let leaves: Vec<Value> = carries.iter().chain(&slices).map(Tensor::value).collect();
    let outputs: Vec<Value> = next.iter().chain(&ys).map(Tensor::value).collect();
    let mut sub = extract(&dev, &leaves, &outputs)?;
    let next_ids: Vec<_> = outputs[..nc].iter().map(|v| sub.id(v)).collect();
    let y_ids: Vec<_> = outputs[nc..].iter().map(|v| sub.id(v)).collect();
    sub.graph
        .set_outputs(&next_ids)
        .map_err(|source| crate::Error::Op { location, source })?;
    let body = Arc::new(ScanBody {
        graph: sub.graph,
        carries: nc,
        xs: nx,
        saved: saved(options.remat),
    });
    let captured: Vec<Tensor> = sub
        .captured
        .into_iter()
        .map(|v| {
            let ty = value_type(&dev, &v);
            tensor(&dev, v, ty)
        })
        .collect();
    let operands: Vec<&Tensor> = init
        .iter()
        .copied()
        .chain(xs.iter().copied())
        .chain(&captured)
        .collect();
    let result = |output| {
        let op = Op::Scan {
            body: body.clone(),
            length,
            reverse: options.reverse,
            output,
        };
        Tensor::apply_at(op, &operands, location)
    };
    let finals = (0..nc)
        .map(|k| result(ScanOutput::Carry(k)))
        .collect::<Result<_>>()?;
    let stacked = y_ids
        .into_iter()
        .map(|n| result(ScanOutput::Stacked(n)))
        .collect::<Result<_>>()?;
    Ok((finals, stacked))
}

/// Ops the backward loop recomputes from their operands rather than reading back, whatever
/// the policy: memory-bound work that XLA fuses into its readers (elementwise arithmetic,
/// layout changes), so a stacked copy would cost more than it saves. XLA then fuses and
/// simplifies the backward program differently from the unrolled model's, so gradients agree
/// with it to the last bits, not bit for bit (`tests/training/scan_layers.rs`).
fn cheap(op: &Op) -> bool {
    op.recomputes_cheaply()
}

/// The gradient contributions of one scan result with cotangent `g` to the scan's operands
/// `x` (see the module doc).
pub(super) fn vjp(op: &Op, x: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let Op::Scan {
        body,
        length,
        reverse,
        output,
    } = op
    else {
        return Err(crate::Error::Config(format!(
            "scan's gradient rule given {op}"
        )));
    };
    let dev = g.device_inner()?;
    let location = Location::caller();
    let (nc, nx, ni) = (body.carries, body.xs, body.invariants());
    let fg = &body.graph;
    let param_types = fg.parameter_types();

    // The body replayed on placeholders; which of its nodes vary between iterations.
    let params: Vec<Tensor> = param_types
        .iter()
        .enumerate()
        .map(|(k, ty)| tensor(&dev, placeholder(&dev, k, ty.clone()), ty.clone()))
        .collect();
    let mut replay: Vec<Tensor> = Vec::with_capacity(fg.len());
    let mut varies: Vec<bool> = Vec::with_capacity(fg.len());
    for node in fg.nodes() {
        let op = &node.op;
        let (t, v) = if let Op::Parameter { index } = op {
            (params[*index].clone(), *index < nc + nx)
        } else if node.operands.is_empty() {
            (Tensor::apply_nullary(&dev, op.clone())?, false)
        } else {
            let args: Vec<&Tensor> = node.operands.iter().map(|o| &replay[o.0]).collect();
            let v = node.operands.iter().any(|o| varies[o.0]);
            (Tensor::apply(op.clone(), &args)?, v)
        };
        replay.push(t);
        varies.push(v);
    }

    // Seeds: the next carries' cotangents, and this result's slice when it is stacked.
    let dc: Vec<Tensor> = param_types[..nc]
        .iter()
        .enumerate()
        .map(|(k, ty)| tensor(&dev, placeholder(&dev, k, ty.clone()), ty.clone()))
        .collect();
    let mut seeds: Vec<(&Tensor, Tensor)> = fg
        .outputs()
        .iter()
        .zip(&dc)
        .map(|(o, c)| (&replay[o.0], c.clone()))
        .collect();
    let gy = match output {
        ScanOutput::Stacked(n) => {
            let ty = fg.node_type(*n).clone();
            let t = tensor(&dev, placeholder(&dev, nc, ty.clone()), ty);
            seeds.push((&replay[n.0], t.clone()));
            Some(t)
        }
        ScanOutput::Carry(_) => None,
    };
    let wrt: Vec<&Tensor> = params.iter().collect();
    let grads = grad_of(&dev, &seeds, &wrt, location)?;
    let diff = |k: usize| param_types[k].dtype.is_float();

    // Backward carries: the carries' cotangents, then a sum per float invariant.
    let inv: Vec<usize> = (nc + nx..nc + nx + ni).filter(|&k| diff(k)).collect();
    let acc: Vec<Tensor> = inv
        .iter()
        .map(|&k| {
            let ty = param_types[k].clone();
            tensor(&dev, placeholder(&dev, k, ty.clone()), ty)
        })
        .collect();
    let mut outputs: Vec<Value> = grads[..nc].iter().map(Tensor::value).collect();
    for (a, &k) in acc.iter().zip(&inv) {
        outputs.push(a.add(&grads[k])?.value());
    }
    let dx: Vec<Value> = grads[nc..nc + nx].iter().map(Tensor::value).collect();
    outputs.extend(dx.iter().cloned());

    // What the backward body reads from the forward: the values kept per `saved` (and the
    // iteration's carries and slices, always kept), everything else recomputed.
    let mut kept: Vec<bool> = Vec::with_capacity(fg.len());
    for (n, node) in fg.nodes().iter().enumerate() {
        let k = match body.saved {
            Saved::Everything => {
                // A one-operand function of a value the backward body has anyway (a kept value,
                // the iteration's carries and slices): one evaluation per element costs less
                // than a stacked copy written and read back (SwiGLU's sigmoid of the gate).
                let from_kept = matches!(node.op, Op::Unary(_))
                    && node
                        .operands
                        .iter()
                        .all(|o| kept[o.0] || matches!(fg.nodes()[o.0].op, Op::Parameter { .. }));
                varies[n] && !cheap(&node.op) && !from_kept
            }
            Saved::Inputs => false,
            Saved::Dots => {
                varies[n]
                    && matches!(&node.op, Op::DotGeneral { lhs_batch, .. } if lhs_batch.is_empty())
            }
        };
        kept.push(k);
    }
    let by_key: HashMap<usize, usize> = replay
        .iter()
        .enumerate()
        .map(|(n, t)| (key(&t.value()), n))
        .collect();
    let mut stop: HashSet<usize> = HashSet::default();
    for t in dc.iter().chain(&acc).chain(&gy) {
        stop.insert(key(&t.value()));
    }
    for (n, t) in replay.iter().enumerate() {
        if matches!(fg.nodes()[n].op, Op::Parameter { .. }) || kept[n] {
            stop.insert(key(&t.value()));
        }
    }
    let order = post_order(&outputs, &stop);
    let mut reached: Vec<usize> = Vec::new();
    let mut seen = HashSet::default();
    let operands_of = |v: &Value| -> Vec<Value> {
        match v {
            Value::Node(n) => n.operands.to_vec(),
            Value::Data(_) => Vec::new(),
        }
    };
    for v in order
        .iter()
        .flat_map(operands_of)
        .chain(outputs.iter().cloned())
    {
        if let Some(&n) = by_key.get(&key(&v)) {
            if stop.contains(&key(&v)) && seen.insert(n) {
                reached.push(n);
            }
        }
    }
    reached.sort();
    // Forward values: scanned (kept per iteration) or invariant (a forward operand).
    let (invariant, scanned): (Vec<usize>, Vec<usize>) = reached
        .into_iter()
        .partition(|&n| matches!(fg.nodes()[n].op, Op::Parameter { index } if index >= nc + nx));

    let mut leaves: Vec<Value> = dc
        .iter()
        .chain(&acc)
        .chain(&gy)
        .map(Tensor::value)
        .collect();
    leaves.extend(scanned.iter().map(|&n| replay[n].value()));
    leaves.extend(invariant.iter().map(|&n| replay[n].value()));
    let mut sub = extract(&dev, &leaves, &outputs)?;
    let carry_ids: Vec<_> = outputs[..nc + inv.len()]
        .iter()
        .map(|v| sub.id(v))
        .collect();
    let dx_ids: Vec<_> = dx.iter().map(|v| sub.id(v)).collect();
    sub.graph
        .set_outputs(&carry_ids)
        .map_err(|source| crate::Error::Op { location, source })?;
    let backward = Arc::new(ScanBody {
        graph: sub.graph,
        carries: nc + inv.len(),
        xs: usize::from(gy.is_some()) + scanned.len(),
        saved: body.saved,
    });

    // The backward loop's operands.
    let forward_stacked = |n| -> Result<Tensor> {
        let op = Op::Scan {
            body: body.clone(),
            length: *length,
            reverse: *reverse,
            output: ScanOutput::Stacked(n),
        };
        let refs: Vec<&Tensor> = x.iter().collect();
        Tensor::apply(op, &refs)
    };
    let mut operands: Vec<Tensor> = Vec::new();
    for (k, init) in x[..nc].iter().enumerate() {
        operands.push(match output {
            ScanOutput::Carry(j) if *j == k => g.clone(),
            ScanOutput::Carry(_) | ScanOutput::Stacked(_) => init.zeros_like()?,
        });
    }
    for &k in &inv {
        operands.push(x[k].zeros_like()?);
    }
    if gy.is_some() {
        operands.push(g.clone());
    }
    for &n in &scanned {
        let scanned_input = if let Op::Parameter { index } = fg.nodes()[n].op {
            Some(index).filter(|i| *i >= nc)
        } else {
            None
        };
        operands.push(match scanned_input {
            Some(index) => x[index].clone(),
            None => forward_stacked(neuron_pc_compiler::ir::NodeId(n))?,
        });
    }
    for &n in &invariant {
        if let Op::Parameter { index } = fg.nodes()[n].op {
            operands.push(x[index].clone());
        }
    }
    for v in sub.captured {
        let ty = value_type(&dev, &v);
        operands.push(tensor(&dev, v, ty));
    }
    let refs: Vec<&Tensor> = operands.iter().collect();
    let result = |output| {
        let op = Op::Scan {
            body: backward.clone(),
            length: *length,
            reverse: !*reverse,
            output,
        };
        Tensor::apply(op, &refs)
    };
    let mut out: Vec<Option<Tensor>> = vec![None; x.len()];
    for k in (0..nc).filter(|&k| diff(k)) {
        out[k] = Some(result(ScanOutput::Carry(k))?);
    }
    for (j, id) in dx_ids.into_iter().enumerate() {
        if diff(nc + j) {
            out[nc + j] = Some(result(ScanOutput::Stacked(id))?);
        }
    }
    for (a, &k) in inv.iter().enumerate() {
        out[k] = Some(result(ScanOutput::Carry(nc + a))?);
    }
    Ok(out)
}
