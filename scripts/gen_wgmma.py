#!/usr/bin/env python3
"""gen_wgmma.py - writes src/backend/cuda/cuda_wgmma_ops.h: the inline-PTX wrappers of the wgmma shapes the
flash-attention backward uses (an m64nNk16 instruction names all N/2 accumulator registers of a thread, which
is what makes them tedious to write by hand).  Run: python3 scripts/gen_wgmma.py > src/backend/cuda/cuda_wgmma_ops.h"""


def wrapper(name, n, a_in_regs, trans_b):
    regs = n // 2  # f32 accumulators a thread: 64 x n / 128
    outs = ", ".join(f"%{i}" for i in range(regs))
    if a_in_regs:
        a = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        b, sc = regs + 4, regs + 5
        mods = f"p, 1, 1, {trans_b}"
        sig = f"float (&d)[{n // 8}][4], const uint32_t (&a)[4], uint64_t db, int scale_d"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d)'
    else:
        a = f"%{regs}"
        b, sc = regs + 1, regs + 2
        mods = f"p, 1, 1, 0, {trans_b}"
        sig = f"float (&d)[{n // 8}][4], uint64_t da, uint64_t db, int scale_d"
        ins = '"l"(da), "l"(db), "r"(scale_d)'
    cons = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))
    return (f"static __device__ __forceinline__ void {name}({sig}) {{\n#ifdef CUDA_WGMMA\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{outs}}}, {a}, %{b}, {mods};\\n}}\\n"\n'
            f"                 : {cons}\n                 : {ins});\n#endif\n}}\n")


print("/* cuda_wgmma_ops.h - written by scripts/gen_wgmma.py; do not edit.  d [N/8][4] += A B over k16 (bf16, f32\n"
      " * accumulators; scale_d 0: d = A B): ss, A and B from shared-memory descriptors (K-major); rs, A from\n"
      " * registers (mma.sync's m16n8k16 A fragment, each warp its 16 rows) and B K-major, or transposed (MN-major:\n"
      " * _t). */")
print(wrapper("wg_ss_n64", 64, False, 0))
print(wrapper("wg_rs_n64", 64, True, 0))
print(wrapper("wg_rs_n64_t", 64, True, 1))
print(wrapper("wg_rs_n128_t", 128, True, 1), end="")
