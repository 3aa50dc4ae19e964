//! The loop: [`Op::Scan`] runs one body graph a static number of times over stacked operands
//! (JAX's `lax.scan`, PyTorch/XLA's `scan`), lowered to one `stablehlo.while`.
//!
//! Operands are the initial carries, then the scanned operands (`xs`, each `[length, ..]`),
//! then loop invariants. The body's parameters follow the same order: each carry, each
//! scanned operand's slice for the iteration (`xs[i]`, the leading dimension dropped), each
//! invariant. Its outputs are the next carries, of the carries' types.
//!
//! A scan has several results, and a node of the IR has one type; so each result is a node
//! of its own, `Op::Scan { output, .. }` over the same body and operands, and the lowering
//! emits one loop for all the results of the same scan that a program reads. A result is a
//! final carry, or any body node's value at every iteration stacked along a new leading
//! dimension: the per-iteration outputs a user asks for and the residuals differentiation
//! saves are both stacked nodes, read from the loop that computes the carry.

use std::fmt;

use super::graph::{Graph, NodeId};
use super::op::Op;
use super::types::TensorType;
use crate::error::Result;

/// The graph a scan runs each iteration, and how its parameters split into carries, scanned
/// slices and invariants (the rest).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScanBody {
    pub graph: Graph,
    /// The first `carries` parameters are carried; the body's outputs are their next values.
    pub carries: usize,
    /// The next `xs` parameters are the slices of the scanned operands.
    pub xs: usize,
    /// What differentiation keeps of each iteration for the backward loop. The loop computes
    /// the same values whatever this says.
    pub saved: Saved,
}

/// What the backward pass of a scan reads from the forward loop, per iteration; the rest it
/// recomputes from those (JAX's checkpoint policies inside `lax.scan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Saved {
    /// Every intermediate value the gradient rules read: no recomputation, the most memory.
    #[default]
    Everything,
    /// Only each iteration's carries and slices (a layer's input): the body runs again in the
    /// backward loop.
    Inputs,
    /// The inputs and the products without batch dimensions (the projections of a layer).
    Dots,
}

impl ScanBody {
    /// The number of loop invariants (parameters after the carries and the slices).
    pub fn invariants(&self) -> usize {
        self.graph.parameters().len() - self.carries - self.xs
    }
}

/// Which result of a scan a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScanOutput {
    /// Carry `k` after the last iteration.
    Carry(usize),
    /// Body node `n`'s value at every iteration, stacked: `[length, ..]`, row `i` from the
    /// iteration that read `xs[i]` (so a reverse scan stacks in operand order, as JAX does).
    Stacked(NodeId),
}

impl fmt::Display for ScanOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanOutput::Carry(k) => write!(f, "carry {k}"),
            ScanOutput::Stacked(n) => write!(f, "stacked {n}"),
        }
    }
}

/// The result type of `scan` over operands of types `operands`.
pub(super) fn infer_scan(
    op: &Op,
    operands: &[&TensorType],
    body: &ScanBody,
    length: usize,
    output: ScanOutput,
) -> Result<TensorType> {
    let e = |message: String| super::infer::shape_error(op, operands, message);
    let g = &body.graph;
    let params = g.parameter_types();
    if length == 0 {
        return Err(e(
            "a scan runs at least once (a trip count of 0)".to_string()
        ));
    }
    if body.carries + body.xs > params.len() {
        return Err(e(format!(
            "the body has {} parameters, fewer than its {} carries and {} scanned slices",
            params.len(),
            body.carries,
            body.xs
        )));
    }
    if operands.len() != params.len() {
        return Err(e(format!(
            "the body takes {} parameters, the scan has {} operands",
            params.len(),
            operands.len()
        )));
    }
    for (k, (o, p)) in operands.iter().zip(&params).enumerate() {
        let want = if (body.carries..body.carries + body.xs).contains(&k) {
            let mut dims = vec![length];
            dims.extend_from_slice(&p.dims);
            TensorType::new(p.dtype, dims)
        } else {
            p.clone()
        };
        if **o != want {
            return Err(e(format!(
                "operand {k} is {o}, the body's parameter {k} needs {want}{}",
                if want == *p {
                    String::new()
                } else {
                    format!(" ({length} slices of {p})")
                }
            )));
        }
    }
    let outputs = g.output_types();
    if outputs.len() != body.carries {
        return Err(e(format!(
            "the body returns {} values for {} carries",
            outputs.len(),
            body.carries
        )));
    }
    for (k, (o, p)) in outputs.iter().zip(&params).enumerate() {
        if o != p {
            return Err(e(format!(
                "the body changes carry {k} from {p} to {o}; a carry keeps its type"
            )));
        }
    }
    match output {
        ScanOutput::Carry(k) => params
            .get(k)
            .filter(|_| k < body.carries)
            .cloned()
            .ok_or_else(|| e(format!("carry {k} of a scan with {} carries", body.carries))),
        ScanOutput::Stacked(n) => match g.node(n) {
            Some(node) => {
                let mut dims = vec![length];
                dims.extend_from_slice(&node.ty.dims);
                Ok(TensorType::new(node.ty.dtype, dims))
            }
            None => Err(e(format!("stacked {n} of a body of {} nodes", g.len()))),
        },
    }
}
