//! One arm per op: the StableHLO text for a node.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, Graph, Literal, Node, Op, ProcessCollective, ReduceOp, TensorType,
};

use super::text::{dense, i64_array, list, replica_groups, tensor, tensor_of};
use super::{random, Emitter};

/// Emits node `i` and returns the SSA name holding its value.
pub(crate) fn emit(e: &mut Emitter, graph: &Graph, i: usize, node: &Node) -> Result<String> {
    let v = format!("%{}v{i}", e.prefix);
    let ty = tensor(&node.ty);
    let args: Vec<String> = node.operands.iter().map(|o| e.names[o.0].clone()).collect();
    let arg_tys: Vec<String> = node
        .operands
        .iter()
        .map(|o| tensor(graph.node_type(*o)))
        .collect();
    let arg_list = args.join(", ");
    let sig = format!("({}) -> {ty}", arg_tys.join(", "));
    let in_ty = node.operands.first().map(|o| graph.node_type(*o));
    let line = match &node.op {
        Op::Parameter { .. } => {
            return Err(Error::InvalidGraph {
                message: format!("parameter at node {i} reached the op lowering"),
            })
        }
        Op::Constant(lit) => format!("{v} = stablehlo.constant {} : {ty}", dense(lit)),
        // Every unary op in the generic form (CHLO's erf included; the plugin legalizes it).
        Op::Unary(u) => format!("{v} = \"{}\"({arg_list}) : {sig}", u.stablehlo_name()),
        Op::Binary(b @ (BinaryOp::Max | BinaryOp::Min)) if node.ty.dtype.is_float() => {
            let pred = tensor_of(DType::Pred, &node.ty.dims);
            for l in nan_propagating(&v, *b, &args[0], &args[1], &ty, &pred) {
                e.line(&l);
            }
            return Ok(v);
        }
        Op::Binary(b) => format!("{v} = {} {arg_list} : {ty}", b.stablehlo_name()),
        Op::Compare(c) => {
            let dtype = in_ty.map_or(node.ty.dtype, |t| t.dtype);
            format!(
                "{v} = stablehlo.compare {}, {arg_list}, {} : {sig}",
                c.direction(),
                CompareOp::compare_type(dtype)
            )
        }
        Op::Select => format!("{v} = \"stablehlo.select\"({arg_list}) : {sig}"),
        Op::Convert(_) => format!("{v} = \"stablehlo.convert\"({arg_list}) : {sig}"),
        Op::ReplicaId => format!("{v} = \"stablehlo.replica_id\"() : () -> {ty}"),
        Op::ProcessIndex => format!(
            "{v} = stablehlo.custom_call @{PROCESS_INDEX_TARGET}() {{api_version = 4 : i32, \
             backend_config = {{}}}} : () -> {ty}"
        ),
        Op::ProcessBucket { .. } => return emit_bucket(e, graph, i, node),
        Op::ProcessCollective {
            collective,
            tag,
            manual,
            leader,
            ..
        } => {
            let (op, dim) = match *collective {
                ProcessCollective::AllReduce(op) => (op, 0),
                ProcessCollective::AllGather { dim } => (ReduceOp::Sum, dim),
                ProcessCollective::ReduceScatter { op, dim } => (op, dim),
                ProcessCollective::Ordered => (ReduceOp::Sum, 0),
            };
            // the handler reads and writes row-major buffers: XLA must not pick another layout
            // (of an ordering edge too, which it never reads)
            let operand_layouts: Vec<String> = (node.operands.iter())
                .map(|&o| row_major(graph.node_type(o).rank()))
                .collect();
            let mut layouts = format!(
                "operand_layouts = [{}], result_layouts = [{}]",
                operand_layouts.join(", "),
                row_major(node.ty.rank())
            );
            if matches!(
                collective,
                ProcessCollective::AllReduce(_) | ProcessCollective::Ordered
            ) {
                layouts.push_str(IN_PLACE);
            }
            let call = |arg: &str, sig: &str| {
                format!(
                    "stablehlo.custom_call @{}({arg}) {{api_version = 4 : i32, backend_config = \
                     {{dim = {dim} : i64, leader = {} : i64, op = {} : i64, tag = {tag} : i64}}, \
                     {layouts}}} : {sig}",
                    process_target(collective),
                    i64::from(*leader),
                    process_reduce_code(op)
                )
            };
            let Some(layout) = manual else {
                e.line(&format!("{v} = {}", call(&arg_list, &sig)));
                return Ok(v);
            };
            let x = in_ty.ok_or_else(|| missing(i))?;
            // each device's block, in a manual region of the operand's layout; a gather or a
            // scatter along a dimension the layout splits runs on whole copies instead (the
            // processes' blocks of a device's block do not make that device's block)
            let along = matches!(
                collective,
                ProcessCollective::AllGather { .. } | ProcessCollective::ReduceScatter { .. }
            );
            let layout = if along && sharding_tiles(layout, x.rank())?.get(dim) > Some(&1) {
                "{replicated}"
            } else {
                layout.as_str()
            };
            let in_full = &arg_tys[0];
            let dtype = node.ty.dtype;
            let in_block = tensor_of(dtype, &manual_block(&node.op, layout, &x.dims)?);
            let out_block = tensor_of(dtype, &manual_block(&node.op, layout, &node.ty.dims)?);
            let m = enter_manual(e, &v, &args[0], layout, in_full, &in_block);
            let sig = format!("({in_block}) -> {out_block}");
            e.line(&format!("{v}_c = {}", call(&m, &sig)));
            leave_manual(e, &format!("{v}_c"), &v, layout, &out_block, &ty);
            return Ok(v);
        }
        Op::Iota { dim, .. } => {
            format!("{v} = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {ty}")
        }
        Op::BroadcastInDim {
            broadcast_dimensions,
            ..
        } => format!(
            "{v} = \"stablehlo.broadcast_in_dim\"({arg_list}) \
             {{broadcast_dimensions = {}}} : {sig}",
            i64_array(&to_i64(broadcast_dimensions))
        ),
        Op::Reshape { .. } => format!("{v} = \"stablehlo.reshape\"({arg_list}) : {sig}"),
        Op::Transpose { perm } => format!(
            "{v} = \"stablehlo.transpose\"({arg_list}) {{permutation = {}}} : {sig}",
            i64_array(&to_i64(perm))
        ),
        Op::Slice {
            start,
            limit,
            stride,
        } => format!(
            "{v} = \"stablehlo.slice\"({arg_list}) \
             {{start_indices = {}, limit_indices = {}, strides = {}}} : {sig}",
            i64_array(&to_i64(start)),
            i64_array(&to_i64(limit)),
            i64_array(&to_i64(stride))
        ),
        Op::DynamicSlice { sizes } => format!(
            "{v} = \"stablehlo.dynamic_slice\"({arg_list}) {{slice_sizes = {}}} : {sig}",
            i64_array(&to_i64(sizes))
        ),
        Op::DynamicUpdateSlice => {
            format!("{v} = \"stablehlo.dynamic_update_slice\"({arg_list}) : {sig}")
        }
        Op::Concatenate { dim } => {
            format!(
                "{v} = \"stablehlo.concatenate\"({arg_list}) {{dimension = {dim} : i64}} : {sig}"
            )
        }
        Op::Pad {
            low,
            high,
            interior,
        } => format!(
            "{v} = \"stablehlo.pad\"({arg_list}) {{edge_padding_low = {}, \
             edge_padding_high = {}, interior_padding = {}}} : {sig}",
            i64_array(low),
            i64_array(high),
            i64_array(&to_i64(interior))
        ),
        Op::Reduce(r, dims) => {
            let dtype = node.ty.dtype;
            let init = format!("{v}_init");
            e.line(&format!(
                "{init} = stablehlo.constant {} : {}",
                dense(&reduce_init(*r, dtype)),
                tensor_of(dtype, &[])
            ));
            let region = combiner_region(&v, r.combiner(), dtype, !e.partitioned);
            format!(
                "{v} = \"stablehlo.reduce\"({arg_list}, {init}) ({region}) \
                 {{dimensions = {}}} : ({}, {}) -> {ty}",
                i64_array(&to_i64(dims)),
                arg_tys[0],
                tensor_of(dtype, &[])
            )
        }
        Op::ArgMax { dim, index_dtype } | Op::ArgMin { dim, index_dtype } => {
            let max = matches!(node.op, Op::ArgMax { .. });
            let x = in_ty.ok_or_else(|| missing(i))?;
            return Ok(arg_reduce(e, &v, &args[0], x, *dim, *index_dtype, max));
        }
        Op::ArgSort {
            dim,
            descending,
            index_dtype,
        } => {
            let x = in_ty.ok_or_else(|| missing(i))?;
            let (s, si) = (tensor_of(x.dtype, &[]), tensor_of(*index_dtype, &[]));
            let (xt, it) = (tensor(x), tensor_of(*index_dtype, &x.dims));
            let pred = tensor_of(DType::Pred, &[]);
            let ct = if x.dtype.is_float() {
                "TOTALORDER"
            } else {
                CompareOp::compare_type(x.dtype)
            };
            let dir = if *descending { "GT" } else { "LT" };
            e.line(&format!(
                "{v}_iota = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {it}"
            ));
            let compare = format!(
                "{v}_lt = stablehlo.compare {dir}, {v}_a, {v}_b, {ct} : ({s}, {s}) -> {pred}"
            );
            e.line(&format!(
                "{v}_s:2 = \"stablehlo.sort\"({}, {v}_iota) ({{\n    \
                 ^bb0({v}_a: {s}, {v}_b: {s}, {v}_ia: {si}, {v}_ib: {si}):\n      \
                 {compare}\n      stablehlo.return {v}_lt : {pred}\n    }}) \
                 {{dimension = {dim} : i64, is_stable = true}} : ({xt}, {it}) -> ({xt}, {it})",
                args[0]
            ));
            return Ok(format!("{v}_s#1"));
        }
        Op::TopK { k } => {
            let x = in_ty.ok_or_else(|| missing(i))?;
            let mut dims = x.dims.clone();
            *dims.last_mut().ok_or_else(|| missing(i))? = *k;
            let (vt, it) = (tensor_of(x.dtype, &dims), tensor_of(DType::I32, &dims));
            e.line(&format!(
                "{v}_t:2 = chlo.top_k({}, k = {k}) : {} -> ({vt}, {it})",
                args[0],
                tensor(x)
            ));
            return Ok(format!("{v}_t#1"));
        }
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => {
            let mut fields = Vec::new();
            for (name, dims) in [
                ("lhs_batching_dimensions", lhs_batch),
                ("rhs_batching_dimensions", rhs_batch),
                ("lhs_contracting_dimensions", lhs_contract),
                ("rhs_contracting_dimensions", rhs_contract),
            ] {
                if !dims.is_empty() {
                    fields.push(format!("{name} = {}", list(dims)));
                }
            }
            format!(
                "{v} = \"stablehlo.dot_general\"({arg_list}) \
                 {{dot_dimension_numbers = #stablehlo.dot<{}>}} : {sig}",
                fields.join(", ")
            )
        }
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => {
            let k = stride.len();
            let spatial: Vec<String> = (0..k).map(|i| i.to_string()).collect();
            let s = spatial.join(", ");
            let pads: Vec<String> = padding.iter().map(|p| format!("[{p}, {p}]")).collect();
            format!(
                "{v} = \"stablehlo.convolution\"({arg_list}) {{batch_group_count = 1 : i64, \
                 dimension_numbers = #stablehlo.conv<[b, f, {s}]x[o, i, {s}]->[b, f, {s}]>, \
                 feature_group_count = {groups} : i64, lhs_dilation = {}, \
                 padding = dense<[{}]> : tensor<{k}x2xi64>, rhs_dilation = {}, \
                 window_strides = {}}} : {sig}",
                i64_array(&vec![1i64; k]),
                pads.join(", "),
                i64_array(&to_i64(dilation)),
                i64_array(&to_i64(stride))
            )
        }
        Op::ReduceWindow {
            op,
            window,
            stride,
            padding,
        } => {
            let dtype = node.ty.dtype;
            let init = format!("{v}_init");
            e.line(&format!(
                "{init} = stablehlo.constant {} : {}",
                dense(&reduce_init(*op, dtype)),
                tensor_of(dtype, &[])
            ));
            let region = combiner_region(&v, op.combiner(), dtype, !e.partitioned);
            let pads: Vec<String> = padding.iter().map(|p| format!("[{p}, {p}]")).collect();
            format!(
                "{v} = \"stablehlo.reduce_window\"({arg_list}, {init}) ({region}) \
                 {{padding = dense<[{}]> : tensor<{}x2xi64>, window_dimensions = {}, \
                 window_strides = {}}} : ({}, {}) -> {ty}",
                pads.join(", "),
                padding.len(),
                i64_array(&to_i64(window)),
                i64_array(&to_i64(stride)),
                arg_tys[0],
                tensor_of(dtype, &[])
            )
        }
        Op::Gather => {
            let (table, idx) = (
                graph.node_type(node.operands[0]),
                graph.node_type(node.operands[1]),
            );
            let k = idx.rank();
            let offset: Vec<usize> = (k..k + table.rank() - 1).collect();
            let mut sizes = table.dims.clone();
            sizes[0] = 1;
            let offset_field = if offset.is_empty() {
                String::new()
            } else {
                format!("offset_dims = {}, ", list(&offset))
            };
            format!(
                "{v} = \"stablehlo.gather\"({arg_list}) \
                 {{dimension_numbers = #stablehlo.gather<{offset_field}collapsed_slice_dims = [0], \
                 start_index_map = [0], index_vector_dim = {k}>, indices_are_sorted = false, \
                 slice_sizes = {}}} : {sig}",
                i64_array(&to_i64(&sizes))
            )
        }
        Op::ScatterAdd => {
            let (table, idx) = (
                graph.node_type(node.operands[0]),
                graph.node_type(node.operands[1]),
            );
            let k = idx.rank();
            let window: Vec<usize> = (k..k + table.rank() - 1).collect();
            let window_field = if window.is_empty() {
                String::new()
            } else {
                format!("update_window_dims = {}, ", list(&window))
            };
            let region = combiner_region(&v, BinaryOp::Add, table.dtype, false);
            format!(
                "{v} = \"stablehlo.scatter\"({arg_list}) ({region}) \
                 {{indices_are_sorted = false, \
                 scatter_dimension_numbers = #stablehlo.scatter<{window_field}\
                 inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], \
                 index_vector_dim = {k}>, unique_indices = false}} : {sig}"
            )
        }
        Op::RandomBits { dims } => return Ok(random::emit(e, &v, &args[0], dims)),
        Op::Scan { .. } => return super::scan::emit(e, graph, i, node),
        Op::Call { .. } => {
            return Err(Error::InvalidGraph {
                message: format!("call at node {i} reached the op lowering, not expanded"),
            })
        }
        // only differentiation sees it: the value is the operand's
        Op::StopGradient => return Ok(args[0].clone()),
        // alone it orders nothing: the value is the operand's
        Op::After if args.len() == 1 => return Ok(args[0].clone()),
        Op::ShardingConstraint { sharding } => {
            let t = &arg_tys[0];
            e.line(&format!(
                "{v} = stablehlo.custom_call @Sharding({}) {{mhlo.sharding = \"{sharding}\"}} \
                 : ({t}) -> {t}",
                args[0]
            ));
            return Ok(v);
        }
        Op::After => {
            let tys = format!("({})", arg_tys.join(", "));
            e.line(&format!(
                "{v}:{} = \"stablehlo.optimization_barrier\"({arg_list}) : {tys} -> {tys}",
                args.len()
            ));
            return Ok(format!("{v}#0"));
        }
        Op::AllReduce {
            op,
            replica_groups: g,
        } => {
            let region = combiner_region(&v, op.combiner(), node.ty.dtype, false);
            format!(
                "{v} = \"stablehlo.all_reduce\"({arg_list}) ({region}) \
                 {{replica_groups = {}}} : {sig}",
                replica_groups(g)
            )
        }
        Op::AllGather {
            dim,
            replica_groups: g,
        } => format!(
            "{v} = \"stablehlo.all_gather\"({arg_list}) \
             {{all_gather_dim = {dim} : i64, replica_groups = {}}} : {sig}",
            replica_groups(g)
        ),
        Op::ReduceScatter {
            op,
            dim,
            replica_groups: g,
        } => {
            let region = combiner_region(&v, op.combiner(), node.ty.dtype, false);
            format!(
                "{v} = \"stablehlo.reduce_scatter\"({arg_list}) ({region}) \
                 {{replica_groups = {}, scatter_dimension = {dim} : i64}} : {sig}",
                replica_groups(g)
            )
        }
    };
    e.line(&line);
    Ok(v)
}

/// The custom-call target of [`Op::ProcessIndex`].
pub const PROCESS_INDEX_TARGET: &str = "neuron_pc_process_index";

/// Emits node `i`, a result of an [`Op::ProcessBucket`]: the bucket's region the first time
/// one of its results is needed, and the name of this result.
fn emit_bucket(e: &mut Emitter, graph: &Graph, i: usize, node: &Node) -> Result<String> {
    let Op::ProcessBucket {
        op,
        tag,
        layouts,
        output,
        ..
    } = &node.op
    else {
        return Err(Error::InvalidGraph {
            message: format!("node {i} ({}) lowered as a bucket", node.op.name()),
        });
    };
    let result = |base: &str| format!("{base}_o{output}");
    if let Some((_, base)) = e.buckets.iter().find(|(t, _)| t == tag) {
        return Ok(result(base));
    }
    let v = format!("%{}v{i}", e.prefix);
    let dtype = node.ty.dtype;
    // each operand's block on this device: (elements, block type, whole type, layout)
    let mut blocks = Vec::with_capacity(node.operands.len());
    for (k, (o, layout)) in node.operands.iter().zip(layouts).enumerate() {
        let full_ty = graph.node_type(*o);
        let full = tensor(full_ty);
        let dims = manual_block(&node.op, layout, &full_ty.dims)?;
        let n: usize = dims.iter().product();
        let block = tensor_of(dtype, &dims);
        let flat = tensor_of(dtype, &[n]);
        let arg = e.names[o.0].clone();
        let m = enter_manual(e, &format!("{v}_{k}"), &arg, layout, &full, &block);
        e.line(&format!(
            "{v}_f{k} = \"stablehlo.reshape\"({m}) : ({block}) -> {flat}"
        ));
        blocks.push((n, block, full, layout));
    }
    let total: usize = blocks.iter().map(|b| b.0).sum();
    let joined = tensor_of(dtype, &[total]);
    let names: Vec<String> = (0..blocks.len()).map(|k| format!("{v}_f{k}")).collect();
    let types: Vec<String> = blocks.iter().map(|b| tensor_of(dtype, &[b.0])).collect();
    e.line(&format!(
        "{v}_j = \"stablehlo.concatenate\"({}) {{dimension = 0 : i64}} : ({}) -> {joined}",
        names.join(", "),
        types.join(", ")
    ));
    e.line(&format!(
        "{v}_c = stablehlo.custom_call @{}({v}_j) {{api_version = 4 : i32, backend_config = \
         {{dim = 0 : i64, leader = 0 : i64, op = {} : i64, tag = {tag} : i64}}, \
         operand_layouts = [{}], result_layouts = [{}]{IN_PLACE}}} : ({joined}) -> {joined}",
        process_target(&ProcessCollective::AllReduce(*op)),
        process_reduce_code(*op),
        row_major(1),
        row_major(1)
    ));
    let mut at = 0;
    for (k, (n, block, full, layout)) in blocks.iter().enumerate() {
        let flat = tensor_of(dtype, &[*n]);
        e.line(&format!(
            "{v}_x{k} = \"stablehlo.slice\"({v}_c) {{start_indices = array<i64: {at}>, \
             limit_indices = array<i64: {}>, strides = array<i64: 1>}} : ({joined}) -> {flat}",
            at + n
        ));
        e.line(&format!(
            "{v}_y{k} = \"stablehlo.reshape\"({v}_x{k}) : ({flat}) -> {block}"
        ));
        leave_manual(
            e,
            &format!("{v}_y{k}"),
            &format!("{v}_o{k}"),
            layout,
            block,
            full,
        );
        at += n;
    }
    e.buckets.push((*tag, v.clone()));
    Ok(result(&v))
}

/// A process all-reduce works in place: its result may reuse the operand's buffer (XLA copies
/// the operand first only when something else still reads it).
const IN_PLACE: &str = ", output_operand_aliases = [#stablehlo.output_operand_alias<\
                        output_tuple_indices = [], operand_index = 0, operand_tuple_indices = \
                        []>]";

/// The shape of each device's block of a value of shape `dims` laid out as `layout`; an error
/// naming `op` when the layout's tiles do not divide it.
fn manual_block(op: &Op, layout: &str, dims: &[usize]) -> Result<Vec<usize>> {
    let tiles = sharding_tiles(layout, dims.len())?;
    dims.iter()
        .zip(&tiles)
        .map(|(d, t)| match d % t {
            0 => Ok(d / t),
            _ => Err(Error::InvalidGraph {
                message: format!(
                    "{op} over layout {layout}: dims {dims:?} do not split into {tiles:?} blocks"
                ),
            }),
        })
        .collect()
}

/// Enters a manual region of `layout` with `arg` (of type `full`): `{base}_s` pins the layout,
/// `{base}_m` is this device's block (of type `block`), whose name it returns.
fn enter_manual(
    e: &mut Emitter,
    base: &str,
    arg: &str,
    layout: &str,
    full: &str,
    block: &str,
) -> String {
    e.line(&format!(
        "{base}_s = stablehlo.custom_call @Sharding({arg}) {{mhlo.sharding = \"{layout}\"}} \
         : ({full}) -> {full}"
    ));
    e.line(&format!(
        "{base}_m = stablehlo.custom_call @SPMDFullToShardShape({base}_s) \
         {{mhlo.sharding = \"{{manual}}\"}} : ({full}) -> {block}"
    ));
    format!("{base}_m")
}

/// Leaves a manual region: `value`, each device's block (of type `block`), becomes `out` (of
/// type `full`) laid out as `layout`, through `{out}_r`.
fn leave_manual(e: &mut Emitter, value: &str, out: &str, layout: &str, block: &str, full: &str) {
    e.line(&format!(
        "{out}_r = stablehlo.custom_call @Sharding({value}) \
         {{mhlo.sharding = \"{{manual}}\"}} : ({block}) -> {block}"
    ));
    e.line(&format!(
        "{out} = stablehlo.custom_call @SPMDShardToFullShape({out}_r) \
         {{mhlo.sharding = \"{layout}\"}} : ({block}) -> {full}"
    ));
}

/// The custom-call target a [`ProcessCollective`] lowers to (`neuron_pc_<name>`).
pub fn process_target(c: &ProcessCollective) -> &'static str {
    match c {
        ProcessCollective::AllReduce(_) => "neuron_pc_process_all_reduce",
        ProcessCollective::AllGather { .. } => "neuron_pc_process_all_gather",
        ProcessCollective::ReduceScatter { .. } => "neuron_pc_process_reduce_scatter",
        ProcessCollective::Ordered => "neuron_pc_process_ordered",
    }
}

/// A row-major layout of `rank` dimensions, as a custom call's `operand_layouts` entry.
fn row_major(rank: usize) -> String {
    let dims: Vec<String> = (0..rank).rev().map(|d| d.to_string()).collect();
    format!("dense<[{}]> : tensor<{rank}xindex>", dims.join(", "))
}

/// The tile count of each of `rank` dimensions in an `mhlo.sharding` text: all 1 for
/// `{replicated}`, else the `devices=[..]` grid without its trailing replication dimension.
fn sharding_tiles(layout: &str, rank: usize) -> Result<Vec<usize>> {
    let bad = || Error::InvalidGraph {
        message: format!("cannot read the tiles of layout {layout} for a rank-{rank} value"),
    };
    if layout.trim() == "{replicated}" {
        return Ok(vec![1; rank]);
    }
    let grid = layout
        .split_once("devices=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .ok_or_else(bad)?
        .0;
    let mut tiles = grid
        .split(',')
        .map(|t| t.trim().parse::<usize>().map_err(|_| bad()))
        .collect::<Result<Vec<_>>>()?;
    if layout.contains("last_tile_dim_replicate") {
        tiles.pop();
    }
    if tiles.len() != rank || tiles.contains(&0) {
        return Err(bad());
    }
    Ok(tiles)
}

/// The `op` attribute of a process collective's call: 0 sum, 1 product, 2 max, 3 min.
pub fn process_reduce_code(op: ReduceOp) -> i64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    }
}

fn missing(i: usize) -> Error {
    Error::InvalidGraph {
        message: format!("node {i} lacks an operand"),
    }
}

fn to_i64(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// The identity of `r` on `dtype` (the reduce's init value).
pub(crate) fn reduce_init(r: ReduceOp, dtype: DType) -> Literal {
    // Infinities saturate to the integer extremes under `as` conversion.
    let v = match r {
        ReduceOp::Sum => 0.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    Literal::splat(dtype, v, &[])
}

/// A region `^bb0(a, b): return combine(a, b)` on scalars of `dtype`. With `nan_safe`, float
/// max/min propagate NaN explicitly; collectives take the bare op (the CPU backend accepts only
/// a single recognized op as a collective's reduction).
fn combiner_region(v: &str, op: BinaryOp, dtype: DType, nan_safe: bool) -> String {
    let s = tensor_of(dtype, &[]);
    let (a, b, c) = (format!("{v}_a"), format!("{v}_b"), format!("{v}_c"));
    let body = if nan_safe && dtype.is_float() && matches!(op, BinaryOp::Max | BinaryOp::Min) {
        nan_propagating(&c, op, &a, &b, &s, &tensor_of(DType::Pred, &[]))
    } else {
        vec![format!("{c} = {} {a}, {b} : {s}", op.stablehlo_name())]
    };
    let body: String = body.iter().map(|l| format!("      {l}\n")).collect();
    format!("{{\n    ^bb0({a}: {s}, {b}: {s}):\n{body}      stablehlo.return {c} : {s}\n    }}")
}

/// Float max/min that return NaN when either side is NaN, as StableHLO specifies. Spelled out
/// because backends may lower `maximum` to instructions that drop a NaN in one operand (the
/// XLA CPU plugin does unless `xla_cpu_enable_fast_min_max` is off).
fn nan_propagating(r: &str, op: BinaryOp, a: &str, b: &str, ty: &str, pred: &str) -> Vec<String> {
    vec![
        format!("{r}_m = {} {a}, {b} : {ty}", op.stablehlo_name()),
        format!("{r}_an = stablehlo.compare NE, {a}, {a}, FLOAT : ({ty}, {ty}) -> {pred}"),
        format!("{r}_bn = stablehlo.compare NE, {b}, {b}, FLOAT : ({ty}, {ty}) -> {pred}"),
        format!("{r}_t = \"stablehlo.select\"({r}_bn, {b}, {r}_m) : ({pred}, {ty}, {ty}) -> {ty}"),
        format!("{r} = \"stablehlo.select\"({r}_an, {a}, {r}_t) : ({pred}, {ty}, {ty}) -> {ty}"),
    ]
}

/// argmax/argmin as a reduce over (value, index) pairs; NaN wins, then the lower index.
fn arg_reduce(
    e: &mut Emitter,
    v: &str,
    x: &str,
    xt: &TensorType,
    dim: usize,
    idx: DType,
    max: bool,
) -> String {
    let (vd, s, si) = (xt.dtype, tensor_of(xt.dtype, &[]), tensor_of(idx, &[]));
    let pred = tensor_of(DType::Pred, &[]);
    let iota_ty = tensor_of(idx, &xt.dims);
    let mut out_dims = xt.dims.clone();
    out_dims.remove(dim);
    let (out_v, out_i) = (tensor_of(vd, &out_dims), tensor_of(idx, &out_dims));
    let init = reduce_init(if max { ReduceOp::Max } else { ReduceOp::Min }, vd);
    e.line(&format!(
        "{v}_iota = \"stablehlo.iota\"() {{iota_dimension = {dim} : i64}} : () -> {iota_ty}"
    ));
    e.line(&format!(
        "{v}_initv = stablehlo.constant {} : {s}",
        dense(&init)
    ));
    e.line(&format!("{v}_initi = stablehlo.constant dense<0> : {si}"));
    let ct = CompareOp::compare_type(vd);
    let dir = if max { "GT" } else { "LT" };
    // Integers: `a` wins when strictly better. Floats: also when `a` is NaN and `b` is not.
    let better = if vd.is_float() { "better" } else { "win" };
    let mut body = vec![format!(
        "{v}_{better} = stablehlo.compare {dir}, {v}_a, {v}_b, {ct} : ({s}, {s}) -> {pred}"
    )];
    if vd.is_float() {
        body.extend([
            format!("{v}_anan = stablehlo.compare NE, {v}_a, {v}_a, FLOAT : ({s}, {s}) -> {pred}"),
            format!("{v}_bnan = stablehlo.compare NE, {v}_b, {v}_b, FLOAT : ({s}, {s}) -> {pred}"),
            format!("{v}_bnum = stablehlo.not {v}_bnan : {pred}"),
            format!("{v}_nanwin = stablehlo.and {v}_anan, {v}_bnum : {pred}"),
            format!("{v}_win = stablehlo.or {v}_better, {v}_nanwin : {pred}"),
            format!("{v}_eq0 = stablehlo.compare EQ, {v}_a, {v}_b, FLOAT : ({s}, {s}) -> {pred}"),
            format!("{v}_bothnan = stablehlo.and {v}_anan, {v}_bnan : {pred}"),
            format!("{v}_eq = stablehlo.or {v}_eq0, {v}_bothnan : {pred}"),
        ]);
    } else {
        body.push(format!(
            "{v}_eq = stablehlo.compare EQ, {v}_a, {v}_b, {ct} : ({s}, {s}) -> {pred}"
        ));
    }
    let ict = CompareOp::compare_type(idx);
    body.extend([
        format!("{v}_first = stablehlo.compare LT, {v}_ia, {v}_ib, {ict} : ({si}, {si}) -> {pred}"),
        format!("{v}_tie = stablehlo.and {v}_eq, {v}_first : {pred}"),
        format!("{v}_take = stablehlo.or {v}_win, {v}_tie : {pred}"),
        format!(
            "{v}_val = \"stablehlo.select\"({v}_take, {v}_a, {v}_b) : ({pred}, {s}, {s}) -> {s}"
        ),
        format!(
            "{v}_idx = \"stablehlo.select\"({v}_take, {v}_ia, {v}_ib) : \
             ({pred}, {si}, {si}) -> {si}"
        ),
        format!("stablehlo.return {v}_val, {v}_idx : {s}, {si}"),
    ]);
    let body: Vec<String> = body.into_iter().map(|l| format!("      {l}\n")).collect();
    e.line(&format!(
        "{v}_r:2 = \"stablehlo.reduce\"({x}, {v}_iota, {v}_initv, {v}_initi) ({{\n    \
         ^bb0({v}_a: {s}, {v}_ia: {si}, {v}_b: {s}, {v}_ib: {si}):\n{}    }}) \
         {{dimensions = array<i64: {dim}>}} : ({}, {iota_ty}, {s}, {si}) -> ({out_v}, {out_i})",
        body.concat(),
        tensor(xt)
    ));
    format!("{v}_r#1")
}
