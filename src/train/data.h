/* data.h - training examples from JSON Lines as mlx-lm reads them: each line {"text"} (encoded, the
 * tokenizer's EOS appended), {"prompt", "completion"} (a user and an assistant turn in the model's chat template) or
 * {"messages"} (rendered with the model's chat template).  With mask_prompt the loss covers only the
 * completion, or the last assistant turn. */
#ifndef LMX_TRAIN_DATA_H
#define LMX_TRAIN_DATA_H

#include "../model/model.h"

typedef struct lmx_train_example {
    int32_t *ids;                /* [n] */
    int n;
    int n_prompt;                /* the first n_prompt tokens are the prompt (0 without mask_prompt) */
} lmx_train_example;

typedef struct lmx_train_set {
    lmx_train_example *ex;
    int n;
    int skipped;                 /* bad lines skipped (skip_bad) */
} lmx_train_set;

/* Read path: a bad line (invalid JSON, missing keys, fewer than 2 tokens, over max_len > 0 tokens) is an
 * error naming the file and line, or with skip_bad skipped and counted. */
lmx_status lmx_train_set_load(lmx_model *m, const char *path, int mask_prompt, int max_len, int skip_bad,
                              lmx_train_set *out, lmx_err *err);
void lmx_train_set_free(lmx_train_set *s);

#endif
