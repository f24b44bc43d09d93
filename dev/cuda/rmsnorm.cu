/*
Kernel lab: RMSNorm (MODEL.md §2) with the fused residual add, forward and backward, as train_pdn.cu runs it.
  forward:  resid = a + b (rounded to floatX: the stored residual), out = resid * rstd * w, rstd = 1/sqrt(mean(resid²) + eps)
            (without b: out = a * rstd * w, nothing written to resid)
  backward: dinp += rstd dy ⊙ w - rstd³ (Σ dy ⊙ w ⊙ x) / C · x;   dw += Σ_rows dy ⊙ x · rstd
            (dy fp32, x floatX: the trainer's only combination; dinp and dw accumulate, as in the trainer)

Versions:
  v1  naive: one thread per row for the forward and for dinp (uncoalesced), one thread per column over all rows for dw
  v2  the trainer's forward, rmsnorm_forward (warp per row), and its general backward, rmsnorm_backward_rows (warp per
      row for dinp; the weight gradient as partial sums over 256-row chunks, rmsnorm_dw_partial_kernel, re-reading dy
      and x, then colsum_finish in fixed order)
  v3  the trainer's backward, rmsnorm_backward: where C is a multiple of 128 up to 2048, one pass with the row in
      registers (16-byte fp32 / 8-byte bf16 accesses) and the weight gradient summed on the fly per block of 8 warps
      (4 past C = 1024) of 16 rows each (rmsnorm_backward_fused_kernel); otherwise v2's kernels (C = 64 below)

CPU reference in double from the inputs as the device sees them (a, b, w rounded to floatX; the residual rounded
to floatX after an fp32 add, exactly as the device does, so it must match bit for bit).
Validation: N = 1237 rows (not a multiple of 8 or 128), C = 64, 384, 1024, 1792, 2048 (tiny, a 3-group width, 340m,
1b, the widest fused one),
with and without the residual. Tolerances (relative L2): resid exact; out (floatX) 1e-2 in bf16 (one rounding, ~1e-3
expected), 1e-5 in fp32; rstd 1e-5; dinp, dw (fp32 sums of C or N terms) 1e-4.
Timing: N = 32768 rows (16 x 2048 tokens), C = 1024 and 1792 (340m, 1b); GB/s counts the minimal traffic.

Build and run (from the repository root):
  make -C dev/cuda rmsnorm rmsnorm_fp32
  dev/cuda/rmsnorm [1|2|3] [--no-bench]
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 3
#ifdef ENABLE_FP32
static const double TOL_OUT = 1e-5;
#else
static const double TOL_OUT = 1e-2;
#endif
static const double TOL_RSTD = 1e-5, TOL_GRAD = 1e-4;
static const float EPS = 1e-6f; // the presets' --norm-eps (MODEL.md §2)
static const char* VERSION_NAME[4] = {"", "v1 thread/row", "v2 warp/row", "v3 fused 1-pass"};

// ----------------------------------------------------------------------------------------------------
// v1: naive

__global__ void rmsnorm_forward_naive_kernel(floatX* resid_out, floatX* out, float* rstd, const floatX* a, const floatX* b,
                                             const floatX* w, int N, int C, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) { return; }
    long base = (long)row * C;
    float ss = 0.0f;
    for (int c = 0; c < C; c++) {
        float x = tof(a[base + c]);
        if (b) {
            floatX xs = fromf<floatX>(x + tof(b[base + c]));
            resid_out[base + c] = xs;
            x = tof(xs);
        }
        ss += x * x;
    }
    float r = rsqrtf(ss / C + eps);
    rstd[row] = r;
    const floatX* src = b ? resid_out : a;
    for (int c = 0; c < C; c++) { out[base + c] = fromf<floatX>(tof(src[base + c]) * r * tof(w[c])); }
}

__global__ void rmsnorm_backward_naive_kernel(float* dinp, const float* dout, const floatX* inp, const floatX* w,
                                              const float* rstd, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) { return; }
    long base = (long)row * C;
    float r = rstd[row], dot = 0.0f;
    for (int c = 0; c < C; c++) { dot += dout[base + c] * tof(w[c]) * tof(inp[base + c]); }
    float k = r * r * r * dot / C;
    for (int c = 0; c < C; c++) { dinp[base + c] += r * dout[base + c] * tof(w[c]) - k * tof(inp[base + c]); }
}

__global__ void rmsnorm_dw_naive_kernel(float* dw, const float* dout, const floatX* inp, const float* rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int r = 0; r < N; r++) { s += dout[(long)r * C + c] * tof(inp[(long)r * C + c]) * rstd[r]; }
    dw[c] += s;
}

// ----------------------------------------------------------------------------------------------------

struct RnDev { floatX *a, *b, *w, *resid, *out; float *rstd, *dout, *dinp, *dw; };

static void rn_alloc(RnDev& d, long N, int C) {
    cudaCheck(cudaMalloc(&d.a, N * C * sizeof(floatX))); cudaCheck(cudaMalloc(&d.b, N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.w, C * sizeof(floatX))); cudaCheck(cudaMalloc(&d.resid, N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.out, N * C * sizeof(floatX))); cudaCheck(cudaMalloc(&d.rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d.dout, N * C * sizeof(float))); cudaCheck(cudaMalloc(&d.dinp, N * C * sizeof(float)));
    cudaCheck(cudaMalloc(&d.dw, C * sizeof(float)));
}
static void rn_free(RnDev& d) {
    cudaCheck(cudaFree(d.a)); cudaCheck(cudaFree(d.b)); cudaCheck(cudaFree(d.w)); cudaCheck(cudaFree(d.resid));
    cudaCheck(cudaFree(d.out)); cudaCheck(cudaFree(d.rstd)); cudaCheck(cudaFree(d.dout)); cudaCheck(cudaFree(d.dinp));
    cudaCheck(cudaFree(d.dw));
}

// forward (with the residual add iff resid) then the backward from dout into dinp, dw
static void rn_forward(RnDev& d, int v, long N, int C, int resid) {
    const floatX* b = resid ? d.b : nullptr;
    floatX* ro = resid ? d.resid : nullptr;
    if (v == 1) {
        rmsnorm_forward_naive_kernel<<<cdiv(N, 256), 256, 0, main_stream>>>(ro, d.out, d.rstd, d.a, b, d.w, (int)N, C, EPS);
        cudaCheck(cudaGetLastError());
    } else {
        rmsnorm_forward(ro, d.out, d.rstd, d.a, b, d.w, N, C, EPS);
    }
}
static void rn_backward(RnDev& d, int v, long N, int C, int resid) {
    const floatX* x = resid ? d.resid : d.a;
    if (v == 1) {
        rmsnorm_backward_naive_kernel<<<cdiv(N, 256), 256, 0, main_stream>>>(d.dinp, d.dout, x, d.w, d.rstd, (int)N, C);
        rmsnorm_dw_naive_kernel<<<cdiv(C, 256), 256, 0, main_stream>>>(d.dw, d.dout, x, d.rstd, (int)N, C);
        cudaCheck(cudaGetLastError());
    } else if (v == 2) {
        rmsnorm_backward_rows(d.dinp, d.dw, d.dout, nullptr, x, nullptr, d.w, d.rstd, N, C, nullptr, nullptr);
    } else {
        rmsnorm_backward(d.dinp, d.dw, d.dout, nullptr, x, nullptr, d.w, d.rstd, N, C);
    }
}

static void validate_case(int version_sel, int C, int resid, uint64_t seed) {
    const long N = 1237;
    if (C <= 0) { return; }
    LabRng rng(seed);
    size_t n = (size_t)N * C;
    std::vector<float> a(n), b(n), w(C), dout(n), dinp0(n), dw0(C);
    for (size_t i = 0; i < n; i++) { a[i] = lab_round((float)rng.normal()); b[i] = lab_round((float)(0.5 * rng.normal())); }
    for (int c = 0; c < C; c++) { w[c] = lab_round((float)(1.0 + 0.2 * rng.normal())); dw0[c] = (float)rng.normal(); }
    for (size_t i = 0; i < n; i++) { dout[i] = (float)rng.normal(); dinp0[i] = (float)rng.normal(); }
    // reference
    std::vector<float> xs(n);
    std::vector<double> out(n), rstd(N), dinp(n), dw(C);
    for (size_t i = 0; i < n; i++) { xs[i] = resid ? lab_round(a[i] + b[i]) : a[i]; } // fp32 add, then floatX, as the device
    for (long r = 0; r < N; r++) {
        const float* x = &xs[(size_t)r * C];
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += (double)x[c] * x[c]; }
        double rs = 1.0 / sqrt(ss / C + (double)EPS);
        rstd[r] = rs;
        double dot = 0.0;
        for (int c = 0; c < C; c++) {
            out[(size_t)r * C + c] = x[c] * rs * w[c];
            dot += (double)dout[(size_t)r * C + c] * w[c] * x[c];
        }
        double k = rs * rs * rs * dot / C;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            dinp[i] = dinp0[i] + rs * dout[i] * w[c] - k * x[c];
        }
    }
    for (int c = 0; c < C; c++) {
        double s = dw0[c];
        for (long r = 0; r < N; r++) { s += (double)dout[(size_t)r * C + c] * xs[(size_t)r * C + c] * rstd[r]; }
        dw[c] = s;
    }
    RnDev d;
    rn_alloc(d, N, C);
    std::vector<floatX> ax(n), bx(n), wx(C);
    for (size_t i = 0; i < n; i++) { ax[i] = lab_f2x(a[i]); bx[i] = lab_f2x(b[i]); }
    for (int c = 0; c < C; c++) { wx[c] = lab_f2x(w[c]); }
    cudaCheck(cudaMemcpy(d.a, ax.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.b, bx.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.w, wx.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.dout, dout.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        lab_poison(d.resid, n * sizeof(floatX)); lab_poison(d.out, n * sizeof(floatX)); lab_poison(d.rstd, N * sizeof(float));
        cudaCheck(cudaMemcpy(d.dinp, dinp0.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d.dw, dw0.data(), C * sizeof(float), cudaMemcpyHostToDevice));
        rn_forward(d, v, N, C, resid);
        rn_backward(d, v, N, C, resid);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        char tag[64], what[128];
        snprintf(tag, sizeof tag, "v%d C=%-4d %s", v, C, resid ? "a+b" : "a  ");
        if (resid) {
            std::vector<float> g = lab_download_x(d.resid, n);
            long bad = 0;
            for (size_t i = 0; i < n; i++) { bad += !(g[i] == xs[i]); }
            snprintf(what, sizeof what, "%s resid (bitwise)", tag);
            lab_check_exact(what, bad, (long)n);
        }
        std::vector<float> go = lab_download_x(d.out, n), gr = lab_download(d.rstd, N), gi = lab_download(d.dinp, n),
                           gw = lab_download(d.dw, C);
        snprintf(what, sizeof what, "%s out", tag);
        lab_check(what, rel_l2(go.data(), out.data(), n), TOL_OUT);
        snprintf(what, sizeof what, "%s rstd", tag);
        lab_check(what, rel_l2(gr.data(), rstd.data(), N), TOL_RSTD);
        snprintf(what, sizeof what, "%s dinp (+=)", tag);
        lab_check(what, rel_l2(gi.data(), dinp.data(), n), TOL_GRAD);
        snprintf(what, sizeof what, "%s dw (+=)", tag);
        lab_check(what, rel_l2(gw.data(), dw.data(), C), TOL_GRAD);
    }
    rn_free(d);
}

static void bench(int version_sel, int C) {
    const long N = 32768;
    RnDev d;
    rn_alloc(d, N, C);
    lab_fill(d.a, N * C, FILL_NORMAL, 0.0f, 1.0f, 31);
    lab_fill(d.b, N * C, FILL_NORMAL, 0.0f, 0.5f, 32);
    lab_fill(d.w, C, FILL_NORMAL, 1.0f, 0.2f, 33);
    lab_fill(d.dout, N * C, FILL_NORMAL, 0.0f, 1.0f, 34);
    cudaCheck(cudaMemset(d.dinp, 0, N * C * sizeof(float)));
    cudaCheck(cudaMemset(d.dw, 0, C * sizeof(float)));
    double nc = (double)N * C, xs = sizeof(floatX);
    double fbytes = nc * 4 * xs;          // a, b in; resid, out out
    double bbytes = nc * (4 + xs + 8);    // dout, x in; dinp in + out
    printf("\n=== timing: rmsnorm (%s), N=%ld rows, C=%d; GB/s counts the minimal traffic ===\n", PRECISION_NAME, N, C);
    printf("%-14s %12s %8s %10s %8s\n", "version", "fwd(+res) ms", "GB/s", "bwd ms", "GB/s");
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        double tf = bench_ms([&] { rn_forward(d, v, N, C, 1); });
        rn_forward(d, v, N, C, 1);
        double tb = bench_ms([&] { rn_backward(d, v, N, C, 1); });
        printf("%-14s %12.4f %8.0f %10.4f %8.0f\n", VERSION_NAME[v], tf, fbytes / tf / 1e6, tb, bbytes / tb / 1e6);
        fflush(stdout);
    }
    printf("\n");
    rn_free(d);
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    if (a.validate) {
        printf("\n=== validation: rmsnorm (%s) vs the CPU reference in double; N=1237 ===\n", PRECISION_NAME);
        uint64_t seed = 200;
        for (int C : {64, 384, 1024, 1792, 2048}) {
            for (int resid = 1; resid >= 0; resid--) { validate_case(a.version, C, resid, seed++); }
        }
    }
    if (a.bench) {
        for (int C : {1024, 1792}) { bench(a.version, C); }
    }
    return lab_finish("rmsnorm");
}
#endif
