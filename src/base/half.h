/* half.h - bf16 / f16 <-> f32 scalar conversions (exact widening, round-to-nearest-even narrowing). */
#ifndef LMX_BASE_HALF_H
#define LMX_BASE_HALF_H

#include <stdint.h>
#include <string.h>

#include "dtype.h"

static inline float lmx_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t lmx_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float lmx_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t lmx_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)h;
}

/* Loads from any address.  Tensors in a safetensors file sit wherever the file puts them (the format
 * has no alignment: a header of any length, tensors of any size back to back), and the cpu backend
 * uses them in place, so every read of stored weights goes through these (one plain load where the
 * CPU allows unaligned access, as x86 and ARMv8 do). */
static inline uint16_t lmx_load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t lmx_load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float lmx_load_f32(const void *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* Element i of float data stored as bf16, f16 or (any other dtype) f32, at any alignment (tensors
 * in a safetensors file need not be aligned). */
static inline float lmx_float_at(const void *data, lmx_dtype t, int64_t i) {
    const char *p = data;
    switch (t) {
    case LMX_DTYPE_BF16: return lmx_bf16_to_f32(lmx_load_u16(p + 2 * i));
    case LMX_DTYPE_F16: return lmx_f16_to_f32(lmx_load_u16(p + 2 * i));
    default: return lmx_load_f32(p + 4 * i);
    }
}

#endif
