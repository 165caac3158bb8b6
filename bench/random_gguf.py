#!/usr/bin/env python3
"""random_gguf.py - write a GGUF file of random Q4_K_M-style blocks in a real model's shape (the shapes of
bench/make_random_model.py), without an F16 copy or llama-quantize: a speed benchmark's weights for lmx and
llama.cpp alike, written in seconds (the whole Qwen3-30B-A3B shape is ~17 GB; its F16 file, 61 GB, does not
fit the GPU machine's disk beside a quantized copy).

Types as llama-quantize's Q4_K_M chooses them: Q6_K for the output head, and for attn_v and ffn_down
(ffn_down_exps) on layers i < n/8, i >= 7n/8 and every third between; Q4_K for every other matrix (the
embedding too); f32 for norms and the router (ffn_gate_inp).  The blocks' codes are random bytes (a pool
drawn once, each tensor a slice of it at a random block-aligned offset) and their scales are set so the
weights spread over about +-0.02 around zero; the router is N(0, 0.02) in f32, so routing spreads over the
experts.  The vocabulary is gguf_vocab's placeholder (llama.cpp's benchmarks feed token ids).

usage: bench/random_gguf.py {qwen3-30b-a3b,llama-3.1-8b,qwen3-0.6b} OUT.gguf [--layers N]
       (needs gguf-py on PYTHONPATH and numpy)
"""
import argparse
import os
import sys

import numpy as np

import gguf

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "ref"))
from make_random_model import ARCHS  # noqa: E402
from write_gguf import add_header, gguf_arch  # noqa: E402

Q4_K, Q6_K = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
BLOCK = {Q4_K: 144, Q6_K: 210}  # bytes per 256 weights
POOL = 448 << 20  # bytes of random blocks per type: more than the largest tensor (Llama-3.1-8B's Q6_K head, 431 MB)


def make_pool(rng, qt):
    """Random blocks of type qt with their f16 scales set: Q4_K w = d sc q - dmin m (d at 0, dmin at 2:
    dmin = 7.5 d centres the codes), Q6_K w = d sc (q - 32) (d at the block's last two bytes)."""
    b = BLOCK[qt]
    pool = rng.integers(0, 256, size=POOL // b * b, dtype=np.uint8).reshape(-1, b)
    if qt == Q4_K:
        pool[:, 0:2] = np.frombuffer(np.float16(2e-5).tobytes(), np.uint8)
        pool[:, 2:4] = np.frombuffer(np.float16(1.5e-4).tobytes(), np.uint8)
    else:
        pool[:, b - 2:b] = np.frombuffer(np.float16(1e-5).tobytes(), np.uint8)
    return pool.reshape(-1)


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=sorted(ARCHS))
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=0)
    args = ap.parse_args()
    cfg = dict(ARCHS[args.arch])
    if cfg["model_type"] not in ("llama", "qwen3", "qwen3_moe"):
        sys.exit("random_gguf.py: %s is not written (llama, qwen3, qwen3_moe only)" % args.arch)
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    arch = gguf_arch(cfg)
    C, L, H, Hk, D, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"))
    moe = arch == "qwen3moe"
    rng = np.random.default_rng(0)
    pools = {qt: make_pool(rng, qt) for qt in (Q4_K, Q6_K)}

    w = gguf.GGUFWriter(args.out, arch)
    add_header(w, cfg, 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M

    def blocks(name, qt, *shape):
        """shape [..., rows, K] of type qt, as a slice of the pool (bytes [..., rows, K / 256 * BLOCK])."""
        b = BLOCK[qt]
        nbytes = int(np.prod(shape[:-1])) * (shape[-1] // 256) * b
        off = int(rng.integers(0, (POOL // b * b - nbytes) // b + 1)) * b
        w.add_tensor(name, pools[qt][off:off + nbytes].reshape(*shape[:-1], shape[-1] // 256 * b), raw_dtype=qt)

    def f32(name, a):
        w.add_tensor(name, a.astype(np.float32))

    blocks("token_embd.weight", Q4_K, V, C)
    for i in range(L):
        p = "blk.%d." % i
        six = Q6_K if more_bits(i, L) else Q4_K
        f32(p + "attn_norm.weight", np.ones(C))
        blocks(p + "attn_q.weight", Q4_K, H * D, C)
        blocks(p + "attn_k.weight", Q4_K, Hk * D, C)
        blocks(p + "attn_v.weight", six, Hk * D, C)
        blocks(p + "attn_output.weight", Q4_K, C, H * D)
        if arch != "llama":
            f32(p + "attn_q_norm.weight", np.ones(D))
            f32(p + "attn_k_norm.weight", np.ones(D))
        f32(p + "ffn_norm.weight", np.ones(C))
        if moe:
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            f32(p + "ffn_gate_inp.weight", rng.standard_normal((E, C), dtype=np.float32) * 0.02)
            blocks(p + "ffn_gate_exps.weight", Q4_K, E, Fe, C)
            blocks(p + "ffn_up_exps.weight", Q4_K, E, Fe, C)
            blocks(p + "ffn_down_exps.weight", six, E, C, Fe)
        else:
            blocks(p + "ffn_gate.weight", Q4_K, F, C)
            blocks(p + "ffn_up.weight", Q4_K, F, C)
            blocks(p + "ffn_down.weight", six, C, F)
    f32("output_norm.weight", np.ones(C))
    if not cfg["tie_word_embeddings"]:
        blocks("output.weight", Q6_K, V, C)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
