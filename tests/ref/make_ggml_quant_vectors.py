#!/usr/bin/env python3
"""Test vectors for src/backend/cpu/ggml_quant.c, made with the `gguf` Python package (gguf.quants),
an implementation of the GGUF block formats independent of lmx.

Made with gguf 0.19.0 and numpy 2.x (`pip install gguf==0.19.0 numpy`); the script checks the version.

For each type it writes, under tests/data/ggml_quant/ (ROWS rows of K elements each):
  TYPE.bin   the rows' raw bytes as stored in a GGUF file (row n at n * row_bytes);
  TYPE.f32   gguf.quants.dequantize of those bytes: ROWS x K little-endian float32;
  TYPE.dot   float64 dot products of each dequantized row with x.f32: ROWS little-endian float64.
and x.f32: the K float32 elements of x shared by every type.

The rows come from gguf.quants.quantize of random normal data (fixed seed) where gguf can quantize
the type (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0).  gguf 0.19.0 cannot quantize Q2_K..Q6_K, so those
rows are random bytes with every f16 scale field (d, dmin) replaced by a finite value: mostly
+-[1e-3, 1e-1], plus a few zeros, negatives and f16 subnormals so the conversions are exercised.

usage: python3 tests/ref/make_ggml_quant_vectors.py [OUT_DIR]   (default: tests/data/ggml_quant)
"""
import os
import sys
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

GGUF_VERSION = "0.19.0"
K = 512
ROWS = 3
SEED = 20240611

QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Byte offsets of the f16 scale fields inside one block of each K-quant (from the GGUF block layout).
RANDOM_BLOCKS = {
    T.Q2_K: [80, 82],     # scales[16] qs[64] d dmin
    T.Q3_K: [108],        # hmask[32] qs[64] scales[12] d
    T.Q4_K: [0, 2],       # d dmin scales[12] qs[128]
    T.Q5_K: [0, 2],       # d dmin scales[12] qh[32] qs[128]
    T.Q6_K: [208],        # ql[128] qh[64] scales[16] d
}


def f16_scales(rng, n):
    """n finite f16 scale values as uint16 bit patterns."""
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
    v = (mag * rng.choice([-1.0, 1.0], n, p=[0.2, 0.8])).astype(np.float16)
    v[0] = np.float16(0.0)
    if n > 1:
        v[1] = np.float16(3.0e-6)   # subnormal f16
    if n > 2:
        v[2] = np.float16(-6.1e-5)  # just below the smallest normal
    return v.view(np.uint16)


def random_rows(rng, qtype):
    blk_elems, blk_bytes = GGML_QUANT_SIZES[qtype]
    nb = ROWS * K // blk_elems
    blocks = rng.integers(0, 256, size=(nb, blk_bytes), dtype=np.uint8)
    for off in RANDOM_BLOCKS[qtype]:
        s = f16_scales(rng, nb)
        rng.shuffle(s)
        blocks[:, off:off + 2] = s.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(ROWS, -1)


def main():
    have = version("gguf")
    if have != GGUF_VERSION:
        sys.exit(f"gguf {have} installed; these vectors were made with gguf {GGUF_VERSION}")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "ggml_quant")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal(K).astype(np.float32)
    x.tofile(os.path.join(out, "x.f32"))
    for qtype in QUANTIZABLE + list(RANDOM_BLOCKS):
        if qtype in RANDOM_BLOCKS:
            raw = random_rows(rng, qtype)
        else:
            data = (rng.standard_normal((ROWS, K)) * 0.05).astype(np.float32)
            data[0, :7] = [0.0, -0.0, 1e-7, -3.0, 2.5, 1e-30, 65504.0 / 1024]  # a few edge values
            raw = gguf.quants.quantize(data, qtype)
            raw = np.ascontiguousarray(raw).view(np.uint8).reshape(ROWS, -1)
        deq = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(ROWS, K)
        assert np.all(np.isfinite(deq)), qtype.name
        dots = deq.astype(np.float64) @ x.astype(np.float64)
        raw.tofile(os.path.join(out, f"{qtype.name}.bin"))
        deq.tofile(os.path.join(out, f"{qtype.name}.f32"))
        dots.astype("<f8").tofile(os.path.join(out, f"{qtype.name}.dot"))
        print(f"{qtype.name}: {raw.nbytes} bytes, {ROWS}x{K}")


if __name__ == "__main__":
    main()
