#!/usr/bin/env python3
"""An exact float64 numpy reference for a LoRA adapter on a (possibly quantized) llama, qwen3 or
qwen3_moe base (or for the base alone), independent of lmx's code.  Output: a reference.safetensors in the fixture layout
(../shared/fixtures/README.md): short_/long_ prompt, sequence and teacher-forced logits, and the
right-padded batch's per-prompt last logits.  The token ids are copied from IDS (normally the
fixture's <m>_lora/reference.safetensors); only the logits are computed here (float64, stored F32).

The base weights come from one of
  - an HF directory with bf16 model.safetensors (the dense fixtures);
  - an MLX-quantized directory (model.safetensors holding NAME.weight U32 / .scales / .biases, config
    "quantization": {group_size, bits}): dequantized here as w = q * scale + bias per group;
  - a GGUF file: every tensor dequantized with gguf.quants.dequantize, names mapped back to HF's,
    llama q/k rows un-permuted (inverse of llama.cpp's converter permutation), qwen3moe's stacked
    experts ffn_{gate,up,down}_exps [E, rows, cols] split back into each expert's matrices.
Every model hyper-parameter is read from CONFIG_DIR/config.json (default: BASE when it is a
directory); for a GGUF file the metadata is checked against it, and so is the llama3 rope_freqs tensor.

The math follows HF transformers' llama / qwen3 modelling: RMSNorm x * rsqrt(mean(x^2) + eps) * w,
rotate-half RoPE (llama3 frequency scaling when configured), per-head q/k RMSNorm before RoPE (qwen3),
GQA, causal softmax attention with scale head_dim^-0.5, SiLU-gated MLP, tied or untied lm_head;
qwen3_moe's MoE layers (modeling_qwen3_moe.py): router softmax over the experts, the top k (the lower
index first among equal probabilities), renormalised with norm_topk_prob, each chosen expert's SiLU-gated
MLP weighted by its probability (decoder_sparse_step and mlp_only_layers keep some layers dense).
LoRA (PEFT folder: adapter_config.json + adapter_model.safetensors, or mlx-lm folder:
adapter_config.json + adapters.safetensors) adds scale * B(A x) to every adapted projection, with
scale = lora_alpha / r (PEFT) or lora_parameters.scale (mlx-lm).

usage: make_lora_reference.py BASE IDS.safetensors OUT.safetensors [--adapter DIR] [--config CONFIG_DIR]
       (needs numpy and safetensors; gguf for a GGUF base)
"""
import argparse
import json
import math
import os
import struct

import numpy as np
from safetensors.numpy import save_file

PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


# ---- safetensors reading (own parser: numpy has no bf16) -------------------------------------------
def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    dt = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64,
          "U32": np.uint32, "BF16": np.uint16}
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt[v["dtype"]]).reshape(v["shape"])
        if v["dtype"] == "BF16":  # bf16 -> f32 is exact: the 16 bits are the high half of a float
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[k] = a
    return out


def dequant_mlx(wq, scales, biases, bits, group):
    """MLX affine layout: element j of a row is bits (j % (32/bits))*bits.. of word j/(32/bits)."""
    per = 32 // bits
    rows = wq.shape[0]
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    q = (wq[:, :, None] >> shifts[None, None, :]) & np.uint32((1 << bits) - 1)
    q = q.reshape(rows, -1).astype(np.float64)  # [out, in]
    cols = q.shape[1]
    assert cols == scales.shape[1] * group, (wq.shape, scales.shape, group)
    s = np.repeat(scales.astype(np.float64), group, axis=1)
    b = np.repeat(biases.astype(np.float64), group, axis=1)
    return q * s + b


def load_hf_dir(d, cfg):
    raw = read_safetensors(os.path.join(d, "model.safetensors"))
    quant = cfg.get("quantization")
    W = {}
    for k, a in raw.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[:-len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in raw:
            assert quant, f"{k} is quantized but config.json has no quantization"
            W[k] = dequant_mlx(a, raw[base + ".scales"], raw[base + ".biases"], quant["bits"], quant["group_size"])
        else:
            assert a.dtype != np.uint32, k
            W[k] = a.astype(np.float64)
    return W


# ---- GGUF ---------------------------------------------------------------------------------------
GGUF_ROLES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate"}
GGUF_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}


def unpermute(w, n_head):  # inverse of llama.cpp's HF -> GGUF row permutation of q/k
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path, cfg, hp):
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields.get(name)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    assert arch == GGUF_ARCH[cfg["model_type"]], (arch, cfg["model_type"])
    # the GGUF metadata must describe the model of config.json
    for key, want in ((f"{arch}.block_count", hp["L"]), (f"{arch}.embedding_length", hp["C"]),
                      (f"{arch}.attention.head_count", hp["H"]), (f"{arch}.attention.head_count_kv", hp["Hk"]),
                      (f"{arch}.feed_forward_length", cfg["intermediate_size"])):
        assert field(key) == want, (key, field(key), want)
    assert abs(field(f"{arch}.attention.layer_norm_rms_epsilon") - hp["eps"]) <= 1e-6 * hp["eps"]
    assert abs(field(f"{arch}.rope.freq_base") - hp["theta"]) <= 1e-6 * hp["theta"]
    if hp["E"]:
        for key, want in ((f"{arch}.expert_count", hp["E"]), (f"{arch}.expert_used_count", hp["K"]),
                          (f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])):
            assert field(key) == want, (key, field(key), want)
    W, types = {}, {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists dimensions innermost first
        a = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        if t.name == "rope_freqs.weight":
            W["rope_freqs"] = a
            continue
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, role, kind = t.name.split(".")
            if role in GGUF_EXPERTS:  # [E, rows, cols]: one matrix per expert
                for e in range(a.shape[0]):
                    W[f"model.layers.{layer}.mlp.experts.{e}.{GGUF_EXPERTS[role]}.{kind}"] = a[e]
                continue
            name = f"model.layers.{layer}.{GGUF_ROLES[role]}.{kind}"
            if arch == "llama" and role in ("attn_q", "attn_k"):
                a = unpermute(a, hp["H"] if role == "attn_q" else hp["Hk"])
        W[name] = a
    print("gguf tensor types:", types)
    return W


# ---- config -------------------------------------------------------------------------------------
def hyper(cfg):
    mt = cfg["model_type"]
    assert mt in ("llama", "qwen3", "qwen3_moe"), mt
    assert not cfg.get("attention_bias") and not cfg.get("mlp_bias"), "biases are not supported"
    assert cfg.get("hidden_act", "silu") == "silu"
    H = cfg["num_attention_heads"]
    hp = dict(arch=mt, L=cfg["num_hidden_layers"], C=cfg["hidden_size"], H=H,
              Hk=cfg.get("num_key_value_heads") or H, D=cfg.get("head_dim") or cfg["hidden_size"] // H,
              eps=cfg["rms_norm_eps"], V=cfg["vocab_size"], tied=cfg.get("tie_word_embeddings", False),
              qk_norm=mt in ("qwen3", "qwen3_moe"), E=0)
    if mt == "qwen3_moe":  # both config styles: num_experts or num_local_experts
        step, only = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
        hp.update(E=cfg.get("num_experts") or cfg["num_local_experts"], K=cfg["num_experts_per_tok"],
                  norm_topk=cfg.get("norm_topk_prob", False),
                  moe=[l not in only and (l + 1) % step == 0 for l in range(hp["L"])])
    rp = dict(cfg.get("rope_parameters") or {})
    if cfg.get("rope_scaling"):  # legacy keys
        rp.update(cfg["rope_scaling"])
    hp["theta"] = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rtype = rp.get("rope_type", rp.get("type", "default"))
    D = hp["D"]
    inv = 1.0 / hp["theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if rtype == "llama3":  # HF's _compute_llama3_parameters
        factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, smoothed, scaled)
    else:
        assert rtype == "default", rtype
    hp["inv_freq"] = inv
    hp["rope_type"] = rtype
    return hp


# ---- LoRA ---------------------------------------------------------------------------------------
def load_adapter(d):
    """{hf module name ('model.layers.N.self_attn.q_proj'): (A [r, in], B [out, r], scale)}."""
    acfg = json.load(open(os.path.join(d, "adapter_config.json")))
    out = {}
    if os.path.exists(os.path.join(d, "adapter_model.safetensors")):  # PEFT
        assert acfg.get("peft_type", "LORA") == "LORA"
        assert not acfg.get("use_rslora") and not acfg.get("use_dora") and not acfg.get("fan_in_fan_out")
        assert not acfg.get("rank_pattern") and not acfg.get("alpha_pattern")
        scale = acfg["lora_alpha"] / acfg["r"]
        t = read_safetensors(os.path.join(d, "adapter_model.safetensors"))
        for k, a in t.items():
            if ".lora_A." in k:
                mod = k.split(".lora_A.")[0]
                mod = mod[len("base_model.model."):] if mod.startswith("base_model.model.") else mod
                out[mod] = (a.astype(np.float64), t[k.replace(".lora_A.", ".lora_B.")].astype(np.float64), scale)
    else:  # mlx-lm: lora_a = A^T [in, r], lora_b = B^T [r, out]
        scale = acfg["lora_parameters"]["scale"]
        t = read_safetensors(os.path.join(d, "adapters.safetensors"))
        for k, a in t.items():
            if k.endswith(".lora_a"):
                mod = k[:-len(".lora_a")]
                out[mod] = (a.T.astype(np.float64), t[mod + ".lora_b"].T.astype(np.float64), scale)
    return out


# ---- forward ------------------------------------------------------------------------------------
def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, inv):  # x [T, h, D], HF rotate-half form
    ang = pos[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def moe(h, W, p, hp):
    """qwen3_moe's sparse block on h [T, C]: softmax router, top K experts, SiLU-gated expert MLPs"""
    z = h @ W[p + "mlp.gate.weight"].T  # [T, E]
    prob = np.exp(z - z.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    top = np.argsort(-prob, axis=-1, kind="stable")[:, :hp["K"]]
    tw = np.take_along_axis(prob, top, -1)
    if hp["norm_topk"]:
        tw = tw / tw.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for k, e in enumerate(top[t]):
            q = f"{p}mlp.experts.{e}."
            g = W[q + "gate_proj.weight"] @ h[t]
            out[t] += tw[t, k] * (W[q + "down_proj.weight"] @ (g / (1 + np.exp(-g)) * (W[q + "up_proj.weight"] @ h[t])))
    return out


def forward(ids, W, lora, hp):
    T, C, H, Hk, D, eps = len(ids), hp["C"], hp["H"], hp["Hk"], hp["D"], hp["eps"]

    def lin(x, mod):
        y = x @ W[mod + ".weight"].T
        if mod in lora:
            A, B, s = lora[mod]
            y = y + s * ((x @ A.T) @ B.T)
        return y

    x = W["model.embed_tokens.weight"][ids]
    pos = np.arange(T, dtype=np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    rep = H // Hk
    for l in range(hp["L"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").reshape(T, H, D)
        k = lin(h, p + "self_attn.k_proj").reshape(T, Hk, D)
        v = lin(h, p + "self_attn.v_proj").reshape(T, Hk, D)
        if hp["qk_norm"]:
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, hp["inv_freq"]), rope(k, pos, hp["inv_freq"])
        att = np.zeros((T, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh // rep].T / math.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // rep]
        x = x + lin(att.reshape(T, H * D), p + "self_attn.o_proj")
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        if hp["E"] and hp["moe"][l]:
            x = x + moe(h, W, p, hp)
            continue
        g = lin(h, p + "mlp.gate_proj")
        x = x + lin(g / (1 + np.exp(-g)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = W["model.embed_tokens.weight"] if hp["tied"] else W["lm_head.weight"]
    return rms(x, W["model.norm.weight"], eps) @ head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("ids")
    ap.add_argument("out")
    ap.add_argument("--adapter")
    ap.add_argument("--config")
    a = ap.parse_args()
    cdir = a.config or (a.base if os.path.isdir(a.base) else None)
    assert cdir, "a GGUF base needs --config DIR (the HF fixture of the same model)"
    cfg = json.load(open(os.path.join(cdir, "config.json")))
    hp = hyper(cfg)
    if os.path.isdir(a.base):
        W = load_hf_dir(a.base, cfg)
    else:
        W = load_gguf(a.base, cfg, hp)
        if hp["rope_type"] == "llama3":  # the converter's rope_freqs are the divisors of inv_freq
            theta_inv = 1.0 / hp["theta"] ** (np.arange(0, hp["D"], 2, dtype=np.float64) / hp["D"])
            np.testing.assert_allclose(theta_inv / W.pop("rope_freqs"), hp["inv_freq"], rtol=1e-6)
        else:
            assert "rope_freqs" not in W
    if hp["tied"]:
        assert "lm_head.weight" not in W or np.array_equal(W["lm_head.weight"], W["model.embed_tokens.weight"])
    lora = load_adapter(a.adapter) if a.adapter else {}
    want = {f"model.layers.{l}.{p}" for l in range(hp["L"]) for p in PROJ}
    if lora:
        assert set(lora) == want, sorted(set(lora) ^ want)
        for mod, (A, B, s) in lora.items():
            w = W[mod + ".weight"]
            assert A.shape[1] == w.shape[1] and B.shape[0] == w.shape[0] and A.shape[0] == B.shape[1], mod
    print(f"{hp['arch']}: {hp['L']} layers, C={hp['C']} H={hp['H']} Hk={hp['Hk']} D={hp['D']} V={hp['V']}, "
          f"rope {hp['rope_type']} theta {hp['theta']:g}, {len(lora)} LoRA modules"
          + (f" scale {next(iter(lora.values()))[2]:g}" if lora else ""))

    ids = read_safetensors(a.ids)
    ref = {}
    for s in ("short", "long"):
        if s + "_sequence" not in ids:
            continue
        seq = ids[s + "_sequence"]
        ref[s + "_prompt"] = ids[s + "_prompt"].copy()
        ref[s + "_sequence"] = seq.copy()
        ref[s + "_logits"] = forward(seq[:-1].astype(np.int64), W, lora, hp).astype(np.float32)
    if "batch_prompts" in ids:
        bp, bl = ids["batch_prompts"], ids["batch_lengths"]
        ref["batch_prompts"] = bp.copy()
        ref["batch_lengths"] = bl.copy()
        ref["batch_last_logits"] = np.stack(
            [forward(bp[i, :int(n)].astype(np.int64), W, lora, hp)[-1] for i, n in enumerate(bl)]).astype(np.float32)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, a.out)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
