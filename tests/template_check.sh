#!/usr/bin/env bash
# `lmx template MODEL` must reproduce every rendering in EXPECTED.jsonl (made with jinja2 set up as
# transformers sets it up: tests/ref/render_chats.py).  usage: template_check.sh LMX_BIN MODEL EXPECTED
set -euo pipefail
bin=$1 model=$2 expected=$3
got=$("$bin" template "$model" < "$expected")
printf '%s\n' "$got" | python3 -c '
import json, sys
exp = [json.loads(l)["text"] for l in open(sys.argv[1])]
got = [json.loads(l) for l in sys.stdin if l.strip()]
bad = [i for i, (e, g) in enumerate(zip(exp, got)) if g.get("text") != e]
if len(got) != len(exp) or bad:
    for i in bad:
        print("FAIL row %d\n  expected: %r\n  got:      %r" % (i, exp[i], got[i]))
    sys.exit(1)
print("ok: %d renderings exact" % len(exp))' "$expected"
