#!/usr/bin/env python3
"""write_gguf.py - write the weights of a model directory made by make_random_model.py as an F16 (or
Q4_0) GGUF file that llama.cpp loads, so that llama.cpp is timed on the same weights as lmx.
Q4_0 blocks come from gguf-py's reference quantizer (numpy), every matrix in Q4_0.  qwen3_moe is written
as llama.cpp's converter writes it (architecture "qwen3moe"): the router as ffn_gate_inp, each layer's
experts stacked into ffn_gate_exps / ffn_up_exps [E, F, C] and ffn_down_exps [E, C, F].

The vocabulary is a placeholder (llama.cpp's benchmarks feed token ids, or text by byte fallback): "llama"
(SentencePiece) with <unk>, <s>, </s>, the 256 byte tokens and numbered tokens.  Q/K rows are written as stored (a speed
benchmark does not depend on the RoPE row order).

usage: bench/write_gguf.py MODEL_DIR OUT.gguf [q4_0]    (needs gguf-py on PYTHONPATH, torch, safetensors)
"""
import glob
import json
import os
import sys

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from gguf_vocab import add_placeholder_vocab  # noqa: E402


def gguf_arch(cfg):
    """The GGUF architecture of an HF config (llama, qwen3: the same names)."""
    return {"qwen3_moe": "qwen3moe"}.get(cfg["model_type"], cfg["model_type"])


def add_header(w, cfg, file_type):
    """The model metadata of config cfg and the placeholder vocabulary (byte tokens: text tokenizes by byte
    fallback, llama-completion's prompt), to gguf.GGUFWriter w; file_type: llama.cpp's LLAMA_FTYPE."""
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    D = cfg.get("head_dim", C // H)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    if gguf_arch(cfg) == "qwen3moe":
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_file_type(file_type)
    add_placeholder_vocab(w, cfg["vocab_size"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def main():
    import torch  # here, so that random_gguf.py can use add_header without torch
    from safetensors.torch import load_file

    src, out = sys.argv[1], sys.argv[2]
    q4 = len(sys.argv) > 3 and sys.argv[3] == "q4_0"
    cfg = json.load(open(os.path.join(src, "config.json")))
    arch = gguf_arch(cfg)
    w = gguf.GGUFWriter(out, arch)
    add_header(w, cfg, 2 if q4 else 1)  # mostly Q4_0 / mostly F16

    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    tensors = {}
    for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors.update(load_file(f))
    if arch == "qwen3moe":  # experts stacked per layer and projection, in expert order
        E = cfg["num_experts"]
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d.mlp." % i
            tensors[p + "ffn_gate_inp.weight"] = tensors.pop(p + "gate.weight")
            for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                tensors[p + g + ".weight"] = torch.stack([tensors.pop(p + "experts.%d.%s.weight" % (e, proj))
                                                          for e in range(E)])
        names.update({"mlp." + n: n for n in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})
    for name, t in tensors.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            parts = name.split(".")  # model.layers.N.<module>.weight
            gname = "blk.%s.%s.weight" % (parts[2], names[".".join(parts[3:-1])])
        if t.dim() == 1 or "ffn_gate_inp" in gname:  # norms and the router stay f32, as llama.cpp's converter does
            w.add_tensor(gname, t.to(torch.float32).numpy())
        elif q4:
            qt = gguf.GGMLQuantizationType.Q4_0
            w.add_tensor(gname, gguf.quants.quantize(t.to(torch.float32).numpy(), qt), raw_dtype=qt)
        else:
            w.add_tensor(gname, t.to(torch.float16).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
