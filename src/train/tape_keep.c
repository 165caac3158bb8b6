/* tape_keep.c - the tape's bookkeeping (tape_internal.h): vars (buffer versions), the keeps that records read
 * (shared per version, copied just before a write, or made again in backward as a redo), the shared input of
 * matmul and LoRA, and records.  tape.c's opening comment describes them; tape.c records the ops with them. */
#include "tape_internal.h"

lmx_status tape_grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return LMX_OK;
    int c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return LMX_ERR_NOMEM;
    *p = q;
    *cap = c;
    return LMX_OK;
}

/* ---- vars and buffers ---------------------------------------------------------------------------- */

/* A new version of buffer data ([rows, cols]); its var id, or -1 when out of memory. */
int tape_var_new(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int req) {
    if (tape_grow((void **)&t->vars, &t->cap_vars, t->n_vars + 1, sizeof *t->vars)) return -1;
    tape_var *v = &t->vars[t->n_vars];
    memset(v, 0, sizeof *v);
    v->rows = rows, v->cols = cols, v->requires = req;
    for (int i = 0; i < 3; i++) /* written: its value is there now */
        if (t->absent[i] == data) t->absent[i] = NULL;
    for (int i = 0; i < t->n_bufs; i++)
        if (t->bufs[i].data == data) {
            t->bufs[i].var = t->n_vars;
            return t->n_vars++;
        }
    if (tape_grow((void **)&t->bufs, &t->cap_bufs, t->n_bufs + 1, sizeof *t->bufs)) return -1;
    t->bufs[t->n_bufs++] = (tape_buf){data, t->n_vars};
    return t->n_vars++;
}

/* Record slot *id reads x's first rows * cols values as they are now: a keep, shared with the records
 * that read the same version (copied already or not: a buffer written gets a new version). */
lmx_status tape_save(lmx_tape *t, int *id, const lmx_tensor *x, int64_t rows, int64_t cols) {
    const int v = var_of(t, x->data);
    for (int i = t->n_keeps - 1; i >= 0; i--) {
        tape_keep *k = &t->keeps[i];
        if (k->refs > 0 && (!k->copy.data || v >= 0) && k->src == x->data && k->var == v && k->rows == rows &&
            k->cols == cols) {
            k->refs++;
            *id = i;
            return LMX_OK;
        }
    }
    if (tape_grow((void **)&t->keeps, &t->cap_keeps, t->n_keeps + 1, sizeof *t->keeps)) return nomem(t);
    t->keeps[t->n_keeps] = (tape_keep){.src = x->data, .dtype = x->dtype, .rows = rows, .cols = cols, .var = v, .refs = 1};
    *id = t->n_keeps++;
    return LMX_OK;
}

/* Whether the keep of buffer data's current version [rows, cols] holds a copy (what a muted buffer's readers
 * that take tape_shared_input read: a GLU's output written as its bf16 keep alone) */
int tape_copied(const lmx_tape *t, const void *data, int64_t rows, int64_t cols) {
    const int v = var_of(t, data);
    for (int i = t->n_keeps - 1; v >= 0 && i >= 0; i--) {
        const tape_keep *k = &t->keeps[i];
        if (k->refs > 0 && k->copy.data && k->src == data && k->var == v && k->rows == rows && k->cols == cols) return 1;
    }
    return 0;
}

/* Buffer data is about to be written or released: the keeps that still read it get their copies. */
lmx_status tape_guard(lmx_tape *t, const void *data) {
    for (int i = 0; i < t->n_keeps; i++) {
        tape_keep *k = &t->keeps[i];
        if (k->refs <= 0 || k->copy.data || k->src != data) continue;
        const lmx_tensor x = {.dtype = k->dtype, .ndim = 2, .shape = {k->rows, k->cols}, .data = (void *)data};
        lmx_status st = pass(t, t->bwd->keep(t->in, &k->copy, &x));
        if (st) {
            k->src = NULL; /* lost: backward fails where it reads it */
            return st;
        }
    }
    return LMX_OK;
}

void tape_unkeep(lmx_tape *t, int id) {
    tape_keep *k = &t->keeps[id];
    if (--k->refs > 0) return;
    if (k->copy.data) t->in->ops->release(t->in, &k->copy);
    for (int i = 0; k->redo && i < 2; i++)
        if (k->from[i] >= 0) tape_unkeep(t, k->from[i]);
}

/* Record slot *id reads version vx ([rows, cols]) as a redo (tape_keep) where a GLU's or a norm's record
 * made it: the input of the down projection's LoRA (a GLU's output, the layer's widest value), or of the
 * LoRA records over q, k, v and gate, up (a norm's output).  Backward makes it again from the keeps that
 * record reads, which it has to hold anyway, instead of keeping it through the whole forward pass; but
 * with keep_glu (lmx_tape_set_keep_glu) a GLU's output whose bf16 copy the op wrote is kept instead.
 * 1: done; 0: not taken (the caller keeps the value). */
int tape_redo_input(lmx_tape *t, int *id, int vx, int64_t rows, int64_t cols) {
    if (vx < 0 || !lmx_backward_redoes(t->bwd)) return 0;
    for (int i = t->n_keeps - 1; i >= 0; i--) { /* q, k and v share one */
        tape_keep *k = &t->keeps[i];
        if (k->refs > 0 && k->redo && k->var == vx && k->rows == rows && k->cols == cols) {
            k->refs++;
            *id = i;
            return 1;
        }
    }
    const int j = maker_of(t, t->n_recs, vx);
    if (j < 0) return 0;
    if (t->keep_glu && t->recs[j].op == T_GLU) /* the GLU's bf16 copy, where it wrote one, is kept (save shares it) */
        for (int i = t->n_keeps - 1; i >= 0; i--) {
            const tape_keep *k = &t->keeps[i];
            if (k->refs > 0 && !k->redo && k->copy.data && k->var == vx && k->rows == rows && k->cols == cols) return 0;
        }
    const tape_rec *m = &t->recs[j];
    tape_keep k = {.rows = rows, .cols = cols, .var = vx, .refs = 1, .redo = m->op, .from = {m->keep[0], m->keep[1]},
                   .act = m->act, .w = m->w, .eps = m->eps, .one = m->one};
    if (m->op == T_GLU) {
        if (m->keep[0] < 0 || m->keep[1] < 0 || m->count != rows * cols) return 0;
    } else if (m->op == T_RMSNORM) {
        if (m->keep[0] < 0 || m->rows != rows || m->n != cols) return 0;
        k.from[1] = -1;
    } else {
        return 0;
    }
    if (tape_grow((void **)&t->keeps, &t->cap_keeps, t->n_keeps + 1, sizeof *t->keeps)) return 0;
    for (int i = 0; i < 2; i++)
        if (k.from[i] >= 0) t->keeps[k.from[i]].refs++;
    t->keeps[t->n_keeps] = k;
    *id = t->n_keeps++;
    return 1;
}

/* Keep id becomes the tape's shared input, in place of the last one. */
void tape_set_shared(lmx_tape *t, int id) {
    if (t->shared) tape_unkeep(t, t->shared - 1);
    t->shared = id + 1;
}

/* What matmul and lora read of input x [rows, cols]: where the backend keeps activations in bf16, the
 * keep of x's version, copied now (the op reads it instead of narrowing x itself, and the records that
 * keep x share it: q, k and v, or gate and up, narrow their input once); else x.  The tape holds the
 * last such copy (t->shared) until the next. */
const lmx_tensor *tape_shared_input(lmx_tape *t, const lmx_tensor *x, int64_t rows, int64_t cols) {
    if (t->bwd->keep_dtype(t->in) != LMX_DTYPE_BF16 || var_of(t, x->data) < 0) return x;
    if (x->dtype != LMX_DTYPE_F32 && !tape_copied(t, x->data, rows, cols)) return x; /* bf16: read as it is */
    int id;
    if (tape_save(t, &id, x, rows, cols)) {
        lmx_err_clear(&t->base.err);
        return x;
    }
    tape_keep *k = &t->keeps[id];
    if (!k->copy.data) {
        const lmx_tensor xv = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {rows, cols}, .data = x->data};
        if (t->bwd->keep(t->in, &k->copy, &xv) != LMX_OK) { /* the op narrows x itself */
            k->copy.data = NULL;
            tape_unkeep(t, id);
            return x;
        }
    }
    tape_set_shared(t, id);
    return &k->copy;
}

/* A bf16 tensor [rows, cols] for an op to write its output's keep into (data NULL: none: the backend keeps
 * f32, or out of memory). */
lmx_tensor tape_keep_room(lmx_tape *t, int64_t rows, int64_t cols) {
    lmx_tensor k = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, cols}};
    if (t->bwd->keep_dtype(t->in) != LMX_DTYPE_BF16 || tape_alloc(t, &k)) {
        lmx_err_clear(&t->in->err);
        k.data = NULL;
    }
    return k;
}

/* copy (from tape_keep_room, holding version var of buffer data) becomes that version's keep, with one
 * reference; its id (-1: out of memory, copy released) */
int tape_keep_made(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int var, lmx_tensor *copy) {
    if (tape_grow((void **)&t->keeps, &t->cap_keeps, t->n_keeps + 1, sizeof *t->keeps)) {
        t->in->ops->release(t->in, copy);
        return -1;
    }
    t->keeps[t->n_keeps] = (tape_keep){.src = data, .rows = rows, .cols = cols, .var = var, .refs = 1, .copy = *copy};
    memset(copy, 0, sizeof *copy);
    return t->n_keeps++;
}

/* copy (from tape_keep_room), written by the op that made version var of buffer data, becomes that version's
 * keep and the tape's shared input: the matmuls and LoRA records that read it next find it there
 * (tape_shared_input) instead of narrowing it.  Out of memory: it is dropped. */
void tape_hold_shared(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int var, lmx_tensor *copy) {
    const int id = tape_keep_made(t, data, rows, cols, var, copy);
    if (id >= 0) tape_set_shared(t, id);
}

tape_rec *tape_rec_new(lmx_tape *t, int op) {
    if (tape_grow((void **)&t->recs, &t->cap_recs, t->n_recs + 1, sizeof *t->recs)) return NULL;
    tape_rec *r = &t->recs[t->n_recs++];
    memset(r, 0, sizeof *r);
    r->op = op;
    r->out = r->in[0] = r->in[1] = r->in[2] = -1;
    r->keep[0] = r->keep[1] = r->keep[2] = r->keep[3] = -1;
    return r;
}

/* release record r's keeps and arrays */
void tape_rec_free(lmx_tape *t, tape_rec *r) {
    for (int k = 0; k < 4; k++)
        if (r->keep[k] >= 0) tape_unkeep(t, r->keep[k]), r->keep[k] = -1;
    if (r->own.data) t->in->ops->release(t->in, &r->own);
    if (r->lse.data) t->in->ops->release(t->in, &r->lse);
    if (r->xa.data) t->in->ops->release(t->in, &r->xa);
    free(r->ints);
    free(r->pairs);
    r->ints = NULL, r->pairs = NULL; /* freed twice is freed once (a walked record, at the walk's end) */
}