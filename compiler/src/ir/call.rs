//! A computation recorded once and applied many times: the body of [`Op::Call`].
//!
//! A lazy trace records every op it is given, so a computation repeated per parameter (an
//! optimizer's update) costs the host one recorded node per op per parameter, every step. A
//! call records one node per result instead. Graphs are compiled with their calls expanded
//! ([`CallExpander`]), so the program, and the numbers it computes, are those of the body's
//! ops written out.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::facts::ReplicaRule;
use super::infer::shape_error;
use super::op::{CallBody, Graph, NodeId, Op};
use super::types::TensorType;
use crate::error::{Error, Result};

impl CallBody {
    /// A body over `graph`, which needs at least one output and no op whose value differs
    /// between replicas or reads another replica's (collectives, replica ids): a call's result
    /// is then per replica exactly when an operand is, as for elementwise ops.
    pub fn new(graph: Graph) -> Result<CallBody> {
        if graph.outputs().is_empty() {
            return Err(Error::InvalidGraph {
                message: "a call's body has no outputs".into(),
            });
        }
        let local = |op: &Op| matches!(op.replicas(), ReplicaRule::Local);
        if let Some(n) = graph.nodes().iter().find(|n| !local(&n.op)) {
            return Err(Error::InvalidGraph {
                message: format!(
                    "a call's body may not hold {} (its value depends on the replica)",
                    n.op.name()
                ),
            });
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        graph.hash(&mut h);
        Ok(CallBody {
            fingerprint: h.finish(),
            graph,
        })
    }

    /// The body's graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The type of result `output` over operands of types `operands` (what inference gives a
    /// call node): the operands must be the parameters' types.
    pub(super) fn result_type(
        &self,
        op: &Op,
        operands: &[&TensorType],
        output: usize,
    ) -> Result<TensorType> {
        let params = self.graph.parameter_types();
        if operands.len() != params.len() {
            return Err(shape_error(
                op,
                operands,
                format!(
                    "the body takes {} operands, the call has {}",
                    params.len(),
                    operands.len()
                ),
            ));
        }
        if let Some(k) = (0..params.len()).find(|&k| *operands[k] != params[k]) {
            return Err(shape_error(
                op,
                operands,
                format!("operand {k} is not the body's parameter type {}", params[k]),
            ));
        }
        match self.graph.outputs().get(output) {
            Some(&id) => Ok(self.graph.node_type(id).clone()),
            None => Err(shape_error(
                op,
                operands,
                format!(
                    "the body has {} outputs, no output {output}",
                    self.graph.outputs().len()
                ),
            )),
        }
    }
}

impl PartialEq for CallBody {
    fn eq(&self, other: &CallBody) -> bool {
        self.fingerprint == other.fingerprint && self.graph == other.graph
    }
}

impl Eq for CallBody {}

impl Hash for CallBody {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint.hash(state);
    }
}

/// One application: a body (by its address) over operands.
type Application = (usize, Vec<NodeId>);

/// Writes calls out into a graph being built: each body over the same operands once, however
/// many of its results are read (a call's results are separate nodes over one application).
#[derive(Default)]
pub struct CallExpander {
    /// By the body's address and the operands: the body (held, so the address stays its) and
    /// its outputs in the graph.
    done: HashMap<Application, (Arc<CallBody>, Vec<NodeId>)>,
}

impl CallExpander {
    /// A node of `g` computing `op` over `args`: a call's result written out (see
    /// [`CallExpander::result`]), any other op pushed as it is.
    pub fn push(&mut self, g: &mut Graph, op: &Op, args: &[NodeId]) -> Result<NodeId> {
        if let Op::Call { body, output } = op {
            return self.result(g, body, *output, args);
        }
        g.push(op.clone(), args)
    }

    /// The node of `g` holding output `output` of `body` over `args`: the body's ops are
    /// appended to `g` the first time these operands are seen.
    pub fn result(
        &mut self,
        g: &mut Graph,
        body: &Arc<CallBody>,
        output: usize,
        args: &[NodeId],
    ) -> Result<NodeId> {
        let key = (Arc::as_ptr(body) as usize, args.to_vec());
        if let Some((_, outs)) = self.done.get(&key) {
            return outs
                .get(output)
                .copied()
                .ok_or_else(|| no_output(body, output));
        }
        let bg = body.graph();
        let mut ids: Vec<NodeId> = Vec::with_capacity(bg.len());
        for n in bg.nodes() {
            let id = if let Op::Parameter { index } = n.op {
                args[index]
            } else {
                let operands: Vec<NodeId> = n.operands.iter().map(|o| ids[o.0]).collect();
                self.push(g, &n.op, &operands)?
            };
            ids.push(id);
        }
        let outs: Vec<NodeId> = bg.outputs().iter().map(|o| ids[o.0]).collect();
        let id = outs
            .get(output)
            .copied()
            .ok_or_else(|| no_output(body, output));
        self.done.insert(key, (body.clone(), outs));
        id
    }
}

fn no_output(body: &CallBody, output: usize) -> Error {
    Error::InvalidGraph {
        message: format!(
            "a call reads output {output} of a body with {}",
            body.graph().outputs().len()
        ),
    }
}

/// `graph` with every call written out: the same outputs from the same parameters, computed
/// by the bodies' ops. A graph without calls comes back borrowed, as it is.
pub fn expand_calls(graph: &Graph) -> Result<Cow<'_, Graph>> {
    if !graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Call { .. }))
    {
        return Ok(Cow::Borrowed(graph));
    }
    let mut g = Graph::with_capacity(graph.len());
    let mut calls = CallExpander::default();
    let mut ids: Vec<NodeId> = Vec::with_capacity(graph.len());
    for n in graph.nodes() {
        let id = if let Op::Parameter { .. } = n.op {
            g.parameter(n.ty.clone())
        } else {
            let operands: Vec<NodeId> = n.operands.iter().map(|o| ids[o.0]).collect();
            calls.push(&mut g, &n.op, &operands)?
        };
        ids.push(id);
    }
    let outs: Vec<NodeId> = graph.outputs().iter().map(|o| ids[o.0]).collect();
    g.set_outputs(&outs)?;
    Ok(Cow::Owned(g))
}
