//! Creating tensors on a device: uploads, scalars, constants, ranges and random values.

use neuron_pc_compiler::ir::{Literal, Op};
use neuron_pc_compiler::{DType, HostTensor};

use super::Tensor;
use crate::device::trace::Value;
use crate::device::LazyDevice;
use crate::error::Result;

impl LazyDevice {
    /// Copies `host` to the device; the tensor holds device data (nothing pending).
    pub fn tensor(&self, host: &HostTensor) -> Result<Tensor> {
        let data = self.inner.upload(host, false)?;
        Ok(Tensor {
            cell: self.inner.new_cell(data.ty(), Value::Data(data)),
        })
    }

    /// A scalar on the device, for values that change between steps (learning rate, step
    /// count, loss scale, seeds): it enters the graph as an input, so changing it does not make
    /// a new graph. Plain Rust numbers used in ops become constants of the graph instead.
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor> {
        self.tensor(&HostTensor::from_f64s(dtype, &[value], &[])?)
    }

    /// Copies `values` (shape `dims`) to the device.
    pub fn from_slice<T: neuron_pc_compiler::Element>(
        &self,
        values: &[T],
        dims: &[usize],
    ) -> Result<Tensor> {
        self.tensor(&HostTensor::from_slice(values, dims)?)
    }

    /// A tensor filled with `value` (recorded as a constant of the graph).
    #[track_caller]
    pub fn full(&self, value: f64, dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::apply_nullary(
            &self.inner,
            Op::Constant(Literal::splat(dtype, value, dims)),
        )
    }

    /// Zeros (a constant of the graph).
    #[track_caller]
    pub fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(0.0, dims, dtype)
    }

    /// Ones (a constant of the graph).
    #[track_caller]
    pub fn ones(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(1.0, dims, dtype)
    }

    /// `0, 1, ..., n-1`.
    #[track_caller]
    pub fn arange(&self, n: usize, dtype: DType) -> Result<Tensor> {
        Tensor::apply_nullary(
            &self.inner,
            Op::Iota {
                dims: vec![n],
                dim: 0,
                dtype,
            },
        )
    }

    /// Uniform values in [0, 1) from a counter-based generator keyed by `key` (a `u32[2]`
    /// device tensor, so a new key per step does not make a new graph).
    #[track_caller]
    pub fn rand(&self, key: &Tensor, dims: &[usize]) -> Result<Tensor> {
        let bits = Tensor::apply(
            Op::RandomBits {
                dims: dims.to_vec(),
            },
            &[key],
        )?;
        // The top 24 bits give every float32 in [0, 1) with spacing 2^-24.
        let top = bits.div(&bits.constant_like(256.0)?)?;
        top.to_dtype(DType::F32)?.mul_scalar(1.0 / 16_777_216.0)
    }

    /// A `u32[2]` key for [`LazyDevice::rand`] and dropout, from a seed.
    pub fn key(&self, seed: u64) -> Result<Tensor> {
        self.from_slice(&[(seed >> 32) as u32, seed as u32], &[2])
    }
}
