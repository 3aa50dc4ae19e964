//! Part of the recorded DAG as a graph of its own: the body of a loop (`nn::scan`), traced
//! once over placeholder values and cut out of the trace.
//!
//! A placeholder is a node of op `Parameter` that no step ever reads: the tensor holding it is
//! detached (never a step output), and nothing the user keeps may depend on it (a step that
//! reaches one fails to build its graph).

use std::sync::Arc;

use neuron_pc_compiler::ir::{Graph, NodeId, Op, TensorType};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::trace::{post_order, value_key, Node, Value};
use super::{lock, DeviceInner};
use crate::error::Result;

/// A value standing for parameter `index` of a graph being traced, of type `ty`.
pub(crate) fn placeholder(dev: &Arc<DeviceInner>, index: usize, ty: TensorType) -> Value {
    let op_id = lock(&dev.recorder)
        .interner
        .op(Op::Parameter { index }, ty)
        .0;
    Value::Node(Arc::new(Node::new(op_id, false, Default::default())))
}

/// The recorded computation from `leaves` to `outputs`, as a graph.
pub(crate) struct Subgraph {
    /// Parameters: the leaves in order, then the captured values; no outputs set.
    pub graph: Graph,
    /// The node of each value the graph holds, by [`value_key`].
    pub ids: HashMap<usize, NodeId>,
    /// Values from outside that the computation reads (device data, values computed before
    /// the trace, an enclosing loop's values), in the order their parameters were added.
    pub captured: Vec<Value>,
}

impl Subgraph {
    /// The node holding `v`.
    pub fn id(&self, v: &Value) -> NodeId {
        self.ids[&value_key(v)]
    }
}

/// Cuts out what `outputs` compute from `leaves`: each leaf becomes a parameter, each node
/// that depends on a leaf a node, a constant (an op without operands) a copy; anything else
/// reached is captured as one more parameter.
pub(crate) fn extract(dev: &DeviceInner, leaves: &[Value], outputs: &[Value]) -> Result<Subgraph> {
    let stop: HashSet<usize> = leaves.iter().map(value_key).collect();
    let order = post_order(outputs, &stop);
    let mut depends = stop.clone();
    for v in &order {
        if let Value::Node(n) = v {
            if n.operands.iter().any(|o| depends.contains(&value_key(o))) {
                depends.insert(value_key(v));
            }
        }
    }
    let rec = lock(&dev.recorder);
    let type_of = |v: &Value| -> TensorType {
        match v {
            Value::Node(n) => rec.interner.op_of(n.op_id).1.clone(),
            Value::Data(d) => d.ty(),
        }
    };
    let mut sub = Subgraph {
        graph: Graph::with_capacity(order.len() + leaves.len()),
        ids: HashMap::default(),
        captured: Vec::new(),
    };
    for l in leaves {
        let id = sub.graph.parameter(type_of(l));
        sub.ids.insert(value_key(l), id);
    }
    let resolve = |sub: &mut Subgraph, v: &Value| -> Result<NodeId> {
        if let Some(&id) = sub.ids.get(&value_key(v)) {
            return Ok(id);
        }
        // an op of no operands (a constant, an iota) is copied in; anything else captured
        let nullary = match v {
            Value::Node(n) if n.operands.is_empty() => Some(rec.interner.op_of(n.op_id).0),
            Value::Node(_) | Value::Data(_) => None,
        };
        let id = match nullary {
            Some(op) if !matches!(op, Op::Parameter { .. }) => {
                Some(sub.graph.push(op.clone(), &[])?)
            }
            Some(_) | None => None,
        };
        let id = match id {
            Some(id) => id,
            None => {
                sub.captured.push(v.clone());
                sub.graph.parameter(type_of(v))
            }
        };
        sub.ids.insert(value_key(v), id);
        Ok(id)
    };
    for v in &order {
        let Value::Node(n) = v else { continue };
        if !depends.contains(&value_key(v)) {
            continue;
        }
        let mut args = Vec::with_capacity(n.operands.len());
        for o in &n.operands {
            args.push(resolve(&mut sub, o)?);
        }
        let op = rec.interner.op_of(n.op_id).0.clone();
        let id = sub.graph.push(op, &args)?;
        sub.ids.insert(value_key(v), id);
    }
    for o in outputs {
        resolve(&mut sub, o)?;
    }
    Ok(sub)
}
