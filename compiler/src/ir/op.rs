//! The primitive ops (their fieldless families, `UnaryOp` and the rest, are in `families.rs`),
//! and the types that hold them: a [`Node`], a [`Graph`] of nodes (its methods are in `graph.rs`),
//! a loop's [`ScanBody`] and a call's [`CallBody`] (its methods are in `call.rs`). They are one
//! module because they are one recursive type: a loop or a call is an op whose body is a graph
//! of ops.

use std::fmt;
use std::sync::Arc;

use super::families::{BinaryOp, CompareOp, ReduceOp, UnaryOp};
use super::types::{Literal, TensorType};
use crate::dtype::DType;

/// One primitive of the graph IR. Each maps onto StableHLO (a few onto a short fixed sequence
/// of StableHLO ops). Shapes are static; broadcasting is explicit ([`Op::BroadcastInDim`]).
///
/// Operand conventions are documented per variant; [`super::infer`] checks them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Graph input number `index`; its type is the node's type (see `Graph::parameter`).
    /// Lowers to no op: the value is `@main`'s argument `%arg<index>`.
    Parameter {
        /// The input's position among the graph's parameters, from 0.
        index: usize,
    },
    /// A constant (no operands). Lowers to `stablehlo.constant` with a `dense<..>` literal.
    Constant(Literal),
    /// Elementwise `f(x)`. Lowers to the op's [`UnaryOp::stablehlo_name`] (`chlo.erf` for erf).
    Unary(UnaryOp),
    /// Elementwise `f(x, y)`; operands of equal type. Lowers to [`BinaryOp::stablehlo_name`];
    /// float max/min add NaN checks (`stablehlo.compare` and `stablehlo.select`).
    Binary(BinaryOp),
    /// Elementwise comparison of two operands of equal type, giving pred. Lowers to
    /// `stablehlo.compare` with [`CompareOp::direction`] and [`CompareOp::compare_type`].
    Compare(CompareOp),
    /// `select(pred, on_true, on_false)`; pred is a scalar or has the operands' shape.
    /// Lowers to `stablehlo.select`.
    Select,
    /// Elementwise cast to another dtype (floats to integers round toward zero). Lowers to
    /// `stablehlo.convert`.
    Convert(DType),
    /// `dims`-shaped tensor counting 0, 1, ... along `dim` (no operands). Lowers to
    /// `stablehlo.iota`.
    Iota {
        /// The result's shape.
        dims: Vec<usize>,
        /// The dimension along which the values count up (`iota_dimension`).
        dim: usize,
        /// The result's dtype, a float or integer one.
        dtype: DType,
    },
    /// Operand dimension `i` becomes result dimension `broadcast_dimensions[i]` (size 1 or
    /// equal); result has `dims`. Lowers to `stablehlo.broadcast_in_dim`.
    BroadcastInDim {
        /// The result's shape.
        dims: Vec<usize>,
        /// For each operand dimension, the distinct result dimension it maps to.
        broadcast_dimensions: Vec<usize>,
    },
    /// Same elements, row-major, new `dims`. Lowers to `stablehlo.reshape`.
    Reshape {
        /// The result's shape, with the operand's element count.
        dims: Vec<usize>,
    },
    /// Result dimension `i` is operand dimension `perm[i]`. Lowers to `stablehlo.transpose`.
    Transpose {
        /// A permutation of `0..rank` (`permutation` in StableHLO; PyTorch's `permute`).
        perm: Vec<usize>,
    },
    /// Static strided slice, `start <= limit <= dim`, `stride >= 1`. Lowers to
    /// `stablehlo.slice`.
    Slice {
        /// The first index taken, per dimension.
        start: Vec<usize>,
        /// One past the last index that may be taken, per dimension (exclusive).
        limit: Vec<usize>,
        /// The step between taken indices, per dimension (at least 1).
        stride: Vec<usize>,
    },
    /// Operands: the tensor, then one scalar integer start index per dimension (clamped so the
    /// window stays inside). Result has `sizes`. Lowers to `stablehlo.dynamic_slice`.
    DynamicSlice {
        /// The window's size per dimension (`slice_sizes`), each at most the operand's.
        sizes: Vec<usize>,
    },
    /// Operands: the tensor, the update, then one scalar integer start index per dimension
    /// (clamped). Result has the tensor's type. Lowers to `stablehlo.dynamic_update_slice`.
    DynamicUpdateSlice,
    /// Joins operands of equal dtype and rank along `dim`. Lowers to `stablehlo.concatenate`.
    Concatenate {
        /// The dimension the operands are joined along (PyTorch's `torch.cat` `dim`).
        dim: usize,
    },
    /// Operands: the tensor and a scalar pad value of its dtype. Negative `low`/`high` crop.
    /// Lowers to `stablehlo.pad`.
    Pad {
        /// Entries added before the first element, per dimension (`edge_padding_low`).
        low: Vec<i64>,
        /// Entries added after the last element, per dimension (`edge_padding_high`).
        high: Vec<i64>,
        /// Entries added between each two elements, per dimension (`interior_padding`).
        interior: Vec<usize>,
    },
    /// Reduces over `dims` (removed from the shape). Lowers to `stablehlo.reduce` from the
    /// reduction's identity; float max/min propagate NaN (except in a partitioned program).
    Reduce(ReduceOp, Vec<usize>),
    /// Index of the largest element along `dim` (removed); ties and NaN: see [`Op::ArgMin`].
    /// NaN counts as larger than any number; among equal values the first index wins.
    /// Lowers to a two-operand `stablehlo.reduce` over (value, `stablehlo.iota` index) pairs.
    ArgMax {
        /// The dimension searched (removed from the result).
        dim: usize,
        /// The integer dtype of the result, wide enough to index `dim`.
        index_dtype: DType,
    },
    /// Index of the smallest element along `dim` (removed). NaN counts as smaller than any
    /// number; among equal values the first index wins. Lowers as [`Op::ArgMax`] does.
    ArgMin {
        /// The dimension searched (removed from the result).
        dim: usize,
        /// The integer dtype of the result, wide enough to index `dim`.
        index_dtype: DType,
    },
    /// The positions that sort the operand along `dim` (PyTorch's `argsort(stable=True)`):
    /// result element `j` of a row is the operand index of the row's `j`-th smallest (or
    /// largest) element; equal elements keep their order. Floats are ordered totally:
    /// `-NaN < -inf < ... < -0 < +0 < ... < inf < NaN`, as `f64::total_cmp`. Lowers to a stable
    /// two-operand `stablehlo.sort` of (value, `stablehlo.iota` index) pairs whose comparator
    /// reads the values (`TOTALORDER` for floats), keeping the indices.
    ArgSort {
        /// The dimension sorted along (kept in the result).
        dim: usize,
        /// Largest first (PyTorch's `descending=True`); otherwise smallest first.
        descending: bool,
        /// The integer dtype of the result, wide enough to index `dim`.
        index_dtype: DType,
    },
    /// The positions of the `k` largest elements along the last dimension (replaced by `k`),
    /// largest first, the lower position first among equals, as i32: `jax.lax.top_k`'s
    /// indices. Ordered as [`Op::ArgSort`] orders (NaN largest). Lowers to `chlo.top_k`, which
    /// XLA runs as a partial sort (far cheaper than a whole sort on cpu), keeping the indices.
    TopK {
        /// How many positions per row, at most the last dimension.
        k: usize,
    },
    /// StableHLO `dot_general`: result dims are batch dims, then lhs free dims, then rhs free
    /// dims (each in operand order).
    DotGeneral {
        /// The lhs's batch dimensions (`lhs_batching_dimensions`).
        lhs_batch: Vec<usize>,
        /// The rhs's batch dimensions, paired with `lhs_batch` in order.
        rhs_batch: Vec<usize>,
        /// The lhs dimensions summed over (`lhs_contracting_dimensions`).
        lhs_contract: Vec<usize>,
        /// The rhs dimensions summed over, paired with `lhs_contract` in order.
        rhs_contract: Vec<usize>,
    },
    /// StableHLO `convolution` in PyTorch's layouts: operands `lhs [n, c_in, spatial..]` and
    /// `rhs [c_out, c_in / groups, kernel..]` of one dtype; result `[n, c_out, out..]`. Per
    /// spatial dimension: the window `stride`, zero `padding` on both sides, and the kernel's
    /// `dilation`; `groups` splits the channels (PyTorch's `groups`).
    Convolution {
        /// The window step per spatial dimension (`window_strides`), at least 1.
        stride: Vec<usize>,
        /// Zeros added on both sides per spatial dimension.
        padding: Vec<usize>,
        /// The kernel's dilation per spatial dimension (`rhs_dilation`), at least 1.
        dilation: Vec<usize>,
        /// The number of channel groups (`feature_group_count`); 1 is a plain convolution.
        groups: usize,
    },
    /// StableHLO `reduce_window`: reduces each `window` (one size per operand dimension) placed
    /// every `stride` over the operand padded by `padding` on both sides with the reduction's
    /// identity (`-inf` for max, 0 for sum); result dimension `(d + 2 p - w) / s + 1`. Floats.
    ReduceWindow {
        /// The reduction applied to each window (max for max pooling, sum for sum pooling).
        op: ReduceOp,
        /// The window's size per operand dimension (`window_dimensions`).
        window: Vec<usize>,
        /// The window step per operand dimension (`window_strides`), at least 1.
        stride: Vec<usize>,
        /// Identity entries added on both sides per operand dimension.
        padding: Vec<usize>,
    },
    /// Row lookup: operands `table [n, rest..]` and integer `indices` of any shape; result
    /// `indices.dims ++ rest`. Indices are clamped into `0..n` (StableHLO gather semantics).
    /// Lowers to `stablehlo.gather` of `[1, rest..]` slices, dimension 0 collapsed.
    Gather,
    /// The gradient of [`Op::Gather`]: operands `table [n, rest..]`, integer `indices`,
    /// `updates [indices.dims ++ rest]`; adds each update row into the table row it names
    /// (repeats sum). Out-of-range rows are skipped. Result has the table's type. Lowers to
    /// `stablehlo.scatter` with an add region.
    ScatterAdd,
    /// Operand: a `u32[2]` key. Result `u32[dims]`: element `i` (row-major) is the first word
    /// of threefry-2x32 (20 rounds) of the counter `(0, i)` under that key. Lowers to the
    /// rounds written out in StableHLO integer ops (add, xor, shifts).
    RandomBits {
        /// The result's shape.
        dims: Vec<usize>,
    },
    /// The operand's value unchanged; differentiation treats it as a constant (PyTorch's
    /// `detach`, JAX's `stop_gradient`). Lowers to no StableHLO op.
    StopGradient,
    /// Operand 0's value, computed no earlier than every other operand: an ordering edge and
    /// nothing else (StableHLO's `optimization_barrier` over all operands, of which the first
    /// is used). An optimizer reads a parameter through it, after every gradient, so that XLA
    /// updates the donated buffer in place instead of first copying the parameter: a backward
    /// product that reads a weight (`dx = dy . w`) is no ancestor of that weight's update, so
    /// nothing else orders the two. Differentiation passes through operand 0 only.
    After,
    /// The operand's value, laid out over the devices as `sharding` says (an `mhlo.sharding`
    /// text, `crate::sharding::Sharding::hlo`) in a partitioned program: JAX's
    /// `with_sharding_constraint`, PyTorch/XLA's `mark_sharding` on an activation. Lowers to
    /// the `@Sharding` custom call XLA's partitioner reads; differentiation constrains the
    /// cotangent the same way.
    ShardingConstraint {
        /// The `mhlo.sharding` attribute text, e.g. `{replicated}` or `{devices=[2,1]0,1}`.
        sharding: String,
    },
    /// Reduces the operand across the replicas of each group (result has its type). Lowers to
    /// `stablehlo.all_reduce` with the bare combiner as its region.
    AllReduce {
        /// The reduction combining the replicas' values.
        op: ReduceOp,
        /// Groups of replica ids, all of one size, that reduce together.
        replica_groups: Vec<Vec<usize>>,
    },
    /// Concatenates the operands of each group's replicas along `dim`. Lowers to
    /// `stablehlo.all_gather`.
    AllGather {
        /// The dimension the replicas' values are joined along (grows by the group size).
        dim: usize,
        /// Groups of replica ids, all of one size, that gather together.
        replica_groups: Vec<Vec<usize>>,
    },
    /// Reduces across each group and leaves replica `k` of a group the `k`-th block along `dim`.
    /// Lowers to `stablehlo.reduce_scatter` with the bare combiner as its region.
    ReduceScatter {
        /// The reduction combining the replicas' values.
        op: ReduceOp,
        /// The dimension split into blocks (its size must divide by the group size).
        dim: usize,
        /// Groups of replica ids, all of one size, that reduce together.
        replica_groups: Vec<Vec<usize>>,
    },
    /// No operands. Result `u32[]`: the index of the replica running the program (0 on one
    /// device). Lowers to `stablehlo.replica_id`.
    ReplicaId,
    /// A collective between processes of the operand: each device's value with that of the
    /// same device (replica or partition) of each of the run's `processes` processes. Made only
    /// by [`crate::passes::cross_process`], for a target whose runtime keeps collectives inside
    /// a process (cpu); lowers to a custom call to a handler of neuron-pc's own, which calls
    /// the collective library (gloo) for the device the call runs on. A second operand, if
    /// any, is only waited for: the previous collective's result, so that every process runs
    /// its calls in the same order (an edge that no compiler pass removes).
    ProcessCollective {
        /// What the processes' values make.
        collective: ProcessCollective,
        /// Processes in the run.
        processes: usize,
        /// This call's number in its program (`0..`), distinct for calls that may overlap.
        tag: u32,
        /// In a partitioned program, the operand's layout (an `mhlo.sharding` text): the call
        /// runs on each device's block, in a manual region of that layout.
        manual: Option<String>,
        /// A sum in which only each process's first device takes part, the others giving zeros
        /// (an all-reduce inside the process then spreads the result): one exchange between
        /// processes per process instead of one per local device.
        leader: bool,
    },
    /// Several all-reduces between processes in a partitioned program as one exchange (as
    /// DDP's buckets are): operands are the values, result `output` is the reduction of operand
    /// `output`. Each device's blocks of all of them (each in a manual region of its layout,
    /// `layouts[k]`) are flattened and joined, reduced by one call, and split again. Made only
    /// by [`crate::passes::cross_process`]; every result of one bucket lowers from one region.
    ProcessBucket {
        /// The combining op.
        op: ReduceOp,
        /// Processes in the run.
        processes: usize,
        /// The call's number in its program (see [`Op::ProcessCollective`]).
        tag: u32,
        /// Each operand's layout (an `mhlo.sharding` text).
        layouts: Vec<String>,
        /// Which operand's reduction this node is.
        output: usize,
    },
    /// No operands. Result `u32[]`: this process's index in a multi-process run. Made only by
    /// [`crate::passes::cross_process`] (a global replica index is `index * local + local
    /// replica`); lowers to a custom call, so every process compiles the same program.
    ProcessIndex,
    /// One result of a loop running `body` `length` times (see [`ScanBody`]): operands are
    /// the initial carries, the scanned operands (`[length, ..]`) and the invariants. With
    /// `reverse`, iteration `t` reads `xs[length - 1 - t]`. Lowers to one `stablehlo.while`
    /// for all the results of the same scan.
    Scan {
        /// The graph each iteration runs, and how its parameters split.
        body: Arc<ScanBody>,
        /// The number of iterations (the scanned operands' leading dimension).
        length: usize,
        /// Whether the loop runs from the last slice to the first.
        reverse: bool,
        /// Which of the loop's results this node is.
        output: ScanOutput,
    },
    /// Result `output` of `body` applied to the operands (see [`CallBody`]): a computation
    /// recorded once and applied many times, so a trace records one node per result instead
    /// of the body's ops. A graph is compiled with its calls expanded
    /// ([`super::CallExpander`], [`super::expand_calls`]): the program is the one the
    /// body's ops would have made.
    Call {
        /// The computation, its parameters the operands.
        body: Arc<CallBody>,
        /// Which of the body's outputs this node is.
        output: usize,
    },
}

/// What a [`Op::ProcessCollective`] computes from the processes' values (the same results as
/// [`Op::AllReduce`], [`Op::AllGather`] and [`Op::ReduceScatter`] over one group of every
/// process, in process order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcessCollective {
    /// Combined elementwise; the operand's type.
    AllReduce(ReduceOp),
    /// Joined along `dim`, which grows by the process count.
    AllGather {
        /// The joined dimension.
        dim: usize,
    },
    /// Combined, and process `p` keeps block `p` along `dim`.
    ReduceScatter {
        /// The combining op.
        op: ReduceOp,
        /// The split dimension.
        dim: usize,
    },
    /// No exchange: the operand, in place, once the second operand (the previous collective's
    /// result) is computed. It orders an XLA collective inside the process after the call
    /// between processes before it, in every process alike, where an optimization barrier
    /// would not hold: newer XLA cpu pipelines drop barriers before they schedule. The op's
    /// other fields mean nothing for it (tag 0, no layout, not a leader's).
    Ordered,
}

impl ProcessCollective {
    /// The name in messages and of the custom call's target (`neuron_pc.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            ProcessCollective::AllReduce(_) => "process_all_reduce",
            ProcessCollective::AllGather { .. } => "process_all_gather",
            ProcessCollective::ReduceScatter { .. } => "process_reduce_scatter",
            ProcessCollective::Ordered => "process_ordered",
        }
    }
}

impl Op {
    /// A short lowercase name for messages (`add`, `dot_general`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant(_) => "constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Convert(_) => "convert",
            Op::Iota { .. } => "iota",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::Concatenate { .. } => "concatenate",
            Op::Pad { .. } => "pad",
            Op::Reduce(r, _) => r.name(),
            Op::ArgMax { .. } => "argmax",
            Op::ArgMin { .. } => "argmin",
            Op::ArgSort { .. } => "argsort",
            Op::TopK { .. } => "top_k",
            Op::DotGeneral { .. } => "dot_general",
            Op::Convolution { .. } => "convolution",
            Op::ReduceWindow { .. } => "reduce_window",
            Op::Gather => "gather",
            Op::ScatterAdd => "scatter_add",
            Op::RandomBits { .. } => "random_bits",
            Op::StopGradient => "stop_gradient",
            Op::After => "after",
            Op::ShardingConstraint { .. } => "sharding_constraint",
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::ReplicaId => "replica_id",
            Op::ProcessCollective { collective, .. } => collective.name(),
            Op::ProcessBucket { .. } => "process_all_reduce_bucket",
            Op::ProcessIndex => "process_index",
            Op::Scan { .. } => "scan",
            Op::Call { .. } => "call",
        }
    }
}

/// The name and the attributes, e.g. `reshape{dims=[2, 3]}` or `constant(f32[] 1.5)`.
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.name();
        match self {
            Op::Parameter { index } => write!(f, "{n}{{index={index}}}"),
            Op::Constant(lit) => write!(f, "{n}({lit})"),
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select => f.write_str(n),
            Op::DynamicUpdateSlice
            | Op::Gather
            | Op::ScatterAdd
            | Op::StopGradient
            | Op::After
            | Op::ReplicaId
            | Op::ProcessIndex => f.write_str(n),
            Op::ProcessCollective {
                collective,
                processes,
                tag,
                manual,
                leader,
            } => {
                match collective {
                    ProcessCollective::AllReduce(op) => write!(f, "{n}{{op={}", op.name())?,
                    ProcessCollective::AllGather { dim } => write!(f, "{n}{{dim={dim}")?,
                    ProcessCollective::ReduceScatter { op, dim } => {
                        write!(f, "{n}{{op={}, dim={dim}", op.name())?
                    }
                    ProcessCollective::Ordered => write!(f, "{n}{{")?,
                }
                if *collective != ProcessCollective::Ordered {
                    f.write_str(", ")?;
                }
                write!(f, "processes={processes}, tag={tag}")?;
                if *leader {
                    f.write_str(", leader")?;
                }
                match manual {
                    Some(s) => write!(f, ", manual={s}}}"),
                    None => f.write_str("}"),
                }
            }
            Op::ProcessBucket {
                op,
                processes,
                tag,
                layouts,
                output,
            } => write!(
                f,
                "{n}{{op={}, processes={processes}, tag={tag}, output={output}, layouts=[{}]}}",
                op.name(),
                layouts.join(", ")
            ),
            Op::Convert(d) => write!(f, "{n}{{{d}}}"),
            Op::ShardingConstraint { sharding } => write!(f, "{n}{{{sharding}}}"),
            Op::Iota { dims, dim, dtype } => {
                write!(f, "{n}{{dims={dims:?}, dim={dim}, dtype={dtype}}}")
            }
            Op::BroadcastInDim {
                dims,
                broadcast_dimensions,
            } => {
                write!(
                    f,
                    "{n}{{dims={dims:?}, broadcast_dimensions={broadcast_dimensions:?}}}"
                )
            }
            Op::Reshape { dims } => write!(f, "{n}{{dims={dims:?}}}"),
            Op::Transpose { perm } => write!(f, "{n}{{perm={perm:?}}}"),
            Op::Slice {
                start,
                limit,
                stride,
            } => {
                write!(
                    f,
                    "{n}{{start={start:?}, limit={limit:?}, stride={stride:?}}}"
                )
            }
            Op::DynamicSlice { sizes } => write!(f, "{n}{{sizes={sizes:?}}}"),
            Op::Concatenate { dim } => write!(f, "{n}{{dim={dim}}}"),
            Op::Pad {
                low,
                high,
                interior,
            } => {
                write!(
                    f,
                    "{n}{{low={low:?}, high={high:?}, interior={interior:?}}}"
                )
            }
            Op::Reduce(_, dims) => write!(f, "{n}{{dims={dims:?}}}"),
            Op::ArgMax { dim, index_dtype } | Op::ArgMin { dim, index_dtype } => {
                write!(f, "{n}{{dim={dim}, index_dtype={index_dtype}}}")
            }
            Op::TopK { k } => write!(f, "{n}{{k={k}}}"),
            Op::ArgSort {
                dim,
                descending,
                index_dtype,
            } => write!(
                f,
                "{n}{{dim={dim}, descending={descending}, index_dtype={index_dtype}}}"
            ),
            Op::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            } => write!(
                f,
                "{n}{{batch={lhs_batch:?}x{rhs_batch:?}, \
                 contract={lhs_contract:?}x{rhs_contract:?}}}"
            ),
            Op::Convolution {
                stride,
                padding,
                dilation,
                groups,
            } => write!(
                f,
                "{n}{{stride={stride:?}, padding={padding:?}, dilation={dilation:?}, \
                 groups={groups}}}"
            ),
            Op::ReduceWindow {
                op,
                window,
                stride,
                padding,
            } => write!(
                f,
                "{n}{{op={}, window={window:?}, stride={stride:?}, padding={padding:?}}}",
                op.name()
            ),
            Op::RandomBits { dims } => write!(f, "{n}{{dims={dims:?}}}"),
            Op::Scan {
                body,
                length,
                reverse,
                output,
            } => write!(
                f,
                "{n}{{length={length}{}, carries={}, xs={}, body={} nodes, output={output}}}",
                if *reverse { ", reverse" } else { "" },
                body.carries,
                body.xs,
                body.graph.len()
            ),
            Op::Call { body, output } => write!(
                f,
                "{n}{{body={} nodes, output={output}}}",
                body.graph().len()
            ),
            Op::AllReduce { op, replica_groups } => {
                write!(
                    f,
                    "{n}{{op={}, replica_groups={replica_groups:?}}}",
                    op.name()
                )
            }
            Op::AllGather {
                dim,
                replica_groups,
            } => {
                write!(f, "{n}{{dim={dim}, replica_groups={replica_groups:?}}}")
            }
            Op::ReduceScatter {
                op,
                dim,
                replica_groups,
            } => {
                write!(
                    f,
                    "{n}{{op={}, dim={dim}, replica_groups={replica_groups:?}}}",
                    op.name()
                )
            }
        }
    }
}

/// A node's position in its graph's arena. Operands always precede their users.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl NodeId {
    /// The position in the arena.
    pub fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One op applied to earlier nodes, with its inferred result type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Its operands, all earlier nodes.
    pub operands: Vec<NodeId>,
    /// Its result type, as inference gives it.
    pub ty: TensorType,
}

/// A computation with static shapes: parameters (numbered `0..n` in creation order), ops in
/// topological order, and an ordered list of outputs.
///
/// Built with [`Graph::parameter`] and [`Graph::push`], which check types as they go, so a
/// built graph is valid by construction; graphs assembled from raw nodes go through
/// [`Graph::from_nodes`], which runs [`Graph::validate`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Graph {
    pub(super) nodes: Vec<Node>,
    pub(super) params: Vec<NodeId>,
    pub(super) outputs: Vec<NodeId>,
}

/// The graph a scan runs each iteration, and how its parameters split into carries, scanned
/// slices and invariants (the rest).
///
/// The loop: [`Op::Scan`] runs one body graph a static number of times over stacked operands
/// (JAX's `lax.scan`, PyTorch/XLA's `scan`), lowered to one `stablehlo.while`.
///
/// Operands are the initial carries, then the scanned operands (`xs`, each `[length, ..]`),
/// then loop invariants. The body's parameters follow the same order: each carry, each
/// scanned operand's slice for the iteration (`xs[i]`, the leading dimension dropped), each
/// invariant. Its outputs are the next carries, of the carries' types.
///
/// A scan has several results, and a node of the IR has one type; so each result is a node
/// of its own, `Op::Scan { output, .. }` over the same body and operands, and the lowering
/// emits one loop for all the results of the same scan that a program reads. A result is a
/// final carry, or any body node's value at every iteration stacked along a new leading
/// dimension: the per-iteration outputs a user asks for and the residuals differentiation
/// saves are both stacked nodes, read from the loop that computes the carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScanBody {
    /// The graph one iteration runs: its parameters are the carries, the slices and the
    /// invariants, its outputs the next carries.
    pub graph: Graph,
    /// The first `carries` parameters are carried; the body's outputs are their next values.
    pub carries: usize,
    /// The next `xs` parameters are the slices of the scanned operands.
    pub xs: usize,
    /// What differentiation keeps of each iteration for the backward loop. The loop computes
    /// the same values whatever this says.
    pub saved: Saved,
}

/// The graph an [`Op::Call`] applies: its parameters are the call's operands, its outputs the
/// call's results. Compared by content; hashed by a fingerprint taken once, so a recorder
/// looking a call up does not walk the body.
#[derive(Clone, Debug)]
pub struct CallBody {
    pub(super) graph: Graph,
    pub(super) fingerprint: u64,
}

/// What the backward pass of a scan reads from the forward loop, per iteration; the rest it
/// recomputes from those (JAX's checkpoint policies inside `lax.scan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Saved {
    /// Every intermediate value the gradient rules read, but for cheap ones (elementwise
    /// arithmetic, layout changes) and one-operand functions of a value kept anyway (a
    /// sigmoid of a kept product) that the backward loop recomputes from their operands.
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
