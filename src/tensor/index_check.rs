//! Recording an index check (see `device/checks.rs`) for the ops that take indices.

use std::panic::Location;

use neuron_pc_compiler::DType;

use super::Tensor;
use crate::device::checks::IndexCheck;
use crate::error::Result;

impl Tensor {
    /// With index checks on ([`crate::DeviceConfig::check_indices`]), records that every value
    /// of this integer tensor except `ignore` must lie in `0..upper`, for `op` called at `site`.
    /// Does nothing when the checks are off.
    pub(crate) fn check_index_range(
        &self,
        op: &'static str,
        what: &'static str,
        upper: usize,
        ignore: Option<i64>,
        site: &'static Location<'static>,
    ) -> Result<()> {
        let dev = self.device_inner()?;
        let count = self.elem_count();
        if !dev.config().check_indices || count == 0 {
            return Ok(());
        }
        let v = self.to_dtype(DType::I64)?.reshape(&[count])?;
        let looked_at = match ignore {
            Some(i) => v.ne(&v.constant_like(i as f64)?)?,
            None => v.eq(&v)?,
        };
        let out = v
            .lt(&v.constant_like(0.0)?)?
            .logical_or(&v.ge(&v.constant_like(upper as f64)?)?)?
            .logical_and(&looked_at)?;
        let bad = out.to_dtype(DType::I64)?.sum_all()?;
        // ignored values stand in as 0, which is always in range
        let seen = Tensor::where_cond(&looked_at, &v, &v.zeros_like()?)?;
        let lo = seen.min(&[0], false)?;
        let hi = seen.max(&[0], false)?;
        let stats = Tensor::stack(&[&bad, &lo, &hi], 0)?;
        // the mark_step that will cut this op's step, counted from 1 as Error::StepFailed does
        let step = dev.steps() + 1;
        dev.add_index_check(IndexCheck {
            stats: stats.cell,
            op,
            what,
            upper,
            count,
            site,
            step,
        });
        Ok(())
    }
}
