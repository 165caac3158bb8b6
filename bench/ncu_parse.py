#!/usr/bin/env python3
"""ncu_parse.py - one line per kernel from an Nsight Compute text report made with
    ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__warps_active.avg.pct_of_peak_sustained_active -c N PROGRAM ...
(duration in microseconds, DRAM throughput and achieved occupancy in percent).  ncu runs each kernel
alone with its clocks locked and caches flushed, so durations are for comparing kernels, not totals.

usage: bench/ncu_parse.py REPORT.txt
"""
import re
import sys

METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__warps_active.avg.pct_of_peak_sustained_active")


def main():
    text = open(sys.argv[1]).read()
    for block in re.split(r"\n  (?=\S)", text)[1:]:
        name = block.split("(")[0].strip()[:50]
        m = dict(re.findall(r"(%s)\s+\S+\s+([\d.,]+)" % "|".join(re.escape(k) for k in METRICS), block))
        print(f"{name:50s} t={m.get(METRICS[0])} dram%={m.get(METRICS[1])} occ%={m.get(METRICS[2])}")


if __name__ == "__main__":
    main()
