//! ZeRO-1: the optimizer state sharded over the data-parallel replicas (the Neuron SDK's ZeRO-1
//! optimizer, PyTorch/XLA's `ZeroRedundancyOptimizer`), inside the one step graph.
//!
//! Each parameter is seen flattened and padded with zeros to a multiple of the replica count
//! N, as N equal blocks; replica `r` owns block `r`. A step reduce-scatters the gradient (its
//! mean over the replicas, block by block), updates the replica's block of the parameter with
//! the block of optimizer state it holds, and all-gathers the blocks into the whole parameter
//! again, which every replica then holds. The update is elementwise, so it is the plain
//! data-parallel update computed once per block instead of N times; the state per replica is
//! 1/N of the plain one (plus the padding of the last block).
//!
//! The exchanges are joined in buckets: the views of consecutive parameters of one dtype, up to
//! 32 MiB, are one reduce-scatter and one all-gather, as DDP's buckets join all-reduces. Between
//! processes each call has a fixed cost, and one pair per parameter made a step of the small
//! Llama 7x slower across 2 processes than in one.
//!
//! Checkpoints hold the whole state under PyTorch's names ([`Zero1::gather`]), so a file saved
//! with ZeRO-1 at N replicas loads at any other N, with or without ZeRO-1.
//!
//! On a mesh in each process (the processes its replicas: tensor parallelism inside a node,
//! ZeRO-1 across nodes, as NeuronX Distributed lays it out) a process's block is split further
//! over every device of its mesh, so a device holds `1/(N x devices)` of the state. The block is
//! padded to a multiple of the mesh's size, and the `[N, block]` views are split along the
//! block, never along the replicas: the exchanges between processes then run on each device's
//! piece alone.

use neuron_pc_compiler::sharding::PartitionSpec;
use neuron_pc_compiler::DType;

use crate::device::LazyDevice;
use crate::error::Result;
use crate::tensor::{Reduction, Tensor};

/// The most bytes of gradient views one exchange joins (DDP's buckets are 25 MiB): a step's
/// exchanges between replicas are a few large calls, not two per parameter.
const BUCKET_BYTES: usize = 32 << 20;

/// One parameter's blocks.
#[derive(Clone, Debug)]
struct Layout {
    /// Elements of the parameter.
    numel: usize,
    /// Elements of one block: `ceil(numel / N)`.
    block: usize,
    /// The parameter's shape.
    dims: Vec<usize>,
}

/// The sharding of a list of parameters over a device's replicas.
pub(crate) struct Zero1 {
    device: LazyDevice,
    layouts: Vec<Layout>,
    /// Replicas of the whole run (the blocks are numbered globally).
    replicas: usize,
    /// On a mesh: every axis of it, the split of a block (see the module documentation).
    axes: Option<Vec<String>>,
    /// Devices a block is split over (the mesh's size; 1 without a mesh).
    pieces: usize,
}

impl Zero1 {
    pub(crate) fn new(device: &LazyDevice, params: &[Tensor]) -> Zero1 {
        let replicas = device.global_replicas();
        let mesh = device.mesh();
        // a block splits evenly over the mesh's devices
        let pieces = mesh.map_or(1, |m| m.size());
        let layouts = params
            .iter()
            .map(|p| {
                let numel = p.elem_count();
                Layout {
                    numel,
                    block: numel.div_ceil(replicas * pieces).max(1) * pieces,
                    dims: p.dims().to_vec(),
                }
            })
            .collect();
        let axes = mesh.map(|m| m.axes().map(|(name, _)| name.to_string()).collect());
        Zero1 {
            device: device.clone(),
            layouts,
            replicas,
            axes,
            pieces,
        }
    }

    /// On a mesh, `t` (a block, or `[N, block]`) split along the block over every device.
    fn split(&self, t: Tensor) -> Result<Tensor> {
        let Some(axes) = &self.axes else {
            return Ok(t);
        };
        let mut spec = vec![Vec::new(); t.dims().len() - 1];
        spec.push(axes.clone());
        t.constrain(&PartitionSpec(spec))
    }

    /// Parameter `i`'s shape.
    pub(crate) fn dims(&self, i: usize) -> &[usize] {
        &self.layouts[i].dims
    }

    /// Zeros of parameter `i`'s block, each replica's own.
    pub(crate) fn zeros(&self, i: usize, dtype: DType) -> Result<Tensor> {
        let dims = [self.layouts[i].block];
        match &self.axes {
            Some(axes) => {
                let spec = PartitionSpec(vec![axes.clone()]);
                self.device.zeros_data_split(&dims, dtype, &spec)
            }
            None => self.device.zeros_data(&dims, dtype, true),
        }
    }

    /// `t` (shaped like parameter `i`) flattened and padded with zeros to N blocks: `[N, block]`.
    fn blocks(&self, i: usize, t: &Tensor) -> Result<Tensor> {
        let Layout { numel, block, .. } = self.layouts[i];
        let flat = t.reshape(&[numel])?;
        let padded = if block * self.replicas == numel {
            flat
        } else {
            let high = (block * self.replicas - numel) as i64;
            flat.pad(&[0], &[high], &[0], &flat.constant_like(0.0)?)?
        };
        self.split(padded.reshape(&[self.replicas, block])?)
    }

    /// Runs of consecutive parameters of one dtype whose `[N, block]` views fit a bucket.
    fn buckets(&self, tensors: &[&Tensor]) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut bytes = 0;
        for (i, t) in tensors.iter().enumerate() {
            let size = self.replicas * self.layouts[i].block * t.dtype().size_in_bytes();
            let joins = out.last().is_some_and(|run| {
                tensors[run[0]].dtype() == t.dtype() && bytes + size <= BUCKET_BYTES
            });
            if joins {
                out.last_mut().expect("checked").push(i);
                bytes += size;
            } else {
                out.push(vec![i]);
                bytes = size;
            }
        }
        out
    }

    /// `views` (each `[rows, D, block_i / D]`) joined along their last dimension and, on a mesh,
    /// split over it along the middle one: every device's pieces of every member, together.
    fn join(&self, views: &[Tensor]) -> Result<Tensor> {
        let refs: Vec<&Tensor> = views.iter().collect();
        let joined = Tensor::cat(&refs, 2)?;
        let Some(axes) = &self.axes else {
            return Ok(joined);
        };
        joined.constrain(&PartitionSpec(vec![Vec::new(), axes.clone()]))
    }

    /// This replica's block of the replicas' mean of each of `grads` (each parameter's
    /// gradient, each replica's own or already averaged), by one reduce-scatter per bucket: the
    /// blocks' views joined, each device's pieces of all of them exchanged at once.
    pub(crate) fn grad_blocks(&self, grads: &[Tensor]) -> Result<Vec<Tensor>> {
        let d = self.pieces;
        let mut out: Vec<Option<Tensor>> = vec![None; grads.len()];
        for bucket in self.buckets(&grads.iter().collect::<Vec<_>>()) {
            let views = (bucket.iter())
                .map(|&i| {
                    let block = self.layouts[i].block;
                    self.blocks(i, &grads[i])?
                        .reshape(&[self.replicas, d, block / d])
                })
                .collect::<Result<Vec<_>>>()?;
            let mine = self.join(&views)?.reduce_scatter(Reduction::Mean, 0)?;
            let mut at = 0;
            for &i in &bucket {
                let block = self.layouts[i].block;
                let piece = mine.narrow(2, at, block / d)?.reshape(&[block])?;
                out[i] = Some(self.split(piece)?);
                at += block / d;
            }
        }
        Ok(out
            .into_iter()
            .map(|t| t.expect("every parameter is in a bucket"))
            .collect())
    }

    /// Each parameter whole from this replica's updated block of it (`blocks[i]`, as
    /// [`Zero1::gather`]), by one all-gather per bucket.
    pub(crate) fn gather_all(&self, blocks: &[Tensor]) -> Result<Vec<Tensor>> {
        let d = self.pieces;
        let mut out: Vec<Option<Tensor>> = vec![None; blocks.len()];
        for bucket in self.buckets(&blocks.iter().collect::<Vec<_>>()) {
            let views = (bucket.iter())
                .map(|&i| blocks[i].reshape(&[1, d, self.layouts[i].block / d]))
                .collect::<Result<Vec<_>>>()?;
            let all = self.join(&views)?.all_gather(0)?;
            let mut at = 0;
            for &i in &bucket {
                let l = &self.layouts[i];
                let whole = all
                    .narrow(2, at, l.block / d)?
                    .reshape(&[self.replicas * l.block])?
                    .narrow(0, 0, l.numel)?
                    .reshape(&l.dims)?;
                out[i] = Some(whole);
                at += l.block / d;
            }
        }
        Ok(out
            .into_iter()
            .map(|t| t.expect("every parameter is in a bucket"))
            .collect())
    }

    /// This replica's block of `t` (shaped like parameter `i`, the same on every replica).
    pub(crate) fn local_block(&self, i: usize, t: &Tensor) -> Result<Tensor> {
        let block = self.layouts[i].block;
        let r = self.device.replica_index()?.to_dtype(DType::I32)?;
        let zero = r.constant_like(0.0)?;
        let block = self
            .blocks(i, t)?
            .dynamic_slice(&[&r, &zero], &[1, block])?
            .reshape(&[block])?;
        self.split(block)
    }

    /// The whole of parameter `i`'s `blocks` (each replica's block, shape `[block]`), shaped like
    /// the parameter and the same on every replica: one all-gather.
    pub(crate) fn gather(&self, i: usize, block: &Tensor) -> Result<Tensor> {
        let l = &self.layouts[i];
        let row = self.split(block.reshape(&[1, l.block])?)?;
        let blocks = self.split(row.all_gather(0)?)?;
        blocks
            .reshape(&[self.replicas * l.block])?
            .narrow(0, 0, l.numel)?
            .reshape(&l.dims)
    }
}
