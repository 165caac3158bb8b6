/* fuse.h - merge a LoRA adapter into a copy of a model directory (lmx fuse).
 *
 * Each projection the adapter modifies becomes W' = W + scale * B A, computed in float64 from the
 * base weight widened (or dequantized) to float32; A [r, K] and B [N, r] as in PEFT (mlx-lm's
 * transposed lora_a / lora_b are read accordingly).
 *   - a dense base (f32 / f16 / bf16): merged projections are written in bf16, every other tensor
 *     is copied unchanged in its dtype;
 *   - an MLX affine-quantized base (packed U32 "weight" + "scales" + "biases", bits and group from
 *     config.json "quantization", per-module entries included): merged projections are quantized
 *     again with their own bits and group (lmx_quantize_row: bf16 scales and biases), other
 *     tensors copied unchanged;
 *   - dequantize != 0: every quantized tensor is written dense in bf16 (merged or not) and
 *     "quantization" / "quantization_config" leave config.json.
 * The output directory (new, or empty) gets one model.safetensors holding every tensor (a sharded
 * base's index is not copied), config.json, and those of generation_config.json and the tokenizer
 * files (tokenizer.json, tokenizer_config.json, chat_template.jinja, special_tokens_map.json, ...)
 * that the base has.  Test references and adapters beside the weights are never copied.
 *
 * Errors (the message in err names the file or tensor; nothing is left in out on failure):
 *   LMX_ERR_UNSUPPORTED  a GGUF base, an adapter trained for another architecture, a projection
 *                        stored in a dtype lmx cannot merge into;
 *   LMX_ERR_SHAPE        an adapter tensor that does not fit its projection, a layer beyond the
 *                        model, quantization scales that do not match their weight;
 *   LMX_ERR_MISSING      a projection the adapter names is absent from the base;
 *   LMX_ERR_FORMAT       NaN or infinite adapter values, mlx-lm layers outside num_layers;
 *   LMX_ERR_INVALID_ARG  out exists and is not empty;
 *   and what reading the config, the weights or the adapter reports. */
#ifndef LMX_MODEL_FUSE_H
#define LMX_MODEL_FUSE_H

#include "../base/status.h"

lmx_status lmx_fuse_dir(const char *base, const char *adapter, const char *out, int dequantize, lmx_err *err);

#endif
