#!/usr/bin/env python3
"""cuda_summary.py - the table of a bench/cuda_bench.sh run: per model, lmx's figures (`lmx bench
--json`) with the decode roofline (bytes read per token over the measured device copy bandwidth),
and the peers measured in the same run (HF transformers decode, llama.cpp pp512 / pp2048 / tg128).  "decode" returns every logit to the
host (lmx_context_eval); "generate" is the stream API with sampling, on the GPU's top-k candidates.

usage: bench/cuda_summary.py OUT_DIR
"""
import glob
import json
import os
import re
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(v, digits=0):
    return "-" if v is None or v < 0 else f"{v:,.{digits}f}"


def main():
    out = sys.argv[1]
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*.lmx.json"))):
        name = os.path.basename(path)[: -len(".lmx.json")]
        j = load_json(path)
        if not j:
            rows.append(f"| {name} | lmx | (failed) | | | | | | | |")
            continue
        bw = j.get("copy_bw") or 0
        tg = j["decode_ctx0_tok_s"]
        roof = j["bytes_per_token"] / bw if bw else 0
        roof_s = f"{100 * j['achieved_bw_ctx0'] / bw:.0f}% of {1 / roof:,.0f}" if bw else "-"
        rows.append(f"| {name} | lmx {j['dtype']} | {fmt(j['prefill512_tok_s'])} | {fmt(j['prefill2048_tok_s'])} | "
                    f"**{fmt(tg, 1)}** | {roof_s} | {fmt(j.get('generate_greedy_tok_s'), 1)} / "
                    f"{fmt(j.get('generate_sampled_tok_s'), 1)} | {fmt(j.get('decode_long_tok_s'), 1)} | "
                    f"{fmt(j['batch1_tok_s'])} / {fmt(j['batch8_tok_s'])} / {fmt(j['batch32_tok_s'])} | "
                    f"{j['peak_gpu_bytes'] / 2**30:.2f} GiB, load {j['load_s']:.2f} s |")
        hf = os.path.join(out, name + ".hf.txt")
        if os.path.exists(hf):
            m = re.search(r"decode .*?: ([0-9.]+) tok/s", open(hf).read())
            rows.append(f"| | HF transformers bf16 | | | {m.group(1) if m else '(failed)'} | | | | | |")
        for q in ("f16", "q4_0"):
            lj = load_json(os.path.join(out, f"{name}.llamacpp-{q}.json"))
            if not lj:
                continue
            by = {}
            for r in lj:
                key = "tg" if r.get("n_gen", 0) > 0 else f"pp{r.get('n_prompt')}"
                by[key] = (r["avg_ts"], r.get("stddev_ts", 0))
            cell = lambda k: f"{by[k][0]:,.0f} ± {by[k][1]:,.0f}" if k in by else "-"
            rows.append(f"| | llama.cpp {q.upper()} | {cell('pp512')} | {cell('pp2048')} | {cell('tg')} | | | | | |")
    gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else ""
    print(f"GPU: {gpu}")
    print("| model | engine | prefill 512 (tok/s) | prefill 2048 | decode ctx 0 | decode roofline (% of copy bw, of max tok/s) "
          "| generate greedy / sampled | decode ctx 4096 | batch 1 / 8 / 32 | memory |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
