/*
train_pdn.c: the CPU reference of pdn.c. It defines the Preconditioned DeltaNet model family (DN, PDN, GDN,
PGDN, KDA, PKDA) and how it is trained, in fp32 C with OpenMP. The CUDA trainer (train_pdn.cu) mirrors it and
is tested against it. The model is defined in MODEL.md; section numbers below refer to it.

Read it top to bottom:
  1. layers: one forward/backward pair per op (backward functions always ACCUMULATE into their outputs)
  2. the mixer: preconditioners (diagonal MODEL.md §3.6, exact MODEL.md §5), then the delta rule in its two forms,
     per token (MODEL.md §3, the definition) and chunkwise (MODEL.md §4, the fast algorithm), forward and backward;
     2b. softmax attention with the rotary embedding, the layer kind of --attn-layers (hybrid models)
  3. the model: parameters (layout from pdn.h), activations, forward, backward, AdamW
  4. recurrent inference and sampling
  5. training: the calls train_common.h's run makes on this model (a step, an evaluation batch, generation,
     what a checkpoint saves), then main()

Determinism: every parallel loop writes disjoint outputs and every sum runs in a fixed order, so the same
seed gives bit-identical losses whatever the number of threads.
*/
#include <tgmath.h>   // exp/log/sqrt act on `real` (float, or double in the gradient-check build)
#undef I              // tgmath.h brings complex.h's imaginary unit; I is the MLP width here
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include "pdn.h"
#include "mqar.h"
#include "train_common.h"

#define R(x) ((real)(x))
#define L2NORM_EPS 1e-6   // MODEL.md §3.3, fixed
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline real sigmoidr(real x) { return R(1) / (R(1) + exp(-x)); }
static inline real softplus(real x) { return x > R(20) ? x : log1p(exp(x)); }

// ----------------------------------------------------------------------------------------------------
// 1. layers

// out (M, N) = a (M, Kd) @ b (Kd, N) (or +=), all row-major. Register-blocked: an 8 x 32 tile of out lives in
// vector registers while k runs (16 AVX-512 or 32 AVX2 registers), a panel of b's 32 columns stays in L2 while
// the row blocks stream past it. Full tiles take the fixed-size path the compiler unrolls; edges the generic one.
// Each output sums over k in order, so the result does not depend on the number of threads.
#define MM_ROWS 8
#define MM_COLS 32
static void matmul_ab(real* out, const real* a, const real* b, int M, int Kd, int N, int accumulate) {
    int mblocks = (M + MM_ROWS - 1) / MM_ROWS, nblocks = (N + MM_COLS - 1) / MM_COLS;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int nb = 0; nb < nblocks; nb++) {
        for (int mb = 0; mb < mblocks; mb++) {
            int m0 = mb * MM_ROWS, n0 = nb * MM_COLS;
            int mr = imin(MM_ROWS, M - m0), nc = imin(MM_COLS, N - n0);
            real acc[MM_ROWS][MM_COLS];
            memset(acc, 0, sizeof(acc));
            const real* ab = a + (size_t)m0 * Kd;
            if (mr == MM_ROWS && nc == MM_COLS) {
                for (int k = 0; k < Kd; k++) {
                    const real* brow = b + (size_t)k * N + n0;
                    for (int r = 0; r < MM_ROWS; r++) {
                        real x = ab[(size_t)r * Kd + k];
                        for (int j = 0; j < MM_COLS; j++) { acc[r][j] += x * brow[j]; }
                    }
                }
            } else {
                for (int k = 0; k < Kd; k++) {
                    const real* brow = b + (size_t)k * N + n0;
                    for (int r = 0; r < mr; r++) {
                        real x = ab[(size_t)r * Kd + k];
                        for (int j = 0; j < nc; j++) { acc[r][j] += x * brow[j]; }
                    }
                }
            }
            for (int r = 0; r < mr; r++) {
                real* o = out + (size_t)(m0 + r) * N + n0;
                if (accumulate) { for (int j = 0; j < nc; j++) { o[j] += acc[r][j]; } }
                else { for (int j = 0; j < nc; j++) { o[j] = acc[r][j]; } }
            }
        }
    }
}

// dst (cols, rows) = src (rows, cols)ᵀ
static void transpose(real* dst, const real* src, int rows, int cols) {
    #pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < rows; r0 += 32) {
        for (int c0 = 0; c0 < cols; c0 += 32) {
            for (int r = r0; r < imin(r0 + 32, rows); r++) {
                for (int c = c0; c < imin(c0 + 32, cols); c++) { dst[(size_t)c * rows + r] = src[(size_t)r * cols + c]; }
            }
        }
    }
}

// A grow-only scratch buffer for the transposes of the matmul wrappers (called from serial code only):
// allocating per call would page-fault hundreds of MB per step at the 340m shapes.
static real* mm_scratch = NULL;
static size_t mm_scratch_n = 0;
static real* matmul_scratch(size_t n) {
    if (n > mm_scratch_n) {
        free(mm_scratch);
        mm_scratch = (real*)mallocCheck(n * sizeof(real));
        mm_scratch_n = n;
    }
    return mm_scratch;
}

// out (N, OC) = inp (N, C) @ w (OC, C)ᵀ + bias (OC, optional)
static void matmul_forward(real* out, const real* inp, const real* w, const real* bias, int N, int C, int OC) {
    real* wt = matmul_scratch((size_t)C * OC); // (C, OC)
    transpose(wt, w, OC, C);
    matmul_ab(out, inp, wt, N, C, OC, 0);
    if (bias) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) { for (int o = 0; o < OC; o++) { out[(size_t)n * OC + o] += bias[o]; } }
    }
}

// dinp (N, C) += dout @ w;  dw (OC, C) += doutᵀ @ inp;  dbias (OC) += column sums of dout
static void matmul_backward(real* dinp, real* dw, real* dbias, const real* dout, const real* inp, const real* w,
                            int N, int C, int OC) {
    if (dinp) { matmul_ab(dinp, dout, w, N, OC, C, 1); }
    real* dt = matmul_scratch((size_t)N * OC); // (OC, N)
    transpose(dt, dout, N, OC);
    matmul_ab(dw, dt, inp, OC, N, C, 1);
    if (dbias) {
        #pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            real s = 0;
            for (int n = 0; n < N; n++) { s += dt[(size_t)o * N + n]; }
            dbias[o] += s;
        }
    }
}

// out (N, C) = inp * rsqrt(mean(inp²) + eps) * w;  rstd (N)
static void rmsnorm_forward(real* out, real* rstd, const real* inp, const real* w, size_t N, int C, real eps) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = inp + n * C;
        real ss = 0;
        for (int c = 0; c < C; c++) { ss += x[c] * x[c]; }
        real r = R(1) / sqrt(ss / C + eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) { out[n * C + c] = x[c] * r * w[c]; }
    }
}

static void rmsnorm_backward(real* dinp, real* dw, const real* dout, const real* inp, const real* w, const real* rstd,
                             size_t N, int C) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real *x = inp + n * C, *dy = dout + n * C;
        real r = rstd[n], dot = 0;
        for (int c = 0; c < C; c++) { dot += dy[c] * w[c] * x[c]; }
        real k = r * r * r * dot / C;
        for (int c = 0; c < C; c++) { dinp[n * C + c] += r * dy[c] * w[c] - k * x[c]; }
    }
    // dw: every thread owns a block of columns and sums over rows in order
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = imin(c0 + 16, C);
        for (size_t n = 0; n < N; n++) {
            for (int c = c0; c < c1; c++) { dw[c] += dout[n * C + c] * inp[n * C + c] * rstd[n]; }
        }
    }
}

// out (N, d) = wte[tokens]
static void encoder_forward(real* out, const int* tokens, const real* wte, size_t N, int d) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) { memcpy(out + n * d, wte + (size_t)tokens[n] * d, d * sizeof(real)); }
}

static void encoder_backward(real* dwte, const real* dout, const int* tokens, size_t N, int d) {
    // a token can repeat: threads own column blocks, rows are summed in order
    #pragma omp parallel for
    for (int c0 = 0; c0 < d; c0 += 16) {
        int c1 = imin(c0 + 16, d);
        for (size_t n = 0; n < N; n++) {
            real* dst = dwte + (size_t)tokens[n] * d;
            for (int c = c0; c < c1; c++) { dst[c] += dout[n * d + c]; }
        }
    }
}

// Depthwise causal convolution then SiLU (MODEL.md §3.2). z, pre, out: (B, T, Ch); w: (Ch, cs).
// pre[t] = Σ_i w[i] z[t-cs+1+i]; positions before the sequence come from hist (B, cs-1, Ch; oldest first) or are 0.
// doc (B, T) or NULL: with packed documents, the window position where token t's document starts (doc_starts);
// positions before it count as 0, as if the document were a sequence of its own.
static void conv_silu_forward(real* pre, real* out, const real* z, const real* w, const real* hist, const int* doc,
                              int B, int T, int Ch, int cs) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real* p = pre + ((size_t)b * T + t) * Ch;
            real* o = out + ((size_t)b * T + t) * Ch;
            for (int c = 0; c < Ch; c++) { p[c] = 0; }
            for (int i = 0; i < cs; i++) {
                int s = t - (cs - 1) + i;
                const real* zs;
                if (doc && s < doc[(size_t)b * T + t]) { continue; }
                if (s >= 0) { zs = z + ((size_t)b * T + s) * Ch; }
                else if (hist) { zs = hist + ((size_t)b * (cs - 1) + (cs - 1 + s)) * Ch; }
                else { continue; }
                for (int c = 0; c < Ch; c++) { p[c] += w[(size_t)c * cs + i] * zs[c]; }
            }
            for (int c = 0; c < Ch; c++) { o[c] = p[c] * sigmoidr(p[c]); }
        }
    }
}

// training only (no history): dz (B,T,Ch) +=, dw (Ch, cs) +=, from dout = grad of the SiLU output
static void conv_silu_backward(real* dz, real* dw, const real* dout, const real* pre, const real* z, const real* w,
                               const int* doc, int B, int T, int Ch, int cs) {
    size_t N = (size_t)B * T;
    real* dpre = (real*)mallocCheck(N * Ch * sizeof(real));
    #pragma omp parallel for
    for (size_t i = 0; i < N * Ch; i++) {
        real s = sigmoidr(pre[i]);
        dpre[i] = dout[i] * s * (R(1) + pre[i] * (R(1) - s));
    }
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < T; s++) {
            real* d = dz + ((size_t)b * T + s) * Ch;
            for (int i = 0; i < cs; i++) {
                int t = s + (cs - 1) - i; // output position that read z[s] through tap i
                if (t >= T || (doc && s < doc[(size_t)b * T + t])) { continue; }
                const real* dp = dpre + ((size_t)b * T + t) * Ch;
                for (int c = 0; c < Ch; c++) { d[c] += w[(size_t)c * cs + i] * dp[c]; }
            }
        }
    }
    #pragma omp parallel for
    for (int c = 0; c < Ch; c++) {
        for (int i = 0; i < cs; i++) {
            real acc = 0;
            for (int b = 0; b < B; b++) {
                for (int t = 0; t < T; t++) {
                    int s = t - (cs - 1) + i;
                    if (s < 0 || (doc && s < doc[(size_t)b * T + t])) { continue; }
                    acc += dpre[((size_t)b * T + t) * Ch + c] * z[((size_t)b * T + s) * Ch + c];
                }
            }
            dw[(size_t)c * cs + i] += acc;
        }
    }
    free(dpre);
}

// L2 normalisation of rows of length K (MODEL.md §3.3): out = scale * x / sqrt(Σx² + 1e-6); rstd per row
static void l2norm_forward(real* out, real* rstd, const real* inp, size_t rows, int K, real scale) {
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
        const real* x = inp + r * K;
        real ss = 0;
        for (int j = 0; j < K; j++) { ss += x[j] * x[j]; }
        real rs = R(1) / sqrt(ss + R(L2NORM_EPS));
        rstd[r] = rs;
        for (int j = 0; j < K; j++) { out[r * K + j] = x[j] * rs * scale; }
    }
}

// out = scale * y with y = x * rstd: dx = rstd * (dy - y (dy·y)) with dy = scale * dout, and dy·y = dout·out
static void l2norm_backward(real* dinp, const real* dout, const real* out, const real* rstd, size_t rows, int K, real scale) {
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
        const real *o = out + r * K, *dy = dout + r * K;
        real dot = 0;
        for (int j = 0; j < K; j++) { dot += dy[j] * o[j]; }
        for (int j = 0; j < K; j++) { dinp[r * K + j] += rstd[r] * (scale * dy[j] - o[j] * dot / scale); }
    }
}

// sigmoid gate (MODEL.md §3.4): out = bmax * sigmoid(pre), bmax = 2 with allow_neg_eigval
static void sigmoid_gate_forward(real* out, const real* pre, size_t n, real bmax) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { out[i] = bmax * sigmoidr(pre[i]); }
}

static void sigmoid_gate_backward(real* dpre, const real* dout, const real* out, size_t n, real bmax) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real s = out[i] / bmax;
        dpre[i] += dout[i] * bmax * s * (R(1) - s);
    }
}

// log-space decay gate (MODEL.md §3.5, §3.6): g[n,h,j] = -exp(A_log[h]) * softplus(pre[n,h,j] + dt_bias[h*gk+j])
// pre, g: (N, H, gk)
static void decay_gate_forward(real* g, const real* pre, const real* a_log, const real* dt_bias, size_t N, int H, int gk) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (int h = 0; h < H; h++) {
            real a = -exp(a_log[h]);
            for (int j = 0; j < gk; j++) {
                size_t i = (n * H + h) * gk + j;
                g[i] = a * softplus(pre[i] + dt_bias[h * gk + j]);
            }
        }
    }
}

static void decay_gate_backward(real* dpre, real* da_log, real* ddt_bias, const real* dg, const real* g, const real* pre,
                                const real* a_log, const real* dt_bias, size_t N, int H, int gk) {
    // d/dpre = -exp(A_log) * sigmoid(pre + dt_bias);  d/dA_log = g
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (int h = 0; h < H; h++) {
            for (int j = 0; j < gk; j++) {
                size_t i = (n * H + h) * gk + j;
                dpre[i] += dg[i] * -exp(a_log[h]) * sigmoidr(pre[i] + dt_bias[h * gk + j]);
            }
        }
    }
    #pragma omp parallel for
    for (int h = 0; h < H; h++) {
        real sa = 0;
        for (int j = 0; j < gk; j++) {
            real sb = 0;
            for (size_t n = 0; n < N; n++) {
                size_t i = (n * H + h) * gk + j;
                sb += dg[i] * -exp(a_log[h]) * sigmoidr(pre[i] + dt_bias[h * gk + j]);
                sa += dg[i] * g[i];
            }
            ddt_bias[h * gk + j] += sb;
        }
        da_log[h] += sa;
    }
}

// out = x ⊙ sigmoid(z) (the KDA output gate, MODEL.md §3.8)
static void sigmoid_mul_forward(real* out, const real* x, const real* z, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { out[i] = x[i] * sigmoidr(z[i]); }
}

static void sigmoid_mul_backward(real* dx, real* dz, const real* dout, const real* x, const real* z, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real s = sigmoidr(z[i]);
        dx[i] += dout[i] * s;
        dz[i] += dout[i] * x[i] * s * (R(1) - s);
    }
}

// SwiGLU (MODEL.md §2): out = silu(gate) ⊙ up
static void swiglu_forward(real* out, const real* gate, const real* up, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { out[i] = gate[i] * sigmoidr(gate[i]) * up[i]; }
}

static void swiglu_backward(real* dgate, real* dup, const real* dout, const real* gate, const real* up, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real s = sigmoidr(gate[i]);
        dgate[i] += dout[i] * up[i] * s * (R(1) + gate[i] * (R(1) - s));
        dup[i] += dout[i] * gate[i] * s;
    }
}

static void add_inplace(real* a, const real* b, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { a[i] += b[i]; }
}

// Softmax cross-entropy. logits (N, Vv) are turned into probabilities in place; losses (N). Positions whose
// target is < 0 have no loss (loss 0). Returns the sum of the losses; *count = positions with a target.
static double crossentropy_forward(real* logits, real* losses, const int* targets, size_t N, int Vv, long* count) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        real* x = logits + n * Vv;
        real mx = x[0];
        for (int i = 1; i < Vv; i++) { mx = x[i] > mx ? x[i] : mx; }
        real sum = 0;
        for (int i = 0; i < Vv; i++) { x[i] = exp(x[i] - mx); sum += x[i]; }
        int t = targets[n];
        losses[n] = t >= 0 ? log(sum) - log(x[t]) : R(0);
        for (int i = 0; i < Vv; i++) { x[i] /= sum; }
    }
    double s = 0.0;
    long c = 0;
    for (size_t n = 0; n < N; n++) { if (targets[n] >= 0) { s += losses[n]; c++; } }
    *count = c;
    return s;
}

// in place: probs -> dlogits = (probs - onehot) * scale for positions with a target, 0 elsewhere
static void crossentropy_backward(real* probs, const int* targets, size_t N, int Vv, real scale) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        real* p = probs + n * Vv;
        int t = targets[n];
        if (t < 0) { memset(p, 0, Vv * sizeof(real)); continue; }
        for (int i = 0; i < Vv; i++) { p[i] *= scale; }
        p[t] -= scale;
    }
}

// ----------------------------------------------------------------------------------------------------
// 2. the mixer
//
// Shapes (N = B*T): q, k, kt (B, T, H, K); v, o (B, T, H, V); beta (B, T, H); g (B, T, H, gk) with gk = 0 (no
// decay), 1 (scalar decay, one value per head) or K (channel decay). q is already L2-normalised and scaled by
// K^-1/2, k is L2-normalised (k̂), kt is the preconditioned write key k̃ (== k without a preconditioner).
// Both forms keep the state at the start of every chunk of C tokens, states (B, H, NC+1, K, V), NC = ceil(T/C),
// the last entry being the final state: the backward passes recompute everything else from them.

static inline size_t bth(int b, int t, int h, int T, int H) { return ((size_t)b * T + t) * H + h; }

// Packed documents (--doc-mask 1): doc (B, T) holds, for every token, the window position where its document starts
// (doc_starts), or the pointer is NULL. A document's first token t > 0 is a boundary: the recurrent states (the
// delta-rule S, the preconditioner's a or P) restart there from their initial values, exactly as if the document
// were a sequence of its own. (t = 0 starts from the given initial state, as without documents.)
static inline int doc_boundary(const int* doc, int b, int t, int T) { return doc && t > 0 && doc[(size_t)b * T + t] == t; }

// 2a. diagonal preconditioner (MODEL.md §3.6): a_t = exp(gP_t) a_{t-1} + betaP_t k̂_t² (updated before use),
// r = log(a_t + eps) - c, s = r / (1 + |r|), b = exp(-ln(x) s), k̃ = b ⊙ k̂. gp, betap: (B,T,H); astat (B,T,H,K) keeps
// a_t for the backward. a0 (B,H,K) or NULL for zeros; a_final (B,H,K) or NULL (may equal a0). At a document boundary
// a_{t-1} is taken as 0 (its decay factor is 0).
static void precond_diag_forward(real* kt, real* astat, const real* k, const real* gp, const real* betap,
                                 const real* log_atk_scale, const real* a0, real* a_final, const int* doc,
                                 int B, int T, int H, int K, real x, real eps) {
    real lnx = log(x);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            real* a = (real*)mallocCheck(K * sizeof(real));
            for (int j = 0; j < K; j++) { a[j] = a0 ? a0[((size_t)b * H + h) * K + j] : R(0); }
            real c = log_atk_scale[h];
            for (int t = 0; t < T; t++) {
                size_t i = bth(b, t, h, T, H);
                real decay = doc_boundary(doc, b, t, T) ? R(0) : exp(gp[i]), bp = betap[i];
                for (int j = 0; j < K; j++) {
                    real kj = k[i * K + j];
                    a[j] = decay * a[j] + bp * kj * kj;
                    real r = log(a[j] + eps) - c;
                    real s = r / (R(1) + fabs(r));
                    astat[i * K + j] = a[j];
                    kt[i * K + j] = exp(-lnx * s) * kj;
                }
            }
            if (a_final) { for (int j = 0; j < K; j++) { a_final[((size_t)b * H + h) * K + j] = a[j]; } }
            free(a);
        }
    }
}

// From dkt: dk +=, dgp +=, dbetap += (per token), dlog_atk_scale (H) +=. The scan runs backwards carrying
// abar = dL/da_t; the contribution of each (b, h) to dlog_atk_scale is kept apart and summed in order.
static void precond_diag_backward(real* dk, real* dgp, real* dbetap, real* dlog_atk_scale, const real* dkt,
                                  const real* k, const real* gp, const real* betap, const real* astat,
                                  const real* log_atk_scale, const real* a0, const int* doc, int B, int T, int H, int K,
                                  real x, real eps) {
    real lnx = log(x);
    real* dc = (real*)callocCheck((size_t)B * H, sizeof(real));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            real* abar = (real*)callocCheck(K, sizeof(real));
            real c = log_atk_scale[h], dcs = 0;
            for (int t = T - 1; t >= 0; t--) {
                size_t i = bth(b, t, h, T, H);
                real decay = doc_boundary(doc, b, t, T) ? R(0) : exp(gp[i]), bp = betap[i], dg = 0, db = 0;
                for (int j = 0; j < K; j++) {
                    real kj = k[i * K + j], a = astat[i * K + j];
                    real r = log(a + eps) - c;
                    real s = r / (R(1) + fabs(r));
                    real m = exp(-lnx * s);
                    real g = dkt[i * K + j];
                    dk[i * K + j] += g * m;
                    real ds = g * kj * -lnx * m;
                    real dr = ds / ((R(1) + fabs(r)) * (R(1) + fabs(r)));
                    dcs -= dr;
                    abar[j] += dr / (a + eps);
                    real aprev = t > 0 ? astat[(i - H) * K + j] : (a0 ? a0[((size_t)b * H + h) * K + j] : R(0));
                    dg += abar[j] * aprev * decay;
                    db += abar[j] * kj * kj;
                    dk[i * K + j] += R(2) * bp * kj * abar[j];
                    abar[j] *= decay;
                }
                dgp[i] += dg;
                dbetap[i] += db;
            }
            dc[(size_t)b * H + h] = dcs;
            free(abar);
        }
    }
    for (int h = 0; h < H; h++) { for (int b = 0; b < B; b++) { dlog_atk_scale[h] += dc[(size_t)b * H + h]; } }
    free(dc);
}

// 2b. exact preconditioner (MODEL.md §5, ATK by Sherman-Morrison): P_0 = I/lambda (or P0), for every token
// w = P k̂, k̃ = w / (1 + k̂·w), P ← P - k̃ wᵀ. pstate (B,H,NC+1,K,K) keeps P at chunk starts for the backward.
// At a document boundary P restarts from I/lambda.
// w = P k, k̃ = w / (1 + k·w); returns the denominator
static real precond_exact_key(const real* P, const real* k, real* w, real* kt, int K) {
    real den = 1;
    for (int a = 0; a < K; a++) {
        real s = 0;
        for (int c = 0; c < K; c++) { s += P[a * K + c] * k[c]; }
        w[a] = s;
        den += k[a] * s;
    }
    for (int a = 0; a < K; a++) { kt[a] = w[a] / den; }
    return den;
}

static void precond_exact_reset(real* P, int K, real ridge) {
    for (size_t e = 0; e < (size_t)K * K; e++) { P[e] = (e % (K + 1) == 0) ? R(1) / ridge : R(0); }
}

static void precond_exact_step(real* P, real* w, real* kt, const real* k, int K) {
    precond_exact_key(P, k, w, kt, K);
    for (int a = 0; a < K; a++) { for (int c = 0; c < K; c++) { P[a * K + c] -= kt[a] * w[c]; } }
}

static void precond_exact_forward(real* kt, real* pstate, const real* k, const real* P0, real* P_final, const int* doc,
                                  int B, int T, int H, int K, int C, real ridge) {
    int NC = (T + C - 1) / C;
    size_t KK = (size_t)K * K;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            real* P = (real*)mallocCheck((KK + K) * sizeof(real));
            real* w = P + KK;
            if (P0) { memcpy(P, P0 + ((size_t)b * H + h) * KK, KK * sizeof(real)); }
            else { precond_exact_reset(P, K, ridge); }
            real* ps = pstate + ((size_t)b * H + h) * (NC + 1) * KK;
            for (int t = 0; t < T; t++) {
                if (t % C == 0) { memcpy(ps + (size_t)(t / C) * KK, P, KK * sizeof(real)); }
                if (doc_boundary(doc, b, t, T)) { precond_exact_reset(P, K, ridge); }
                size_t i = bth(b, t, h, T, H);
                precond_exact_step(P, w, kt + i * K, k + i * K, K);
            }
            memcpy(ps + (size_t)NC * KK, P, KK * sizeof(real));
            if (P_final) { memcpy(P_final + ((size_t)b * H + h) * KK, P, KK * sizeof(real)); }
            free(P);
        }
    }
}

// dk += from dkt, by the adjoint of each Sherman-Morrison step (P recomputed chunk by chunk from pstate; at a document
// boundary P_{t-1} is I/lambda, a constant, so no gradient flows to the tokens before it)
static void precond_exact_backward(real* dk, const real* dkt, const real* k, const real* pstate, const int* doc,
                                   int B, int T, int H, int K, int C, real ridge) {
    int NC = (T + C - 1) / C;
    size_t KK = (size_t)K * K;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            real* Ps = (real*)mallocCheck(((size_t)(C + 1) * KK + 5 * K + KK) * sizeof(real));
            real* dP = Ps + (size_t)(C + 1) * KK;
            real *w = dP + KK, *kt = w + K, *dw = kt + K, *dktl = dw + K, *tmp = dktl + K;
            memset(dP, 0, KK * sizeof(real));
            const real* ps = pstate + ((size_t)b * H + h) * (NC + 1) * KK;
            for (int ch = NC - 1; ch >= 0; ch--) {
                int t0 = ch * C, n = imin(C, T - t0);
                memcpy(Ps, ps + (size_t)ch * KK, KK * sizeof(real));
                for (int i = 0; i < n; i++) { // Ps[i] = P before token t0 + i, after a boundary's reset
                    if (doc_boundary(doc, b, t0 + i, T)) { precond_exact_reset(Ps + (size_t)i * KK, K, ridge); }
                    memcpy(Ps + (size_t)(i + 1) * KK, Ps + (size_t)i * KK, KK * sizeof(real));
                    precond_exact_step(Ps + (size_t)(i + 1) * KK, w, kt, k + bth(b, t0 + i, h, T, H) * K, K);
                }
                for (int i = n - 1; i >= 0; i--) {
                    size_t ti = bth(b, t0 + i, h, T, H);
                    const real* P = Ps + (size_t)i * KK; // P_{t-1}
                    const real* kv = k + ti * K;
                    real den = precond_exact_key(P, kv, w, kt, K);
                    for (int a = 0; a < K; a++) { dktl[a] = dkt[ti * K + a]; }
                    // P_t = P - kt wᵀ
                    for (int a = 0; a < K; a++) {
                        real s1 = 0, s2 = 0;
                        for (int c = 0; c < K; c++) { s1 += dP[a * K + c] * w[c]; s2 += dP[c * K + a] * kt[c]; }
                        dktl[a] -= s1;
                        dw[a] = -s2;
                    }
                    // kt = w / den, den = 1 + k·w
                    real dden = 0;
                    for (int a = 0; a < K; a++) { dw[a] += dktl[a] / den; dden -= dktl[a] * w[a] / (den * den); }
                    for (int a = 0; a < K; a++) { dk[ti * K + a] += dden * w[a]; dw[a] += dden * kv[a]; }
                    // w = P k: dP += dw kᵀ, dk += Pᵀ dw
                    for (int c = 0; c < K; c++) {
                        real s = 0;
                        for (int a = 0; a < K; a++) { s += P[a * K + c] * dw[a]; }
                        tmp[c] = s;
                    }
                    for (int a = 0; a < K; a++) {
                        dk[ti * K + a] += tmp[a];
                        for (int c = 0; c < K; c++) { dP[a * K + c] += dw[a] * kv[c]; }
                    }
                    if (doc_boundary(doc, b, t0 + i, T)) { memset(dP, 0, KK * sizeof(real)); }
                }
            }
            free(Ps);
        }
    }
}

// 2c. the delta rule, one token at a time (MODEL.md §3.7), for one (b, h):
//   S̄ = exp(g_t) S (per row for channel decay);  u = beta (v - S̄ᵀ k̂);  S = S̄ + k̃ uᵀ;  o = Sᵀ q̂
static inline void decay_state(real* S, const real* g, int gk, int K, int V) {
    if (gk == 0) { return; }
    for (int j = 0; j < K; j++) {
        real e = exp(g[gk == 1 ? 0 : j]);
        for (int c = 0; c < V; c++) { S[j * V + c] *= e; }
    }
}

// one token: S (K, V) in place; u (V) scratch; o (V) output or NULL
static inline void delta_token_step(real* S, real* u, real* o, const real* q, const real* k, const real* kt,
                                    const real* v, real beta, const real* g, int gk, int K, int V) {
    decay_state(S, g, gk, K, V);
    for (int c = 0; c < V; c++) { u[c] = 0; }
    for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { u[c] += S[j * V + c] * k[j]; } }
    for (int c = 0; c < V; c++) { u[c] = beta * (v[c] - u[c]); }
    for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { S[j * V + c] += kt[j] * u[c]; } }
    if (o) {
        for (int c = 0; c < V; c++) { o[c] = 0; }
        for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { o[c] += S[j * V + c] * q[j]; } }
    }
}

static void delta_token_forward_bh(real* o, real* st, const real* q, const real* k, const real* kt, const real* v,
                                   const real* beta, const real* g, const real* S0, real* S_final, const int* doc,
                                   int b, int h, int T, int H, int K, int V, int gk, int C, real* S, real* u) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C;
    if (S0) { memcpy(S, S0, KV * sizeof(real)); } else { memset(S, 0, KV * sizeof(real)); }
    for (int t = 0; t < T; t++) {
        if (t % C == 0) { memcpy(st + (size_t)(t / C) * KV, S, KV * sizeof(real)); }
        if (doc_boundary(doc, b, t, T)) { memset(S, 0, KV * sizeof(real)); }
        size_t i = bth(b, t, h, T, H);
        delta_token_step(S, u, o + i * V, q + i * K, k + i * K, kt + i * K, v + i * V, beta[i], g ? g + i * gk : NULL, gk, K, V);
    }
    memcpy(st + (size_t)NC * KV, S, KV * sizeof(real));
    if (S_final) { memcpy(S_final, S, KV * sizeof(real)); }
}

// backward of the per-token form for one (b, h); dS (K, V) holds dL/dS_final on entry and dL/dS_0 on exit
static void delta_token_backward_bh(real* dq, real* dk, real* dkt, real* dv, real* dbeta, real* dg, real* dS,
                                    const real* dout, const real* q, const real* k, const real* kt, const real* v,
                                    const real* beta, const real* g, const real* st, const int* doc,
                                    int b, int h, int T, int H, int K, int V, int gk, int C, real* Sbuf, real* vec) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C;
    real *Sb = Sbuf + (size_t)(C + 1) * KV; // S̄ of the current token
    real *u = vec, *r = vec + V, *du = vec + 2 * V, *dr = vec + 3 * V;
    for (int ch = NC - 1; ch >= 0; ch--) {
        int t0 = ch * C, n = imin(C, T - t0);
        // recompute the states after every token of this chunk: Sbuf[i] = state before token t0 + i (the state after
        // the token before it: a boundary's reset happens in the step)
        memcpy(Sbuf, st + (size_t)ch * KV, KV * sizeof(real));
        for (int i = 0; i < n; i++) {
            size_t ti = bth(b, t0 + i, h, T, H);
            if (doc_boundary(doc, b, t0 + i, T)) { memset(Sbuf + (size_t)(i + 1) * KV, 0, KV * sizeof(real)); }
            else { memcpy(Sbuf + (size_t)(i + 1) * KV, Sbuf + (size_t)i * KV, KV * sizeof(real)); }
            delta_token_step(Sbuf + (size_t)(i + 1) * KV, u, NULL, q + ti * K, k + ti * K, kt + ti * K, v + ti * V,
                             beta[ti], g ? g + ti * gk : NULL, gk, K, V);
        }
        for (int i = n - 1; i >= 0; i--) {
            size_t ti = bth(b, t0 + i, h, T, H);
            const real *qi = q + ti * K, *ki = k + ti * K, *kti = kt + ti * K, *vi = v + ti * V, *doi = dout + ti * V;
            const real* St = Sbuf + (size_t)(i + 1) * KV;
            real bi = beta[ti];
            if (doc_boundary(doc, b, t0 + i, T)) { memset(Sb, 0, KV * sizeof(real)); } // S̄ = 0 at a boundary
            else { memcpy(Sb, Sbuf + (size_t)i * KV, KV * sizeof(real)); }
            decay_state(Sb, g ? g + ti * gk : NULL, gk, K, V);
            for (int c = 0; c < V; c++) { r[c] = 0; }
            for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { r[c] += Sb[j * V + c] * ki[j]; } }
            for (int c = 0; c < V; c++) { u[c] = bi * (vi[c] - r[c]); }
            // o = Sᵀ q
            for (int j = 0; j < K; j++) {
                real s = 0;
                for (int c = 0; c < V; c++) { s += St[j * V + c] * doi[c]; dS[j * V + c] += qi[j] * doi[c]; }
                dq[ti * K + j] += s;
            }
            // S = S̄ + k̃ uᵀ
            for (int c = 0; c < V; c++) { du[c] = 0; }
            for (int j = 0; j < K; j++) {
                real s = 0;
                for (int c = 0; c < V; c++) { s += dS[j * V + c] * u[c]; du[c] += dS[j * V + c] * kti[j]; }
                dkt[ti * K + j] += s;
            }
            // u = beta (v - r), r = S̄ᵀ k̂
            real db = 0;
            for (int c = 0; c < V; c++) {
                db += du[c] * (vi[c] - r[c]);
                dv[ti * V + c] += bi * du[c];
                dr[c] = -bi * du[c];
            }
            dbeta[ti] += db;
            for (int j = 0; j < K; j++) {
                real s = 0;
                for (int c = 0; c < V; c++) { s += Sb[j * V + c] * dr[c]; dS[j * V + c] += ki[j] * dr[c]; }
                dk[ti * K + j] += s;
            }
            // S̄ = exp(g) S_prev: dg = Σ dS̄ ⊙ S̄, dS_prev = exp(g) dS̄
            if (gk) {
                real* dgi = dg + ti * gk;
                for (int j = 0; j < K; j++) {
                    real s = 0;
                    for (int c = 0; c < V; c++) { s += dS[j * V + c] * Sb[j * V + c]; }
                    dgi[gk == 1 ? 0 : j] += s;
                }
                decay_state(dS, g + ti * gk, gk, K, V);
            }
            if (doc_boundary(doc, b, t0 + i, T)) { memset(dS, 0, KV * sizeof(real)); } // S_{t-1} was not read
        }
    }
}

// 2d. the delta rule, a chunk at a time (MODEL.md §4). Inside a chunk of n tokens with start state S (K, V),
// G_i = inclusive cumsum of g (per channel for channel decay), E_ij = exp(G_i - G_j) for j <= i (never
// exp(G_i) * exp(-G_j): that overflows):
//   A_ij   = beta_i Σ_c k̂_i k̃_j E_ij                  (j < i)
//   RHS_i  = beta_i (v_i - (k̂_i ⊙ e^G_i)ᵀ S)
//   V'     = (I + A)^-1 RHS                            (forward substitution; V' = U - W S of MODEL.md §4)
//   O_i    = (q̂_i ⊙ e^G_i)ᵀ S + Σ_{j<=i} (Σ_c q̂_i k̃_j E_ij) V'_j
//   S_new  = e^G_n ⊙ S + Σ_j (k̃_j ⊙ exp(G_n - G_j)) V'_jᵀ
// Only the two interaction matrices K̂K̃ᵀ and Q̂K̃ᵀ appear, the reason the two-key rule keeps the speed of the
// one-key rule.
// Document boundaries inside a chunk (doc) are masks on these terms, so chunks stay on their fixed grid: a score
// (i, j) counts only if i and j are in the same document, the start state S reaches row i only if no boundary lies
// in the chunk up to i (its weight e^G_i becomes 0), and row j reaches S_new only if j is in the chunk's last
// document. The masks are constants, so the backward below needs nothing else: the decay gradient's identity holds
// term by term.

typedef struct {
    real *Q, *Kh, *Kt, *Vv, *G, *eG, *E, *M, *A, *P, *RHS, *Rv, *Vn, *S, *dS, *dSn;
    real *dQ, *dKh, *dKt, *dVn, *dRHS, *dP, *dA, *dG, *Kd;
    int* ds;     // (C) the chunk's rows' document starts, or NULL without documents (points at dsbuf)
    int* dsbuf;
} ChunkScratch;

static ChunkScratch chunk_scratch_alloc(int C, int K, int V, int gk) {
    ChunkScratch s;
    size_t CK = (size_t)C * K, CV = (size_t)C * V, CC = (size_t)C * C, KV = (size_t)K * V;
    size_t gkk = gk ? gk : 1;
    size_t sizes[] = {CK, CK, CK, CV, C * gkk, C * gkk, CC * gkk, CC, CC, CC, CV, CV, CV, KV, KV, KV,
                      CK, CK, CK, CV, CV, CC, CC, C * gkk, CK};
    real** ptrs[] = {&s.Q, &s.Kh, &s.Kt, &s.Vv, &s.G, &s.eG, &s.E, &s.M, &s.A, &s.P, &s.RHS, &s.Rv, &s.Vn, &s.S, &s.dS,
                     &s.dSn, &s.dQ, &s.dKh, &s.dKt, &s.dVn, &s.dRHS, &s.dP, &s.dA, &s.dG, &s.Kd};
    int n = (int)(sizeof(sizes) / sizeof(sizes[0]));
    size_t total = 0;
    for (int i = 0; i < n; i++) { total += sizes[i]; }
    real* base = (real*)mallocCheck(total * sizeof(real));
    for (int i = 0; i < n; i++) { *ptrs[i] = base; base += sizes[i]; }
    s.dsbuf = (int*)mallocCheck((size_t)C * sizeof(int));
    s.ds = NULL;
    return s;
}
static void chunk_scratch_free(ChunkScratch* s) { free(s->Q); free(s->dsbuf); }

// the start state's weight in row i, channel c: e^G_i (1 without decay), 0 after a document boundary in the chunk
static inline real start_weight(const ChunkScratch* s, int i, int c, int gk) {
    return s->eG[(size_t)i * (gk ? gk : 1) + (gk > 1 ? c : 0)];
}
// row j's weight in S_new, channel c: exp(G_n - G_j) (1 without decay), 0 if j's document ends inside the chunk
static inline real end_weight(const ChunkScratch* s, int n, int j, int c, int gk) {
    if (s->ds && s->ds[j] != s->ds[n - 1]) { return R(0); }
    return gk ? exp(s->G[(n - 1) * gk + (gk == 1 ? 0 : c)] - s->G[j * gk + (gk == 1 ? 0 : c)]) : R(1);
}

// M_ij = Σ_c X_i[c] Y_j[c] E_ij[c] for j < i (incl = 0) or j <= i (incl = 1), and 0 where the rows' document
// starts ds differ (ds NULL: one document); M is (n, ld = C), zero above.
static void decayed_scores(real* M, const real* X, const real* Y, const real* E, const int* ds, int n, int K, int gk,
                           int incl, int C) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < C; j++) { M[i * C + j] = 0; }
        for (int j = 0; j < i + incl; j++) {
            if (ds && ds[i] != ds[j]) { continue; }
            const real *x = X + (size_t)i * K, *y = Y + (size_t)j * K;
            real s = 0;
            if (gk == K && gk > 1) {
                const real* e = E + ((size_t)i * C + j) * K;
                for (int c = 0; c < K; c++) { s += x[c] * y[c] * e[c]; }
            } else {
                for (int c = 0; c < K; c++) { s += x[c] * y[c]; }
                if (gk == 1) { s *= E[(size_t)i * C + j]; }
            }
            M[i * C + j] = s;
        }
    }
}

// dX_i += Σ_j dM_ij Y_j E_ij;  dY_j += Σ_i dM_ij X_i E_ij  (same masks as decayed_scores)
static void decayed_scores_backward(real* dX, real* dY, const real* dM, const real* X, const real* Y, const real* E,
                                    const int* ds, int n, int K, int gk, int incl, int C) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i + incl; j++) {
            real d = dM[i * C + j];
            if (d == 0 || (ds && ds[i] != ds[j])) { continue; }
            const real *x = X + (size_t)i * K, *y = Y + (size_t)j * K;
            real *dx = dX + (size_t)i * K, *dy = dY + (size_t)j * K;
            if (gk == K && gk > 1) {
                const real* e = E + ((size_t)i * C + j) * K;
                for (int c = 0; c < K; c++) { dx[c] += d * y[c] * e[c]; dy[c] += d * x[c] * e[c]; }
            } else {
                if (gk == 1) { d *= E[(size_t)i * C + j]; }
                for (int c = 0; c < K; c++) { dx[c] += d * y[c]; dy[c] += d * x[c]; }
            }
        }
    }
}

// Load chunk ch of (b, h) into the scratch and compute everything that depends only on the inputs and the
// start state s->S: G, e^G (the start state's weights), E, A, RHS, V', the scores P = Q̂K̃ᵀ ⊙ E, and
// Kd = k̃_j ⊙ exp(G_n - G_j), each masked by the document boundaries in doc (or NULL).
static void chunk_prepare(ChunkScratch* s, const real* q, const real* k, const real* kt, const real* v, const real* beta,
                          const real* g, const int* doc, int b, int h, int t0, int n, int T, int H, int K, int V, int gk,
                          int C) {
    int gw = gk ? gk : 1;
    s->ds = doc ? s->dsbuf : NULL;
    for (int i = 0; i < n; i++) {
        size_t ti = bth(b, t0 + i, h, T, H);
        // row i sees the start state unless a boundary lies in [t0, t0 + i] (t0 = 0 is the window's own start)
        int sees_s0 = 1;
        if (doc) { s->ds[i] = doc[(size_t)b * T + t0 + i]; sees_s0 = s->ds[i] < (t0 > 0 ? t0 : 1); }
        memcpy(s->Q + (size_t)i * K, q + ti * K, K * sizeof(real));
        memcpy(s->Kh + (size_t)i * K, k + ti * K, K * sizeof(real));
        memcpy(s->Kt + (size_t)i * K, kt + ti * K, K * sizeof(real));
        memcpy(s->Vv + (size_t)i * V, v + ti * V, V * sizeof(real));
        for (int c = 0; c < gw; c++) {
            real gi = gk ? g[ti * gk + c] : R(0);
            s->G[i * gw + c] = (i ? s->G[(i - 1) * gw + c] : R(0)) + gi;
            s->eG[i * gw + c] = sees_s0 ? exp(s->G[i * gw + c]) : R(0);
        }
    }
    if (gk) {
        for (int i = 0; i < n; i++) {
            for (int j = 0; j <= i; j++) {
                for (int c = 0; c < gk; c++) { s->E[((size_t)i * C + j) * gk + c] = exp(s->G[i * gk + c] - s->G[j * gk + c]); }
            }
        }
    }
    // RHS_i = beta_i (v_i - (k̂_i ⊙ e^G_i)ᵀ S), kept as Rv = v - (k̂ ⊙ e^G)ᵀ S and RHS = beta Rv
    for (int i = 0; i < n; i++) {
        size_t ti = bth(b, t0 + i, h, T, H);
        real* rv = s->Rv + (size_t)i * V;
        memcpy(rv, s->Vv + (size_t)i * V, V * sizeof(real));
        for (int j = 0; j < K; j++) {
            real kg = s->Kh[(size_t)i * K + j] * start_weight(s, i, j, gk);
            const real* Sj = s->S + (size_t)j * V;
            for (int c = 0; c < V; c++) { rv[c] -= kg * Sj[c]; }
        }
        for (int c = 0; c < V; c++) { s->RHS[(size_t)i * V + c] = beta[ti] * rv[c]; }
    }
    decayed_scores(s->M, s->Kh, s->Kt, s->E, s->ds, n, K, gk, 0, C);
    for (int i = 0; i < n; i++) {
        real bi = beta[bth(b, t0 + i, h, T, H)];
        for (int j = 0; j < C; j++) { s->A[i * C + j] = bi * s->M[i * C + j]; }
    }
    // V' = (I + A)^-1 RHS by forward substitution
    for (int i = 0; i < n; i++) {
        real* vn = s->Vn + (size_t)i * V;
        memcpy(vn, s->RHS + (size_t)i * V, V * sizeof(real));
        for (int j = 0; j < i; j++) {
            real a = s->A[i * C + j];
            const real* vj = s->Vn + (size_t)j * V;
            for (int c = 0; c < V; c++) { vn[c] -= a * vj[c]; }
        }
    }
    decayed_scores(s->P, s->Q, s->Kt, s->E, s->ds, n, K, gk, 1, C);
    for (int j = 0; j < n; j++) {
        for (int c = 0; c < K; c++) {
            s->Kd[(size_t)j * K + c] = s->Kt[(size_t)j * K + c] * end_weight(s, n, j, c, gk);
        }
    }
}

static void delta_chunk_forward_bh(real* o, real* st, const real* q, const real* k, const real* kt, const real* v,
                                   const real* beta, const real* g, const real* S0, real* S_final, const int* doc,
                                   int b, int h, int T, int H, int K, int V, int gk, int C, ChunkScratch* s) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C;
    if (S0) { memcpy(s->S, S0, KV * sizeof(real)); } else { memset(s->S, 0, KV * sizeof(real)); }
    for (int ch = 0; ch < NC; ch++) {
        int t0 = ch * C, n = imin(C, T - t0);
        memcpy(st + (size_t)ch * KV, s->S, KV * sizeof(real));
        chunk_prepare(s, q, k, kt, v, beta, g, doc, b, h, t0, n, T, H, K, V, gk, C);
        for (int i = 0; i < n; i++) {
            real* oi = o + bth(b, t0 + i, h, T, H) * V;
            for (int c = 0; c < V; c++) { oi[c] = 0; }
            for (int j = 0; j < K; j++) { // (q̂_i ⊙ e^G_i)ᵀ S
                real qg = s->Q[(size_t)i * K + j] * start_weight(s, i, j, gk);
                const real* Sj = s->S + (size_t)j * V;
                for (int c = 0; c < V; c++) { oi[c] += qg * Sj[c]; }
            }
            for (int j = 0; j <= i; j++) {
                real p = s->P[i * C + j];
                const real* vj = s->Vn + (size_t)j * V;
                for (int c = 0; c < V; c++) { oi[c] += p * vj[c]; }
            }
        }
        // S_new = e^G_n ⊙ S + Kdᵀ V'
        for (int j = 0; j < K; j++) {
            real e = start_weight(s, n - 1, j, gk);
            real* Sj = s->S + (size_t)j * V;
            for (int c = 0; c < V; c++) { Sj[c] *= e; }
            for (int i = 0; i < n; i++) {
                real kd = s->Kd[(size_t)i * K + j];
                const real* vi = s->Vn + (size_t)i * V;
                for (int c = 0; c < V; c++) { Sj[c] += kd * vi[c]; }
            }
        }
    }
    memcpy(st + (size_t)NC * KV, s->S, KV * sizeof(real));
    if (S_final) { memcpy(S_final, s->S, KV * sizeof(real)); }
}

// Backward of the chunkwise form for one (b, h). s->dS holds dL/dS_final on entry and dL/dS_0 on exit.
// With dq, dk̂, dk̃ the gradients of this chunk's terms, the decay gradient is
//   dG_i = q̂_i ⊙ dq_i + k̂_i ⊙ dk̂_i - k̃_i ⊙ dk̃_i   (+ at i = n: Σ_j k̃_j ⊙ dk̃_j^(state) + e^G_n ⊙ Σ_v dS ⊙ S)
// because every term where q̂_i or k̂_i appears carries exp(+G_i) and every term where k̃_j appears exp(-G_j).
static void delta_chunk_backward_bh(real* dq, real* dk, real* dkt, real* dv, real* dbeta, real* dg,
                                    const real* dout, const real* q, const real* k, const real* kt, const real* v,
                                    const real* beta, const real* g, const real* st, const int* doc,
                                    int b, int h, int T, int H, int K, int V, int gk, int C, ChunkScratch* s) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C, gw = gk ? gk : 1;
    for (int ch = NC - 1; ch >= 0; ch--) {
        int t0 = ch * C, n = imin(C, T - t0);
        memcpy(s->S, st + (size_t)ch * KV, KV * sizeof(real));
        chunk_prepare(s, q, k, kt, v, beta, g, doc, b, h, t0, n, T, H, K, V, gk, C);
        memset(s->dQ, 0, (size_t)n * K * sizeof(real));
        memset(s->dKh, 0, (size_t)n * K * sizeof(real));
        memset(s->dKt, 0, (size_t)n * K * sizeof(real));
        memset(s->dG, 0, (size_t)n * gw * sizeof(real));
        const real* dS = s->dS; // dL/dS_new
        // dV'_j = Σ_{i>=j} P_ij dO_i + Kd_j dS;  dP_ij = dO_i · V'_j;  dKd_j = dS V'_j
        for (int j = 0; j < n; j++) {
            real* dvn = s->dVn + (size_t)j * V;
            for (int c = 0; c < V; c++) { dvn[c] = 0; }
            for (int i = j; i < n; i++) {
                real p = s->P[i * C + j];
                const real* doi = dout + bth(b, t0 + i, h, T, H) * V;
                for (int c = 0; c < V; c++) { dvn[c] += p * doi[c]; }
            }
            for (int a = 0; a < K; a++) {
                real kd = s->Kd[(size_t)j * K + a], dkd = 0;
                const real* dSa = dS + (size_t)a * V;
                for (int c = 0; c < V; c++) { dvn[c] += kd * dSa[c]; dkd += dSa[c] * s->Vn[(size_t)j * V + c]; }
                s->dKt[(size_t)j * K + a] += dkd * end_weight(s, n, j, a, gk); // Kd_j = k̃_j ⊙ exp(G_n - G_j)
                if (gk) { s->dG[(n - 1) * gk + (gk == 1 ? 0 : a)] += dkd * kd; } // the +G_n part of exp(G_n - G_j)
            }
        }
        for (int i = 0; i < n; i++) {
            const real* doi = dout + bth(b, t0 + i, h, T, H) * V;
            for (int j = 0; j < C; j++) { s->dP[i * C + j] = 0; }
            for (int j = 0; j <= i; j++) {
                real d = 0;
                const real* vj = s->Vn + (size_t)j * V;
                for (int c = 0; c < V; c++) { d += doi[c] * vj[c]; }
                s->dP[i * C + j] = d;
            }
        }
        // the start-state terms: O_i ∋ (q̂_i ⊙ e^G_i)ᵀ S, S_new ∋ e^G_n ⊙ S; dS_0 accumulates in tmp (s->dS is still needed)
        real* dSnew = s->dSn; // dL/dS_0 of this chunk
        for (int a = 0; a < K; a++) {
            real e = start_weight(s, n - 1, a, gk);
            real gsum = 0;
            for (int c = 0; c < V; c++) { dSnew[a * V + c] = e * dS[a * V + c]; gsum += dS[a * V + c] * s->S[a * V + c]; }
            if (gk) { s->dG[(n - 1) * gk + (gk == 1 ? 0 : a)] += e * gsum; }
        }
        for (int i = 0; i < n; i++) {
            const real* doi = dout + bth(b, t0 + i, h, T, H) * V;
            for (int a = 0; a < K; a++) {
                real eg = start_weight(s, i, a, gk);
                real qg = s->Q[(size_t)i * K + a] * eg, d = 0;
                const real* Sa = s->S + (size_t)a * V;
                real* dSa = dSnew + (size_t)a * V;
                for (int c = 0; c < V; c++) { d += Sa[c] * doi[c]; dSa[c] += qg * doi[c]; }
                s->dQ[(size_t)i * K + a] += d * eg;
            }
        }
        // dRHS = (I + A)^-T dV' (back substitution); dA_ij = -dRHS_i · V'_j
        for (int i = n - 1; i >= 0; i--) {
            real* dr = s->dRHS + (size_t)i * V;
            memcpy(dr, s->dVn + (size_t)i * V, V * sizeof(real));
            for (int j = i + 1; j < n; j++) {
                real a = s->A[j * C + i];
                const real* drj = s->dRHS + (size_t)j * V;
                for (int c = 0; c < V; c++) { dr[c] -= a * drj[c]; }
            }
        }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < C; j++) { s->dA[i * C + j] = 0; }
            for (int j = 0; j < i; j++) {
                real d = 0;
                for (int c = 0; c < V; c++) { d -= s->dRHS[(size_t)i * V + c] * s->Vn[(size_t)j * V + c]; }
                s->dA[i * C + j] = d;
            }
        }
        // RHS_i = beta_i Rv_i, Rv_i = v_i - (k̂_i ⊙ e^G_i)ᵀ S
        for (int i = 0; i < n; i++) {
            size_t ti = bth(b, t0 + i, h, T, H);
            real bi = beta[ti], db = 0;
            const real* dr = s->dRHS + (size_t)i * V;
            for (int c = 0; c < V; c++) { db += dr[c] * s->Rv[(size_t)i * V + c]; dv[ti * V + c] += bi * dr[c]; }
            dbeta[ti] += db;
            for (int a = 0; a < K; a++) {
                real eg = start_weight(s, i, a, gk);
                real kg = s->Kh[(size_t)i * K + a] * eg, d = 0;
                const real* Sa = s->S + (size_t)a * V;
                real* dSa = dSnew + (size_t)a * V;
                for (int c = 0; c < V; c++) { d += Sa[c] * dr[c]; dSa[c] -= kg * bi * dr[c]; }
                s->dKh[(size_t)i * K + a] -= bi * d * eg;
            }
        }
        // A_ij = beta_i M_ij with M = K̂K̃ᵀ ⊙ E: dbeta_i += Σ_j dA_ij M_ij, dM_ij = beta_i dA_ij
        for (int i = 0; i < n; i++) {
            size_t ti = bth(b, t0 + i, h, T, H);
            real bi = beta[ti], db = 0;
            for (int j = 0; j < i; j++) {
                db += s->dA[i * C + j] * s->M[i * C + j];
                s->dA[i * C + j] *= bi;
            }
            dbeta[ti] += db;
        }
        decayed_scores_backward(s->dKh, s->dKt, s->dA, s->Kh, s->Kt, s->E, s->ds, n, K, gk, 0, C);
        decayed_scores_backward(s->dQ, s->dKt, s->dP, s->Q, s->Kt, s->E, s->ds, n, K, gk, 1, C);
        // write out the token gradients and the decay gradient
        for (int i = 0; i < n; i++) {
            size_t ti = bth(b, t0 + i, h, T, H);
            for (int a = 0; a < K; a++) {
                real dqa = s->dQ[(size_t)i * K + a], dka = s->dKh[(size_t)i * K + a], dkta = s->dKt[(size_t)i * K + a];
                dq[ti * K + a] += dqa;
                dk[ti * K + a] += dka;
                dkt[ti * K + a] += dkta;
                if (gk) {
                    s->dG[i * gk + (gk == 1 ? 0 : a)] += s->Q[(size_t)i * K + a] * dqa + s->Kh[(size_t)i * K + a] * dka
                                                         - s->Kt[(size_t)i * K + a] * dkta;
                }
            }
        }
        if (gk) { // dg_t = Σ_{i >= t} dG_i within the chunk
            for (int c = 0; c < gk; c++) {
                real acc = 0;
                for (int i = n - 1; i >= 0; i--) {
                    acc += s->dG[i * gk + c];
                    dg[bth(b, t0 + i, h, T, H) * gk + c] += acc;
                }
            }
        }
        memcpy(s->dS, dSnew, KV * sizeof(real));
    }
}

// The mixer core, both forms. S0 (B,H,K,V) or NULL; S_final (B,H,K,V) or NULL (may equal S0); doc (B,T) or NULL:
// packed documents (doc_boundary).
static void delta_forward(real* o, real* states, const real* q, const real* k, const real* kt, const real* v,
                          const real* beta, const real* g, const real* S0, real* S_final, const int* doc,
                          int B, int T, int H, int K, int V, int gk, int C, int chunk_form) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C;
    #pragma omp parallel
    {
        ChunkScratch s = chunk_scratch_alloc(chunk_form ? C : 1, K, V, chunk_form ? gk : 0);
        real* u = (real*)mallocCheck(V * sizeof(real));
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                size_t bh = (size_t)b * H + h;
                real* st = states + bh * (NC + 1) * KV;
                const real* s0 = S0 ? S0 + bh * KV : NULL;
                real* sf = S_final ? S_final + bh * KV : NULL;
                if (chunk_form) { delta_chunk_forward_bh(o, st, q, k, kt, v, beta, g, s0, sf, doc, b, h, T, H, K, V, gk, C, &s); }
                else { delta_token_forward_bh(o, st, q, k, kt, v, beta, g, s0, sf, doc, b, h, T, H, K, V, gk, C, s.S, u); }
            }
        }
        free(u);
        chunk_scratch_free(&s);
    }
}

// Gradients (accumulated): dq, dk, dkt (may alias dk), dv, dbeta, dg (if gk), dS0 (B,H,K,V; if not NULL).
// dS_final (B,H,K,V) or NULL: the gradient reaching the final state (tests use it; training passes NULL).
static void delta_backward(real* dq, real* dk, real* dkt, real* dv, real* dbeta, real* dg, real* dS0,
                           const real* dout, const real* dS_final, const real* q, const real* k, const real* kt,
                           const real* v, const real* beta, const real* g, const real* states, const int* doc,
                           int B, int T, int H, int K, int V, int gk, int C, int chunk_form) {
    size_t KV = (size_t)K * V;
    int NC = (T + C - 1) / C;
    #pragma omp parallel
    {
        ChunkScratch s = chunk_scratch_alloc(chunk_form ? C : 1, K, V, chunk_form ? gk : 0);
        real* Sbuf = chunk_form ? NULL : (real*)mallocCheck(((size_t)(C + 2) * KV) * sizeof(real));
        real* vec = (real*)mallocCheck(4 * (size_t)V * sizeof(real));
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                size_t bh = (size_t)b * H + h;
                const real* st = states + bh * (NC + 1) * KV;
                if (dS_final) { memcpy(s.dS, dS_final + bh * KV, KV * sizeof(real)); }
                else { memset(s.dS, 0, KV * sizeof(real)); }
                if (chunk_form) {
                    delta_chunk_backward_bh(dq, dk, dkt, dv, dbeta, dg, dout, q, k, kt, v, beta, g, st, doc, b, h, T, H, K, V, gk, C, &s);
                } else {
                    delta_token_backward_bh(dq, dk, dkt, dv, dbeta, dg, s.dS, dout, q, k, kt, v, beta, g, st, doc, b, h, T, H, K, V, gk, C, Sbuf, vec);
                }
                if (dS0) { for (size_t e = 0; e < KV; e++) { dS0[bh * KV + e] += s.dS[e]; } }
            }
        }
        free(vec);
        free(Sbuf);
        chunk_scratch_free(&s);
    }
}

// ----------------------------------------------------------------------------------------------------
// 2b. softmax attention (issue 19), the second layer kind: fla's Attention layer (q/k/v/o projections without bias,
// the rotary embedding on q and k, causal softmax attention, optionally in a sliding window, grouped-query heads)

// The rotary embedding of fla's RotaryEmbedding (rotate-half, GPT-NeoX form): in a head of D, the pair (i, i + D/2)
// turns by pos * theta^(-2i/D) where pos is the token's position in the sequence (pos0 + t). The angle is made as
// fla makes it, in fp32 (inverse frequency, then position times it), so the export computes the same rotation.
static inline float rope_angle(int pos, int i, int D, float theta) {
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    return (float)pos * inv_freq;
}

// out (B, T, nh, D) = rotate(inp (B, T, nh, D)) by the angles times dir (+1; -1 is the rotation's transpose), written
// or, with accumulate, added; out may be inp when written
static void rope_rotate(real* out, const real* inp, int B, int T, int nh, int D, int pos0, float theta, real dir, int accumulate) {
    int half = D / 2;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < half; i++) {
                float ang = rope_angle(pos0 + t, i, D, theta);
                real cs = R(cos((double)ang)), sn = dir * R(sin((double)ang));
                for (int h = 0; h < nh; h++) {
                    size_t r = (((size_t)b * T + t) * nh + h) * D;
                    real x1 = inp[r + i], x2 = inp[r + half + i];
                    real y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
                    if (accumulate) { out[r + i] += y1; out[r + half + i] += y2; }
                    else { out[r + i] = y1; out[r + half + i] = y2; }
                }
            }
        }
    }
}

static void rope_forward(real* out, const real* inp, int B, int T, int nh, int D, int pos0, float theta) {
    rope_rotate(out, inp, B, T, nh, D, pos0, theta, R(1), 0);
}

// dinp += rotateᵀ(dout): the transpose of a rotation turns by the opposite angle
static void rope_backward(real* dinp, const real* dout, int B, int T, int nh, int D, int pos0, float theta) {
    rope_rotate(dinp, dout, B, T, nh, D, pos0, theta, R(-1), 1);
}

// the first key a query at position pos sees: window W counts the query's own token (flash_attn's (W-1, 0))
static inline int attn_first_key(int pos, int W) { return W > 0 && pos - W + 1 > 0 ? pos - W + 1 : 0; }

// Causal softmax attention. q, o: (B, T, Hq, D); k, v: (B, Tcap, Hkv, D) of which the first Tk positions hold keys,
// the T queries being the last T of them (Tk = T in training; with a KV cache Tk = tokens so far). Query head h reads
// key/value head h / (Hq / Hkv). o = softmax(q kᵀ / sqrt(D)) v per row; lse (B, T, Hq): the log of each row's
// softmax denominator, with the max folded in (what the backward needs to rebuild the probabilities).
static void attention_forward(real* o, real* lse, const real* q, const real* k, const real* v, int B, int T, int Tk,
                              int Tcap, int Hq, int Hkv, int D, int W) {
    int G = Hq / Hkv;
    real scale = R(1) / sqrt(R(D));
    #pragma omp parallel
    {
        real* s = (real*)mallocCheck((size_t)Tk * sizeof(real));   // one row's scores
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < Hq; h++) {
                int hk = h / G;
                for (int t = 0; t < T; t++) {
                    int pos = Tk - T + t, j0 = attn_first_key(pos, W);
                    const real* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                    real mx = -INFINITY;
                    for (int j = j0; j <= pos; j++) {
                        const real* kr = k + (((size_t)b * Tcap + j) * Hkv + hk) * D;
                        real dot = 0;
                        for (int e = 0; e < D; e++) { dot += qr[e] * kr[e]; }
                        s[j] = dot * scale;
                        if (s[j] > mx) { mx = s[j]; }
                    }
                    real sum = 0;
                    for (int j = j0; j <= pos; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                    real* orow = o + (((size_t)b * T + t) * Hq + h) * D;
                    for (int e = 0; e < D; e++) { orow[e] = 0; }
                    for (int j = j0; j <= pos; j++) {
                        const real* vr = v + (((size_t)b * Tcap + j) * Hkv + hk) * D;
                        real p = s[j] / sum;
                        for (int e = 0; e < D; e++) { orow[e] += p * vr[e]; }
                    }
                    lse[((size_t)b * T + t) * Hq + h] = mx + log(sum);
                }
            }
        }
        free(s);
    }
}

// Gradients (accumulated) of attention_forward in training (Tk = Tcap = T): with P = exp(S - lse),
// dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ - rowsum(dO ⊙ O)), dQ += dS K / sqrt(D), dK += dSᵀ Q / sqrt(D). A thread owns a
// key/value head and the query heads of its group, so every sum runs in a fixed order.
static void attention_backward(real* dq, real* dk, real* dv, const real* dout, const real* q, const real* k,
                               const real* v, const real* o, const real* lse, int B, int T, int Hq, int Hkv, int D, int W) {
    int G = Hq / Hkv;
    real scale = R(1) / sqrt(R(D));
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int hk = 0; hk < Hkv; hk++) {
            for (int g = 0; g < G; g++) {
                int h = hk * G + g;
                for (int t = 0; t < T; t++) {
                    size_t qi = (((size_t)b * T + t) * Hq + h) * D;
                    const real *qr = q + qi, *dor = dout + qi, *orow = o + qi;
                    real* dqr = dq + qi;
                    real l = lse[((size_t)b * T + t) * Hq + h], Di = 0;
                    for (int e = 0; e < D; e++) { Di += dor[e] * orow[e]; }
                    for (int j = attn_first_key(t, W); j <= t; j++) {
                        size_t ki = (((size_t)b * T + j) * Hkv + hk) * D;
                        const real *kr = k + ki, *vr = v + ki;
                        real dot = 0, dp = 0;
                        for (int e = 0; e < D; e++) { dot += qr[e] * kr[e]; dp += dor[e] * vr[e]; }
                        real p = exp(dot * scale - l), ds = p * (dp - Di) * scale;
                        for (int e = 0; e < D; e++) {
                            dv[ki + e] += p * dor[e];
                            dqr[e] += ds * kr[e];
                            dk[ki + e] += ds * qr[e];
                        }
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// 3. the model

typedef struct {
    PdnConfig cfg;
    PdnLayout lay;
    real* params;     // (lay.num_elems) the flat parameter buffer, layout in pdn.h
    real* grads;      // same layout
    real* m;          // AdamW first moment, allocated on first update (or by resume)
    real* v;          // AdamW second moment
    int C;            // chunk size of the mixer
    int chunk_form;   // 1: chunkwise mixer (MODEL.md §4), 0: per token (MODEL.md §3)
} Model;

// Activations of one layer. Tensors a variant lacks have size 0; without a preconditioner kt points at kn,
// without an output gate og points at on (the same aliases make their gradients add up in the backward).
typedef struct {
    real *ln1, *ln1_rstd;               // (N, d), (N)
    real *qp, *kp, *vp;                 // projections (N, HK), (N, HK), (N, HV)
    real *qc, *kc, *vc;                 // short convolution outputs, before SiLU
    real *qs, *ks, *v;                  // after SiLU; v is the mixer's value
    real *qn, *kn, *q_rstd, *k_rstd;    // (N, HK): q̂ (scaled by K^-1/2), k̂; (N, H) their rstd
    real *beta_pre, *beta;              // (N, H)
    real *f1;                           // (N, V) channel decay, low-rank first half
    real *g_pre, *g;                    // (N, H*gk) decay gate input and log decay
    real *gp_pre, *bp_pre, *gp, *betap; // (N, H) preconditioner gates
    real *astat, *kt;                   // (N, HK) statistic a_t and the write key k̃
    real *pstate;                       // (B, H, NC+1, K, K) exact preconditioner at chunk starts
    real *o, *states;                   // (N, HV) mixer core output; (B, H, NC+1, K, V) states at chunk starts
    real *on, *o_rstd;                  // (N, HV) after o_norm; (N*H)
    real *g1, *gz, *og;                 // (N, V), (N, HV), (N, HV) output gate
    real *h;                            // (N, d) residual stream after the mixer
    real *ln2, *ln2_rstd;               // (N, d), (N)
    real *mg, *mu, *ma;                 // (N, I) MLP gate, up, silu(gate) * up
    // an attention layer's instead of the mixer's (Ha query heads, Hkv key/value heads of D; KVD = Hkv * D)
    real *aq, *ak, *av;                 // (N, d), (N, KVD), (N, KVD) projections
    real *aqr, *akr;                    // the same q and k after the rotary embedding
    real *ao, *alse;                    // (N, d) attention output, (N, Ha) its rows' log-sum-exp
} LayerActs;

// Point the fields of la into base (or only count, if base is NULL); returns the number of elements.
// with_states = 0 drops the chunk-start states (not needed in the gradient scratch). attn: the layer is attention
// (its mixer fields are empty), else a mixer layer (its attention fields are empty).
static size_t layer_acts_point(LayerActs* la, real* base, const PdnConfig* c, int B, int T, int C, int with_states, int attn) {
    size_t N = (size_t)B * T, d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    size_t HK = H * K, HV = H * V, I = c->mlp_hidden, NC = (T + C - 1) / C;
    size_t gk = pdn_decay_width(c), Ha = c->attn_heads, KVD = pdn_attn_kv_dim(c);
    int diag = c->precond == PRECOND_DIAG, exact = c->precond == PRECOND_EXACT, chan = c->decay == DECAY_CHANNEL;
    size_t mix = attn ? 0 : 1, at = attn ? 1 : 0;   // multiply each size by its kind's flag
    H *= mix; HK *= mix; HV *= mix; V *= mix; gk *= mix; Ha *= at; KVD *= at;
    struct { real** p; size_t n; } f[] = {
        {&la->ln1, N * d}, {&la->ln1_rstd, N}, {&la->qp, N * HK}, {&la->kp, N * HK}, {&la->vp, N * HV},
        {&la->qc, N * HK}, {&la->kc, N * HK}, {&la->vc, N * HV}, {&la->qs, N * HK}, {&la->ks, N * HK}, {&la->v, N * HV},
        {&la->qn, N * HK}, {&la->kn, N * HK}, {&la->q_rstd, N * H}, {&la->k_rstd, N * H},
        {&la->beta_pre, N * H}, {&la->beta, N * H}, {&la->f1, chan ? N * V : 0},
        {&la->g_pre, N * H * gk}, {&la->g, N * H * gk},
        {&la->gp_pre, diag ? N * H : 0}, {&la->bp_pre, diag ? N * H : 0}, {&la->gp, diag ? N * H : 0},
        {&la->betap, diag ? N * H : 0}, {&la->astat, diag ? N * HK : 0}, {&la->kt, (diag || exact) ? N * HK : 0},
        {&la->pstate, exact && with_states ? B * H * (NC + 1) * K * K : 0},
        {&la->o, N * HV}, {&la->states, with_states ? B * H * (NC + 1) * K * V : 0},
        {&la->on, N * HV}, {&la->o_rstd, N * H},
        {&la->g1, c->out_gate ? N * V : 0}, {&la->gz, c->out_gate ? N * HV : 0}, {&la->og, c->out_gate ? N * HV : 0},
        {&la->h, N * d}, {&la->ln2, N * d}, {&la->ln2_rstd, N}, {&la->mg, N * I}, {&la->mu, N * I}, {&la->ma, N * I},
        {&la->aq, N * d * at}, {&la->ak, N * KVD}, {&la->av, N * KVD}, {&la->aqr, N * d * at}, {&la->akr, N * KVD},
        {&la->ao, N * d * at}, {&la->alse, N * Ha},
    };
    size_t off = 0;
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        *f[i].p = base ? base + off : NULL;
        off += f[i].n;
    }
    if (c->precond == PRECOND_NONE) { la->kt = la->kn; }
    if (!c->out_gate) { la->og = la->on; }
    return off;
}

typedef struct {
    int B, T;
    size_t layer_size;
    real* mem;
    real* resid;                  // (L+1, N, d): resid[0] = embeddings, resid[l+1] = output of layer l
    real *lnf, *lnf_rstd;         // (N, d), (N)
    real *logits, *losses;        // (M, vocab) (probabilities after the loss, dlogits after its backward), (M)
    // the classifier's rows: M = N is every row; else only rows[0..M), the positions with a target (MQAR's answers:
    // the classifier is most of a small model's work, and rows without a target give it no gradient)
    size_t M;
    int *rows, *row_y;            // (N) the rows' positions and targets (acts_target_rows)
    real *lnf_rows, *dlnf_rows;   // (N, d) those rows of lnf and their gradient
    // backward scratch (allocated with grads = 1): one layer's worth, reused by every layer
    real* gmem;
    size_t gsize;                 // elements of gmem before dresid: one layer's gradients, either kind
    real *dresid, *dlnf;          // (N, d)
    const int* doc;               // (N) packed documents' starts (doc_boundary), or NULL; set by the caller per batch
} Acts;

static void layer_acts_at(const Model* m, const Acts* a, int l, LayerActs* la) {
    size_t N = (size_t)a->B * a->T;
    real* base = a->mem + (size_t)(m->cfg.n_layer + 1) * N * m->cfg.d_model + (size_t)l * a->layer_size;
    layer_acts_point(la, base, &m->cfg, a->B, a->T, m->C, 1, pdn_is_attn(&m->cfg, l));
}

// the larger of a layer's two kinds (every layer gets the same room)
static size_t layer_acts_size(const PdnConfig* c, int B, int T, int C, int with_states) {
    LayerActs tmp;
    size_t mix = layer_acts_point(&tmp, NULL, c, B, T, C, with_states, 0);
    size_t att = layerset_count(&c->attn_layers) ? layer_acts_point(&tmp, NULL, c, B, T, C, with_states, 1) : 0;
    return mix > att ? mix : att;
}

static Acts acts_alloc(const Model* m, int B, int T, int grads) {
    const PdnConfig* c = &m->cfg;
    Acts a;
    memset(&a, 0, sizeof(a));
    a.B = B; a.T = T;
    size_t N = (size_t)B * T, d = c->d_model;
    a.layer_size = layer_acts_size(c, B, T, m->C, 1);
    size_t total = (size_t)(c->n_layer + 1) * N * d + (size_t)c->n_layer * a.layer_size + 2 * N * d + N + N * c->vocab_size + N;
    a.mem = (real*)mallocCheck(total * sizeof(real));
    a.resid = a.mem;
    real* p = a.mem + (size_t)(c->n_layer + 1) * N * d + (size_t)c->n_layer * a.layer_size;
    a.lnf = p; p += N * d;
    a.lnf_rstd = p; p += N;
    a.logits = p; p += N * c->vocab_size;
    a.losses = p; p += N;
    a.lnf_rows = p;
    a.M = N;
    a.rows = (int*)mallocCheck(2 * N * sizeof(int));
    a.row_y = a.rows + N;
    if (grads) {
        size_t gs = layer_acts_size(c, B, T, m->C, 0);
        a.gmem = (real*)mallocCheck((gs + 3 * N * d) * sizeof(real));
        a.gsize = gs;
        a.dresid = a.gmem + gs;
        a.dlnf = a.dresid + N * d;
        a.dlnf_rows = a.dlnf + N * d;
    }
    return a;
}

static void acts_free(Acts* a) { free(a->mem); free(a->gmem); free(a->rows); }

// The classifier's rows for targets y (N): the positions with a target when some have none (and at least one has
// one), else every row. Returns the targets of those rows; acts_all_rows goes back to every row.
static const int* acts_target_rows(Acts* a, const int* y) {
    size_t N = (size_t)a->B * a->T, M = 0;
    for (size_t n = 0; n < N; n++) {
        if (y[n] >= 0) { a->rows[M] = (int)n; a->row_y[M] = y[n]; M++; }
    }
    a->M = M > 0 && M < N ? M : N;
    return a->M < N ? a->row_y : y;
}
static void acts_all_rows(Acts* a) { a->M = (size_t)a->B * a->T; }
// generation reads the last row's logits only
static void acts_last_row(Acts* a) { a->rows[0] = a->B * a->T - 1; a->M = 1; }

// logits (M, vocab) = lnf's classifier rows (all N with all_rows) times the head
static void logits_forward(const Model* m, Acts* a, int all_rows) {
    const PdnConfig* c = &m->cfg;
    size_t N = (size_t)a->B * a->T, M = all_rows ? N : a->M;
    int d = c->d_model;
    const real* head = PDN_PARAM(m->params, &m->lay, c->tie_embeddings ? T_WTE : T_LM_HEAD, 0);
    const real* x = a->lnf;
    if (M < N) {
        #pragma omp parallel for
        for (size_t i = 0; i < M; i++) { memcpy(a->lnf_rows + i * d, a->lnf + (size_t)a->rows[i] * d, d * sizeof(real)); }
        x = a->lnf_rows;
    }
    matmul_forward(a->logits, x, head, NULL, (int)M, d, c->vocab_size);
}

// Recurrent state for inference (section 4): what a layer needs to continue a sequence
typedef struct {
    int B;
    real *hq, *hk, *hv;  // (L, B, cs-1, HK | HK | HV): the last cs-1 projections, for the short convolution
    real *S;             // (L, B, H, K, V) delta-rule state
    real *a;             // (L, B, H, K) diagonal preconditioner statistic
    real *P;             // (L, B, H, K, K) exact preconditioner
    real *kc, *vc;       // (attention layers, B, Tcap, KVD): the KV cache, keys after the rotary embedding
    int Tcap, pos;       // the cache's room in tokens; tokens fed so far (the next token's position)
} RecState;

// new history = the last cs-1 rows of [old history; z]
static void conv_history_update(real* hist, const real* z, int B, int T, int Ch, int cs) {
    int nh = cs - 1;
    if (nh == 0) { return; }
    real* tmp = (real*)mallocCheck((size_t)nh * Ch * sizeof(real));
    for (int b = 0; b < B; b++) {
        real* hb = hist + (size_t)b * nh * Ch;
        for (int i = 0; i < nh; i++) {
            int s = T - nh + i; // position in z, or in the old history if negative
            const real* src = s >= 0 ? z + ((size_t)b * T + s) * Ch : hb + (size_t)(nh + s) * Ch;
            memcpy(tmp + (size_t)i * Ch, src, Ch * sizeof(real));
        }
        memcpy(hb, tmp, (size_t)nh * Ch * sizeof(real));
    }
    free(tmp);
}

static int rs_B(const RecState* rs) { return rs ? rs->B : 0; }

// An attention layer's part between its norms (fla's Attention): from la->ln1 (N, d) to la->h = o_proj(attention)
// (the caller adds the residual). With rs the keys and values go into its KV cache after the rs->pos tokens before
// them, and the queries attend over the whole cache.
static void attn_layer_forward(const Model* m, LayerActs* la, RecState* rs, int l, int B, int T) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    const real* p = m->params;
    int d = c->d_model, Ha = c->attn_heads, Hkv = c->attn_kv_heads, D = pdn_attn_head_dim(c), KVD = pdn_attn_kv_dim(c);
    size_t N = (size_t)B * T;
    int pos0 = rs ? rs->pos : 0;
    matmul_forward(la->aq, la->ln1, PDN_PARAM(p, lay, T_AQ, l), NULL, N, d, d);
    matmul_forward(la->ak, la->ln1, PDN_PARAM(p, lay, T_AK, l), NULL, N, d, KVD);
    matmul_forward(la->av, la->ln1, PDN_PARAM(p, lay, T_AV, l), NULL, N, d, KVD);
    rope_forward(la->aqr, la->aq, B, T, Ha, D, pos0, c->rope_theta);
    rope_forward(la->akr, la->ak, B, T, Hkv, D, pos0, c->rope_theta);
    if (rs) {
        if (pos0 + T > rs->Tcap) { fail(EXIT_USAGE, "the KV cache holds %d tokens, %d were asked for", rs->Tcap, pos0 + T); }
        size_t cb = (size_t)lay->slot[l] * rs->B * rs->Tcap * KVD; // this layer's cache
        for (int b = 0; b < B; b++) {
            size_t dst = cb + ((size_t)b * rs->Tcap + pos0) * KVD, src = (size_t)b * T * KVD;
            memcpy(rs->kc + dst, la->akr + src, (size_t)T * KVD * sizeof(real));
            memcpy(rs->vc + dst, la->av + src, (size_t)T * KVD * sizeof(real));
        }
        attention_forward(la->ao, la->alse, la->aqr, rs->kc + cb, rs->vc + cb, B, T, pos0 + T, rs->Tcap, Ha, Hkv, D, c->attn_window);
    } else {
        attention_forward(la->ao, la->alse, la->aqr, la->akr, la->av, B, T, T, T, Ha, Hkv, D, c->attn_window);
    }
    matmul_forward(la->h, la->ao, PDN_PARAM(p, lay, T_AO, l), NULL, N, d, d);
}

// its backward: dl->h (N, d) holds dL/dh; accumulates dl->ln1 and the layer's parameter gradients
static void attn_layer_backward(Model* m, const LayerActs* la, LayerActs* dl, int l, int B, int T) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    const real* p = m->params;
    int d = c->d_model, Ha = c->attn_heads, Hkv = c->attn_kv_heads, D = pdn_attn_head_dim(c), KVD = pdn_attn_kv_dim(c);
    size_t N = (size_t)B * T;
    matmul_backward(dl->ao, PDN_PARAM(m->grads, lay, T_AO, l), NULL, dl->h, la->ao, PDN_PARAM(p, lay, T_AO, l), N, d, d);
    attention_backward(dl->aqr, dl->akr, dl->av, dl->ao, la->aqr, la->akr, la->av, la->ao, la->alse, B, T, Ha, Hkv, D,
                       c->attn_window);
    rope_backward(dl->aq, dl->aqr, B, T, Ha, D, 0, c->rope_theta);
    rope_backward(dl->ak, dl->akr, B, T, Hkv, D, 0, c->rope_theta);
    matmul_backward(dl->ln1, PDN_PARAM(m->grads, lay, T_AQ, l), NULL, dl->aq, la->ln1, PDN_PARAM(p, lay, T_AQ, l), N, d, d);
    matmul_backward(dl->ln1, PDN_PARAM(m->grads, lay, T_AK, l), NULL, dl->ak, la->ln1, PDN_PARAM(p, lay, T_AK, l), N, d, KVD);
    matmul_backward(dl->ln1, PDN_PARAM(m->grads, lay, T_AV, l), NULL, dl->av, la->ln1, PDN_PARAM(p, lay, T_AV, l), N, d, KVD);
}

// Forward pass over tokens (B, T) into a->logits (the classifier's rows: every row unless acts_target_rows chose
// some). rs: NULL for training (zero initial state), else the recurrent state, read at the start and advanced past
// these T tokens.
static void pdn_forward(const Model* m, Acts* a, const int* tokens, RecState* rs) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    const real* p = m->params;
    int B = a->B, T = a->T, d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    int HK = H * K, HV = H * V, I = c->mlp_hidden, cs = c->conv_size, gk = pdn_decay_width(c), C = m->C;
    size_t N = (size_t)B * T;
    real eps = c->norm_eps, qscale = R(1) / sqrt(R(K)), bmax = c->neg_eigval ? R(2) : R(1);
    for (size_t n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= c->vocab_size) {
            fail(EXIT_BADFILE, "token id %d at position %zu is outside the model's vocabulary [0, %d)", tokens[n], n, c->vocab_size);
        }
    }
    encoder_forward(a->resid, tokens, PDN_PARAM(p, lay, T_WTE, 0), N, d);
    for (int l = 0; l < c->n_layer; l++) {
#define W(id) PDN_PARAM(p, lay, id, l)
        LayerActs la;
        layer_acts_at(m, a, l, &la);
        real* x = a->resid + (size_t)l * N * d;
        size_t lb = (size_t)l * rs_B(rs);
        rmsnorm_forward(la.ln1, la.ln1_rstd, x, W(T_ATTN_NORM), N, d, eps);
        if (pdn_is_attn(c, l)) {
            attn_layer_forward(m, &la, rs, l, B, T);
        } else {
        matmul_forward(la.qp, la.ln1, W(T_WQ), NULL, N, d, HK);
        matmul_forward(la.kp, la.ln1, W(T_WK), NULL, N, d, HK);
        matmul_forward(la.vp, la.ln1, W(T_WV), NULL, N, d, HV);
        real *hq = rs ? rs->hq + lb * (cs - 1) * HK : NULL, *hk = rs ? rs->hk + lb * (cs - 1) * HK : NULL;
        real* hv = rs ? rs->hv + lb * (cs - 1) * HV : NULL;
        conv_silu_forward(la.qc, la.qs, la.qp, W(T_CONV_Q), hq, a->doc, B, T, HK, cs);
        conv_silu_forward(la.kc, la.ks, la.kp, W(T_CONV_K), hk, a->doc, B, T, HK, cs);
        conv_silu_forward(la.vc, la.v, la.vp, W(T_CONV_V), hv, a->doc, B, T, HV, cs);
        if (rs) {
            conv_history_update(hq, la.qp, B, T, HK, cs);
            conv_history_update(hk, la.kp, B, T, HK, cs);
            conv_history_update(hv, la.vp, B, T, HV, cs);
        }
        l2norm_forward(la.qn, la.q_rstd, la.qs, N * H, K, qscale);
        l2norm_forward(la.kn, la.k_rstd, la.ks, N * H, K, R(1));
        matmul_forward(la.beta_pre, la.ln1, W(T_WB), NULL, N, d, H);
        sigmoid_gate_forward(la.beta, la.beta_pre, N * H, bmax);
        if (c->decay == DECAY_SCALAR) {
            matmul_forward(la.g_pre, la.ln1, W(T_WA), NULL, N, d, H);
            decay_gate_forward(la.g, la.g_pre, W(T_A_LOG), W(T_DT_BIAS), N, H, 1);
        } else if (c->decay == DECAY_CHANNEL) {
            matmul_forward(la.f1, la.ln1, W(T_WF1), NULL, N, d, V);
            matmul_forward(la.g_pre, la.f1, W(T_WF2), NULL, N, V, HK);
            decay_gate_forward(la.g, la.g_pre, W(T_A_LOG), W(T_DT_BIAS), N, H, K);
        }
        if (c->precond == PRECOND_DIAG) {
            matmul_forward(la.gp_pre, la.ln1, W(T_WAP), NULL, N, d, H);
            matmul_forward(la.bp_pre, la.ln1, W(T_WBP), NULL, N, d, H);
            decay_gate_forward(la.gp, la.gp_pre, W(T_A_LOGP), W(T_DT_BIASP), N, H, 1);
            sigmoid_gate_forward(la.betap, la.bp_pre, N * H, R(1));
            real* a0 = rs ? rs->a + lb * H * K : NULL;
            precond_diag_forward(la.kt, la.astat, la.kn, la.gp, la.betap, W(T_LOG_ATK_SCALE), a0, a0, a->doc, B, T, H, K,
                                 c->squash_x, c->precond_eps);
        } else if (c->precond == PRECOND_EXACT) {
            real* P0 = rs ? rs->P + lb * H * K * K : NULL;
            precond_exact_forward(la.kt, la.pstate, la.kn, P0, P0, a->doc, B, T, H, K, C, c->ridge);
        }
        real* S0 = rs ? rs->S + lb * H * K * V : NULL;
        delta_forward(la.o, la.states, la.qn, la.kn, la.kt, la.v, la.beta, gk ? la.g : NULL, S0, S0, a->doc,
                      B, T, H, K, V, gk, C, m->chunk_form);
        rmsnorm_forward(la.on, la.o_rstd, la.o, W(T_O_NORM), N * H, V, eps);
        if (c->out_gate) {
            matmul_forward(la.g1, la.ln1, W(T_WG1), NULL, N, d, V);
            matmul_forward(la.gz, la.g1, W(T_WG2), W(T_BG2), N, V, HV);
            sigmoid_mul_forward(la.og, la.on, la.gz, N * HV);
        }
        matmul_forward(la.h, la.og, W(T_WO), NULL, N, HV, d);
        }
        add_inplace(la.h, x, N * d);
        rmsnorm_forward(la.ln2, la.ln2_rstd, la.h, W(T_MLP_NORM), N, d, eps);
        matmul_forward(la.mg, la.ln2, W(T_WGATE), NULL, N, d, I);
        matmul_forward(la.mu, la.ln2, W(T_WUP), NULL, N, d, I);
        swiglu_forward(la.ma, la.mg, la.mu, N * I);
        real* xo = a->resid + (size_t)(l + 1) * N * d;
        matmul_forward(xo, la.ma, W(T_WDOWN), NULL, N, I, d);
        add_inplace(xo, la.h, N * d);
#undef W
    }
    rmsnorm_forward(a->lnf, a->lnf_rstd, a->resid + (size_t)c->n_layer * N * d, PDN_PARAM(p, lay, T_FINAL_NORM, 0), N, d, eps);
    logits_forward(m, a, 0);
    if (rs) { rs->pos += T; }
}

// Backward pass: a->logits must hold dL/dlogits (crossentropy_backward). Accumulates into m->grads.
static void pdn_backward(Model* m, Acts* a, const int* tokens) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    const real* p = m->params;
    int B = a->B, T = a->T, d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    int HK = H * K, HV = H * V, I = c->mlp_hidden, cs = c->conv_size, gk = pdn_decay_width(c), C = m->C;
    size_t N = (size_t)B * T;
    real qscale = R(1) / sqrt(R(K)), bmax = c->neg_eigval ? R(2) : R(1);
    int head = c->tie_embeddings ? T_WTE : T_LM_HEAD;
    memset(a->dlnf, 0, N * d * sizeof(real));
    memset(a->dresid, 0, N * d * sizeof(real));
    if (a->M < N) { // the classifier's rows only (acts_target_rows); the other rows' gradient stays 0
        memset(a->dlnf_rows, 0, a->M * d * sizeof(real));
        matmul_backward(a->dlnf_rows, PDN_PARAM(m->grads, lay, head, 0), NULL, a->logits, a->lnf_rows,
                        PDN_PARAM(p, lay, head, 0), (int)a->M, d, c->vocab_size);
        for (size_t i = 0; i < a->M; i++) { memcpy(a->dlnf + (size_t)a->rows[i] * d, a->dlnf_rows + i * d, d * sizeof(real)); }
    } else {
        matmul_backward(a->dlnf, PDN_PARAM(m->grads, lay, head, 0), NULL, a->logits, a->lnf, PDN_PARAM(p, lay, head, 0),
                        N, d, c->vocab_size);
    }
    rmsnorm_backward(a->dresid, PDN_PARAM(m->grads, lay, T_FINAL_NORM, 0), a->dlnf, a->resid + (size_t)c->n_layer * N * d,
                     PDN_PARAM(p, lay, T_FINAL_NORM, 0), a->lnf_rstd, N, d);
    for (int l = c->n_layer - 1; l >= 0; l--) {
#define W(id) PDN_PARAM(p, lay, id, l)
#define DW(id) PDN_PARAM(m->grads, lay, id, l)
        LayerActs la, dl;
        layer_acts_at(m, a, l, &la);
        layer_acts_point(&dl, a->gmem, c, B, T, C, 0, pdn_is_attn(c, l));
        memset(a->gmem, 0, a->gsize * sizeof(real));
        const real* x = a->resid + (size_t)l * N * d;
        // MLP: out = h + W_down (silu(W_gate ln2) ⊙ W_up ln2), ln2 = RMSNorm(h); a->dresid = dL/dout
        memcpy(dl.h, a->dresid, N * d * sizeof(real));
        matmul_backward(dl.ma, DW(T_WDOWN), NULL, a->dresid, la.ma, W(T_WDOWN), N, I, d);
        swiglu_backward(dl.mg, dl.mu, dl.ma, la.mg, la.mu, N * I);
        matmul_backward(dl.ln2, DW(T_WGATE), NULL, dl.mg, la.ln2, W(T_WGATE), N, d, I);
        matmul_backward(dl.ln2, DW(T_WUP), NULL, dl.mu, la.ln2, W(T_WUP), N, d, I);
        rmsnorm_backward(dl.h, DW(T_MLP_NORM), dl.ln2, la.h, W(T_MLP_NORM), la.ln2_rstd, N, d);
        memcpy(a->dresid, dl.h, N * d * sizeof(real));
        if (pdn_is_attn(c, l)) {
            attn_layer_backward(m, &la, &dl, l, B, T);
            rmsnorm_backward(a->dresid, DW(T_ATTN_NORM), dl.ln1, x, W(T_ATTN_NORM), la.ln1_rstd, N, d);
            continue;
        }
        // mixer: h = x + W_o og
        matmul_backward(dl.og, DW(T_WO), NULL, dl.h, la.og, W(T_WO), N, HV, d);
        if (c->out_gate) {
            sigmoid_mul_backward(dl.on, dl.gz, dl.og, la.on, la.gz, N * HV);
            matmul_backward(dl.g1, DW(T_WG2), DW(T_BG2), dl.gz, la.g1, W(T_WG2), N, V, HV);
            matmul_backward(dl.ln1, DW(T_WG1), NULL, dl.g1, la.ln1, W(T_WG1), N, d, V);
        }
        rmsnorm_backward(dl.o, DW(T_O_NORM), dl.on, la.o, W(T_O_NORM), la.o_rstd, N * H, V);
        delta_backward(dl.qn, dl.kn, dl.kt, dl.v, dl.beta, gk ? dl.g : NULL, NULL, dl.o, NULL, la.qn, la.kn, la.kt,
                       la.v, la.beta, gk ? la.g : NULL, la.states, a->doc, B, T, H, K, V, gk, C, m->chunk_form);
        if (c->precond == PRECOND_DIAG) {
            precond_diag_backward(dl.kn, dl.gp, dl.betap, DW(T_LOG_ATK_SCALE), dl.kt, la.kn, la.gp, la.betap, la.astat,
                                  W(T_LOG_ATK_SCALE), NULL, a->doc, B, T, H, K, c->squash_x, c->precond_eps);
            decay_gate_backward(dl.gp_pre, DW(T_A_LOGP), DW(T_DT_BIASP), dl.gp, la.gp, la.gp_pre, W(T_A_LOGP), W(T_DT_BIASP), N, H, 1);
            sigmoid_gate_backward(dl.bp_pre, dl.betap, la.betap, N * H, R(1));
            matmul_backward(dl.ln1, DW(T_WAP), NULL, dl.gp_pre, la.ln1, W(T_WAP), N, d, H);
            matmul_backward(dl.ln1, DW(T_WBP), NULL, dl.bp_pre, la.ln1, W(T_WBP), N, d, H);
        } else if (c->precond == PRECOND_EXACT) {
            precond_exact_backward(dl.kn, dl.kt, la.kn, la.pstate, a->doc, B, T, H, K, C, c->ridge);
        }
        if (c->decay == DECAY_SCALAR) {
            decay_gate_backward(dl.g_pre, DW(T_A_LOG), DW(T_DT_BIAS), dl.g, la.g, la.g_pre, W(T_A_LOG), W(T_DT_BIAS), N, H, 1);
            matmul_backward(dl.ln1, DW(T_WA), NULL, dl.g_pre, la.ln1, W(T_WA), N, d, H);
        } else if (c->decay == DECAY_CHANNEL) {
            decay_gate_backward(dl.g_pre, DW(T_A_LOG), DW(T_DT_BIAS), dl.g, la.g, la.g_pre, W(T_A_LOG), W(T_DT_BIAS), N, H, K);
            matmul_backward(dl.f1, DW(T_WF2), NULL, dl.g_pre, la.f1, W(T_WF2), N, V, HK);
            matmul_backward(dl.ln1, DW(T_WF1), NULL, dl.f1, la.ln1, W(T_WF1), N, d, V);
        }
        sigmoid_gate_backward(dl.beta_pre, dl.beta, la.beta, N * H, bmax);
        matmul_backward(dl.ln1, DW(T_WB), NULL, dl.beta_pre, la.ln1, W(T_WB), N, d, H);
        l2norm_backward(dl.qs, dl.qn, la.qn, la.q_rstd, N * H, K, qscale);
        l2norm_backward(dl.ks, dl.kn, la.kn, la.k_rstd, N * H, K, R(1));
        conv_silu_backward(dl.qp, DW(T_CONV_Q), dl.qs, la.qc, la.qp, W(T_CONV_Q), a->doc, B, T, HK, cs);
        conv_silu_backward(dl.kp, DW(T_CONV_K), dl.ks, la.kc, la.kp, W(T_CONV_K), a->doc, B, T, HK, cs);
        conv_silu_backward(dl.vp, DW(T_CONV_V), dl.v, la.vc, la.vp, W(T_CONV_V), a->doc, B, T, HV, cs);
        matmul_backward(dl.ln1, DW(T_WQ), NULL, dl.qp, la.ln1, W(T_WQ), N, d, HK);
        matmul_backward(dl.ln1, DW(T_WK), NULL, dl.kp, la.ln1, W(T_WK), N, d, HK);
        matmul_backward(dl.ln1, DW(T_WV), NULL, dl.vp, la.ln1, W(T_WV), N, d, HV);
        rmsnorm_backward(a->dresid, DW(T_ATTN_NORM), dl.ln1, x, W(T_ATTN_NORM), la.ln1_rstd, N, d);
#undef W
#undef DW
    }
    encoder_backward(PDN_PARAM(m->grads, lay, T_WTE, 0), a->dresid, tokens, N, d);
}

// One micro-batch: forward, loss, backward (gradients accumulate). Returns the mean loss over the positions
// with a target; dloss_scale = 1 / (targets in the micro-batch * grad_accum) makes accumulated gradients the
// mean over the whole step. logits: if not NULL, gets the (N, vocab) logits before the softmax (every row).
static double pdn_forward_backward(Model* m, Acts* a, const int* x, const int* y, int grad_accum, float* logits) {
    size_t N = (size_t)a->B * a->T;
    const int* yr = acts_target_rows(a, y);
    pdn_forward(m, a, x, NULL);
    if (logits) {
        logits_forward(m, a, 1);
        for (size_t i = 0; i < N * m->cfg.vocab_size; i++) { logits[i] = (float)a->logits[i]; }
        logits_forward(m, a, 0);
    }
    long count;
    double sum = crossentropy_forward(a->logits, a->losses, yr, a->M, m->cfg.vocab_size, &count);
    crossentropy_backward(a->logits, yr, a->M, m->cfg.vocab_size, count ? R(1.0 / ((double)count * grad_accum)) : R(0));
    pdn_backward(m, a, x);
    acts_all_rows(a);
    return count ? sum / count : 0.0;
}

// L2 norm of a buffer: fixed-size blocks summed in parallel in double, then the blocks in order
static double global_norm(const real* g, size_t n) {
    size_t blk = 1 << 16, nb = (n + blk - 1) / blk;
    double* part = (double*)callocCheck(nb, sizeof(double));
    #pragma omp parallel for
    for (size_t i = 0; i < nb; i++) {
        double s = 0.0;
        for (size_t j = i * blk; j < (i + 1) * blk && j < n; j++) { s += (double)g[j] * g[j]; }
        part[i] = s;
    }
    double s = 0.0;
    for (size_t i = 0; i < nb; i++) { s += part[i]; }
    free(part);
    return sqrt(s);
}

// AdamW (decoupled weight decay, MODEL.md §6: only tensors flagged wd). grad_scale folds in the clipping. t >= 1.
// Returns the number of elements whose parameter or moments are no longer finite (a g*g that overflows, say).
static long adamw_update(Model* m, float lr, float beta1, float beta2, float eps, float weight_decay, int t, real grad_scale) {
    size_t n = m->lay.num_elems;
    if (!m->m) { m->m = (real*)callocCheck(n, sizeof(real)); m->v = (real*)callocCheck(n, sizeof(real)); }
    real bc1 = R(1.0 - pow(beta1, t)), bc2 = R(1.0 - pow(beta2, t));
    long bad = 0;
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* tt = &m->lay.t[i];
        real wd = tt->wd ? R(weight_decay) : R(0);
        #pragma omp parallel for reduction(+:bad)
        for (size_t j = tt->offset; j < tt->offset + tt->numel; j++) {
            real g = m->grads[j] * grad_scale;
            m->m[j] = R(beta1) * m->m[j] + R(1.0f - beta1) * g;
            m->v[j] = R(beta2) * m->v[j] + R(1.0f - beta2) * g * g;
            real mh = m->m[j] / bc1, vh = m->v[j] / bc2;
            m->params[j] -= R(lr) * (mh / (sqrt(vh) + R(eps)) + wd * m->params[j]);
            bad += !(isfinite(m->params[j]) && isfinite(m->m[j]) && isfinite(m->v[j]));
        }
    }
    return bad;
}

static void model_init(Model* m, const PdnConfig* c, int C, int chunk_form) {
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    pdn_build_layout(c, &m->lay);
    m->params = (real*)callocCheck(m->lay.num_elems, sizeof(real));
    m->grads = (real*)callocCheck(m->lay.num_elems, sizeof(real));
    m->C = C;
    m->chunk_form = chunk_form;
}

static void model_free(Model* m) { free(m->params); free(m->grads); free(m->m); free(m->v); }

// ----------------------------------------------------------------------------------------------------
// 4. recurrent inference: the state carries everything, so each new token costs the same whatever came before

// Tcap: the most tokens a sequence will hold (the attention layers' KV cache; the mixer's state has a fixed size)
static RecState recstate_alloc(const PdnConfig* c, int B, real ridge, int Tcap) {
    RecState r;
    size_t L = c->n_layer, H = c->n_head, K = c->head_k, V = pdn_head_v(c), cs1 = c->conv_size - 1;
    size_t kv = (size_t)layerset_count(&c->attn_layers) * B * Tcap * pdn_attn_kv_dim(c);
    r.B = B;
    r.Tcap = Tcap;
    r.pos = 0;
    r.kc = (real*)callocCheck(kv + 1, sizeof(real));
    r.vc = (real*)callocCheck(kv + 1, sizeof(real));
    r.hq = (real*)callocCheck(L * B * cs1 * H * K + 1, sizeof(real));
    r.hk = (real*)callocCheck(L * B * cs1 * H * K + 1, sizeof(real));
    r.hv = (real*)callocCheck(L * B * cs1 * H * V + 1, sizeof(real));
    r.S = (real*)callocCheck(L * B * H * K * V, sizeof(real));
    r.a = (real*)callocCheck(L * B * H * K, sizeof(real));
    r.P = (real*)callocCheck(c->precond == PRECOND_EXACT ? L * B * H * K * K : 1, sizeof(real));
    if (c->precond == PRECOND_EXACT) {
        for (size_t e = 0; e < L * B * H * K * K; e++) { r.P[e] = (e % (K * K)) % (K + 1) == 0 ? R(1) / ridge : R(0); }
    }
    return r;
}

static void recstate_free(RecState* r) {
    free(r->hq); free(r->hk); free(r->hv); free(r->S); free(r->a); free(r->P); free(r->kc); free(r->vc);
}

// ----------------------------------------------------------------------------------------------------
// 5. training

// The calls of train_common.h's run (evaluation, generation, checkpoints, the loop) for a model in host memory.
struct Trainer {
    Model m;
    Acts acts;                  // (B, T) with gradients: training, evaluation, --debug-state
    const TrainConfig* tc;
    double t0;                  // the step's start
    Acts eval;                  // (eval_B, eval_T) without gradients: tr_logprobs (--eval)
    int eval_B, eval_T;
};

static void tr_step_begin(Trainer* tr) {
    tr->t0 = wall_seconds();
    memset(tr->m.grads, 0, tr->m.lay.num_elems * sizeof(real));
}

static double tr_forward_backward(Trainer* tr, const int* x, const int* y, const int* doc, int accum, int last,
                                  float* logits) {
    (void)last; // one process: no gradient exchange
    tr->acts.doc = doc;
    return pdn_forward_backward(&tr->m, &tr->acts, x, y, accum, logits);
}

// one process: the loss and the stop request are already everyone's
static double tr_grad_norm(Trainer* tr, double* loss, int* stop) {
    (void)loss; (void)stop;
    return global_norm(tr->m.grads, tr->m.lay.num_elems);
}

static int tr_update(Trainer* tr, float lr, long step, double grad_scale) {
    const TrainConfig* tc = tr->tc;
    return adamw_update(&tr->m, lr, tc->beta1, tc->beta2, tc->adam_eps, tc->weight_decay, (int)step, R(grad_scale)) > 0;
}

static void tr_skip(Trainer* tr, long step) { (void)tr; (void)step; } // the parameters are the master weights

static double tr_step_end(Trainer* tr, int timed) { (void)timed; return wall_seconds() - tr->t0; }

static double tr_eval_batch(Trainer* tr, const int* x, const int* y, const int* doc, long* count, long* hits) {
    const Model* m = &tr->m;
    Acts* a = &tr->acts;
    a->doc = doc;
    int Vv = m->cfg.vocab_size;
    const int* yr = acts_target_rows(a, y);
    pdn_forward(m, a, x, NULL);
    *hits = 0;
    for (size_t n = 0; n < a->M; n++) {
        if (yr[n] < 0) { continue; }
        const real* lg = a->logits + n * Vv;
        int best = 0;
        for (int i = 1; i < Vv; i++) { if (lg[i] > lg[best]) { best = i; } }
        *hits += best == yr[n];
    }
    double sum = crossentropy_forward(a->logits, a->losses, yr, a->M, Vv, count);
    acts_all_rows(a);
    return sum;
}

static void tr_sum(Trainer* tr, double* v, int n) { (void)tr; (void)v; (void)n; }

static void tr_host_state(Trainer* tr, real* params, real* m, real* v) {
    size_t n = tr->m.lay.num_elems;
    memcpy(params, tr->m.params, n * sizeof(real));
    if (tr->m.m) { memcpy(m, tr->m.m, n * sizeof(real)); } else { memset(m, 0, n * sizeof(real)); } // before any update
    if (tr->m.v) { memcpy(v, tr->m.v, n * sizeof(real)); } else { memset(v, 0, n * sizeof(real)); }
}

static void tr_grads(Trainer* tr, float* out) {
    for (size_t i = 0; i < tr->m.lay.num_elems; i++) { out[i] = (float)tr->m.grads[i]; }
}

struct GenState { const Model* m; RecState rs; Acts ap, a1; };

static GenState* tr_gen_open(Trainer* tr, int P, int total) {
    GenState* g = (GenState*)mallocCheck(sizeof(GenState));
    g->m = &tr->m;
    g->rs = recstate_alloc(&tr->m.cfg, 1, tr->m.cfg.ridge, total);
    g->ap = acts_alloc(g->m, 1, P, 0);
    g->a1 = acts_alloc(g->m, 1, 1, 0);
    return g;
}

static void tr_gen_feed(GenState* g, const int* tokens, int n, float* row) {
    Acts* a = n == 1 ? &g->a1 : &g->ap;
    acts_last_row(a);
    pdn_forward(g->m, a, tokens, &g->rs);
    acts_all_rows(a);
    int Vv = g->m->cfg.vocab_size;
    for (int v = 0; v < Vv; v++) { row[v] = (float)a->logits[v]; }
}

static void tr_gen_close(GenState* g) { acts_free(&g->ap); acts_free(&g->a1); recstate_free(&g->rs); free(g); }

static void tr_logprobs(Trainer* tr, int B, int T, const int* x, const int* y, float* lp) {
    const Model* m = &tr->m;
    if (tr->eval_B != B || tr->eval_T != T) {
        if (tr->eval_B) { acts_free(&tr->eval); }
        tr->eval = acts_alloc(m, B, T, 0);
        tr->eval_B = B; tr->eval_T = T;
    }
    Acts* a = &tr->eval;
    int Vv = m->cfg.vocab_size;
    size_t N = (size_t)B * T;
    pdn_forward(m, a, x, NULL);
    // log-softmax at the target, in double: logit - max - log(sum of exp(logit - max))
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        if (y[n] < 0 || y[n] >= Vv) { lp[n] = 0.0f; continue; }
        const real* lg = a->logits + n * Vv;
        double mx = lg[0], s = 0.0;
        for (int i = 1; i < Vv; i++) { mx = lg[i] > mx ? lg[i] : mx; }
        for (int i = 0; i < Vv; i++) { s += exp((double)lg[i] - mx); }
        lp[n] = (float)((double)lg[y[n]] - mx - log(s));
    }
}

static void tr_watch(Trainer* tr, const char* phase) { (void)tr; (void)phase; }

#ifndef TESTING
int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); // a line at a time even into a pipe (| tee): each step shows as it ends
#if defined(__SSE__) && !defined(PDN_DOUBLE)
    // subnormals flushed to zero (FTZ + DAZ; OpenMP's threads inherit it): state directions that decay without being
    // written reach the subnormal range after a few thousand tokens, and each operation on one costs ~100x (decoding
    // after an S-NIAH prompt ran at a few tokens/s); values below 1.2e-38 change nothing a loss can see
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
    PdnConfig mc;
    TrainConfig tc;
    parse_args(argc, argv, &mc, &tc);
    train_config_check(&tc, 1);
    if (tc.world_size > 1 || tc.dist_host[0] || tc.dist_dir[0]) {
        fail(EXIT_USAGE, "the CPU trainer runs in one process: --world-size, --dist-host and --dist-dir are for train_pdncu");
    }
    if (hf_command(&tc)) { return 0; }
    char device[64];
#ifdef _OPENMP
    if (tc.threads > 0) { omp_set_num_threads(tc.threads); }
    if (tc.threads > omp_get_num_procs()) {
        fprintf(stderr, "warning: --threads %d is more than the %d cores here: threads will take turns (slower, same results)\n",
                tc.threads, omp_get_num_procs());
    }
    int nthreads = omp_get_max_threads();
    snprintf(device, sizeof device, "CPU, %d OpenMP thread%s", nthreads, nthreads == 1 ? "" : "s");
#else
    snprintf(device, sizeof device, "CPU, 1 thread (built without OpenMP)");
#endif

    // the model: from a checkpoint (-e, or -y 1 with one in -o), else from the flags; a vocabulary the preset leaves
    // at 0 comes from the data source (MQAR: --mqar-vocab; text: the tokenizer, else the shards)
    Trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.tc = &tc;
    Model* m = &tr.m;
    real* loaded = NULL;
    uint32_t loaded_crc = 0;
    char resume_state[1100];
    Tokenizer tok_mem;
    DataSource ds;
    Tokenizer* tok = run_setup(&tc, &mc, &loaded, &loaded_crc, resume_state, sizeof resume_state, &tok_mem, &ds, 0, 1);
    if (tc.count_params) { print_param_table(&mc); return 0; }
    model_init(m, &mc, tc.chunk, tc.chunk_form);
    if (loaded) { memcpy(m->params, loaded, m->lay.num_elems * sizeof(real)); free(loaded); }
    else { pdn_init_params(&mc, &m->lay, m->params, (uint64_t)tc.seed); }
    char precision[32];
    snprintf(precision, sizeof precision, "cpu-%s", REAL_DTYPE);
    Run run;
    run_init(&run, &tc, &mc, &m->lay, &ds, tok, 0, 1, precision);

    if (tc.eval[0]) {
        run_eval(&tr, &run);
        if (tr.eval_B) { acts_free(&tr.eval); }
        model_free(m);
        if (tok) { tokenizer_free(tok); }
        return 0;
    }
    if (tc.generate) {
        run_generate(&tr, &run);
        model_free(m);
        if (tok) { tokenizer_free(tok); }
        return 0;
    }
    if (resume_state[0]) { // the optimizer moments, the step and the data position
        m->m = (real*)callocCheck(m->lay.num_elems, sizeof(real));
        m->v = (real*)callocCheck(m->lay.num_elems, sizeof(real));
        run.start_step = resume_state_read(resume_state, &tc, 1, loaded_crc, &ds, m->m, m->v, m->lay.num_elems, REAL_DTYPE);
    }
    run_check(&run);
    print_config_box(&mc, &tc, &m->lay, device, REAL_DTYPE);
    if (tc.recompute) { printf("--recompute 1: the CPU reference keeps every layer's activations (the flag is train_pdncu's)\n"); }
    tr.acts = acts_alloc(m, tc.B, tc.T, 1);
    int rc = 0;
    if (tc.debug_state[0]) { run_debug_state(&tr, &run); }
    else {
        rc = run_train(&tr, &run);
        print_done(&run, "");
    }
    acts_free(&tr.acts);
    model_free(m);
    data_free(&ds);
    if (tok) { tokenizer_free(tok); }
    return rc;
}
#endif
