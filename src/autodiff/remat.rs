//! Activation checkpointing: a block's activations are not kept for the backward pass but
//! recomputed there from the block's inputs (`jax.checkpoint`, `torch.utils.checkpoint`).
//!
//! [`checkpoint`] runs the block once, as recorded ops like any other, and registers it with
//! the device: its inputs, its outputs, its policy. The recorded nodes between them are the
//! block. When [`crate::grad`] reaches the block it differentiates the same nodes, but every
//! value a gradient rule reads inside the block (an operand, a result) is a recomputed one:
//! the block's ops applied again to its inputs, each input first passed through an
//! optimization barrier together with the cotangent that reached the block. The barrier is the
//! fence: the recomputed values are new values, so neither our CSE nor XLA's can merge them
//! with the forward's, and they cannot be computed before the backward pass reaches the block,
//! so XLA cannot schedule them into the forward pass and keep them alive from there. The
//! forward's own activations then have no reader after the block's outputs are computed, and
//! XLA frees them.
//!
//! Nothing is stored but weak references and a flag: the function is the recorded graph
//! itself, so a block needs no `'static` closure, and a block nobody differentiates costs
//! nothing.

use std::panic::Location;
use std::str::FromStr;
use std::sync::{Arc, Weak};

use neuron_pc_compiler::ir::Op;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::key;
use crate::device::trace::{RematRegion, Value, WeakValue};
use crate::device::DeviceInner;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What a checkpointed block keeps for the backward pass (JAX's checkpoint policies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Remat {
    /// No checkpointing: every activation is kept.
    #[default]
    None,
    /// Keep only the block's inputs; recompute everything inside it (NeuronX Distributed's
    /// `activation_checkpoint_config="full"`, `jax.checkpoint` with no policy).
    Full,
    /// Keep the outputs of products without batch dimensions (the projections) and recompute
    /// the rest, the attention products among it
    /// (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`): the quadratic attention
    /// term is not kept, the expensive projections are not recomputed.
    Dots,
}

impl Remat {
    /// The names the policies parse from, as a phrase for messages and help texts.
    pub const NAMES: &'static str = "none, full or dots";

    /// The policy's name (`none`, `full` or `dots`), as it parses and displays.
    pub fn name(self) -> &'static str {
        match self {
            Remat::None => "none",
            Remat::Full => "full",
            Remat::Dots => "dots",
        }
    }
}

impl std::fmt::Display for Remat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Remat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Remat> {
        match s {
            "none" => Ok(Remat::None),
            "full" => Ok(Remat::Full),
            "dots" => Ok(Remat::Dots),
            other => Err(Error::Config(format!(
                "checkpoint policy {other:?}: use {}",
                Remat::NAMES
            ))),
        }
    }
}

/// `f(inputs)`, its activations recomputed in the backward pass instead of kept, as `policy`
/// says (with [`Remat::None`], plain `f(inputs)`).
///
/// The block is everything `f` computes from `inputs`. What it reads besides them (weights,
/// rotary tables, a mask) is kept as it is and not recomputed; gradients reach those values as
/// usual. Values and gradients are those of `f` itself; only memory and time change: the
/// backward pass runs the block's forward ops once more. Nested checkpoints act as the
/// outermost one.
///
/// ```no_run
/// # use neuron_pc::{nn::{remat, Remat, Linear}, Tensor, Result};
/// # fn block(mlp: &Linear, x: &Tensor) -> Result<Tensor> {
/// let y = remat(Remat::Full, &[x], |xs| Ok(vec![mlp.forward(&xs[0])?.silu()?]))?;
/// # Ok(y[0].clone()) }
/// ```
///
/// PyTorch calls this activation checkpointing (`torch.utils.checkpoint`), JAX `jax.remat`;
/// here "checkpoint" names training checkpoints alone ([`crate::state::Checkpoints`]).
#[track_caller]
pub fn remat<F>(policy: Remat, inputs: &[&Tensor], f: F) -> Result<Vec<Tensor>>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let owned: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    let outputs = f(&owned)?;
    if policy == Remat::None || inputs.is_empty() {
        return Ok(outputs);
    }
    let dev = inputs[0].device_inner()?;
    let nodes: Vec<Weak<_>> = outputs
        .iter()
        .filter_map(|t| match t.value() {
            Value::Node(n) => Some(Arc::downgrade(&n)),
            Value::Data(_) => None,
        })
        .collect();
    if nodes.is_empty() {
        return Ok(outputs);
    }
    let region = RematRegion {
        inputs: owned.iter().map(|t| WeakValue::new(&t.value())).collect(),
        outputs: nodes,
        save_dots: policy == Remat::Dots,
    };
    dev.add_remat(region);
    Ok(outputs)
}

/// The old name of [`remat`] (until 0.2).
#[deprecated(since = "0.1.1", note = "renamed `nn::remat`")]
#[track_caller]
pub fn checkpoint<F>(policy: Remat, inputs: &[&Tensor], f: F) -> Result<Vec<Tensor>>
where
    F: FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
{
    remat(policy, inputs, f)
}

/// The recomputed blocks below one loss, for [`crate::grad`].
pub(super) struct Blocks {
    /// The block each recorded node belongs to (an index into `blocks`).
    of: HashMap<usize, usize>,
    /// The blocks each value is an input of.
    inputs: HashMap<usize, Vec<usize>>,
    blocks: Vec<Block>,
    /// The block entered last, and the finished cotangents of its inputs so far: the next
    /// block's recomputation waits for them, so that blocks the data does not order (the
    /// chunks of a loss) are recomputed one at a time, not all at once.
    last: Option<(usize, Vec<Tensor>)>,
}

struct Block {
    region: Arc<RematRegion>,
    /// The block's nodes, operands before users.
    nodes: Vec<Value>,
    /// Once the backward pass has reached the block: the value a gradient rule reads in place
    /// of each input and node (the fenced inputs, the recomputed nodes, a kept product).
    primals: Option<HashMap<usize, Tensor>>,
}

impl Blocks {
    /// The registered blocks with an output among `needed` (the values below the loss that a
    /// gradient flows through; a block off that path needs no recomputation).
    pub fn collect(dev: &DeviceInner, needed: &HashSet<usize>) -> Blocks {
        let regions: Vec<Arc<RematRegion>> = dev.remat_regions();
        let mut blocks = Blocks {
            of: HashMap::default(),
            inputs: HashMap::default(),
            blocks: Vec::new(),
            last: None,
        };
        // registration order: an enclosing block comes after the blocks inside it and takes
        // their nodes
        for region in regions {
            let outputs: Vec<Value> = region
                .outputs
                .iter()
                .filter_map(|o| o.upgrade().map(Value::Node))
                .filter(|v| needed.contains(&key(v)))
                .collect();
            if outputs.is_empty() {
                continue;
            }
            let inputs: HashSet<usize> = region.inputs.iter().map(WeakValue::key).collect();
            let nodes = interior(&outputs, &inputs);
            if nodes.is_empty() {
                continue;
            }
            let index = blocks.blocks.len();
            for v in &nodes {
                blocks.of.insert(key(v), index);
            }
            for k in &inputs {
                blocks.inputs.entry(*k).or_default().push(index);
            }
            blocks.blocks.push(Block {
                region,
                nodes,
                primals: None,
            });
        }
        blocks
    }

    /// The block `v` belongs to, if any.
    pub fn block_of(&self, v: &Value) -> Option<usize> {
        self.of.get(&key(v)).copied()
    }

    /// The value gradient rules read for `v` inside block `b` (`None`: `v` itself, a value
    /// from outside the block).
    pub fn primal(&self, b: usize, v: &Value) -> Option<&Tensor> {
        self.blocks[b].primals.as_ref()?.get(&key(v))
    }

    /// Notes `g`, the whole cotangent of `v`: if `v` is an input of the block entered last,
    /// the next block's recomputation waits for it.
    pub fn finished(&mut self, v: &Value, g: &Tensor) {
        let Some(blocks) = self.inputs.get(&key(v)) else {
            return;
        };
        if let Some((b, done)) = &mut self.last {
            if blocks.contains(b) {
                done.push(g.clone());
            }
        }
    }

    /// Recomputes block `b` (once) from its inputs, fenced with `g`, the first cotangent the
    /// backward pass brings to it (and with the finished input cotangents of the block before
    /// it).
    pub fn enter(
        &mut self,
        b: usize,
        dev: &Arc<DeviceInner>,
        g: &Tensor,
        location: &'static Location<'static>,
    ) -> Result<()> {
        let block = &mut self.blocks[b];
        if block.primals.is_some() {
            return Ok(());
        }
        let mut fence: Vec<&Tensor> = vec![g];
        let previous = self.last.take();
        if let Some((_, done)) = &previous {
            fence.extend(done);
        }
        let mut primals: HashMap<usize, Tensor> = HashMap::default();
        for input in &block.region.inputs {
            let Some(x) = input.upgrade() else { continue };
            let x = detached(dev, &x);
            let operands: Vec<&Tensor> = std::iter::once(&x).chain(fence.iter().copied()).collect();
            let fenced = Tensor::apply_at(Op::After, &operands, location)?;
            primals.insert(input.key(), fenced);
        }
        for v in &block.nodes {
            let Value::Node(node) = v else { continue };
            let op = dev.op_of(node.op_id).0;
            let kept = block.region.save_dots
                && matches!(&op, Op::DotGeneral { lhs_batch, .. } if lhs_batch.is_empty());
            let value = if kept {
                // fenced too: the recomputation starts from it, and an unfenced operand would
                // let CSE merge the recomputed ops above it with the forward's
                let kept = detached(dev, v);
                let operands: Vec<&Tensor> = std::iter::once(&kept)
                    .chain(fence.iter().copied())
                    .collect();
                Tensor::apply_at(Op::After, &operands, location)?
            } else {
                let operands: Vec<Tensor> = node
                    .operands
                    .iter()
                    .map(|o| match primals.get(&key(o)) {
                        Some(t) => t.clone(),
                        None => detached(dev, o),
                    })
                    .collect();
                let refs: Vec<&Tensor> = operands.iter().collect();
                Tensor::apply_at(op, &refs, location)?
            };
            primals.insert(key(v), value);
        }
        block.primals = Some(primals);
        self.last = Some((b, Vec::new()));
        Ok(())
    }
}

fn detached(dev: &Arc<DeviceInner>, v: &Value) -> Tensor {
    Tensor {
        cell: dev.detached_cell(v.clone(), super::value_type(dev, v)),
    }
}

/// The nodes below `outputs` that depend on a value of `inputs`, operands before users
/// (the walk stops at the inputs).
fn interior(outputs: &[Value], inputs: &HashSet<usize>) -> Vec<Value> {
    let mut inside: HashSet<usize> = HashSet::default();
    super::post_order(outputs, inputs)
        .into_iter()
        .filter(|v| {
            let Value::Node(n) = v else { return false };
            let depends = n.operands.iter().any(|o| {
                let k = key(o);
                inputs.contains(&k) || inside.contains(&k)
            });
            if depends {
                inside.insert(key(v));
            }
            depends
        })
        .collect()
}
