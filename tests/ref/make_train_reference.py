#!/usr/bin/env python3
"""A LoRA training reference from HF transformers + peft, in the layout of ../shared/fixtures' llama_lora
(../shared/fixtures/README.md, "LoRA"): a small random Llama base whose heads are 64 wide (the shared
fixtures' are 16 and 32: on cuda, 64 is a head size whose flash kernels write the log-sum-exp that a
checkpointed layer's replay takes back), a random rank-4 adapter on all seven projections, and three AdamW
steps computed in float64 from the bf16 weights.

Writes OUT/llama_hd64/ (config.json, model.safetensors in bf16) and OUT/llama_hd64_lora/ (peft_adapter/,
train_reference.json, train_reference.safetensors: inputs, targets, mask, init.*, grad.*, after1.*).

usage: make_train_reference.py OUT        (needs torch, transformers, peft, safetensors)
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EMBED, GAIN = 0.3, 0.5  # embedding std; projections std GAIN / sqrt(in): bf16 training on cuda within its tolerance
OPT = {"name": "AdamW", "lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def main():
    out = sys.argv[1]
    base_dir, lora_dir = os.path.join(out, "llama_hd64"), os.path.join(out, "llama_hd64_lora")
    torch.manual_seed(64)
    cfg = LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that attention and the MLP matter to the loss
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (EMBED if "embed" in n else GAIN / p.shape[-1] ** 0.5))
    model = model.to(torch.bfloat16)
    model.save_pretrained(base_dir, safe_serialization=True)
    # the reference: the bf16 weights exactly, in float64, read back as any user would (the RoPE frequencies
    # made again in float64, not the bf16 copy that converting the model in memory leaves)
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float64, attn_implementation="eager")
    rot = model.model.rotary_emb
    rot.inv_freq = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():  # A and B both random (B zero would leave A's gradients zero)
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    pm.save_pretrained(os.path.join(lora_dir, "peft_adapter"), safe_serialization=True)
    os.rename(os.path.join(lora_dir, "peft_adapter", "adapter_model.safetensors"),
              os.path.join(lora_dir, "peft_adapter", "adapter_model.safetensors.tmp"))
    # stored in f32, as the shared fixtures' adapters
    from safetensors.torch import load_file
    ad = load_file(os.path.join(lora_dir, "peft_adapter", "adapter_model.safetensors.tmp"))
    save_file({k: v.to(torch.float32).contiguous() for k, v in ad.items()},
              os.path.join(lora_dir, "peft_adapter", "adapter_model.safetensors"))
    os.remove(os.path.join(lora_dir, "peft_adapter", "adapter_model.safetensors.tmp"))
    with torch.no_grad():  # the parameters exactly as stored (f32)
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(p.to(torch.float32).to(torch.float64))

    g = torch.Generator().manual_seed(7)
    inputs = torch.randint(3, cfg.vocab_size, (2, 12), generator=g)
    targets = torch.randint(3, cfg.vocab_size, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.float64)
    mask[1, :5] = 0  # a prompt masked out of the loss

    def name(n):  # PEFT's name without base_model.model. and .default
        return n.replace("base_model.model.", "").replace(".default", "")

    params = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    tensors = {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32), "mask": mask.to(torch.float32)}
    for n, p in params:
        tensors["init." + name(n)] = p.detach().to(torch.float32).clone()
    opt = torch.optim.AdamW([p for _, p in params], lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]),
                            eps=OPT["eps"], weight_decay=OPT["weight_decay"])
    losses = []
    for step in range(3):
        opt.zero_grad()
        logits = pm(input_ids=inputs).logits
        nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss = (nll * mask).sum() / mask.sum()
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            for n, p in params:
                tensors["grad." + name(n)] = p.grad.detach().to(torch.float32).clone()
        opt.step()
        if step == 0:
            for n, p in params:
                tensors["after1." + name(n)] = p.detach().to(torch.float32).clone()
    tensors["losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(lora_dir, "train_reference.safetensors"))
    meta = {"loss": "mean over mask of -log softmax(logits)[target], logits of the model with LoRA (scale alpha/r = 2)",
            "optimizer": OPT, "losses": losses, "base_model": "llama_hd64",
            "lora": {"r": 4, "alpha": 8, "targets": TARGETS},
            "made_by": "tests/ref/make_train_reference.py (float64): torch %s, transformers %s, peft %s"
                       % (torch.__version__, transformers.__version__, peft.__version__)}
    with open(os.path.join(lora_dir, "train_reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("losses", losses)


if __name__ == "__main__":
    main()
