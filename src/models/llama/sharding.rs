//! [`LlamaSharding`]: where each parameter of the decoder lives on a mesh.

/// The Llama sharding plan over a mesh's `model` axis (tensor parallelism, the Megatron layout
/// NeuronX Distributed uses) and, with `fsdp`, its `data` axis (FSDP): q/k/v and gate/up
/// split by output features over `model`, o and down by input features, the embedding and
/// `lm_head` by vocabulary; FSDP splits each weight's other dimension over `data`, and the
/// norms over `data`. A bias follows its weight's output features (Qwen2's q/k/v biases split
/// over `model`); Qwen3's per-head q/k norms stay whole over `model`. A dimension an axis does
/// not divide stays whole; an axis the mesh lacks (or of size 1) splits nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct LlamaSharding {
    /// Also split over the `data` axis (FSDP): each weight's dimension that `model` does not
    /// split, and the norms. `false` (the default): tensor parallelism alone.
    pub fsdp: bool,
}

impl crate::sharding::ShardingPlan for LlamaSharding {
    fn spec(
        &self,
        name: &str,
        dims: &[usize],
        mesh: &neuron_pc_compiler::sharding::Mesh,
    ) -> neuron_pc_compiler::sharding::PartitionSpec {
        use crate::sharding::{split_if_divisible, DATA_AXIS, MODEL_AXIS};
        let column = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"];
        let vocab = ["embed_tokens", "lm_head"];
        // a bias is split as its weight's outputs are
        let layer = name
            .strip_suffix(".weight")
            .or_else(|| name.strip_suffix(".bias"));
        let layer = layer.unwrap_or(name);
        let layer = layer.rsplit('.').next().unwrap_or(layer);
        // (dimension split over `model`, dimension split over `data`)
        let (tp, dp) = if column.contains(&layer) || vocab.contains(&layer) {
            (Some(0), 1)
        } else if layer == "o_proj" || layer == "down_proj" {
            (Some(1), 0)
        } else {
            (None, 0)
        };
        let mut splits = Vec::new();
        if let Some(d) = tp {
            splits.push((d, MODEL_AXIS));
        }
        if self.fsdp {
            splits.push((dp, DATA_AXIS));
        }
        split_if_divisible(dims, &splits, mesh)
    }
}
