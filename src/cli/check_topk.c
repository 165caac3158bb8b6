/* check_topk.c - `lmx check-reference MODEL --reference REF.json`: compare with a compact reference
 * of a real model (tests/ref/make_gguf_reference.py): for each prompt, its token ids and at every
 * position the reference's top-K next-token ids with their logits and the logsumexp over the
 * vocabulary.  At every position lmx's logits at those ids and its logsumexp must lie within `tol`
 * of the reference, and the argmax must agree wherever the reference's top-2 margin exceeds 2 tol. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/fileio.h"
#include "cli.h"
#include "lmx.h"

static double num_at(const cJSON *a, int i) { return cJSON_GetArrayItem(a, i)->valuedouble; }

int cli_check_topk(lmx_model *m, const char *ref_path, double tol, int n_ctx) {
    char *text = NULL;
    size_t n = 0;
    lmx_err err = {0};
    if (lmx_read_file(ref_path, &text, &n, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(root, "prompts");
    if (!cJSON_IsArray(prompts) || cJSON_GetArraySize(prompts) == 0) {
        fprintf(stderr, "lmx: %s: no \"prompts\" array\n", ref_path);
        cJSON_Delete(root);
        return 1;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    int failed = 0, p = 0;
    const cJSON *pr;
    cJSON_ArrayForEach(pr, prompts) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pr, "ids");
        const cJSON *top_ids = cJSON_GetObjectItemCaseSensitive(pr, "top_ids");
        const cJSON *top_logits = cJSON_GetObjectItemCaseSensitive(pr, "top_logits");
        const cJSON *lse = cJSON_GetObjectItemCaseSensitive(pr, "logsumexp");
        int T = cJSON_GetArraySize(ids);
        if (T < 1 || cJSON_GetArraySize(top_ids) != T || cJSON_GetArraySize(top_logits) != T || cJSON_GetArraySize(lse) != T) {
            printf("prompt %d: FAIL: malformed reference\n", p);
            failed = 1;
            break;
        }
        int32_t *tok = malloc((size_t)T * sizeof *tok);
        float *logits = malloc((size_t)T * in.vocab_size * sizeof *logits);
        lmx_context *c = NULL;
        lmx_context_params cp = lmx_context_default_params();
        cp.n_ctx = n_ctx;
        for (int t = 0; t < T; t++) tok[t] = (int32_t)num_at(ids, t);
        if (!tok || !logits || lmx_context_create(m, &cp, &c) != LMX_OK ||
            lmx_context_eval(c, tok, T, logits, 1) != LMX_OK) {
            printf("prompt %d: FAIL: %s\n", p, lmx_last_error(m));
            failed = 1;
        } else {
            double worst = 0, worst_lse = 0;
            int mismatch = 0;
            for (int t = 0; t < T; t++) {
                const float *row = logits + (size_t)t * in.vocab_size;
                const cJSON *ti = cJSON_GetArrayItem(top_ids, t), *tl = cJSON_GetArrayItem(top_logits, t);
                int K = cJSON_GetArraySize(ti);
                for (int k = 0; k < K; k++) {
                    int id = (int)num_at(ti, k);
                    double e = id >= 0 && id < in.vocab_size ? fabs(row[id] - num_at(tl, k)) : INFINITY;
                    if (!(e <= worst)) worst = e;
                }
                double mx = row[0], s = 0;
                int am = 0;
                for (int v = 1; v < in.vocab_size; v++)
                    if (row[v] > mx) { mx = row[v]; am = v; }
                for (int v = 0; v < in.vocab_size; v++) s += exp(row[v] - mx);
                double e = fabs(mx + log(s) - num_at(lse, t));
                if (!(e <= worst_lse)) worst_lse = e;
                if (K > 1 && num_at(tl, 0) - num_at(tl, 1) > 2 * tol && am != (int)num_at(ti, 0)) mismatch++;
            }
            int ok = worst <= tol && worst_lse <= tol && mismatch == 0;
            printf("prompt %d (%2d tokens)  max|err| top-k %.2e  logsumexp %.2e  argmax mismatches %d  %s\n", p, T,
                   worst, worst_lse, mismatch, ok ? "ok" : "FAIL");
            if (!ok) failed = 1;
        }
        lmx_context_free(c);
        free(tok);
        free(logits);
        p++;
    }
    cJSON_Delete(root);
    printf("%s\n", failed ? "FAILED" : "all checks passed");
    return failed;
}
