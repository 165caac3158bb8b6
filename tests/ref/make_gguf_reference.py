#!/usr/bin/env python3
"""Teacher-forced reference logits for a real GGUF model, computed by llama.cpp (llama-cpp-python).

For each prompt: llama.cpp's token ids (with BOS where the model adds it), and at every position the
top-K next-token ids with their logits and the logsumexp over the whole vocabulary.  Stored compactly
as JSON (full logits of a 262k vocabulary would be megabytes per position).

usage: make_gguf_reference.py MODEL.gguf OUT.json [K]
"""
import json
import math
import sys

import numpy as np
from llama_cpp import Llama
import llama_cpp

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Water boils at 100 degrees Celsius. At high altitude it boils at a",
]

path, out = sys.argv[1], sys.argv[2]
K = int(sys.argv[3]) if len(sys.argv) > 3 else 8
llm = Llama(model_path=path, n_ctx=256, logits_all=True, n_threads=2, n_batch=256, verbose=False, seed=0,
            type_k=0, type_v=0, flash_attn=False)  # float32 KV cache: one source of difference fewer
rows = []
for text in PROMPTS:
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float64)  # [T, V]
    top = np.argsort(-logits, axis=1)[:, :K]
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    rows.append({
        "text": text,
        "ids": [int(i) for i in ids],
        "top_ids": top.tolist(),
        "top_logits": [[float(logits[t, i]) for i in top[t]] for t in range(len(ids))],
        "logsumexp": lse.tolist(),
    })
json.dump({"model": path.split("/")[-1], "reference": "llama.cpp CPU via llama-cpp-python " + llama_cpp.__version__,
           "note": "llama.cpp multiplies quantized weights with 8-bit-quantized activations, so it differs from an "
                   "exact float32 dequantized product by up to about 1% of the logit scale",
           "top_k": K, "prompts": rows}, open(out, "w"))
print("wrote", out, [len(r["ids"]) for r in rows])
