#!/usr/bin/env bash
# lmx quantize on a dense fixture.  usage: quantize_check.sh LMX_BIN FIXTURES MODEL BITS
# Where the fixtures hold MODEL_qBITS (quantized by an independent implementation), the output must
# equal it byte for byte and match its reference logits at float32 tolerance.  Otherwise the
# logits must stay within quantization error of the dense reference: relative L2 per position
# <= 5% at 8 bits and <= 40% at 4 bits.  Rounding to 2^b - 1 levels over a group's range leaves an
# rms weight error of range / ((2^b - 1) sqrt(12)), about 0.5% of the weights' spread at 8 bits and
# 8% at 4 bits, compounded over the model's matmuls (measured on the fixtures: 1-2% and 15-28%).
set -euo pipefail
bin=$1 fixtures=$2 model=$3 bits=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" quantize "$fixtures/models/$model" "$tmp/q" --bits "$bits" --group-size 64
grep -q '"quantization"' "$tmp/q/config.json"
ref_q="$fixtures/models/${model}_q$bits"
if [ -d "$ref_q" ]; then
    python3 - "$tmp/q/model.safetensors" "$ref_q/model.safetensors" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, f = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(k for k in a.keys() | f.keys() if a.get(k) != f.get(k))
if bad:
    sys.exit("tensors differ from the independent quantization: %s" % bad[:5])
print("%d tensors identical to %s" % (len(a), sys.argv[2]))
PY
    "$bin" check-reference "$tmp/q" --reference "$ref_q/reference.safetensors"
else
    tol=$([ "$bits" = 8 ] && echo rel:0.05 || echo rel:0.40)
    "$bin" check-reference "$tmp/q" --reference "$fixtures/models/$model/reference.safetensors" --tolerance "$tol"
fi
