#!/usr/bin/env bash
# The lmx command end to end: --help everywhere, one-line errors with exit code 2, sampling
# reproducibility by seed, --json metrics, prompts from stdin, --stop, piped chat, discover.
# usage: cli_check.sh LMX_BIN FIXTURES
set -euo pipefail
bin=$1 fixtures=$2
llama=$fixtures/models/llama stories=$fixtures/real/stories260K.gguf
fail() { echo "FAIL: $*"; exit 1; }

for cmd in run chat info discover bench check-reference quantize tokenize template; do
    "$bin" $cmd --help >/dev/null || fail "$cmd --help"
done
for args in "run" "run $llama --temp x" "run $llama --top-k" "run $llama --bogus" "chat" "info" "discover" \
            "nosuchcommand" "run $llama --prompt-ids 1,x" "bench $llama --batch 65"; do
    set +e; err=$("$bin" $args 2>&1 >/dev/null </dev/null); rc=$?; set -e
    [ "$rc" = 2 ] || fail "'lmx $args' exited $rc, expected 2"
    [ "$(wc -l <<<"$err")" = 1 ] || fail "'lmx $args' printed more than one line: $err"
done
echo "ok: --help for every command; bad arguments exit 2 with one line"

# sampling: the same seed gives the same ids, another seed others (temperature high enough to matter)
a=$("$bin" run "$llama" --prompt-ids 1,2,3 --max-tokens 20 --temp 3 --top-k 0 --top-p 1 --min-p 0 --seed 5)
b=$("$bin" run "$llama" --prompt-ids 1,2,3 --max-tokens 20 --temp 3 --top-k 0 --top-p 1 --min-p 0 --seed 5)
c=$("$bin" run "$llama" --prompt-ids 1,2,3 --max-tokens 20 --temp 3 --top-k 0 --top-p 1 --min-p 0 --seed 6)
[ "$a" = "$b" ] || fail "same seed, different ids: $a / $b"
[ "$a" != "$c" ] || fail "different seeds, same ids: $a"
[ "$(wc -w <<<"$a")" = 20 ] || fail "expected 20 ids: $a"
echo "ok: seeds"

# --json: one JSON line on stderr with the metrics
json=$("$bin" run "$llama" --prompt-ids 1,2,3 --max-tokens 5 --temp 0 --json 2>&1 >/dev/null)
python3 - "$json" <<'PY' || fail "--json: $json"
import json, sys
m = json.loads(sys.argv[1])
assert m["prompt_tokens"] == 3 and m["generated_tokens"] == 5 and m["finish"] == "length", m
assert m["decode_tokens_per_s"] > 0 and m["peak_memory_bytes"] >= m["memory_bytes"] > 0, m
PY
echo "ok: --json metrics"

# bench --batch B: that batch size alone, the other figures 0
json=$("$bin" bench "$llama" --backend cpu --batch 8 --steps 8 --json)
python3 - "$json" <<'PY' || fail "bench --batch: $json"
import json, sys
m = json.loads(sys.argv[1])
assert m["batch8_tok_s"] > 0 and m["batch1_tok_s"] == 0 and m["batch32_tok_s"] == 0 and m["decode_ctx0_tok_s"] == 0, m
assert m["generate_batch8_tok_s"] > 0 and m["generate_batch32_tok_s"] == 0, m
assert m["generate_batch32_staggered_tok_s"] == 0, m
PY
json=$("$bin" bench "$llama" --backend cpu --batch 32 --steps 8 --json)
python3 - "$json" <<'PY' || fail "bench --batch 32: $json"
import json, sys
m = json.loads(sys.argv[1])
assert m["batch32_tok_s"] > 0 and m["generate_batch32_tok_s"] > 0 and m["generate_batch32_staggered_tok_s"] > 0, m
assert m["generate_batch32_prefill_tok_s"] > 0 and m["generate_batch32_staggered_prefill_tok_s"] > 0, m
PY
json=$("$bin" bench "$llama" --backend cpu --batch 5 --steps 8 --json)
python3 - "$json" <<'PY' || fail "bench --batch 5: $json"
import json, sys
m = json.loads(sys.argv[1])
assert m["batch5_tok_s"] > 0 and "batch8_tok_s" not in m and m["batch32_tok_s"] == 0, m
assert m["batch_ctx"] == 16, m
PY
# --batch-ctx: the batch decodes after a longer prompt (300 tokens: two prefill calls of the bench's 256)
json=$("$bin" bench "$llama" --backend cpu --batch 3 --batch-ctx 300 --steps 8 --json)
python3 - "$json" <<'PY' || fail "bench --batch-ctx: $json"
import json, sys
m = json.loads(sys.argv[1])
assert m["batch3_tok_s"] > 0 and m["generate_batch3_tok_s"] > 0 and m["batch_ctx"] == 300, m
PY
if "$bin" bench "$llama" --backend cpu --batch 3 --batch-ctx 0 --json >/dev/null 2>&1; then fail "bench --batch-ctx 0 accepted"; fi
echo "ok: bench --batch"

# a prompt from stdin equals the same prompt as an argument; --stop cuts the text before the stop
full=$("$bin" run "$stories" "Once upon a time" --max-tokens 40 --temp 0)
piped=$(printf 'Once upon a time\n' | "$bin" run "$stories" --max-tokens 40 --temp 0)
[ "$full" = "$piped" ] || fail "stdin prompt differs: '$piped' vs '$full'"
stop=$(python3 -c 'import sys; w = sys.argv[1].split(); print(w[len(w) // 2])' "$full")
cut=$("$bin" run "$stories" "Once upon a time" --max-tokens 40 --temp 0 --stop "$stop")
python3 - "$full" "$cut" "$stop" <<'PY' || fail "--stop '$stop': '$cut' from '$full'"
import sys
full, cut, stop = sys.argv[1:]
assert cut == full[:full.index(stop)].rstrip("\n"), (cut, full)
PY
echo "ok: stdin prompt, --stop \"$stop\""

# piped chat: two turns and /reset run through
out=$(printf 'Hello\n/reset\nTell me a story\n/quit\nignored\n' | "$bin" chat "$stories" --max-tokens 8 --temp 0)
[ "$(grep -c . <<<"$out")" -ge 1 ] || fail "chat printed nothing"
echo "ok: piped chat"

# discover: every fixture model directory and the GGUF files
list=$("$bin" discover "$fixtures")
for want in "models/llama " "models/qwen3_q4 " "stories260K.gguf"; do
    grep -q "$want" <<<"$list" || fail "discover does not list $want: $list"
done
grep -q "stories260K.gguf *llama" <<<"$list" || fail "discover: stories260K is not a llama: $list"
echo "ok: discover"
