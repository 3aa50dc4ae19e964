//! Common subexpression elimination: nodes with the same op (attributes and constant values
//! included, compared bit for bit) and the same operands become one node. Operands are merged
//! before their users, so whole duplicate subtrees collapse in one sweep.
//!
//! Every op of the IR is a pure function of its operands, including `random_bits` (a function
//! of its key) and the collectives (all replicas run the same program), so merging is always
//! safe. Parameters are never merged: two inputs of equal type are still two inputs.

use crate::error::Result;
use crate::ir::Graph;

use super::rewrite::{rebuild, Copy};

/// `graph` with duplicate computations merged.
pub fn cse(graph: &Graph) -> Result<Graph> {
    rebuild(graph, None, true, &mut Copy)
}
