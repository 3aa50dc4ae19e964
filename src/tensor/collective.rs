//! Collectives across the replicas of an SPMD program (data-parallel gradient averaging), as
//! `torch.distributed`'s `all_reduce`, `all_gather_into_tensor` and `reduce_scatter_tensor`.
//! `replica_groups` lists the replicas that combine with each other; on one device every group
//! is `[[0]]` and each collective is the identity.

use neuron_pc_compiler::ir::{Op, ReduceOp};

use std::panic::Location;

use super::shape::dim_index;
use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// Sum (or `op`) of this tensor over the replicas of each group; every replica gets it.
    #[track_caller]
    pub fn all_reduce(&self, op: ReduceOp, replica_groups: &[Vec<usize>]) -> Result<Tensor> {
        Tensor::apply(
            Op::AllReduce {
                op,
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
        )
    }

    /// The group's tensors concatenated along `dim`, on every replica of the group.
    #[track_caller]
    pub fn all_gather(&self, dim: isize, replica_groups: &[Vec<usize>]) -> Result<Tensor> {
        let location = Location::caller();
        let dim = dim_index("all_gather", dim, self.dims(), location)?;
        Tensor::apply_at(
            Op::AllGather {
                dim,
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
            location,
        )
    }

    /// Reduces over each group, then replica `k` of the group keeps the `k`-th block along
    /// `dim`.
    #[track_caller]
    pub fn reduce_scatter(
        &self,
        op: ReduceOp,
        dim: isize,
        replica_groups: &[Vec<usize>],
    ) -> Result<Tensor> {
        let location = Location::caller();
        let dim = dim_index("reduce_scatter", dim, self.dims(), location)?;
        Tensor::apply_at(
            Op::ReduceScatter {
                op,
                dim,
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
            location,
        )
    }
}
