//! Tensor methods that expose IR primitives directly (padding, strided and dynamic slices,
//! `dot_general`, `broadcast_in_dim`): the building blocks of the friendlier ops and of the
//! gradient rules in [`crate::autodiff`].

use neuron_pc_compiler::ir::{Literal, Op};

use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// Zeros of this tensor's type (a constant of the graph).
    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        let dev = self.device_inner()?;
        Tensor::apply_nullary(
            &dev,
            Op::Constant(Literal::splat(self.dtype(), 0.0, self.dims())),
        )
    }

    /// Pads with the scalar `value` (same dtype): `low`/`high` entries before/after each
    /// dimension (negative ones crop), `interior` entries between neighbouring elements.
    #[track_caller]
    pub fn pad(
        &self,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
        value: &Tensor,
    ) -> Result<Tensor> {
        Tensor::apply(
            Op::Pad {
                low: low.to_vec(),
                high: high.to_vec(),
                interior: interior.to_vec(),
            },
            &[self, value],
        )
    }

    /// Elements `start[d], start[d] + stride[d], ...` below `limit[d]` of each dimension.
    #[track_caller]
    pub fn slice_strided(
        &self,
        start: &[usize],
        limit: &[usize],
        stride: &[usize],
    ) -> Result<Tensor> {
        Tensor::apply(
            Op::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
                stride: stride.to_vec(),
            },
            &[self],
        )
    }

    /// The `sizes` window at `starts` (one scalar integer tensor per dimension, so the offset
    /// can change between steps without a new graph; clamped to keep the window inside).
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[usize]) -> Result<Tensor> {
        let mut operands = vec![self];
        operands.extend_from_slice(starts);
        Tensor::apply(
            Op::DynamicSlice {
                sizes: sizes.to_vec(),
            },
            &operands,
        )
    }

    /// This tensor with `update` written at `starts` (scalar integer tensors, clamped).
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Result<Tensor> {
        let mut operands = vec![self, update];
        operands.extend_from_slice(starts);
        Tensor::apply(Op::DynamicUpdateSlice, &operands)
    }

    /// The IR's `dot_general`: contracts `lhs_contract[k]` of this tensor with `rhs_contract[k]`
    /// of `rhs`, batching over paired `lhs_batch`/`rhs_batch`; the result has the batch
    /// dimensions, then this tensor's free ones, then `rhs`'s free ones.
    #[track_caller]
    pub fn dot_general(
        &self,
        rhs: &Tensor,
        lhs_batch: &[usize],
        rhs_batch: &[usize],
        lhs_contract: &[usize],
        rhs_contract: &[usize],
    ) -> Result<Tensor> {
        let op = Op::DotGeneral {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contract: lhs_contract.to_vec(),
            rhs_contract: rhs_contract.to_vec(),
        };
        Tensor::apply(op, &[self, rhs])
    }

    /// The IR's `broadcast_in_dim`: operand dimension `i` becomes result dimension
    /// `broadcast_dimensions[i]` (equal size, or 1 to stretch); the result has `dims`.
    #[track_caller]
    pub fn broadcast_in_dim(
        &self,
        dims: &[usize],
        broadcast_dimensions: &[usize],
    ) -> Result<Tensor> {
        Tensor::apply(
            Op::BroadcastInDim {
                dims: dims.to_vec(),
                broadcast_dimensions: broadcast_dimensions.to_vec(),
            },
            &[self],
        )
    }
}
