#!/usr/bin/env python3
"""Re-write a GGUF file (e.g. one made by hf_to_gguf.py) with its 2-D weight tensors block-quantized
by the `gguf` Python package (gguf.quants.quantize, independent of lmx), as llama.cpp's quantizer
does: every matrix (token_embd and output included) and every stack of expert matrices (3-D
ffn_*_exps) becomes TYPE, routers (ffn_gate_inp, which llama.cpp's quantizer leaves alone) and 1-D
tensors (norms, rope_freqs) become F32 (exact for the BF16 norms), and so does a matrix whose rows are
not whole blocks.  Metadata is copied unchanged, plus general.file_type.

gguf 0.19.0 quantizes F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 (not the K-quants, whose 256-element
blocks would not fit these fixtures' 64-wide rows anyway).

usage: quantize_gguf.py IN.gguf OUT.gguf TYPE        (TYPE e.g. Q8_0, Q4_0; needs numpy and gguf)
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

src, out, tname = sys.argv[1], sys.argv[2], sys.argv[3]
qtype = T[tname]
FILE_TYPE = {T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, T.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
             T.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1, T.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0,
             T.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1}

r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(out, arch)
for f in r.fields.values():
    if f.name == "general.architecture" or f.name.startswith("GGUF.") or f.name == "general.file_type":
        continue
    vtype = f.types[0]
    sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
w.add_file_type(FILE_TYPE[qtype])
for t in r.tensors:
    shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows first
    a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if a.ndim >= 2 and "ffn_gate_inp" not in t.name and a.shape[-1] % block == 0:
        q = quantize(a, qtype)  # uint8 [..., rows, row bytes]
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qtype)
    else:
        w.add_tensor(t.name, a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out, len(r.tensors), "tensors, matrices as", qtype.name)
