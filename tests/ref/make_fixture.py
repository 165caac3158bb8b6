#!/usr/bin/env python3
"""Make a tiny random-weight HF model directory plus reference logits in the layout of
../shared/fixtures (README there): short_/long_ prompt, sequence (prompt + greedy tokens) and
teacher-forced logits, and a right-padded batch with each prompt's last logits computed alone.
Weights are stored in bf16; the reference runs HF transformers in float64 on exactly those weights.

usage: make_fixture.py NAME OUT_DIR        (run where torch + transformers are installed)
NAME is one of the CASES below.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

CASES = {
    # llama with every projection biased (attention_bias, mlp_bias) and an untied head
    "llama_bias": lambda: LlamaConfig(**TINY, num_hidden_layers=2, attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=False, rope_theta=10000.0),
    # qwen2 whose layers >= max_window_layers use a 16-token sliding window (legacy keys only:
    # layer_types is removed from the written config.json)
    "qwen2_sliding": lambda: Qwen2Config(**TINY, num_hidden_layers=3, use_sliding_window=True,
                                         sliding_window=16, max_window_layers=1,
                                         tie_word_embeddings=True, rope_theta=10000.0),
}
DROP_KEYS = {"qwen2_sliding": ["layer_types"]}


def greedy(model, prompt, n):
    seq = prompt.clone()
    for _ in range(n):
        logits = model(seq[None]).logits[0, -1]
        seq = torch.cat([seq, logits.argmax().view(1)])
    return seq


def main():
    name, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(1234)
    cfg = CASES[name]()
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random everything, biases included (HF zero-initialises them)
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    cpath = os.path.join(out, "config.json")
    c = json.load(open(cpath))
    for k in DROP_KEYS.get(name, []):
        c.pop(k, None)
    json.dump(c, open(cpath, "w"), indent=2)

    model = model.to(torch.float64)
    g = torch.Generator().manual_seed(99)
    ref = {}
    margins = {}
    with torch.no_grad():
        for set_name, p_len, n_gen in (("short", 7, 24), ("long", 40, 24)):
            prompt = torch.randint(3, cfg.vocab_size, (p_len,), generator=g)
            seq = greedy(model, prompt, n_gen)
            logits = model(seq[None, :-1]).logits[0]
            top2 = logits[p_len - 1:].topk(2, dim=-1).values
            margins[f"{set_name}_min_margin"] = float((top2[:, 0] - top2[:, 1]).min())
            ref[f"{set_name}_prompt"] = prompt.int()
            ref[f"{set_name}_sequence"] = seq.int()
            ref[f"{set_name}_logits"] = logits.float()
        lengths = [5, 9, 13]
        prompts = torch.zeros(3, 13, dtype=torch.long)
        last = []
        for i, n in enumerate(lengths):
            prompts[i, :n] = torch.randint(3, cfg.vocab_size, (n,), generator=g)
            last.append(model(prompts[i:i + 1, :n]).logits[0, -1])
        ref["batch_prompts"] = prompts.int()
        ref["batch_lengths"] = torch.tensor(lengths, dtype=torch.int32)
        ref["batch_last_logits"] = torch.stack(last).float()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
    import transformers
    meta = dict(model=name, model_type=c["model_type"], weights="bf16", reference="float64 eager HF",
                transformers=transformers.__version__, **margins)
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
