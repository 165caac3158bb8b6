import re,sys
t=open(sys.argv[1]).read()
for blk in re.split(r'\n  (?=\S)', t)[1:]:
    name=blk.split('(')[0].strip()[:50]
    m=dict(re.findall(r'(gpu__time_duration.sum|dram__throughput.avg.pct_of_peak_sustained_elapsed|sm__warps_active.avg.pct_of_peak_sustained_active)\s+\S+\s+([\d.,]+)', blk))
    print(f"{name:50s} t={m.get('gpu__time_duration.sum')} dram%={m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')} occ%={m.get('sm__warps_active.avg.pct_of_peak_sustained_active')}")
