/* tape_wait.c - the work the tape leaves for later (tape.h, tape_internal.h): a projection's LoRA expand,
 * waiting for the op that reads the projection next to add it in its own pass (tape_term), and a frozen
 * matmul with its LoRA op and residual add, waiting for the tape's next op (tape_lazy); a checkpointed
 * layer run again never needs its last projection's, which lmx_tape_end_forward drops. */
#include "tape_internal.h"

/* ---- LoRA expands left to the op that reads the projection next (tape_term) ------------------------ */

int tape_term_index(const lmx_tape *t, const void *data) {
    for (int i = 0; i < t->n_terms; i++)
        if (t->terms[i].y == data) return i;
    return -1;
}

/* term i off the waiting list, as the op that takes it reads it (d: room for the term's data) */
lmx_lora_term tape_term_take(lmx_tape *t, int i, tape_term *d) {
    *d = t->terms[i];
    memmove(&t->terms[i], &t->terms[i + 1], (size_t)(t->n_terms - i - 1) * sizeof *t->terms);
    t->n_terms--;
    return (lmx_lora_term){&d->xa, d->pair};
}

/* ---- ops left unrun until the tape's next op (tape_lazy) ---------------------------------------- */

static lmx_status lazy_exec(lmx_tape *t, tape_lazy *z) {
    const lmx_lora_term term = {&z->term.xa, z->term.pair};
    if (z->op == T_MATMUL) return pass(t, t->in->ops->matmul(t->in, &z->out, &z->x, z->w, z->bias, z->M));
    if (z->op == T_LORA) return pass(t, t->in->ops->lora(t->in, &z->out, &z->x, z->B, z->T, z->pairs));
    if (z->term.pair) return pass(t, t->bwd->lora_add(t->in, &z->out, &z->x, z->n, &term));
    return pass(t, t->in->ops->add(t->in, &z->out, &z->x, z->n));
}

/* every op left unrun, run now (run 1) or dropped (run 0), oldest first */
lmx_status tape_lazy_end(lmx_tape *t, int run) {
    lmx_status st = LMX_OK;
    for (int i = 0; i < t->n_lazy; i++) {
        tape_lazy *z = &t->lazy[i];
        double t0 = 0;
        if (run && !st && t->prof_fwd) prof_lap(t, &z->out, &t0);
        if (run && !st) st = lazy_exec(t, z);
        if (!st && t0 > 0) { /* timed as its kind's, not as the op's that ran it */
            const double s = prof_lap(t, &z->out, &t0);
            t->prof_fwd[z->op] += s, t->lazy_s += s;
        }
        if (z->keep >= 0) tape_unkeep(t, z->keep);
    }
    t->n_lazy = 0;
    return st;
}

/* The callers keep to TAPE_LAZY (a matmul with nothing waiting, its LoRA and add where tape_lazy_only_into
 * holds); the check keeps the array whole if one ever did not. */
lmx_status tape_lazy_push(lmx_tape *t, const tape_lazy *z) {
    if (t->n_lazy >= TAPE_LAZY) {
        if (z->keep >= 0) tape_unkeep(t, z->keep);
        return lmx_err_set(&t->base.err, LMX_ERR_BACKEND, "tape: more than %d ops left unrun", TAPE_LAZY);
    }
    t->lazy[t->n_lazy++] = *z;
    return LMX_OK;
}

/* The ops left unrun are a matmul into buffer data and its LoRA, with room for one more (else 0) */
int tape_lazy_only_into(const lmx_tape *t, const void *data) {
    for (int i = 0; i < t->n_lazy; i++)
        if (t->lazy[i].op == T_ADD || t->lazy[i].out.data != data) return 0;
    return t->n_lazy > 0 && t->n_lazy < TAPE_LAZY;
}

/* An op left unrun that reads xin: where xin is the tape's shared keep, a reference held on it (its id;
 * else -1: xin is a buffer the next op to write runs the op first, or a record's own) */
int tape_lazy_hold(lmx_tape *t, const lmx_tensor *xin) {
    const int id = t->shared && xin == &t->keeps[t->shared - 1].copy ? t->shared - 1 : -1;
    if (id >= 0) t->keeps[id].refs++;
    return id;
}

/* term i added to its buffer now */
lmx_status tape_settle_at(lmx_tape *t, int i) {
    lmx_status st = tape_lazy_end(t, 1);
    if (st) return st;
    tape_term d;
    const lmx_lora_term term = tape_term_take(t, i, &d);
    const int64_t rows = d.xa.shape[0], N = d.pair->b.shape[0];
    lmx_tensor y = {.dtype = d.dtype, .ndim = 2, .shape = {rows, N}, .data = d.y};
    return pass(t, t->bwd->lora_add(t->in, &y, NULL, rows * N, &term));
}

/* every waiting term but those of buffers a and b (NULL: none) added now */
lmx_status tape_settle_others(lmx_tape *t, const void *a, const void *b) {
    lmx_status st = LMX_OK;
    for (int i = t->n_terms - 1; i >= 0 && !st; i--)
        if (t->terms[i].y != a && t->terms[i].y != b) st = tape_settle_at(t, i);
    return st;
}

/* buffer data's waiting terms (NULL: every one) added now */
lmx_status tape_settle_terms(lmx_tape *t, const void *data) {
    lmx_status st = LMX_OK;
    for (int i = t->n_terms - 1; i >= 0 && !st; i--)
        if (!data || t->terms[i].y == data) st = tape_settle_at(t, i);
    return st;
}

lmx_status tape_settle(lmx_tape *t, const void *data) {
    lmx_status st = tape_lazy_end(t, 1);
    return st ? st : tape_settle_terms(t, data);
}

/* No keep reads buffer data's present value from the buffer itself (every such keep has its copy): an op
 * may take the buffer's term in its pass without the buffer ever holding it. */
int tape_unkept(const lmx_tape *t, const void *data) {
    for (int i = 0; i < t->n_keeps; i++)
        if (t->keeps[i].refs > 0 && !t->keeps[i].copy.data && t->keeps[i].src == data) return 0;
    return 1;
}

lmx_status lmx_tape_end_forward(lmx_tape *t, const lmx_tensor *unread) {
    /* the ops left unrun end in an add into unread (the matmul and LoRA before it feed it alone) */
    int drop = unread && t->n_lazy > 0 && t->lazy[t->n_lazy - 1].out.data == unread->data;
    for (int i = 0; drop && i < t->n_lazy; i++) drop = tape_unkept(t, t->lazy[i].out.data); /* and no keep reads them */
    return tape_lazy_end(t, !drop);
}
