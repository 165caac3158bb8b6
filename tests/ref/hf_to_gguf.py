#!/usr/bin/env python3
"""Write a tiny HF fixture model directory as a GGUF file, following the conventions of llama.cpp's
convert_hf_to_gguf.py that a GGUF reader must undo: llama q/k rows permuted for interleaved RoPE,
gemma norm weights stored as (1 + w), llama3 RoPE scaling as a "rope_freqs" tensor, GGUF tensor
names and reversed dimension order.  Weights keep their bf16 values (gemma's 1 + w norms are F32).  The logits of the result must
match the fixture's HF reference (tests: reference_gguf_*).

usage: hf_to_gguf.py MODEL_DIR OUT.gguf        (needs numpy and the gguf package)
"""
import json
import math
import struct
import sys

import numpy as np
import gguf

src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{src}/config.json"))
mt = cfg["model_type"]
arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3"}[mt]


def load_bf16(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        assert v["dtype"] == "BF16", (k, v["dtype"])
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.uint16).reshape(v["shape"])
    return out


def bf16_to_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def permute(w, n_head):  # llama.cpp's HF -> GGUF row order for q/k (interleaved RoPE pairs)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


H, Hk = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
D = cfg.get("head_dim") or cfg["hidden_size"] // H
w = gguf.GGUFWriter(out, arch)
w.add_block_count(cfg["num_hidden_layers"])
w.add_context_length(cfg.get("max_position_embeddings", 2048))
w.add_embedding_length(cfg["hidden_size"])
w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(H)
w.add_head_count_kv(Hk)
w.add_key_length(D)
w.add_value_length(D)
w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
rope = cfg.get("rope_parameters") or {}
if "full_attention" in rope:
    rope = rope["full_attention"]
theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
w.add_rope_freq_base(theta)
scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
if scaling and scaling.get("rope_type", scaling.get("type")) == "linear":
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(scaling["factor"])
if cfg.get("sliding_window"):
    w.add_sliding_window(cfg["sliding_window"])
if cfg.get("attn_logit_softcapping"):
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
if cfg.get("final_logit_softcapping"):
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
w.add_bos_token_id(cfg.get("bos_token_id", 1))
w.add_eos_token_id(cfg.get("eos_token_id", 2))

tensors = {}
if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":  # as the converter does
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
    f = []
    for fr in freqs:
        wl = 2 * math.pi / fr
        if wl < old / high:
            f.append(1.0)
        elif wl > old / low:
            f.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            f.append(1.0 / ((1 - smooth) / factor + smooth))
    tensors["rope_freqs.weight"] = np.array(f, dtype=np.float32)

names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm"}
gemma = arch.startswith("gemma")
names["post_attention_layernorm"] = "post_attention_norm" if gemma else "ffn_norm"
names["pre_feedforward_layernorm"] = "ffn_norm"
for k, a in load_bf16(f"{src}/model.safetensors").items():
    if k == "model.embed_tokens.weight":
        name = "token_embd.weight"
    elif k == "model.norm.weight":
        name = "output_norm.weight"
    elif k == "lm_head.weight":
        name = "output.weight"
    else:
        parts = k.split(".")  # model.layers.N.<role...>.weight|bias
        role = ".".join(parts[3:-1])
        name = f"blk.{parts[2]}.{names[role]}.{parts[-1]}"
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        a = permute(a, H if ".attn_q." in name else Hk)
    if gemma and name.endswith("norm.weight"):
        a = bf16_to_f32(a) + np.float32(1.0)  # F32, as the converter keeps 1-D tensors (exact)
    tensors[name] = a
for name, a in tensors.items():
    if a.dtype == np.uint16:
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(name, a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out, len(tensors), "tensors")
