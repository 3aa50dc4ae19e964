//! Device-side random numbers beyond the uniform generator of [`crate::LazyDevice::rand`].

use neuron_pc_compiler::DType;

use super::Tensor;
use crate::error::Result;

impl crate::LazyDevice {
    /// Standard normal values (Box-Muller over two streams of [`crate::LazyDevice::rand`]),
    /// f32. `key` is a `u32[2]` device tensor, as for `rand`: the same key gives the same
    /// values, and a new key per step keeps the same graph.
    #[track_caller]
    pub fn randn(&self, key: &Tensor, dims: &[usize]) -> Result<Tensor> {
        let mut both = vec![2];
        both.extend_from_slice(dims);
        let u = self.rand(key, &both)?;
        let n: usize = dims.iter().product();
        let flat = u.reshape(&[2, n])?;
        let halves = flat.split(1, 0)?;
        // 1 - u lies in (0, 1], so the logarithm is finite
        let u1 = halves[0].neg()?.add_scalar(1.0)?;
        let u2 = &halves[1];
        let radius = u1.log()?.mul_scalar(-2.0)?.sqrt()?;
        let angle = u2.mul_scalar(2.0 * std::f64::consts::PI)?.cos()?;
        radius.mul(&angle)?.reshape(dims)?.to_dtype(DType::F32)
    }
}
