#!/usr/bin/env bash
# lmx fuse (a LoRA adapter merged into a copy of a model directory).
# usage: fuse_check.sh LMX_BIN FIXTURES MODEL     (MODEL: llama or qwen3, with MODEL_lora fixtures)
#        fuse_check.sh LMX_BIN FIXTURES errors    (GGUF base, adapters that do not fit, bad arguments)
#
# Two independent checks of every fused directory:
#  1. its weights against a merge computed here in Python from the base and adapter files alone
#     (W + scale * B A, MLX dequantization as the fixtures README defines it): merged bf16 weights
#     within one bf16 ulp of the exact value; re-quantized weights within half a quantization step
#     (plus the bf16 rounding of scale and bias) of it; every other tensor byte-identical.
#  2. its logits against the fixture's HF + peft logits of base + adapter (check-reference).
#     Dense base: rel:1e-2.  The merged weights are rounded once to bf16 (8 significant bits: at
#     most 2^-8 relative, rms about 0.15%); compounded over the 2 layers' projections and the head
#     that gives logits about 0.3-0.5% off (measured: relative L2 per position at most 5.1e-3 for
#     llama and 5.0e-3 for qwen3, peft and mlx adapters alike), so 1e-2 leaves a 2x margin while an
#     unmerged base is 60-80% off.  tests/ref/check_fused_hf.py confirmed it with torch: peft's own
#     merge_and_unload rounded to bf16 gives the same errors (5.13e-3 / 4.95e-3), HF on lmx's fused
#     directories too, and lmx's merged weights are peft's merge correctly rounded (<= 0.5 ulp).
#     Quantized bases, against tests/data/lora/<model>_q<bits>/reference.safetensors (float64 logits
#     of the same quantized base with the adapter unmerged, tests/ref/make_lora_reference.py):
#     --dequantize leaves only bf16 rounding, now of every matrix (embedding and head too, and q*s+b
#     needs more than bf16's 8 bits): rel:1e-2 (measured at most 6.7e-3).  Re-quantizing the merged
#     weights adds one quantization error, that of quantizing a dense model once, so the bounds of
#     tests/quantize_check.sh apply: rel:0.05 at 8 bits, rel:0.40 at 4 bits (measured 1.5% / 2.1% and
#     27.5% / 27.6% for llama / qwen3).  Where those references are absent, only the dense base's
#     reference is left, and the base's own quantization error comes on top: --dequantize rel:0.05 /
#     rel:0.5 (measured 2.3-3.2% / 39-40%), re-quantized sqrt(2) times that, rel:0.07 / rel:0.6
#     (measured 2.6-3.8% / 49-50%).  At 4 bits that is as large as the adapter's own effect, so there
#     the weight check (1) is what pins the merge.
set -euo pipefail
bin=$1 fixtures=$2 what=$3
here=$(cd "$(dirname "$0")" && pwd)
M=$fixtures/models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# verify MODE BASE ADAPTER FUSED   (MODE: dense, requant, dequant)
verify() {
    python3 - "$@" <<'PY'
import json, os, struct, sys
from array import array

mode, base_dir, adapter_dir, fused_dir = sys.argv[1:5]

def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}

def load_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors") and not f.startswith("reference")
                       and f not in ("adapter_model.safetensors", "adapters.safetensors"))
    out = {}
    for f in files:
        out.update(load(os.path.join(d, f)))
    return out

def floats(t):
    dt, shape, raw = t
    if dt == "F32":
        return array("f", raw)
    if dt == "BF16":
        wide = bytearray(2 * len(raw))
        wide[2::4], wide[3::4] = raw[0::2], raw[1::2]
        return array("f", bytes(wide))
    if dt == "F16":
        return array("f", [x[0] for x in struct.iter_unpack("<e", raw)])
    sys.exit("unexpected dtype %s" % dt)

def quantized(ts, name):
    stem = name[:-len(".weight")]
    return name.endswith(".weight") and ts[name][0] == "U32" and stem + ".scales" in ts and stem + ".biases" in ts

def dequant(ts, name, bits):
    """w = q * scale + bias per group; element j of a row in word j / (32/bits), LSB first."""
    stem = name[:-len(".weight")]
    (N, Wd), words = ts[name][1], array("I", ts[name][2])
    sc, bi = floats(ts[stem + ".scales"]), floats(ts[stem + ".biases"])
    per, mask, K = 32 // bits, (1 << bits) - 1, Wd * 32 // bits
    G = ts[stem + ".scales"][1][1]
    group = K // G
    out = [0.0] * (N * K)
    for n in range(N):
        for k in range(K):
            q = (words[n * Wd + k // per] >> ((k % per) * bits)) & mask
            out[n * K + k] = q * sc[n * G + k // group] + bi[n * G + k // group]
    return out, N, K, group

def adapter(d):
    """{base weight name: (A [r*K], B [N*r], r, scale)} read from a PEFT or mlx-lm folder."""
    cfg = json.load(open(os.path.join(d, "adapter_config.json")))
    pairs = {}
    if "peft_type" in cfg:
        assert not cfg.get("use_rslora") and not cfg.get("rank_pattern") and not cfg.get("alpha_pattern")
        t, scale = load(os.path.join(d, "adapter_model.safetensors")), cfg["lora_alpha"] / cfg["r"]
        for k in t:
            if k.endswith(".lora_A.weight"):
                mod = k[len("base_model.model."):-len(".lora_A.weight")]
                A, B = t[k], t[k.replace("lora_A", "lora_B")]
                pairs[mod + ".weight"] = (floats(A), floats(B), A[1][0], scale)
    else:
        t, scale = load(os.path.join(d, "adapters.safetensors")), cfg["lora_parameters"]["scale"]
        for k in t:
            if k.endswith(".lora_a"):
                a, b = t[k], t[k[:-1] + "b"]
                (K, r), N = a[1], b[1][1]
                fa, fb = floats(a), floats(b)
                pairs[k[:-len(".lora_a")] + ".weight"] = ([fa[k2 * r + i] for i in range(r) for k2 in range(K)],
                                                         [fb[i * N + n] for n in range(N) for i in range(r)], r, scale)
    return pairs

def merged(w, N, K, pair):
    A, B, r, s = pair
    out = list(w)
    for n in range(N):
        for i in range(r):
            b = s * B[n * r + i]
            row = A[i * K:(i + 1) * K]
            for k in range(K):
                out[n * K + k] += b * row[k]
    return out

base, fused = load_dir(base_dir), load(os.path.join(fused_dir, "model.safetensors"))
pairs = adapter(adapter_dir)
cfg = json.load(open(os.path.join(base_dir, "config.json")))
bits = cfg.get("quantization", {}).get("bits")
stats = {"merged": 0, "resolved": 0, "elements": 0, "worst": 0.0}

def expect_bf16(name, got, exact, base_w=None):
    """got within one bf16 ulp (2^-7 relative) of exact; count where the base alone is not."""
    assert fused[name][0] == "BF16", (name, fused[name][0])
    for g, e, i in zip(got, exact, range(len(exact))):
        tol = 2.0 ** -7 * abs(e) + 1e-30
        if abs(g - e) > tol:
            sys.exit("%s[%d]: fused %r, exact %r (more than one bf16 ulp)" % (name, i, g, e))
        stats["worst"] = max(stats["worst"], abs(g - e) / tol)
        if base_w is not None and abs(base_w[i] - e) > tol:
            stats["resolved"] += 1
    if base_w is not None:
        stats["elements"] += len(exact)

expected_names = set(base)
for name in sorted(base):
    if quantized(base, name) and mode == "dequant":
        expected_names -= {name[:-7] + ".scales", name[:-7] + ".biases"}
if set(fused) != expected_names:
    sys.exit("fused tensors differ from the base's: extra %s, missing %s" %
             (sorted(set(fused) - expected_names)[:5], sorted(expected_names - set(fused))[:5]))
missing = set(pairs) - set(base)
assert not missing, missing

for name in sorted(fused):
    q = quantized(base, name)
    if name not in pairs and not (q and mode == "dequant"):
        if fused[name] != base[name] and not (name[:-7] + ".weight" in pairs and quantized(base, name[:-7] + ".weight")):
            sys.exit("%s: changed, but the adapter does not touch it" % name)
        continue
    if q:
        w, N, K, group = dequant(base, name, bits)
    else:
        (N, K), w = base[name][1], floats(base[name])
    if name not in pairs:  # a quantized weight dequantized
        expect_bf16(name, floats(fused[name]), w)
        continue
    exact = merged(w, N, K, pairs[name])
    stats["merged"] += 1
    if mode == "requant":  # same layout; within half a step of exact (plus bf16 rounding of scale and bias)
        stem = name[:-7]
        for suffix in (".weight", ".scales", ".biases"):
            assert fused[stem + suffix][1] == base[stem + suffix][1], (stem + suffix, fused[stem + suffix][1])
        got, _, _, _ = dequant(fused, name, bits)
        sc, bi = floats(fused[stem + ".scales"]), floats(fused[stem + ".biases"])
        levels, G = (1 << bits) - 1, K // group
        for i, (g, e) in enumerate(zip(got, exact)):
            s, b = sc[i // K * G + i % K // group], bi[i // K * G + i % K // group]
            tol = 0.5 * s + 2.0 ** -8 * (abs(b) + levels * s) + 1e-7
            if abs(g - e) > tol:
                sys.exit("%s[%d]: fused %r, exact %r, step %r" % (name, i, g, e, s))
            stats["worst"] = max(stats["worst"], abs(g - e) / tol)
            stats["resolved"] += abs(w[i] - e) > tol
        stats["elements"] += len(exact)
    else:
        expect_bf16(name, floats(fused[name]), exact, w)

# the directory: model.safetensors, config.json and the base's side files; nothing else
side = {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}
want = {"model.safetensors", "config.json"} | (side & set(os.listdir(base_dir)))
got_files = set(os.listdir(fused_dir))
if got_files != want:
    sys.exit("fused directory holds %s, expected %s" % (sorted(got_files), sorted(want)))
for f in want - {"model.safetensors", "config.json"}:
    assert open(os.path.join(fused_dir, f), "rb").read() == open(os.path.join(base_dir, f), "rb").read(), f
fcfg = json.load(open(os.path.join(fused_dir, "config.json")))
if mode == "dequant":
    cfg.pop("quantization", None), cfg.pop("quantization_config", None)
assert fcfg == cfg, "config.json: %s" % fcfg

assert stats["merged"] == len(pairs), (stats["merged"], len(pairs))
# the check discriminates: most merged elements are further from the base than the tolerance
assert stats["resolved"] > stats["elements"] // 4, stats
print("%s: %d merged weights as computed independently (worst error/tolerance %.2f; %d of %d elements "
      "resolve the adapter)" % (fused_dir, stats["merged"], stats["worst"], stats["resolved"], stats["elements"]))
PY
}

# shard BASE OUT: BASE's tensors split over two shards with an index, its side files, and files fuse
# must not copy (a reference, an adapter)
shard() {
    python3 - "$@" <<'PY'
import json, os, shutil, struct, sys
base, out = sys.argv[1:3]
os.makedirs(out)
b = open(os.path.join(base, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
names = list(h)
wmap = {}
for i, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
    fname = "model-%05d-of-00002.safetensors" % (i + 1)
    header, data = {}, b""
    for k in part:
        v = h[k]
        raw = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        header[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
        wmap[k] = fname
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    open(os.path.join(out, fname), "wb").write(struct.pack("<Q", len(hj)) + hj + data)
json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
for f in ("config.json", "generation_config.json", "reference.safetensors"):
    shutil.copy(os.path.join(base, f), out)
PY
}

if [ "$what" = errors ]; then
    o=$tmp/out
    # expect RC PATTERN ARGS...: one line on stderr holding PATTERN, exit RC, nothing written
    expect() {
        local want=$1 pattern=$2
        shift 2
        set +e; err=$("$bin" fuse "$@" 2>&1 >/dev/null); rc=$?; set -e
        [ "$rc" = "$want" ] || fail "'lmx fuse $*' exited $rc, expected $want: $err"
        [ "$(wc -l <<<"$err")" = 1 ] || fail "'lmx fuse $*' printed more than one line: $err"
        grep -qF -- "$pattern" <<<"$err" || fail "'lmx fuse $*': \"$err\" does not say \"$pattern\""
        [ ! -e "$o" ] || fail "'lmx fuse $*' left $o behind"
        echo "ok ($rc): $err"
    }
    "$bin" fuse --help >/dev/null || fail "fuse --help"
    expect 2 "required"
    expect 2 "required" "$M/llama" "$M/llama_lora/peft_adapter"
    expect 2 "too many" "$M/llama" "$M/llama_lora/peft_adapter" "$o" extra
    expect 2 "unknown option" "$M/llama" "$M/llama_lora/peft_adapter" "$o" --bogus
    expect 1 "GGUF bases are not supported" "$here/data/gguf/llama.gguf" "$M/llama_lora/peft_adapter" "$o"
    expect 1 "no such adapter" "$M/llama" "$tmp/nothing" "$o"
    # the llama adapter on qwen3: PEFT names its base class; mlx-lm's q_proj B is 64 wide, qwen3's is 128
    expect 1 "trained for LlamaForCausalLM" "$M/qwen3" "$M/llama_lora/peft_adapter" "$o"
    expect 1 "layers.0.self_attn.q_proj.lora_b\" is [4, 64]: it does not fit" "$M/qwen3" "$M/llama_lora/mlx_adapter" "$o"
    # adapters made here from the llama one: layer 1 renamed 7 (the model has 2); a NaN in a B matrix
    python3 - "$M/llama_lora/mlx_adapter" "$tmp/far" "$tmp/nan" <<'PY'
import json, math, os, shutil, struct, sys
src, far, nan = sys.argv[1:4]
b = open(os.path.join(src, "adapters.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
def write(d, rename, poison):
    os.makedirs(d)
    shutil.copy(os.path.join(src, "adapter_config.json"), d)
    header, data = {}, b""
    for k, v in h.items():
        raw = bytearray(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        if k == poison:
            assert v["dtype"] == "F32"
            raw[0:4] = struct.pack("<f", math.nan)
        header[rename(k)] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    open(os.path.join(d, "adapters.safetensors"), "wb").write(struct.pack("<Q", len(hj)) + hj + data)
write(far, lambda k: k.replace("layers.1.", "layers.7."), None)
write(nan, lambda k: k, "model.layers.1.mlp.down_proj.lora_b")
PY
    expect 1 "is for layer 7; the model has 2 layers" "$M/llama" "$tmp/far" "$o"
    expect 1 "\"model.layers.1.mlp.down_proj.lora_b\" holds NaN" "$M/llama" "$tmp/nan" "$o"
    mkdir "$tmp/full" && touch "$tmp/full/x"
    set +e; err=$("$bin" fuse "$M/llama" "$M/llama_lora/peft_adapter" "$tmp/full" 2>&1); rc=$?; set -e
    [ "$rc" = 1 ] && grep -qF "not an empty directory" <<<"$err" || fail "fuse into a non-empty directory: $rc $err"
    echo "ok: every error exits as documented with one line"
    exit 0
fi

m=$what lora=$M/${what}_lora
for fmt in peft mlx; do
    "$bin" fuse "$M/$m" "$lora/${fmt}_adapter" "$tmp/$fmt"
    verify dense "$M/$m" "$lora/${fmt}_adapter" "$tmp/$fmt"
    "$bin" check-reference "$tmp/$fmt" --reference "$lora/reference.safetensors" --backend cpu --tolerance rel:1e-2
done

# a sharded base: one model.safetensors out, no index, no reference or adapter files
shard "$M/$m" "$tmp/sharded"
cp -r "$lora/peft_adapter/." "$fixtures/tokenizers/llama3/"tokenizer*.json "$tmp/sharded/"
echo '{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}' >"$tmp/sharded/chat_template.jinja"
"$bin" fuse "$tmp/sharded" "$lora/peft_adapter" "$tmp/from_shards"
verify dense "$tmp/sharded" "$lora/peft_adapter" "$tmp/from_shards"

for bits in 4 8; do
    q=$M/${m}_q$bits
    [ -d "$q" ] || continue
    qref=$here/data/lora/${m}_q$bits/reference.safetensors
    if [ -f "$qref" ]; then  # the same quantized base with the adapter unmerged
        requant=$([ "$bits" = 8 ] && echo rel:0.05 || echo rel:0.40)
        dequant=rel:1e-2
    else                     # the dense base with the adapter
        qref=$lora/reference.safetensors
        requant=$([ "$bits" = 8 ] && echo rel:0.07 || echo rel:0.6)
        dequant=$([ "$bits" = 8 ] && echo rel:0.05 || echo rel:0.5)
    fi
    "$bin" fuse "$q" "$lora/peft_adapter" "$tmp/q$bits"
    verify requant "$q" "$lora/peft_adapter" "$tmp/q$bits"
    "$bin" check-reference "$tmp/q$bits" --reference "$qref" --backend cpu --tolerance "$requant"
    "$bin" fuse "$q" "$lora/mlx_adapter" "$tmp/q${bits}_dense" --dequantize
    verify dequant "$q" "$lora/mlx_adapter" "$tmp/q${bits}_dense"
    "$bin" check-reference "$tmp/q${bits}_dense" --reference "$qref" --backend cpu --tolerance "$dequant"
done
echo "ok: fuse $m"
