#!/usr/bin/env python3
# hf_moe_bf16.py - qwen3_moe fixture: how far HF's own bf16 run is from the float32 reference, teacher-forced and with
# the KV cache, by the bf16 criterion of lmx check-reference (rel L2 <= 2e-2, argmax where margin > 0.1)
# usage (GPU machine, torch + transformers): python3 bench/hf_moe_bf16.py FIXTURES/models/qwen3_moe
import sys, torch
from transformers import AutoModelForCausalLM
from safetensors.torch import load_file
d = sys.argv[1]
ref = load_file(d + '/reference.safetensors')
for part in ('short', 'long'):
    seq = ref[part + '_sequence'].long(); P = ref[part + '_prompt'].numel(); L = seq.numel()
    lg = ref[part + '_logits'].float()
    top2 = lg.topk(2, dim=-1).values; margin = top2[:, 0] - top2[:, 1]
    for dt in (torch.float32, torch.bfloat16):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dt).cuda().eval()
        with torch.no_grad():
            full = m(seq[None].cuda()).logits[0, :-1].float().cpu()
            o = m(seq[None, :P].cuda(), use_cache=True); pkv = o.past_key_values; inc = [o.logits[0].float().cpu()]
            for t in range(P, L - 1):
                o = m(seq[None, t:t + 1].cuda(), past_key_values=pkv, use_cache=True); pkv = o.past_key_values
                inc.append(o.logits[0].float().cpu())
        inc = torch.cat(inc, 0)
        for name, x in (('teacher-forced', full), ('kv-cache decode', inc)):
            rel = (x - lg).norm(dim=-1) / lg.norm(dim=-1)
            am = ((x.argmax(-1) != lg.argmax(-1)) & (margin > 0.1)).sum()
            print('%-5s %-8s %-15s max rel L2 %.4f (err/tol %.2f) at position %d, argmax mismatches %d' %
                  (part, str(dt).split('.')[-1], name, rel.max(), rel.max() / 0.02, int(rel.argmax()), int(am)))
