#!/usr/bin/env python3
"""write_lora_gguf.py - write a PEFT LoRA adapter (bench/make_random_adapter.py's output) as the LoRA GGUF
file llama.cpp's `--lora` loads, so that llama.cpp is timed with the same adapter as lmx.

Layout (llama.cpp's adapter loader): general.type "adapter", general.architecture "llama",
adapter.type "lora", adapter.lora.alpha; per projection `blk.N.<tensor>.weight.lora_a` (PEFT's A, [r, in])
and `.lora_b` (PEFT's B, [out, r]) in f32.  Q/K rows stay as stored, as bench/write_gguf.py writes the base.

usage: bench/write_lora_gguf.py ADAPTER_DIR OUT.gguf        (needs gguf-py on PYTHONPATH, numpy, safetensors)
"""
import json
import os
import re
import sys

from safetensors.numpy import load_file

import gguf

GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "adapter_config.json")))
    tensors = load_file(os.path.join(src, "adapter_model.safetensors"))
    w = gguf.GGUFWriter(out, "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(cfg["lora_alpha"]))
    key = re.compile(r".*layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
    n = 0
    for name in sorted(tensors):
        m = key.match(name)
        if not m or m.group(3) not in GGUF_NAMES:
            sys.exit("write_lora_gguf: unexpected tensor " + name)
        w.add_tensor("blk.%s.%s.weight.lora_%s" % (m.group(1), GGUF_NAMES[m.group(3)], m.group(4).lower()),
                     tensors[name].astype("float32"))
        n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %d tensors, alpha %s" % (out, n, cfg["lora_alpha"]))


if __name__ == "__main__":
    main()
