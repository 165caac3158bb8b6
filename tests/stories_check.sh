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
got=$("$bin" run "$fixtures/real/stories260K.gguf" --prompt-ids "$prompt" --max-tokens "$n" --temp 0)
if [ "$got" != "$expected" ]; then
    echo "FAIL: greedy tokens differ"; echo "  expected: $expected"; echo "  got:      $got"; exit 1
fi
echo "ok: $n greedy tokens from BOS match the reference"

# llama.cpp's two text prompts: lmx's tokenizer (from the GGUF metadata) and greedy generation must
# give the same 48-token continuation (llama.cpp's output echoes the prompt after a leading space).
python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["prompts_llama_cpp_greedy_48_tokens"]:
    print(json.dumps([p["prompt"], p["output"]]))' "$ref" | while read -r row; do
    prompt=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$row")
    expected=$(python3 -c 'import json,sys; p,o=json.loads(sys.argv[1]); assert o.startswith(" "+p); print(o[len(p)+1:])' "$row")
    got=$("$bin" run "$fixtures/real/stories260K.gguf" "$prompt" --max-tokens 48 --temp 0)
    if [ "$got" != "$expected" ]; then
        echo "FAIL: \"$prompt\""; echo "  expected: $expected"; echo "  got:      $got"; exit 1
    fi
    echo "ok: \"$prompt\" continues as llama.cpp does"
done
