#!/usr/bin/env bash
# A real trained GGUF model (stories260K, F32): greedy generation from BOS must reproduce the 120
# reference tokens (checked by llama.cpp and an independent fp32 forward pass).
# usage: stories_check.sh LMX_BIN FIXTURES
set -euo pipefail
bin=$1 fixtures=$2
ref="$fixtures/real/stories260K.reference.json"
read -r prompt n expected < <(python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))["greedy_from_bos"]
print(",".join(map(str, g["prompt_ids"])), g["steps"], " ".join(map(str, g["generated_ids"])))' "$ref")
got=$("$bin" run "$fixtures/real/stories260K.gguf" --prompt-ids "$prompt" --max-tokens "$n")
if [ "$got" != "$expected" ]; then
    echo "FAIL: greedy tokens differ"; echo "  expected: $expected"; echo "  got:      $got"; exit 1
fi
echo "ok: $n greedy tokens from BOS match the reference"
