#!/usr/bin/env python3
"""check_fused_hf.py - load an `lmx fuse` output with HF transformers and compare its logits with a
fixture reference (HF + peft logits of base + adapter, unmerged, float64).

Not run in CI: it needs torch and transformers (and peft for --base/--adapter).  Usage, from the project
root:

    F=../shared/fixtures/models
    build/lmx fuse $F/llama $F/llama_lora/peft_adapter /tmp/fused
    python3 tests/ref/check_fused_hf.py /tmp/fused $F/llama_lora/reference.safetensors \\
        [--tolerance 1e-2] [--base $F/llama --adapter $F/llama_lora/peft_adapter]

FUSED must be dense (a dense base, or a quantized one fused with --dequantize): transformers does not
read MLX-quantized weights.  The model runs in float64 with eager attention, as the references were
made.  It prints, for the short and long sequences (teacher forced: row t is the logits after
sequence[:t+1]) and for each batch prompt alone, the largest relative L2 error per position
||out - ref|| / ||ref||, and exits 1 when one exceeds --tolerance (default 1e-2, the bound
tests/fuse_check.sh derives for bf16 rounding of the merged weights).

With --base and --adapter (a PEFT folder) it also merges the adapter with peft's merge_and_unload in
float64, independently of lmx, and reports
  - per tensor, the largest difference between FUSED's weights and peft's merge, in bf16 ulps of
    peft's value (0.5 or less: lmx's bf16 weights are peft's merge correctly rounded);
  - the logits error of peft's merge itself (about 1e-6: it reproduces the reference) and of peft's
    merge rounded to bf16: what bf16 rounding alone costs, which FUSED's error should equal.
"""
import argparse
import math
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def load_model(path):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager")
    except TypeError:  # transformers < 4.56 names it torch_dtype
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager")


def rel_errors(model, ref):
    """{check: largest relative L2 error per position} against the reference logits."""
    model.eval()
    out = {}
    with torch.no_grad():
        for kind in ("short", "long"):
            seq = ref[f"{kind}_sequence"].long()
            want = ref[f"{kind}_logits"].double()
            got = model(seq[None, :-1]).logits[0].double()
            out[kind] = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
        prompts, lens = ref["batch_prompts"].long(), ref["batch_lengths"].long()
        want = ref["batch_last_logits"].double()
        errs = []
        for b in range(prompts.shape[0]):
            got = model(prompts[b:b + 1, :int(lens[b])]).logits[0, -1].double()
            errs.append(((got - want[b]).norm() / want[b].norm()).item())
        out["batch"] = max(errs)
    return out


def show(label, errs):
    print("%-34s %s" % (label, "  ".join("%s %.3e" % kv for kv in errs.items())))


def bf16_ulps(got, want):
    """Largest |got - want| in units of the bf16 ulp of want (8 significant bits)."""
    want = want.double()
    diff = (got.double() - want).abs()
    exp = torch.floor(torch.log2(want.abs().clamp_min(1e-30)))
    return (diff / torch.pow(2.0, exp - 7)).max().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fused")
    ap.add_argument("reference")
    ap.add_argument("--tolerance", type=float, default=1e-2)
    ap.add_argument("--base")
    ap.add_argument("--adapter")
    args = ap.parse_args()
    ref = load_file(args.reference)

    errs = rel_errors(load_model(args.fused), ref)
    show("fused (HF on lmx fuse output)", errs)

    if args.base and args.adapter:
        from peft import PeftModel

        merged = PeftModel.from_pretrained(load_model(args.base), args.adapter).merge_and_unload()
        theirs = merged.state_dict()
        fused_w = load_file(args.fused + "/model.safetensors")
        worst = (0.0, "")
        for name, w in fused_w.items():
            if name in theirs and w.shape == theirs[name].shape:
                u = bf16_ulps(w, theirs[name])
                worst = max(worst, (u, name))
        print("weights: fused vs peft merge_and_unload: at most %.2f bf16 ulp (%s)" % worst)
        show("peft merge (float64)", rel_errors(merged, ref))
        with torch.no_grad():
            for p in merged.parameters():
                p.copy_(p.to(torch.bfloat16).double())
        show("peft merge rounded to bf16", rel_errors(merged, ref))

    bad = {k: v for k, v in errs.items() if not math.isfinite(v) or v > args.tolerance}
    if bad:
        print("FAIL: relative error above %g: %s" % (args.tolerance, bad))
        return 1
    print("ok: within rel %g of %s" % (args.tolerance, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
