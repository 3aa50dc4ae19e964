//! What the passes, the lazy device and autodiff need to know of each primitive, decided
//! here once per op by matches that list every variant. A new primitive is a compile error in
//! each of them until it is decided, never a silent default somewhere else. (The module is
//! checked by `clippy::wildcard_enum_match_arm`, as is the whole compiler crate.)

use super::families::BinaryOp;
use super::op::Op;

/// How an op's result relates to the replicas of a data-parallel program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaRule<'a> {
    /// Computed from its operands on each replica alone (a collective between processes
    /// included: its partners are other processes, each replica's own).
    Local,
    /// Operand 0's value (an ordering edge): differs between replicas where operand 0 does.
    FirstOperand,
    /// Differs between replicas by construction (the replica's or the process's index).
    Distinct,
    /// Combines the replicas of each of `groups`; with `agree`, every member of a group gets
    /// the same value (all-reduce, all-gather), without it each its own part (reduce-scatter).
    Groups {
        /// The replica groups, as the op's `replica_groups`.
        groups: &'a [Vec<usize>],
        /// Whether the members of one group receive the same value.
        agree: bool,
    },
}

impl Op {
    /// Whether the op's value is fixed by its operands on one replica (constant folding may
    /// evaluate it ahead of time): not parameters, constants and iotas (nothing to fold) nor
    /// collectives (their value depends on the other replicas).
    pub fn is_foldable(&self) -> bool {
        match self {
            Op::Parameter { .. } | Op::Constant(_) | Op::Iota { .. } => false,
            Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } => false,
            Op::ReplicaId | Op::ProcessCollective { .. } | Op::ProcessIndex => false,
            Op::ProcessBucket { .. } => false,
            // a whole loop is no constant to fold ahead of time
            Op::Scan { .. } | Op::Call { .. } => false,
            // a layout the user asked for, kept where it was put
            Op::ShardingConstraint { .. } => false,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce(..)
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::ArgSort { .. }
            | Op::TopK { .. }
            | Op::DotGeneral { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::StopGradient
            | Op::After
            | Op::Convolution { .. }
            | Op::ReduceWindow { .. }
            | Op::RandomBits { .. } => true,
        }
    }

    /// How the result relates to the replicas (see [`ReplicaRule`]).
    pub fn replicas(&self) -> ReplicaRule<'_> {
        match self {
            Op::ReplicaId | Op::ProcessIndex => ReplicaRule::Distinct,
            Op::After => ReplicaRule::FirstOperand,
            Op::AllReduce { replica_groups, .. } | Op::AllGather { replica_groups, .. } => {
                ReplicaRule::Groups {
                    groups: replica_groups,
                    agree: true,
                }
            }
            Op::ReduceScatter { replica_groups, .. } => ReplicaRule::Groups {
                groups: replica_groups,
                agree: false,
            },
            Op::ProcessCollective { .. } | Op::ProcessBucket { .. } => ReplicaRule::Local,
            Op::Parameter { .. }
            | Op::Constant(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Iota { .. }
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce(..)
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::ArgSort { .. }
            | Op::TopK { .. }
            | Op::DotGeneral { .. }
            | Op::Convolution { .. }
            | Op::ReduceWindow { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::RandomBits { .. }
            | Op::StopGradient
            | Op::ShardingConstraint { .. }
            | Op::Scan { .. }
            // a body holds no replica-dependent op (`CallBody::new`)
            | Op::Call { .. } => ReplicaRule::Local,
        }
    }

    /// Whether `--auto-cast all` may run the op in bf16/fp16 (an elementwise float op whose
    /// family says so; everything else keeps its dtype).
    pub fn half_precision_safe(&self) -> bool {
        match self {
            Op::Unary(u) => u.half_precision_safe(),
            Op::Binary(b) => b.half_precision_safe(),
            Op::Parameter { .. }
            | Op::Constant(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Iota { .. }
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce(..)
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::ArgSort { .. }
            | Op::TopK { .. }
            | Op::DotGeneral { .. }
            | Op::Convolution { .. }
            | Op::ReduceWindow { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::RandomBits { .. }
            | Op::StopGradient
            | Op::After
            | Op::ShardingConstraint { .. }
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::ReplicaId
            | Op::ProcessCollective { .. }
            | Op::ProcessBucket { .. }
            | Op::ProcessIndex
            | Op::Scan { .. }
            | Op::Call { .. } => false,
        }
    }

    /// Whether recomputing the op from its operands costs less than keeping its result for a
    /// backward pass: memory-bound work that XLA fuses into its readers (cheap elementwise
    /// arithmetic, layout changes, constants), not transcendental functions, contractions,
    /// reductions, data-dependent indexing or anything between replicas.
    pub fn recomputes_cheaply(&self) -> bool {
        match self {
            Op::Unary(u) => u.cheap(),
            Op::Binary(b) => !matches!(b, BinaryOp::Pow),
            Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::StopGradient
            | Op::ShardingConstraint { .. } => true,
            Op::Parameter { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Reduce(..)
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::ArgSort { .. }
            | Op::TopK { .. }
            | Op::DotGeneral { .. }
            | Op::Convolution { .. }
            | Op::ReduceWindow { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::RandomBits { .. }
            | Op::After
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::ReplicaId
            | Op::ProcessCollective { .. }
            | Op::ProcessBucket { .. }
            | Op::ProcessIndex
            | Op::Scan { .. }
            | Op::Call { .. } => false,
        }
    }

    /// For an op whose work grows with a contraction (a product's summed dimensions), the
    /// operand-0 dimensions it sums over; `None` for ops whose work is about the size of their
    /// operands and result. Constant folding weighs an op's cost by it.
    pub fn contracted_dims(&self) -> Option<&[usize]> {
        match self {
            Op::DotGeneral { lhs_contract, .. } => Some(lhs_contract),
            // folded as rarely as it is met in constants: its size alone is weighed
            Op::Convolution { .. } => None,
            Op::Parameter { .. }
            | Op::Reduce(..)
            | Op::Constant(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Iota { .. }
            | Op::BroadcastInDim { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::ArgSort { .. }
            | Op::TopK { .. }
            | Op::ReduceWindow { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::RandomBits { .. }
            | Op::StopGradient
            | Op::After
            | Op::ShardingConstraint { .. }
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::ReplicaId
            | Op::ProcessCollective { .. }
            | Op::ProcessBucket { .. }
            | Op::ProcessIndex
            | Op::Scan { .. }
            | Op::Call { .. } => None,
        }
    }
}
