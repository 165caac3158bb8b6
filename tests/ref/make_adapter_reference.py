#!/usr/bin/env python3
"""Teacher-forced reference logits for a real LoRA adapter on a real GGUF model, computed by HF
transformers + peft: the GGUF loaded with AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)
(transformers dequantizes every tensor to float32) and the PEFT adapter applied with
PeftModel.from_pretrained (unmerged, as lmx applies it).

Writes the compact top-K format of make_gguf_reference.py (read by `lmx check-reference --reference
X.json`, src/cli/check_topk.c): per prompt the token ids and at every position the top-K next-token ids
with their logits and the logsumexp over the vocabulary.  Also records how far the adapter moves the
logits ("adapter_effect": the same model with the adapter disabled, measured at the reference's top-K
ids and on the logsumexp, as check_topk measures), so that a tolerance can be shown to be well below
the adapter's effect.

Prompts are tokenized with the tokenizer transformers builds from the GGUF; the text of each carries
its own <bos> (add_special_tokens=False), so the ids are exactly the ones written.

usage: make_adapter_reference.py MODEL.gguf ADAPTER_DIR OUT.json [--k K] [--base-out BASE.json]
                                 [--llama-ref REF.json]
  --base-out:  also write the reference of the model without the adapter (for checking transformers'
               GGUF loader against lmx without --adapter)
  --llama-ref: also print how far transformers' base model is from a llama.cpp top-K reference of the
               same GGUF (make_gguf_reference.py), on that reference's own token ids
"""
import argparse
import json
import os

import numpy as np
import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "<bos>The capital of France is",
    "<bos>Once upon a time, there was a little robot who",
    "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    "The capital of France is Paris.<end_of_turn>\n",
    "<bos><start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n"
    "Waves fold into foam,\nsalt wind carries gull voices,",
]

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("adapter")
ap.add_argument("out")
ap.add_argument("--k", type=int, default=8)
ap.add_argument("--base-out")
ap.add_argument("--llama-ref")
a = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(2)
mdir, mname = os.path.dirname(os.path.abspath(a.model)), os.path.basename(a.model)
tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mname)
# eager attention: the plain softmax(QK^T)V, as lmx computes it (sdpa would do as well in float32)
base = AutoModelForCausalLM.from_pretrained(mdir, gguf_file=mname, dtype=torch.float32, attn_implementation="eager")
base.eval()


def logits_of(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].double().numpy()  # [T, V]


def lse_of(lg):
    mx = lg.max(1, keepdims=True)
    return (np.log(np.exp(lg - mx).sum(1, keepdims=True)) + mx)[:, 0]


def row_of(text, ids, lg, K):
    top = np.argsort(-lg, axis=1)[:, :K]
    return {
        "text": text,
        "ids": [int(i) for i in ids],
        "top_ids": top.tolist(),
        "top_logits": [[float(lg[t, i]) for i in top[t]] for t in range(len(ids))],
        "logsumexp": lse_of(lg).tolist(),
    }


def topk_err(row, lg):
    """check_topk's measure of logits lg against a reference row: max |err| at the row's top-K ids, on
    the logsumexp."""
    e = max(abs(lg[t, i] - v) for t in range(len(row["ids"])) for i, v in zip(row["top_ids"][t], row["top_logits"][t]))
    return e, float(np.abs(lse_of(lg) - np.array(row["logsumexp"])).max())


if a.llama_ref:  # transformers' GGUF loader vs llama.cpp, without the adapter
    ref = json.load(open(a.llama_ref))
    for r in ref["prompts"]:
        lg = logits_of(base, r["ids"])
        e, el = topk_err(r, lg)
        am = int((lg.argmax(1) != np.array([t[0] for t in r["top_ids"]])).sum())
        print(f"HF base vs {os.path.basename(a.llama_ref)}: {len(r['ids'])} tokens  max|err| top-k {e:.3g}  "
              f"logsumexp {el:.3g}  argmax differences {am}")

model = PeftModel.from_pretrained(base, a.adapter)
model.eval()
cfg = model.peft_config["default"]
rows, base_rows, eff = [], [], []
for text in PROMPTS:
    ids = tok(text, add_special_tokens=False).input_ids
    lg = logits_of(model, ids)
    with model.disable_adapter():
        lg0 = logits_of(model, ids)
    r, r0 = row_of(text, ids, lg, a.k), row_of(text, ids, lg0, a.k)
    rows.append(r)
    base_rows.append(r0)
    e, el = topk_err(r, lg0)  # what check-reference without --adapter measures against this reference
    eff.append({"tokens": len(ids), "topk": e, "logsumexp": el, "full_vocab": float(np.abs(lg - lg0).max()),
                "argmax_changed": int((lg.argmax(1) != lg0.argmax(1)).sum())})
    print(f"{len(ids):2d} tokens  adapter effect: max|diff| at top-{a.k} {e:.3f}  logsumexp {el:.3f}  "
          f"full vocab {eff[-1]['full_vocab']:.3f}  argmax changed at {eff[-1]['argmax_changed']} positions")

src = (f"HF transformers {transformers.__version__} (gguf_file=, dequantized to float32, eager attention) + "
       f"peft {peft.__version__}, torch {torch.__version__} CPU")
json.dump({"model": mname, "adapter": os.path.basename(os.path.normpath(a.adapter)),
           "reference": src,
           "note": f"LoRA r={cfg.r}, alpha={cfg.lora_alpha} (scale {cfg.lora_alpha / cfg.r:g}) on "
                   f"{','.join(sorted(cfg.target_modules))}, unmerged.  adapter_effect: the same model with "
                   "the adapter disabled, max |logit difference| from this reference at its top-K ids and on "
                   "the logsumexp (what check-reference without --adapter measures), and over the full vocabulary",
           "adapter_effect": eff, "top_k": a.k, "prompts": rows}, open(a.out, "w"))
print("wrote", a.out, [len(r["ids"]) for r in rows])
if a.base_out:
    json.dump({"model": mname, "reference": src + ", no adapter", "top_k": a.k, "prompts": base_rows},
              open(a.base_out, "w"))
    print("wrote", a.base_out)
