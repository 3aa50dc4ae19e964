//! `Op::Scan` as one `stablehlo.while` per loop, whatever number of its results are read.
//!
//! The loop state is the iteration counter (`i32`), the carries, one buffer per stacked result
//! the program reads, then the scanned operands and the invariants, passed through unchanged
//! (so the body reads them as block arguments, not as values captured from `main`). Each
//! iteration slices `xs[i]` out of every scanned operand, runs the body (its values named
//! under the prefix `s<node>_`), and writes each stacked node's value into row `i` of its
//! buffer.

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Graph, Literal, Node, NodeId, Op, ScanBody, ScanOutput, TensorType};

use super::text::{dense, tensor, tensor_of};
use super::Emitter;
use crate::dtype::DType;

/// The custom call whose result is a buffer as the runtime allocated it, never written by the
/// call ([`super::LowerOptions::own_handlers`]; the handler is
/// `crate::pjrt::ffi`'s, registered by every cpu client whose plugin has the FFI extension).
pub const UNINITIALIZED_TARGET: &str = "neuron_pc_uninitialized";

/// The custom call that writes whole rows into a stacked buffer in place: `(stack, update,
/// row)`, its result aliased to the stack; one copy of the update's bytes, where XLA's cpu
/// backend writes a `dynamic_update_slice` element by element on one thread.
pub const WRITE_ROWS_TARGET: &str = "neuron_pc_write_rows";

/// The custom call that reads whole rows of a scanned operand: `(stack, row)`; one copy of
/// the rows' bytes, where XLA's cpu backend copies a `dynamic_slice` element by element.
pub const READ_ROWS_TARGET: &str = "neuron_pc_read_rows";

/// A loop already in the text: what identifies it and where its results are.
pub(crate) struct Emitted {
    body: Arc<ScanBody>,
    length: usize,
    reverse: bool,
    operands: Vec<NodeId>,
    /// The while op's results (`%v5`).
    base: String,
    /// The stacked nodes it writes, in state order.
    stacked: Vec<NodeId>,
}

impl Emitted {
    fn name_of(&self, output: ScanOutput) -> Option<String> {
        let k = match output {
            ScanOutput::Carry(k) => k,
            ScanOutput::Stacked(n) => {
                self.body.carries + self.stacked.iter().position(|&s| s == n)?
            }
        };
        Some(format!("{}#{}", self.base, 1 + k))
    }
}

/// Emits node `i` (a scan result): the loop itself, the first time one of its results is
/// needed, and the name of this result.
pub(crate) fn emit(e: &mut Emitter, graph: &Graph, i: usize, node: &Node) -> Result<String> {
    let Op::Scan {
        body,
        length,
        reverse,
        output,
    } = &node.op
    else {
        return Err(crate::error::Error::InvalidGraph {
            message: format!("node {i} ({}) lowered as a scan", node.op.name()),
        });
    };
    let same = |x: &Emitted| {
        x.length == *length
            && x.reverse == *reverse
            && x.operands == node.operands
            && x.body == *body
    };
    if let Some(name) = e
        .scans
        .iter()
        .find(|x| same(x))
        .and_then(|x| x.name_of(*output))
    {
        return Ok(name);
    }
    // Every stacked result of this loop the program reads, in body order.
    let mut stacked: Vec<NodeId> = graph
        .nodes()
        .iter()
        .filter_map(|n| {
            let Op::Scan {
                body: b,
                length: l,
                reverse: r,
                output: ScanOutput::Stacked(s),
            } = &n.op
            else {
                return None;
            };
            let same = l == length && r == reverse && n.operands == node.operands && b == body;
            same.then_some(*s)
        })
        .collect();
    stacked.sort();
    stacked.dedup();
    let v = format!("%{}v{i}", e.prefix);
    emit_loop(e, graph, i, node, body, *length, *reverse, &stacked, &v)?;
    let emitted = Emitted {
        body: body.clone(),
        length: *length,
        reverse: *reverse,
        operands: node.operands.clone(),
        base: v,
        stacked,
    };
    let name = emitted.name_of(*output);
    e.scans.push(emitted);
    name.ok_or_else(|| crate::error::Error::InvalidGraph {
        message: format!("node {i}: a scan result its loop does not write"),
    })
}

#[allow(clippy::too_many_arguments)]
fn emit_loop(
    e: &mut Emitter,
    graph: &Graph,
    i: usize,
    node: &Node,
    body: &ScanBody,
    length: usize,
    reverse: bool,
    stacked: &[NodeId],
    v: &str,
) -> Result<()> {
    let (nc, nx) = (body.carries, body.xs);
    let g = &body.graph;
    let counter = tensor_of(DType::I32, &[]);
    let stacked_tys: Vec<TensorType> = stacked
        .iter()
        .map(|&n| {
            let t = g.node_type(n);
            let mut dims = vec![length];
            dims.extend_from_slice(&t.dims);
            TensorType::new(t.dtype, dims)
        })
        .collect();
    // State: counter, carries, stacked buffers, scanned operands, invariants.
    let mut init = vec![format!("{v}_i0")];
    let mut tys = vec![counter.clone()];
    e.line(&format!("{v}_i0 = stablehlo.constant dense<0> : {counter}"));
    for &o in &node.operands[..nc] {
        init.push(e.names[o.0].clone());
        tys.push(tensor(graph.node_type(o)));
    }
    for (b, t) in stacked_tys.iter().enumerate() {
        if e.own_handlers {
            // the attributes only keep XLA from merging two calls into one buffer
            e.line(&format!(
                "{v}_z{b} = stablehlo.custom_call @{UNINITIALIZED_TARGET}() {{api_version = 4 : \
                 i32, backend_config = {{loop = {i} : i64, stack = {b} : i64}}}} : () -> {}",
                tensor(t)
            ));
        } else {
            let zero = Literal::splat(t.dtype, 0.0, &t.dims);
            e.line(&format!(
                "{v}_z{b} = stablehlo.constant {} : {}",
                dense(&zero),
                tensor(t)
            ));
        }
        init.push(format!("{v}_z{b}"));
        tys.push(tensor(t));
    }
    for &o in &node.operands[nc..] {
        init.push(e.names[o.0].clone());
        tys.push(tensor(graph.node_type(o)));
    }
    let state = tys.join(", ");
    let block_args = |tag: &str| -> String {
        let args: Vec<String> = tys
            .iter()
            .enumerate()
            .map(|(k, t)| format!("{v}_{tag}{k}: {t}"))
            .collect();
        args.join(", ")
    };
    e.line(&format!(
        "{v}:{} = \"stablehlo.while\"({}) ({{",
        tys.len(),
        init.join(", ")
    ));
    // cond: i < length
    e.out.push_str(&format!("  ^bb0({}):\n", block_args("c")));
    e.line(&format!(
        "{v}_n = stablehlo.constant dense<{length}> : {counter}"
    ));
    e.line(&format!(
        "{v}_lt = stablehlo.compare LT, {v}_c0, {v}_n, SIGNED : ({counter}, {counter}) -> \
         tensor<i1>"
    ));
    e.line(&format!(
        "\"stablehlo.return\"({v}_lt) : (tensor<i1>) -> ()"
    ));
    e.out.push_str("  }, {\n");
    // body
    e.out.push_str(&format!("  ^bb0({}):\n", block_args("a")));
    let idx = if reverse {
        e.line(&format!(
            "{v}_last = stablehlo.constant dense<{}> : {counter}",
            length - 1
        ));
        e.line(&format!(
            "{v}_idx = stablehlo.subtract {v}_last, {v}_a0 : {counter}"
        ));
        format!("{v}_idx")
    } else {
        format!("{v}_a0")
    };
    e.line(&format!(
        "{v}_zero = stablehlo.constant dense<0> : {counter}"
    ));
    let at = |rank: usize| -> String {
        let mut s = vec![idx.clone()];
        s.extend(std::iter::repeat_n(format!("{v}_zero"), rank - 1));
        s.join(", ")
    };
    let index_tys = |rank: usize| vec![counter.clone(); rank].join(", ");
    let m = stacked.len();
    let mut params: Vec<String> = (1..=nc).map(|k| format!("{v}_a{k}")).collect();
    for j in 0..nx {
        let whole = graph.node_type(node.operands[nc + j]);
        let slice = g.node_type(g.parameters()[nc + j]);
        let arg = format!("{v}_a{}", 1 + nc + m + j);
        let mut row_dims = vec![1];
        row_dims.extend_from_slice(&slice.dims);
        let row = tensor_of(slice.dtype, &row_dims);
        if e.own_handlers {
            e.line(&format!(
                "{v}_x{j}r = stablehlo.custom_call @{READ_ROWS_TARGET}({arg}, {idx}) \
                 {{api_version = 4 : i32}} : ({}, {counter}) -> {row}",
                tensor(whole)
            ));
        } else {
            let mut sizes = vec![1i64];
            sizes.extend(slice.dims.iter().map(|&d| d as i64));
            e.line(&format!(
                "{v}_x{j}r = \"stablehlo.dynamic_slice\"({arg}, {}) {{slice_sizes = {}}} : ({}, \
                 {}) -> {row}",
                at(whole.rank()),
                super::text::i64_array(&sizes),
                tensor(whole),
                index_tys(whole.rank())
            ));
        }
        e.line(&format!(
            "{v}_x{j} = \"stablehlo.reshape\"({v}_x{j}r) : ({row}) -> {}",
            tensor(slice)
        ));
        params.push(format!("{v}_x{j}"));
    }
    let ni = body.invariants();
    params.extend((0..ni).map(|k| format!("{v}_a{}", 1 + nc + m + nx + k)));
    let mut inner = Emitter::new(format!("{}s{i}_", e.prefix), g.len(), e.partitioned);
    inner.own_handlers = e.own_handlers;
    inner.emit_nodes(g, &params)?;
    e.out.push_str(&inner.out);
    let mut next = vec![format!("{v}_i1")];
    e.line(&format!(
        "{v}_one = stablehlo.constant dense<1> : {counter}"
    ));
    e.line(&format!(
        "{v}_i1 = stablehlo.add {v}_a0, {v}_one : {counter}"
    ));
    next.extend(g.outputs().iter().map(|o| inner.names[o.0].clone()));
    for (b, (&n, t)) in stacked.iter().zip(&stacked_tys).enumerate() {
        let value = g.node_type(n);
        let mut row_dims = vec![1];
        row_dims.extend_from_slice(&value.dims);
        let row = tensor_of(value.dtype, &row_dims);
        e.line(&format!(
            "{v}_u{b}r = \"stablehlo.reshape\"({}) : ({}) -> {row}",
            inner.names[n.0],
            tensor(value)
        ));
        if e.own_handlers {
            // the result is the stack's own buffer: XLA copies the stack first only where
            // something else still reads it (nothing does in this loop)
            e.line(&format!(
                "{v}_u{b} = stablehlo.custom_call @{WRITE_ROWS_TARGET}({v}_a{}, {v}_u{b}r, {idx}) \
                 {{api_version = 4 : i32, output_operand_aliases = \
                 [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, \
                 operand_tuple_indices = []>]}} : ({}, {row}, {counter}) -> {}",
                1 + nc + b,
                tensor(t),
                tensor(t)
            ));
        } else {
            e.line(&format!(
                "{v}_u{b} = \"stablehlo.dynamic_update_slice\"({v}_a{}, {v}_u{b}r, {}) : ({}, \
                 {row}, {}) -> {}",
                1 + nc + b,
                at(t.rank()),
                tensor(t),
                index_tys(t.rank()),
                tensor(t)
            ));
        }
        next.push(format!("{v}_u{b}"));
    }
    next.extend((1 + nc + m..tys.len()).map(|k| format!("{v}_a{k}")));
    e.line(&format!(
        "\"stablehlo.return\"({}) : ({state}) -> ()",
        next.join(", ")
    ));
    e.line(&format!("}}) : ({state}) -> ({state})"));
    Ok(())
}
