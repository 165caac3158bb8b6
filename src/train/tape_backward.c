/* tape_backward.c - the tape's walk back (tape.h): each record's gradient from its output's, through
 * the backend's backward ops (backward.h), last record first.  A var's gradient is allocated where an op
 * first adds to it, written without zeroing where the op writes it whole (fresh), or handed over from the
 * op's output where the op passes it through (LoRA, residual adds); and in bf16 alone where the backend
 * keeps bf16 and every reader of the gradient takes it so (bf16_grad_ok). */
#include "tape_internal.h"

static lmx_status du_settle(lmx_tape *t, int v);

/* Var v's LoRA input-gradient terms wait for the record that made v, a GLU whose backward takes them in its
 * own pass (glu_bwd_dx: the down projection's input), rather than going into v's gradient before the frozen
 * matmul's product does: that writes the gradient then instead of adding to it. */
static int du_to_maker(const lmx_tape *t, int v) {
    if (!t->vars[v].n_du || !t->bwd->glu_bwd_dx) return 0;
    const int j = maker_of(t, t->n_recs, v);
    return j >= 0 && t->recs[j].op == T_GLU;
}

/* The gradient of var v, allocated (zeroed) on first use; NULL with t's error set on failure. */
static lmx_tensor *grad_of(lmx_tape *t, int v) {
    tape_var *x = &t->vars[v];
    if (x->n_du && !du_to_maker(t, v) && du_settle(t, v)) return NULL;
    if (only16(x)) {
        lmx_err_set(&t->base.err, LMX_ERR_BACKEND, "tape: a bf16 gradient gains a second term");
        return NULL;
    }
    drop16(t, v);
    if (!x->grad.data) {
        x->grad = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {x->rows, x->cols}};
        if (pass(t, t->in->ops->alloc(t->in, &x->grad))) return NULL;
    }
    return &x->grad;
}
/* dst = the gradient of var v when v needs one, else NULL (returns from the caller on failure) */
#define GRAD(v, dst)                                          \
    do {                                                      \
        dst = NULL;                                           \
        if (requires(t, (v)) && !(dst = grad_of(t, (v)))) return t->base.err.status; \
    } while (0)

/* The same for an op that writes n values of a gradient: when it is the first to reach it and writes
 * all of it, the buffer is not zeroed first and fresh gains bit (backward.h). */
static lmx_tensor *grad_fresh(lmx_tape *t, int v, int64_t n, unsigned bit, unsigned *fresh) {
    tape_var *x = &t->vars[v];
    if (x->n_du && !du_to_maker(t, v) && du_settle(t, v)) return NULL;
    if (only16(x)) return grad_of(t, v);
    drop16(t, v);
    if (x->grad.data || !t->in->ops->alloc_raw || x->rows * x->cols != n) return grad_of(t, v);
    x->grad = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {x->rows, x->cols}};
    if (pass(t, t->in->ops->alloc_raw(t->in, &x->grad))) return NULL;
    *fresh |= bit;
    return &x->grad;
}
#define GRAD_FRESH(v, dst, n, bit, fresh)                                                       \
    do {                                                                                        \
        dst = NULL;                                                                             \
        if (requires(t, (v)) && !(dst = grad_fresh(t, (v), (n), (bit), &(fresh)))) return t->base.err.status; \
    } while (0)

/* Var v's waiting LoRA input-gradient terms (tape_var du) added to its gradient now, in one lora_dx, which
 * writes the gradient where v has none yet: the first of the q, k, v (or gate, up) projections' input
 * gradients to reach it, before their frozen matmuls add theirs. */
static lmx_status du_settle(lmx_tape *t, int v) {
    tape_var *x = &t->vars[v];
    const int n = x->n_du;
    if (!n) return LMX_OK;
    x->n_du = 0; /* before grad_fresh, which settles */
    unsigned fresh = 0;
    const lmx_tensor *g = grad_fresh(t, v, x->rows * x->cols, 1, &fresh);
    lmx_status st = g ? pass(t, t->bwd->lora_dx(t->in, &x->grad, n, x->du, x->du_pair, fresh)) : t->base.err.status;
    for (int i = 0; i < n; i++) t->in->ops->release(t->in, &x->du[i]);
    return st;
}

/* LoRA record r's input gradient as a term of its input var (tape_var du), where the backend has lora_dx, the
 * input takes no dropout and one pair adapts every row: room for u = s dy B [B*T, r], or data NULL (the input
 * gradient is added at once). */
static lmx_tensor du_room(lmx_tape *t, const tape_rec *r) {
    const tape_var *x = r->in[1] >= 0 ? &t->vars[r->in[1]] : NULL;
    if (!x || !x->requires || !t->bwd->lora_dx || r->drop > 0 || x->n_du >= TAPE_DU || only16(x) || x->grad16.data ||
        !r->pairs[0])
        return (lmx_tensor){0};
    for (int b = 1; b < r->bt.B; b++)
        if (r->pairs[b] != r->pairs[0]) return (lmx_tensor){0};
    lmx_tensor u = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {(int64_t)r->bt.B * r->bt.T, r->pairs[0]->a.shape[0]}};
    if (tape_alloc(t, &u)) {
        lmx_err_clear(&t->in->err);
        u.data = NULL;
    }
    return u;
}

/* Var v's gradient gains the gradient dy of var from (the output of an op that passes it through): v
 * takes dy's buffer over when it has none yet and dy owns it (dy is used up then), else dy is added. */
static lmx_status pass_grad(lmx_tape *t, int v, lmx_tensor *dy) {
    if (!requires(t, v)) return LMX_OK;
    drop16(t, v);
    tape_var *x = &t->vars[v];
    if (!x->grad.data && dy->owned && x->rows * x->cols == lmx_tensor_nelem(dy)) {
        x->grad = *dy;
        x->grad.ndim = 2, x->grad.shape[0] = x->rows, x->grad.shape[1] = x->cols;
        memset(dy, 0, sizeof *dy);
        return LMX_OK;
    }
    lmx_tensor *g = grad_of(t, v);
    return g ? pass(t, t->in->ops->add(t->in, g, dy, lmx_tensor_nelem(g))) : t->base.err.status;
}

/* Whether a record before i other than skip reads var v. */
static int read_before(const lmx_tape *t, int i, int v, int skip) {
    for (int j = 0; j < i; j++) {
        const tape_rec *r = &t->recs[j];
        if (j != skip && (r->in[0] == v || r->in[1] == v || r->in[2] == v)) return 1;
    }
    return 0;
}

/* Whether var v's gradient, which record i is about to write whole, may live in bf16 alone (grad16,
 * no f32 grad): where keeps are bf16, record i is v's only reader and what reads v's gradient next
 * takes it in bf16 anyway: the matmul that made v, or the LoRA record that made it, when that record's
 * input version is read by it alone and was made by a matmul.  (The gate and up of a GLU; the output
 * projection of a residual branch.) */
static int bf16_grad_ok(lmx_tape *t, int i, int v) {
    if (v < 0 || t->vars[v].grad.data || t->vars[v].grad16.data || t->vars[v].n_du ||
        t->bwd->keep_dtype(t->in) != LMX_DTYPE_BF16 ||
        read_before(t, i, v, -1))
        return 0;
    const int j = maker_of(t, i, v);
    if (j < 0) return 0;
    if (t->recs[j].op == T_MATMUL) return 1;
    if (t->recs[j].op != T_LORA) return 0;
    const int y0 = t->recs[j].in[0], m = maker_of(t, j, y0);
    return y0 >= 0 && !t->vars[y0].grad.data && !t->vars[y0].grad16.data && !read_before(t, i, y0, j) && m >= 0 &&
           t->recs[m].op == T_MATMUL;
}

/* Whether var v, a GLU's output, may have its gradient in bf16 alone, written whole by record i (the frozen
 * matmul that reads it: the down projection): asked for (lmx_tape_set_glu_out16), keeps are bf16, v has no
 * gradient yet and its LoRA terms wait for the GLU (du_to_maker), no record before i reads v, and the GLU that
 * made v reads that gradient next (in bf16 where glu_bwd16 takes it, else widened: widen16). */
static int glu_out16(lmx_tape *t, int i, int v) {
    const tape_var *x = v >= 0 ? &t->vars[v] : NULL;
    if (!t->glu_out16 || !x || !x->requires || x->grad.data || x->grad16.data || (x->n_du && !du_to_maker(t, v)) ||
        t->bwd->keep_dtype(t->in) != LMX_DTYPE_BF16 || read_before(t, i, v, -1))
        return 0;
    const int j = maker_of(t, i, v);
    return j >= 0 && t->recs[j].op == T_GLU && t->recs[j].count == x->rows * x->cols;
}

/* Var v's bf16 gradient (only16) widened into an f32 one, for an op that adds to it or reads f32. */
static lmx_status widen16(lmx_tape *t, int v) {
    tape_var *x = &t->vars[v];
    x->grad = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {x->rows, x->cols}};
    lmx_status st = pass(t, t->in->ops->alloc(t->in, &x->grad));
    if (!st) st = pass(t, t->bwd->restore(t->in, &x->grad, &x->grad16));
    drop16(t, v);
    return st;
}

/* Var v's bf16 gradient allocated for an op that writes it whole (bf16_grad_ok): 1, or 0 (out of memory: none). */
static int grad16_room(lmx_tape *t, int v) {
    tape_var *x = &t->vars[v];
    x->grad16 = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {x->rows, x->cols}};
    if (tape_alloc(t, &x->grad16) == LMX_OK) return 1;
    lmx_err_clear(&t->in->err);
    x->grad16.data = NULL;
    return 0;
}

/* Keep id is a bf16 copy of n values that no record but the one walked reads (its last reader) */
static int keep_last16(const lmx_tape *t, int id, int64_t n) {
    const tape_keep *k = id >= 0 ? &t->keeps[id] : NULL;
    return k && k->refs == 1 && k->copy.data && k->copy.dtype == LMX_DTYPE_BF16 && lmx_tensor_nelem(&k->copy) == n;
}
/* keep id's copy becomes var v's bf16 gradient (the keep is left empty: lost, which no one reads) */
static void keep_to_grad16(lmx_tape *t, int id, int v) {
    tape_keep *k = &t->keeps[id];
    tape_var *x = &t->vars[v];
    x->grad16 = k->copy;
    x->grad16.ndim = 2, x->grad16.shape[0] = x->rows, x->grad16.shape[1] = x->cols;
    memset(&k->copy, 0, sizeof k->copy);
    k->src = NULL;
}

/* GLU record i's gradients as bf16 alone (bf16_grad_ok), written by glu_bwd: over its gate and up keeps
 * where it is their last reader (glu_bwd reads each value before it writes its place), else into new
 * tensors.  1 done, 0 not taken (the f32 way then), -1 failed. */
static int glu_bwd16(lmx_tape *t, int i, const lmx_tensor *dy, const lmx_tensor *saved) {
    const tape_rec *r = &t->recs[i];
    if (r->in[0] == r->in[1] || !bf16_grad_ok(t, i, r->in[0]) || !bf16_grad_ok(t, i, r->in[1])) return 0;
    tape_var *g = &t->vars[r->in[0]], *u = &t->vars[r->in[1]];
    if (g->rows * g->cols != r->count || u->rows * u->cols != r->count) return 0;
    if (r->keep[0] != r->keep[1] && keep_last16(t, r->keep[0], r->count) && keep_last16(t, r->keep[1], r->count)) {
        keep_to_grad16(t, r->keep[0], r->in[0]);
        keep_to_grad16(t, r->keep[1], r->in[1]);
    } else if (!grad16_room(t, r->in[0]) || !grad16_room(t, r->in[1])) {
        drop16(t, r->in[0]);
        return 0;
    }
    tape_var *y = &t->vars[r->out];
    lmx_status st = LMX_ERR_UNSUPPORTED;
    if (y->n_du && t->bwd->glu_bwd_dx) { /* the down projection's LoRA input gradients in the same pass (du_to_maker) */
        st = t->bwd->glu_bwd_dx(t->in, &g->grad16, &u->grad16, dy, &saved[0], &saved[1], r->count, r->act, y->n_du,
                                y->du, y->du_pair);
        if (st == LMX_OK) {
            drop_du(t, r->out);
        } else if (st != LMX_ERR_UNSUPPORTED) {
            return pass(t, st), -1;
        }
    }
    if (st == LMX_ERR_UNSUPPORTED && only16(y)) { /* dy in bf16 (glu_out16): f32 for the terms to join */
        if (widen16(t, r->out)) return -1;
        dy = &y->grad;
    }
    if (st == LMX_ERR_UNSUPPORTED && (du_settle(t, r->out) ||
                                      pass(t, t->bwd->glu_bwd(t->in, &g->grad16, &u->grad16, dy, &saved[0], &saved[1],
                                                              r->count, r->act, 3))))
        return -1;
    return 1;
}

/* The backward op of record r, reading saved (its keeps' values). */
static lmx_status backward_op(lmx_tape *t, tape_rec *r, lmx_tensor *dy, lmx_tensor *saved) {
    lmx_backend *in = t->in;
    const lmx_backward_ops *bw = t->bwd;
    lmx_tensor *g0, *g1, *g2;
    /* bf16_grad_ok and glu_out16 send a bf16 gradient to these alone */
    if (!dy->data && r->op != T_LORA && r->op != T_MATMUL && r->op != T_GLU)
        return lmx_err_set(&t->base.err, LMX_ERR_BACKEND, "tape: record kind %d reached with a bf16 gradient", r->op);
    switch (r->op) {
    case T_RMSNORM: {
        unsigned fresh = 0;
        GRAD_FRESH(r->in[0], g0, (int64_t)r->rows * r->n, 1, fresh);
        return g0 ? pass(t, bw->rmsnorm_bwd(in, g0, dy, &saved[0], r->w, r->rows, r->n, r->eps, r->one, fresh)) : LMX_OK;
    }
    case T_MATMUL: {
        unsigned fresh = 0;
        const lmx_tensor *d16 = &t->vars[r->out].grad16; /* the LoRA record's copy of dy, or none */
        tape_var *xv = r->in[0] >= 0 ? &t->vars[r->in[0]] : NULL;
        if (glu_out16(t, (int)(r - t->recs), r->in[0]) && (int64_t)r->M * r->w->shape[1] == xv->rows * xv->cols &&
            grad16_room(t, r->in[0])) { /* a GLU output's gradient in bf16 alone, as the backend writes it */
            const lmx_status st = bw->matmul_bwd(in, &xv->grad16, d16->data ? d16 : dy, r->w, r->M, 1);
            if (st != LMX_ERR_UNSUPPORTED) return pass(t, st);
            drop16(t, r->in[0]);
            lmx_err_clear(&in->err);
        }
        GRAD_FRESH(r->in[0], g0, (int64_t)r->M * r->w->shape[1], 1, fresh);
        return g0 ? pass(t, bw->matmul_bwd(in, g0, d16->data ? d16 : dy, r->w, r->M, fresh)) : LMX_OK;
    }
    case T_LORA: { /* y's gradient passes on to y's input version (pass_grad, last: it may take dy over) */
        tape_var *yv = &t->vars[r->out];
        const int dy_only16 = only16(yv); /* then y's bf16 gradient is read here and moves on whole */
        unsigned fresh = 0;
        lmx_tensor u = du_room(t, r); /* x's gradient left as a term (then g1 stays NULL) */
        if (u.data) g1 = NULL;
        else if (r->drop > 0) GRAD(r->in[1], g1); /* then x's gradient is added from tmp, below */
        else GRAD_FRESH(r->in[1], g1, lmx_tensor_nelem(&saved[0]), 1, fresh);
        lmx_status st = LMX_OK;
        const lmx_tensor *x = r->own.data ? &r->own : &saved[0];
        lmx_tensor **da = malloc((size_t)r->bt.B * 2 * sizeof *da);
        if (!da) {
            if (u.data) in->ops->release(in, &u);
            return nomem(t);
        }
        lmx_tensor **db = da + r->bt.B;
        for (int b = 0; b < r->bt.B; b++) {
            const tape_watch *w = watch_of(t, r->pairs[b]);
            da[b] = w ? w->da : NULL, db[b] = w ? w->db : NULL;
        }
        lmx_tensor tmp = {0}; /* with dropout, x's gradient goes through the same mask */
        const int64_t nx = lmx_tensor_nelem(x);
        if (g1 && r->drop > 0) {
            tmp = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {x->shape[0], x->shape[1]}};
            st = pass(t, in->ops->alloc(in, &tmp));
        }
        /* where keeps are bf16, dy once as bf16 for this op and the matmul record that made y (its
         * input version, which takes dy over below) */
        lmx_tensor dy16 = {0};
        if (dy_only16) dy16 = yv->grad16, memset(&yv->grad16, 0, sizeof yv->grad16);
        else if (!st && t->bwd->keep_dtype(in) == LMX_DTYPE_BF16 && t->bwd->keep(in, &dy16, dy) != LMX_OK) dy16.data = NULL;
        if (!st)
            st = pass(t, bw->lora_bwd(in, tmp.data ? &tmp : g1, da, db, dy16.data ? &dy16 : dy, x, r->bt.B, r->bt.T,
                                      r->pairs, fresh, r->xa.data ? &r->xa : NULL, u.data ? &u : NULL));
        if (u.data && !st) { /* x's term, added with the other pairs' that read x (du_settle) */
            tape_var *xv = &t->vars[r->in[1]];
            xv->du[xv->n_du] = u, xv->du_pair[xv->n_du++] = r->pairs[0];
        } else if (u.data) {
            in->ops->release(in, &u);
        }
        if (!st && tmp.data) st = pass(t, bw->dropout(in, &tmp, &tmp, nx, r->drop, r->seed));
        if (!st && tmp.data) st = pass(t, in->ops->add(in, g1, &tmp, nx));
        if (tmp.data) in->ops->release(in, &tmp);
        free(da);
        if (!st && !dy_only16) st = pass_grad(t, r->in[0], dy);
        if (!st && dy16.data && !dy->data) { /* taken over whole: the copy goes with it */
            t->vars[r->in[0]].grad16 = dy16;
            dy16.data = NULL;
        }
        if (dy16.data) in->ops->release(in, &dy16);
        return st;
    }
    case T_ADD: { /* y += x: both gain dy (x's first, as y's may take dy over) */
        const int64_t n = lmx_tensor_nelem(dy);
        tape_var *xv = r->in[1] >= 0 ? &t->vars[r->in[1]] : NULL;
        if (xv && xv->rows * xv->cols == n && bf16_grad_ok(t, (int)(r - t->recs), r->in[1])) {
            /* x's gradient is dy rounded once to bf16 (a residual branch's output: its LoRA and matmul
             * records read it so), not zeros plus dy in f32 */
            if (bw->keep(in, &xv->grad16, dy) == LMX_OK) return pass_grad(t, r->in[0], dy);
            memset(&xv->grad16, 0, sizeof xv->grad16);
            lmx_err_clear(&in->err);
        }
        GRAD(r->in[1], g1);
        if (g1 && pass(t, in->ops->add(in, g1, dy, n < lmx_tensor_nelem(g1) ? n : lmx_tensor_nelem(g1))))
            return t->base.err.status;
        return pass_grad(t, r->in[0], dy);
    }
    case T_GLU: {
        tape_var *yv = &t->vars[r->out];
        const int done = glu_bwd16(t, (int)(r - t->recs), dy->data ? dy : &yv->grad16, saved);
        if (done) return done > 0 ? LMX_OK : t->base.err.status;
        if (!dy->data && widen16(t, r->out)) return t->base.err.status; /* dy (y's gradient) f32 now */
        lmx_status st0 = du_settle(t, r->out); /* terms left for glu_bwd_dx, which the f32 way does not take */
        if (st0) return st0;
        unsigned fresh = 0;
        GRAD_FRESH(r->in[0], g0, r->count, 1, fresh);
        GRAD_FRESH(r->in[1], g1, r->count, 2, fresh);
        lmx_tensor sink = {0}; /* one side needs no gradient: it still gets one, thrown away */
        if (!g0 || !g1) {
            sink = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {r->count}};
            if (pass(t, in->ops->alloc(in, &sink))) return t->base.err.status;
        }
        lmx_status st = pass(t, bw->glu_bwd(in, g0 ? g0 : &sink, g1 ? g1 : &sink, dy, &saved[0], &saved[1],
                                            r->count, r->act, fresh));
        if (sink.data) in->ops->release(in, &sink);
        return st;
    }
    case T_SOFTCAP:
        GRAD(r->in[0], g0);
        return g0 ? pass(t, bw->softcap_bwd(in, g0, dy, &saved[0], r->count, r->cap)) : LMX_OK;
    case T_ROPE: {
        tape_var *xv = &t->vars[r->in[0]];
        if (xv->rows * xv->cols == lmx_tensor_nelem(dy) && bf16_grad_ok(t, (int)(r - t->recs), r->in[0]) &&
            grad16_room(t, r->in[0])) { /* x's gradient in bf16 alone, written whole */
            const lmx_status st = bw->rope_bwd(in, &xv->grad16, dy, &r->bt, r->nh, r->hd, &r->rope, 1);
            if (st != LMX_ERR_UNSUPPORTED) return pass(t, st);
            drop16(t, r->in[0]);
            lmx_err_clear(&in->err);
        }
        unsigned fresh = 0;
        GRAD_FRESH(r->in[0], g0, lmx_tensor_nelem(dy), 1, fresh);
        return g0 ? pass(t, bw->rope_bwd(in, g0, dy, &r->bt, r->nh, r->hd, &r->rope, fresh)) : LMX_OK;
    }
    case T_ATTENTION: {
        unsigned fresh = 0;
        GRAD_FRESH(r->in[0], g0, lmx_tensor_nelem(&saved[0]), 1, fresh);
        GRAD_FRESH(r->in[1], g1, lmx_tensor_nelem(&saved[1]), 2, fresh);
        GRAD_FRESH(r->in[2], g2, lmx_tensor_nelem(&saved[2]), 4, fresh);
        lmx_tensor sink[3] = {{0}};
        lmx_tensor *gs[3] = {g0, g1, g2};
        for (int k = 0; k < 3; k++)
            if (!gs[k]) {
                sink[k] = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {saved[k].shape[0], saved[k].shape[1]}};
                if (pass(t, in->ops->alloc(in, &sink[k]))) return t->base.err.status;
                gs[k] = &sink[k];
            }
        lmx_attn_args a = r->attn;
        a.batch = &r->bt, a.q = &saved[0], a.k = &saved[1], a.v = &saved[2];
        if (r->lse.data) a.out = &saved[3], a.lse = &r->lse; /* the forward's output and log-sum-exp */
        lmx_status st = pass(t, bw->attention_bwd(in, gs[0], gs[1], gs[2], dy, &a, r->ints + 2 * r->bt.B, fresh));
        for (int k = 0; k < 3; k++)
            if (sink[k].data) in->ops->release(in, &sink[k]);
        return st;
    }
    case T_GATHER:
        GRAD(r->in[0], g0);
        return g0 ? pass(t, bw->gather_rows_bwd(in, g0, dy, r->ints, r->R, r->count)) : LMX_OK;
    }
    return lmx_err_set(&t->base.err, LMX_ERR_BACKEND, "tape: unknown record %d", r->op);
}

/* Keep id's value made again where it is a redo not made yet (tape_keep): in the keep dtype, held as
 * the keep's copy until its last reader is walked. */
static lmx_status redo_make(lmx_tape *t, int id) {
    tape_keep *k = &t->keeps[id];
    if (!k->redo || k->copy.data) return LMX_OK;
    const lmx_tensor a = kept(t, k->from[0]), b = k->from[1] >= 0 ? kept(t, k->from[1]) : a;
    if (!a.data || !b.data)
        return lmx_err_set(&t->base.err, LMX_ERR_NOMEM, "tape: a value backward reads was lost (out of memory)");
    lmx_tensor out = {.dtype = t->bwd->keep_dtype(t->in), .ndim = 2, .shape = {k->rows, k->cols}};
    lmx_status st = pass(t, tape_alloc(t, &out));
    if (!st && k->redo == T_GLU) st = pass(t, t->bwd->glu_redo(t->in, &out, &a, &b, k->rows * k->cols, k->act));
    else if (!st) st = pass(t, t->bwd->rmsnorm_redo(t->in, &out, &a, k->w, (int)k->rows, (int)k->cols, k->eps, k->one));
    if (st && out.data) t->in->ops->release(t->in, &out);
    if (!st) k->copy = out;
    return st;
}

/* Record r's gradient back to its inputs, from dy (the gradient of its output, which T_LORA and T_ADD
 * may hand over to an input, leaving dy empty). */
static lmx_status backward_rec(lmx_tape *t, tape_rec *r, lmx_tensor *dy) {
    lmx_tensor saved[4] = {{0}}; /* what the op reads (f32, or the backend's keep dtype) */
    for (int k = 0; k < 4; k++) {
        if (r->keep[k] < 0) continue;
        lmx_status st = redo_make(t, r->keep[k]);
        if (st) return st;
        saved[k] = kept(t, r->keep[k]);
        if (!saved[k].data)
            return lmx_err_set(&t->base.err, LMX_ERR_NOMEM, "tape: a value backward reads was lost (out of memory)");
    }
    return backward_op(t, r, dy, saved);
}

void lmx_tape_take_grad(lmx_tape *t, int v, lmx_tensor *g) {
    memset(g, 0, sizeof *g);
    if (v < 0 || v >= t->n_vars) return;
    *g = t->vars[v].grad;
    memset(&t->vars[v].grad, 0, sizeof t->vars[v].grad);
}


/* The gradient var of y's latest version, checked against n values; -1 with t's error set. */
static int seed_var(lmx_tape *t, const lmx_tensor *y, int64_t n) {
    const int vy = var_of(t, y->data);
    if (vy < 0 || !t->vars[vy].requires) {
        lmx_err_set(&t->base.err, LMX_ERR_INVALID_ARG, "tape: the output does not depend on a trained parameter");
        return -1;
    }
    if (t->vars[vy].rows * t->vars[vy].cols != n) {
        lmx_err_set(&t->base.err, LMX_ERR_SHAPE, "tape: gradient of %lld values for an output of %lld", (long long)n,
                    (long long)(t->vars[vy].rows * t->vars[vy].cols));
        return -1;
    }
    return vy;
}

/* Walk the records from the last back to mark, then forget them. */
static lmx_status walk_back(lmx_tape *t, int mark) {
    lmx_status st = tape_settle(t, NULL); /* the forward's values whole before any is read back */
    double t0 = 0;
    if (mark < 0 || mark > t->n_recs) mark = t->n_recs;
    for (int i = t->n_recs - 1; i >= mark && !st; i--) {
        tape_rec *r = &t->recs[i];
        /* terms waiting for this record's own op (du_to_maker) stay where it has a gradient to take them with */
        const int to_op = r->out >= 0 && (t->vars[r->out].grad.data || t->vars[r->out].grad16.data) &&
                          du_to_maker(t, r->out);
        if (r->out >= 0 && !to_op && (st = du_settle(t, r->out))) break;
        if (r->out < 0 || (!t->vars[r->out].grad.data && !t->vars[r->out].grad16.data)) continue; /* nothing flows back */
        /* the gradient (f32, or bf16 alone), for the profile's waits: backward may hand its buffer over, still live */
        const lmx_tensor dy = t->vars[r->out].grad.data ? t->vars[r->out].grad : t->vars[r->out].grad16;
        if (t->prof) prof_lap(t, &dy, &t0);
        st = backward_rec(t, r, &t->vars[r->out].grad);
        if (t->prof) t->prof[r->op] += prof_lap(t, &dy, &t0);
        t->in->ops->release(t->in, &t->vars[r->out].grad); /* each version's gradient is used once */
        drop16(t, r->out);
        tape_rec_free(t, r); /* and its keeps (a redo's copy with its last reader) */
    }
    for (int i = mark; i < t->n_recs; i++) tape_rec_free(t, &t->recs[i]); /* walked: forgotten */
    t->n_recs = mark;
    for (int v = 0; v < t->n_vars && !st; v++) st = du_settle(t, v); /* the gradients the caller takes, whole */
    return st;
}

lmx_status lmx_tape_walk(lmx_tape *t, int mark) { return walk_back(t, mark); }

lmx_status lmx_tape_backward_take(lmx_tape *t, const lmx_tensor *y, lmx_tensor *dy, int64_t n, int mark) {
    const int vy = seed_var(t, y, n);
    if (vy < 0) return t->base.err.status;
    tape_var *v = &t->vars[vy];
    if (v->grad.data || v->grad16.data || !dy->owned || dy->dtype != LMX_DTYPE_F32 || lmx_tensor_nelem(dy) != n)
        return lmx_tape_backward_from(t, y, dy, n, mark);
    v->grad = *dy; /* y's gradient, not zeros plus dy */
    v->grad.ndim = 2, v->grad.shape[0] = v->rows, v->grad.shape[1] = v->cols;
    memset(dy, 0, sizeof *dy);
    return walk_back(t, mark);
}

int lmx_tape_seed16(lmx_tape *t, const lmx_tensor *y) {
    const int vy = var_of(t, y->data), j = vy >= 0 ? maker_of(t, t->n_recs, vy) : -1;
    return j >= 0 && t->recs[j].op == T_MATMUL && t->bwd->keep_dtype(t->in) == LMX_DTYPE_BF16;
}

lmx_status lmx_tape_backward_from(lmx_tape *t, const lmx_tensor *y, const lmx_tensor *dy, int64_t n, int mark) {
    const int vy = seed_var(t, y, n);
    if (vy < 0) return t->base.err.status;
    tape_var *v = &t->vars[vy];
    if (dy->dtype == LMX_DTYPE_BF16) { /* lmx_tape_seed16: the matmul that made y reads it as it is (a view) */
        if (!lmx_tape_seed16(t, y) || v->grad.data || v->grad16.data)
            return lmx_err_set(&t->base.err, LMX_ERR_INVALID_ARG, "tape: a bf16 gradient for an output not a matmul's");
        v->grad16 = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {v->rows, v->cols}, .data = dy->data};
        return walk_back(t, mark);
    }
    if (!v->grad.data && dy->data == y->data && dy->dtype == LMX_DTYPE_F32) {
        /* the gradient written over the output (the loss's logits): read where it is, not copied; a view
         * the walk's release leaves alone and pass_grad never hands on (the caller's buffer) */
        v->grad = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {v->rows, v->cols}, .data = dy->data};
        return walk_back(t, mark);
    }
    if (!grad_of(t, vy)) return t->base.err.status;
    lmx_status st = pass(t, t->in->ops->add(t->in, &v->grad, dy, n));
    return st ? st : walk_back(t, mark);
}
