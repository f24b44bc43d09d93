/*
mqar.h: multi-query associative recall (MQAR), the synthetic recall benchmark of Zoology (Arora et al. 2023)
that the paper uses, generated in C from a seeded RNG.
defines: MqarConfig, mqar_check(), mqar_example(), mqar_batch().

One example of length T with N key-value pairs over a vocabulary of size Vm:
- keys are drawn from [1, Vm/2), values from [Vm/2, Vm); the N keys are distinct, the N values are distinct
- positions 0..2N-1 hold k1 v1 k2 v2 ... kN vN
- the rest is (T - 2N)/2 query slots; slot s sits at position 2N + 2s and is chosen with probability
  proportional to (s+1)^(power_a - 1) (power_a = 0.01: a power law that favours early slots), N distinct
  slots without replacement; each key is queried exactly once, in random order
- the target at a query position is the key's value (next-token prediction at the query); every other
  position has no target (-1)
- every position not holding a key, value or query gets a uniform random token from [0, Vm)
Chance accuracy is about 1/(Vm/2): a model that has only learned "answers are values" guesses among Vm/2.
*/
#ifndef PDN_MQAR_H
#define PDN_MQAR_H

#include "utils.h"

typedef struct { int vocab, seq_len, pairs; float power_a; } MqarConfig;

// NULL if the settings can make examples, else why not
static const char* mqar_check(const MqarConfig* c) {
    static char msg[200];
    if (c->pairs < 1) { snprintf(msg, sizeof msg, "--mqar-pairs must be >= 1"); return msg; }
    if (c->vocab < 4 || c->vocab / 2 - 1 < c->pairs) {
        snprintf(msg, sizeof msg, "--mqar-vocab %d is too small for %d distinct keys (keys come from [1, vocab/2))",
                 c->vocab, c->pairs);
        return msg;
    }
    if (4 * c->pairs > c->seq_len) {
        snprintf(msg, sizeof msg, "sequence length -t %d is too short for %d pairs (needs at least 4 x pairs = %d)",
                 c->seq_len, c->pairs, 4 * c->pairs);
        return msg;
    }
    if (!(c->power_a > 0)) { snprintf(msg, sizeof msg, "--mqar-power-a must be > 0"); return msg; }
    return NULL;
}

// draw k distinct integers from [lo, hi) (partial Fisher-Yates on a scratch array of size hi - lo)
static void mqar_distinct(Rng* rng, int lo, int hi, int k, int* out, int* scratch) {
    int n = hi - lo;
    for (int i = 0; i < n; i++) { scratch[i] = lo + i; }
    for (int i = 0; i < k; i++) {
        int j = i + (int)rng_below(rng, (uint64_t)(n - i));
        int t = scratch[i]; scratch[i] = scratch[j]; scratch[j] = t;
        out[i] = scratch[i];
    }
}

// One example: tokens x[T], targets y[T] (-1 where there is no target). scratch: >= vocab + 3*T ints/doubles.
static void mqar_example(const MqarConfig* c, Rng* rng, int* x, int* y, int* iscratch, double* weights) {
    int T = c->seq_len, N = c->pairs, Vm = c->vocab, C = 2 * N;
    int* keys = iscratch;                 // N
    int* vals = iscratch + N;             // N
    int* perm = iscratch + 2 * N;         // Vm
    for (int t = 0; t < T; t++) { x[t] = -1; y[t] = -1; }
    mqar_distinct(rng, 1, Vm / 2, N, keys, perm);
    mqar_distinct(rng, Vm / 2, Vm, N, vals, perm);
    for (int i = 0; i < N; i++) { x[2 * i] = keys[i]; x[2 * i + 1] = vals[i]; }
    int space = (T - C) / 2;
    double total = 0.0;
    for (int s = 0; s < space; s++) { weights[s] = pow((double)(s + 1), (double)c->power_a - 1.0); total += weights[s]; }
    for (int i = 0; i < N; i++) {
        // sequential weighted draw without replacement: pick a slot, remove its weight
        double u = rng_uniform(rng) * total, acc = 0.0;
        int slot = -1;
        for (int s = 0; s < space; s++) {
            if (weights[s] <= 0) { continue; }
            acc += weights[s];
            slot = s;
            if (u < acc) { break; }
        }
        total -= weights[slot];
        weights[slot] = 0.0;
        int pos = C + 2 * slot;
        x[pos] = keys[i];
        y[pos] = vals[i];
    }
    for (int t = 0; t < T; t++) {
        if (x[t] < 0) { x[t] = (int)rng_below(rng, (uint64_t)Vm); }
    }
}

// B examples into x, y of shape (B, T)
static void mqar_batch(const MqarConfig* c, Rng* rng, int B, int* x, int* y) {
    int* is = (int*)mallocCheck(sizeof(int) * (size_t)(c->vocab + 3 * c->pairs + 8));
    double* w = (double*)mallocCheck(sizeof(double) * (size_t)(c->seq_len + 1));
    for (int b = 0; b < B; b++) {
        mqar_example(c, rng, x + (size_t)b * c->seq_len, y + (size_t)b * c->seq_len, is, w);
    }
    free(is);
    free(w);
}

#endif // PDN_MQAR_H
