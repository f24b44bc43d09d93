/*
mqar.h: multi-query associative recall (MQAR), the synthetic recall benchmark of Zoology (Arora et al. 2023)
that the paper uses, generated in C from a seeded RNG.
defines: MqarConfig, mqar_check(), mqar_example(), mqar_batch() (the pdn generator); mqar_check_zoology(),
mqar_zoology_seeds(), mqar_zoology_example(), mqar_zoology_batch() (Zoology's).

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

Two generators make such examples (--mqar-gen):
- pdn (mqar_batch): a fresh example every time, from the training stream; the default job's.
- zoology (mqar_zoology_batch): Zoology's data as its multiquery_ar.py and data/utils.py build it: a fixed
  training set and a fixed test set, each of a given size and with its own seed (Zoology draws train seeds from
  [0, 2^31) and test seeds from [2^31, 2^32) out of DataConfig.seed = 123, so the two never share one), the
  training set served in the same order every epoch (its DataLoader does not shuffle), a short last batch.
  Example i of a set depends only on (the set's seed, i), so no set is stored: a batch makes its examples
  again. Same distribution as Zoology's numpy/torch code, not the same numbers (theirs come from MT19937).
  Zoology's asserts hold too: T even and Vm > T.
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

// ----------------------------------------------------------------------------------------------------
// Zoology's generator

#define MQAR_GEN_PDN 0
#define MQAR_GEN_ZOOLOGY 1

// NULL if Zoology's generator can make examples with these settings (mqar_check and multiquery_ar's asserts)
static const char* mqar_check_zoology(const MqarConfig* c) {
    static char msg[200];
    const char* err = mqar_check(c);
    if (err) { return err; }
    if (c->seq_len % 2 != 0) {
        snprintf(msg, sizeof msg, "Zoology's MQAR generator needs an even sequence length (-t %d)", c->seq_len);
        return msg;
    }
    if (c->vocab <= c->seq_len) {
        snprintf(msg, sizeof msg, "Zoology's MQAR generator needs --mqar-vocab > -t (vocab %d, length %d)", c->vocab, c->seq_len);
        return msg;
    }
    return NULL;
}

// the two sets' seeds from one data seed: the training set's in [0, 2^31), the test set's in [2^31, 2^32)
static void mqar_zoology_seeds(uint64_t data_seed, uint64_t* train_seed, uint64_t* test_seed) {
    uint64_t s = data_seed;
    *train_seed = splitmix64(&s) & 0x7FFFFFFFull;
    *test_seed = 0x80000000ull | (splitmix64(&s) & 0x7FFFFFFFull);
}

// the query slots' weights p_i ~ i^(a-1), i = 1..space (Zoology's a * i^(a-1), normalised: constant factors do not
// change the draw)
static void mqar_zoology_weights(const MqarConfig* c, double* w) {
    int space = (c->seq_len - 2 * c->pairs) / 2;
    for (int s = 0; s < space; s++) { w[s] = pow((double)(s + 1), (double)c->power_a - 1.0); }
}

typedef struct { double e; int slot; } MqarSlotKey;
static int mqar_slot_key_cmp(const void* a, const void* b) {
    double x = ((const MqarSlotKey*)a)->e, y = ((const MqarSlotKey*)b)->e;
    return (x > y) - (x < y);
}

// k distinct integers from [lo, hi) in random order: every ordered k-subset equally likely, as numpy's
// choice(replace=False). Rejection against a mark per value (mark: hi bytes, zero on entry and on return); with
// Zoology's asserts (4N <= T < Vm) k is at most about half of hi - lo, so a draw takes under two tries on average.
static void mqar_distinct_marked(Rng* rng, int lo, int hi, int k, int* out, uint8_t* mark) {
    for (int i = 0; i < k; i++) {
        int v;
        do { v = lo + (int)rng_below(rng, (uint64_t)(hi - lo)); } while (mark[v]);
        mark[v] = 1;
        out[i] = v;
    }
    for (int i = 0; i < k; i++) { mark[out[i]] = 0; }
}

// Example `index` of the set with seed `set_seed`: x[T] tokens, y[T] targets (-1: none). w: mqar_zoology_weights;
// scratch: keys, values, gaps (3N ints), sk (space), mark (vocab bytes, zero).
// The N query slots are drawn without replacement with probabilities p, in order (key j is queried at the j-th
// slot drawn), as numpy's choice(space, N, replace=False, p) draws them: successive sampling. Here by exponential
// keys: with E_s ~ Exp(rate w_s) independent, the smallest is slot s with probability w_s / sum(w), and, the
// exponential having no memory, the next smallest among the others again with w_s over what is left.
static void mqar_zoology_example(const MqarConfig* c, const double* w, uint64_t set_seed, long index, int* x, int* y,
                                 int* scratch, MqarSlotKey* sk, uint8_t* mark) {
    int T = c->seq_len, N = c->pairs, Vm = c->vocab, C = 2 * N, space = (T - C) / 2;
    int* keys = scratch;          // N
    int* vals = scratch + N;      // N
    Rng rng;
    uint64_t z = (set_seed << 32) ^ (uint64_t)index; // set seeds < 2^32, indices < 2^31: one stream per example
    rng_seed(&rng, splitmix64(&z));
    mqar_distinct_marked(&rng, 1, Vm / 2, N, keys, mark);
    mqar_distinct_marked(&rng, Vm / 2, Vm, N, vals, mark);
    for (int t = 0; t < T; t++) { x[t] = -1; y[t] = -1; }
    for (int i = 0; i < N; i++) { x[2 * i] = keys[i]; x[2 * i + 1] = vals[i]; }
    for (int s = 0; s < space; s++) {
        sk[s].e = -log(1.0 - rng_uniform(&rng)) / w[s];
        sk[s].slot = s;
    }
    qsort(sk, (size_t)space, sizeof(MqarSlotKey), mqar_slot_key_cmp);
    for (int j = 0; j < N; j++) {
        int pos = C + 2 * sk[j].slot;  // the query; the label: its value, predicted at the query token
        x[pos] = keys[j];
        y[pos] = vals[j];
    }
    // every other position (the token after each query, the unused slots, the end) is uniform over [0, Vm)
    for (int t = 0; t < T; t++) {
        if (x[t] < 0) { x[t] = (int)rng_below(&rng, (uint64_t)Vm); }
    }
}

// B rows of shape (B, T): examples first, first + 1, ... of the set (seed, n examples). Rows past its end are
// padding (tokens 0, no targets), so a short last batch weighs its loss over its own targets, as Zoology's does.
static void mqar_zoology_batch(const MqarConfig* c, uint64_t set_seed, long n, long first, int B, int* x, int* y) {
    int T = c->seq_len, space = (T - 2 * c->pairs) / 2;
    double* w = (double*)mallocCheck(sizeof(double) * (size_t)space);
    int* scratch = (int*)mallocCheck(sizeof(int) * (size_t)(2 * c->pairs));
    MqarSlotKey* sk = (MqarSlotKey*)mallocCheck(sizeof(MqarSlotKey) * (size_t)space);
    uint8_t* mark = (uint8_t*)callocCheck((size_t)c->vocab, 1);
    mqar_zoology_weights(c, w);
    for (int b = 0; b < B; b++) {
        int *xb = x + (size_t)b * T, *yb = y + (size_t)b * T;
        if (first + b < n) { mqar_zoology_example(c, w, set_seed, first + b, xb, yb, scratch, sk, mark); continue; }
        for (int t = 0; t < T; t++) { xb[t] = 0; yb[t] = -1; }
    }
    free(w); free(scratch); free(sk); free(mark);
}

#endif // PDN_MQAR_H
