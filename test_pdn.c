/*
test_pdn.c: the CPU tests. Built twice from this one file:
  test_pdn64 (-DPDN_DOUBLE, real = double): gradients against central finite differences, for every variant,
             every parameter tensor and every mixer input; the chunkwise/per-token identity; Theorem 3.1.
  test_pdn   (real = float, the production precision): chunkwise vs per-token in fp32, recurrent generation vs
             the full forward, MQAR generator, parameter counts against SPEC §7, checkpoints (round trip,
             corruption, truncation), resume exactness, determinism across thread counts, CLI errors, and a
             tiny PGDN learning MQAR.
Every check prints what it compared; any failure prints FAIL with file:line and the process exits nonzero.
Tolerances are stated next to each check with the reason.
*/
#define TESTING
#include "train_pdn.c"
#include <sys/wait.h>

static int n_checks = 0, n_fail = 0;
#define CHECK(cond, ...) do { n_checks++; if (!(cond)) { n_fail++; printf("FAIL [%s:%d] ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf("\n"); } } while (0)

static Rng trng;
static double urand(void) { return rng_uniform(&trng); }
static double nrand(void) { static NormalRng nr; static int init = 0; if (!init) { rng_seed(&nr.rng, 99); init = 1; } return rng_normal(&nr); }
static void fill_normal(real* x, size_t n, double std) { for (size_t i = 0; i < n; i++) { x[i] = R(std * nrand()); } }

// max |a - b| / max |b|: the error relative to the tensor's scale (robust to elements near zero)
static double rel_err(const real* a, const real* b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || d != d) { md = d != d ? INFINITY : d; }
        if (fabs((double)b[i]) > mb) { mb = fabs((double)b[i]); }
    }
    return mb > 0 ? md / mb : md;
}

// a small config of a given variant for in-process tests
static PdnConfig small_config(const char* variant, int precond_exact, int tie) {
    PdnConfig c;
    pdn_config_defaults(&c);
    pdn_variant_apply(&c, variant);
    if (precond_exact) { c.precond = PRECOND_EXACT; c.ridge = 0.8f; }
    c.vocab_size = 13; c.d_model = 12; c.n_layer = 2; c.n_head = 2; c.head_k = 4; c.expand_v = 2; c.mlp_hidden = 20;
    c.tie_embeddings = tie;
    const char* err = pdn_config_check(&c);
    if (err) { printf("bad test config: %s\n", err); exit(1); }
    return c;
}

// parameters with every path active: matrices N(0, 0.3), norms 1 + N(0, 0.1), gates and scales O(1)
static void randomize_params(Model* m) {
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &m->lay.t[i];
        real* p = m->params + t->offset;
        for (size_t j = 0; j < t->numel; j++) {
            double v;
            switch (t->init) {
                case INIT_ONES: v = 1.0 + 0.1 * nrand(); break;
                case INIT_ALOG: v = -1.0 + 1.5 * urand(); break;          // decay rates exp(A_log) in (0.37, 1.6)
                case INIT_DTBIAS: v = -2.0 + 2.0 * urand(); break;
                case INIT_LOGATK: v = -0.5 + urand(); break;
                default: v = 0.3 * nrand(); break;
            }
            p[j] = R(v);
        }
    }
}

#ifdef PDN_DOUBLE
// ====================================================================================================
// fp64 tests

static void make_batch(int B, int T, int vocab, int* x, int* y) {
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)rng_below(&trng, vocab);
        y[i] = urand() < 0.2 ? -1 : (int)rng_below(&trng, vocab); // some positions without a target
    }
}

static double model_loss(Model* m, Acts* a, const int* x, const int* y) {
    pdn_forward(m, a, x, NULL);
    long count;
    double s = crossentropy_forward(a->logits, a->losses, y, (size_t)a->B * a->T, m->cfg.vocab_size, &count);
    return s / count;
}

// Central differences in double with one Richardson step: D(h) = (L(x+h) - L(x-h)) / 2h has error c h² + O(h⁴),
// so (4 D(h/2) - D(h)) / 3 has error O(h⁴). With h = 1e-5 that is ~1e-18 relative, under the rounding error
// ~1e-16 |L| / h ~ 1e-11; analytic and numeric derivatives must agree to 1e-6 relative (directional, whole tensor)
// and to 1e-6 |an| + 1e-8 per element, where a wrong gradient is off by O(1).
static double model_loss(Model* m, Acts* a, const int* x, const int* y);
static double fd_derivative(Model* m, Acts* a, const int* x, const int* y, real* p, const real* u, size_t n, double h) {
    double d[2];
    for (int k = 0; k < 2; k++) {
        double hk = k ? h / 2 : h;
        for (size_t j = 0; j < n; j++) { p[j] += hk * u[j]; }
        double lp = model_loss(m, a, x, y);
        for (size_t j = 0; j < n; j++) { p[j] -= 2 * hk * u[j]; }
        double lm = model_loss(m, a, x, y);
        for (size_t j = 0; j < n; j++) { p[j] += hk * u[j]; }
        d[k] = (lp - lm) / (2 * hk);
    }
    return (4 * d[1] - d[0]) / 3;
}

static void gradcheck_model(const char* name, PdnConfig c, int chunk_form) {
    Model m;
    model_init(&m, &c, 4, chunk_form);
    randomize_params(&m);
    int B = 2, T = 11; // 11 = 2 chunks of 4 + a partial chunk
    int x[22], y[22];
    make_batch(B, T, c.vocab_size, x, y);
    Acts a = acts_alloc(&m, B, T, 1);
    memset(m.grads, 0, m.lay.num_elems * sizeof(real));
    pdn_forward_backward(&m, &a, x, y, 1);
    real* u = (real*)callocCheck(m.lay.num_elems, sizeof(real));
    double h = 1e-5, worst = 0;
    int tensors = 0;
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &m.lay.t[i];
        if (!t->numel) { continue; }
        tensors++;
        // directional derivative along a random ±1 direction over the whole tensor
        double an = 0;
        for (size_t j = 0; j < t->numel; j++) {
            u[j] = urand() < 0.5 ? -1 : 1;
            an += m.grads[t->offset + j] * u[j];
        }
        real* p = m.params + t->offset;
        double fd = fd_derivative(&m, &a, x, y, p, u, t->numel, h);
        double rel = fabs(fd - an) / fmax(fabs(an), 1e-8);
        worst = fmax(worst, rel);
        CHECK(rel < 1e-6, "%s %s: directional derivative analytic %.12g vs numeric %.12g (rel %.2e)",
              name, t->name, an, fd, rel);
        // three single elements
        for (int r = 0; r < 3; r++) {
            size_t j = rng_below(&trng, t->numel);
            real one = 1;
            fd = fd_derivative(&m, &a, x, y, p + j, &one, 1, h);
            double g = m.grads[t->offset + j];
            CHECK(fabs(fd - g) <= 1e-6 * fabs(g) + 1e-8, "%s %s[%zu]: analytic %.12g vs numeric %.12g", name, t->name, j, g, fd);
        }
    }
    printf("  grad check %-12s (%s form): %d tensors, worst directional rel error %.1e\n", name,
           chunk_form ? "chunk" : "token", tensors, worst);
    free(u);
    acts_free(&a);
    model_free(&m);
}

// the mixer core alone: loss = Σ o ⊙ Wo + Σ S_final ⊙ Ws, gradients of every input incl. the initial state.
// Plain central differences, h = 1e-6: truncation ~h² = 1e-12 of the third derivative, rounding ~1e-16 |L| / h
// ~ 1e-9; we require |fd - an| <= 1e-6 |an| + 1e-7 for every element.
typedef struct { real *q, *k, *kt, *v, *beta, *g, *S0; } CoreInputs;

static double core_loss(const CoreInputs* in, const real* Wo, const real* Ws, int B, int T, int H, int K, int V, int gk, int C, int form) {
    int NC = (T + C - 1) / C;
    size_t N = (size_t)B * T;
    real* o = (real*)mallocCheck(N * H * V * sizeof(real));
    real* st = (real*)mallocCheck((size_t)B * H * (NC + 1) * K * V * sizeof(real));
    real* Sf = (real*)mallocCheck((size_t)B * H * K * V * sizeof(real));
    delta_forward(o, st, in->q, in->k, in->kt, in->v, in->beta, in->g, in->S0, Sf, B, T, H, K, V, gk, C, form);
    double l = 0;
    for (size_t i = 0; i < N * H * V; i++) { l += o[i] * Wo[i]; }
    for (size_t i = 0; i < (size_t)B * H * K * V; i++) { l += Sf[i] * Ws[i]; }
    free(o); free(st); free(Sf);
    return l;
}

static void gradcheck_core(int gk_kind, int form) {
    int B = 2, T = 11, H = 2, K = 3, V = 5, C = 4, NC = (T + C - 1) / C;
    int gk = gk_kind == 0 ? 0 : gk_kind == 1 ? 1 : K;
    size_t N = (size_t)B * T, nS = (size_t)B * H * K * V;
    CoreInputs in;
    size_t sizes[] = {N * H * K, N * H * K, N * H * K, N * H * V, N * H, N * H * (gk ? gk : 1), nS};
    real** ptr[] = {&in.q, &in.k, &in.kt, &in.v, &in.beta, &in.g, &in.S0};
    const char* names[] = {"q", "k", "kt", "v", "beta", "g", "S0"};
    for (int i = 0; i < 7; i++) { *ptr[i] = (real*)mallocCheck(sizes[i] * sizeof(real)); fill_normal(*ptr[i], sizes[i], 0.5); }
    for (size_t i = 0; i < N * H; i++) { in.beta[i] = R(0.2 + 0.6 * urand()); }
    for (size_t i = 0; i < sizes[5]; i++) { in.g[i] = R(-0.5 * urand()); }
    if (!gk) { in.g = NULL; }
    real* Wo = (real*)mallocCheck(N * H * V * sizeof(real));
    real* Ws = (real*)mallocCheck(nS * sizeof(real));
    fill_normal(Wo, N * H * V, 1.0);
    fill_normal(Ws, nS, 1.0);
    real* grads[7];
    for (int i = 0; i < 7; i++) { grads[i] = (real*)callocCheck(sizes[i], sizeof(real)); }
    real* st = (real*)mallocCheck((size_t)B * H * (NC + 1) * K * V * sizeof(real));
    real* o = (real*)mallocCheck(N * H * V * sizeof(real));
    delta_forward(o, st, in.q, in.k, in.kt, in.v, in.beta, in.g, in.S0, NULL, B, T, H, K, V, gk, C, form);
    delta_backward(grads[0], grads[1], grads[2], grads[3], grads[4], gk ? grads[5] : NULL, grads[6], Wo, Ws,
                   in.q, in.k, in.kt, in.v, in.beta, in.g, st, B, T, H, K, V, gk, C, form);
    double h = 1e-6, worst = 0;
    for (int i = 0; i < 7; i++) {
        if (i == 5 && !gk) { continue; }
        real* x = *ptr[i];
        double gmax = 0, emax = 0;
        for (size_t j = 0; j < sizes[i]; j++) {
            real save = x[j];
            x[j] = save + h; double lp = core_loss(&in, Wo, Ws, B, T, H, K, V, gk, C, form);
            x[j] = save - h; double lm = core_loss(&in, Wo, Ws, B, T, H, K, V, gk, C, form);
            x[j] = save;
            double fd = (lp - lm) / (2 * h), an = grads[i][j];
            gmax = fmax(gmax, fabs(an));
            emax = fmax(emax, fabs(fd - an));
            CHECK(fabs(fd - an) <= 1e-6 * fabs(an) + 1e-7, "core gk=%d %s: d%s[%zu] analytic %.12g numeric %.12g",
                  gk, form ? "chunk" : "token", names[i], j, an, fd);
        }
        worst = fmax(worst, emax / gmax);
    }
    printf("  mixer core %s decay, %s form: every element of q k kt v beta%s S0, worst error %.1e of the gradient's scale\n",
           gk_kind == 0 ? "no" : gk_kind == 1 ? "scalar" : "channel", form ? "chunk" : "token", gk ? " g" : "", worst);
    for (int i = 0; i < 7; i++) { if (*ptr[i]) { free(*ptr[i]); } free(grads[i]); }
    free(Wo); free(Ws); free(st); free(o);
}

// preconditioners alone: loss = Σ k̃ ⊙ W
static double diag_loss(const real* k, const real* gp, const real* bp, const real* las, const real* a0, const real* W,
                        int B, int T, int H, int K) {
    size_t n = (size_t)B * T * H * K;
    real* kt = (real*)mallocCheck(n * sizeof(real));
    real* as = (real*)mallocCheck(n * sizeof(real));
    precond_diag_forward(kt, as, k, gp, bp, las, a0, NULL, B, T, H, K, R(1.5), R(1e-6));
    double l = 0;
    for (size_t i = 0; i < n; i++) { l += kt[i] * W[i]; }
    free(kt); free(as);
    return l;
}

static void gradcheck_precond(void) {
    int B = 2, T = 9, H = 2, K = 3;
    size_t n = (size_t)B * T * H * K, nh = (size_t)B * T * H;
    real *k = mallocCheck(n * sizeof(real)), *W = mallocCheck(n * sizeof(real)), *gp = mallocCheck(nh * sizeof(real));
    real *bp = mallocCheck(nh * sizeof(real)), las[2] = {R(-0.2), R(0.3)}, *a0 = mallocCheck((size_t)B * H * K * sizeof(real));
    fill_normal(k, n, 0.7);
    fill_normal(W, n, 1.0);
    for (size_t i = 0; i < nh; i++) { gp[i] = R(-0.7 * urand()); bp[i] = R(0.1 + 0.8 * urand()); }
    for (int i = 0; i < B * H * K; i++) { a0[i] = R(0.5 * urand()); }
    real *dk = callocCheck(n, sizeof(real)), *dgp = callocCheck(nh, sizeof(real)), *dbp = callocCheck(nh, sizeof(real));
    real dlas[2] = {0, 0};
    real* kt = mallocCheck(n * sizeof(real));
    real* as = mallocCheck(n * sizeof(real));
    precond_diag_forward(kt, as, k, gp, bp, las, a0, NULL, B, T, H, K, R(1.5), R(1e-6));
    precond_diag_backward(dk, dgp, dbp, dlas, W, k, gp, bp, as, las, a0, B, T, H, K, R(1.5), R(1e-6));
    real* xs[] = {k, gp, bp, las};
    real* gs[] = {dk, dgp, dbp, dlas};
    size_t ns[] = {n, nh, nh, 2};
    const char* names[] = {"k", "gP", "betaP", "log_atk_scale"};
    double h = 1e-6;
    for (int i = 0; i < 4; i++) {
        for (size_t j = 0; j < ns[i]; j++) {
            real save = xs[i][j];
            xs[i][j] = save + h; double lp = diag_loss(k, gp, bp, las, a0, W, B, T, H, K);
            xs[i][j] = save - h; double lm = diag_loss(k, gp, bp, las, a0, W, B, T, H, K);
            xs[i][j] = save;
            double fd = (lp - lm) / (2 * h);
            CHECK(fabs(fd - gs[i][j]) <= 1e-6 * fabs(gs[i][j]) + 1e-7, "diag precond d%s[%zu]: analytic %.12g numeric %.12g",
                  names[i], j, gs[i][j], fd);
        }
    }
    printf("  diagonal preconditioner (nonzero a_0): every element of k, gP, betaP, log_atk_scale\n");
    // exact preconditioner: dk through the Sherman-Morrison chain, with chunks of 4 over 9 tokens
    real* pst = mallocCheck((size_t)B * H * 4 * K * K * sizeof(real));
    memset(dk, 0, n * sizeof(real));
    precond_exact_forward(kt, pst, k, NULL, NULL, B, T, H, K, 4, R(0.8));
    precond_exact_backward(dk, W, k, pst, B, T, H, K, 4);
    for (size_t j = 0; j < n; j++) {
        real save = k[j];
        double lv[2];
        for (int s = 0; s < 2; s++) {
            k[j] = save + (s ? -h : h);
            precond_exact_forward(kt, pst, k, NULL, NULL, B, T, H, K, 4, R(0.8));
            lv[s] = 0;
            for (size_t i = 0; i < n; i++) { lv[s] += kt[i] * W[i]; }
        }
        k[j] = save;
        double fd = (lv[0] - lv[1]) / (2 * h);
        CHECK(fabs(fd - dk[j]) <= 1e-6 * fabs(dk[j]) + 1e-7, "exact precond dk[%zu]: analytic %.12g numeric %.12g", j, dk[j], fd);
    }
    printf("  exact preconditioner: every element of k\n");
    free(k); free(W); free(gp); free(bp); free(a0); free(dk); free(dgp); free(dbp); free(kt); free(as); free(pst);
}

// Theorem 3.1: exact ATQ and exact ATK give the same outputs; SPEC §5's counterexample for the diagonal versions
static void test_theorem31(void) {
    int T = 12, K = 4, V = 3;
    double lambda = 0.7;
    real *q = mallocCheck(T * K * sizeof(real)), *k = mallocCheck(T * K * sizeof(real)), *v = mallocCheck(T * V * sizeof(real));
    fill_normal(q, T * K, 1.0); fill_normal(k, T * K, 1.0); fill_normal(v, T * V, 1.0);
    // ATK: our exact preconditioner then the delta rule with beta = 1 and no decay
    real *kt = mallocCheck(T * K * sizeof(real)), *pst = mallocCheck(5 * K * K * sizeof(real)), *beta = mallocCheck(T * sizeof(real));
    real *o = mallocCheck(T * V * sizeof(real)), *st = mallocCheck(5 * K * V * sizeof(real));
    for (int t = 0; t < T; t++) { beta[t] = 1; }
    precond_exact_forward(kt, pst, k, NULL, NULL, 1, T, 1, K, 4, R(lambda));
    double worst = 0;
    for (int form = 0; form < 2; form++) {
        delta_forward(o, st, q, k, kt, v, beta, NULL, NULL, NULL, 1, T, 1, K, V, 0, 4, form);
        // ATQ: o_t = C_t G_t^-1 q_t, C_t = Σ v kᵀ, G_t = lambda I + Σ k kᵀ (solved by Gaussian elimination)
        double G[16], Cm[12];
        memset(Cm, 0, sizeof Cm);
        for (int a = 0; a < K * K; a++) { G[a] = a % (K + 1) == 0 ? lambda : 0; }
        for (int t = 0; t < T; t++) {
            for (int a = 0; a < K; a++) {
                for (int b = 0; b < K; b++) { G[a * K + b] += k[t * K + a] * k[t * K + b]; }
                for (int c = 0; c < V; c++) { Cm[c * K + a] += v[t * V + c] * k[t * K + a]; }
            }
            double M[16], z[4];
            memcpy(M, G, sizeof M);
            for (int a = 0; a < K; a++) { z[a] = q[t * K + a]; }
            for (int p = 0; p < K; p++) {
                for (int r = p + 1; r < K; r++) {
                    double f = M[r * K + p] / M[p * K + p];
                    for (int c = p; c < K; c++) { M[r * K + c] -= f * M[p * K + c]; }
                    z[r] -= f * z[p];
                }
            }
            for (int p = K - 1; p >= 0; p--) {
                for (int c = p + 1; c < K; c++) { z[p] -= M[p * K + c] * z[c]; }
                z[p] /= M[p * K + p];
            }
            for (int c = 0; c < V; c++) {
                double ref = 0;
                for (int a = 0; a < K; a++) { ref += Cm[c * K + a] * z[a]; }
                double err = fabs(ref - o[t * V + c]) / (fabs(ref) + 1e-12);
                worst = fmax(worst, err);
                CHECK(err < 1e-9, "Theorem 3.1 (%s form): t=%d c=%d ATQ %.15g vs ATK %.15g", form ? "chunk" : "token", t, c, ref, o[t * V + c]);
            }
        }
    }
    printf("  Theorem 3.1: exact ATQ == exact ATK over %d tokens (both mixer forms), worst rel error %.1e\n", T, worst);
    // counterexample (SPEC §5): lambda = 1, k1 = v1 = (1, 1)
    real k1[2] = {1, 1}, v1[2] = {1, 1}, q1[2] = {1, 0}, kt1[2], b1 = 1, o1[2], ps[2 * 4], st1[2 * 4];
    precond_exact_forward(kt1, ps, k1, NULL, NULL, 1, 1, 1, 2, 1, R(1));
    delta_forward(o1, st1, q1, k1, kt1, v1, &b1, NULL, NULL, NULL, 1, 1, 1, 2, 2, 0, 1, 0);
    const real* S1 = st1 + 4; // final state (K x V)
    int ok_atk = 1;
    for (int e = 0; e < 4; e++) { ok_atk &= fabs(S1[e] - 1.0 / 3.0) < 1e-12; }
    CHECK(ok_atk, "ATK on the counterexample: S_1 = [%g %g; %g %g], expected 1/3 * 11^T", S1[0], S1[1], S1[2], S1[3]);
    // diagonal ATQ: G ≈ lambda I + diag(k²) = 2I, S = C G^-1 = 11ᵀ / 2
    double Sdiag = 1.0 * 1.0 / (1.0 + 1.0 * 1.0);
    CHECK(fabs(Sdiag - 0.5) < 1e-15, "diagonal ATQ gives %g, expected 1/2", Sdiag);
    // exact ATQ: 11ᵀ (I + 11ᵀ)^-1 = 11ᵀ / 3 (the theorem), diagonal ATK: P_0 = I is diagonal, one step = 1/3
    printf("  counterexample: diagonal ATQ S_1 = 1/2 11^T, ATK S_1 = [%.6f %.6f; %.6f %.6f] = 1/3 11^T\n", S1[0], S1[1], S1[2], S1[3]);
    free(q); free(k); free(v); free(kt); free(pst); free(beta); free(o); free(st);
}

static void chunk_vs_token_model(const char* variant, int exact) {
    PdnConfig c = small_config(variant, exact, 1);
    Model mt, mc;
    model_init(&mt, &c, 4, 0);
    randomize_params(&mt);
    model_init(&mc, &c, 4, 1);
    memcpy(mc.params, mt.params, mt.lay.num_elems * sizeof(real));
    int x[22], y[22];
    make_batch(2, 11, c.vocab_size, x, y);
    Acts at = acts_alloc(&mt, 2, 11, 1), ac = acts_alloc(&mc, 2, 11, 1);
    double lt = pdn_forward_backward(&mt, &at, x, y, 1), lc = pdn_forward_backward(&mc, &ac, x, y, 1);
    double e = rel_err(mc.grads, mt.grads, mt.lay.num_elems);
    CHECK(fabs(lt - lc) < 1e-12 && e < 1e-10, "%s%s model: chunk vs token loss %.15g vs %.15g, grads rel err %.2e", variant,
          exact ? "-exact" : "", lc, lt, e);
    acts_free(&at); acts_free(&ac); model_free(&mt); model_free(&mc);
}

static void run_double_tests(void) {
    printf("gradient checks (fp64, central differences):\n");
    const char* variants[] = {"dn", "pdn", "gdn", "pgdn", "kda", "pkda"};
    for (int v = 0; v < 6; v++) {
        for (int form = 1; form >= 0; form--) { gradcheck_model(variants[v], small_config(variants[v], 0, v != 3), form); }
    }
    gradcheck_model("pgdn-exact", small_config("pgdn", 1, 1), 1);
    gradcheck_model("pdn-exact", small_config("pdn", 1, 1), 0);
    PdnConfig cg = small_config("gdn", 0, 1);
    cg.out_gate = 1; cg.neg_eigval = 1;
    pdn_build_layout(&cg, &(PdnLayout){0});
    gradcheck_model("gdn+gate+neg", cg, 1);
    for (int gk = 0; gk < 3; gk++) { for (int form = 0; form < 2; form++) { gradcheck_core(gk, form); } }
    gradcheck_precond();
    printf("chunkwise == per-token at model level (fp64, every variant):\n");
    for (int v = 0; v < 6; v++) { chunk_vs_token_model(variants[v], 0); }
    chunk_vs_token_model("pgdn", 1);
    printf("  done (losses to 1e-12, gradients to 1e-10 relative)\n");
    printf("Theorem 3.1:\n");
    test_theorem31();
}

#else
// ====================================================================================================
// fp32 tests

// Chunkwise vs per-token in fp32 for every decay kind, a distinct write key, T not a multiple of C and a nonzero
// initial state. Both are exact rewritings of one recurrence, so they differ only by rounding: with fp32
// (eps 6e-8) and sums of ~K*C terms we allow 2e-5 of each tensor's scale.
static void test_chunk_vs_token_fp32(void) {
    int B = 2, T = 150, H = 2, K = 16, V = 24, C = 64, NC = (T + C - 1) / C;
    size_t N = (size_t)B * T, nS = (size_t)B * H * K * V;
    for (int kind = 0; kind < 3; kind++) {
        int gk = kind == 0 ? 0 : kind == 1 ? 1 : K;
        real *q = mallocCheck(N * H * K * sizeof(real)), *k = mallocCheck(N * H * K * sizeof(real));
        real *kt = mallocCheck(N * H * K * sizeof(real)), *v = mallocCheck(N * H * V * sizeof(real));
        real *beta = mallocCheck(N * H * sizeof(real)), *g = mallocCheck(N * H * K * sizeof(real)), *S0 = mallocCheck(nS * sizeof(real));
        real *dout = mallocCheck(N * H * V * sizeof(real)), *dSf = mallocCheck(nS * sizeof(real));
        fill_normal(q, N * H * K, 0.25); fill_normal(v, N * H * V, 1.0); fill_normal(S0, nS, 0.3);
        fill_normal(dout, N * H * V, 1.0); fill_normal(dSf, nS, 1.0);
        // unit-norm keys like the model's k̂, and k̃ = b ⊙ k̂ with b in (2/3, 3/2)
        for (size_t r = 0; r < N * H; r++) {
            double ss = 0;
            for (int j = 0; j < K; j++) { k[r * K + j] = R(nrand()); ss += k[r * K + j] * k[r * K + j]; }
            for (int j = 0; j < K; j++) { k[r * K + j] /= R(sqrt(ss)); kt[r * K + j] = k[r * K + j] * R(2.0 / 3.0 + (1.5 - 2.0 / 3.0) * urand()); }
        }
        for (size_t i = 0; i < N * H; i++) { beta[i] = R(urand()); }
        for (size_t i = 0; i < N * H * K; i++) { g[i] = R(-0.3 * urand()); }
        real *o[2], *Sf[2], *st[2], *gr[2][7];
        size_t gsz[7] = {N * H * K, N * H * K, N * H * K, N * H * V, N * H, N * H * (gk ? gk : 1), nS};
        for (int f = 0; f < 2; f++) {
            o[f] = mallocCheck(N * H * V * sizeof(real));
            Sf[f] = mallocCheck(nS * sizeof(real));
            st[f] = mallocCheck((size_t)B * H * (NC + 1) * K * V * sizeof(real));
            for (int i = 0; i < 7; i++) { gr[f][i] = callocCheck(gsz[i], sizeof(real)); }
            delta_forward(o[f], st[f], q, k, kt, v, beta, gk ? g : NULL, S0, Sf[f], B, T, H, K, V, gk, C, f);
            delta_backward(gr[f][0], gr[f][1], gr[f][2], gr[f][3], gr[f][4], gk ? gr[f][5] : NULL, gr[f][6], dout, dSf,
                           q, k, kt, v, beta, gk ? g : NULL, st[f], B, T, H, K, V, gk, C, f);
        }
        const char* nm[7] = {"dq", "dk", "dkt", "dv", "dbeta", "dg", "dS0"};
        double eo = rel_err(o[1], o[0], N * H * V), es = rel_err(Sf[1], Sf[0], nS), worst = fmax(eo, es);
        CHECK(eo < 2e-5, "decay %d: chunk vs token outputs rel err %.2e", kind, eo);
        CHECK(es < 2e-5, "decay %d: chunk vs token final state rel err %.2e", kind, es);
        for (int i = 0; i < 7; i++) {
            if (i == 5 && !gk) { continue; }
            double e = rel_err(gr[1][i], gr[0][i], gsz[i]);
            worst = fmax(worst, e);
            CHECK(e < 2e-5, "decay %d: chunk vs token %s rel err %.2e", kind, nm[i], e);
        }
        printf("  %-7s decay: T=%d, C=%d, nonzero S0: outputs, final state and 7 gradients agree, worst rel err %.1e\n",
               kind == 0 ? "no" : kind == 1 ? "scalar" : "channel", T, C, worst);
        for (int f = 0; f < 2; f++) { free(o[f]); free(Sf[f]); free(st[f]); for (int i = 0; i < 7; i++) { free(gr[f][i]); } }
        free(q); free(k); free(kt); free(v); free(beta); free(g); free(S0); free(dout); free(dSf);
    }
}

// Recurrent inference: feeding a sequence as a prompt chunk plus one token at a time with the carried state must
// give the logits of one full forward pass (fp32: 1e-4 of the logits' scale).
static void test_recurrent_matches_full(const char* variant, int exact) {
    PdnConfig c = small_config(variant, exact, 1);
    Model m;
    model_init(&m, &c, 4, 1);
    randomize_params(&m);
    int T = 23, P = 9; // the prompt spans 2 chunks and a part
    int x[23];
    for (int i = 0; i < T; i++) { x[i] = (int)rng_below(&trng, c.vocab_size); }
    Acts full = acts_alloc(&m, 1, T, 0), ap = acts_alloc(&m, 1, P, 0), a1 = acts_alloc(&m, 1, 1, 0);
    pdn_forward(&m, &full, x, NULL);
    RecState rs = recstate_alloc(&c, 1, c.ridge);
    real* got = mallocCheck((size_t)T * c.vocab_size * sizeof(real));
    pdn_forward(&m, &ap, x, &rs);
    memcpy(got, ap.logits, (size_t)P * c.vocab_size * sizeof(real));
    for (int t = P; t < T; t++) {
        pdn_forward(&m, &a1, &x[t], &rs);
        memcpy(got + (size_t)t * c.vocab_size, a1.logits, c.vocab_size * sizeof(real));
    }
    double e = rel_err(got, full.logits, (size_t)T * c.vocab_size);
    CHECK(e < 1e-4, "%s%s: recurrent logits vs full forward rel err %.2e", variant, exact ? "-exact" : "", e);
    printf("  %-10s prompt of %d then %d single tokens: logits match the full pass (rel err %.1e)\n",
           exact ? "pgdn-exact" : variant, P, T - P, e);
    free(got); recstate_free(&rs); acts_free(&full); acts_free(&ap); acts_free(&a1); model_free(&m);
}

static void test_mqar_generator(void) {
    MqarConfig mq = {128, 64, 8, 0.01f};
    CHECK(mqar_check(&mq) == NULL, "valid MQAR config rejected");
    MqarConfig bad = {16, 64, 8, 0.01f};
    CHECK(mqar_check(&bad) != NULL, "MQAR with 8 pairs over vocab 16 (7 keys) accepted");
    MqarConfig bad2 = {128, 20, 8, 0.01f};
    CHECK(mqar_check(&bad2) != NULL, "MQAR with 8 pairs in 20 tokens accepted");
    int B = 50, T = 64, x[50 * 64], y[50 * 64];
    Rng r;
    rng_seed(&r, 5);
    mqar_batch(&mq, &r, B, x, y);
    int ok = 1, early = 0, total = 0;
    for (int b = 0; b < B; b++) {
        int *xb = x + b * T, *yb = y + b * T, nt = 0;
        for (int i = 0; i < 8; i++) {
            ok &= xb[2 * i] >= 1 && xb[2 * i] < 64 && xb[2 * i + 1] >= 64 && xb[2 * i + 1] < 128;
            for (int j = 0; j < i; j++) { ok &= xb[2 * i] != xb[2 * j] && xb[2 * i + 1] != xb[2 * j + 1]; }
        }
        for (int t = 0; t < T; t++) {
            if (yb[t] < 0) { continue; }
            nt++;
            ok &= t >= 16 && (t - 16) % 2 == 0;
            int found = 0; // the target is the value stored with the queried key
            for (int i = 0; i < 8; i++) { if (xb[2 * i] == xb[t]) { found = 1; ok &= yb[t] == xb[2 * i + 1]; } }
            ok &= found;
            early += t < 16 + 2 * 12;
            total++;
        }
        ok &= nt == 8;
    }
    CHECK(ok, "MQAR examples malformed (keys/values/targets/positions)");
    // the power law favours early query slots: under uniform placement 12 of 24 slots would get ~50%
    CHECK(early > 0.6 * total, "MQAR query placement not front-loaded: %d of %d in the first half", early, total);
    printf("  MQAR generator: %d examples, 8 distinct key/value pairs each, every target = value of its key, "
           "%.0f%% of queries in the first half of the slots\n", B, 100.0 * early / total);
}

// ---- subprocess helpers: run ./train_pdn and inspect exit code and output

static int run_cmd(const char* cmd, char* out, size_t outn) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE* p = popen(full, "r");
    if (!p) { return -1; }
    size_t n = 0;
    int ch;
    while ((ch = fgetc(p)) != EOF) { if (out && n + 1 < outn) { out[n++] = (char)ch; } }
    if (out) { out[n] = 0; }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char outbuf[1 << 20];

static void last_line(const char* s, char* line, size_t n) {
    size_t len = strlen(s);
    while (len && s[len - 1] == '\n') { len--; }
    size_t st = len;
    while (st && s[st - 1] != '\n') { st--; }
    size_t l = len - st < n - 1 ? len - st : n - 1;
    memcpy(line, s + st, l);
    line[l] = 0;
}

static void test_count_params(void) {
    struct { const char* preset; const char* count; } want[] = {
        {"dn-340m", "341594112"}, {"pdn-340m", "341987904"}, {"gdn-340m", "341791104"}, {"pgdn-340m", "342184896"},
        {"kda-340m", "354226368"}, {"pkda-340m", "354620160"}, {"gdn-1b", "995009952"}, {"pgdn-1b", "996215184"},
        {"kda-1b", "995186832"}, {"pkda-1b", "996392064"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char cmd[256], line[256];
        snprintf(cmd, sizeof cmd, "./train_pdn --preset %s --count-params", want[i].preset);
        int rc = run_cmd(cmd, outbuf, sizeof outbuf);
        last_line(outbuf, line, sizeof line);
        CHECK(rc == 0 && strcmp(line, want[i].count) == 0, "%s: --count-params printed '%s' (rc %d), SPEC §7 says %s",
              want[i].preset, line, rc, want[i].count);
    }
    printf("  --count-params matches SPEC §7 for the %zu listed presets\n", sizeof(want) / sizeof(want[0]));
}

static int files_equal(const char* a, const char* b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) { eq = 0; }
        if (ca == EOF || cb == EOF) { break; }
    }
    if (fa) { fclose(fa); }
    if (fb) { fclose(fb); }
    return eq;
}

// the lines of main.log starting with "s:<step> trl:" for steps in [from, to]
static void log_losses(const char* dir, int from, int to, char* out, size_t n) {
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/main.log", dir);
    out[0] = 0;
    FILE* f = fopen(path, "r");
    if (!f) { return; }
    while (fgets(line, sizeof line, f)) {
        int s;
        if (sscanf(line, "s:%d trl:", &s) == 1 && strstr(line, "trl:") && s >= from && s <= to) {
            char* ms = strstr(line, " ms:"); // timing differs between runs
            if (ms) { *ms = '\n'; ms[1] = 0; }
            strncat(out, line, n - strlen(out) - 1);
        }
    }
    fclose(f);
}

static char la[1 << 16], lb[1 << 16];

static void test_checkpoints_and_resume(void) {
    const char* base = "/tmp/pdn_test_ckpt";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", base, base);
    CHECK(system(cmd) == 0, "cannot make %s", base);
    const char* flags = "--preset pgdn-tiny -b 4 -t 32 -d 256 --mqar-pairs 4 -x 12 -n 6 -v 0 -m 1";
    // uninterrupted run A (2 threads), checkpoints at 6 and 12
    snprintf(cmd, sizeof cmd, "./train_pdn %s --threads 2 -o %s/a", flags, base);
    CHECK(run_cmd(cmd, outbuf, sizeof outbuf) == 0, "training run A failed:\n%s", outbuf);
    // run B: same flags, one thread: bit-identical losses and parameters (determinism across thread counts)
    snprintf(cmd, sizeof cmd, "./train_pdn %s --threads 1 -o %s/b", flags, base);
    CHECK(run_cmd(cmd, outbuf, sizeof outbuf) == 0, "training run B failed:\n%s", outbuf);
    log_losses(".", 0, 0, la, sizeof la);
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/a", base); snprintf(pb, sizeof pb, "%s/b", base);
    log_losses(pa, 1, 12, la, sizeof la);
    log_losses(pb, 1, 12, lb, sizeof lb);
    CHECK(la[0] && strcmp(la, lb) == 0, "same seed, 2 vs 1 threads: losses differ:\n%s---\n%s", la, lb);
    snprintf(pa, sizeof pa, "%s/a/model_00000012.bin", base); snprintf(pb, sizeof pb, "%s/b/model_00000012.bin", base);
    CHECK(files_equal(pa, pb), "same seed, 2 vs 1 threads: final checkpoints differ");
    printf("  determinism: 12 steps with 2 threads and with 1 thread give identical losses and identical checkpoints\n");
    // resume: copy A's step-6 files into c, resume to 12; losses 7..12 and the final checkpoint must equal A's
    snprintf(cmd, sizeof cmd, "mkdir -p %s/c && cp %s/a/model_00000006.bin %s/a/state_00000006.bin %s/c/", base, base, base, base);
    CHECK(system(cmd) == 0, "copy failed");
    snprintf(cmd, sizeof cmd, "./train_pdn %s -o %s/c -y 1", flags, base);
    CHECK(run_cmd(cmd, outbuf, sizeof outbuf) == 0 && strstr(outbuf, "resuming from"), "resume run failed:\n%s", outbuf);
    snprintf(pa, sizeof pa, "%s/a", base); snprintf(pb, sizeof pb, "%s/c", base);
    log_losses(pa, 7, 12, la, sizeof la);
    log_losses(pb, 7, 12, lb, sizeof lb);
    CHECK(la[0] && strcmp(la, lb) == 0, "resumed losses differ from the uninterrupted run:\n%s---\n%s", la, lb);
    snprintf(pa, sizeof pa, "%s/a/model_00000012.bin", base); snprintf(pb, sizeof pb, "%s/c/model_00000012.bin", base);
    CHECK(files_equal(pa, pb), "resumed run's final checkpoint differs from the uninterrupted run's");
    snprintf(pa, sizeof pa, "%s/a/state_00000012.bin", base); snprintf(pb, sizeof pb, "%s/c/state_00000012.bin", base);
    CHECK(files_equal(pa, pb), "resumed run's final optimizer state differs from the uninterrupted run's");
    printf("  resume: steps 7-12 after resuming from step 6 reproduce the uninterrupted losses, parameters and moments bit for bit\n");
    // changing the batch on resume is refused
    snprintf(cmd, sizeof cmd, "./train_pdn --preset pgdn-tiny -b 2 -t 32 --mqar-pairs 4 -x 12 -o %s/c -y 1", base);
    int rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "same batch settings"), "resume with another -b: rc %d, output:\n%s", rc, outbuf);

    // checkpoint round trip in-process: write, read back, bit-exact, same config and layout
    snprintf(pa, sizeof pa, "%s/a/model_00000012.bin", base);
    PdnConfig c;
    PdnLayout lay;
    real* params;
    uint32_t crc;
    long step = pdn_checkpoint_read(pa, &c, &lay, &params, &crc);
    snprintf(pb, sizeof pb, "%s/rt.bin", base);
    uint32_t crc2 = pdn_checkpoint_write(pb, &c, &lay, params, REAL_DTYPE, step);
    PdnConfig c2;
    PdnLayout lay2;
    real* params2;
    pdn_checkpoint_read(pb, &c2, &lay2, &params2, NULL);
    CHECK(step == 12 && crc == crc2 && memcmp(&c, &c2, sizeof c) == 0 && memcmp(params, params2, lay.num_elems * sizeof(real)) == 0
          && files_equal(pa, pb), "checkpoint round trip is not bit-exact");
    printf("  checkpoint round trip: read + write + read gives the identical file, config and parameters\n");

    // corrupted, truncated, wrong magic, wrong version, wrong kind of file: refused with a reason, exit code 2
    struct { const char* what; const char* edit; const char* expect; } bad[] = {
        {"one flipped data byte", "printf '\\x55' | dd of=%s bs=1 seek=5000 conv=notrunc 2>/dev/null", "checksum mismatch"},
        {"truncated", "truncate -s 4500 %s", "truncated"},
        {"wrong magic", "printf 'XDNCKPT' | dd of=%s bs=1 seek=0 conv=notrunc 2>/dev/null", "bad magic"},
        {"wrong version", "printf '9' | dd of=%s bs=1 seek=16 conv=notrunc 2>/dev/null", "version 9"},
        {"edited config value", "sed -i 's/config squash_x 1.5/config squash_x 1.6/' %s", "checksum mismatch"},
        {"a state file given as model", NULL, "bad magic"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char f[512];
        snprintf(f, sizeof f, "%s/bad%zu.bin", base, i);
        if (bad[i].edit) {
            snprintf(cmd, sizeof cmd, "cp %s/a/model_00000012.bin %s && ", base, f);
            size_t l = strlen(cmd);
            snprintf(cmd + l, sizeof cmd - l, bad[i].edit, f);
        } else {
            snprintf(cmd, sizeof cmd, "cp %s/a/state_00000012.bin %s", base, f);
        }
        CHECK(system(cmd) == 0, "could not prepare %s", bad[i].what);
        snprintf(cmd, sizeof cmd, "./train_pdn -e %s --generate 2 --prompt 1", f);
        rc = run_cmd(cmd, outbuf, sizeof outbuf);
        CHECK(rc == EXIT_BADFILE && strstr(outbuf, bad[i].expect) && strncmp(outbuf, "error: ", 7) == 0,
              "%s: expected exit %d with '%s', got rc %d:\n%s", bad[i].what, EXIT_BADFILE, bad[i].expect, rc, outbuf);
    }
    printf("  bad checkpoints (flipped byte, truncated, wrong magic, wrong version, edited header, state file) are refused, exit 2\n");
    // a crash while writing (simulated: a stale .tmp) leaves the previous checkpoint usable
    snprintf(cmd, sizeof cmd, "head -c 100 %s/a/model_00000012.bin > %s/a/model_00000012.bin.tmp && ./train_pdn -e %s/a/model_00000012.bin --generate 3 --prompt '1 2'", base, base, base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == 0, "checkpoint unusable next to a torn temporary file: rc %d\n%s", rc, outbuf);
    free(params); free(params2);
}

static void test_cli_errors(void) {
    struct { const char* args; int rc; const char* expect; } cases[] = {
        {"--bogus 1", EXIT_USAGE, "unknown flag '--bogus'"},
        {"-b 4 -t 32 -d 1000", EXIT_USAGE, "not a positive multiple"},
        {"-b 0", EXIT_USAGE, "-b (micro-batch) must be >= 1"},
        {"--preset nope-tiny", EXIT_USAGE, "unknown preset"},
        {"--mixer fast", EXIT_USAGE, "--mixer must be chunk or token"},
        {"--decay lots", EXIT_USAGE, "bad value 'lots' for --decay"},
        {"-t 20 --mqar-pairs 8", EXIT_USAGE, "too short for 8 pairs"},
        {"-l", EXIT_USAGE, "needs a value"},
        {"-e /nonexistent.bin --generate 1 --prompt 1", EXIT_BADFILE, "cannot open"},
        {"--vocab 64 --mqar-vocab 128", EXIT_USAGE, "larger than the model's vocabulary"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./train_pdn -x 1 %s", cases[i].args);
        int rc = run_cmd(cmd, outbuf, sizeof outbuf);
        CHECK(rc == cases[i].rc && strstr(outbuf, cases[i].expect), "'%s': expected rc %d and '%s', got rc %d:\n%s",
              cases[i].args, cases[i].rc, cases[i].expect, rc, outbuf);
    }
    printf("  %zu kinds of bad command line get a one-line reason and a nonzero exit\n", sizeof(cases) / sizeof(cases[0]));
}

// A tiny PGDN learns MQAR: held-out recall accuracy far above chance (1/32 = 3%) within a bounded budget.
static void test_mqar_learns(void) {
    const char* dir = "/tmp/pdn_test_mqar";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && ./train_pdn --preset pgdn-tiny --mqar-vocab 64 --mqar-pairs 4 -t 32 -b 16 "
             "-x 250 -l 3e-3 -u 20 -v 0 -m 16 -o %s", dir, dir);
    double t0 = wall_seconds();
    int rc = run_cmd(cmd, outbuf, sizeof outbuf);
    double acc = -1;
    char* p = strstr(outbuf, "recall accuracy");
    while (p) { sscanf(p, "recall accuracy %lf", &acc); p = strstr(p + 1, "recall accuracy"); }
    CHECK(rc == 0 && acc > 50.0, "tiny PGDN on MQAR (4 pairs, vocab 64, 250 steps): held-out accuracy %.2f%% (rc %d), "
          "expected > 50%% (chance ~3%%)", acc, rc);
    printf("  tiny PGDN, MQAR 4 pairs / vocab 64 / length 32, 250 steps: held-out recall %.1f%% (chance ~3%%) in %.0f s\n",
           acc, wall_seconds() - t0);
}

static void run_float_tests(void) {
    printf("chunkwise vs per-token mixer (fp32):\n");
    test_chunk_vs_token_fp32();
    printf("recurrent inference vs full forward (fp32):\n");
    const char* variants[] = {"dn", "pdn", "gdn", "pgdn", "kda", "pkda"};
    for (int v = 0; v < 6; v++) { test_recurrent_matches_full(variants[v], 0); }
    test_recurrent_matches_full("pgdn", 1);
    printf("MQAR:\n");
    test_mqar_generator();
    if (!file_exists("./train_pdn")) {
        n_fail++;
        printf("FAIL: ./train_pdn not found: the end-to-end tests need it (run 'make test' from the repository root)\n");
        return;
    }
    printf("parameter counts:\n");
    test_count_params();
    printf("checkpoints, resume, determinism:\n");
    test_checkpoints_and_resume();
    printf("command line:\n");
    test_cli_errors();
    printf("learning:\n");
    test_mqar_learns();
}
#endif

int main(void) {
    rng_seed(&trng, 20261130);
    double t0 = wall_seconds();
#ifdef PDN_DOUBLE
    printf("== test_pdn64 (real = double) ==\n");
    run_double_tests();
#else
    printf("== test_pdn (real = float) ==\n");
    run_float_tests();
#endif
    printf("%d checks, %d failed (%.1f s)\n", n_checks, n_fail, wall_seconds() - t0);
    if (n_fail) { printf("TESTS FAILED\n"); return 1; }
    printf("ALL OK\n");
    return 0;
}
