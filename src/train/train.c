/* train.c - the loss, its gradients through the tape, and AdamW (train.h).
 *
 * A training pass runs the model's own forward pass (model/forward.c) on the tape's backend over B
 * sequences from position 0, with fresh caches that nothing else sees.  The final norm and the lm head
 * then run a chunk of rows at a time (lmx_model_head: logits of 64-512 MiB at once, whatever the
 * vocabulary); each chunk's loss and its gradient with respect to the logits are computed by the
 * backend's xent op (in place of the logits) and taken back through the head at once, and finally the
 * tape takes the gradient of the last layer's output back to every pair's A and B. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static lmx_status fail(lmx_trainer *tr, lmx_status st, const char *msg) {
    return lmx_err_set(&tr->err, st, "%s", msg);
}

void lmx_trainer_free(lmx_trainer *tr) {
    if (!tr) return;
    lmx_backend *be = tr->m->be;
    for (int i = 0; i < 2 * tr->n; i++) {
        if (tr->grad && tr->grad[i].data) be->ops->release(be, &tr->grad[i]);
        for (int k = 0; tr->mom && k < 2; k++)
            if (tr->mom[2 * i + k].data) be->ops->release(be, &tr->mom[2 * i + k]);
    }
    if (tr->park) be->ops->host_free(be, tr->park);
    free(tr->grad);
    free(tr->mom);
    free(tr->pairs);
    lmx_tape_free(tr->tape);
    free(tr);
}

lmx_status lmx_trainer_create(lmx_model *m, lmx_adapter *ad, lmx_trainer **out, lmx_err *err) {
    *out = NULL;
    lmx_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return lmx_err_set(err, LMX_ERR_NOMEM, "trainer: out of memory");
    tr->m = m;
    tr->ad = ad;
    tr->checkpoint = -1;
    tr->offload = 1;
    tr->replay = 1;
    tr->replay_qkv = 1;
    tr->keep_gu = -1;
    tr->dropout = ad->spec.dropout;
    tr->seed = ad->spec.seed;
    lmx_backend *be = m->be;
    lmx_status st = lmx_tape_create(be, be->ops->backward, &tr->tape, err);
    if (st) {
        free(tr);
        return st;
    }
    const int total = m->cfg.n_layers * LMX_PROJ_N;
    tr->pairs = calloc((size_t)total, sizeof *tr->pairs);
    tr->grad = calloc((size_t)2 * total, sizeof *tr->grad);
    tr->mom = calloc((size_t)4 * total, sizeof *tr->mom);
    if (!tr->pairs || !tr->grad || !tr->mom) st = lmx_err_set(err, LMX_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < total && !st; i++) {
        lmx_lora_pair *p = &ad->pairs[i];
        if (!p->a.data) continue;
        const int k = tr->n++;
        tr->pairs[k] = p;
        for (int j = 0; j < 6 && !st; j++) { /* dA, dB, then the moments of each */
            const lmx_tensor *src = j % 2 ? &p->b : &p->a;
            lmx_tensor *g = j < 2 ? &tr->grad[2 * k + j] : &tr->mom[2 * (2 * k + j % 2) + (j - 2) / 2];
            *g = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {src->shape[0], src->shape[1]}};
            if ((st = be->ops->alloc(be, g))) st = lmx_err_set(err, st, "%s", be->err.msg);
        }
        if (!st) st = lmx_tape_watch(tr->tape, p, &tr->grad[2 * k], &tr->grad[2 * k + 1]);
        if (tr->n == 1) tr->lowest = i / LMX_PROJ_N; /* pairs come in layer order */
    }
    if (!st && tr->n == 0) st = lmx_err_set(err, LMX_ERR_INVALID_ARG, "trainer: the adapter adapts nothing");
    if (st) {
        lmx_trainer_free(tr);
        return st;
    }
    *out = tr;
    return LMX_OK;
}

/* With tr->profile: the backend's peak since the last mark counted as phase k's (prof_peak), and a new
 * one started (bench-train reports the largest of them as the run's) */
static void peak_mark(lmx_trainer *tr, int k) {
    if (!tr->profile) return;
    lmx_backend *be = lmx_tape_inner(tr->tape); /* the model's may be the tape's, which holds nothing itself */
    if (be->mem_peak > tr->prof_peak[k]) tr->prof_peak[k] = be->mem_peak;
    be->mem_peak = be->mem_now;
}

/* With tr->profile: wait for the backend (a read waits for every op before it), then add the seconds
 * since *t0 to tr->prof[k] and restart *t0; the peak since the last mark is phase k's where one ended. */
static void prof_mark(lmx_trainer *tr, int k, double *t0) {
    if (!tr->profile) return;
    lmx_backend *be = tr->m->be, *in = lmx_tape_inner(tr->tape);
    if (*t0 > 0) peak_mark(tr, k);
    else in->mem_peak = in->mem_now;
    float x;
    be->ops->read(be, &tr->grad[0], 0, &x, sizeof x);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = ts.tv_sec + ts.tv_nsec * 1e-9;
    if (*t0 > 0) tr->prof[k] += t - *t0;
    *t0 = t;
}

/* The default (tr->checkpoint < 0): where the backend knows its free memory, checkpoint when a recorded
 * step would not fit in 95% of it: per layer and token the tape keeps (in the backend's keep_dtype, f32
 * or bf16) the two norms' inputs, q, k, v, the attention output, and the GLU's gate and up (and the
 * inputs of q / k norms and post-norms where the model has them; and the norms' and the GLU's outputs
 * where the backend cannot compute them again in backward); beside them the largest layer's gradients
 * in flight, the loss's logits (1 GiB) and 2 GiB to spare (measured on the H100: the 8B at 6 x 2048
 * tokens holds 39.6 GiB beside its weights and LoRA state, this says 41.6).
 * Elsewhere, from LMX_CHECKPOINT_FROM tokens a sequence.  Decided at the first step of a shape, while the
 * memory the steps hold on to (the pool's blocks, scratch buffers) is still free. */
int lmx_trainer_checkpoints(lmx_trainer *tr, int B, int T) {
    if (tr->checkpoint >= 0) return tr->checkpoint > 0;
    if (tr->auto_B == B && tr->auto_T == T) return tr->auto_ckpt;
    const lmx_model *m = tr->m;
    const lmx_backend *be = m->be;
    if (!be->ops->free_bytes) return T >= LMX_CHECKPOINT_FROM;
    const lmx_config *c = &m->cfg;
    const double M = (double)B * T, C = c->hidden;
    const int redo = lmx_backward_redoes(be->ops->backward); /* tape.c's redo keeps */
    double keep = 0, widest = 0;
    for (int l = tr->lowest; l < c->n_layers; l++) {
        const lmx_layer *L = &m->layers[l];
        const double qkv = (double)(c->n_heads + 2 * L->n_kv_heads) * L->head_dim;
        keep += (redo ? 2 : 4) * C + qkv + (double)c->n_heads * L->head_dim + (redo ? 2.0 : 3.0) * L->ffn;
        if (m->traits.qk_norm) keep += (double)(c->n_heads + L->n_kv_heads) * L->head_dim; /* the norms' inputs */
        if (L->post_attn_norm.data) keep += C; /* gemma's post-norms' inputs */
        if (L->post_ffn_norm.data) keep += C;
        if (L->ffn > widest) widest = L->ffn;
    }
    const double keep_bytes = (double)lmx_dtype_size(be->ops->backward->keep_dtype(be));
    const double need = keep * M * keep_bytes + 8.0 * M * (4 * C + 2 * widest) + (double)(3u << 30);
    int64_t room = be->ops->free_bytes(be);
    if (be->mem_limit > 0 && be->mem_limit - be->mem_now - be->mem_mapped < room)
        room = be->mem_limit - be->mem_now - be->mem_mapped;
    tr->auto_B = B, tr->auto_T = T, tr->auto_ckpt = need > 0.95 * (double)room;
    return tr->auto_ckpt;
}

/* Fresh caches for B sequences (a layer's window as a context of unbounded length has it). */
static lmx_kv_layer *kv_new(const lmx_model *m, int B) {
    lmx_kv_layer *kv = calloc((size_t)B * m->cfg.n_layers, sizeof *kv);
    for (int i = 0; kv && i < B * m->cfg.n_layers; i++) {
        const int l = i % m->cfg.n_layers;
        kv[i].window = m->layers[l].sliding ? m->cfg.sliding_window : 0;
    }
    return kv;
}
static void kv_free(lmx_backend *be, lmx_kv_layer *kv, int n) {
    for (int i = 0; kv && i < n; i++) {
        if (kv[i].k.data) be->ops->release(be, &kv[i].k);
        if (kv[i].v.data) be->ops->release(be, &kv[i].v);
    }
    free(kv);
}

/* Where a checkpointed step holds its layers' inputs [M, C] (and with replay, each layer's attention output
 * [M, H*D], hidden state after the attention block [M, C], and attention inputs q [M, H*D], k and v
 * [M, Hk*D]): page-locked host memory, a block of stride bytes a layer (host non-NULL: the backend's
 * offload / reload ops; kind k at byte offset off[k]), or the backward ops' keeps in saved[CK_KINDS l + k]
 * (bf16 on cuda, as every other value backward reads there).  The last layer keeps its own on the device
 * even where the others go to the host: backward starts with it, so its copies would come straight back
 * while it waited; it fetches the layer below's instead.  It also keeps its MLP's gate and up products [M, F],
 * and its run again takes them instead of their two GEMMs; so do the layers gu_layers_picked picks, theirs in a
 * region of host of their own (gu_slot; their copies there spread over the offloads after them). */
enum { CK_INPUT, CK_ATT, CK_RESID, CK_Q, CK_K, CK_V, CK_GATE, CK_UP, CK_KINDS };
typedef struct ckpt_store {
    lmx_trainer *tr;
    lmx_backend *be;             /* the inner backend (the model's is the tape's while a layer runs again) */
    lmx_tensor *saved;           /* [CK_KINDS L] */
    char *host;
    size_t stride, off[CK_KINDS];
    int on_host;                 /* where host is not NULL: the layers below this one are saved there */
    int *gu_slot;                /* [L] layer l keeps its gate / up products (gu_layers_picked; -1: not), in block
                                  * gu_slot[l] of host's region for them where it goes to the host */
    size_t gu_off, gu_block;     /* that region's byte offset in host; the bytes of one product [M, F] */
    int spread;                  /* the offloads over which a gate / up product's copy to the host goes (offload's) */
    int qkv;                     /* replay takes back q, k and v too (qkv_replayable) */
    int M, l;                    /* rows; the layer a replay serves */
    lmx_tensor *lse;             /* [L] each layer's attention log-sum-exp, for replay (data NULL: none) */
    unsigned char *has;          /* [L] bit k: kind k of layer l saved and not taken back yet */
} ckpt_store;
_Static_assert(CK_KINDS <= 8, "ckpt_store.has holds a layer's kinds in a byte");

/* tr->park of at least bytes (grown) */
static lmx_status park_reserve(lmx_trainer *tr, size_t bytes) {
    lmx_backend *be = tr->m->be;
    if (bytes <= tr->park_bytes) return LMX_OK;
    if (tr->park) be->ops->host_free(be, tr->park);
    tr->park_bytes = 0;
    if (!(tr->park = be->ops->host_alloc(be, bytes)))
        return fail(tr, LMX_ERR_NOMEM, "trainer: out of page-locked host memory for the checkpoints");
    tr->park_bytes = bytes;
    return LMX_OK;
}

static char *ck_host(const ckpt_store *cs, int l, int k) {
    if (k >= CK_GATE) /* gate, up: layer l's pair of blocks in their region */
        return cs->host + cs->gu_off + ((size_t)cs->gu_slot[l] * 2 + (size_t)(k - CK_GATE)) * cs->gu_block;
    return cs->host + (size_t)l * cs->stride + cs->off[k];
}

/* The layer below l whose kind k a load of layer l's kind k fetches ahead from the host: l - 1, or for gate and
 * up the next layer down that saved them (-1: none) */
static int ck_below(const ckpt_store *cs, int l, int k) {
    int j = l - 1;
    while (k >= CK_GATE && j >= cs->tr->lowest && !(cs->has[j] >> k & 1)) j--;
    return cs->host && j >= cs->tr->lowest && (cs->has[j] >> k & 1) && j < cs->on_host ? j : -1;
}

/* Kind k of layer l (x [M, cols] f32), saved */
static lmx_status ck_save(ckpt_store *cs, int l, int k, const lmx_tensor *x) {
    lmx_model *m = cs->tr->m;
    lmx_backend *be = cs->be;
    const lmx_backward_ops *bw = be->ops->backward;
    lmx_status st = cs->host && l < cs->on_host ? bw->offload(be, ck_host(cs, l, k), x, k >= CK_GATE ? cs->spread : 0)
                                                : bw->keep(be, &cs->saved[CK_KINDS * l + k], x);
    if (!st) cs->has[l] |= 1u << k;
    return st ? lmx_err_set(&m->err, st, "%s", be->err.msg) : LMX_OK;
}

/* Kind k of layer l (n values) back into dst (f32, or the keep dtype: then the keep itself in dst's place
 * where it is on the device and dst owns its memory, else copied), its copy released; layer l - 1's fetched
 * ahead where it was saved to the host. */
static lmx_status ck_load(ckpt_store *cs, int l, int k, lmx_tensor *dst, int64_t n) {
    lmx_model *m = cs->tr->m;
    lmx_backend *be = cs->be;
    const lmx_backward_ops *bw = be->ops->backward;
    lmx_tensor *sv = &cs->saved[CK_KINDS * l + k];
    lmx_status st;
    if (!(cs->has[l] >> k & 1)) return lmx_err_set(&m->err, LMX_ERR_BACKEND, "trainer: layer %d's checkpoint is missing", l);
    cs->has[l] &= ~(1u << k);
    const int below = ck_below(cs, l, k);
    const char *next = below >= 0 ? ck_host(cs, below, k) : NULL;
    if (cs->host && l < cs->on_host) {
        st = bw->reload(be, dst, ck_host(cs, l, k), n, next);
    } else if (!(st = next ? bw->reload(be, NULL, NULL, n, next) : LMX_OK)) { /* a keep on the device */
        if (dst->dtype == sv->dtype && dst->dtype != LMX_DTYPE_F32 && dst->owned) {
            be->ops->release(be, dst);
            *dst = *sv, *sv = (lmx_tensor){0};
            return LMX_OK;
        }
        st = bw->restore(be, dst, sv);
        be->ops->release(be, sv);
    }
    return st ? lmx_err_set(&m->err, st, "%s", be->err.msg) : LMX_OK;
}

/* Layer l's input: ws.x's first M rows, saved. */
static lmx_status save_input(ckpt_store *cs, int l) {
    const lmx_model *m = cs->tr->m;
    const lmx_tensor x = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {cs->M, m->cfg.hidden}, .data = m->ws.x.data};
    return ck_save(cs, l, CK_INPUT, &x);
}

/* Whether layer l's q, k and v can be taken back in place of the ops that make them: a frozen matmul, its LoRA
 * and RoPE each, which the tape leaves unrun (lmx_tape_replay qkv); not after q / k norms or value norms
 * (their backward reads their inputs), nor of a layer that shares another's keys */
static int qkv_replayable(const lmx_model *m, int l) {
    const lmx_layer *L = &m->layers[l];
    return !m->traits.qk_norm && !m->traits.gemma4 && L->kv_src == l && L->kv_slot < 0 && L->wv.data;
}

/* Whether layer l keeps its MLP's gate and up products for its run again: the last layer and those
 * gu_layers_picked, where its hidden state after attention is taken back too (through host memory where its
 * other kinds go there) */
static int gu_kept(const ckpt_store *cs, int l) {
    if (!cs->qkv || l < cs->tr->lowest || !(cs->has[l] >> CK_RESID & 1)) return 0;
    return l == cs->tr->m->cfg.n_layers - 1 || cs->gu_slot[l] >= 0;
}

/* How many layers below the last keep their gate and up products [M, F] for their runs again (tr->keep_gu, or
 * where it is -1 and the inputs go to the host KEEP_GU_DEFAULT from a hidden size of KEEP_GU_HIDDEN, else none),
 * and which (slot[l]: the block of layer l, -1 none): spread evenly over the trained layers below the last but
 * an eighth of them, so that their copies to the host keep pace with the forward (at the 8B's shape the copy
 * engine has some 2 ms to spare a layer, a layer's products take 8.5 ms) and are done before the last layer
 * (whose own stay on the device) and backward.  A product's GEMM takes 2 C flops a value, its copy 2 bytes:
 * at the 8B's C of 4,096 the two GEMMs a layer saves (2.8 ms) pay for the copies' share of the forward; at the
 * Qwen3-0.6B's 1,024 (0.3 ms) they do not (its step 0.238 -> 0.263 s with six: bench/RESULTS.md). */
#define KEEP_GU_DEFAULT 6
#define KEEP_GU_HIDDEN 4096
#define GU_SPREAD_LAYERS 4 /* a product's copy to the host goes a share with each offload of this many layers */
static int gu_layers_picked(const lmx_trainer *tr, int *slot, int host) {
    const int below = tr->m->cfg.n_layers - 1 - tr->lowest, span = below - below / 8;
    int K = tr->keep_gu >= 0 ? tr->keep_gu : host && tr->m->cfg.hidden >= KEEP_GU_HIDDEN ? KEEP_GU_DEFAULT : 0;
    if (K > span) K = span > 0 ? span : 0;
    for (int i = 0; i < K; i++) slot[tr->lowest + (int)((2LL * i + 1) * span / (2LL * K))] = i;
    return K;
}

/* lmx_layer_save's: a layer's attention output (its log-sum-exp written), its hidden state after the
 * attention block, its attention's q, k, v, or its MLP's gate and up products, saved for its run again
 * (layers from the lowest trained one up) */
static lmx_status layer_saved(void *user, int l, int what, const lmx_tensor *x) {
    ckpt_store *cs = user;
    const int k = what == LMX_SAVE_ATT ? CK_ATT : what == LMX_SAVE_RESID ? CK_RESID : CK_Q + (what - LMX_SAVE_Q);
    if (l < cs->tr->lowest || (k >= CK_Q && k <= CK_V && !(cs->qkv && qkv_replayable(cs->tr->m, l))) ||
        (k >= CK_GATE && !gu_kept(cs, l)))
        return LMX_OK;
    lmx_tensor v = *x;
    v.ndim = 2, v.shape[0] = cs->M, v.shape[1] = k == CK_RESID ? cs->tr->m->cfg.hidden : x->shape[x->ndim - 1];
    return ck_save(cs, l, k, &v);
}

/* lmx_tape_replay's: kind k of layer cs->l (its attention output, its hidden state after the block, or its
 * attention's q, k or v) into dst, counted in replayed[count] (-1: not counted; the tape reports the error as
 * the backend's) */
static lmx_status replay_load(ckpt_store *cs, int k, lmx_tensor *dst, int64_t n, int count) {
    lmx_status st = ck_load(cs, cs->l, k, dst, n);
    if (!st && count >= 0) cs->tr->replayed[count]++;
    return st ? lmx_err_set(&cs->be->err, st, "%s", cs->tr->m->err.msg) : LMX_OK;
}
static lmx_status replay_att(void *user, lmx_tensor *dst) {
    ckpt_store *cs = user;
    const lmx_model *m = cs->tr->m;
    return replay_load(cs, CK_ATT, dst, (int64_t)cs->M * m->cfg.n_heads * m->layers[cs->l].head_dim, 0);
}
static lmx_status replay_resid(void *user, lmx_tensor *dst) {
    ckpt_store *cs = user;
    return replay_load(cs, CK_RESID, dst, (int64_t)cs->M * cs->tr->m->cfg.hidden, 1);
}
static lmx_status replay_qkv(void *user, int which, lmx_tensor *dst) { /* a layer's three counted once */
    ckpt_store *cs = user;
    return replay_load(cs, CK_Q + which, dst, lmx_tensor_nelem(dst), which == 0 ? 2 : -1);
}
static lmx_status replay_gu(void *user, int which, lmx_tensor *dst) { /* gate and up counted once */
    ckpt_store *cs = user;
    return replay_load(cs, CK_GATE + which, dst, lmx_tensor_nelem(dst), which == 0 ? 3 : -1);
}

/* Whether layer l's run again needs its input only as its attention norm's keep: its q, k, v (every reader
 * of that norm's output) and the hidden state after its attention block (written over the input by the
 * residual add) are taken back; not the lowest trained layer (its input needs no gradient: its norm is not
 * recorded, so it runs) */
static int input_given(const ckpt_store *cs, int l) {
    const unsigned want = 1u << CK_INPUT | 1u << CK_RESID | 7u << CK_Q;
    return l > cs->tr->lowest && (cs->has[l] & want) == want;
}

/* What layer l's run again takes back instead of computing: what its first run saved, and with input->data
 * its input as its norm's keep (the tape's now) */
static void replay_set(ckpt_store *cs, int l, lmx_tensor *input) {
    lmx_tape_replay rp = {.user = cs, .input = *input, .input_buf = cs->tr->m->ws.x.data};
    *input = (lmx_tensor){0};
    cs->l = l;
    if ((cs->has[l] >> CK_ATT & 1) && cs->lse && cs->lse[l].data) {
        rp.att = replay_att, rp.lse = cs->lse[l];
        cs->lse[l] = (lmx_tensor){0}; /* the tape's now */
    }
    if (cs->has[l] >> CK_RESID & 1) rp.resid = replay_resid, rp.resid_buf = cs->tr->m->ws.x.data;
    const lmx_workspace *ws = &cs->tr->m->ws;
    if ((cs->has[l] >> CK_Q & 7) == 7)
        rp.qkv = replay_qkv, rp.qkv_buf[0] = ws->q.data, rp.qkv_buf[1] = ws->k.data, rp.qkv_buf[2] = ws->v.data;
    if ((cs->has[l] >> CK_GATE & 3) == 3)
        rp.gu = replay_gu, rp.gu_w[0] = &cs->tr->m->layers[l].w_gate, rp.gu_w[1] = &cs->tr->m->layers[l].w_up;
    lmx_tape_set_replay(cs->tr->tape, &rp);
}

/* What layer l's run again left untaken (the tape found other ops than it replays), dropped */
static void replay_drop(ckpt_store *cs, int l) {
    lmx_backend *be = cs->be;
    for (int k = CK_ATT; k < CK_KINDS; k++)
        if (cs->saved[CK_KINDS * l + k].data) be->ops->release(be, &cs->saved[CK_KINDS * l + k]);
    cs->has[l] &= 1u << CK_INPUT;
}

/* lmx_layer_save's mid in a layer run again (m's backend the tape): the attention's buffers released through
 * the tape, which copies what its records still read of them, then the MLP's made (on the inner backend,
 * unzeroed: the matmuls write them), so that the layer never holds both */
static lmx_status layer_mid(void *user, int l) {
    ckpt_store *cs = user;
    lmx_model *m = cs->tr->m;
    lmx_backend *tb = m->be;
    (void)l;
    lmx_status st = lmx_model_layer_buffers_of(m, LMX_WS_ATTN, 1);
    m->be = cs->be;
    if (!st) st = lmx_model_layer_buffers_of(m, LMX_WS_MLP, 0);
    m->be = tb;
    if (!st && (lmx_tape_fresh(cs->tr->tape, &m->ws.gate) || lmx_tape_fresh(cs->tr->tape, &m->ws.up)))
        st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "trainer: out of memory");
    return st;
}

/* Gradient checkpointing's backward: from the gradient of the last layer's output (var leaf's), each
 * layer from the last down to the lowest adapted one runs again from its saved input (back in ws.x),
 * recorded, and its output's gradient goes back through it to the pairs and to its input (a leaf; the
 * lowest layer's input needs none).  The output's value is not needed: the run leaves the last
 * projection and its residual add out where the tape can (lmx_tape_end_forward); and it takes back its
 * attention's output and the hidden state after that block where the first run saved them (replay). */
static lmx_status layers_back(lmx_trainer *tr, lmx_backend *inner, lmx_kv_layer **kvs, const lmx_adapter **ads,
                              const lmx_batch *bt, ckpt_store *cs, int leaf) {
    lmx_model *m = tr->m;
    lmx_backend *tb = lmx_tape_backend(tr->tape);
    const int64_t n = (int64_t)bt->B * bt->T * m->cfg.hidden;
    lmx_tensor g;
    lmx_tape_take_grad(tr->tape, leaf, &g);
    lmx_status st = LMX_OK;
    /* where the GLU writes the keeps of its gate and up (glu_keep), backward reads nothing else of the
     * widest buffers; of the others the tape copies what it reads as they go */
    const int release_ws = inner->ops->backward->glu_keep != NULL;
    lmx_tape_set_keep_glu(tr->tape, 1); /* one layer on the tape at a time */
    lmx_layer_save mid = {.mid = layer_mid, .user = cs};
    m->be = inner;
    for (int l = m->cfg.n_layers - 1; l >= tr->lowest && g.data && !st; l--) {
        lmx_tape_reset(tr->tape);
        /* the layer runs on its input (or takes it as its norm's keep: input_given); where its buffers go
         * between layers, the MLP's come after attention's go */
        lmx_tensor x16 = {.dtype = inner->ops->backward->keep_dtype(inner), .ndim = 2,
                          .shape = {n / m->cfg.hidden, m->cfg.hidden}};
        if (input_given(cs, l) && (st = lmx_backend_alloc_raw(inner, &x16))) {
            lmx_err_set(&m->err, st, "%s", inner->err.msg);
            break;
        }
        if ((st = ck_load(cs, l, CK_INPUT, x16.data ? &x16 : &m->ws.x, n)) ||
            (st = lmx_model_layer_buffers_of(m, release_ws ? LMX_WS_SHARED | LMX_WS_ATTN : LMX_WS_ALL, 0))) {
            if (x16.data) inner->ops->release(inner, &x16);
            break;
        }
        const int in = l > tr->lowest ? lmx_tape_leaf(tr->tape, &m->ws.x, n / m->cfg.hidden, m->cfg.hidden) : -1;
        if (l > tr->lowest && in < 0) st = fail(tr, LMX_ERR_NOMEM, "trainer: out of memory");
        replay_set(cs, l, &x16);
        m->be = tb;
        m->layer_save = release_ws ? &mid : NULL;
        if (!st) st = lmx_model_layers(m, kvs, ads, bt, l, l + 1);
        m->layer_save = NULL;
        if (!st && (st = lmx_tape_end_forward(tr->tape, &m->ws.x))) lmx_err_set(&m->err, st, "%s", tb->err.msg);
        replay_drop(cs, l);
        peak_mark(tr, 4);
        if (!st && release_ws) lmx_model_layer_buffers(m, 1); /* through the tape, which copies what it still reads of them */
        m->be = inner;
        if (!st && (st = lmx_tape_backward_take(tr->tape, &m->ws.x, &g, n, 0))) lmx_err_set(&m->err, st, "%s", tb->err.msg);
        peak_mark(tr, 5);
        inner->ops->release(inner, &g); /* where the tape did not take it */
        if (!st) lmx_tape_take_grad(tr->tape, in, &g);
    }
    if (g.data) inner->ops->release(inner, &g);
    lmx_tape_set_keep_glu(tr->tape, 0);
    lmx_status fs = lmx_model_layer_buffers(m, 0);
    return st ? st : fs;
}

/* Rows of logits a loss chunk holds: about 64 MiB of f32 logits on the cpu, 512 MiB on a GPU (whose
 * head GEMMs want many rows), at least one row; or tr->loss_rows. */
static int chunk_rows(const lmx_trainer *tr, int M) {
    const int64_t bytes = (int64_t)(strcmp(tr->m->be->ops->name, "cpu") ? 512 : 64) << 20;
    int64_t r = tr->loss_rows > 0 ? tr->loss_rows : bytes / ((int64_t)tr->m->cfg.vocab * 4);
    if (r < 1) r = 1;
    return r < M ? (int)r : M;
}

/* The loss of a chunk of R logit rows (row0 on) in m->ws.logits, with the gradient written in their
 * place when grad_weight != 0 (or into g16, where its data is not NULL: bf16; released where the backend
 * cannot): the cross-entropy against targets (backend's xent op), or fn's loss (the logits read to the
 * host, fn's gradient written back times grad_weight). */
static lmx_status chunk_loss(lmx_trainer *tr, lmx_backend *inner, const int32_t *targets, const float *mask, double wsum,
                             lmx_loss_fn fn, void *user, int row0, int R, double grad_weight, float *host, double *part,
                             lmx_tensor *g16) {
    lmx_model *m = tr->m;
    const int V = m->cfg.vocab;
    lmx_status st = lmx_tape_guard(tr->tape, &m->ws.logits); /* overwritten here: a soft-cap keeps its output */
    if (st) return lmx_err_set(&m->err, st, "%s", lmx_tape_backend(tr->tape)->err.msg);
    if (!fn) {
        const lmx_backward_ops *bw = inner->ops->backward;
        const double c = grad_weight / wsum;
        st = bw->xent(inner, &m->ws.logits, targets + row0, mask ? mask + row0 : NULL, R, V, c, part,
                      g16->data ? g16 : NULL);
        if (st == LMX_ERR_UNSUPPORTED && g16->data) { /* in place, in f32 */
            inner->ops->release(inner, g16);
            st = bw->xent(inner, &m->ws.logits, targets + row0, mask ? mask + row0 : NULL, R, V, c, part, NULL);
        }
        return st ? lmx_err_set(&m->err, st, "%s", inner->err.msg) : LMX_OK;
    }
    const size_t n = (size_t)R * V;
    if ((st = inner->ops->read(inner, &m->ws.logits, 0, host, n * sizeof(float))))
        return lmx_err_set(&m->err, st, "%s", inner->err.msg);
    float *grad = host + n;
    memset(grad, 0, n * sizeof *grad);
    *part = fn(user, row0, R, V, host, grad);
    if (grad_weight == 0) return LMX_OK;
    for (size_t i = 0; i < n; i++) grad[i] = (float)(grad[i] * grad_weight);
    if ((st = inner->ops->write(inner, &m->ws.logits, 0, grad, n * sizeof(float))))
        return lmx_err_set(&m->err, st, "%s", inner->err.msg);
    return LMX_OK;
}

/* Whether a step's MLP buffers may be bf16 (lmx_model.mlp16): the backend keeps bf16 and writes the GLU's keeps
 * in its pass (whose f32 output LoRA dropout would read), and no layer adds a gate or up bias.  The GEMMs then
 * round gate and up to bf16 as HF's bf16 Linear does, and the GLU reads half the bytes (the 8B's checkpointed
 * step 1.5-1.8% faster, 0.25 GiB less at its peak: bench/RESULTS.md). */
static int mlp16_fits(const lmx_trainer *tr) {
    const lmx_model *m = tr->m;
    const lmx_backward_ops *bw = m->be->ops->backward;
    if (!bw || !bw->glu_keep || bw->keep_dtype(m->be) != LMX_DTYPE_BF16 || tr->dropout > 0 || m->cfg.layer_moe) return 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->layers[l].b_gate.data || m->layers[l].b_up.data) return 0;
    return 1;
}

lmx_status lmx_trainer_loss(lmx_trainer *tr, const int32_t *inputs, const int32_t *targets, const float *mask, int B,
                            int T, double grad_weight, int accumulate, double *loss) {
    return lmx_trainer_loss_fn(tr, inputs, targets, mask, NULL, NULL, B, T, grad_weight, accumulate, loss);
}

lmx_status lmx_trainer_loss_fn(lmx_trainer *tr, const int32_t *inputs, const int32_t *targets, const float *mask,
                               lmx_loss_fn fn, void *user, int B, int T, double grad_weight, int accumulate,
                               double *loss) {
    lmx_model *m = tr->m;
    lmx_backend *inner = m->be;
    const int L = m->cfg.n_layers, V = m->cfg.vocab, M = B * T;
    if (B <= 0 || T <= 0) return fail(tr, LMX_ERR_INVALID_ARG, "training batch: no tokens");
    double wsum = fn ? 1.0 : 0.0; /* fn's loss is its own sum */
    for (int i = 0; !fn && i < M; i++) {
        if (targets[i] < 0 || targets[i] >= V)
            return lmx_err_set(&tr->err, LMX_ERR_INVALID_ARG, "training batch: target %d outside the vocabulary [0, %d)",
                               targets[i], V);
        wsum += mask ? mask[i] : 1.0;
    }
    if (wsum <= 0) return fail(tr, LMX_ERR_INVALID_ARG, "training batch: the mask selects no position");
    const int CR = chunk_rows(tr, M);
    int *n_past = calloc((size_t)B, sizeof *n_past), *n_new = malloc((size_t)B * sizeof *n_new);
    int *rows = malloc((size_t)CR * sizeof *rows);
    float *host = fn ? malloc((size_t)2 * CR * V * sizeof *host) : NULL; /* fn's logits and gradient */
    const lmx_adapter **ads = malloc((size_t)B * sizeof *ads);
    lmx_kv_layer *kv = kv_new(m, B);
    lmx_kv_layer **kvs = malloc((size_t)B * sizeof *kvs);
    lmx_status st = LMX_OK;
    if (!n_past || !n_new || !rows || !ads || !kv || !kvs || (fn && !host)) st = fail(tr, LMX_ERR_NOMEM, "trainer: out of memory");
    for (int b = 0; !st && b < B; b++) n_new[b] = T, ads[b] = tr->ad, kvs[b] = kv + (size_t)b * L;
    if (!st && grad_weight != 0 && !accumulate && (st = inner->ops->backward->zero_many(inner, 2 * tr->n, tr->grad)))
        lmx_err_set(&tr->err, st, "trainer: clearing the gradients: %s", inner->err.msg); /* set, not accumulate */
    lmx_tape_reset(tr->tape);
    lmx_backend *tb = lmx_tape_backend(tr->tape);
    double sum = 0;
    if (grad_weight != 0 && tr->dropout > 0) { /* masks of (seed, step, micro-batch): a resumed run draws the same */
        tr->micro = accumulate ? tr->micro + 1 : 0;
        lmx_tape_set_dropout(tr->tape, tr->dropout, tr->seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)tr->step << 20 ^ (uint64_t)tr->micro);
    } else {
        lmx_tape_set_dropout(tr->tape, 0, 0);
    }
    ckpt_store cs = {0}; /* checkpointing: each layer's input (and what replay takes back) */
    if (!st) { /* the layers (recorded, or run and checkpointed); then the head a chunk of rows at a time, each
                * taken back at once; then the layers backward (or each again, recorded, and backward) */
        const lmx_batch bt = {.B = B, .T = T, .n_past = n_past, .n_new = n_new, .no_cache = 1};
        const int ckpt = grad_weight != 0 && lmx_trainer_checkpoints(tr, B, T);
        /* a checkpointed step's gate and up in bf16 (its passes' only; inference's and the other steps' stay f32:
         * the reference with heads of 64 took its loss after two AdamW steps past tolerance with them there) */
        m->mlp16 = ckpt && mlp16_fits(tr);
        lmx_tape_set_glu_out16(tr->tape, m->mlp16); /* and the GLU output's gradient likewise */
        int leaf = -1;
        double t0 = 0;
        prof_mark(tr, 0, &t0);
        if (!ckpt) {
            m->be = grad_weight != 0 ? tb : inner; /* a loss alone records nothing */
            st = lmx_model_forward(m, kvs, ads, &bt, inputs, NULL, 0, NULL);
        } else if (!(cs.saved = calloc((size_t)CK_KINDS * L, sizeof *cs.saved)) || !(cs.has = calloc((size_t)L, 1)) ||
                   !(cs.lse = calloc((size_t)L, sizeof *cs.lse)) || !(cs.gu_slot = malloc((size_t)L * sizeof *cs.gu_slot))) {
            st = fail(tr, LMX_ERR_NOMEM, "trainer: out of memory");
        } else {
            for (int l = 0; l < L; l++) cs.gu_slot[l] = -1;
            const lmx_backward_ops *bw = inner->ops->backward;
            const int replay = tr->replay && tr->dropout <= 0; /* with dropout the first run goes through the tape */
            const size_t es = lmx_dtype_size(bw->keep_dtype(inner));
            cs.tr = tr, cs.be = inner, cs.M = M, cs.qkv = replay && tr->replay_qkv;
            const int host = tr->offload && bw->offload && bw->reload && inner->ops->host_alloc;
            /* layers below the last that keep their gate / up products */
            int gu_picked = cs.qkv ? gu_layers_picked(tr, cs.gu_slot, host) : 0;
            if (host) {
                /* kind k's room a layer: C, or the widest H*D or Hk*D (where replay takes it back) */
                /* (gate and up: a region of their own, for the layers gu_layers_picked picks) */
                const int64_t cols[CK_KINDS] = {m->cfg.hidden, replay ? m->q_width : 0, replay ? m->cfg.hidden : 0,
                                                cs.qkv ? m->q_width : 0, cs.qkv ? m->kv_width : 0, cs.qkv ? m->kv_width : 0,
                                                0, 0};
                for (int k = 0; k < CK_KINDS; k++) cs.off[k] = cs.stride, cs.stride += (size_t)M * cols[k] * es;
                cs.gu_off = cs.stride * L, cs.gu_block = (size_t)M * m->max_ffn * es;
                for (int k = 0; k < CK_GATE; k++) cs.spread += cols[k] > 0 ? GU_SPREAD_LAYERS : 0;
                if (gu_picked && park_reserve(tr, cs.gu_off + (size_t)gu_picked * 2 * cs.gu_block)) {
                    /* no page-locked room for their products: those layers compute them again */
                    lmx_err_clear(&tr->err), lmx_err_clear(&inner->err);
                    for (int l = 0; l < L; l++) cs.gu_slot[l] = -1;
                    gu_picked = 0;
                }
                if (!(st = park_reserve(tr, cs.gu_off))) cs.host = tr->park, cs.on_host = L - 1;
            }
            for (int l = tr->lowest; replay && l < L; l++) { /* where there is no room: those layers compute it again */
                cs.lse[l] = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {(int64_t)B * m->cfg.n_heads * T}};
                if (lmx_backend_alloc_raw(inner, &cs.lse[l])) {
                    lmx_err_clear(&inner->err);
                    cs.lse[l].data = NULL;
                    break;
                }
            }
            lmx_layer_save sv = {.save = layer_saved, .lse = cs.lse, .user = &cs};
            if (!st) st = lmx_model_embed(m, kvs, &bt, inputs);
            for (int l = 0; l < L && !st; l++) { /* with dropout through the tape (its masks), forgotten a layer on */
                if (l >= tr->lowest && (st = save_input(&cs, l))) break;
                /* the copies' stages grown for gate / up go before the last layer keeps its own on the device */
                if (l == L - 1 && gu_picked && cs.host && inner->ops->trim_scratch) inner->ops->trim_scratch(inner);
                m->be = tr->dropout > 0 ? tb : inner;
                m->layer_save = replay ? &sv : NULL;
                st = lmx_model_layers(m, kvs, ads, &bt, l, l + 1);
                m->layer_save = NULL;
                if (!st && m->be == tb && (st = lmx_tape_end_forward(tr->tape, NULL)))
                    lmx_err_set(&m->err, st, "%s", tb->err.msg);
                m->be = inner;
                lmx_tape_reset(tr->tape);
            }
            m->be = tb;
            if (!st && (leaf = lmx_tape_leaf(tr->tape, &m->ws.x, M, m->cfg.hidden)) < 0)
                st = fail(tr, LMX_ERR_NOMEM, "trainer: out of memory");
        }
        prof_mark(tr, 0, &t0);
        /* the unrecorded forward's scratch (its widest: the down projections' inputs narrowed, which the
         * recorded layers take from the tape's keeps) goes before the head's: a checkpointed step gives it back */
        if (ckpt && (inner->ops->trim_scratch || inner->ops->trim))
            (inner->ops->trim_scratch ? inner->ops->trim_scratch : inner->ops->trim)(inner);
        const int mark = lmx_tape_mark(tr->tape);
        lmx_tensor g16 = {0}; /* the loss's gradient of a chunk in bf16, where the head's backward reads it so */
        for (int r0 = 0; r0 < M && !st; r0 += CR) {
            const int R = M - r0 < CR ? M - r0 : CR;
            for (int i = 0; i < R; i++) rows[i] = r0 + i;
            if ((st = lmx_model_head(m, rows, R, NULL))) break;
            if (r0 == 0 && !fn && grad_weight != 0 && lmx_tape_seed16(tr->tape, &m->ws.logits)) {
                g16 = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {CR, V}};
                if (lmx_backend_alloc_raw(inner, &g16))
                    lmx_err_clear(&inner->err), g16.data = NULL; /* then in place, in f32 */
            }
            double part = 0; /* the loss, and its gradient in place of the logits (or in g16) */
            if ((st = chunk_loss(tr, inner, targets, mask, wsum, fn, user, r0, R, grad_weight, host, &part, &g16))) break;
            sum += part;
            if (grad_weight != 0 && (st = lmx_tape_backward_from(tr->tape, &m->ws.logits, g16.data ? &g16 : &m->ws.logits,
                                                                 (int64_t)R * V, mark)))
                lmx_err_set(&m->err, st, "%s", tb->err.msg);
        }
        if (g16.data) inner->ops->release(inner, &g16);
        lmx_model_head_release(m); /* the layers' backward holds no logits */
        prof_mark(tr, 1, &t0);
        if (!st && grad_weight != 0 && ckpt) st = layers_back(tr, inner, kvs, ads, &bt, &cs, leaf);
        else if (!st && grad_weight != 0 && (st = lmx_tape_walk(tr->tape, 0)))
            lmx_err_set(&m->err, st, "%s", tb->err.msg);
        prof_mark(tr, 2, &t0);
        m->be = inner;
        if (st) lmx_err_set(&tr->err, st, "%s", m->err.msg);
    }
    lmx_tape_reset(tr->tape);
    for (int i = 0; cs.saved && i < CK_KINDS * L; i++)
        if (cs.saved[i].data) inner->ops->release(inner, &cs.saved[i]);
    for (int l = 0; cs.lse && l < L; l++)
        if (cs.lse[l].data) inner->ops->release(inner, &cs.lse[l]);
    free(cs.saved);
    free(cs.has);
    free(cs.lse);
    free(cs.gu_slot);
    if (!st) *loss = sum / wsum;
    m->mlp16 = 0;
    kv_free(inner, kv, B * L);
    free(kvs);
    free(ads);
    free(rows);
    free(host);
    free(n_new);
    free(n_past);
    return st;
}

lmx_status lmx_trainer_adamw(lmx_trainer *tr, const lmx_adamw *opt, double *gnorm) {
    lmx_backend *be = tr->m->be;
    const lmx_backward_ops *bw = be->ops->backward;
    lmx_status st = LMX_OK;
    double t0 = 0, ss = 0;
    prof_mark(tr, 3, &t0);
    if (tr->n > 0) st = bw->sumsq(be, tr->grad, 2 * tr->n, &ss);
    const double norm = sqrt(ss);
    if (gnorm) *gnorm = norm;
    if (!st) tr->step++;
    const lmx_adamw_step s = {.lr = opt->lr, .beta1 = opt->beta1, .beta2 = opt->beta2, .eps = opt->eps,
                              .weight_decay = opt->weight_decay, .bc1 = 1.0 - pow(opt->beta1, (double)tr->step),
                              .bc2 = 1.0 - pow(opt->beta2, (double)tr->step),
                              .clip = opt->clip_grad_norm > 0 && norm > opt->clip_grad_norm
                                          ? opt->clip_grad_norm / (norm + 1e-6) : 1.0};
    lmx_tensor **par = !st && tr->n > 0 ? malloc((size_t)2 * tr->n * sizeof *par) : NULL;
    if (!st && tr->n > 0 && !par) st = lmx_err_set(&be->err, LMX_ERR_NOMEM, "adamw: out of memory");
    for (int i = 0; par && i < 2 * tr->n; i++) par[i] = i & 1 ? &tr->pairs[i / 2]->b : &tr->pairs[i / 2]->a;
    if (par && bw->adamw_many) st = bw->adamw_many(be, 2 * tr->n, par, tr->grad, tr->mom, &s);
    for (int i = 0; par && !bw->adamw_many && i < 2 * tr->n && !st; i++)
        st = bw->adamw(be, par[i], &tr->grad[i], &tr->mom[2 * i], &tr->mom[2 * i + 1], lmx_tensor_nelem(par[i]), &s);
    free(par);
    if (st) lmx_err_set(&tr->err, st, "%s", be->err.msg);
    prof_mark(tr, 3, &t0);
    return st;
}

static lmx_status moment_io(lmx_trainer *tr, int i, int k, float *dst, const float *src) {
    if (i < 0 || i >= 2 * tr->n || k < 0 || k > 1) return lmx_err_set(&tr->err, LMX_ERR_INVALID_ARG, "no moment %d.%d", k, i);
    lmx_backend *be = tr->m->be;
    lmx_tensor *t = &tr->mom[2 * i + k];
    const size_t bytes = (size_t)lmx_tensor_nelem(t) * sizeof(float);
    lmx_status st = dst ? be->ops->read(be, t, 0, dst, bytes) : be->ops->write(be, t, 0, src, bytes);
    return st ? lmx_err_set(&tr->err, st, "%s", be->err.msg) : LMX_OK;
}
lmx_status lmx_trainer_moment_read(lmx_trainer *tr, int i, int k, float *dst) { return moment_io(tr, i, k, dst, NULL); }
lmx_status lmx_trainer_moment_write(lmx_trainer *tr, int i, int k, const float *src) {
    return moment_io(tr, i, k, NULL, src);
}
