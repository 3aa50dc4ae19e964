//! [`LlamaSharding`]: where each parameter of the decoder lives on a mesh.

/// The Llama sharding plan over a mesh's `model` axis (tensor parallelism, the Megatron layout
/// NeuronX Distributed uses) and, with `fsdp`, its `data` axis (FSDP): q/k/v and gate/up
/// split by output features over `model`, o and down by input features, the embedding and
/// `lm_head` by vocabulary; FSDP splits each weight's other dimension over `data`, and the
/// norms over `data`. A bias follows its weight's output features (Qwen2's q/k/v biases split
/// over `model`); Qwen3's per-head q/k norms stay whole over `model`. A mixture's experts
/// (stacked `[experts, ..]`) are split over the `expert` axis (expert parallelism), each
/// expert's projections as a dense MLP's over `model` and `data`; the router is a weight like
/// any other (`data` with FSDP). A dimension an axis does not divide stays whole; an axis the
/// mesh lacks (or of size 1) splits nothing.
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
        // Mixtral's experts name their gate, up and down projections w1, w3 and w2
        let column = [
            "q_proj",
            "k_proj",
            "v_proj",
            "gate_proj",
            "up_proj",
            "w1",
            "w3",
        ];
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
        } else if ["o_proj", "down_proj", "w2"].contains(&layer) {
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

    fn stacked_spec(
        &self,
        name: &str,
        dims: &[usize],
        mesh: &neuron_pc_compiler::sharding::Mesh,
    ) -> neuron_pc_compiler::sharding::PartitionSpec {
        use crate::sharding::{split_if_divisible, stacked_whole, EXPERT_AXIS};
        let mut spec = stacked_whole(self, name, dims, mesh);
        if !name.contains(".experts.*.") {
            return spec;
        }
        let experts = split_if_divisible(&dims[..1], &[(0, EXPERT_AXIS)], mesh);
        if let Some(axes) = experts.0.into_iter().next() {
            match spec.0.first_mut() {
                Some(first) => *first = axes,
                None => spec.0.push(axes),
            }
        }
        spec
    }
}
