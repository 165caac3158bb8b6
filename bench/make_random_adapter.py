#!/usr/bin/env python3
"""make_random_adapter.py - write a random LoRA adapter in HF PEFT's layout for a model directory, for
`lmx bench --adapter` (numpy + safetensors).  Every decoder layer's seven projections (or --targets)
get A [r, in] ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming init) and B [out, r] ~ N(0, std) (a trained
adapter's B is nonzero), in f32; adapter_config.json says r, lora_alpha = 2r (scale 2), target_modules.

usage: bench/make_random_adapter.py MODEL_DIR OUT_DIR [--rank 16] [--seed 0] [--targets q,k,v,o,gate,up,down]
       bench/make_random_adapter.py - OUT_DIR --shape C,F,L,H,Hk,D [...]     (no config.json, e.g. a GGUF base)
"""
import argparse
import json
import os

import numpy as np
from safetensors.numpy import save_file

MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--rank", type=int, default=16)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--std", type=float, default=0.01)
ap.add_argument("--targets", default="q,k,v,o,gate,up,down")
ap.add_argument("--shape", help="C,F,L,H,Hk,D instead of MODEL_DIR/config.json")
a = ap.parse_args()
if a.shape:
    C, F, L, H, Hk, D = (int(v) for v in a.shape.split(","))
else:
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    cfg = cfg.get("text_config", cfg)
    C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, Hk = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or C // H
shape = {"q": (H * D, C), "k": (Hk * D, C), "v": (Hk * D, C), "o": (C, H * D), "gate": (F, C), "up": (F, C),
         "down": (C, F)}
g = np.random.default_rng(a.seed)
r = a.rank
tensors = {}
targets = a.targets.split(",")
for l in range(L):
    for t in targets:
        n_out, n_in = shape[t]
        key = f"base_model.model.model.layers.{l}.{MODULES[t]}"
        bound = 1.0 / n_in ** 0.5
        tensors[f"{key}.lora_A.weight"] = g.uniform(-bound, bound, (r, n_in)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = (g.standard_normal((n_out, r)) * a.std).astype(np.float32)
os.makedirs(a.out, exist_ok=True)
save_file(tensors, os.path.join(a.out, "adapter_model.safetensors"), metadata={"format": "pt"})
json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": [MODULES[t].split(".")[1] for t in targets],
           "use_rslora": False, "use_dora": False, "bias": "none", "modules_to_save": None,
           "base_model_name_or_path": a.model, "task_type": "CAUSAL_LM"},
          open(os.path.join(a.out, "adapter_config.json"), "w"), indent=2)
print(f"{a.out}: rank {r}, {len(tensors) // 2} projections")
