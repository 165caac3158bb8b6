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
--type q4_0: Q4_0 for every matrix but the head (Q6_K), as llama-quantize's Q4_0 chooses; --type q8_0: Q8_0
for every matrix, the head too.
--spread: the matrices that write into the residual stream (attn_output, ffn_down, ffn_down_exps) with scales
64 times smaller, so that each position's hidden state stays mostly its token's embedding.  Without it the
random blocks' row means (the codes are not centred per row) add one shared direction to every position,
layer after layer, and a long prompt's rows all choose the same few experts; a trained mixture spreads them
(load balancing), which --spread imitates: random token ids then route about uniformly (the prefill
benchmarks' realistic case for a mixture's grouped GEMMs).

usage: bench/random_gguf.py {qwen3-30b-a3b,llama-3.1-8b,qwen3-0.6b} OUT.gguf [--layers N] [--type q4_k_m|q4_0|q8_0]
       [--spread]
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

Q4_K, Q6_K, Q4_0 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q4_0
Q8_0 = gguf.GGMLQuantizationType.Q8_0
BLOCK = {Q4_K: 144, Q6_K: 210, Q4_0: 18, Q8_0: 34}  # bytes per block
ELEMS = {Q4_K: 256, Q6_K: 256, Q4_0: 32, Q8_0: 32}  # weights per block
SCALES = {Q4_K: (0, 2), Q6_K: (208,), Q4_0: (0,), Q8_0: (0,)}  # each block's f16 scale fields: (d, dmin), or d
POOL = 448 << 20  # bytes of random blocks per type: more than the largest tensor (Llama-3.1-8B's Q6_K head, 431 MB)
POOL_Q8 = 640 << 20  # Q8_0's (its head: 558 MB)


def pool_bytes(qt):
    return POOL_Q8 if qt == Q8_0 else POOL


def make_pool(rng, qt):
    """Random blocks of type qt with their f16 scales set: Q4_K w = d sc q - dmin m (d at 0, dmin at 2:
    dmin = 7.5 d centres the codes), Q6_K w = d sc (q - 32) (d at the block's last two bytes), Q4_0
    w = d (q - 8) (d at 0), Q8_0 w = d q (q signed; d at 0)."""
    b = BLOCK[qt]
    pool = rng.integers(0, 256, size=pool_bytes(qt) // b * b, dtype=np.uint8).reshape(-1, b)
    values = {Q4_K: (2e-5, 1.5e-4), Q6_K: (1e-5,), Q4_0: (2.5e-3,), Q8_0: (1.6e-4,)}[qt]
    for at, v in zip(SCALES[qt], values):
        pool[:, at:at + 2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
    return pool.reshape(-1)


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=sorted(ARCHS))
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--type", choices=("q4_k_m", "q4_0", "q8_0"), default="q4_k_m",
                    help="q4_0: Q4_0 everywhere but the head (Q6_K), as llama-quantize's Q4_0 chooses; q8_0: Q8_0 everywhere")
    ap.add_argument("--spread", action="store_true",
                    help="residual writers' scales / 64: a prompt's rows spread over the experts as a trained mixture's")
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
    q40, q80 = args.type == "q4_0", args.type == "q8_0"
    four = Q4_0 if q40 else Q8_0 if q80 else Q4_K  # every matrix's type but the head and the Q4_K_M mix's
    head = Q8_0 if q80 else Q6_K
    pools = {qt: make_pool(rng, qt) for qt in dict.fromkeys((four, head))}  # in this order: the same draws

    w = gguf.GGUFWriter(args.out, arch)
    add_header(w, cfg, 2 if q40 else 7 if q80 else 15)  # LLAMA_FTYPE_MOSTLY_Q4_0 / _Q8_0 / _Q4_K_M

    def blocks(name, qt, *shape, small=False):
        """shape [..., rows, K] of type qt, as a slice of the pool (bytes [..., rows, K / ELEMS * BLOCK]);
        small (with --spread): its blocks' f16 scales divided by 64 (a copy of the slice)."""
        b, e = BLOCK[qt], ELEMS[qt]
        nbytes = int(np.prod(shape[:-1])) * (shape[-1] // e) * b
        off = int(rng.integers(0, (pool_bytes(qt) // b * b - nbytes) // b + 1)) * b
        raw = pools[qt][off:off + nbytes]
        if small and args.spread:
            raw = raw.reshape(-1, b).copy()
            for a in SCALES[qt]:
                raw[:, a:a + 2] = (raw[:, a:a + 2].copy().view(np.float16) / np.float16(64)).view(np.uint8)
            raw = raw.reshape(-1)
        w.add_tensor(name, raw.reshape(*shape[:-1], shape[-1] // e * b), raw_dtype=qt)

    def f32(name, a):
        w.add_tensor(name, a.astype(np.float32))

    blocks("token_embd.weight", four, V, C)
    for i in range(L):
        p = "blk.%d." % i
        vd = Q6_K if more_bits(i, L) and four == Q4_K else four  # attn_v's and ffn_down's type
        f32(p + "attn_norm.weight", np.ones(C))
        blocks(p + "attn_q.weight", four, H * D, C)
        blocks(p + "attn_k.weight", four, Hk * D, C)
        blocks(p + "attn_v.weight", vd, Hk * D, C)
        blocks(p + "attn_output.weight", four, C, H * D, small=True)
        if arch != "llama":
            f32(p + "attn_q_norm.weight", np.ones(D))
            f32(p + "attn_k_norm.weight", np.ones(D))
        f32(p + "ffn_norm.weight", np.ones(C))
        if moe:
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            f32(p + "ffn_gate_inp.weight", rng.standard_normal((E, C), dtype=np.float32) * 0.02)
            blocks(p + "ffn_gate_exps.weight", four, E, Fe, C)
            blocks(p + "ffn_up_exps.weight", four, E, Fe, C)
            blocks(p + "ffn_down_exps.weight", vd, E, C, Fe, small=True)
        else:
            blocks(p + "ffn_gate.weight", four, F, C)
            blocks(p + "ffn_up.weight", four, F, C)
            blocks(p + "ffn_down.weight", vd, C, F, small=True)
    f32("output_norm.weight", np.ones(C))
    if not cfg["tie_word_embeddings"]:
        blocks("output.weight", head, V, C)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", args.out)


if __name__ == "__main__":
    main()
