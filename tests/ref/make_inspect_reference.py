#!/usr/bin/env python3
"""Reference keys and attention probabilities for `lmx inspect` / lmx_inspect_ids (tests/test_inspect.c).

For each fixture model, HF transformers (eager attention, float64; float32 for gemma4, which has no float64
path) runs the fixture's short_prompt and long_prompt (ids from reference.safetensors: no tokenizer) and
this script writes tests/data/inspect/<model>.safetensors:

  short_prompt, long_prompt             I32 [T]            the ids, as in the fixture
  short.layers.N.keys, long.layers.N.keys   F32 [Hk, T, D]  layer N's post-RoPE keys
  short.layers.N.probs, long.layers.N.probs F32 [H, T, T]   layer N's attention probabilities (eager's
                                                            output_attentions: causal, sliding window,
                                                            soft-capping applied; 0 where masked)
  metadata: "layers.N.shared_from" = the layer whose keys layer N attends over (N itself unless shared),
            "dtype", "transformers", "max_logit_diff_short" / "max_logit_diff_long" (against the fixture's
            logits: the HF pass is the one the fixtures were made with).

Where the keys come from (transformers 5.17):
  - past_key_values: the script passes a DynamicCache() made without the config, so every layer's cache is a
    full DynamicLayer.  The config's cache (DynamicCache(config=...)) would keep only the last
    sliding_window - 1 positions of a sliding layer (DynamicSlidingWindowLayer); the attention masks do not
    depend on the cache type, so the logits are the same (checked below against the fixture).
  - Gemma 4 shared-KV layers (the last num_kv_shared_layers): HF gives them no cache layer at all
    (get_layer_types_and_kwargs drops them, and their attention never calls past_key_values.update); they
    attend over shared_kv_states[layer_type], the full-length keys and values of the last earlier layer of
    their type (the one whose attention has store_full_length_kv).  The script asks for those states
    (return_shared_kv_states=True), writes them as the shared layers' keys, and names that layer in
    "layers.N.shared_from" from the modules' flags, so the sharing rule is HF's, not lmx's.

usage: make_inspect_reference.py FIXTURES_DIR OUT_DIR [MODEL ...]   (default models: llama gemma2 gemma3 gemma4_kv)
run where torch + transformers 5.17 are (pip install torch transformers==5.17.0 safetensors numpy).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DynamicCache

MODELS = ["llama", "gemma2", "gemma3", "gemma4_kv"]


def load(path):
    cfg = json.load(open(f"{path}/config.json"))
    dtype = torch.float32 if cfg["model_type"].startswith("gemma4") else torch.float64
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    return model, dtype


def decoder_layers(model):
    return model.model.layers


def run(model, ids):
    """keys [L] of [Hk, T, D] (None for shared layers), shared states by layer type, probs [L] of [H, T, T], logits."""
    cache = DynamicCache()  # every layer a full DynamicLayer: all T positions (see the docstring)
    kwargs = {"return_shared_kv_states": True} if hasattr(model.config, "num_kv_shared_layers") else {}
    with torch.no_grad():
        out = model(ids[None, :].long(), past_key_values=cache, use_cache=True, output_attentions=True, **kwargs)
    keys = []
    n_cached = len(cache.layers)
    for l in range(n_cached):
        keys.append(cache.layers[l].keys[0])  # [Hk, T, D]
    shared = getattr(out, "shared_kv_states", None) or {}
    probs = [a[0] for a in out.attentions]  # [H, T, T] each
    return keys, shared, probs, out.logits[0]


def shared_from(model):
    """Layer l -> the layer whose keys it attends over, from HF's own flags."""
    layers = decoder_layers(model)
    src = {}
    stores = {}  # layer type -> the layer with store_full_length_kv
    for l, layer in enumerate(layers):
        att = layer.self_attn
        if getattr(att, "store_full_length_kv", False):
            stores[att.layer_type] = l
    for l, layer in enumerate(layers):
        att = layer.self_attn
        src[l] = stores[att.layer_type] if getattr(att, "is_kv_shared_layer", False) else l
    return src


def main():
    fixtures, out_dir = sys.argv[1], sys.argv[2]
    models = sys.argv[3:] or MODELS
    os.makedirs(out_dir, exist_ok=True)
    for name in models:
        path = f"{fixtures}/models/{name}"
        ref = load_file(f"{path}/reference.safetensors")
        model, dtype = load(path)
        src = shared_from(model)
        tensors, meta = {}, {"dtype": str(dtype).replace("torch.", ""), "transformers": transformers.__version__,
                             "model": name}
        for l, s in src.items():
            meta[f"layers.{l}.shared_from"] = str(s)
        for tag in ("short", "long"):
            ids = ref[f"{tag}_prompt"]
            keys, shared, probs, logits = run(model, ids)
            T = ids.shape[0]
            for l, layer in enumerate(decoder_layers(model)):
                att = layer.self_attn
                if src[l] == l:
                    k = keys[l]
                else:  # a shared-KV layer: no cache of its own; the states it attended over
                    k = shared[att.layer_type][0][0]
                    assert torch.equal(k, keys[src[l]]), f"{name}: layer {l}'s shared keys are not layer {src[l]}'s"
                assert k.shape[1] == T, f"{name} layer {l}: {k.shape[1]} cached positions, {T} tokens"
                tensors[f"{tag}.layers.{l}.keys"] = k.float().clone()  # own memory: shared layers repeat a tensor
                tensors[f"{tag}.layers.{l}.probs"] = probs[l].float().contiguous()
            tensors[f"{tag}_prompt"] = ids.to(torch.int32).contiguous()
            # the fixture's logits after each prompt position: this pass is the fixtures' pass
            want = ref[f"{tag}_logits"][:T].double()  # row t: after sequence[:t+1], the prompt its first T
            diff = (logits.double() - want).abs().max().item()
            meta[f"max_logit_diff_{tag}"] = f"{diff:.3g}"
            assert diff < 2e-3 + 1e-3 * want.abs().max().item(), f"{name} {tag}: logits differ from the fixture by {diff}"
        save_file(tensors, f"{out_dir}/{name}.safetensors", metadata=meta)
        print(json.dumps({"model": name, **{k: v for k, v in meta.items() if not k.startswith("layers.")},
                          "shared": {l: s for l, s in src.items() if s != l}}))


if __name__ == "__main__":
    main()
