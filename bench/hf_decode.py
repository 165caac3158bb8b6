#!/usr/bin/env python3
"""hf_decode.py - the HF transformers peer for `lmx bench`: a plain bf16 greedy decode loop with the
model's KV cache (DynamicCache, default attention), one token per step, on the GPU.

Prints prefill tok/s for a PROMPT-token prompt and the median decode tok/s over STEPS steps after it
(each step synchronised, like `lmx bench`'s decode at context ~PROMPT).

usage: bench/hf_decode.py MODEL_DIR [--steps N] [--prompt N]
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda").eval()
    vocab = model.config.vocab_size
    ids = torch.randint(500, 1500 if vocab > 2000 else vocab, (1, args.prompt), device="cuda")
    times = []
    with torch.inference_mode():
        for rep in range(2):  # the first pass warms up kernels and the allocator
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            torch.cuda.synchronize()
            t_prefill = time.perf_counter() - t0
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    import transformers
    print(f"hf transformers {transformers.__version__} torch {torch.__version__}: {args.model}")
    print(f"  prefill {args.prompt} tokens: {args.prompt / t_prefill:.0f} tok/s")
    print(f"  decode (median of {args.steps} steps after {args.prompt} tokens): {1.0 / med:.1f} tok/s "
          f"({med * 1e3:.2f} ms/token)")


if __name__ == "__main__":
    main()
