#!/usr/bin/env python3
"""make_peft_reference.py - the fixture reference (layout of ../shared/fixtures/README.md) of a base model
with a PEFT adapter applied by HF transformers + peft (unmerged, float64, eager attention), on the token
sequences of an existing reference: `lmx check-reference BASE --adapter ADAPTER --reference OUT` then
compares lmx with transformers + peft on an adapter lmx trained (tests/peft_interop_check.sh).

usage: make_peft_reference.py BASE_DIR ADAPTER_DIR IDS_REFERENCE.safetensors OUT.safetensors
"""
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def main():
    base, adapter, ids_ref, out = sys.argv[1:5]
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float64, attn_implementation="eager")
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float64, attn_implementation="eager")
    model = PeftModel.from_pretrained(model, adapter).eval()
    ref = load_file(ids_ref)
    res = {}
    with torch.no_grad():
        for kind in ("short", "long"):
            seq = ref[f"{kind}_sequence"]
            res[f"{kind}_prompt"] = ref[f"{kind}_prompt"].contiguous()
            res[f"{kind}_sequence"] = seq.contiguous()
            res[f"{kind}_logits"] = model(seq[None, :-1].long()).logits[0].float().contiguous()
        prompts, lens = ref["batch_prompts"], ref["batch_lengths"]
        res["batch_prompts"], res["batch_lengths"] = prompts.contiguous(), lens.contiguous()
        res["batch_last_logits"] = torch.stack(
            [model(prompts[b:b + 1, :int(lens[b])].long()).logits[0, -1] for b in range(prompts.shape[0])]).float()
    save_file(res, out)
    print("wrote %s (transformers + peft %s)" % (out, __import__("peft").__version__))


if __name__ == "__main__":
    main()
