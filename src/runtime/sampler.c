/* sampler.c - see sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void lmx_rng_seed(lmx_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lmx_rng_next(lmx_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double lmx_rng_uniform(lmx_rng *r) { return (double)(lmx_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- the chain ----------------------------------------------------------------------------- */

size_t lmx_sampler_bytes(int V) { return (size_t)V * (sizeof(lmx_cand) + sizeof(int32_t)); }

int lmx_sampler_init(lmx_sampler *s, int V) {
    memset(s, 0, sizeof *s);
    s->cand = malloc((size_t)V * sizeof *s->cand);
    s->counts = calloc((size_t)V, sizeof *s->counts);
    if (!s->cand || !s->counts) {
        lmx_sampler_free(s);
        return -1;
    }
    s->V = V;
    return 0;
}

void lmx_sampler_free(lmx_sampler *s) {
    free(s->cand);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

int32_t lmx_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void lmx_sampler_penalize(lmx_sampler *s, const lmx_sampler_params *p, float *logits,
                          const int32_t *history, int n_hist) {
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    int last = p->penalty_last_n < 0 || p->penalty_last_n > n_hist ? n_hist : p->penalty_last_n;
    const int32_t *h = history + (n_hist - last);
    for (int i = 0; i < last; i++)
        if (h[i] >= 0 && h[i] < s->V) s->counts[h[i]]++;
    for (int i = 0; i < last; i++) {
        int32_t id = h[i];
        if (id < 0 || id >= s->V || s->counts[id] == 0) continue; /* seen already this call */
        float l = logits[id];
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
        logits[id] = l;
        s->counts[id] = 0; /* once per distinct token; leaves counts zeroed */
    }
}

static int cand_cmp(const void *a, const void *b) {
    const lmx_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void cand_swap(lmx_cand *c, int i, int j) {
    const lmx_cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* The k first of c [n] in cand_cmp's order (k <= n) moved to c [0, k), in no particular order: a quickselect, so
 * that top-k over a flat distribution (every token gathered) costs O(n), not a sort of the vocabulary. */
static void select_first(lmx_cand *c, int n, int k) {
    const int t = k - 1; /* the place whose element ends in its sorted position */
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2; /* median of three as the pivot */
        if (cand_cmp(&c[mid], &c[lo]) < 0) cand_swap(c, mid, lo);
        if (cand_cmp(&c[hi], &c[lo]) < 0) cand_swap(c, hi, lo);
        if (cand_cmp(&c[hi], &c[mid]) < 0) cand_swap(c, hi, mid);
        const lmx_cand piv = c[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&c[i], &piv) < 0) i++;
            while (cand_cmp(&c[j], &piv) > 0) j--;
            if (i <= j) cand_swap(c, i++, j--);
        }
        if (t <= j) hi = j; /* c [lo, j] precede the pivot, c [i, hi] follow it, those between are it */
        else if (t >= i) lo = i;
        else break;
    }
}

/* Gather the tokens whose relative probability exp((l - lmax) / T) is at least thr into cand,
 * with that value in p; returns how many, and their summed relative probability in *mass. */
static int gather(lmx_sampler *s, float temperature, const float *logits, float lmax, float thr,
                  double *mass) {
    float inv_t = 1.0f / temperature;
    double sum = 0;
    int n = 0;
    for (int i = 0; i < s->V; i++) {
        float e = expf((logits[i] - lmax) * inv_t);
        if (e < thr) continue;
        s->cand[n++] = (lmx_cand){.id = i, .logit = logits[i] * inv_t, .p = e};
        sum += e;
    }
    *mass = sum;
    return n;
}

static int finish_chain(lmx_sampler *s, const lmx_sampler_params *p, int n, double total);

int lmx_sampler_filter(lmx_sampler *s, const lmx_sampler_params *p, const float *logits) {
    int V = s->V, k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    int use_p = p->top_p > 0.0f && p->top_p < 1.0f, use_min = p->min_p > 0.0f;
    float lmax = logits[lmx_argmax(logits, V)], inv_t = 1.0f / p->temperature;
    double total = 0; /* relative probability mass that top-p measures against */
    if (use_p && !k) /* only the gathering below needs it up front; with top-k it comes later */
        for (int i = 0; i < V; i++) total += expf((logits[i] - lmax) * inv_t);

    /* Only the likeliest tokens can survive: gather those above a threshold, lowering it until
     * the set provably holds every survivor (min-p gives the exact threshold), and with top-k all k
     * candidates, whose mass top-p measures against. */
    double mass = 0;
    int n;
    if (!k && !use_p && !use_min) {
        n = gather(s, p->temperature, logits, lmax, 0.0f, &mass); /* no filter: every token, in id order */
    } else {
        float thr = use_min && !k ? p->min_p : 1e-4f;
        for (;;) {
            n = gather(s, p->temperature, logits, lmax, thr, &mass);
            if ((use_min && !k) || thr == 0.0f || (k && n >= k) || (!k && use_p && mass >= p->top_p * total)) break;
            thr = thr > 1e-30f ? thr * 1e-6f : 0.0f;
        }
        if (k && n > 2 * k) { /* only the first k are kept: select them, then sort those */
            select_first(s->cand, n, k);
            n = k;
        }
        qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
    }
    if (k) { /* top-k; later filters see the k renormalised (fewer gathered: every token is here) */
        if (n > k) n = k;
        total = 0;
        for (int i = 0; i < n; i++) total += s->cand[i].p;
    }
    return finish_chain(s, p, n, total);
}

/* Steps 4-5 over the first n candidates (sorted), total their relative mass; then renormalise. */
static int finish_chain(lmx_sampler *s, const lmx_sampler_params *p, int n, double total) {
    int use_p = p->top_p > 0.0f && p->top_p < 1.0f, use_min = p->min_p > 0.0f;
    if (use_p) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += s->cand[i].p;
            if (cum >= p->top_p * total) {
                n = i + 1;
                break;
            }
        }
    }
    if (use_min) { /* relative probabilities are p / p_max already */
        int m = 1;
        while (m < n && s->cand[m].p >= p->min_p) m++;
        n = m;
    }
    double z = 0;
    for (int i = 0; i < n; i++) z += s->cand[i].p;
    for (int i = 0; i < n; i++) s->cand[i].p = (float)(s->cand[i].p / z);
    s->n_cand = n;
    return n;
}

/* Step 6 over the first n candidates. */
static int32_t draw(lmx_sampler *s, lmx_rng *rng, int n) {
    double u = lmx_rng_uniform(rng), cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* rounding left u above the last sum */
}

int32_t lmx_sampler_sample(lmx_sampler *s, const lmx_sampler_params *p, lmx_rng *rng, float *logits,
                           const int32_t *history, int n_hist) {
    lmx_sampler_penalize(s, p, logits, history, n_hist);
    if (!(p->temperature > 0.0f)) return lmx_argmax(logits, s->V);
    return draw(s, rng, lmx_sampler_filter(s, p, logits));
}

int lmx_sampler_topk_need(const lmx_sampler_params *p, int V, int kmax) {
    if (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) return 0;
    if (!(p->temperature > 0.0f)) return 1;
    return p->top_k > 0 && p->top_k < V && p->top_k <= kmax ? p->top_k : 0;
}

int32_t lmx_sampler_sample_topk(lmx_sampler *s, const lmx_sampler_params *p, lmx_rng *rng, const float *vals,
                                const int32_t *ids, int k) {
    if (!(p->temperature > 0.0f)) return ids[0];
    /* the candidates as lmx_sampler_filter gathers them (same arithmetic), then its order */
    float lmax = vals[0], inv_t = 1.0f / p->temperature;
    for (int i = 0; i < k; i++)
        s->cand[i] = (lmx_cand){.id = ids[i], .logit = vals[i] * inv_t, .p = expf((vals[i] - lmax) * inv_t)};
    qsort(s->cand, (size_t)k, sizeof *s->cand, cand_cmp);
    double total = 0;
    for (int i = 0; i < k; i++) total += s->cand[i].p;
    return draw(s, rng, finish_chain(s, p, k, total));
}
