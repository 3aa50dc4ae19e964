//! An optimizer's per-parameter update as a function traced once and called per parameter
//! ([`TracedFn`]): each step records a few nodes a parameter (one per updated tensor) instead of
//! one per op of the update, which is most of a small model's tracing. The compiled program
//! is the one the ops would have made: the step graph writes the calls out.

use std::collections::HashMap;
use std::sync::Arc;

use neuron_pc_compiler::ir::TensorType;

use crate::error::Result;
use crate::tensor::{Tensor, TracedFn};

/// A parameter's last update: the settings' bits, the function and the argument types.
type Last = (Vec<u64>, TracedFn, Vec<Arc<TensorType>>);

/// The update functions of one optimizer, by the settings baked into them (as bits) and the
/// types of their arguments; the last one each parameter used, looked up without allocating.
#[derive(Default)]
pub(super) struct Updates {
    by_key: HashMap<(Vec<u64>, Vec<TensorType>), TracedFn>,
    last: Vec<Option<Last>>,
}

impl Updates {
    /// The update of parameter `i` over `args` with `settings`: the one it used last when the
    /// settings and the argument types are the same, else one traced by `f` (or shared with a
    /// parameter of the same types).
    #[track_caller]
    pub fn call(
        &mut self,
        i: usize,
        settings: &[f64],
        args: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        if self.last.len() <= i {
            self.last.resize_with(i + 1, || None);
        }
        if let Some((b, traced, types)) = &self.last[i] {
            let same_settings =
                b.len() == settings.len() && b.iter().zip(settings).all(|(b, s)| *b == s.to_bits());
            // a device's tensors share their types: compared by address first
            let same =
                |t: &Arc<TensorType>, a: &&Tensor| Arc::ptr_eq(t, &a.cell.ty) || **t == *a.ty();
            let same_types =
                types.len() == args.len() && types.iter().zip(args).all(|(t, a)| same(t, a));
            if same_settings && same_types {
                return traced.call(args);
            }
        }
        let bits: Vec<u64> = settings.iter().map(|s| s.to_bits()).collect();
        let types: Vec<TensorType> = args.iter().map(|a| a.ty().clone()).collect();
        let key = (bits.clone(), types.clone());
        let traced = match self.by_key.get(&key) {
            Some(t) => t.clone(),
            None => {
                let t = TracedFn::new(&args[0].device()?, &types, f)?;
                self.by_key.insert(key, t.clone());
                t
            }
        };
        let out = traced.call(args);
        let held = args.iter().map(|a| a.cell.ty.clone()).collect();
        self.last[i] = Some((bits, traced, held));
        out
    }
}
