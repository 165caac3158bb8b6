#!/usr/bin/env python3
"""gpu_timeline.py - where a GPU idles, from bench/gpu_timeline.c's records.

A window of the trace (the span from one launch of the marker kernel to the next, e.g. one training
step from its embedding lookup): its wall time, the time some kernel, copy or memset ran (the union
over streams), the kernels' time by name, the longest idle gaps with the GPU work on either side and the
host API calls that overlap each gap, and the host API time by call.

With --chain REGEX instead: over the whole trace, the median for each kernel name that REGEX matches of its
launch's end less the end of the kernel launched before it.  With programmatic dependent launch the launches
overlap, and this is what each costs the chain of a decode step (its own span is not).

usage: bench/gpu_timeline.py TRACE.tsv [--marker REGEX] [--window N] [--gaps N] [--chain REGEX]
  --marker: kernel name pattern that starts a window (default k_embed); --window: which one (default -2,
  the last complete one; -1 runs to the trace's end)
"""
import argparse
import re
import statistics
from collections import defaultdict


def load(path):
    gpu, api = [], []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t", 4)
            if len(parts) < 5:
                continue
            kind, start, end, stream, name = parts
            rec = (int(start), int(end), kind, int(stream), name)
            (gpu if kind in "KCS" else api).append(rec)
    gpu.sort()
    api.sort()
    return gpu, api


def short(name, n=60):
    name = re.sub(r"\(.*", "", name)  # a kernel's parameter list
    return name if len(name) <= n else name[: n - 3] + "..."


def chain(gpu, pattern):
    ks = [r for r in gpu if r[2] == "K"]  # by start
    by = defaultdict(list)
    for prev, r in zip(ks, ks[1:]):
        if re.search(pattern, r[4]):
            by[short(r[4])].append((r[1] - prev[1]) / 1e3)
    print("us on the chain (median of end - previous end), count, total ms:")
    for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {statistics.median(v):8.2f} {len(v):6d} {sum(v) / 1e3:8.2f}  {k}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--marker", default="k_embed")
    ap.add_argument("--window", type=int, default=-2)
    ap.add_argument("--gaps", type=int, default=20)
    ap.add_argument("--chain")
    a = ap.parse_args()
    gpu, api = load(a.trace)
    if a.chain:
        return chain(gpu, a.chain)
    marks = [r[0] for r in gpu if r[2] == "K" and re.search(a.marker, r[4])]
    if not marks:
        raise SystemExit(f"no kernel matches {a.marker!r}")
    bounds = marks + [max(r[1] for r in gpu)]
    i = a.window % len(marks)
    lo, hi = bounds[i], bounds[i + 1]
    win = [r for r in gpu if lo <= r[0] < hi]
    print(f"window {i} of {len(marks)}: {(hi - lo) / 1e6:.3f} ms, {len(win)} GPU records")

    busy, gaps, cur_end, prev = 0, [], lo, None
    for r in win:
        if r[0] > cur_end:
            gaps.append((r[0] - cur_end, cur_end, r[0], prev, r))
        if r[1] > cur_end:
            busy += r[1] - max(r[0], cur_end)
            cur_end = r[1]
        prev = r
    wall = hi - lo
    print(f"busy {busy / 1e6:.3f} ms ({100 * busy / wall:.1f}%), idle {(wall - busy) / 1e6:.3f} ms in {len(gaps)} gaps")
    hist = defaultdict(lambda: [0, 0])
    for g in gaps:
        b = "<2us" if g[0] < 2e3 else "2-10us" if g[0] < 1e4 else "10-100us" if g[0] < 1e5 else ">=100us"
        hist[b][0] += 1
        hist[b][1] += g[0]
    for b in ("<2us", "2-10us", "10-100us", ">=100us"):
        if b in hist:
            print(f"  gaps {b:9s} {hist[b][0]:6d}  {hist[b][1] / 1e6:8.3f} ms")

    by = defaultdict(lambda: [0, 0])
    for r in win:
        k = short(r[4]) if r[2] == "K" else r[4].split(",")[0]
        by[k][0] += 1
        by[k][1] += r[1] - r[0]
    print("\nGPU time by name (ms, count):")
    for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {t / 1e6:9.3f} {n:6d}  {k}")

    print(f"\nlongest {a.gaps} gaps (us): before -> after; host calls overlapping")
    for g in sorted(gaps, reverse=True)[: a.gaps]:
        d, s, e, p, n = g
        calls = defaultdict(int)
        for r in api:
            if r[0] < e and r[1] > s and not r[4].startswith("cuGetProcAddress"):
                calls[r[4]] += min(r[1], e) - max(r[0], s)
        host = ", ".join(f"{k} {v / 1e3:.0f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:4])
        print(f"  {d / 1e3:8.1f} at {(s - lo) / 1e6:8.3f} ms: {short(p[4], 40) if p else '-'} -> {short(n[4], 40)}; {host}")

    calls = defaultdict(lambda: [0, 0])
    for r in api:
        if lo <= r[0] < hi:
            calls[r[4]][0] += 1
            calls[r[4]][1] += r[1] - r[0]
    print("\nhost API time by call (ms, count):")
    for k, (n, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {t / 1e6:9.3f} {n:6d}  {k}")


if __name__ == "__main__":
    main()
