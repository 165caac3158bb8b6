#!/usr/bin/env python3
"""An exact float64 reference for a llama-architecture GGUF model: gguf-py dequantizes every tensor
(independently of lmx's kernels), the q/k rows are un-permuted back to the HF layout and a plain numpy
forward pass with HF's rotate-half RoPE computes teacher-forced logits.  Output: the top-K JSON
format of make_gguf_reference.py (token ids from that file, so both references use the same ids).

usage: numpy_llama_gguf.py MODEL.gguf IDS_FROM.json OUT.json [K]      (needs numpy and gguf)
"""
import json
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

path, ids_from, out = sys.argv[1], sys.argv[2], sys.argv[3]
K = int(sys.argv[4]) if len(sys.argv) > 4 else 8
r = gguf.GGUFReader(path)


def meta(name, default=None):
    f = r.fields.get(name)
    return default if f is None else f.parts[f.data[0]][0]


arch = bytes(r.fields["general.architecture"].parts[r.fields["general.architecture"].data[0]]).decode()
assert arch == "llama", arch
L = int(meta("llama.block_count"))
H = int(meta("llama.attention.head_count"))
Hk = int(meta("llama.attention.head_count_kv", H))
eps = float(meta("llama.attention.layer_norm_rms_epsilon", 1e-5))
theta = float(meta("llama.rope.freq_base", 10000.0))
W = {}
for t in r.tensors:
    a = dequantize(t.data, t.tensor_type).astype(np.float64)
    W[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
C = W["token_embd.weight"].shape[1]
D = C // H
out_w = W.get("output.weight", W["token_embd.weight"])


def unpermute(w, n_head):  # inverse of llama.cpp's HF -> GGUF row permutation
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos):  # x [T, h, D], rotate-half form
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def forward(ids):
    T = len(ids)
    x = W["token_embd.weight"][ids]
    pos = np.arange(T, dtype=np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = h @ unpermute(W[p + "attn_q.weight"], H).T
        k = h @ unpermute(W[p + "attn_k.weight"], Hk).T
        v = h @ W[p + "attn_v.weight"].T
        q = rope(q.reshape(T, H, D), pos)
        k = rope(k.reshape(T, Hk, D), pos)
        v = v.reshape(T, Hk, D)
        rep = H // Hk
        att = np.zeros((T, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh // rep].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // rep]
        x = x + att.reshape(T, C) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        g = h @ W[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return rms(x, W["output_norm.weight"]) @ out_w.T


src = json.load(open(ids_from))
rows = []
for pr in src["prompts"]:
    logits = forward(np.array(pr["ids"]))
    top = np.argsort(-logits, axis=1)[:, :K]
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    rows.append({"text": pr["text"], "ids": pr["ids"], "top_ids": top.tolist(),
                 "top_logits": [[float(logits[t, i]) for i in top[t]] for t in range(len(pr["ids"]))],
                 "logsumexp": lse.tolist()})
json.dump({"model": path.split("/")[-1], "reference": "float64 numpy forward on gguf-py dequantized weights", "top_k": K, "prompts": rows}, open(out, "w"))
print("wrote", out)
