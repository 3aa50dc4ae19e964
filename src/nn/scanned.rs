//! A stack of identical layers run as one loop ([`crate::nn::scan`]): the step graph holds one
//! layer's ops whatever the depth, so tracing, lowering and compiling do not grow with it
//! (PyTorch/XLA's `scan_layers`, MaxText's `scan_layers`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use neuron_pc_compiler::HostTensor;

use super::var_builder::Collected;
use super::{join_name, Module, VarBuilder};
use crate::autodiff::{scan, Remat, ScanOptions};
use crate::error::{Error, Result};
use crate::state_dict::{stack_rows, STACKED};
use crate::tensor::Tensor;

/// Builds one layer from a [`VarBuilder`] (its `from_vb`).
pub type LayerBuilder<M> = Arc<dyn Fn(&VarBuilder) -> Result<M> + Send + Sync>;

/// `len` layers of type `M` with their parameters stacked: each `[len, ..]` on the device,
/// named with `*` for the layer (`layers.*.mlp.up_proj.weight`; in a state dict, a checkpoint
/// or a `save_pretrained` directory they are `layers.0.…`, `layers.1.…` as unstacked, see
/// [`crate::state`]). [`ScannedLayers::forward`] runs them as one loop; optimizers, ZeRO-1 and
/// sharding plans see the stacked tensors as any other parameter.
///
/// The layer is built again from one layer's slices each time the loop is traced, by the
/// builder given here (its `from_vb`), so `M` needs nothing but [`Module`].
pub struct ScannedLayers<M> {
    /// The layer built over the stacked tensors (its parameters are `[len, ..]`).
    stacked: M,
    build: LayerBuilder<M>,
    len: usize,
    /// What the backward pass keeps of each layer (see [`ScanOptions::remat`]).
    pub remat: Remat,
}

impl<M: Module> ScannedLayers<M> {
    /// Reads layers `vb.pp("0")` .. `vb.pp("len - 1")` with `build` (from a checkpoint, or a
    /// random initialiser drawing what the unstacked layers would draw, in the same order), and
    /// uploads each parameter stacked, laid out by the builder's sharding plan: no layer is on
    /// the device on its own.
    pub fn from_vb(vb: &VarBuilder, len: usize, build: LayerBuilder<M>) -> Result<Self> {
        if len == 0 {
            return Err(Error::Config(format!(
                "ScannedLayers under {:?}: a stack of 0 layers (a trip count of 0)",
                vb.prefix()
            )));
        }
        let collected: Collected = Arc::new(Mutex::new(Vec::new()));
        let mut per_layer: Vec<Vec<(String, HostTensor)>> = Vec::with_capacity(len);
        for i in 0..len {
            let layer_vb = vb.pp(&i.to_string());
            build(&layer_vb.collecting(&collected))?;
            let under = format!("{}.", layer_vb.prefix());
            let read = std::mem::take(&mut *crate::device::lock(&collected));
            per_layer.push(
                read.into_iter()
                    .map(|(n, t)| (n.strip_prefix(&under).unwrap_or(&n).to_string(), t))
                    .collect(),
            );
        }
        let shapes =
            |l: &[(String, HostTensor)]| signature(l.iter().map(|(n, t)| (n, t.dims(), t.dtype())));
        let names = shapes(&per_layer[0]);
        for (i, l) in per_layer.iter().enumerate() {
            check_same(vb.prefix(), 0, &names, i, &shapes(l))?;
        }
        let mut tensors = BTreeMap::new();
        for (k, (name, _, _)) in names.iter().enumerate() {
            let rows: Vec<&HostTensor> = per_layer.iter().map(|l| &l[k].1).collect();
            let host = stack_rows(&rows)?;
            let full = join_name(&join_name(vb.prefix(), STACKED), name);
            tensors.insert(name.clone(), vb.upload_stacked(&full, &host)?);
        }
        ScannedLayers::over(vb, tensors, len, build)
    }

    /// Stacks layers already built (`len` of them, of one structure: parameter names, shapes
    /// and dtypes), as recorded ops; their tensors are free once the next step has run.
    pub fn from_layers(layers: Vec<M>, build: LayerBuilder<M>) -> Result<Self> {
        let Some(first) = layers.first() else {
            return Err(Error::Config(
                "ScannedLayers: a stack of 0 layers (a trip count of 0)".into(),
            ));
        };
        let device = match first.parameters().first() {
            Some((_, t)) => t.device()?,
            None => {
                return Err(Error::Config(
                    "ScannedLayers: a layer without parameters".into(),
                ))
            }
        };
        let params: Vec<Vec<(String, Tensor)>> = layers.iter().map(|l| l.parameters()).collect();
        let shapes =
            |l: &[(String, Tensor)]| signature(l.iter().map(|(n, t)| (n, t.dims(), t.dtype())));
        let want = shapes(&params[0]);
        for (i, l) in params.iter().enumerate() {
            check_same("", 0, &want, i, &shapes(l))?;
        }
        let mut tensors = BTreeMap::new();
        for (k, (name, _, _)) in want.iter().enumerate() {
            let rows: Vec<&Tensor> = params.iter().map(|l| &l[k].1).collect();
            let stacked = Tensor::stack(&rows, 0)?;
            stacked.set_name(&join_name(STACKED, name));
            tensors.insert(name.clone(), stacked);
        }
        let vb = VarBuilder::from_device_tensors(&device, BTreeMap::new(), None);
        ScannedLayers::over(&vb, tensors, layers.len(), build)
    }

    fn over(
        vb: &VarBuilder,
        tensors: BTreeMap<String, Tensor>,
        len: usize,
        build: LayerBuilder<M>,
    ) -> Result<Self> {
        let stacked = build(&VarBuilder::from_device_tensors(
            vb.device(),
            tensors,
            Some(len),
        ))?;
        Ok(ScannedLayers {
            stacked,
            build,
            len,
            remat: Remat::None,
        })
    }

    /// The layers one by one, each parameter a row of its stacked one (a recorded slice,
    /// computed in the graph that uses it): for code that runs the layers unrolled, such as
    /// generation with a cache per layer.
    pub fn unstacked(&self) -> Result<Vec<M>> {
        let params = self.stacked.parameters();
        let Some((_, first)) = params.first() else {
            return Err(Error::Config(
                "ScannedLayers: a layer without parameters".into(),
            ));
        };
        let device = first.device()?;
        (0..self.len)
            .map(|i| {
                let mut rows = BTreeMap::new();
                for (name, t) in &params {
                    let row = t.narrow(0, i, 1)?.reshape(&t.dims()[1..])?;
                    rows.insert(name.clone(), row);
                }
                (self.build)(&VarBuilder::from_device_tensors(&device, rows, None))
            })
            .collect()
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a stack has at least one layer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The layer over the stacked parameters (each `[len, ..]`): what an optimizer or a
    /// checkpoint reads through [`Module`]; not for running.
    pub fn stacked(&self) -> &M {
        &self.stacked
    }

    /// Runs every layer in order: `f(layer, carries)` gives the next carries (of the same
    /// shapes and dtypes), traced once, over one layer's slices of the stacked parameters.
    #[track_caller]
    pub fn forward<F>(&self, carries: &[&Tensor], f: F) -> Result<Vec<Tensor>>
    where
        F: FnOnce(&M, &[Tensor]) -> Result<Vec<Tensor>>,
    {
        let named = self.stacked.parameters();
        let xs: Vec<&Tensor> = named.iter().map(|(_, t)| t).collect();
        let device = match xs.first() {
            Some(t) => t.device()?,
            None => {
                return Err(Error::Config(
                    "ScannedLayers: a layer without parameters".into(),
                ))
            }
        };
        let options = ScanOptions {
            reverse: false,
            remat: self.remat,
        };
        let (out, _) = scan(carries, &xs, options, |c, slices| {
            let tensors = named
                .iter()
                .zip(slices)
                .map(|((n, _), s)| (n.clone(), s.clone()))
                .collect();
            let layer = (self.build)(&VarBuilder::from_device_tensors(&device, tensors, None))?;
            Ok((f(&layer, c)?, Vec::new()))
        })?;
        Ok(out)
    }
}

/// A layer's parameters as `(name, shape, dtype)`, what two layers must share to be stacked.
fn signature<'a>(
    params: impl Iterator<Item = (&'a String, &'a [usize], neuron_pc_compiler::DType)>,
) -> Vec<(String, Vec<usize>, String)> {
    params
        .map(|(n, d, t)| (n.clone(), d.to_vec(), t.to_string()))
        .collect()
}

/// Layer `i`'s parameters (`got`) are those of layer `first` (`want`): names, shapes, dtypes.
fn check_same(
    prefix: &str,
    first: usize,
    want: &[(String, Vec<usize>, String)],
    i: usize,
    got: &[(String, Vec<usize>, String)],
) -> Result<()> {
    if want == got {
        return Ok(());
    }
    let at = |l: usize| join_name(prefix, &l.to_string());
    let differs = want
        .iter()
        .zip(got)
        .find(|(a, b)| a != b)
        .map(|((n, d, t), (m, e, u))| {
            format!(
                "{}.{n} is {t}{d:?} but {}.{m} is {u}{e:?}",
                at(first),
                at(i)
            )
        })
        .unwrap_or_else(|| {
            format!(
                "layer {} has {} parameters, layer {i} has {}",
                at(first),
                want.len(),
                got.len()
            )
        });
    Err(Error::Config(format!(
        "ScannedLayers: layers must be identical to be stacked: {differs}"
    )))
}

impl<M: Module> Module for ScannedLayers<M> {
    fn named_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.stacked.named_params(&join_name(prefix, STACKED), out);
    }

    fn named_buffers(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.stacked.named_buffers(&join_name(prefix, STACKED), out);
    }
}
