#!/usr/bin/env python3
"""Write the seed inputs of fuzz/corpus/NAME/seed-* from the shared fixtures (python3, standard library
only).  The seeds are committed; run this again when the fixtures change:

    python3 fuzz/make_seeds.py [FIXTURES]      # default: ../shared/fixtures

Seeds are small versions of real files, so that the fuzzer starts from valid inputs of every shape
and mutates quickly: safetensors and GGUF files keep their headers (every key, a few tensors shrunk
to one block), tokenizer.json files keep their pipeline and a self-consistent slice of the
vocabulary and merges.  Inputs made of two files join them with a NUL byte (see each harness).
Files named crash-* in the corpus are regression inputs of past crashes and are left alone."""
import glob
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIX = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "fixtures"))
OUT = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def clear_seeds():
    for p in glob.glob(os.path.join(OUT, "*", "seed-*")):
        os.remove(p)


def rel(path):
    return os.path.join(FIX, path)


def load(path):
    with open(path, "rb") as f:
        return f.read()


# ---- safetensors ---------------------------------------------------------------------------------
DSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
         "I8": 1, "U8": 1, "BOOL": 1}


def st_read(path):
    b = load(path)
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    return header, b[8 + n:]


def st_write(tensors, meta=None, pad_to=8, extra_spaces=0):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, off, data = {}, 0, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        h += b" " * (-len(h) % pad_to)
    h += b" " * extra_spaces
    return struct.pack("<Q", len(h)) + h + data


def st_shrunk(path, keep=6, shrink=True):
    header, data = st_read(path)
    meta = header.pop("__metadata__", None)
    out = []
    for name in list(header)[:keep]:
        e = header[name]
        shape = [min(d, 2) for d in e["shape"]] if shrink else e["shape"]
        n = 1
        for d in shape:
            n *= d
        b, _ = e["data_offsets"]
        out.append((name, e["dtype"], shape, data[b:b + n * DSIZE[e["dtype"]]]))
    return out, meta


def seeds_safetensors():
    for i, path in enumerate(["models/qwen3_q4/model.safetensors", "models/qwen3/model.safetensors",
                              "models/llama_lora/peft_adapter/adapter_model.safetensors",
                              "models/qwen3_lora/mlx_adapter/adapters.safetensors",
                              "models/gemma3_q8/model.safetensors"]):
        tensors, meta = st_shrunk(rel(path))
        write("safetensors", "fixture%d" % i, st_write(tensors, meta))
        write("safetensors", "fixture%d-unaligned" % i, st_write(tensors, meta, pad_to=0, extra_spaces=1 + i))
    every = [("t." + dt.lower(), dt, [2, 1], bytes(range(2 * DSIZE[dt]))) for dt in DSIZE]
    write("safetensors", "every-dtype", st_write(every, {"format": "pt"}))
    write("safetensors", "empty", st_write([]))
    write("safetensors", "zero-sized", st_write([("z", "F32", [0, 4], b""), ("s", "F32", [], b"\0\0\x80?")]))


# ---- GGUF ----------------------------------------------------------------------------------------
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
         11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}


class Reader:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        n = struct.calcsize("<" + fmt)
        v = struct.unpack("<" + fmt, self.b[self.p:self.p + n])
        self.p += n
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.b[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def gguf_read(path):
    r = Reader(load(path))
    assert r.b[:4] == b"GGUF"
    r.p = 4
    _, nt, nkv = r.take("IQQ")
    kvs = []
    for _ in range(nkv):
        k = r.string()
        t = r.take("I")
        kvs.append((k, t, r.value(t)))
    tensors = []
    for _ in range(nt):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        t = r.take("I")
        r.take("Q")  # offset: the seeds lay the data out again
        tensors.append((name, dims, t))
    return kvs, tensors


def gguf_value(t, v):
    if t == 8:
        return struct.pack("<Q", len(v)) + v
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack("<" + SCALAR[t], v)


def gguf_write(kvs, tensors, align=32):
    """tensors: [(name, dims, type)], each shrunk to one row of one block (zero data)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + gguf_value(t, v)
    off, blobs = 0, []
    for name, dims, t in tensors:
        be, bb = BLOCK.get(t, (1, 4))
        dims = [max(be, 32 if be == 1 else be)] + [1] * (len(dims) - 1)
        size = dims[0] // be * bb
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off)
        blobs.append(b"\x11" * size)
        off += size + (-size % align)
    out += b"\0" * (-len(out) % align)
    for b in blobs:
        out += b + b"\0" * (-len(b) % align)
    return out


def seeds_gguf(mini_qwen):
    paths = sorted(glob.glob(os.path.join(ROOT, "tests/data/gguf/*.gguf")))
    paths += sorted(glob.glob(os.path.join(ROOT, "tests/data/lora/*/*.gguf")))[:2]
    paths.append(rel("real/stories260K.gguf"))
    for path in paths:
        kvs, tensors = gguf_read(path)
        keep = tensors[:5] + [t for t in tensors if t[0] == b"rope_freqs.weight"]
        write("gguf", os.path.basename(os.path.dirname(path)) + "-" + os.path.basename(path), gguf_write(kvs, keep))
    # a gpt2 (byte-level BPE) tokenizer and a chat template in the metadata, from the small qwen3 tokenizer
    tok = mini_qwen
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [k.encode() for k, _ in vocab] + [a["content"].encode() for a in tok["added_tokens"]]
    types = [1] * len(vocab) + [3] * len(tok["added_tokens"])
    merges = [(" ".join(m) if isinstance(m, list) else m).encode() for m in tok["model"]["merges"]]
    tpl = json.load(open(rel("tokenizers/qwen3/tokenizer_config.json")))["chat_template"].encode()
    kvs = [(b"general.architecture", 8, b"qwen3"), (b"qwen3.block_count", 4, 1), (b"qwen3.embedding_length", 4, 32),
           (b"qwen3.attention.head_count", 4, 2), (b"qwen3.feed_forward_length", 4, 64),
           (b"tokenizer.ggml.model", 8, b"gpt2"), (b"tokenizer.ggml.pre", 8, b"qwen2"),
           (b"tokenizer.ggml.tokens", 9, (8, tokens)), (b"tokenizer.ggml.token_type", 9, (5, types)),
           (b"tokenizer.ggml.merges", 9, (8, merges)), (b"tokenizer.ggml.eos_token_id", 4, len(vocab) + 1),
           (b"tokenizer.chat_template", 8, tpl)]
    write("gguf", "gpt2-tokenizer", gguf_write(kvs, [(b"token_embd.weight", [32, 8], 0)]))


# ---- config.json, adapters -----------------------------------------------------------------------
def seeds_config():
    for path in sorted(glob.glob(rel("models/*/config.json")) + glob.glob(rel("real/configs/*/config.json"))):
        name = os.path.basename(os.path.dirname(path))
        data = load(path)
        gen = os.path.join(os.path.dirname(path), "generation_config.json")
        if os.path.exists(gen):
            data += b"\0" + load(gen)
        write("config", name, data)


def seeds_adapter():
    for path in sorted(glob.glob(rel("models/*_lora/*_adapter")) + glob.glob(rel("real/adapters/*"))):
        name = os.path.basename(os.path.dirname(path)) + "-" + os.path.basename(path)
        cfg = load(os.path.join(path, "adapter_config.json"))
        write("adapter", name, cfg)
        weights = [p for p in glob.glob(os.path.join(path, "*.safetensors"))][:1]
        if weights:
            tensors, meta = st_shrunk(weights[0], keep=4, shrink=False)
            if sum(len(t[3]) for t in tensors) <= 64 << 10:
                write("adapter", name + "-weights", cfg + b"\0" + st_write(tensors, meta))


# ---- tokenizer.json ------------------------------------------------------------------------------
def mini_tokenizer(tok, n_base, n_merges=300):
    """A self-consistent slice: the first n_base tokens, the merges among them (and the tokens they
    make, up to n_merges), the added tokens; ids renumbered densely."""
    m = tok["model"]
    vocab, pre = m["vocab"], m.get("continuing_subword_prefix") or ""
    kept = {t for t, i in vocab.items() if i < n_base or (t.startswith("<0x") and len(t) == 6)}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in kept and b in kept:
            merged = a + (b[len(pre):] if pre and b.startswith(pre) else b)
            if merged in vocab:
                kept.add(merged)
                merges.append(mg)
                if len(merges) >= n_merges:
                    break
    order = sorted(kept, key=lambda t: vocab[t])
    new_vocab = {t: i for i, t in enumerate(order)}
    remap, added = {}, []
    for a in tok["added_tokens"][:24]:
        if a["content"] in new_vocab:
            nid = new_vocab[a["content"]]
        else:
            nid = len(new_vocab) + len(added)
        remap[a["id"]] = nid
        added.append(dict(a, id=nid))
    out = dict(tok)
    out["model"] = dict(m, vocab=new_vocab, merges=merges)
    out["added_tokens"] = added
    pp = tok.get("post_processor")

    def fix(p):
        if isinstance(p, dict):
            if p.get("type") == "TemplateProcessing":
                for st in p.get("special_tokens", {}).values():
                    st["ids"] = [remap.get(i, 0) for i in st.get("ids", [])]
            for k in ("processors",):
                for q in p.get(k, []) or []:
                    fix(q)
    if pp:
        pp = json.loads(json.dumps(pp))
        fix(pp)
        out["post_processor"] = pp
    return out


def seeds_tokenizer():
    minis = {}
    for name, n_base in (("qwen3", 256), ("llama3", 256), ("gemma3", 520)):
        tok = json.load(open(rel("tokenizers/%s/tokenizer.json" % name)))
        mini = mini_tokenizer(tok, n_base)
        minis[name] = mini
        cfg = json.load(open(rel("tokenizers/%s/tokenizer_config.json" % name)))
        small_cfg = {k: v for k, v in cfg.items() if k not in ("added_tokens_decoder", "chat_template")}
        text = json.dumps(mini, ensure_ascii=False)
        write("tokenizer", name, text)
        write("tokenizer", name + "-config", text.encode() + b"\0" + json.dumps(small_cfg).encode())
    return minis


# ---- chat templates and the JSON Lines readers ----------------------------------------------------
SMALL_TEMPLATES = [
    "{% for m in messages %}{{ m.role | upper }}: {{ m.content | trim }}\n{% endfor %}",
    "{{ messages | map(attribute='role') | unique | list | tojson }} {{ messages | length }}",
    "{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}"
    "{{ loop.index }}/{{ loop.length }}{% if loop.last %}!{% endif %}{% endfor %}{{ ns.n }}",
    "{{ ([] | max) is defined }}{{ [] | sort }}{{ [] | sum }}{{ ([3, 1, 2] | max) }}{{ 'a,b' .split(',') }}",
    "{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(3) }}{{ f(1, y=5) }}{{ range(3) | list }}",
    "{{ messages[0]['content'][1:3] }}{{ messages[-1].content.startswith('2') }}{{ '%d' % 3 }}",
    "{%- if tools %}{{ tools | tojson(indent=2) }}{% endif %}{{ raise_exception('no') if not messages }}",
    "{{ {'b': 1, 'a': 2} | dictsort }}{{ {'b': 1}.items() | list }}{{ 'x' ~ 1 ~ none }}{{ 7 // 2 }}{{ 2 ** 10 }}",
]


def seeds_jinja_jsonl():
    chats = {}
    for name in ("qwen3", "llama3", "gemma3"):
        lines = open(rel("tokenizers/%s.public.chat.jsonl" % name)).read().splitlines()
        rows = [json.loads(l) for l in lines[:3]]
        chats[name] = [{k: r[k] for k in ("messages", "add_generation_prompt", "kwargs") if k in r} for r in rows]
        tpl = json.load(open(rel("tokenizers/%s/tokenizer_config.json" % name)))["chat_template"]
        for i, c in enumerate(chats[name][:2]):
            write("jinja", "%s-%d" % (name, i), tpl.encode() + b"\0" + json.dumps(c).encode())
        texts = [json.loads(l)["text"] for l in open(rel("tokenizers/%s.public.jsonl" % name)).read().splitlines()[:6]]
        write("jsonl", name + "-text", "".join(json.dumps({"text": t}) + "\n" for t in texts))
        write("jsonl", name + "-chat", "".join(json.dumps(c) + "\n" for c in chats[name]))
    for path in sorted(glob.glob(rel("real/configs/*/chat_template.jinja"))):
        write("jinja", os.path.basename(os.path.dirname(path)), load(path) + b"\0" + json.dumps(chats["gemma3"][0]).encode())
    for i, t in enumerate(SMALL_TEMPLATES):
        write("jinja", "small%d" % i, t)
    write("jsonl", "mixed", '{"text": "a"}\n\n  \n{"messages": [{"role": "user", "content": "x"}], "tools": [{"a": 1}]}\n')


def seeds_yaml():
    """`lmx train --config` files: settings, lists (block and flow), quoting, and the refused forms."""
    write("yaml", "train", "# a training config\nmodel: /m\ndata: \"/d\"\niters: 30\nlr: 1.0e-2\nrank: 4\n"
          "targets:\n  - q\n  - v\nmask_prompt: yes\ngrad_checkpoint: off\nseed: ~\n")
    write("yaml", "flow", "---\n{lr: 1e-4, targets: [q, k, 'v'], schedule: cosine}\n...\n")
    write("yaml", "nested", "lora:\n  rank: 4\n")
    write("yaml", "anchor", "a: &x 1\nb: *x\n")
    write("yaml", "bad", "a: [1, {b: 2}]\n- c\n\t:\n")


def main():
    if not os.path.isdir(FIX):
        sys.exit("no fixtures at %s" % FIX)
    clear_seeds()
    seeds_safetensors()
    seeds_config()
    seeds_adapter()
    minis = seeds_tokenizer()
    seeds_gguf(minis["qwen3"])
    seeds_jinja_jsonl()
    seeds_yaml()
    total = 0
    for p in glob.glob(os.path.join(OUT, "*", "seed-*")):
        total += os.path.getsize(p)
    print("wrote %d seeds, %d KiB, under %s" % (len(glob.glob(os.path.join(OUT, "*", "seed-*"))), total >> 10, OUT))


if __name__ == "__main__":
    main()
