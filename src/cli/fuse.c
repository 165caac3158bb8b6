/* fuse.c - `lmx fuse BASE ADAPTER OUT [--dequantize]`: merge a LoRA adapter into the weights. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/fuse.h"

int cmd_fuse(int argc, char **argv) {
    const char *base = NULL, *adapter = NULL, *out = NULL;
    int dequantize = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: lmx fuse BASE ADAPTER OUT [--dequantize]\n\n"
                   "Writes to OUT (new or empty) a copy of the HF model directory BASE with the LoRA\n"
                   "ADAPTER (a PEFT or mlx-lm folder) merged into its weights: W' = W + scale * B A.\n"
                   "Merged projections of a dense base are written in bf16; those of an MLX-quantized\n"
                   "base are quantized again with the same bits and group size, or, with --dequantize,\n"
                   "every quantized weight is written in bf16 and config.json loses its quantization.\n"
                   "Other tensors, config.json, generation_config.json and tokenizer files are copied.\n");
            return 0;
        }
        if (!strcmp(a, "--dequantize")) dequantize = 1;
        else if (a[0] == '-') return cli_usage_error("fuse: unknown option: %s", a);
        else if (!base) base = a;
        else if (!adapter) adapter = a;
        else if (!out) out = a;
        else return cli_usage_error("fuse: too many arguments");
    }
    if (!base || !adapter || !out) return cli_usage_error("fuse: BASE, ADAPTER and OUT are required");
    lmx_err err = {0};
    if (lmx_fuse_dir(base, adapter, out, dequantize, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    return 0;
}
