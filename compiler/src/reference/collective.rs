//! Collectives across replicas evaluated in lockstep: each replica's value of the operand is
//! given, and each replica gets the result for its group (members combined in group order).

use crate::error::{Error, Result};
use crate::ir::{Node, Op, ReduceOp};

use super::data::{Data, Value};
use super::{elementwise, structural};

#[derive(Clone, Copy)]
enum Kind {
    AllReduce(ReduceOp),
    AllGather(usize),
    ReduceScatter(ReduceOp, usize),
}

/// The results of collective `node` for every replica, given every replica's operand value.
// The evaluator routes the ops whose `replicas()` are groups here; one without a rule below is
// refused with an error.
#[allow(clippy::wildcard_enum_match_arm)]
pub(crate) fn eval(node: &Node, operand: &[&Value]) -> Result<Vec<Value>> {
    let name = node.op.name();
    let (kind, groups) = match &node.op {
        Op::AllReduce { op, replica_groups } => (Kind::AllReduce(*op), replica_groups),
        Op::AllGather {
            dim,
            replica_groups,
        } => (Kind::AllGather(*dim), replica_groups),
        Op::ReduceScatter {
            op,
            dim,
            replica_groups,
        } => (Kind::ReduceScatter(*op, *dim), replica_groups),
        other => {
            return Err(Error::Evaluate {
                op: other.name(),
                message: "not a collective".to_string(),
            })
        }
    };
    let mut out = Vec::with_capacity(operand.len());
    for r in 0..operand.len() {
        let group = groups
            .iter()
            .find(|g| g.contains(&r))
            .ok_or_else(|| Error::Evaluate {
                op: name,
                message: format!("replica {r} is in none of the groups {groups:?}"),
            })?;
        let members: Vec<&Value> = group
            .iter()
            .map(|&m| {
                operand.get(m).copied().ok_or_else(|| Error::Evaluate {
                    op: name,
                    message: format!(
                        "group {group:?} names replica {m}, but {} run",
                        operand.len()
                    ),
                })
            })
            .collect::<Result<_>>()?;
        let data = match kind {
            Kind::AllReduce(op) => combine(op, &members),
            Kind::AllGather(dim) => {
                let first = members[0];
                let mut dims = first.ty.dims.clone();
                dims[dim] *= members.len();
                let ty = crate::ir::TensorType::new(first.ty.dtype, dims);
                structural::concatenate(&members, &ty, dim)
            }
            Kind::ReduceScatter(op, dim) => {
                let whole = Value {
                    ty: members[0].ty.clone(),
                    data: combine(op, &members),
                };
                let k = group.iter().position(|&m| m == r).unwrap_or(0);
                let mut start = vec![0; whole.ty.rank()];
                start[dim] = k * node.ty.dims[dim];
                structural::slice(&whole, &node.ty, &start, &vec![1; whole.ty.rank()])
            }
        };
        out.push(Value {
            ty: node.ty.clone(),
            data,
        });
    }
    Ok(out)
}

fn combine(op: ReduceOp, members: &[&Value]) -> Data {
    let dtype = members[0].ty.dtype;
    let mut acc = members[0].data.clone();
    for m in &members[1..] {
        acc = elementwise::binary(op.combiner(), dtype, &acc, &m.data);
    }
    acc
}
