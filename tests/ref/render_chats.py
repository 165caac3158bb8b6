#!/usr/bin/env python3
"""Expected renderings of a real model's chat template, made with jinja2 set up as HF transformers'
apply_chat_template sets it up (trim_blocks, lstrip_blocks, raise_exception, tojson; messages,
add_generation_prompt, bos_token, eos_token).  The template comes from a GGUF file's
tokenizer.chat_template (with its BOS/EOS token strings) or from a model directory
(chat_template.jinja / tokenizer_config.json).  Writes JSON lines {messages, add_generation_prompt,
text} for `lmx template` to reproduce.

usage: render_chats.py MODEL(.gguf|dir) OUT.jsonl        (needs jinja2; gguf for GGUF files)
"""
import json
import os
import sys

import jinja2
import jinja2.ext

CONVERSATIONS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}], True),
    ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3? Answer in one word — please."}], True),
    ([{"role": "user", "content": "Say \"hello\"\nin two lines."}], False),
]


def from_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields[name]
        return f.parts[f.data[0]]

    tpl = bytes(field("tokenizer.chat_template")).decode()
    tokens = r.fields["tokenizer.ggml.tokens"]

    def tok(i):
        return bytes(tokens.parts[tokens.data[i]]).decode()

    return tpl, tok(int(field("tokenizer.ggml.bos_token_id")[0])), tok(int(field("tokenizer.ggml.eos_token_id")[0]))


def from_dir(d):
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    jp = os.path.join(d, "chat_template.jinja")
    tpl = open(jp).read() if os.path.exists(jp) else cfg["chat_template"]
    name = lambda v: v["content"] if isinstance(v, dict) else v
    return tpl, name(cfg.get("bos_token")), name(cfg.get("eos_token"))


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


src, out = sys.argv[1], sys.argv[2]
tpl, bos, eos = from_gguf(src) if src.endswith(".gguf") else from_dir(src)
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
env.globals["raise_exception"] = raise_exception
t = env.from_string(tpl)
with open(out, "w") as f:
    for messages, gen in CONVERSATIONS:
        text = t.render(messages=messages, add_generation_prompt=gen, bos_token=bos, eos_token=eos)
        f.write(json.dumps({"messages": messages, "add_generation_prompt": gen, "text": text}, ensure_ascii=False) + "\n")
print("wrote", out, "with jinja2", jinja2.__version__)
