#!/usr/bin/env bash
# train_check.sh - `lmx train` and `lmx eval` end to end on the llama fixture with a byte-level tokenizer
# (tests/data/bridge): a prompt/completion dataset of invented facts, written here.  Checks that the
# loss falls (the trained adapter's validation loss under a quarter of the base model's), that the
# adapter written in PEFT and in mlx-lm layout loads back with the same validation loss that training
# reported, that metrics.csv has every step, and that bad data fails with the file and line (or is
# skipped with --skip-bad), and that checkpoints resume exactly.  With mlx-lm installed: adapters cross between lmx and mlx-lm both ways with
# equal losses (tests/ref/mlx_adapter_loss.py).
# usage: tests/train_check.sh LMX FIXTURES
set -u
lmx=$1 fix=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
mkdir -p "$tmp/model" "$tmp/data" "$tmp/bad"
for f in "$fix"/models/llama/*; do ln -s "$f" "$tmp/model/"; done
cp "$root"/tests/data/bridge/tokenizer.json "$root"/tests/data/bridge/tokenizer_config.json "$tmp/model/"
names=(Zor Kel Mip Tav Rux Bel Quo Dax) colors=(red blue green gold)
for i in $(seq 0 63); do
    n=$((i * 5 % 8))
    echo "{\"prompt\": \"color of ${names[$n]}?\", \"completion\": \"${colors[$((n % 4))]}\"}"
done >"$tmp/data/train.jsonl"
for n in 0 1 2 3 4 5 6 7; do echo "{\"prompt\": \"color of ${names[$n]}?\", \"completion\": \"${colors[$((n % 4))]}\"}"; done >"$tmp/data/valid.jsonl"

"$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/out" --iters 30 --batch-size 8 --lr 1e-2 --rank 4 \
    --mask-prompt --eval-every 10 2>"$tmp/train.log" || { echo "FAIL: lmx train"; tail -3 "$tmp/train.log"; exit 1; }
trained=$(grep -o 'valid loss [0-9.]*' "$tmp/train.log" | tail -1 | cut -d' ' -f3)
base=$("$lmx" eval "$tmp/model" --data "$tmp/data/valid.jsonl" --mask-prompt | grep -o 'loss [0-9.]*' | cut -d' ' -f2)
echo "validation loss: base $base, trained $trained"
awk -v b="$base" -v t="$trained" 'BEGIN { exit !(t < b / 4) }' || { echo "FAIL: the loss did not fall"; fail=1; }
for fmt in peft mlx; do
    l=$("$lmx" eval "$tmp/model" --data "$tmp/data/valid.jsonl" --mask-prompt --adapter "$tmp/out/$fmt" | grep -o 'loss [0-9.]*' | cut -d' ' -f2)
    echo "reloaded $fmt adapter: validation loss $l"
    [ "$l" = "$trained" ] || { echo "FAIL: the $fmt adapter reloads with loss $l, training ended at $trained"; fail=1; }
done
[ "$(wc -l <"$tmp/out/metrics.csv")" = 31 ] || { echo "FAIL: metrics.csv has $(wc -l <"$tmp/out/metrics.csv") lines"; fail=1; }
[ -f "$tmp/out/best/peft/adapter_model.safetensors" ] || { echo "FAIL: no best checkpoint"; fail=1; }
# the loss curve: a PNG where python3 has matplotlib (scripts/setup.sh installs it), else a note saying so
if python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    [ "$(head -c 8 "$tmp/out/loss.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
        { echo "FAIL: no PNG loss curve"; grep 'loss curve' "$tmp/train.log"; fail=1; }
else
    grep -q 'no loss curve' "$tmp/train.log" || { echo "FAIL: no word about the missing loss curve"; fail=1; }
fi

# the same settings from a JSON config file: the same run; an option on the command line wins
cat >"$tmp/cfg.json" <<CFG
{"model": "$tmp/model", "data": "$tmp/data", "adapter_out": "$tmp/cfgout", "iters": 30, "batch_size": 8,
 "lr": 0.01, "rank": 4, "targets": ["q", "k", "v", "o", "gate", "up", "down"], "mask_prompt": true, "eval_every": 10}
CFG
"$lmx" train --config "$tmp/cfg.json" 2>"$tmp/cfg.log" || { echo "FAIL: --config"; tail -2 "$tmp/cfg.log"; fail=1; }
c=$(grep -o 'valid loss [0-9.]*' "$tmp/cfg.log" | tail -1 | cut -d' ' -f3)
[ "$c" = "$trained" ] && echo "--config: the same run (validation loss $c)" ||
    { echo "FAIL: --config gave $c, the command line $trained"; fail=1; }
"$lmx" train --config "$tmp/cfg.json" --iters 2 --adapter-out "$tmp/cfgout2" 2>"$tmp/cfg2.log" &&
    grep -q '^step 2/2' "$tmp/cfg2.log" || { echo "FAIL: the command line does not override the config"; fail=1; }
# the same settings as YAML (a .yaml file): the same run again
cat >"$tmp/cfg.yaml" <<CFG
# lmx train --config cfg.yaml
model: $tmp/model
data: "$tmp/data"
adapter_out: $tmp/cfgout3
iters: 30
batch_size: 8
lr: 1.0e-2
rank: 4
targets:
  - q
  - k
  - v
  - o
  - gate
  - up
  - down
mask_prompt: yes
grad_checkpoint: off
eval_every: 10
CFG
"$lmx" train --config "$tmp/cfg.yaml" 2>"$tmp/cfg3.log" || { echo "FAIL: a YAML --config"; tail -2 "$tmp/cfg3.log"; fail=1; }
c=$(grep -o 'valid loss [0-9.]*' "$tmp/cfg3.log" | tail -1 | cut -d' ' -f3)
[ "$c" = "$trained" ] && echo "--config YAML: the same run (validation loss $c)" ||
    { echo "FAIL: the YAML config gave $c, the command line $trained"; fail=1; }
printf 'lora:\n  rank: 4\n' >"$tmp/bad.yaml" # nested mappings are refused with the line
"$lmx" train --config "$tmp/bad.yaml" 2>"$tmp/cfg4.log" && { echo "FAIL: a nested YAML config accepted"; fail=1; }
grep -q 'line 2: "lora": a nested mapping' "$tmp/cfg4.log" || { echo "FAIL: YAML config message: $(cat "$tmp/cfg4.log")"; fail=1; }
mkdir -p "$tmp/y" && cp "$tmp/bad.yaml" "$tmp/y/a.yml" # a name as short as a.yml is YAML too
(cd "$tmp/y" && "$lmx" train --config a.yml) 2>"$tmp/cfg6.log"
grep -q 'line 2: "lora": a nested mapping' "$tmp/cfg6.log" || { echo "FAIL: a.yml read as: $(cat "$tmp/cfg6.log")"; fail=1; }

printf 'grad_checkpoint: on\niters: 1\n' >"$tmp/on.yaml" # on/off: a value, not a flag
"$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/cfgout4" --config "$tmp/on.yaml" 2>"$tmp/cfg5.log" ||
    { echo "FAIL: grad_checkpoint: on in YAML"; tail -2 "$tmp/cfg5.log"; fail=1; }
"$lmx" bench-train "$tmp/model" --steps 0 2>"$tmp/bt.log"
[ $? = 2 ] && grep -q 'bad --steps' "$tmp/bt.log" || { echo "FAIL: bench-train --steps 0: $(cat "$tmp/bt.log")"; fail=1; }

# checkpoints: --resume from step 3 of a 6-step run gives steps 4-6 the losses of the uninterrupted run;
# Ctrl-C saves a checkpoint that --resume goes on from
# (with LoRA dropout, which the resumed run takes from the checkpoint's adapter)
"$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/ra" --iters 6 --batch-size 8 --lr 1e-2 --rank 4 \
    --lora-dropout 0.25 --save-every 3 2>/dev/null && cp -r "$tmp/ra/step0000003" "$tmp/ck" &&
    "$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/rb" --iters 6 --batch-size 8 --lr 1e-2 --rank 4 \
        --resume "$tmp/ck" 2>/dev/null || { echo "FAIL: the resume run"; fail=1; }
if [ "$(tail -3 "$tmp/ra/metrics.csv" | cut -d, -f1,2)" = "$(tail -3 "$tmp/rb/metrics.csv" | cut -d, -f1,2)" ]; then
    echo "resume: steps 4-6 as the uninterrupted run"
else
    echo "FAIL: resumed losses differ"; tail -3 "$tmp/ra/metrics.csv" "$tmp/rb/metrics.csv"; fail=1
fi
"$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/rc" --iters 1000000 --batch-size 8 --rank 4 2>/dev/null &
pid=$!
sleep 2
kill -INT $pid
wait $pid
if [ -f "$tmp/rc/interrupted/state.json" ]; then
    at=$(sed 's/.*"step": \([0-9]*\).*/\1/' "$tmp/rc/interrupted/state.json")
    "$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/rc" --iters $((at + 2)) --batch-size 8 --rank 4 \
        --resume "$tmp/rc/interrupted" 2>"$tmp/rc.log" && grep -q "^step $((at + 2))/" "$tmp/rc.log" &&
        echo "Ctrl-C: checkpoint after step $at, resumed to $((at + 2))" ||
        { echo "FAIL: resuming after Ctrl-C"; tail -2 "$tmp/rc.log"; fail=1; }
else
    echo "FAIL: Ctrl-C saved no checkpoint"; fail=1
fi

# mlx-lm (when installed, as test_bridge finds it): the adapter lmx wrote in mlx-lm's layout gives mlx-lm the
# loss lmx computes, and an adapter `mlx_lm lora` trains gives lmx the loss mlx-lm computes (both in f32)
py=${LMX_PYTHON:-$HOME/.cache/lmx/mlx-lm-venv/bin/python}
if "$py" -c 'import mlx_lm' 2>/dev/null; then
    for n in Zor Kel Mip; do echo "{\"text\": \"color of $n? red\"}"; done >"$tmp/text.jsonl"
    "$py" -m mlx_lm lora --model "$tmp/model" --train --data "$tmp/data" --iters 5 --batch-size 4 --num-layers 2 \
        --learning-rate 1e-2 --adapter-path "$tmp/mlx_trained" >"$tmp/mlx_lora.log" 2>&1 ||
        { echo "FAIL: mlx_lm lora"; tail -3 "$tmp/mlx_lora.log"; fail=1; }
    for ad in "$tmp/out/mlx" "$tmp/mlx_trained"; do
        want=$("$py" "$root/tests/ref/mlx_adapter_loss.py" "$tmp/model" "$ad" "$tmp/text.jsonl" 2>"$tmp/mlx_loss.err")
        got=$("$lmx" eval "$tmp/model" --data "$tmp/text.jsonl" --adapter "$ad" | grep -o 'loss [0-9.]*' | cut -d' ' -f2)
        echo "adapter $(basename "$ad"): mlx-lm loss $want, lmx loss $got"
        awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * (1 + a)) }' ||
            { echo "FAIL: mlx-lm and lmx disagree on $ad"; tail -2 "$tmp/mlx_loss.err"; fail=1; }
    done
else
    echo "skip: no python with mlx-lm ($py): the mlx-lm interoperability checks did not run"
fi

# bad data: an error with file and line, or skipped and counted
cp "$tmp/data/valid.jsonl" "$tmp/bad/train.jsonl"
printf '{"prompt": "x"\n{"completion": "only"}\n' >>"$tmp/bad/train.jsonl"
if "$lmx" train "$tmp/model" --data "$tmp/bad" --adapter-out "$tmp/out2" --iters 1 2>"$tmp/bad.log"; then
    echo "FAIL: bad data accepted"; fail=1
fi
grep -q 'train.jsonl:9: not a JSON object' "$tmp/bad.log" || { echo "FAIL: bad data message: $(cat "$tmp/bad.log")"; fail=1; }
"$lmx" train "$tmp/model" --data "$tmp/bad" --adapter-out "$tmp/out2" --iters 1 --skip-bad 2>"$tmp/skip.log" ||
    { echo "FAIL: --skip-bad"; tail -2 "$tmp/skip.log"; fail=1; }
grep -q '(2 skipped)' "$tmp/skip.log" || { echo "FAIL: skipped count: $(head -1 "$tmp/skip.log")"; fail=1; }
[ $fail = 0 ] && echo "train_check: all passed"
exit $fail
