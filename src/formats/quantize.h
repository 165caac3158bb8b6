/* quantize.h - write an MLX-layout affine-quantized copy of a model directory (lmx quantize).
 *
 * Every 2-D "*_proj.weight", "embed_tokens.weight" and "lm_head.weight" whose input size is a
 * multiple of the group is quantized per group of `group` inputs: bias = min, scale =
 * (max - min) / (2^bits - 1) (both stored as bf16), q = round((w - bias) / scale) clamped to
 * [0, 2^bits - 1], packed LSB first into uint32 words.  Other tensors are copied unchanged; the
 * other files of the directory (tokenizer, generation config, templates) are copied, and
 * config.json gains "quantization": {"group_size", "bits"}. */
#ifndef LMX_FORMATS_QUANTIZE_H
#define LMX_FORMATS_QUANTIZE_H

#include <stdint.h>
#include "../base/status.h"

/* Quantize one row of K floats (K a multiple of group): packed [K*bits/32] words, scales and
 * biases [K/group] bf16. */
void lmx_quantize_row(const float *w, int64_t K, int bits, int group, uint32_t *packed,
                      uint16_t *scales, uint16_t *biases);

/* Quantize the model directory src into dst (created if absent; must not be src). */
lmx_status lmx_quantize_dir(const char *src, const char *dst, int bits, int group, lmx_err *err);

#endif
