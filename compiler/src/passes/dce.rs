//! Dead code elimination: drop every node no output depends on. Parameters stay (the
//! program's signature is the caller's contract even for an unused input).

use crate::error::Result;
use crate::ir::Graph;

use super::rewrite::{rebuild, Copy};

/// `graph` without the nodes that no output reaches.
pub fn dce(graph: &Graph) -> Result<Graph> {
    let live = live_nodes(graph);
    rebuild(graph, Some(&live), false, &mut Copy)
}

/// `live[i]` is true when some output depends on node `i`. One backward sweep suffices because
/// operands always precede their users.
pub(crate) fn live_nodes(graph: &Graph) -> Vec<bool> {
    let mut live = vec![false; graph.len()];
    for &o in graph.outputs() {
        live[o.index()] = true;
    }
    for (i, node) in graph.nodes().iter().enumerate().rev() {
        if live[i] {
            for &o in &node.operands {
                live[o.index()] = true;
            }
        }
    }
    live
}
