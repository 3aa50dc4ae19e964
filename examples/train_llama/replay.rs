//! `--step-fn`: the training step as a step function (`LazyDevice::step_fn`), traced on its
//! first calls and then replayed without tracing; the same step the loop traces otherwise.

use std::cell::RefCell;

use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::optim::{average_gradients, grad_norm, AdamW};
use neuron_pc::tensor::{Reduction, StepFn};
use neuron_pc::{grad, DType, LazyDevice, Tensor};

/// What the step computes besides the model and its parameters.
pub struct Settings {
    /// Packed rows: the middle argument is the position ids, not a mask.
    pub packed: bool,
    /// The products' dtype under autocast (`--precision bf16`).
    pub autocast: Option<DType>,
    /// ZeRO-1: each replica's own gradients go to the optimizer.
    pub zero1: bool,
    /// Also return the gradients' norm (for TensorBoard).
    pub norm: bool,
}

/// The step over `[ids, labels, lr]` or `[ids, mask or position ids, labels, lr]`: returns the
/// loss averaged over the replicas, and the gradients' norm when `settings.norm`.
pub fn step_fn<'a>(
    device: &'a LazyDevice,
    model: &'a LlamaForCausalLM,
    params: &'a [Tensor],
    opt: &'a RefCell<AdamW>,
    settings: Settings,
) -> StepFn<impl FnMut(&[Tensor]) -> neuron_pc::Result<Vec<Tensor>> + 'a> {
    device.step_fn(move |a: &[Tensor]| {
        let (ids, middle, labels, lr) = match a {
            [ids, labels, lr] => (ids, None, labels, lr),
            [ids, middle, labels, lr] => (ids, Some(middle), labels, lr),
            _ => unreachable!("the loop passes three or four arguments"),
        };
        let loss = device.autocast(settings.autocast, || match (settings.packed, middle) {
            (true, Some(p)) => model.loss_packed(ids, p, labels),
            (_, mask) => model.loss(ids, mask, labels),
        })?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        let grads = match settings.zero1 {
            true => grads,
            false => average_gradients(&grads)?,
        };
        let mut out = vec![loss.all_reduce(Reduction::Mean)?];
        if settings.norm {
            out.push(grad_norm(&grads)?);
        }
        opt.borrow_mut().step(params, &grads, lr)?;
        Ok(out)
    })
}
