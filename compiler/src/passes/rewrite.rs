//! The rebuilding machinery every pass shares: walk the old graph in order, emit into a new one
//! through a builder that can merge duplicates (hash-consing), and carry parameters and outputs
//! over unchanged in number, order and type.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::error::{Error, Result};
use crate::ir::{Graph, Literal, Node, NodeId, Op, TensorType};

/// Emits nodes into a new graph. With `cse` on, an op already emitted with the same operands
/// returns the earlier node instead of a new one.
pub(crate) struct Builder {
    pub(crate) graph: Graph,
    cse: bool,
    /// Hash of (op, operands) to the nodes with that hash; compared exactly on lookup, so the
    /// table never clones an op (constants may be large).
    seen: HashMap<u64, Vec<NodeId>>,
}

impl Builder {
    pub(crate) fn new(capacity: usize, cse: bool) -> Builder {
        Builder {
            graph: Graph::with_capacity(capacity),
            cse,
            seen: HashMap::new(),
        }
    }

    /// Appends `op(operands)` (or finds an equal node when merging duplicates).
    pub(crate) fn push(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        if !self.cse {
            return self.graph.push(op, operands);
        }
        let mut h = DefaultHasher::new();
        op.hash(&mut h);
        operands.hash(&mut h);
        let key = h.finish();
        if let Some(ids) = self.seen.get(&key) {
            for &id in ids {
                if let Some(n) = self.graph.node(id) {
                    if n.op == op && n.operands == operands {
                        return Ok(id);
                    }
                }
            }
        }
        let id = self.graph.push(op, operands)?;
        self.seen.entry(key).or_default().push(id);
        Ok(id)
    }

    /// The node `id` of the graph being built.
    pub(crate) fn node(&self, id: NodeId) -> Result<&Node> {
        self.graph.node(id).ok_or_else(|| Error::InvalidGraph {
            message: format!("pass referred to node {id}, which it has not built"),
        })
    }

    pub(crate) fn ty(&self, id: NodeId) -> Result<&TensorType> {
        Ok(&self.node(id)?.ty)
    }

    /// The literal of `id` if it is a constant.
    pub(crate) fn constant(&self, id: NodeId) -> Option<&Literal> {
        let Op::Constant(lit) = &self.graph.node(id)?.op else {
            return None;
        };
        Some(lit)
    }
}

/// What a pass does with one node of the old graph, given its operands already mapped into
/// the new graph.
pub(crate) trait NodeRewrite {
    /// Returns the new node standing for `node`.
    fn rewrite(
        &mut self,
        b: &mut Builder,
        old_id: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId>;
}

/// Copies the node as it is (through the builder, so duplicates merge when CSE is on).
pub(crate) struct Copy;

impl NodeRewrite for Copy {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        _: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        b.push(node.op.clone(), operands)
    }
}

/// Rebuilds `old` through `rw`, keeping only nodes in `keep` (all when `None`). Parameters are
/// always kept and created first, in index order, so the new graph has the old signature even
/// when a parameter is unused; outputs keep their order and types (checked, since a pass that
/// changed an output type would hand the caller a wrong executable).
pub(crate) fn rebuild(
    old: &Graph,
    keep: Option<&[bool]>,
    cse: bool,
    rw: &mut dyn NodeRewrite,
) -> Result<Graph> {
    let mut b = Builder::new(old.len(), cse);
    let mut map: Vec<Option<NodeId>> = vec![None; old.len()];
    for &p in old.parameters() {
        let ty = old.node_type(p).clone();
        map[p.index()] = Some(b.graph.parameter(ty));
    }
    let mut operands = Vec::new();
    for (i, node) in old.nodes().iter().enumerate() {
        if matches!(node.op, Op::Parameter { .. }) || keep.is_some_and(|k| !k[i]) {
            continue;
        }
        operands.clear();
        for &o in &node.operands {
            operands.push(mapped(&map, o)?);
        }
        map[i] = Some(rw.rewrite(&mut b, NodeId(i), node, &operands)?);
    }
    let outputs = old
        .outputs()
        .iter()
        .map(|&o| mapped(&map, o))
        .collect::<Result<Vec<_>>>()?;
    b.graph.set_outputs(&outputs)?;
    if b.graph.output_types() != old.output_types() {
        return Err(Error::InvalidGraph {
            message: format!(
                "a pass changed the output types from {:?} to {:?}",
                old.output_types(),
                b.graph.output_types()
            ),
        });
    }
    Ok(b.graph)
}

fn mapped(map: &[Option<NodeId>], id: NodeId) -> Result<NodeId> {
    map.get(id.index())
        .copied()
        .flatten()
        .ok_or_else(|| Error::InvalidGraph {
            message: format!("node {id} is used but was removed or comes later"),
        })
}
