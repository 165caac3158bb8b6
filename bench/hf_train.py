#!/usr/bin/env python3
"""hf_train.py - the HF transformers + peft peer for `lmx bench-train`: LoRA (rank R, alpha 2R, dropout 0,
all seven projections) on a bf16 base with SDPA attention, AdamW on the LoRA parameters, B random
sequences of T tokens a step (labels = the inputs, shifted inside the model, as `lmx bench-train`).

Prints one JSON line: median step seconds over STEPS steps after one warm-up, tokens/s, and
torch.cuda.max_memory_allocated in GiB (weights included).

usage: bench/hf_train.py MODEL_DIR [--rank R] [--batch B] [--seq T] [--steps N] [--checkpointing]
"""
import argparse
import json
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--checkpointing", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to("cuda")
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    vocab = model.config.vocab_size
    times = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps + 1):
        ids = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"engine": "hf+peft", "batch": args.batch, "seq": args.seq, "checkpointing": args.checkpointing,
                      "step_s": round(med, 4), "tokens_per_s": round(args.batch * args.seq / med, 1),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "transformers": __import__("transformers").__version__, "peft": __import__("peft").__version__}))


if __name__ == "__main__":
    main()
