#!/usr/bin/env python3
"""Write a tiny HF fixture model directory as a GGUF file, following the conventions of llama.cpp's
convert_hf_to_gguf.py (llama-cpp-python 0.3.36's vendor/llama.cpp, read for this script) that a GGUF
reader must undo: llama q/k rows permuted for interleaved RoPE, gemma2/3 norm weights stored as (1 + w)
(gemma4's as they are), llama3 RoPE scaling as a "rope_freqs" tensor, gemma4's proportional RoPE as a
"rope_freqs" of 1 (rotated pairs) and 1e30 (the rest), qwen3moe's per-expert weights stacked into 3-D
ffn_{gate,up,down}_exps [E, rows, cols], gemma4's fused experts kept as ffn_gate_up_exps, per-layer
sizes (gemma4's kv heads, double-wide MLPs) as arrays of one value per layer, tensor names from gguf-py's
own tables (gguf.TENSOR_NAMES) and reversed dimension order.  The logits of the result must match the
fixture's HF reference (tests: reference_gguf_*).

Tensor types: by default llama, qwen2, qwen3, gemma2 and gemma3 keep their bf16 values (gemma2/3's
1 + w norms are F32), as the files in tests/data/gguf were first written.  qwen3moe and gemma4, and
every model with --outtype, follow the converter's rules: 1-D tensors, norms, routers (ffn_gate_inp)
and names not ending in ".weight" F32, the other matrices OUTTYPE (bf16 by default; f16 and f32 convert
the bf16 values; quantized copies: quantize_gguf.py).

--placeholder-vocab writes a vocabulary of numbered tokens (llama.cpp loads no model without one) for
random-weight models made for benchmarks, which have no tokenizer (bench/gemma4_bench.sh).

usage: hf_to_gguf.py MODEL_DIR OUT.gguf [--outtype bf16|f16|f32] [--placeholder-vocab]
       (needs numpy and the gguf package)
"""
import argparse
import json
import math
import struct

import numpy as np
import gguf

from gguf_vocab import add_placeholder_vocab

T = gguf.MODEL_TENSOR
ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("src")
ap.add_argument("out")
ap.add_argument("--outtype", choices=["bf16", "f16", "f32"])
ap.add_argument("--placeholder-vocab", action="store_true")
args = ap.parse_args()
src, out = args.src, args.out
cfg = json.load(open(f"{src}/config.json"))
mt = cfg["model_type"]
arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3",
        "qwen3_moe": "qwen3moe", "gemma4_text": "gemma4"}[mt]
converter_types = args.outtype is not None or arch in ("qwen3moe", "gemma4")
outtype = args.outtype or "bf16"


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
L = cfg["num_hidden_layers"]
w = gguf.GGUFWriter(out, arch)
w.add_block_count(L)
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
scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default", "proportional") else None)
if scaling and scaling.get("rope_type", scaling.get("type")) == "linear":
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(scaling["factor"])
if cfg.get("sliding_window"):
    w.add_sliding_window(cfg["sliding_window"])
if cfg.get("attn_logit_softcapping"):
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
if cfg.get("final_logit_softcapping"):
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
if args.placeholder_vocab:
    add_placeholder_vocab(w, cfg["vocab_size"])
w.add_bos_token_id(cfg.get("bos_token_id", 1))
w.add_eos_token_id(cfg.get("eos_token_id", 2))

# the experts (the converter's TextModel keys: num_local_experts / num_experts, num_experts_per_tok /
# top_k_experts; Qwen2MoeModel's and Gemma4Model's expert_feed_forward_length)
n_experts = cfg.get("num_local_experts") or cfg.get("num_experts")
if n_experts:
    w.add_expert_count(n_experts)
    w.add_expert_used_count(cfg.get("num_experts_per_tok") or cfg["top_k_experts"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])

tensors = {}
if arch == "gemma4":  # as Gemma4Model.set_gguf_parameters and generate_extra_tensors
    types = cfg["layer_types"]
    swa = [t == "sliding_attention" for t in types]
    shared = cfg["num_kv_shared_layers"]
    plc = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
    D_full = cfg.get("global_head_dim") or next(v["head_dim"] for k, v in sorted(plc.items())
                                                if types[k] == "full_attention" and "head_dim" in v)
    Hk_full = cfg.get("num_global_key_value_heads") or next(
        (v["num_key_value_heads"] for k, v in sorted(plc.items())
         if types[k] == "full_attention" and "num_key_value_heads" in v), None)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    w.add_sliding_window_pattern(swa)
    w.add_key_length(D_full)
    w.add_value_length(D_full)
    w.add_key_length_swa(D)
    w.add_value_length_swa(D)
    if cfg.get("use_double_wide_mlp"):
        F = cfg["intermediate_size"]
        w.add_feed_forward_length([F if l < L - shared else 2 * F for l in range(L)])
    if Hk_full is not None:
        w.add_head_count_kv([Hk if s else Hk_full for s in swa])
    w.add_rope_dimension_count(D_full)
    w.add_rope_dimension_count_swa(D)
    w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    assert rope["rope_type"] == "proportional"
    n_rot = int(D_full * rope["partial_rotary_factor"] / 2)
    tensors["rope_freqs.weight"] = np.array([1.0] * n_rot + [1e30] * (D_full // 2 - n_rot), dtype=np.float32)
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

gemma = arch in ("gemma2", "gemma3", "gemma4")
# HF name (without model.layers.N. and the suffix) -> GGUF tensor, as gguf-py's tensor_mapping.py maps them
names = {"input_layernorm": T.ATTN_NORM, "self_attn.q_proj": T.ATTN_Q, "self_attn.k_proj": T.ATTN_K,
         "self_attn.v_proj": T.ATTN_V, "self_attn.o_proj": T.ATTN_OUT, "self_attn.q_norm": T.ATTN_Q_NORM,
         "self_attn.k_norm": T.ATTN_K_NORM, "mlp.gate_proj": T.FFN_GATE, "mlp.up_proj": T.FFN_UP,
         "mlp.down_proj": T.FFN_DOWN, "post_feedforward_layernorm": T.FFN_POST_NORM,
         "post_attention_layernorm": T.ATTN_POST_NORM if gemma else T.FFN_NORM,
         "pre_feedforward_layernorm": T.FFN_PRE_NORM,
         # qwen3moe (the per-expert weights are stacked below)
         "mlp.gate": T.FFN_GATE_INP,
         # gemma4
         "router.proj": T.FFN_GATE_INP, "experts.gate_up_proj": T.FFN_GATE_UP_EXP, "experts.down_proj": T.FFN_DOWN_EXP,
         "pre_feedforward_layernorm_2": T.FFN_PRE_NORM_2, "post_feedforward_layernorm_1": T.FFN_POST_NORM_1,
         "post_feedforward_layernorm_2": T.FFN_POST_NORM_2, "per_layer_input_gate": T.PER_LAYER_INP_GATE,
         "per_layer_projection": T.PER_LAYER_PROJ, "post_per_layer_input_norm": T.PER_LAYER_POST_NORM,
         "layer_scalar": T.LAYER_OUT_SCALE}
# Gemma4Model.modify_tensors: the router's input scale and the per-expert scales as ".scale" of these
scales = {"router.scale": T.FFN_GATE_INP, "router.per_expert_scale": T.FFN_DOWN_EXP}
top = {"model.embed_tokens.weight": T.TOKEN_EMBD, "model.norm.weight": T.OUTPUT_NORM, "lm_head.weight": T.OUTPUT,
       "model.embed_tokens_per_layer.weight": T.PER_LAYER_TOKEN_EMBD,
       "model.per_layer_model_projection.weight": T.PER_LAYER_MODEL_PROJ,
       "model.per_layer_projection_norm.weight": T.PER_LAYER_PROJ_NORM}
router = set()  # GGUF names the converter keeps F32 as routers
experts = {}  # (layer, proj) -> {expert: array}
for k, a in load_bf16(f"{src}/model.safetensors").items():
    if k in top:
        name = gguf.TENSOR_NAMES[top[k]] + ".weight"
    else:
        parts = k.split(".")  # model.layers.N.<role...>[.weight|.bias]
        bid = int(parts[2])
        if parts[3:5] == ["mlp", "experts"] and parts[5].isdigit():  # qwen3moe: mlp.experts.E.gate_proj.weight
            experts.setdefault((bid, parts[6]), {})[int(parts[5])] = a
            continue
        role, kind = ".".join(parts[3:]), ""
        if role not in names and role not in scales:
            role, kind = ".".join(parts[3:-1]), "." + parts[-1]
        if role in scales:
            name = gguf.TENSOR_NAMES[scales[role]].format(bid=bid) + ".scale"
        else:
            name = gguf.TENSOR_NAMES[names[role]].format(bid=bid) + (kind or ".weight")
        if names.get(role) == T.FFN_GATE_INP:
            router.add(name)
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        a = permute(a, H if ".attn_q." in name else Hk)
    if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
        a = bf16_to_f32(a) + np.float32(1.0)  # F32, as the converter keeps 1-D tensors (exact)
    tensors[name] = a
stacked = {"gate_proj": T.FFN_GATE_EXP, "up_proj": T.FFN_UP_EXP, "down_proj": T.FFN_DOWN_EXP}
for (bid, proj), per in sorted(experts.items()):  # Qwen2MoeModel.modify_tensors: torch.stack(dim=0)
    assert sorted(per) == list(range(n_experts)), (bid, proj, sorted(per))
    tensors[gguf.TENSOR_NAMES[stacked[proj.split(".")[0]]].format(bid=bid) + ".weight"] = np.stack(
        [per[e] for e in range(n_experts)])


def stored(name, a):
    """(array, raw ggml type or None) as the file holds it"""
    if a.dtype != np.uint16:
        return a, None
    if converter_types and (a.ndim <= 1 or name.endswith("_norm.weight") or name in router
                            or not name.endswith(".weight")):
        return bf16_to_f32(a), None
    if converter_types and outtype == "f32":
        return bf16_to_f32(a), None
    if converter_types and outtype == "f16":
        return bf16_to_f32(a).astype(np.float16), None
    return a, gguf.GGMLQuantizationType.BF16


if converter_types:
    w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "f32": gguf.LlamaFileType.ALL_F32}[outtype])
for name, a in tensors.items():
    a, raw = stored(name, a)
    if raw is not None:
        w.add_tensor(name, a, raw_shape=a.shape, raw_dtype=raw)
    else:
        w.add_tensor(name, a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out, len(tensors), "tensors")
