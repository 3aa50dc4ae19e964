//! The graph: an append-only arena of typed nodes, built through checked builder methods.

use std::fmt;

use crate::error::{Error, Result};

use super::infer::infer;
use super::op::{Graph, Node, NodeId, Op};
use super::types::TensorType;

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// An empty graph with room for `nodes` nodes.
    pub fn with_capacity(nodes: usize) -> Graph {
        Graph {
            nodes: Vec::with_capacity(nodes),
            params: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Adds the next parameter (index = number of parameters so far) of type `ty`.
    pub fn parameter(&mut self, ty: TensorType) -> NodeId {
        let id = NodeId(self.nodes.len());
        let index = self.params.len();
        self.nodes.push(Node {
            op: Op::Parameter { index },
            operands: Vec::new(),
            ty,
        });
        self.params.push(id);
        id
    }

    /// Appends `op` applied to `operands`, inferring its type. Parameters are added with
    /// [`Graph::parameter`] instead.
    pub fn push(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        if let Op::Parameter { .. } = op {
            return Err(Error::InvalidGraph {
                message: "add parameters with Graph::parameter".to_string(),
            });
        }
        let ty = {
            let mut types: Vec<&TensorType> = Vec::with_capacity(operands.len());
            for &o in operands {
                types.push(self.type_of(o, self.nodes.len())?);
            }
            infer(&op, &types)?
        };
        let id = NodeId(self.nodes.len());
        self.nodes.push(Node {
            op,
            operands: operands.to_vec(),
            ty,
        });
        Ok(id)
    }

    /// Sets the ordered outputs (replacing earlier ones); an id may appear more than once.
    pub fn set_outputs(&mut self, outputs: &[NodeId]) -> Result<()> {
        for &o in outputs {
            self.type_of(o, self.nodes.len())?;
        }
        self.outputs = outputs.to_vec();
        Ok(())
    }

    /// A graph from raw parts, checked with [`Graph::validate`].
    pub fn from_nodes(nodes: Vec<Node>, outputs: Vec<NodeId>) -> Result<Graph> {
        let mut params: Vec<(usize, NodeId)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let Op::Parameter { index } = n.op else {
                    return None;
                };
                Some((index, NodeId(i)))
            })
            .collect();
        params.sort();
        let g = Graph {
            nodes,
            params: params.into_iter().map(|(_, id)| id).collect(),
            outputs,
        };
        g.validate()?;
        Ok(g)
    }

    /// Checks every structural rule: operands refer to earlier nodes, each node's type is what
    /// inference gives, parameters are numbered `0..n` without gaps or repeats, outputs exist.
    pub fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidGraph { message });
        let mut seen_params = vec![false; self.params.len()];
        let mut count = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            if node.ty.checked_size().is_none() {
                return invalid(format!(
                    "node {i} has type {}, too large to address",
                    node.ty
                ));
            }
            if let Op::Parameter { index } = node.op {
                if !node.operands.is_empty() {
                    return invalid(format!("parameter node {i} has operands"));
                }
                match seen_params.get_mut(index) {
                    Some(s) if !*s && self.params.get(index) == Some(&NodeId(i)) => *s = true,
                    _ => {
                        return invalid(format!(
                            "parameter index {index} at node {i} is repeated or out of order"
                        ))
                    }
                }
                count += 1;
                continue;
            }
            let mut types = Vec::with_capacity(node.operands.len());
            for &o in &node.operands {
                types.push(self.type_of(o, i)?);
            }
            let ty = infer(&node.op, &types)?;
            if ty != node.ty {
                return invalid(format!(
                    "node {i} ({}) records type {} but its operands give {ty}",
                    node.op.name(),
                    node.ty
                ));
            }
        }
        if count != self.params.len() {
            return invalid(format!(
                "{} parameters listed, {count} found",
                self.params.len()
            ));
        }
        for &o in &self.outputs {
            self.type_of(o, self.nodes.len())?;
        }
        Ok(())
    }

    /// The type of `id`, which must come before position `before`.
    fn type_of(&self, id: NodeId, before: usize) -> Result<&TensorType> {
        match self.nodes.get(id.0) {
            Some(n) if id.0 < before => Ok(&n.ty),
            _ => Err(Error::InvalidGraph {
                message: format!(
                    "node {} refers to node {}, which does not precede it",
                    before, id.0
                ),
            }),
        }
    }

    /// Every node, in order (parameters included).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node `id`; `None` if it is not in this graph.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.0)
    }

    /// The type of node `id`.
    ///
    /// # Panics
    /// If `id` was not returned by this graph's builder (ids are positions in the arena).
    pub fn node_type(&self, id: NodeId) -> &TensorType {
        &self.nodes[id.0].ty
    }

    /// The outputs, in order.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Parameter nodes, by parameter index.
    pub fn parameters(&self) -> &[NodeId] {
        &self.params
    }

    /// Parameter types, by parameter index (the program's signature).
    pub fn parameter_types(&self) -> Vec<TensorType> {
        self.params
            .iter()
            .map(|&p| self.nodes[p.0].ty.clone())
            .collect()
    }

    /// Output types, in output order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs
            .iter()
            .map(|&o| self.nodes[o.0].ty.clone())
            .collect()
    }

    /// Number of nodes, parameters included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the graph has no nodes at all.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of nodes that are not parameters.
    pub fn op_count(&self) -> usize {
        self.nodes.len() - self.params.len()
    }

    /// One line per non-parameter node, `add(%2, %3) -> f32[4,8]`, for diagnostics that
    /// compare two graphs.
    pub fn op_descriptions(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Parameter { .. }))
            .map(|n| {
                let args: Vec<String> = n.operands.iter().map(|o| o.to_string()).collect();
                format!("{}({}) -> {}", n.op, args.join(", "), n.ty)
            })
            .collect()
    }
}

/// A readable listing, one node per line.
impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            let args: Vec<String> = n.operands.iter().map(|o| o.to_string()).collect();
            writeln!(f, "%{i} = {}({}) : {}", n.op, args.join(", "), n.ty)?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        write!(f, "outputs: [{}]", outs.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Literal};
    use crate::DType;

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }

    #[test]
    fn build_and_validate() {
        let mut g = Graph::new();
        let a = g.parameter(f32s(&[2, 3]));
        let b = g.parameter(f32s(&[2, 3]));
        let c = g.push(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
        g.set_outputs(&[c, a]).unwrap();
        g.validate().unwrap();
        assert_eq!(g.op_count(), 1);
        assert_eq!(g.parameter_types(), vec![f32s(&[2, 3]); 2]);
        assert_eq!(
            g.op_descriptions(),
            vec!["add(%0, %1) -> f32[2,3]".to_string()]
        );
        let again = Graph::from_nodes(g.nodes().to_vec(), g.outputs().to_vec()).unwrap();
        assert_eq!(again, g);
    }

    #[test]
    fn structural_errors() {
        let mut g = Graph::new();
        let a = g.parameter(f32s(&[2]));
        assert!(g.push(Op::Binary(BinaryOp::Add), &[a, NodeId(7)]).is_err());
        assert!(g.push(Op::Parameter { index: 1 }, &[]).is_err());
        assert!(g.set_outputs(&[NodeId(1)]).is_err());

        let konst = Op::Constant(Literal::splat(DType::F32, 1.0, &[2]));
        let good = Node {
            op: konst.clone(),
            operands: vec![],
            ty: f32s(&[2]),
        };
        // A forward reference.
        let fwd = Node {
            op: Op::Binary(BinaryOp::Add),
            operands: vec![NodeId(0), NodeId(1)],
            ty: f32s(&[2]),
        };
        assert!(Graph::from_nodes(vec![fwd, good.clone()], vec![]).is_err());
        // A recorded type that inference disagrees with.
        let wrong = Node {
            op: konst,
            operands: vec![],
            ty: f32s(&[3]),
        };
        assert!(matches!(
            Graph::from_nodes(vec![wrong], vec![]),
            Err(Error::InvalidGraph { .. })
        ));
        // Parameter numbering with a gap.
        let p = |index| Node {
            op: Op::Parameter { index },
            operands: vec![],
            ty: f32s(&[2]),
        };
        assert!(Graph::from_nodes(vec![p(0), p(2)], vec![]).is_err());
        assert!(Graph::from_nodes(vec![p(0), p(0)], vec![]).is_err());
        assert!(Graph::from_nodes(vec![p(1), p(0)], vec![NodeId(1)]).is_ok());
        // A missing output.
        assert!(Graph::from_nodes(vec![good], vec![NodeId(1)]).is_err());
    }
}
