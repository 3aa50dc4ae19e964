//! `matmul` with PyTorch's semantics: vectors, matrices, and batches whose leading
//! dimensions broadcast.

use std::panic::Location;

use neuron_pc_compiler::ir::Op;

use super::shape::{broadcast_shape, shape_error};
use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// Matrix product as `torch.matmul`:
    /// - vector · vector is their dot product (a scalar);
    /// - matrix · vector and vector · matrix treat the vector as a column / row and drop that
    ///   dimension from the result;
    /// - otherwise the last two dimensions multiply as matrices and the leading (batch)
    ///   dimensions broadcast, so `[2, 4, 5, 8] @ [1, 4, 8, 5]` is `[2, 4, 5, 5]`.
    ///
    /// Mixed dtypes are promoted as PyTorch promotes them.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        let (ra, rb) = (self.rank(), rhs.rank());
        let mismatch = |message: String| {
            shape_error(
                "matmul",
                format!("{}, {}", self.ty(), rhs.ty()),
                message,
                location,
            )
        };
        if ra == 0 || rb == 0 {
            return Err(mismatch("both operands need at least one dimension".into()));
        }
        let k_lhs = self.dims()[ra - 1];
        let k_rhs = if rb == 1 {
            rhs.dims()[0]
        } else {
            rhs.dims()[rb - 2]
        };
        if k_lhs != k_rhs {
            return Err(mismatch(format!(
                "the contracted dimensions differ ({k_lhs} vs {k_rhs})"
            )));
        }
        let (a, b) = Tensor::promoted(self, rhs, location)?;
        let dot = |a: &Tensor, b: &Tensor, op: Op| Tensor::apply_at(op, &[a, b], location);
        let plain = |lc: usize, rc: usize| Op::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![lc],
            rhs_contract: vec![rc],
        };
        match (ra, rb) {
            // [k] . [k] -> [];  [..., m, k] . [k] -> [..., m];  [k] . [k, n] -> [n];
            // [..., m, k] . [k, n]: contract directly, no batch copy of the matrix
            (_, 1 | 2) => dot(&a, &b, plain(ra - 1, 0)),
            // [k] . [..., k, n]: a row vector against each batch matrix
            (1, _) => {
                let row = a.reshape_at(&[1, k_lhs], location)?;
                let y = row.matmul_batched(&b, location)?;
                let mut dims = y.dims().to_vec();
                dims.remove(dims.len() - 2);
                y.reshape_at(&dims, location)
            }
            _ => a.matmul_batched(&b, location),
        }
    }

    /// Both operands have rank >= 2: broadcast the batch dimensions, then one `dot_general`
    /// batched over all of them.
    fn matmul_batched(&self, rhs: &Tensor, location: &'static Location<'static>) -> Result<Tensor> {
        let (ra, rb) = (self.rank(), rhs.rank());
        let batch = broadcast_shape(
            "matmul",
            &self.dims()[..ra - 2],
            &rhs.dims()[..rb - 2],
            location,
        )?;
        let full = |t: &Tensor| -> Result<Tensor> {
            let r = t.rank();
            let mut dims = batch.clone();
            dims.extend_from_slice(&t.dims()[r - 2..]);
            t.broadcast_to_at(&dims, location)
        };
        let (a, b) = (full(self)?, full(rhs)?);
        let nb = batch.len();
        let batch_dims: Vec<usize> = (0..nb).collect();
        Tensor::apply_at(
            Op::DotGeneral {
                lhs_batch: batch_dims.clone(),
                rhs_batch: batch_dims,
                lhs_contract: vec![nb + 1],
                rhs_contract: vec![nb],
            },
            &[&a, &b],
            location,
        )
    }
}
