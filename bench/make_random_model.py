#!/usr/bin/env python3
"""make_random_model.py - write a random-weight bf16 HF model directory with a real model's shapes,
for `lmx bench` on the GPU machine (torch + safetensors; the weights are drawn on the GPU when
there is one).  Weights ~ N(0, 0.02), norm weights 1; config.json is written last.

usage: bench/make_random_model.py {qwen3-0.6b,llama-3.1-8b,gemma-3-1b} OUT_DIR
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

ARCHS = {
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       max_position_embeddings=40960, hidden_act="silu"),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
                         tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=131072, hidden_act="silu",
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192)),
}


def main():
    arch, out = sys.argv[1], sys.argv[2]
    cfg = dict(ARCHS[arch], architectures=["X"], torch_dtype="bfloat16")
    os.makedirs(out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    C, L, H, Hk, D, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"))

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    shards, cur, index, size = [], {}, {}, 0

    def add(name, t):
        nonlocal cur, size
        cur[name] = t
        size += t.numel() * 2
        if size > (2 << 30):
            flush()

    def flush():
        nonlocal cur, size
        if not cur:
            return
        fn = "model-%05d.safetensors" % (len(shards) + 1)
        save_file(cur, os.path.join(out, fn), metadata={"format": "pt"})
        for k in cur:
            index[k] = fn
        shards.append(fn)
        cur, size = {}, 0

    add("model.embed_tokens.weight", rnd(V, C))
    for i in range(L):
        p = "model.layers.%d." % i
        add(p + "input_layernorm.weight", ones(C))
        add(p + "post_attention_layernorm.weight", ones(C))
        add(p + "self_attn.q_proj.weight", rnd(H * D, C))
        add(p + "self_attn.k_proj.weight", rnd(Hk * D, C))
        add(p + "self_attn.v_proj.weight", rnd(Hk * D, C))
        add(p + "self_attn.o_proj.weight", rnd(C, H * D))
        if cfg["model_type"] == "qwen3":
            add(p + "self_attn.q_norm.weight", ones(D))
            add(p + "self_attn.k_norm.weight", ones(D))
        add(p + "mlp.gate_proj.weight", rnd(F, C))
        add(p + "mlp.up_proj.weight", rnd(F, C))
        add(p + "mlp.down_proj.weight", rnd(C, F))
    add("model.norm.weight", ones(C))
    if not cfg["tie_word_embeddings"]:
        add("lm_head.weight", rnd(V, C))
    flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote", out, len(shards), "shards")


if __name__ == "__main__":
    main()
