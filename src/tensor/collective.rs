//! Collectives across the replicas of a data-parallel device, as `torch.distributed`'s
//! `all_reduce`, `all_gather_into_tensor` and `reduce_scatter_tensor`: recorded into the step
//! graph like any op, run by the accelerator runtime's collectives.
//!
//! The plain methods combine every replica; the `_in` variants take `replica_groups`, a
//! partition of the replicas into equal groups that combine among themselves (`[[0, 1], [2,
//! 3]]`). On one device every collective is the identity.
//!
//! Gradients: the loss of an SPMD program is the sum over replicas of each replica's loss, so
//! `grad` on replica `k` is the derivative of that sum by replica `k`'s values. A sum
//! all-reduce's gradient is the sum all-reduce of the incoming gradients, an all-gather's is a
//! sum reduce-scatter and a sum reduce-scatter's is an all-gather; max and min send the summed
//! gradient to the replicas holding the extreme (ties share it equally). With per-replica
//! losses (each a mean over its shard), each replica's gradient is its local gradient, and
//! [`crate::optim::average_gradients`] turns them into the gradient of the global batch.

use std::panic::Location;

use neuron_pc_compiler::ir::{Op, ReduceOp};

use super::shape::dim_index;
use super::Tensor;
use crate::error::{Error, Result};

/// How [`Tensor::all_reduce`] and [`Tensor::reduce_scatter`] combine the replicas' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The sum of the replicas' values.
    Sum,
    /// The sum divided by the group size (float tensors).
    Mean,
    /// The largest of the replicas' values, elementwise.
    Max,
    /// The smallest of the replicas' values, elementwise.
    Min,
}

impl Reduction {
    fn ir(self) -> ReduceOp {
        match self {
            Reduction::Sum | Reduction::Mean => ReduceOp::Sum,
            Reduction::Max => ReduceOp::Max,
            Reduction::Min => ReduceOp::Min,
        }
    }
}

impl Tensor {
    /// Combines this tensor over every replica; each replica gets the result (a replicated
    /// value).
    #[track_caller]
    pub fn all_reduce(&self, op: Reduction) -> Result<Tensor> {
        let location = Location::caller();
        let groups = self.all_replicas()?;
        self.all_reduce_at(op, &groups, location)
    }

    /// Combines this tensor over the replicas of each group.
    #[track_caller]
    pub fn all_reduce_in(&self, op: Reduction, replica_groups: &[Vec<usize>]) -> Result<Tensor> {
        self.all_reduce_at(op, replica_groups, Location::caller())
    }

    fn all_reduce_at(
        &self,
        op: Reduction,
        replica_groups: &[Vec<usize>],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let size = self.check_groups("all_reduce", op, replica_groups, location)?;
        let out = Tensor::apply_at(
            Op::AllReduce {
                op: op.ir(),
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
            location,
        )?;
        mean_of(out, op, size)
    }

    /// Every replica's tensor concatenated along `dim` (in replica order), on every replica.
    #[track_caller]
    pub fn all_gather(&self, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let groups = self.all_replicas()?;
        self.all_gather_at(dim, &groups, location)
    }

    /// The group's tensors concatenated along `dim` (in group order), on each replica of the
    /// group.
    #[track_caller]
    pub fn all_gather_in(&self, dim: isize, replica_groups: &[Vec<usize>]) -> Result<Tensor> {
        self.all_gather_at(dim, replica_groups, Location::caller())
    }

    fn all_gather_at(
        &self,
        dim: isize,
        replica_groups: &[Vec<usize>],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let dim = dim_index("all_gather", dim, self.dims(), location)?;
        self.check_groups("all_gather", Reduction::Sum, replica_groups, location)?;
        Tensor::apply_at(
            Op::AllGather {
                dim,
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
            location,
        )
    }

    /// Combines over every replica, then replica `k` keeps the `k`-th of `replicas` equal
    /// blocks along `dim` (a per-replica value).
    #[track_caller]
    pub fn reduce_scatter(&self, op: Reduction, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let groups = self.all_replicas()?;
        self.reduce_scatter_at(op, dim, &groups, location)
    }

    /// Combines over each group, then the group's `k`-th replica keeps the `k`-th block along
    /// `dim`.
    #[track_caller]
    pub fn reduce_scatter_in(
        &self,
        op: Reduction,
        dim: isize,
        replica_groups: &[Vec<usize>],
    ) -> Result<Tensor> {
        self.reduce_scatter_at(op, dim, replica_groups, Location::caller())
    }

    fn reduce_scatter_at(
        &self,
        op: Reduction,
        dim: isize,
        replica_groups: &[Vec<usize>],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let dim = dim_index("reduce_scatter", dim, self.dims(), location)?;
        let size = self.check_groups("reduce_scatter", op, replica_groups, location)?;
        let out = Tensor::apply_at(
            Op::ReduceScatter {
                op: op.ir(),
                dim,
                replica_groups: replica_groups.to_vec(),
            },
            &[self],
            location,
        )?;
        mean_of(out, op, size)
    }

    /// [`Tensor::all_reduce`] with a mean, reported at `location`.
    pub(crate) fn all_reduce_at_mean(
        &self,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let groups = self.all_replicas()?;
        self.all_reduce_at(Reduction::Mean, &groups, location)
    }

    /// One group of every replica of this tensor's device.
    fn all_replicas(&self) -> Result<Vec<Vec<usize>>> {
        let n = self.device_inner()?.global_replicas();
        Ok(vec![(0..n).collect()])
    }

    /// Checks that `groups` partition the device's replicas into equal groups (and that a
    /// mean has a float tensor to divide); returns the group size.
    fn check_groups(
        &self,
        op: &'static str,
        reduction: Reduction,
        groups: &[Vec<usize>],
        location: &'static Location<'static>,
    ) -> Result<usize> {
        let n = self.device_inner()?.global_replicas();
        let bad = |message: String| Error::Op {
            location,
            source: neuron_pc_compiler::Error::Shape {
                op,
                operands: self.ty().to_string(),
                message,
            },
        };
        if reduction == Reduction::Mean && !self.dtype().is_float() {
            return Err(bad("a mean needs a float tensor".into()));
        }
        let size = groups.first().map_or(0, Vec::len);
        let mut seen = vec![false; n];
        let partition = size > 0
            && groups.iter().all(|g| g.len() == size)
            && groups
                .iter()
                .flatten()
                .all(|&r| r < n && !std::mem::replace(&mut seen[r], true))
            && seen.iter().all(|&s| s);
        if !partition {
            return Err(bad(format!(
                "replica groups {groups:?} must split the {n} replicas 0..{n} into equal groups, \
                 each replica once"
            )));
        }
        Ok(size)
    }
}

/// `sum / size` for a mean; `t` unchanged otherwise.
fn mean_of(t: Tensor, op: Reduction, size: usize) -> Result<Tensor> {
    match op {
        Reduction::Mean if size > 1 => t.mul_scalar(1.0 / size as f64),
        _ => Ok(t),
    }
}
