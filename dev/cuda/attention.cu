/*
Kernel lab: softmax attention of the hybrid models' attention layers (issue 19; train_pdn.c section 2b is the
definition, train_pdn.cu sections 3b-3d the kernels), causal, optionally in a sliding window of W tokens (the query's
own included), grouped-query heads (query head h reads key/value head h / (Hq / Hkv)), scale 1/sqrt(D):
  forward:  o = softmax(q kᵀ / sqrt(D)) v per row over the keys it sees; lse = the row's log-sum-exp (B, Hq, T)
  backward: with P = exp(s - lse), Di = rowsum(dO ⊙ o): dv = Pᵀ dO, dS = P ⊙ (dO vᵀ - Di), dq = dS k / sqrt(D),
            dk = dSᵀ q / sqrt(D) (summed over the query heads of a key/value head)
Layouts as the trainer has them: q, o, dO (B, T, Hq, D); k, v (B, T, Hkv, D).

Versions:
  v1  the trainer's own kernels: attention_forward_own (a warp per query row, online softmax) and
      attention_backward_own (a warp per query row for dq and Di, a warp per key row for dk and dv; deterministic)
  v2  cuDNN's fused flash attention through the trainer's backend graphs (sdpa_build: the SDPA forward pattern, causal
      and windowed, head dim a multiple of 8 up to 128; the backward pattern where every query head has its own key/value
      head, else v1's backward on cuDNN's o and lse). bf16 build only; where a graph does not finalize the reason is
      printed and that part counts as not run (no check fails for it)

CPU reference in double from the inputs as the device sees them (rounded to floatX).
Validation shapes: (B 2, T 77, Hq 4, Hkv 2, D 64), (1, 130, 2, 2, 128), (2, 50, 4, 1, 32, W 9), (1, 96, 2, 2, 64, W 17)
(v2 grouped-query shapes: the backward graph over K, V repeated to every query head, then summed per group).
Tolerances (relative L2): fp32 build every output 1e-5 (the same sums in another order); bf16 build: lse, dq, dk (fp32
outputs from bf16 inputs; the reference's D = dout . o uses o rounded to bf16, as the backward reads it) 1e-4, o and
dv (rounded to bf16: 2^-9 relative) 1e-2; v2 (cuDNN rounds P to bf16 before P v)
o 2e-2, lse 1e-4, gradients (bf16 from cuDNN, or v1's from cuDNN's o) 2e-2.
Timing: the 340m hybrid's attention layer, B 16 x T 2048, 8 heads of 128 (and 2 kv heads), full causal; TFLOP/s counts
the causal half: forward 2 matmuls of B H T²/2 D, backward 5.

Build and run (from the repository root):
  make -C dev/cuda attention attention_fp32
  dev/cuda/attention [1|2] [--no-bench]
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 2
static const char* VERSION_NAME[3] = {"", "v1 own kernels", "v2 cuDNN fwd"};

struct AttnShape { int B, T, Hq, Hkv, D, W; };

// the reference in double: o, lse (B, Hq, T), and the gradients for dout
static void attn_reference(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const std::vector<float>& dout, std::vector<double>& o,
                           std::vector<double>& lse, std::vector<double>& dq, std::vector<double>& dk,
                           std::vector<double>& dv) {
    int B = s.B, T = s.T, Hq = s.Hq, Hkv = s.Hkv, D = s.D, G = Hq / Hkv;
    double scale = 1.0 / sqrt((double)D);
    o.assign((size_t)B * T * Hq * D, 0.0); lse.assign((size_t)B * Hq * T, 0.0);
    dq.assign(o.size(), 0.0); dk.assign((size_t)B * T * Hkv * D, 0.0); dv.assign(dk.size(), 0.0);
    std::vector<double> p(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            int hk = h / G;
            for (int t = 0; t < T; t++) {
                int j0 = s.W > 0 && t - s.W + 1 > 0 ? t - s.W + 1 : 0;
                size_t qi = (((size_t)b * T + t) * Hq + h) * D;
                double mx = -INFINITY, sum = 0.0;
                for (int j = j0; j <= t; j++) {
                    size_t ki = (((size_t)b * T + j) * Hkv + hk) * D;
                    double dot = 0.0;
                    for (int e = 0; e < D; e++) { dot += (double)q[qi + e] * k[ki + e]; }
                    p[j] = dot * scale;
                    mx = std::max(mx, p[j]);
                }
                for (int j = j0; j <= t; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
                for (int j = j0; j <= t; j++) {
                    p[j] /= sum;
                    size_t ki = (((size_t)b * T + j) * Hkv + hk) * D;
                    for (int e = 0; e < D; e++) { o[qi + e] += p[j] * v[ki + e]; }
                }
                lse[((size_t)b * Hq + h) * T + t] = mx + log(sum);
                // D = dout . o from o as the device stores it (floatX): the backward reads the stored o, and its
                // bf16 rounding (2^-9) would otherwise dominate the fp32 gradients' error
                double di = 0.0;
                for (int e = 0; e < D; e++) { di += (double)dout[qi + e] * lab_round((float)o[qi + e]); }
                for (int j = j0; j <= t; j++) {
                    size_t ki = (((size_t)b * T + j) * Hkv + hk) * D;
                    double dp = 0.0;
                    for (int e = 0; e < D; e++) { dp += (double)dout[qi + e] * v[ki + e]; }
                    double ds = p[j] * (dp - di) * scale;
                    for (int e = 0; e < D; e++) {
                        dv[ki + e] += p[j] * dout[qi + e];
                        dq[qi + e] += ds * k[ki + e];
                        dk[ki + e] += ds * q[qi + e];
                    }
                }
            }
        }
    }
}

struct AttnDev { floatX *q, *k, *v, *o, *dout, *dv, *dqx, *dkx; float *lse, *dq, *dk, *di; };

static void attn_alloc(AttnDev& d, const AttnShape& s) {
    long nq = (long)s.B * s.T * s.Hq * s.D, nk = (long)s.B * s.T * s.Hkv * s.D, nr = (long)s.B * s.Hq * s.T;
    cudaCheck(cudaMalloc(&d.q, nq * sizeof(floatX))); cudaCheck(cudaMalloc(&d.o, nq * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.dout, nq * sizeof(floatX))); cudaCheck(cudaMalloc(&d.dq, nq * sizeof(float)));
    cudaCheck(cudaMalloc(&d.k, nk * sizeof(floatX))); cudaCheck(cudaMalloc(&d.v, nk * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.dv, nk * sizeof(floatX))); cudaCheck(cudaMalloc(&d.dk, nk * sizeof(float)));
    cudaCheck(cudaMalloc(&d.lse, nr * sizeof(float))); cudaCheck(cudaMalloc(&d.di, nr * sizeof(float)));
    cudaCheck(cudaMalloc(&d.dqx, nq * sizeof(floatX))); cudaCheck(cudaMalloc(&d.dkx, nk * sizeof(floatX)));
}
static void attn_free(AttnDev& d) {
    floatX* x[] = {d.q, d.k, d.v, d.o, d.dout, d.dv, d.dqx, d.dkx};
    float* f[] = {d.lse, d.dq, d.dk, d.di};
    for (auto p : x) { cudaCheck(cudaFree(p)); }
    for (auto p : f) { cudaCheck(cudaFree(p)); }
}

// version v's forward; returns 0 when it cannot run here (v2 without a cuDNN plan)
static int attn_forward(AttnDev& d, const AttnShape& s, int v) {
    if (v == 1) { attention_forward_own(d.o, d.lse, d.q, d.k, d.v, s.B, s.T, s.T, s.T, s.Hq, s.Hkv, s.D, s.W); return 1; }
#ifdef USE_CUDNN
    if (sdpa_fits(sdpa_fwd, s.B, s.T, s.Hq, s.Hkv, s.D, s.W)) { sdpa_forward(d.o, d.lse, d.q, d.k, d.v, s.D); return 1; }
#endif
    return 0;
}

// version v's backward; returns 1 when dq, dk came as floatX (cuDNN: d.dqx, d.dkx), 0 as fp32 (d.dq, d.dk)
static int attn_backward(AttnDev& d, const AttnShape& s, int v) {
#ifdef USE_CUDNN
    if (v == 2 && sdpa_fits(sdpa_bwd, s.B, s.T, s.Hq, s.Hkv, s.D, s.W)) {
        sdpa_backward(d.dqx, d.dkx, d.dv, d.dout, d.q, d.k, d.v, d.o, d.lse, s.D);
        return 1;
    }
#else
    (void)v;
#endif
    attention_backward_own(d.dq, d.dk, d.dv, d.di, d.dout, d.q, d.k, d.v, d.o, d.lse, s.B, s.T, s.Hq, s.Hkv, s.D, s.W);
    return 0;
}

// v2's plan for a shape (bf16 build): 1 if built
static int attn_prepare(const AttnShape& s, int v) {
#ifdef USE_CUDNN
    if (v != 2) { return 1; }
    sdpa_build(s.B, s.T, s.Hq, s.Hkv, s.D, s.W);
    if (!sdpa_bwd.ok) { printf("  v2 backward: cuDNN's graph not built (v1's backward runs): %s\n", sdpa_bwd.why); }
    if (!sdpa_fwd.ok) { printf("  v2: cuDNN's forward graph not built: %s\n", sdpa_fwd.why); return 0; }
    return 1;
#else
    (void)s;
    return v == 1;
#endif
}

static void validate_case(int vsel, const AttnShape& s, uint64_t seed) {
    long nq = (long)s.B * s.T * s.Hq * s.D, nk = (long)s.B * s.T * s.Hkv * s.D, nr = (long)s.B * s.Hq * s.T;
    Rng r;
    rng_seed(&r, seed);
    auto fill = [&](std::vector<float>& x, long n, double sd) {
        x.resize(n);
        for (long i = 0; i < n; i++) { x[i] = lab_round((float)(sd * (2.0 * rng_uniform(&r) - 1.0) * 1.7320508)); }
    };
    std::vector<float> q, k, v, dout;
    fill(q, nq, 1.0); fill(k, nk, 1.0); fill(v, nk, 1.0); fill(dout, nq, 1.0);
    std::vector<double> o, lse, dq, dk, dv;
    attn_reference(s, q, k, v, dout, o, lse, dq, dk, dv);
    AttnDev d;
    attn_alloc(d, s);
    auto up = [](floatX* dst, const std::vector<float>& h) {
        std::vector<floatX> x(h.size());
        for (size_t i = 0; i < h.size(); i++) { x[i] = lab_f2x(h[i]); }
        cudaCheck(cudaMemcpy(dst, x.data(), x.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    };
    up(d.q, q); up(d.k, k); up(d.v, v); up(d.dout, dout);
    bool fp32 = sizeof(floatX) == 4;
    for (int ver = 1; ver <= NVERSIONS; ver++) {
        if (vsel && ver != vsel) { continue; }
        if (!attn_prepare(s, ver)) { continue; }
        lab_poison(d.o, nq * sizeof(floatX)); lab_poison(d.lse, nr * sizeof(float));
        lab_poison(d.dq, nq * sizeof(float)); lab_poison(d.dk, nk * sizeof(float)); lab_poison(d.dv, nk * sizeof(floatX));
        lab_poison(d.dqx, nq * sizeof(floatX)); lab_poison(d.dkx, nk * sizeof(floatX));
        if (!attn_forward(d, s, ver)) { continue; }
        int xq = attn_backward(d, s, ver);
        std::vector<float> go = lab_download_x(d.o, nq), gdv = lab_download_x(d.dv, nk), glse = lab_download(d.lse, nr);
        std::vector<float> gdq = xq ? lab_download_x(d.dqx, nq) : lab_download(d.dq, nq);
        std::vector<float> gdk = xq ? lab_download_x(d.dkx, nk) : lab_download(d.dk, nk);
        double to = fp32 ? 1e-5 : ver == 2 ? 2e-2 : 1e-2, tl = fp32 ? 1e-5 : 1e-4;
        double tg = fp32 ? 1e-5 : ver == 2 ? 2e-2 : 1e-4, tv = fp32 ? 1e-5 : ver == 2 ? 2e-2 : 1e-2;
        char what[160];
        const char* nm[5] = {"o", "lse", "dq", "dk", "dv"};
        double err[5] = {rel_l2(go.data(), o.data(), nq), rel_l2(glse.data(), lse.data(), nr), rel_l2(gdq.data(), dq.data(), nq),
                         rel_l2(gdk.data(), dk.data(), nk), rel_l2(gdv.data(), dv.data(), nk)};
        double tol[5] = {to, tl, tg, tg, tv};
        for (int i = 0; i < 5; i++) {
            snprintf(what, sizeof what, "%-14s B%d T%d Hq%d Hkv%d D%d W%d %-3s", VERSION_NAME[ver], s.B, s.T, s.Hq, s.Hkv,
                     s.D, s.W, nm[i]);
            lab_check(what, err[i], tol[i]);
        }
    }
    attn_free(d);
}

static void bench(int vsel) {
    printf("\n=== timing: attention (%s), the 340m hybrid's layer: B 16, T 2048, D 128, full causal ===\n", PRECISION_NAME);
    printf("%-16s %5s %10s %8s %10s %8s\n", "version", "Hkv", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s");
    for (int hkv : {8, 2}) {
        AttnShape s{16, 2048, 8, hkv, 128, 0};
        AttnDev d;
        attn_alloc(d, s);
        long nq = (long)s.B * s.T * s.Hq * s.D, nk = (long)s.B * s.T * s.Hkv * s.D;
        lab_fill(d.q, nq, FILL_NORMAL, 0.0f, 1.0f, 51); lab_fill(d.k, nk, FILL_NORMAL, 0.0f, 1.0f, 52);
        lab_fill(d.v, nk, FILL_NORMAL, 0.0f, 1.0f, 53); lab_fill(d.dout, nq, FILL_NORMAL, 0.0f, 1.0f, 54);
        double half = (double)s.B * s.Hq * s.T * (s.T + 1) / 2.0 * s.D; // causal: the lower triangle
        for (int ver = 1; ver <= NVERSIONS; ver++) {
            if (vsel && ver != vsel) { continue; }
            if (!attn_prepare(s, ver)) { continue; }
            double tf = bench_ms([&] { attn_forward(d, s, ver); });
            double tb = bench_ms([&] { attn_backward(d, s, ver); });
            printf("%-16s %5d %10.3f %8.1f %10.3f %8.1f\n", VERSION_NAME[ver], hkv, tf, 4.0 * half / tf / 1e9, tb,
                   10.0 * half / tb / 1e9);
            fflush(stdout);
        }
        attn_free(d);
    }
    printf("\n");
}

int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    if (a.validate) {
        printf("\n=== validation: attention (%s) vs the CPU reference in double ===\n", PRECISION_NAME);
        AttnShape shapes[] = {{2, 77, 4, 2, 64, 0}, {1, 130, 2, 2, 128, 0}, {2, 50, 4, 1, 32, 9}, {1, 96, 2, 2, 64, 17}};
        uint64_t seed = 900;
        for (const AttnShape& s : shapes) { validate_case(a.version, s, seed++); }
    }
    if (a.bench) { bench(a.version); }
    return lab_finish("attention");
}
