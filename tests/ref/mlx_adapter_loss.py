#!/usr/bin/env python3
"""mlx_adapter_loss.py - the mean next-token cross-entropy of a JSON Lines file of {"text"} lines, computed
by mlx-lm with a LoRA adapter (mlx-lm's own loader and LoRA layers) in float32, for tests/train_check.sh:
an adapter that lmx trained and wrote in mlx-lm's layout must give mlx-lm the loss `lmx eval` gives, and
one that `mlx_lm lora` trained must give lmx the loss mlx-lm gives.

Each line is encoded by the model's tokenizer (transformers, as mlx-lm loads it) with the EOS id appended,
as mlx-lm's text datasets and lmx's data loader do; the loss is the mean over every predicted token.

usage: mlx_adapter_loss.py MODEL_DIR ADAPTER_DIR DATA.jsonl      (prints the loss)
"""
import json
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import load


def main():
    model_dir, adapter, data = sys.argv[1:4]
    model, tok = load(model_dir, adapter_path=adapter)
    model.set_dtype(mx.float32)  # a bf16 checkpoint computes in f32, as lmx's cpu backend does
    total, count = 0.0, 0
    for line in open(data):
        if not line.strip():
            continue
        ids = tok.encode(json.loads(line)["text"])
        if not ids or ids[-1] != tok.eos_token_id:
            ids.append(tok.eos_token_id)
        x = mx.array([ids[:-1]])
        logits = model(x).astype(mx.float32)
        ce = nn.losses.cross_entropy(logits[0], mx.array(ids[1:]), reduction="sum")
        total += ce.item()
        count += len(ids) - 1
    print("%.6f" % (total / count))


if __name__ == "__main__":
    main()
