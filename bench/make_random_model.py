#!/usr/bin/env python3
"""make_random_model.py - write a random-weight HF model directory with a real model's shapes, for
`lmx bench` on the GPU machine (torch + safetensors; the weights are drawn on the GPU when there is
one).  Weights ~ N(0, 0.02) in bf16, norm weights 1; config.json is written last.

With --bits 4 or 8 every projection, the embedding and the output head are stored MLX-quantized
(affine, group 64: packed uint32 codes + bf16 scales and biases, as mlx-lm writes them), with random
codes and scales chosen so that the weights again spread over about +-0.02.

usage: bench/make_random_model.py {qwen3-0.6b,llama-3.1-8b,smollm2-135m,qwen3-30b-a3b,gemma-3-1b} OUT_DIR [--bits 4|8] [--layers N]

--layers N keeps the first N layers of the shape (qwen3-30b-a3b in bf16 is 61 GB: more than a 64 GB
disk holds beside anything else).  qwen3-30b-a3b is Qwen3-30B-A3B's shape: 128 experts of 768 hidden
units per layer, 8 chosen per token, router weights random too (so the routing spreads over them).
"""
import argparse
import json
import os

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
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=8192, hidden_act="silu"),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144, vocab_size=151936,
                          tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=40960, hidden_act="silu", num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[]),
    "gemma-3-1b": dict(model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
                       tie_word_embeddings=True, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_activation="gelu_pytorch_tanh",
                       query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
                       attn_logit_softcapping=None, final_logit_softcapping=None, rope_scaling=None),
}
GROUP = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=sorted(ARCHS))
    ap.add_argument("out")
    ap.add_argument("--bits", type=int, choices=(0, 4, 8), default=0)
    ap.add_argument("--layers", type=int, default=0)
    args = ap.parse_args()
    import torch  # here, so that random_gguf.py can read ARCHS without torch
    from safetensors.torch import save_file

    cfg = dict(ARCHS[args.arch], architectures=["X"], torch_dtype="bfloat16")
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.bits:
        cfg["quantization"] = {"group_size": GROUP, "bits": args.bits}
    out = args.out
    os.makedirs(out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    C, L, H, Hk, D, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"))
    gemma = cfg["model_type"].startswith("gemma")

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16) if not gemma else torch.zeros(n, dtype=torch.bfloat16)

    shards, cur, index, size = [], {}, {}, 0

    def add(name, t):
        nonlocal size
        cur[name] = t
        size += t.numel() * t.element_size()
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

    def weight(prefix, n, k):
        """A [n, k] matrix under prefix + '.weight', MLX-quantized with --bits."""
        if not args.bits:
            add(prefix + ".weight", rnd(n, k))
            return
        words = torch.randint(-2**31, 2**31, (n, k * args.bits // 32), generator=gen, device=dev,
                              dtype=torch.int64).to(torch.int32).view(torch.uint32).cpu()
        levels = (1 << args.bits) - 1
        scale = (0.04 / levels) * (1.0 + 0.25 * torch.rand(n, k // GROUP, generator=gen, device=dev))
        bias = -0.5 * levels * scale + 0.002 * torch.randn(n, k // GROUP, generator=gen, device=dev)
        add(prefix + ".weight", words)
        add(prefix + ".scales", scale.to(torch.bfloat16).cpu())
        add(prefix + ".biases", bias.to(torch.bfloat16).cpu())

    weight("model.embed_tokens", V, C)
    for i in range(L):
        p = "model.layers.%d." % i
        add(p + "input_layernorm.weight", ones(C))
        add(p + "post_attention_layernorm.weight", ones(C))
        if gemma:
            add(p + "pre_feedforward_layernorm.weight", ones(C))
            add(p + "post_feedforward_layernorm.weight", ones(C))
        weight(p + "self_attn.q_proj", H * D, C)
        weight(p + "self_attn.k_proj", Hk * D, C)
        weight(p + "self_attn.v_proj", Hk * D, C)
        weight(p + "self_attn.o_proj", C, H * D)
        if cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text"):
            add(p + "self_attn.q_norm.weight", ones(D))
            add(p + "self_attn.k_norm.weight", ones(D))
        if cfg["model_type"] == "qwen3_moe":
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            add(p + "mlp.gate.weight", rnd(E, C))
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                weight(q + "gate_proj", Fe, C)
                weight(q + "up_proj", Fe, C)
                weight(q + "down_proj", C, Fe)
            continue
        weight(p + "mlp.gate_proj", F, C)
        weight(p + "mlp.up_proj", F, C)
        weight(p + "mlp.down_proj", C, F)
    add("model.norm.weight", ones(C))
    if not cfg["tie_word_embeddings"]:
        weight("lm_head", V, C)
    flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote", out, len(shards), "shards")


if __name__ == "__main__":
    main()
