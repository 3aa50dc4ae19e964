#!/usr/bin/env python3
"""The MoE benchmark's models in PyTorch eager, as `transformers` builds them: a Qwen3-MoE and
the dense Qwen3 with as many parameters active per token (`--dense`), the sizes of
`scripts/bench moe` (hidden 256, 4 layers, 8 heads over 4 kv heads of 32, vocabulary 2048;
8 experts of width 384, 2 per token, renormalised, the load-balancing loss at 0.001; dense:
SwiGLU 768), fp32 on the cpu, four batches of 4 x 128 uniform random tokens, the next-token
loss, `torch.optim.AdamW(lr=1e-3, weight_decay=0.01)`.

Prints `RESULT <name> synced_ms=.. pipelined_ms=.. params=.. active=.. loss=..`: the median
step, waited for, after warm-up, and the median per step of 3 rounds of `steps / 2`.

Needs torch and transformers, not installed by scripts/setup: `scripts/bench moe` runs this
when NEURON_PC_BENCH_TORCH names a Python that has them.
"""
import argparse

import torch
from step_times import step_times
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

ap = argparse.ArgumentParser()
ap.add_argument("--dense", action="store_true", help="the dense Qwen3 of the same active size")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=2)
args = ap.parse_args()

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2048, 256, 4, 8, 4, 32
EXPERTS, TOP_K, EXPERT_WIDTH = 8, 2, 384
SEQ, BATCH = 128, 4
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
              rms_norm_eps=1e-5, max_position_embeddings=SEQ, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def main():
    torch.manual_seed(0)
    if args.dense:
        config = Qwen3Config(**COMMON, intermediate_size=TOP_K * EXPERT_WIDTH)
        name, active = "pytorch-eager-dense", None
    else:
        config = Qwen3MoeConfig(**COMMON, intermediate_size=TOP_K * EXPERT_WIDTH,
                                num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                                moe_intermediate_size=EXPERT_WIDTH, norm_topk_prob=True,
                                output_router_logits=True, router_aux_loss_coef=0.001)
        name = "pytorch-eager-moe"
    model = AutoModelForCausalLM.from_config(config).float().train()
    params = sum(p.numel() for p in model.parameters())
    if not args.dense:
        expert = 3 * HIDDEN * EXPERT_WIDTH
        active = params - LAYERS * (EXPERTS - TOP_K) * expert
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(4)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        ids = batches[i % len(batches)]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    step(0).item()
    for i in range(1, args.warmup + 1):
        step(i)
    # eager on the cpu: a step is done when it returns
    synced, pipelined = step_times(step, args.steps, wait=lambda: None)
    loss = step(0).item()
    print(f"RESULT {name} synced_ms={synced:.3f} pipelined_ms={pipelined:.3f} params={params} "
          f"active={active or params} loss={loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
