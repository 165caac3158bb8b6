/* quantize.c - `lmx quantize SRC DST [--bits N] [--group-size N]`. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "formats/quantize.h"

int cmd_quantize(int argc, char **argv) {
    const char *src = NULL, *dst = NULL;
    int bits = 4, group = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help")) {
            printf("usage: lmx quantize SRC DST [--bits 2|4|8] [--group-size 32|64|128]\n\n"
                   "Writes an MLX-layout affine-quantized copy of the bf16/f16/f32 model directory SRC to\n"
                   "DST (new or empty): projections, embedding and output head are quantized (default 4\n"
                   "bits, groups of 64); tokenizer and other files are copied.\n");
            return 0;
        }
        if (!strcmp(a, "--bits") && has_val) { if (cli_parse_int(argv[++i], &bits)) return cli_usage_error("quantize: bad --bits"); }
        else if (!strcmp(a, "--group-size") && has_val) { if (cli_parse_int(argv[++i], &group)) return cli_usage_error("quantize: bad --group-size"); }
        else if (a[0] == '-') return cli_usage_error("quantize: unknown option or missing value: %s", a);
        else if (!src) src = a;
        else if (!dst) dst = a;
        else return cli_usage_error("quantize: too many arguments");
    }
    if (!src || !dst) return cli_usage_error("quantize: SRC and DST are required");
    if (bits != 2 && bits != 4 && bits != 8) return cli_usage_error("quantize: --bits must be 2, 4 or 8");
    if (group != 32 && group != 64 && group != 128) return cli_usage_error("quantize: --group-size must be 32, 64 or 128");
    lmx_err err = {0};
    if (lmx_quantize_dir(src, dst, bits, group, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    return 0;
}
