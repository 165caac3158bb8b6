#!/usr/bin/env python3
"""A float64 numpy forward pass of the Gemma 4 text model, written from transformers 5.17's
modeling_gemma4.py (Gemma4TextModel / Gemma4ForCausalLM, eager attention), for fixtures of shapes the
shared ones lack.  It is first checked against the HF references of the shared gemma4 fixtures (the
same math on every path they exercise), then used to make a variant fixture in their layout.

usage: numpy_gemma4.py check MODEL_DIR              teacher-forced logits vs MODEL_DIR/reference.safetensors
       numpy_gemma4.py make-variant FIXTURES OUT    tests/data/gemma4_variant from FIXTURES/models/gemma4_kv:
           layer scalars != 1, double-wide MLPs on the shared-KV layers, full-attention layers sized by
           global_head_dim / num_global_key_value_heads (no per_layer_config: 1 kv head of 32 under
           K = V), a partial rotary factor of 0.5 and final logit soft-capping (needs numpy only)
       numpy_gemma4.py gguf MODEL.gguf CONFIG_DIR OUT   the reference of a (quantized) GGUF copy of the model
           in CONFIG_DIR (as tests/ref/hf_to_gguf.py writes it): every tensor dequantized by gguf-py
           (gguf.quants.dequantize), named back to HF's, the config and token ids from CONFIG_DIR; OUT in
           the layout of CONFIG_DIR/reference.safetensors (needs the gguf package too)
"""
import json
import os
import struct
import sys

import numpy as np

# ---- safetensors ---------------------------------------------------------------------------------

DT = {"BF16": (2, None), "F32": (4, "<f4"), "F16": (2, "<f2"), "I32": (4, "<i4"), "I64": (8, "<i8"), "F64": (8, "<f8")}


def st_read(path):
    """name -> (dtype, shape, raw bytes)"""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}


def as_f64(t):
    dtype, shape, raw = t
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).reshape(shape)
    return np.frombuffer(raw, dtype=DT[dtype][1]).astype(np.float64).reshape(shape)


def to_bf16(x):
    """float values -> raw bf16 bytes, rounded to nearest even"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def st_write(path, items):
    """items: name -> (dtype, shape, raw bytes), written in name order"""
    header, off = {}, 0
    for k in sorted(items):
        dtype, shape, raw = items[k]
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for k in sorted(items):
            f.write(items[k][2])


# ---- the model -----------------------------------------------------------------------------------


class Gemma4:
    def __init__(self, cfg, tensors):
        c = cfg.get("text_config", cfg)
        self.c = c
        self.w = {k: as_f64(v) for k, v in tensors.items()}
        pre = "model.language_model." if any(k.startswith("model.language_model.") for k in self.w) else "model."
        self.pre = pre
        self.L = c["num_hidden_layers"]
        self.C = c["hidden_size"]
        self.H = c["num_attention_heads"]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.types = list(c.get("layer_types") or
                          ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(self.L)])
        self.types[-1] = "full_attention"
        self.window = c.get("sliding_window", 512)
        self.P = c.get("hidden_size_per_layer_input", 256) or 0
        # per-layer head sizes: per_layer_config, or global_head_dim / num_global_key_value_heads
        self.D = [c.get("head_dim", 256)] * self.L
        self.Hk = [c.get("num_key_value_heads", self.H)] * self.L
        plc = c.get("per_layer_config")
        if plc is None:
            for i, t in enumerate(self.types):
                if t == "full_attention":
                    self.D[i] = c.get("global_head_dim", 512)
                    if c.get("attention_k_eq_v", True) and c.get("num_global_key_value_heads") is not None:
                        self.Hk[i] = c["num_global_key_value_heads"]
        else:
            for k, o in plc.items():
                self.D[int(k)] = o.get("head_dim", self.D[int(k)])
                self.Hk[int(k)] = o.get("num_key_value_heads", self.Hk[int(k)])
        self.first_shared = self.L - c.get("num_kv_shared_layers", 0)
        prev = self.types[:self.first_shared]
        self.store = [i < self.first_shared and i == len(prev) - 1 - prev[::-1].index(self.types[i])
                      for i in range(self.L)]
        self.rope = c.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}
        self.softcap = c.get("final_logit_softcapping")
        self.moe = c.get("enable_moe_block", False)
        self.k_eq_v = c.get("attention_k_eq_v", False)

    def W(self, name):
        return self.w[self.pre + name]

    def inv_freq(self, layer):
        p, D = self.rope[self.types[layer]], self.D[layer]
        base, factor = p["rope_theta"], p.get("factor", 1.0)
        if p.get("rope_type", "default") == "proportional":
            n = int(p.get("partial_rotary_factor", 1.0) * D // 2)
            f = np.concatenate([1.0 / base ** (np.arange(0, 2 * n, 2) / D), np.zeros(D // 2 - n)])
        else:
            f = 1.0 / base ** (np.arange(0, D, 2) / D)
        return f / factor

    def rms(self, x, w=None):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return y * w if w is not None else y

    @staticmethod
    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    @staticmethod
    def rotate(x, pos, f):  # x [T, h, D], rotate-half
        ang = pos[:, None] * f[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], 1))[:, None], np.sin(np.concatenate([ang, ang], 1))[:, None]
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def logits(self, ids):
        """teacher-forced next-token logits [T, V] of ids (one sequence from position 0)"""
        ids = np.asarray(ids)
        T, C, L, P = len(ids), self.C, self.L, self.P
        pos = np.arange(T, dtype=np.float64)
        x = self.W("embed_tokens.weight")[ids] * C ** 0.5
        if P:
            proj = (x @ self.W("per_layer_model_projection.weight").T * C ** -0.5).reshape(T, L, P)
            proj = self.rms(proj, self.W("per_layer_projection_norm.weight"))
            tok = self.W("embed_tokens_per_layer.weight")[ids].reshape(T, L, P) * P ** 0.5
            ple = (proj + tok) * 2 ** -0.5
        shared = {}
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        for l in range(L):
            p = "layers.%d." % l
            D, Hk, H = self.D[l], self.Hk[l], self.H
            f = self.inv_freq(l)
            h = self.rms(x, self.W(p + "input_layernorm.weight"))
            q = (h @ self.W(p + "self_attn.q_proj.weight").T).reshape(T, H, D)
            q = self.rotate(self.rms(q, self.W(p + "self_attn.q_norm.weight")), pos, f)
            if l >= self.first_shared:
                k, v = shared[self.types[l]]
            else:
                k = (h @ self.W(p + "self_attn.k_proj.weight").T).reshape(T, Hk, D)
                vname = self.pre + p + "self_attn.v_proj.weight"
                use_v = not (self.k_eq_v and self.types[l] == "full_attention")
                v = (h @ self.w[vname].T).reshape(T, Hk, D) if use_v else k
                k = self.rotate(self.rms(k, self.W(p + "self_attn.k_norm.weight")), pos, f)
                v = self.rms(v)
                if self.store[l]:
                    shared[self.types[l]] = (k, v)
            mask = j <= i
            if self.types[l] == "sliding_attention":
                mask = mask & (i - j < self.window)
            rep = H // k.shape[1]
            kk, vv = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,shd->hts", q, kk)  # scaling 1
            s = np.where(mask[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = np.einsum("hts,shd->thd", s, vv).reshape(T, H * D)
            x = x + self.rms(a @ self.W(p + "self_attn.o_proj.weight").T, self.W(p + "post_attention_layernorm.weight"))
            r = x
            h = self.rms(x, self.W(p + "pre_feedforward_layernorm.weight"))
            m = (self.gelu(h @ self.W(p + "mlp.gate_proj.weight").T) * (h @ self.W(p + "mlp.up_proj.weight").T)) @ \
                self.W(p + "mlp.down_proj.weight").T
            if self.moe:
                m1 = self.rms(m, self.W(p + "post_feedforward_layernorm_1.weight"))
                hr = self.rms(r) * self.W(p + "router.scale") * C ** -0.5
                z = hr @ self.W(p + "router.proj.weight").T
                pr = np.exp(z - z.max(-1, keepdims=True))
                pr /= pr.sum(-1, keepdims=True)
                K = self.c["top_k_experts"]
                top = np.argsort(-pr, axis=-1, kind="stable")[:, :K]
                tw = np.take_along_axis(pr, top, -1)
                tw = tw / tw.sum(-1, keepdims=True) * self.W(p + "router.per_expert_scale")[top]
                h2 = self.rms(r, self.W(p + "pre_feedforward_layernorm_2.weight"))
                gu, dn = self.W(p + "experts.gate_up_proj"), self.W(p + "experts.down_proj")
                Fm = gu.shape[1] // 2
                acc = np.zeros_like(r)
                for t in range(T):
                    for kk_, e in enumerate(top[t]):
                        y = gu[e] @ h2[t]
                        acc[t] += tw[t, kk_] * (dn[e] @ (self.gelu(y[:Fm]) * y[Fm:]))
                m = m1 + self.rms(acc, self.W(p + "post_feedforward_layernorm_2.weight"))
            x = r + self.rms(m, self.W(p + "post_feedforward_layernorm.weight"))
            if P:
                g = self.gelu(x @ self.W(p + "per_layer_input_gate.weight").T) * ple[:, l]
                x = x + self.rms(g @ self.W(p + "per_layer_projection.weight").T,
                                 self.W(p + "post_per_layer_input_norm.weight"))
            x = x * self.W(p + "layer_scalar")[0]
        x = self.rms(x, self.W("norm.weight"))
        z = x @ self.W("embed_tokens.weight").T
        if self.softcap:
            z = np.tanh(z / self.softcap) * self.softcap
        return z


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    return Gemma4(cfg, st_read(os.path.join(d, "model.safetensors")))


def ints(ref, name):
    dtype, shape, raw = ref[name]
    return np.frombuffer(raw, dtype=DT[dtype][1]).astype(np.int64).reshape(shape)


# ---- check ---------------------------------------------------------------------------------------


def check(d):
    model, ref = load(d), st_read(os.path.join(d, "reference.safetensors"))
    worst = 0.0
    for which in ("short", "long"):
        seq = ints(ref, which + "_sequence")
        want = as_f64(ref[which + "_logits"])
        got = model.logits(seq[:-1])
        err = np.abs(got - want).max()
        worst = max(worst, err / (2e-3 + 1e-3 * np.abs(want).max()))
        print("%s %s: max|err| %.3e" % (d, which, err))
    lens = ints(ref, "batch_lengths")
    for b, n in enumerate(lens):
        got = model.logits(ints(ref, "batch_prompts")[b, :n])[-1]
        err = np.abs(got - as_f64(ref["batch_last_logits"])[b]).max()
        print("%s batch %d: max|err| %.3e" % (d, b, err))
    if worst > 0.01:
        sys.exit("FAIL: the numpy pass differs from the HF reference (err/tol %.3f)" % worst)


# ---- make-variant --------------------------------------------------------------------------------


def make_variant(fixtures, out):
    src = os.path.join(fixtures, "models", "gemma4_kv")
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = st_read(os.path.join(src, "model.safetensors"))
    ref = st_read(os.path.join(src, "reference.safetensors"))
    rng = np.random.default_rng(4)
    L = cfg["num_hidden_layers"]
    cfg.pop("per_layer_config")
    cfg.update(global_head_dim=32, num_global_key_value_heads=1, use_double_wide_mlp=True,
               final_logit_softcapping=5.0)
    cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0.5
    for l in range(L):
        p = "model.layers.%d." % l
        t[p + "layer_scalar"] = ("BF16", [1], to_bf16(rng.uniform(0.5, 1.5, 1)))
        k = p + "self_attn.k_proj.weight"
        if cfg["layer_types"][l] == "full_attention" and k in t:  # 1 kv head of 32: the first 32 rows
            dtype, shape, raw = t[k]
            t[k] = (dtype, [32, shape[1]], raw[:32 * shape[1] * 2])
        if l >= L - cfg["num_kv_shared_layers"]:  # double-wide: 2 F hidden units, new weights of the same spread
            for name, shape in (("gate_proj", [256, 64]), ("up_proj", [256, 64]), ("down_proj", [64, 256])):
                w = p + "mlp.%s.weight" % name
                std = as_f64(t[w]).std()
                t[w] = ("BF16", shape, to_bf16(rng.normal(0, std, shape)))
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    st_write(os.path.join(out, "model.safetensors"), t)
    for f in ("generation_config.json",):
        open(os.path.join(out, f), "wb").write(open(os.path.join(src, f), "rb").read())

    model = load(out)
    items, margins = {}, {}
    for which in ("short", "long"):
        prompt = ints(ref, which + "_prompt")
        n = len(ints(ref, which + "_sequence")) - len(prompt)
        seq = list(prompt)
        margin = np.inf
        for _ in range(n):  # greedy
            z = model.logits(seq)[-1]
            top2 = np.sort(z)[-2:]
            margin = min(margin, top2[1] - top2[0])
            seq.append(int(np.argmax(z)))
        logits = model.logits(seq[:-1])
        items[which + "_prompt"] = ("I32", [len(prompt)], np.asarray(prompt, "<i4").tobytes())
        items[which + "_sequence"] = ("I32", [len(seq)], np.asarray(seq, "<i4").tobytes())
        items[which + "_logits"] = ("F32", list(logits.shape), logits.astype("<f4").tobytes())
        margins[which + "_min_margin"] = float(margin)
    prompts, lens = ints(ref, "batch_prompts"), ints(ref, "batch_lengths")
    last = np.stack([model.logits(prompts[b, :n])[-1] for b, n in enumerate(lens)])
    items["batch_prompts"] = ("I32", list(prompts.shape), prompts.astype("<i4").tobytes())
    items["batch_lengths"] = ("I32", list(lens.shape), lens.astype("<i4").tobytes())
    items["batch_last_logits"] = ("F32", list(last.shape), last.astype("<f4").tobytes())
    st_write(os.path.join(out, "reference.safetensors"), items)
    meta = dict(margins, model="gemma4_variant", model_type=cfg["model_type"], weights="bf16",
                reference="float64 numpy (tests/ref/numpy_gemma4.py), checked against the HF gemma4 fixtures",
                note="logits[t] are the next-token logits after sequence[:t+1]; batch_last_logits are per prompt, unpadded")
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=1)
    print("wrote %s (margins %s)" % (out, margins))


# ---- gguf ----------------------------------------------------------------------------------------

# GGUF names (llama.cpp's converter, gguf-py's tensor tables) back to HF's: whole names, then layer roles
GGUF_TOP = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
            "per_layer_token_embd.weight": "embed_tokens_per_layer.weight",
            "per_layer_model_proj.weight": "per_layer_model_projection.weight",
            "per_layer_proj_norm.weight": "per_layer_projection_norm.weight"}
GGUF_LAYER = {"ffn_gate_inp.scale": "router.scale", "ffn_down_exps.scale": "router.per_expert_scale",
              "ffn_gate_up_exps.weight": "experts.gate_up_proj", "ffn_down_exps.weight": "experts.down_proj",
              "layer_output_scale.weight": "layer_scalar"}
GGUF_ROLE = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "ffn_gate_inp": "router.proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
             "post_ffw_norm_1": "post_feedforward_layernorm_1", "post_ffw_norm_2": "post_feedforward_layernorm_2",
             "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm"}


def gguf_reference(path, cdir, out):
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "gemma4"
    cfg = json.load(open(os.path.join(cdir, "config.json")))
    tensors, types = {}, {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in reversed(t.shape)])
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        if t.name == "rope_freqs.weight":
            freqs = a
            continue
        if t.name in GGUF_TOP:
            name = "model." + GGUF_TOP[t.name]
        else:
            _, layer, rest = t.name.split(".", 2)
            role, kind = rest.rsplit(".", 1)
            name = "model.layers.%s.%s" % (layer, GGUF_LAYER.get(rest) or GGUF_ROLE[role] + "." + kind)
        tensors[name] = ("F64", list(a.shape), a.astype("<f8").tobytes())
    print("gguf tensor types:", types)
    model = Gemma4(cfg, tensors)
    full = [l for l in range(model.L) if model.types[l] == "full_attention"][0]
    want = model.inv_freq(full)  # the converter's proportional RoPE: 1 for rotated pairs, 1e30 for the rest
    np.testing.assert_allclose(np.where(freqs < 1e29, 1.0 / freqs, 0.0) * (1.0 / model.rope["full_attention"]["rope_theta"]
                               ** (np.arange(0, model.D[full], 2) / model.D[full])), want, rtol=1e-12)
    ref = st_read(os.path.join(cdir, "reference.safetensors"))
    items = {}
    for which in ("short", "long"):
        seq = ints(ref, which + "_sequence")
        logits = model.logits(seq[:-1])
        items[which + "_prompt"] = ref[which + "_prompt"]
        items[which + "_sequence"] = ref[which + "_sequence"]
        items[which + "_logits"] = ("F32", list(logits.shape), logits.astype("<f4").tobytes())
    lens = ints(ref, "batch_lengths")
    last = np.stack([model.logits(ints(ref, "batch_prompts")[b, :n])[-1] for b, n in enumerate(lens)])
    items["batch_prompts"], items["batch_lengths"] = ref["batch_prompts"], ref["batch_lengths"]
    items["batch_last_logits"] = ("F32", list(last.shape), last.astype("<f4").tobytes())
    st_write(out, items)
    print("wrote", out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "make-variant":
        make_variant(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "gguf":
        gguf_reference(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
