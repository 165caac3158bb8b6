#!/usr/bin/env python3
"""The same measurement as bench_model.c, with llama.cpp (llama-cpp-python) on the same machine:
prefill of N random ids in one eval (best of REPS after a warm-up), then greedy single-token decode.
usage: llamacpp_bench.py MODEL.gguf [PROMPT] [TOKENS] [THREADS] [REPS]"""
import json
import sys
import time

import numpy as np
from llama_cpp import Llama
import llama_cpp

path = sys.argv[1]
prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
llm = Llama(model_path=path, n_ctx=prompt + tokens + 8, n_batch=prompt, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False)
V = llm.n_vocab()
s, ids = 12345, []
for _ in range(prompt):
    s = (s * 1103515245 + 12345) & 0xFFFFFFFF
    ids.append((s >> 8) % V)
best = 1e30
for r in range(reps + 1):
    llm.reset()
    a = time.perf_counter()
    llm.eval(ids)
    dt = time.perf_counter() - a
    if r > 0:
        best = min(best, dt)
decode = 0.0
nxt = int(np.argmax(llm.eval_logits[-1]))
for _ in range(tokens):
    a = time.perf_counter()
    llm.eval([nxt])
    decode += time.perf_counter() - a
    nxt = int(np.argmax(llm.eval_logits[-1]))
print(json.dumps({"engine": "llama.cpp " + llama_cpp.__version__, "model": path, "prompt": prompt,
                  "prefill_tok_s": round(prompt / best, 2), "decode_tok_s": round(tokens / decode, 2)}))
