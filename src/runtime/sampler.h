/* sampler.h - the sampler chain and its seeded random numbers (internal).
 *
 * The chain, in this order (lmx_sampler_params in lmx.h documents each knob):
 *   1. penalties over the last penalty_last_n tokens of the history: repetition (a positive logit
 *      is divided by repeat_penalty, a negative one multiplied), then presence (minus
 *      presence_penalty once per distinct token) and frequency (minus frequency_penalty per
 *      occurrence);
 *   2. temperature <= 0: greedy, the largest logit (the lowest id among equals); otherwise the
 *      logits are divided by the temperature;
 *   3. top-k: the k largest logits stay (0: off);
 *   4. top-p: the smallest most-likely prefix whose probability reaches top_p stays (1: off);
 *   5. min-p: candidates with probability below min_p times the largest stay out (0: off);
 *   6. a categorical draw from the candidates, renormalised, with the seeded generator.
 * Candidates are ordered by logit, largest first, equal logits by lower id; every filter keeps
 * at least one candidate. */
#ifndef LMX_RUNTIME_SAMPLER_H
#define LMX_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "lmx.h"

/* xoshiro256** seeded through splitmix64: the same seed gives the same stream everywhere. */
typedef struct lmx_rng {
    uint64_t s[4];
} lmx_rng;

void lmx_rng_seed(lmx_rng *r, uint64_t seed);
uint64_t lmx_rng_next(lmx_rng *r);
/* A double in [0, 1) with 53 random bits. */
double lmx_rng_uniform(lmx_rng *r);

typedef struct lmx_cand {
    int32_t id;
    float logit;   /* after penalties and temperature */
    float p;       /* probability among the current candidates */
} lmx_cand;

/* Scratch buffers of the chain for a vocabulary of V, shared by every sequence sampled in turn;
 * the parameters and generator state belong to each sequence and come with each call. */
typedef struct lmx_sampler {
    int V;
    lmx_cand *cand;       /* [V] */
    int n_cand;
    int32_t *counts;      /* [V] occurrence counts, all zero between calls */
} lmx_sampler;

/* 0, or -1 when out of memory. */
int lmx_sampler_init(lmx_sampler *s, int V);
void lmx_sampler_free(lmx_sampler *s);
size_t lmx_sampler_bytes(int V);

/* Step 1, in place on logits [V]. history: the last n_hist tokens seen (prompt and generated). */
void lmx_sampler_penalize(lmx_sampler *s, const lmx_sampler_params *p, float *logits,
                          const int32_t *history, int n_hist);
/* Steps 3-5 for temperature > 0: leave the surviving candidates in s->cand[0 .. s->n_cand),
 * most likely first when a filter is on (else in id order), with probabilities renormalised
 * over them.  Returns n_cand. */
int lmx_sampler_filter(lmx_sampler *s, const lmx_sampler_params *p, const float *logits);
/* The whole chain on logits [V] (modified in place), drawing from rng. */
int32_t lmx_sampler_sample(lmx_sampler *s, const lmx_sampler_params *p, lmx_rng *rng, float *logits,
                           const int32_t *history, int n_hist);

/* Sampling from the k largest logits only (what a GPU backend returns instead of all V):
 * lmx_sampler_topk_need gives the k the chain needs for p over a vocabulary of V: 1 for greedy,
 * top_k when top-k is on (top_k < V, at most kmax), 0 when it needs every logit (penalties, top-k
 * off, or more than kmax).  lmx_sampler_sample_topk then draws from vals / ids [k] (largest first,
 * equal logits by lower id) the same token lmx_sampler_sample draws from all V logits. */
int lmx_sampler_topk_need(const lmx_sampler_params *p, int V, int kmax);
int32_t lmx_sampler_sample_topk(lmx_sampler *s, const lmx_sampler_params *p, lmx_rng *rng, const float *vals,
                                const int32_t *ids, int k);

/* The index of the largest of x[0..n) (the lowest index among equals). */
int32_t lmx_argmax(const float *x, int n);

#endif
