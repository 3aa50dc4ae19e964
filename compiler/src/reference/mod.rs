//! A plain Rust evaluator of [`Graph`]s: the test oracle for the lowering and for the passes.
//!
//! It is written for obvious correctness, not speed: explicit loops over output elements,
//! floats computed in f64 and rounded to their dtype after every op (reductions, dot products
//! and scatter-add accumulate in f64 and round once), integers with the wrapping and
//! division-by-zero rules XLA gives StableHLO. It shares nothing with the lowering code
//! except the IR, so the two check each other. Other crates' tests use it too.
//!
//! [`evaluate`] runs one replica, where collectives over groups of one are the identity (larger
//! groups are an [`Error::Evaluate`]); [`evaluate_replicated`] runs several replicas in lockstep
//! and combines their values in each collective.

mod collective;
mod conv;
mod data;
mod elementwise;
mod random;
mod reduce;
mod structural;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::host::HostTensor;
use crate::ir::{Graph, Node, Op, ReplicaRule, ScanBody, ScanOutput};

pub use crate::special::{erf, erfc};
use data::{for_each_index, strides, Data, Scalar, Value};
pub use random::threefry2x32;

/// Runs `graph` on `inputs` (one per parameter, in parameter order) and returns its outputs.
/// Collectives must have groups of one replica (they are then the identity).
pub fn evaluate(graph: &Graph, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    graph.validate()?;
    check_inputs(graph, inputs)?;
    let values = node_values(graph, inputs.iter().map(Value::from_host).collect())?;
    graph
        .outputs()
        .iter()
        .map(|o| values[o.0].to_host())
        .collect()
}

/// Every node's value, in node order, for parameters `inputs` (of the graph's types).
fn node_values(graph: &Graph, inputs: Vec<Value>) -> Result<Vec<Value>> {
    let mut inputs: Vec<Option<Value>> = inputs.into_iter().map(Some).collect();
    let mut values: Vec<Value> = Vec::with_capacity(graph.len());
    for node in graph.nodes() {
        let v = if let Op::Parameter { index } = &node.op {
            inputs[*index].take().ok_or_else(|| Error::InvalidGraph {
                message: format!("parameter {index} appears twice"),
            })?
        } else {
            let args: Vec<&Value> = node.operands.iter().map(|o| &values[o.0]).collect();
            Value {
                ty: node.ty.clone(),
                data: eval_node(node, &args)?,
            }
        };
        values.push(v);
    }
    Ok(values)
}

/// Runs `graph` as `inputs.len()` replicas in lockstep (replica `r` takes `inputs[r]`), so
/// collectives combine the values of the replicas in each of their groups. Every replica
/// must belong to a group of every collective.
pub fn evaluate_replicated(
    graph: &Graph,
    inputs: &[Vec<HostTensor>],
) -> Result<Vec<Vec<HostTensor>>> {
    graph.validate()?;
    for replica in inputs {
        check_inputs(graph, replica)?;
    }
    let mut values: Vec<Vec<Value>> = inputs
        .iter()
        .map(|_| Vec::with_capacity(graph.len()))
        .collect();
    for node in graph.nodes() {
        let row: Vec<Value> = match (&node.op, node.op.replicas()) {
            (Op::Parameter { index }, _) => inputs
                .iter()
                .map(|r| Value::from_host(&r[*index]))
                .collect(),
            (Op::ReplicaId, _) => (0..inputs.len())
                .map(|r| Value {
                    ty: node.ty.clone(),
                    data: Data::from_scalars(node.ty.dtype, std::iter::once(Scalar::U(r as u64))),
                })
                .collect(),
            (_, ReplicaRule::Groups { .. }) => {
                let operand: Vec<&Value> = values.iter().map(|v| &v[node.operands[0].0]).collect();
                collective::eval(node, &operand)?
            }
            (_, ReplicaRule::Local | ReplicaRule::FirstOperand | ReplicaRule::Distinct) => {
                let mut row = Vec::with_capacity(inputs.len());
                for v in &values {
                    let args: Vec<&Value> = node.operands.iter().map(|o| &v[o.0]).collect();
                    row.push(Value {
                        ty: node.ty.clone(),
                        data: eval_node(node, &args)?,
                    });
                }
                row
            }
        };
        for (v, x) in values.iter_mut().zip(row) {
            v.push(x);
        }
    }
    values
        .iter()
        .map(|v| graph.outputs().iter().map(|o| v[o.0].to_host()).collect())
        .collect()
}

fn check_inputs(graph: &Graph, inputs: &[HostTensor]) -> Result<()> {
    let params = graph.parameter_types();
    if inputs.len() != params.len() {
        return Err(Error::Argument {
            message: format!(
                "the graph takes {} inputs, {} given",
                params.len(),
                inputs.len()
            ),
        });
    }
    for (i, (t, ty)) in inputs.iter().zip(&params).enumerate() {
        if t.dtype() != ty.dtype || t.dims() != ty.dims.as_slice() {
            return Err(Error::Argument {
                message: format!(
                    "input {i} is {}{:?}, the graph expects {ty}",
                    t.dtype(),
                    t.dims()
                ),
            });
        }
    }
    Ok(())
}

fn eval_node(node: &Node, a: &[&Value]) -> Result<Data> {
    let out = &node.ty;
    Ok(match &node.op {
        Op::Parameter { .. } => {
            return Err(Error::InvalidGraph {
                message: "parameter evaluated as an op".into(),
            })
        }
        Op::Constant(lit) => Value::from_host(&lit.to_host()?).data,
        Op::Unary(u) => elementwise::unary(*u, out.dtype, &a[0].data),
        Op::Binary(b) => elementwise::binary(*b, out.dtype, &a[0].data, &a[1].data),
        Op::Compare(c) => elementwise::compare(*c, &a[0].data, &a[1].data),
        Op::Select => elementwise::select(&a[0].data, &a[1].data, &a[2].data),
        Op::Convert(to) => Data::from_scalars(*to, (0..a[0].data.len()).map(|i| a[0].data.get(i))),
        Op::Iota { dim, .. } => structural::iota(out, *dim),
        // evaluated alone, the program runs as replica 0
        Op::ReplicaId => Data::from_scalars(out.dtype, std::iter::once(Scalar::U(0))),
        // the reference is one process; the cross-process rewrite's result runs on devices
        Op::ProcessIndex | Op::ProcessCollective { .. } | Op::ProcessBucket { .. } => {
            return Err(Error::Evaluate {
                op: node.op.name(),
                message: "a collective between processes runs only on a device".into(),
            })
        }
        Op::BroadcastInDim {
            broadcast_dimensions,
            ..
        } => structural::broadcast_in_dim(a[0], out, broadcast_dimensions),
        Op::Reshape { .. } | Op::StopGradient | Op::After | Op::ShardingConstraint { .. } => {
            a[0].data.clone()
        }
        Op::Transpose { perm } => structural::transpose(a[0], out, perm),
        Op::Slice { start, stride, .. } => structural::slice(a[0], out, start, stride),
        Op::DynamicSlice { .. } => structural::dynamic_slice(a[0], out, &starts(&a[1..])),
        Op::DynamicUpdateSlice => structural::dynamic_update_slice(a[0], a[1], &starts(&a[2..])),
        Op::Concatenate { dim } => structural::concatenate(a, out, *dim),
        Op::Pad { low, interior, .. } => structural::pad(a[0], a[1], out, low, interior),
        Op::Reduce(r, dims) => reduce::reduce(*r, a[0], dims),
        Op::ArgMax { dim, index_dtype } => reduce::arg_reduce(a[0], *dim, *index_dtype, true),
        Op::ArgMin { dim, index_dtype } => reduce::arg_reduce(a[0], *dim, *index_dtype, false),
        Op::ArgSort {
            dim,
            descending,
            index_dtype,
        } => arg_sort(a[0], *dim, *descending, *index_dtype),
        Op::TopK { k } => {
            let last = a[0].ty.rank() - 1;
            let n = a[0].ty.dims[last];
            let all = arg_sort(a[0], last, true, DType::I64);
            let firsts = (0..all.len()).filter(|i| i % n < *k).map(|i| all.get(i));
            Data::from_scalars(DType::I32, firsts)
        }
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => reduce::dot_general(
            a[0],
            a[1],
            out,
            (lhs_batch, rhs_batch, lhs_contract, rhs_contract),
        ),
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => conv::convolution(a[0], a[1], out, (stride, padding, dilation), *groups),
        Op::ReduceWindow {
            op,
            window,
            stride,
            padding,
        } => conv::reduce_window(*op, a[0], out, (window, stride, padding)),
        Op::Gather => structural::gather(a[0], a[1], out),
        Op::ScatterAdd => structural::scatter_add(a[0], a[1], a[2]),
        Op::RandomBits { .. } => random::random_bits(a[0], out.element_count()),
        Op::Scan {
            body,
            length,
            reverse,
            output,
        } => scan(body, *length, *reverse, *output, a)?,
        Op::Call { body, output } => {
            let values = node_values(body.graph(), a.iter().map(|&v| v.clone()).collect())?;
            let k = body.graph().outputs()[*output];
            values[k.0].data.clone()
        }
        Op::AllReduce { replica_groups, .. }
        | Op::AllGather { replica_groups, .. }
        | Op::ReduceScatter { replica_groups, .. } => {
            single_replica(&node.op, replica_groups)?;
            a[0].data.clone()
        }
    })
}

/// One result of a scan: the body run `length` times on the carries, each slice of the
/// scanned operands and the invariants. (Each result runs the whole loop: the evaluator is
/// the oracle, not a fast path.)
fn scan(
    body: &ScanBody,
    length: usize,
    reverse: bool,
    output: ScanOutput,
    a: &[&Value],
) -> Result<Data> {
    let (nc, nx) = (body.carries, body.xs);
    let mut carries: Vec<Value> = a[..nc].iter().map(|&v| v.clone()).collect();
    let mut stacked: Vec<Option<Data>> = vec![None; length];
    for t in 0..length {
        let i = if reverse { length - 1 - t } else { t };
        let mut inputs = std::mem::take(&mut carries);
        for x in &a[nc..nc + nx] {
            let row = x.data.len() / length;
            let dims = x.ty.dims[1..].to_vec();
            let idx: Vec<usize> = (i * row..(i + 1) * row).collect();
            inputs.push(Value {
                ty: crate::ir::TensorType::new(x.ty.dtype, dims),
                data: x.data.take(&idx),
            });
        }
        inputs.extend(a[nc + nx..].iter().map(|&v| v.clone()));
        let values = node_values(&body.graph, inputs)?;
        if let ScanOutput::Stacked(n) = output {
            stacked[i] = Some(values[n.0].data.clone());
        }
        carries = body
            .graph
            .outputs()
            .iter()
            .map(|o| values[o.0].clone())
            .collect();
    }
    Ok(match output {
        ScanOutput::Carry(k) => carries.swap_remove(k).data,
        ScanOutput::Stacked(_) => {
            let rows: Vec<&Data> = stacked.iter().flatten().collect();
            Data::concat(&rows)
        }
    })
}

fn starts(idx: &[&Value]) -> Vec<i64> {
    idx.iter().map(|v| v.data.get(0).as_i64()).collect()
}

/// On one replica every collective is the identity; larger groups need several replicas.
fn single_replica(op: &Op, groups: &[Vec<usize>]) -> Result<()> {
    if groups.iter().all(|g| g.len() == 1) {
        Ok(())
    } else {
        Err(Error::Evaluate {
            op: op.name(),
            message: format!(
                "replica groups {groups:?} need several replicas; the reference evaluates one"
            ),
        })
    }
}

/// The stable sorting permutation of every row along `dim`: floats by `f64::total_cmp` (the
/// dtype's values are exact in f64, NaN keeping its sign), integers and pred by value.
fn arg_sort(x: &Value, dim: usize, descending: bool, index_dtype: DType) -> Data {
    let dims = &x.ty.dims;
    let step = strides(dims)[dim];
    let n = dims[dim];
    let mut rows = dims.clone();
    rows[dim] = 1;
    let mut out = vec![0u64; x.ty.element_count()];
    let int = |s: Scalar| match s {
        Scalar::I(v) => i128::from(v),
        Scalar::U(v) => i128::from(v),
        Scalar::P(v) => i128::from(v),
        Scalar::F(v) => v as i128,
    };
    let order = |a: Scalar, b: Scalar| match (a, b) {
        (Scalar::F(a), Scalar::F(b)) => a.total_cmp(&b),
        (a, b) => int(a).cmp(&int(b)),
    };
    for_each_index(&rows, |_, at| {
        let base: usize = at.iter().zip(strides(dims)).map(|(i, s)| i * s).sum();
        let mut perm: Vec<usize> = (0..n).collect();
        // a stable sort: equal elements keep their order, in either direction
        perm.sort_by(|&i, &j| {
            let o = order(x.data.get(base + i * step), x.data.get(base + j * step));
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        for (k, p) in perm.into_iter().enumerate() {
            out[base + k * step] = p as u64;
        }
    });
    Data::from_scalars(index_dtype, out.into_iter().map(Scalar::U))
}
