#!/usr/bin/env python3
"""Reference logits for lmx's context-length option (every layer a rotating cache of N positions).

Loads a fixture model with HF transformers, changes its config so that every layer is a sliding-window
layer of N positions (what lmx_context_params.n_ctx = N means), and computes teacher-forced float64
logits of the fixture's long_sequence.  Writes DIR/config.json (the changed config, for the record)
and DIR/reference.safetensors in the fixtures' layout (long_* only).

usage: make_window_reference.py FIXTURE_DIR WINDOW OUT_DIR      (run where torch + transformers are)
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

src, window, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ref = load_file(f"{src}/reference.safetensors")
cfg = AutoConfig.from_pretrained(src)
cfg.use_sliding_window = True
cfg.sliding_window = window
cfg.max_window_layers = 0
cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
model = AutoModelForCausalLM.from_pretrained(src, config=cfg, torch_dtype=torch.float64,
                                             attn_implementation="eager").eval()
seq = ref["long_sequence"].long()
with torch.no_grad():
    logits = model(seq[None, :-1]).logits[0].float()
import os
os.makedirs(out, exist_ok=True)
save_file({"long_prompt": ref["long_prompt"], "long_sequence": ref["long_sequence"],
           "long_logits": logits.contiguous()}, f"{out}/reference.safetensors")
with open(f"{out}/config.json", "w") as f:
    f.write(cfg.to_json_string())
full = ref["long_logits"]
print(json.dumps({"window": window, "positions": logits.shape[0],
                  "max_diff_vs_full_attention": float((logits - full).abs().max()),
                  "transformers": __import__("transformers").__version__}))
