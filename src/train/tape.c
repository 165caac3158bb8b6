/* tape.c - the recording backend of tape.h.
 *
 * Vars: one per buffer version ([rows, cols] as written, whether it depends on a watched pair, its
 * gradient once backward reaches it).  bufs maps each buffer to its current var.  Records: what
 * backward needs of one op, with the inputs it reads as keeps.  A keep is a buffer's version that
 * backward reads: the buffer itself while nothing writes it again, copied (the backward ops' keep op)
 * just before an op writes it, or it is released; records that read one version share one keep.  So a
 * value that survives until backward (a checkpointed layer's last activations) is never copied, and
 * q, k and v's LoRA records keep their one input once.  A LoRA record whose input a norm or a GLU made
 * keeps a redo instead (tape_redo_input): backward computes the value again from that op's own keeps.
 * Their bookkeeping lives in tape_keep.c.
 * Two kinds of work wait for the op that reads their buffer next, a projection's LoRA expand and a frozen
 * matmul with its LoRA op and residual add: tape_wait.c. */
#include "tape_internal.h"

/* With t->prof_fwd: a forward op's seconds (x: a tensor it writes; its start waited for at *t0), less
 * those of the ops left unrun before that it ran (t->lazy_s: lazy_end counts them as their own) */
static lmx_status fwd_lap(lmx_tape *t, int kind, const lmx_tensor *x, double *t0, lmx_status st) {
    if (t->prof_fwd && !st && *t0 > 0) t->prof_fwd[kind] += prof_lap(t, x, t0) - t->lazy_s;
    return st;
}
#define FWD_START(x)                                    \
    double fwd_t0 = 0;                                  \
    if (t->prof_fwd) t->lazy_s = 0, prof_lap(t, (x), &fwd_t0)

/* Buffer data is one replay fills later (lmx_tape_replay qkv): the ops writing it are recorded, not run */
static int muted(const lmx_tape *t, const void *data) {
    return t->rp.qkv && data && (data == t->rp.qkv_buf[0] || data == t->rp.qkv_buf[1] || data == t->rp.qkv_buf[2]);
}
/* Buffer data's value is not there to read: muted, or left out (t->absent: replay's input and its norm's output,
 * a GLU's output written as its bf16 keep alone; the ops writing those run) */
static int unreadable(const lmx_tape *t, const void *data) {
    return muted(t, data) || (data && (data == t->absent[0] || data == t->absent[1] || data == t->absent[2]));
}
/* Input x [rows, cols] of a matmul or LoRA op is not there to read, not even as its keep's copy (which such ops
 * take: tape_shared_input) */
static int input_absent(const lmx_tape *t, const void *x, int64_t rows, int64_t cols) {
    return unreadable(t, x) && !tape_copied(t, x, rows, cols);
}
static lmx_status muted_read(lmx_tape *t, const char *op) {
    return lmx_err_set(&t->base.err, LMX_ERR_BACKEND, "tape: %s reads a value that is not there (q, k or v before "
                       "replay writes them, a replayed layer's input or its norm, a GLU's f32 output)", op);
}

/* ---- recorded ops ----------------------------------------------------------------------------- */

static lmx_status w_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids, int M,
                          float scale) {
    lmx_tape *t = TAPE(be);
    lmx_status st = tape_settle(t, NULL);
    if (!st) st = tape_guard(t, out->data);
    if (!st) st = pass(t, t->in->ops->embed(t->in, out, table, ids, M, scale));
    if (!st && tape_var_new(t, out->data, M, table->shape[1], 0) < 0) st = nomem(t);
    return st;
}

/* Record r's input x [rows, n] is the layer's input that replay gives as a keep (lmx_tape_replay input): its
 * keep; the norm does not run, and its output stays muted until written again. */
static lmx_status rmsnorm_given(lmx_tape *t, tape_rec *r, lmx_tensor *out, const lmx_tensor *x, int rows, int n) {
    if (lmx_tensor_nelem(&t->rp.input) != (int64_t)rows * n)
        return lmx_err_set(&t->base.err, LMX_ERR_SHAPE, "tape: the replayed input is not the norm's [%d, %d]", rows, n);
    if ((r->keep[0] = tape_keep_made(t, x->data, rows, n, r->in[0], &t->rp.input)) < 0) return nomem(t);
    lmx_status st = tape_guard(t, out->data);
    if (st) return st;
    if ((r->out = tape_var_new(t, out->data, rows, n, 1)) < 0) return nomem(t);
    t->absent[1] = out->data;
    return LMX_OK;
}

static lmx_status rec_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                              int n, float eps, float add_one) {
    lmx_tape *t = TAPE(be);
    const int vx = var_of(t, x->data);
    const int given = t->rp.input.data && x->data == t->rp.input_buf && requires(t, vx);
    if (unreadable(t, x->data) && !given) return muted_read(t, "rmsnorm");
    tape_rec *r = NULL;
    if (requires(t, vx)) {
        if (!(r = tape_rec_new(t, T_RMSNORM))) return nomem(t);
        r->in[0] = vx, r->w = w, r->rows = rows, r->n = n, r->eps = eps, r->one = add_one;
        if (given) return rmsnorm_given(t, r, out, x, rows, n);
        lmx_status st = tape_save(t, &r->keep[0], x, rows, n);
        if (st) return st;
    }
    /* a hidden state's norm (not a per-head one, whose output RoPE rewrites) writes the keep of the
     * matmuls' input that follows in its pass, where the backend can */
    lmx_tensor ok = n > 256 && t->bwd->rmsnorm_keep ? tape_keep_room(t, rows, n) : (lmx_tensor){0};
    lmx_status st = tape_guard(t, out->data);
    if (st) {
        if (ok.data) t->in->ops->release(t->in, &ok);
        return st;
    }
    st = LMX_ERR_UNSUPPORTED;
    if (ok.data && (st = t->bwd->rmsnorm_keep(t->in, out, x, w, rows, n, eps, add_one, &ok))) t->in->ops->release(t->in, &ok);
    if (st == LMX_ERR_UNSUPPORTED) st = t->in->ops->rmsnorm(t->in, out, x, w, rows, n, eps, add_one);
    if (pass(t, st)) return st;
    const int v = tape_var_new(t, out->data, rows, n, r != NULL);
    if (v < 0) {
        if (ok.data) t->in->ops->release(t->in, &ok);
        return nomem(t);
    }
    if (ok.data) tape_hold_shared(t, out->data, rows, n, v, &ok);
    if (r) r->out = v;
    return LMX_OK;
}

static lmx_status rec_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                             const lmx_tensor *bias, int M) {
    lmx_tape *t = TAPE(be);
    const int vx = var_of(t, x->data);
    lmx_status st = tape_guard(t, out->data); /* nothing waits: w_matmul settled */
    if (st) return st;
    const int gu = t->rp.gu && w ? (w == t->rp.gu_w[0] ? 0 : w == t->rp.gu_w[1] ? 1 : -1) : -1;
    if (gu >= 0) { /* replay writes the product (lmx_tape_replay gu) */
        t->rp.gu_w[gu] = NULL;
        if ((st = pass(t, t->rp.gu(t->rp.user, gu, out)))) return st;
    } else if (!muted(t, out->data)) { /* left unrun until the tape's next op (tape_lazy), holding the input it reads */
        if (input_absent(t, x->data, M, w->shape[1])) return muted_read(t, "matmul");
        const lmx_tensor *xin = tape_shared_input(t, x, M, w->shape[1]);
        const tape_lazy z = {.op = T_MATMUL, .out = *out, .x = *xin, .w = w, .bias = bias, .M = M,
                             .keep = tape_lazy_hold(t, xin)};
        if ((st = tape_lazy_push(t, &z))) return st;
    }
    const int req = requires(t, vx), v = tape_var_new(t, out->data, M, w->shape[0], req);
    if (v < 0) return nomem(t);
    if (req) {
        tape_rec *r = tape_rec_new(t, T_MATMUL);
        if (!r) return nomem(t);
        r->in[0] = vx, r->out = v, r->w = w, r->M = M;
    }
    return LMX_OK;
}

/* index of p's watch, or -1 */
static int watch_index(const lmx_tape *t, const lmx_lora_pair *p) {
    const tape_watch *w = watch_of(t, p);
    return w ? (int)(w - t->watches) : -1;
}

/* Room for the shrink x A^T [B*T, r] that lora_keep writes, where the backend has it and the pairs are
 * trained and of one rank r (data NULL: none). */
static lmx_tensor lora_xa(lmx_tape *t, int watched, int B, int T, const lmx_lora_pair *const *pairs) {
    lmx_tensor xa = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {(int64_t)B * T, 0}};
    if (!watched || !t->bwd->lora_keep) return (lmx_tensor){0};
    for (int b = 0; b < B; b++) {
        if (!pairs[b]) continue;
        if (xa.shape[1] && pairs[b]->a.shape[0] != xa.shape[1]) return (lmx_tensor){0};
        xa.shape[1] = pairs[b]->a.shape[0];
    }
    if (tape_alloc(t, &xa)) {
        lmx_err_clear(&t->in->err);
        return (lmx_tensor){0};
    }
    return xa;
}

/* y [rows, N] after LoRA record r (NULL: nothing trainable here, y keeps its version) */
static lmx_status lora_versioned(lmx_tape *t, tape_rec *r, const lmx_tensor *y, int64_t rows, int64_t N, int watched) {
    if (!r) return LMX_OK;
    const int v = tape_var_new(t, y->data, rows, N, 1);
    if (v < 0) return nomem(t);
    r->out = v;
    if (!watched) r->op = T_ADD, r->in[1] = -1; /* no pair trained: the gradient passes through */
    return LMX_OK;
}

static lmx_status rec_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                           const lmx_lora_pair *const *pairs) {
    lmx_tape *t = TAPE(be);
    int watched = 0, frozen = 0, first = -1;
    for (int b = 0; b < B; b++)
        if (pairs[b]) {
            const int w = watch_index(t, pairs[b]);
            w >= 0 ? watched++ : frozen++;
            if (w >= 0 && first < 0) first = w;
        }
    const int vy = var_of(t, y->data), vx = var_of(t, x->data);
    if (watched && frozen)
        return lmx_err_set(&t->base.err, LMX_ERR_UNSUPPORTED, "training: a batch mixes trained and frozen adapters");
    if (frozen && requires(t, vx))
        return lmx_err_set(&t->base.err, LMX_ERR_UNSUPPORTED, "training: a frozen adapter after a trained one");
    const int64_t K = x->shape[x->ndim - 1], N = y->shape[y->ndim - 1], rows = (int64_t)B * T;
    const int drop = watched && t->drop_p > 0;
    /* a matmul into y left unrun stays so while y is not touched (its expand waits: below) */
    const int lazy = x->data != y->data && tape_lazy_only_into(t, y->data);
    lmx_status st0 = lazy ? tape_settle_terms(t, x->data) : tape_settle(t, x->data);
    if (!st0) st0 = lazy ? tape_settle_terms(t, y->data) : tape_settle(t, y->data);
    if (st0) return st0;
    const uint64_t seed = t->drop_seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(first + 1)); /* one mask per pair */
    tape_rec *r = NULL;
    if (watched || requires(t, vy)) {
        if (!(r = tape_rec_new(t, T_LORA))) return nomem(t);
        r->pairs = malloc((size_t)B * sizeof *r->pairs);
        if (!r->pairs) return nomem(t);
        for (int b = 0; b < B; b++) r->pairs[b] = pairs[b];
        lmx_status st = LMX_OK;
        if (drop) { /* the pairs read dropout(x), which backward reads too */
            r->own = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {rows, K}};
            st = pass(t, t->in->ops->alloc(t->in, &r->own));
            if (!st) st = pass(t, t->bwd->dropout(t->in, &r->own, x, rows * K, t->drop_p, seed));
            r->drop = t->drop_p, r->seed = seed;
        } else if (watched && !tape_redo_input(t, &r->keep[0], vx, rows, K)) {
            st = input_absent(t, x->data, rows, K) ? muted_read(t, "lora") : tape_save(t, &r->keep[0], x, rows, K);
        }
        if (st) return st;
        r->in[0] = vy, r->in[1] = vx, r->bt.B = B, r->bt.T = T;
    }
    lmx_status st = tape_guard(t, y->data);
    if (st) return st;
    if (muted(t, y->data)) return lora_versioned(t, r, y, rows, N, watched); /* replay writes y: nothing runs */
    if (drop ? unreadable(t, x->data) : input_absent(t, x->data, rows, K)) return muted_read(t, "lora");
    const lmx_tensor *xin = drop ? &r->own : tape_shared_input(t, x, rows, K);
    lmx_tensor xa = lora_xa(t, watched, B, T, pairs);
    st = LMX_ERR_UNSUPPORTED;
    if (xa.data) { /* the op keeps its shrink for backward, where the backend can */
        /* and where one pair adapts every row, the expand waits for the op that reads y next */
        int later = t->bwd->lora_add != NULL;
        for (int b = 0; b < B; b++) later &= pairs[b] == pairs[0];
        st = later && t->n_terms == TAPE_TERMS ? tape_settle_at(t, 0) : later ? LMX_OK : tape_lazy_end(t, 1);
        if (!st) st = t->bwd->lora_keep(t->in, later ? NULL : y, xin, B, T, pairs, &xa);
        if (st) {
            t->in->ops->release(t->in, &xa);
        } else {
            r->xa = xa;
            if (later) t->terms[t->n_terms++] = (tape_term){y->data, y->dtype, xa, pairs[0]};
        }
    }
    if (st == LMX_ERR_UNSUPPORTED && lazy && r) { /* the lora op after the matmul left unrun: it waits too */
        const tape_lazy z = {.op = T_LORA, .out = *y, .x = *xin, .B = B, .T = T, .pairs = r->pairs,
                             .keep = tape_lazy_hold(t, xin)};
        if ((st = tape_lazy_push(t, &z))) return st; /* the tape's own message, not inner's */
    }
    if (st == LMX_ERR_UNSUPPORTED && !(st = tape_lazy_end(t, 1))) st = t->in->ops->lora(t->in, y, xin, B, T, pairs);
    if (pass(t, st)) return st;
    return lora_versioned(t, r, y, rows, N, watched);
}

static lmx_status rec_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) {
    lmx_tape *t = TAPE(be);
    const int vy = var_of(t, y->data), vx = var_of(t, x->data);
    const int given = t->rp.resid && y->data == t->rp.resid_buf; /* y's value may be replay's (below) */
    if ((unreadable(t, y->data) && !given) || unreadable(t, x->data)) return muted_read(t, "add");
    /* x's waiting LoRA expand in the add's pass (the projection's buffer is not read again) */
    lmx_status st = tape_settle_others(t, x->data != y->data ? x->data : NULL, NULL);
    int ix = st ? -1 : tape_term_index(t, x->data);
    if (ix >= 0 && !tape_unkept(t, x->data)) st = tape_settle_at(t, ix), ix = -1;
    /* after a matmul into x left unrun, the add is left unrun too; else both run now */
    const int lazy = x->data != y->data && tape_lazy_only_into(t, x->data);
    if (!st && !lazy) st = tape_lazy_end(t, 1);
    if (!st) st = tape_guard(t, y->data);
    tape_term d = {0};
    const lmx_lora_term term = !st && ix >= 0 ? tape_term_take(t, ix, &d) : (lmx_lora_term){0};
    /* replay (lmx_tape_replay): the matmul and LoRA left unrun feed this add alone, whose result is given */
    if (!st && lazy && given && tape_unkept(t, x->data)) {
        lmx_status (*fill)(void *, lmx_tensor *) = t->rp.resid;
        t->rp.resid = NULL;
        if (!(st = tape_lazy_end(t, 0))) st = pass(t, fill(t->rp.user, y));
    } else if (!st && unreadable(t, y->data))
        st = muted_read(t, "add");
    else if (!st && lazy)
        st = tape_lazy_push(t, &(tape_lazy){.op = T_ADD, .out = *y, .x = *x, .n = n, .term = d, .keep = -1});
    else if (!st && term.pair)
        st = pass(t, t->bwd->lora_add(t->in, y, x, n, &term));
    else if (!st)
        st = pass(t, t->in->ops->add(t->in, y, x, n));
    if (st) return st;
    const int req = requires(t, vy) || requires(t, vx);
    const int64_t cols = vy >= 0 && t->vars[vy].cols ? t->vars[vy].cols : vx >= 0 ? t->vars[vx].cols : n;
    const int v = tape_var_new(t, y->data, cols ? n / cols : 1, cols ? cols : n, req);
    if (v < 0) return nomem(t);
    if (req) {
        tape_rec *r = tape_rec_new(t, T_ADD);
        if (!r) return nomem(t);
        r->in[0] = vy, r->in[1] = vx, r->out = v, r->count = n;
    }
    return LMX_OK;
}

static lmx_status rec_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                          lmx_act act) {
    lmx_tape *t = TAPE(be);
    if (unreadable(t, gate->data) || unreadable(t, up->data)) return muted_read(t, "glu");
    lmx_status st0 = tape_lazy_end(t, 1);
    if (!st0) st0 = tape_settle_others(t, gate->data, up->data);
    if (st0) return st0;
    const int vg = var_of(t, gate->data), vu = var_of(t, up->data);
    const int req = requires(t, vg) || requires(t, vu);
    const int64_t cols = vg >= 0 && t->vars[vg].cols ? t->vars[vg].cols : n;
    tape_rec *r = NULL;
    if (req) {
        if (!(r = tape_rec_new(t, T_GLU))) return nomem(t);
        lmx_status st = tape_save(t, &r->keep[0], gate, n / cols, cols);
        if (!st) st = tape_save(t, &r->keep[1], up, n / cols, cols);
        if (st) return st;
        r->in[0] = vg, r->in[1] = vu, r->count = n, r->act = act;
    }
    /* where the backend can, the op writes gate's and up's bf16 keeps in its pass (their copies are
     * allocated first, so that guard leaves them alone) */
    tape_keep *kg = NULL, *ku = NULL;
    if (r && t->bwd->glu_keep && r->keep[0] != r->keep[1] && !t->keeps[r->keep[0]].copy.data &&
        !t->keeps[r->keep[1]].copy.data) {
        kg = &t->keeps[r->keep[0]], ku = &t->keeps[r->keep[1]];
        kg->copy = tape_keep_room(t, kg->rows, kg->cols);
        ku->copy = kg->copy.data ? tape_keep_room(t, ku->rows, ku->cols) : (lmx_tensor){0};
        if (!ku->copy.data) { /* the plain op, keeps copied later */
            if (kg->copy.data) t->in->ops->release(t->in, &kg->copy);
            kg->copy.data = NULL;
            kg = ku = NULL;
        }
    }
    /* gate's and up's waiting LoRA expands: in that pass too, else added first */
    tape_term dg = {0}, du = {0};
    lmx_lora_term tg = {0}, tu = {0};
    lmx_status st = LMX_OK;
    if (kg && tape_unkept(t, gate->data) && tape_unkept(t, up->data)) {
        int i = tape_term_index(t, gate->data);
        if (i >= 0) tg = tape_term_take(t, i, &dg);
        if ((i = tape_term_index(t, up->data)) >= 0) tu = tape_term_take(t, i, &du);
    } else {
        st = tape_settle(t, gate->data);
        if (!st) st = tape_settle(t, up->data);
    }
    /* and the output's, which the down projection's matmul and LoRA read (tape_shared_input); then the output
     * itself is not written (its buffer muted) but where LoRA dropout reads it in f32 */
    lmx_tensor ok = kg && !st ? tape_keep_room(t, n / cols, cols) : (lmx_tensor){0};
    const int bf16_only = ok.data && t->drop_p <= 0;
    if (!st) st = tape_guard(t, out->data);
    if (!st && kg)
        st = pass(t, t->bwd->glu_keep(t->in, bf16_only ? NULL : out, gate, up, n, act, &kg->copy, &ku->copy,
                                      ok.data ? &ok : NULL, tg.xa ? &tg : NULL, tu.xa ? &tu : NULL));
    else if (!st) st = pass(t, t->in->ops->glu(t->in, out, gate, up, n, act));
    const int v = st ? -1 : tape_var_new(t, out->data, n / cols, cols, req);
    if (!st && v < 0) st = nomem(t);
    if (st) {
        if (ok.data) t->in->ops->release(t->in, &ok);
        return st;
    }
    if (ok.data) tape_hold_shared(t, out->data, n / cols, cols, v, &ok);
    if (bf16_only) t->absent[2] = out->data;
    if (r) r->out = v;
    return LMX_OK;
}

static lmx_status w_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) {
    lmx_tape *t = TAPE(be);
    const int vx = var_of(t, x->data);
    if (unreadable(t, x->data)) return muted_read(t, "softcap");
    lmx_status st = tape_settle(t, NULL);
    if (!st) st = tape_guard(t, x->data);
    if (!st) st = pass(t, t->in->ops->softcap(t->in, x, n, cap));
    if (st) return st;
    const int req = requires(t, vx);
    const int64_t cols = vx >= 0 && t->vars[vx].cols ? t->vars[vx].cols : n;
    const int v = tape_var_new(t, x->data, n / cols, cols, req);
    if (v < 0) return nomem(t);
    if (req) {
        tape_rec *r = tape_rec_new(t, T_SOFTCAP);
        if (!r) return nomem(t);
        if ((st = tape_save(t, &r->keep[0], x, n / cols, cols))) return st; /* the output */
        r->in[0] = vx, r->out = v, r->count = n, r->cap = cap;
    }
    return LMX_OK;
}

/* r->bt with copies of the batch's arrays, and room for B more ints (windows) */
static lmx_status keep_batch(lmx_tape *t, tape_rec *r, const lmx_batch *bt) {
    r->ints = malloc((size_t)3 * bt->B * sizeof *r->ints);
    if (!r->ints) return nomem(t);
    memcpy(r->ints, bt->n_past, (size_t)bt->B * sizeof *r->ints);
    memcpy(r->ints + bt->B, bt->n_new, (size_t)bt->B * sizeof *r->ints);
    r->bt = (lmx_batch){.B = bt->B, .T = bt->T, .n_past = r->ints, .n_new = r->ints + bt->B};
    return LMX_OK;
}

static lmx_status rec_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *bt, int nh, int hd, const lmx_rope *rope) {
    lmx_tape *t = TAPE(be);
    const int vx = var_of(t, x->data);
    lmx_status st = LMX_OK;
    if (!muted(t, x->data)) { /* else replay writes its output */
        if (!(st = tape_guard(t, x->data))) st = pass(t, t->in->ops->rope(t->in, x, bt, nh, hd, rope));
        if (st) return st;
    }
    const int req = requires(t, vx);
    const int v = tape_var_new(t, x->data, (int64_t)bt->B * bt->T, (int64_t)nh * hd, req);
    if (v < 0) return nomem(t);
    if (req) {
        tape_rec *r = tape_rec_new(t, T_ROPE);
        if (!r) return nomem(t);
        if ((st = keep_batch(t, r, bt))) return st;
        r->in[0] = vx, r->out = v, r->nh = nh, r->hd = hd, r->rope = *rope;
    }
    return LMX_OK;
}

/* Record r (attention over M rows, its inputs kept) takes the output and log-sum-exp the layer's first run
 * saved (lmx_tape_replay) instead of running the op. */
static lmx_status replay_attention(lmx_tape *t, tape_rec *r, const lmx_attn_args *a, int64_t M) {
    const int64_t cols = (int64_t)a->H * a->D;
    lmx_status (*fill)(void *, lmx_tensor *) = t->rp.att;
    r->lse = t->rp.lse; /* the record's from now on */
    t->rp.att = NULL, t->rp.lse = (lmx_tensor){0};
    lmx_tensor copy = tape_keep_room(t, M, cols); /* bf16 keeps: the output's, written by fill; else none */
    lmx_status st = pass(t, fill(t->rp.user, copy.data ? &copy : a->out));
    const int v = st ? -1 : tape_var_new(t, a->out->data, M, cols, 1);
    if (!st && v < 0) st = nomem(t);
    if (st) {
        if (copy.data) t->in->ops->release(t->in, &copy);
        return st;
    }
    r->out = v;
    if (!copy.data) return tape_save(t, &r->keep[3], a->out, M, cols);
    return (r->keep[3] = tape_keep_made(t, a->out->data, M, cols, v, &copy)) < 0 ? nomem(t) : LMX_OK;
}

/* The attention op's q, k and v written by replay (lmx_tape_replay qkv), which unmutes them: with r (its
 * record, where the op does not run either: its output is replayed too) into the record's keeps, in the keep
 * dtype where that is bf16; else into the buffers (kept from there as any input). */
static lmx_status qkv_fill(lmx_tape *t, const lmx_attn_args *a, tape_rec *r) {
    const lmx_tensor *in[3] = {a->q, a->k, a->v};
    const int64_t M = (int64_t)a->batch->B * a->batch->T, cols[3] = {(int64_t)a->H * a->D, (int64_t)a->Hk * a->D,
                                                                      (int64_t)a->Hk * a->D};
    for (int i = 0; i < 3; i++)
        if (in[i]->data != t->rp.qkv_buf[i]) return muted_read(t, "attention (not of the replayed q, k, v)");
    lmx_status (*fill)(void *, int, lmx_tensor *) = t->rp.qkv;
    t->rp.qkv = NULL;
    lmx_status st = LMX_OK;
    for (int i = 0; i < 3 && !st; i++) {
        lmx_tensor x = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, cols[i]}, .data = in[i]->data};
        lmx_tensor copy = r ? tape_keep_room(t, M, cols[i]) : (lmx_tensor){0};
        if (!copy.data && !(st = tape_guard(t, x.data))) st = pass(t, fill(t->rp.user, i, &x));
        if (!copy.data && !st && r) st = tape_save(t, &r->keep[i], &x, M, cols[i]);
        if (!copy.data) continue;
        if ((st = pass(t, fill(t->rp.user, i, &copy)))) t->in->ops->release(t->in, &copy);
        else if ((r->keep[i] = tape_keep_made(t, x.data, M, cols[i], var_of(t, x.data), &copy)) < 0) st = nomem(t);
    }
    return st;
}

static lmx_status rec_attention(lmx_backend *be, const lmx_attn_args *a) {
    lmx_tape *t = TAPE(be);
    const int vq = var_of(t, a->q->data), vk = var_of(t, a->k->data), vv = var_of(t, a->v->data);
    const int req = requires(t, vq) || requires(t, vk) || requires(t, vv);
    const int64_t M = (int64_t)a->batch->B * a->batch->T;
    const int replayed = req && t->rp.att && t->rp.lse.data; /* the op's output is given: it does not run */
    if (t->rp.qkv && !replayed) { /* its inputs from replay, into their buffers */
        const lmx_status st = qkv_fill(t, a, NULL);
        if (st) return st;
    }
    tape_rec *r = NULL;
    if (req) {
        if (!(r = tape_rec_new(t, T_ATTENTION))) return nomem(t);
        lmx_status st = keep_batch(t, r, a->batch);
        if (!st && t->rp.qkv) {
            st = qkv_fill(t, a, r);
        } else if (!st) {
            st = tape_save(t, &r->keep[0], a->q, M, (int64_t)a->H * a->D);
            if (!st) st = tape_save(t, &r->keep[1], a->k, M, (int64_t)a->Hk * a->D);
            if (!st) st = tape_save(t, &r->keep[2], a->v, M, (int64_t)a->Hk * a->D);
        }
        if (st) return st;
        for (int b = 0; b < a->batch->B; b++) r->ints[2 * a->batch->B + b] = a->kv[b]->window;
        r->attn = *a; /* its pointers are set at backward: records move as the tape grows */
        r->attn.batch = NULL, r->attn.q = r->attn.k = r->attn.v = NULL, r->attn.out = NULL, r->attn.kv = NULL;
        r->attn.lse = NULL;
        r->in[0] = vq, r->in[1] = vk, r->in[2] = vv;
    }
    lmx_status st = tape_guard(t, a->out->data);
    if (st) return st;
    if (replayed) return replay_attention(t, r, a, M);
    /* the backend may also write each row's log-sum-exp, which backward then takes with the output
     * instead of running the forward again (cuda: the flash kernels) */
    lmx_tensor lse = {.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {(int64_t)a->batch->B * a->H * a->batch->T}};
    if (r && t->in->ops->alloc(t->in, &lse) == LMX_OK) {
        lmx_attn_args al = *a;
        al.lse = &lse;
        st = t->in->ops->attention(t->in, &al);
        if (st) t->in->ops->release(t->in, &lse), lse.data = NULL;
        if (st == LMX_ERR_UNSUPPORTED) st = t->in->ops->attention(t->in, a);
    } else {
        st = t->in->ops->attention(t->in, a);
    }
    if (pass(t, st)) return st;
    const int v = tape_var_new(t, a->out->data, M, (int64_t)a->H * a->D, req);
    if (v < 0) return nomem(t);
    if (!r) return LMX_OK;
    r->out = v;
    if (lse.data && (st = tape_save(t, &r->keep[3], a->out, M, (int64_t)a->H * a->D))) t->in->ops->release(t->in, &lse);
    else r->lse = lse;
    return st;
}

static lmx_status w_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                                int64_t n) {
    lmx_tape *t = TAPE(be);
    const int vx = var_of(t, x->data);
    if (unreadable(t, x->data)) return muted_read(t, "gather rows");
    lmx_status st = tape_settle(t, NULL);
    if (!st) st = tape_guard(t, out->data);
    if (!st) st = pass(t, t->in->ops->gather_rows(t->in, out, x, rows, R, n));
    if (st) return st;
    const int req = requires(t, vx), v = tape_var_new(t, out->data, R, n, req);
    if (v < 0) return nomem(t);
    if (req) {
        tape_rec *r = tape_rec_new(t, T_GATHER);
        if (!r || !(r->ints = malloc((size_t)(R ? R : 1) * sizeof *r->ints))) return nomem(t);
        memcpy(r->ints, rows, (size_t)R * sizeof *rows);
        r->in[0] = vx, r->out = v, r->R = R, r->count = n;
    }
    return LMX_OK;
}

/* the recorded ops, timed by kind with t->prof_fwd */
static lmx_status w_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows, int n,
                            float eps, float add_one) {
    lmx_tape *t = TAPE(be);
    lmx_status st0 = tape_settle(t, NULL); /* whatever it reads holds its LoRA terms */
    if (st0) return st0;
    FWD_START(out);
    return fwd_lap(t, T_RMSNORM, out, &fwd_t0, rec_rmsnorm(be, out, x, w, rows, n, eps, add_one));
}
static lmx_status w_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                           const lmx_tensor *bias, int M) {
    lmx_tape *t = TAPE(be);
    lmx_status st0 = tape_settle(t, NULL); /* whatever it reads holds its LoRA terms */
    if (st0) return st0;
    FWD_START(out);
    return fwd_lap(t, T_MATMUL, out, &fwd_t0, rec_matmul(be, out, x, w, bias, M));
}
static lmx_status w_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                         const lmx_lora_pair *const *pairs) {
    lmx_tape *t = TAPE(be);
    FWD_START(y);
    return fwd_lap(t, T_LORA, y, &fwd_t0, rec_lora(be, y, x, B, T, pairs));
}
static lmx_status w_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) {
    lmx_tape *t = TAPE(be);
    FWD_START(y);
    return fwd_lap(t, T_ADD, y, &fwd_t0, rec_add(be, y, x, n));
}
static lmx_status w_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                        lmx_act act) {
    lmx_tape *t = TAPE(be);
    FWD_START(out);
    return fwd_lap(t, T_GLU, out, &fwd_t0, rec_glu(be, out, gate, up, n, act));
}
static lmx_status w_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *bt, int nh, int hd, const lmx_rope *rope) {
    lmx_tape *t = TAPE(be);
    lmx_status st0 = tape_settle(t, NULL); /* whatever it reads holds its LoRA terms */
    if (st0) return st0;
    FWD_START(x);
    return fwd_lap(t, T_ROPE, x, &fwd_t0, rec_rope(be, x, bt, nh, hd, rope));
}
static lmx_status w_attention(lmx_backend *be, const lmx_attn_args *a) {
    lmx_tape *t = TAPE(be);
    lmx_status st0 = tape_settle(t, NULL); /* whatever it reads holds its LoRA terms */
    if (st0) return st0;
    FWD_START(a->out);
    return fwd_lap(t, T_ATTENTION, a->out, &fwd_t0, rec_attention(be, a));
}

static lmx_status w_scatter_add_rows(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, const int *rows, const float *w,
                                     int R, int64_t n) {
    (void)y, (void)x, (void)rows, (void)w, (void)R, (void)n;
    return lmx_err_set(&TAPE(be)->base.err, LMX_ERR_UNSUPPORTED, "training: mixture-of-experts layers are not supported");
}

static lmx_status w_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s) {
    (void)x, (void)n, (void)s;
    return lmx_err_set(&TAPE(be)->base.err, LMX_ERR_UNSUPPORTED, "training: gemma4 models are not supported (the "
                       "scale op of their per-layer inputs, layer scalars and experts has no backward)");
}

/* ---- forwarded as they are ---------------------------------------------------------------------- */

static lmx_status w_upload(lmx_backend *be, lmx_tensor *w) { return pass(TAPE(be), TAPE(be)->in->ops->upload_weight(TAPE(be)->in, w)); }
static lmx_status w_alloc(lmx_backend *be, lmx_tensor *x) {
    lmx_tape *t = TAPE(be);
    lmx_status st = pass(t, t->in->ops->alloc(t->in, x));
    if (!st && tape_var_new(t, x->data, 0, 0, 0) < 0) st = nomem(t); /* a fresh buffer: no stale version */
    return st;
}
static void w_release(lmx_backend *be, lmx_tensor *x) {
    lmx_tape *t = TAPE(be);
    /* a failure leaves its keep lost: backward fails there */
    if (x->data) tape_settle(t, x->data), tape_guard(t, x->data);
    t->in->ops->release(t->in, x);
}
static lmx_status w_write(lmx_backend *be, lmx_tensor *x, size_t off, const void *src, size_t n) {
    lmx_tape *t = TAPE(be);
    lmx_status st = tape_settle(t, x->data);
    if (!st) st = tape_guard(t, x->data);
    if (!st) st = pass(t, t->in->ops->write(t->in, x, off, src, n));
    if (!st && tape_var_new(t, x->data, 0, 0, 0) < 0) st = nomem(t);
    return st;
}
static lmx_status w_read(lmx_backend *be, const lmx_tensor *x, size_t off, void *dst, size_t n) {
    if (unreadable(TAPE(be), x->data)) return muted_read(TAPE(be), "read");
    lmx_status st = tape_settle(TAPE(be), x->data);
    return st ? st : pass(TAPE(be), TAPE(be)->in->ops->read(TAPE(be)->in, x, off, dst, n));
}
static lmx_status w_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *bt, const lmx_tensor *k,
                              const lmx_tensor *v) {
    lmx_status st = tape_settle(TAPE(be), NULL);
    if (!st && (unreadable(TAPE(be), k->data) || unreadable(TAPE(be), v->data)))
        st = muted_read(TAPE(be), "kv append");
    return st ? st : pass(TAPE(be), TAPE(be)->in->ops->kv_append(TAPE(be)->in, kv, bt, k, v));
}
static lmx_status w_kv_reserve(lmx_backend *be, lmx_kv_layer *kv, int need, int64_t row_elems) {
    return pass(TAPE(be), TAPE(be)->in->ops->kv_reserve(TAPE(be)->in, kv, need, row_elems));
}
static void w_trim(lmx_backend *be) {
    if (TAPE(be)->in->ops->trim) TAPE(be)->in->ops->trim(TAPE(be)->in);
}
static int64_t w_cached(const lmx_backend *be) {
    const lmx_backend *in = ((const lmx_tape *)be)->in;
    return in->ops->cached_bytes ? in->ops->cached_bytes(in) : 0;
}
static int64_t w_free(const lmx_backend *be) {
    const lmx_backend *in = ((const lmx_tape *)be)->in;
    return in->ops->free_bytes(in);
}
static void w_destroy(lmx_backend *be) { (void)be; /* lmx_tape_free owns it */ }
static void *w_host_alloc(lmx_backend *be, size_t n) { return TAPE(be)->in->ops->host_alloc(TAPE(be)->in, n); }
static void w_host_free(lmx_backend *be, void *p) { TAPE(be)->in->ops->host_free(TAPE(be)->in, p); }

/* ---- public ------------------------------------------------------------------------------------- */

lmx_status lmx_tape_create(lmx_backend *inner, const lmx_backward_ops *bwd, lmx_tape **out, lmx_err *err) {
    *out = NULL;
    if (!inner || !bwd)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "the %s backend has no backward ops: it cannot train",
                           inner ? inner->ops->name : "(none)");
    lmx_tape *t = calloc(1, sizeof *t);
    if (!t) return lmx_err_set(err, LMX_ERR_NOMEM, "tape: out of memory");
    t->in = inner;
    t->bwd = bwd;
    t->ops = *inner->ops;
    t->ops.destroy = w_destroy;
    t->ops.upload_weight = w_upload;
    t->ops.alloc = w_alloc;
    t->ops.alloc_raw = NULL; /* the tape's own use goes to the inner backend's */
    t->ops.release = w_release;
    t->ops.write = w_write;
    t->ops.read = w_read;
    t->ops.embed = w_embed;
    t->ops.rmsnorm = w_rmsnorm;
    t->ops.matmul = w_matmul;
    t->ops.lora = w_lora;
    t->ops.add = w_add;
    t->ops.glu = w_glu;
    t->ops.softcap = w_softcap;
    t->ops.rope = w_rope;
    t->ops.attention = w_attention;
    t->ops.kv_append = w_kv_append;
    t->ops.kv_reserve = w_kv_reserve;
    t->ops.gather_rows = w_gather_rows;
    t->ops.scatter_add_rows = w_scatter_add_rows;
    t->ops.scale = w_scale;
    t->ops.moe = NULL; /* training routes on the host, through the recorded ops */
    t->ops.topk = NULL; /* whole logits: the loss reads them */
    t->ops.trim = w_trim;
    t->ops.cached_bytes = w_cached;
    t->ops.free_bytes = inner->ops->free_bytes ? w_free : NULL;
    t->ops.host_alloc = inner->ops->host_alloc ? w_host_alloc : NULL;
    t->ops.host_free = inner->ops->host_free ? w_host_free : NULL;
    t->ops.upload_weight_host = NULL; /* weights are bound before any tape */
    t->ops.trim_scratch = NULL;       /* trim (w_trim) does it all */
    t->ops.read_ahead = NULL;         /* its reads go through w_read */
    t->ops.lora_glu = NULL;           /* the lora, glu and add records (their expands wait: tape_term) */
    t->ops.lora_add = NULL;
    t->ops.norm_matmuls = NULL;       /* the rmsnorm record writes the keep the matmuls share (rmsnorm_keep) */
    t->base.ops = &t->ops;
    *out = t;
    return LMX_OK;
}

lmx_backend *lmx_tape_backend(lmx_tape *t) { return &t->base; }
lmx_backend *lmx_tape_inner(lmx_tape *t) { return t->in; }

lmx_status lmx_tape_watch(lmx_tape *t, const lmx_lora_pair *p, lmx_tensor *da, lmx_tensor *db) {
    if (tape_grow((void **)&t->watches, &t->cap_watches, t->n_watches + 1, sizeof *t->watches)) return nomem(t);
    t->watches[t->n_watches++] = (tape_watch){p->a.data, da, db};
    return LMX_OK;
}

void lmx_tape_clear_watches(lmx_tape *t) { t->n_watches = 0; }

void lmx_tape_set_replay(lmx_tape *t, const lmx_tape_replay *r) {
    if (t->rp.lse.data) t->in->ops->release(t->in, &t->rp.lse);
    if (t->rp.input.data) t->in->ops->release(t->in, &t->rp.input);
    t->rp = r ? *r : (lmx_tape_replay){0};
    t->absent[0] = t->rp.input.data ? t->rp.input_buf : NULL, t->absent[1] = t->absent[2] = NULL;
}

void lmx_tape_reset(lmx_tape *t) {
    lmx_tape_set_replay(t, NULL);
    tape_lazy_end(t, 0);
    t->n_terms = 0; /* their records' xa go with the records */
    if (t->shared) tape_unkeep(t, t->shared - 1);
    t->shared = 0;
    for (int i = 0; i < t->n_recs; i++) tape_rec_free(t, &t->recs[i]);
    for (int i = 0; i < t->n_vars; i++) {
        if (t->vars[i].grad.data) t->in->ops->release(t->in, &t->vars[i].grad);
        drop16(t, i);
        drop_du(t, i);
    }
    t->n_recs = t->n_vars = t->n_bufs = t->n_keeps = 0;
}

void lmx_tape_free(lmx_tape *t) {
    if (!t) return;
    lmx_tape_reset(t);
    free(t->vars);
    free(t->bufs);
    free(t->recs);
    free(t->watches);
    free(t->keeps);
    free(t);
}

int lmx_tape_mark(const lmx_tape *t) { return t->n_recs; }

lmx_status lmx_tape_guard(lmx_tape *t, const lmx_tensor *x) {
    lmx_status st = x->data ? tape_settle(t, x->data) : LMX_OK;
    return st || !x->data ? st : tape_guard(t, x->data);
}

int lmx_tape_leaf(lmx_tape *t, const lmx_tensor *x, int64_t rows, int64_t cols) {
    const int v = tape_var_new(t, x->data, rows, cols, 1);
    if (v < 0) nomem(t);
    return v;
}

int lmx_tape_fresh(lmx_tape *t, const lmx_tensor *x) {
    if (tape_var_new(t, x->data, 0, 0, 0) >= 0) return 0;
    nomem(t);
    return -1;
}

void lmx_tape_profile(lmx_tape *t, double *acc, double *acc_fwd) {
    t->prof = acc;
    t->prof_fwd = acc_fwd;
}

void lmx_tape_set_keep_glu(lmx_tape *t, int on) { t->keep_glu = on; }
void lmx_tape_set_glu_out16(lmx_tape *t, int on) { t->glu_out16 = on; }

void lmx_tape_set_dropout(lmx_tape *t, float p, uint64_t seed) {
    t->drop_p = p;
    t->drop_seed = seed;
}

const char *lmx_tape_kind(int k) {
    static const char *const names[] = {"", "rmsnorm", "matmul", "lora", "add", "glu", "softcap", "rope", "attention",
                                        "gather"};
    return k > 0 && k < LMX_TAPE_KINDS ? names[k] : "";
}

