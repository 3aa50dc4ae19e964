//! A computation traced once and recorded as one node per result each time it is applied
//! ([`Op::Call`]): how an optimizer's per-parameter update costs the host a few nodes a
//! parameter instead of one per op. The step graph is compiled with the calls written out
//! (`CallExpander`), so the program is the one the ops would have made.

use std::panic::Location;
use std::sync::Arc;

use neuron_pc_compiler::ir::{CallBody, Op, TensorType};

use crate::device::subgraph::{extract, placeholder};
use crate::device::trace::Value;
use crate::device::LazyDevice;
use crate::error::{Error, Result};

use super::Tensor;

/// A function of tensors of fixed types, traced once into a [`CallBody`].
#[derive(Clone, Debug)]
pub(crate) struct TracedFn {
    body: Arc<CallBody>,
}

impl TracedFn {
    /// Traces `f` over stand-ins of `types`. `f` may read only its arguments and constants:
    /// a tensor from outside would be a value of this trace, not of the later calls.
    #[track_caller]
    pub fn new(
        device: &LazyDevice,
        types: &[TensorType],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<TracedFn> {
        let location = Location::caller();
        let dev = &device.inner;
        let args: Vec<Tensor> = (types.iter().enumerate())
            .map(|(k, ty)| Tensor {
                cell: dev.detached_cell(placeholder(dev, k, ty.clone()), ty.clone()),
            })
            .collect();
        let results = f(&args)?;
        let leaves: Vec<Value> = args.iter().map(Tensor::value).collect();
        let outputs: Vec<Value> = results.iter().map(Tensor::value).collect();
        let mut sub = extract(dev, &leaves, &outputs)?;
        if !sub.captured.is_empty() {
            return Err(Error::Config(format!(
                "a traced function read {} tensor(s) other than its arguments and constants \
                 ({location}): pass them as arguments",
                sub.captured.len()
            )));
        }
        let ids: Vec<_> = outputs.iter().map(|v| sub.id(v)).collect();
        let op_error = |source| Error::Op { location, source };
        sub.graph.set_outputs(&ids).map_err(op_error)?;
        let body = CallBody::new(sub.graph).map_err(op_error)?;
        Ok(TracedFn {
            body: Arc::new(body),
        })
    }

    /// The function's results over `args` (of the types it was traced for): one recorded node
    /// per result, whatever the body holds.
    #[track_caller]
    pub fn call(&self, args: &[&Tensor]) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let outputs = self.body.graph().outputs().len();
        let ops = (0..outputs).map(|output| Op::Call {
            body: self.body.clone(),
            output,
        });
        Tensor::apply_each(ops, args, location)
    }
}
