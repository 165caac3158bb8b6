#!/usr/bin/env bash
# Greedy `lmx run --prompt-ids` must reproduce a fixture's short_sequence after its short_prompt
# (the reference's greedy tokens from HF).  usage: run_greedy.sh LMX_BIN MODEL_DIR
set -euo pipefail
bin=$1 dir=$2
read -r prompt expected < <(python3 - "$dir/reference.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def ints(name):
    t = h[name]; s, e = t["data_offsets"]
    return list(struct.unpack("<%di" % ((e - s) // 4), b[8 + n + s:8 + n + e]))
p, q = ints("short_prompt"), ints("short_sequence")
print(",".join(map(str, p)), " ".join(map(str, q[len(p):])))
PY
)
n=$(wc -w <<<"$expected")
got=$("$bin" run "$dir" --prompt-ids "$prompt" --max-tokens "$n" --temp 0)
if [ "$got" != "$expected" ]; then
    echo "FAIL $dir"; echo "  expected: $expected"; echo "  got:      $got"; exit 1
fi
echo "ok $dir: $n greedy tokens match"
