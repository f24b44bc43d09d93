/*
Kernel lab: the mixer's per-element neighbours (MODEL.md §3.4-3.8), as train_pdn.cu runs them.
  output norm + gate:  o (head-major (B, H, Tp, Vp) floatX, rows of V used) -> rstd = 1/sqrt(mean(o²) + eps),
                       on = floatX(o rstd w), og = floatX(on sigmoid(gz)) (gated) or on itself (ungated);
                       backward from dog (fp32, token-major): dgz = dog on s (1 - s) (s = sigmoid(gz), on the forward's
                       rounded value), dn = dog s, dO = rstd dn w - rstd³ (Σ dn w o) / V · o, dw += Σ_rows dn o rstd
  log decay (kind 1):  out = -exp(A_log[h]) softplus(pre + dt_bias[c]) into head-major (B, H, Tp, gwp) fp32;
                       backward dp = dout (-exp(A_log[h])) sigmoid(pre + dt_bias[c]) -> dpre (floatX, row stride ld),
                       ddt_bias[c] += Σ_rows dp, dA_log[h] += Σ_rows, channels of h dout out
  sigmoid gate (kind 0): out = bmax sigmoid(pre); dpre = dout bmax s (1 - s)

Versions:
  v1  the general kernels: onorm_gate_forward_kernel / onorm_gate_backward_kernel (loops over the row, 2-byte
      accesses) and gate_forward_kernel (an element a thread, 64-bit index arithmetic)
  v2  the trainer's launchers: onorm_gate_forward / onorm_gate_backward (the row in registers by groups of 4 columns
      where V % 4 == 0, V <= 256), gate_forward (the channel decay by 4 channels a thread)
  The backward of the gates has one implementation (gate_backward: the decay's fused with its column sums), run in
  both versions.

CPU reference in double from the inputs as the device sees them (rounded to floatX), with the device's intermediate
roundings (on, and the stored floatX outputs). Validation: B = 3, T = 150 (N = 450 rows: two COLSUM_ROWS chunks, T
not a multiple of 8, so the decay backward's row stepping crosses sequences), Tp = 160, H = 3; V = 16, 64, 120, 128,
256 (vector kernels, V = 120 the 1b KDA's) and 90 (the loops), gated and not; decays gw = 1, 36, 120, 128, sigmoid
gw = 1. Padding columns of the head-major outputs must stay untouched (checked bytewise against the poison).
Tolerances (relative L2): fp32 outputs 1e-5; floatX outputs 1e-2 in bf16 (a rounding or two, ~2e-3 expected), 1e-5 in
fp32; column sums over 450 rows 1e-4.
Timing: the 340m shape (16 x 2048 tokens, 8 heads of 128) and the 1b KDA's (8 x 2048, 14 heads of 120 in rows of 128).

Build and run (from the repository root):
  make -C dev/cuda gates gates_fp32
  dev/cuda/gates [1|2] [--no-bench]
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 2
#ifdef ENABLE_FP32
static const double TOL_X = 1e-5;
#else
static const double TOL_X = 1e-2;
#endif
static const double TOL_F = 1e-5, TOL_SUM = 1e-4;
static const float EPS = 1e-6f;
static const char* VERSION_NAME[3] = {"", "v1 general", "v2 trainer"};

// ----------------------------------------------------------------------------------------------------
// the two versions

static void on_forward(int v, floatX* on, floatX* og, float* rstd, const floatX* o, const floatX* w, const floatX* gz,
                       int B, int T, int H, int V, int Vp, int Tp) {
    if (v == 1) {
        onorm_gate_forward_kernel<<<cdiv((long)B * T * H, 8), 256, 0, main_stream>>>(on, og, rstd, o, w, gz, B, T, H, V, Vp, Tp, EPS);
        cudaCheck(cudaGetLastError());
    } else {
        onorm_gate_forward(on, og, rstd, o, w, gz, B, T, H, V, Vp, Tp, EPS);
    }
}
static void on_backward(int v, floatX* dO, floatX* dgz, float* dgz_f, float* dw, const float* dog, const floatX* o,
                        const floatX* w, const floatX* gz, const float* rstd, int B, int T, int H, int V, int Vp, int Tp) {
    if (v == 1) {
        int nblk = cdiv((long)B * T * H, ONORM_ROWS);
        float* partial = colsum_partials(nblk, V);
        onorm_gate_backward_kernel<<<nblk, 256, 0, main_stream>>>(dO, dgz, dgz_f, partial, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp);
        cudaCheck(cudaGetLastError());
        colsum_finish(dw, nblk, V);
    } else {
        onorm_gate_backward(dO, dgz, dgz_f, dw, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp);
    }
}
static void gt_forward(int v, float* out, const floatX* pre, const floatX* a_log, const floatX* dt_bias, int kind, float bmax,
                       int B, int T, int H, int gw, int gwp, int Tp) {
    if (v == 1) {
        gate_forward_kernel<<<cdiv((long)B * T * H * gw, 256), 256, 0, main_stream>>>(out, pre, a_log, dt_bias, kind, bmax, B, T, H,
                                                                                      gw, gwp, Tp);
        cudaCheck(cudaGetLastError());
    } else {
        gate_forward(out, pre, a_log, dt_bias, kind, bmax, B, T, H, gw, gwp, Tp);
    }
}

// ----------------------------------------------------------------------------------------------------
// validation

static const int VB = 3, VT = 150, VTP = 160, VH = 3;

// count the bytes of a head-major buffer's padding (columns >= used of rows of width, rows t >= T) that changed
// from the poison (0xFF)
static long padding_touched(const void* d, size_t elem, int rows_bh, int Tp, int T, int width, int used) {
    size_t n = (size_t)rows_bh * Tp * width * elem;
    std::vector<unsigned char> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (int r = 0; r < rows_bh; r++) {
        for (int t = 0; t < Tp; t++) {
            for (int j = 0; j < width; j++) {
                if (t < T && j < used) { continue; }
                size_t off = (((size_t)r * Tp + t) * width + j) * elem;
                for (size_t b = 0; b < elem; b++) { bad += h[off + b] != 0xFF; }
            }
        }
    }
    return bad;
}

static void validate_onorm(int version_sel, int V, int gated, uint64_t seed) {
    const int B = VB, T = VT, Tp = VTP, H = VH, Vp = mixer_pad(V);
    const long N = (long)B * T, rows = N * H;
    const size_t nhm = (size_t)B * H * Tp * Vp, ntm = (size_t)rows * V;
    LabRng rng(seed);
    std::vector<float> o(nhm, 0.0f), w(V), gz(ntm), dog(ntm), dw0(V);
    for (size_t i = 0; i < nhm; i++) { o[i] = lab_round((float)rng.normal()); }
    for (int j = 0; j < V; j++) { w[j] = lab_round((float)(1.0 + 0.2 * rng.normal())); dw0[j] = (float)rng.normal(); }
    for (size_t i = 0; i < ntm; i++) { gz[i] = lab_round((float)rng.normal()); dog[i] = (float)rng.normal(); }
    // reference, row (b, t, h) = token-major row (b T + t) H + h
    std::vector<double> rstd(rows), og(ntm), dgz(ntm), dO(nhm, 0.0), dw(dw0.begin(), dw0.end());
    for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < H; h++) {
        long row = ((long)b * T + t) * H + h;
        const float* x = &o[(((size_t)b * H + h) * Tp + t) * Vp];
        double ss = 0.0;
        for (int j = 0; j < V; j++) { ss += (double)x[j] * x[j]; }
        double r = 1.0 / sqrt(ss / V + (double)EPS), dot = 0.0;
        rstd[row] = r;
        std::vector<double> dn(V);
        for (int j = 0; j < V; j++) {
            size_t i = (size_t)row * V + j;
            double on = lab_round((float)(x[j] * r * w[j])); // the stored (gated: remade) floatX on
            dn[j] = dog[i];
            if (gated) {
                double s = lab_sigmoid(gz[i]);
                og[i] = on * s;
                dgz[i] = dog[i] * on * s * (1.0 - s);
                dn[j] *= s;
            } else {
                og[i] = on;
            }
            dot += dn[j] * w[j] * x[j];
        }
        double k = r * r * r * dot / V;
        for (int j = 0; j < V; j++) {
            dO[(((size_t)b * H + h) * Tp + t) * Vp + j] = r * dn[j] * w[j] - k * x[j];
            dw[j] += dn[j] * x[j] * r;
        }
    }
    std::vector<floatX> ox(nhm), wx(V), gzx(ntm);
    for (size_t i = 0; i < nhm; i++) { ox[i] = lab_f2x(o[i]); }
    for (int j = 0; j < V; j++) { wx[j] = lab_f2x(w[j]); }
    for (size_t i = 0; i < ntm; i++) { gzx[i] = lab_f2x(gz[i]); }
    floatX *d_o = lab_upload(ox), *d_w = lab_upload(wx), *d_gz = lab_upload(gzx), *d_og, *d_dO, *d_dgz;
    cudaCheck(cudaMalloc(&d_og, ntm * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dO, nhm * sizeof(floatX))); cudaCheck(cudaMalloc(&d_dgz, ntm * sizeof(floatX)));
    float *d_rstd, *d_dgzf, *d_dw, *d_dog = lab_upload(dog);
    cudaCheck(cudaMalloc(&d_rstd, rows * sizeof(float))); cudaCheck(cudaMalloc(&d_dgzf, ntm * sizeof(float)));
    cudaCheck(cudaMalloc(&d_dw, V * sizeof(float)));
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        lab_poison(d_og, ntm * sizeof(floatX)); lab_poison(d_rstd, rows * sizeof(float)); lab_poison(d_dO, nhm * sizeof(floatX));
        lab_poison(d_dgz, ntm * sizeof(floatX)); lab_poison(d_dgzf, ntm * sizeof(float));
        cudaCheck(cudaMemcpy(d_dw, dw0.data(), V * sizeof(float), cudaMemcpyHostToDevice));
        // the trainer's calls: gated, on is not stored (nullptr); ungated, og is on itself
        on_forward(v, gated ? nullptr : d_og, d_og, d_rstd, d_o, d_w, gated ? d_gz : nullptr, B, T, H, V, Vp, Tp);
        on_backward(v, d_dO, d_dgz, d_dgzf, d_dw, d_dog, d_o, d_w, gated ? d_gz : nullptr, d_rstd, B, T, H, V, Vp, Tp);
        cudaCheck(cudaDeviceSynchronize());
        char tag[64], what[128];
        snprintf(tag, sizeof tag, "v%d onorm V=%-3d %s", v, V, gated ? "gated" : "plain");
        std::vector<float> g_og = lab_download_x(d_og, ntm), g_r = lab_download(d_rstd, rows), g_dO = lab_download_x(d_dO, nhm),
                           g_dw = lab_download(d_dw, V);
        snprintf(what, sizeof what, "%s og", tag); lab_check(what, rel_l2(g_og.data(), og.data(), ntm), TOL_X);
        snprintf(what, sizeof what, "%s rstd", tag); lab_check(what, rel_l2(g_r.data(), rstd.data(), rows), TOL_F);
        // dO's padding is poison (NaN in floatX): compare the used columns only, through a copy with pads zeroed
        for (size_t i = 0; i < nhm; i++) { if (i % Vp >= (size_t)V || (i / Vp) % Tp >= (size_t)T) { g_dO[i] = 0.0f; } }
        snprintf(what, sizeof what, "%s dO", tag); lab_check(what, rel_l2(g_dO.data(), dO.data(), nhm), TOL_X);
        snprintf(what, sizeof what, "%s dO padding untouched", tag);
        lab_check_exact(what, padding_touched(d_dO, sizeof(floatX), B * H, Tp, T, Vp, V), (long)(nhm - (size_t)rows * V) * (long)sizeof(floatX));
        snprintf(what, sizeof what, "%s dw (+=)", tag); lab_check(what, rel_l2(g_dw.data(), dw.data(), V), TOL_SUM);
        if (gated) {
            std::vector<float> g_dgz = lab_download_x(d_dgz, ntm), g_dgzf = lab_download(d_dgzf, ntm);
            snprintf(what, sizeof what, "%s dgz", tag); lab_check(what, rel_l2(g_dgz.data(), dgz.data(), ntm), TOL_X);
            // dgz carries the floatX-rounded on: where o r w falls on a rounding boundary, the device's fp32 rstd and the
            // reference's double one round on to neighbouring floatX values (one bf16 ulp, 4e-3, on a few elements in
            // ten thousand: ~5e-5 relative L2). The fp32 check therefore remakes on from the device's rstd, in float,
            // in the kernel's order (o r) w; rstd itself is checked against double above.
            std::vector<double> dgz_r(ntm);
            for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < H; h++) {
                long row = ((long)b * T + t) * H + h;
                const float* x = &o[(((size_t)b * H + h) * Tp + t) * Vp];
                for (int j = 0; j < V; j++) {
                    size_t i = (size_t)row * V + j;
                    double on = lab_round(x[j] * g_r[row] * w[j]), s = lab_sigmoid(gz[i]);
                    dgz_r[i] = dog[i] * on * s * (1.0 - s);
                }
            }
            snprintf(what, sizeof what, "%s dgz fp32", tag); lab_check(what, rel_l2(g_dgzf.data(), dgz_r.data(), ntm), TOL_F);
        }
    }
    cudaCheck(cudaFree(d_o)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_gz)); cudaCheck(cudaFree(d_og));
    cudaCheck(cudaFree(d_dO)); cudaCheck(cudaFree(d_dgz)); cudaCheck(cudaFree(d_rstd));
    cudaCheck(cudaFree(d_dgzf)); cudaCheck(cudaFree(d_dw)); cudaCheck(cudaFree(d_dog));
}

static void validate_gate(int version_sel, int kind, int gw, uint64_t seed) {
    const int B = VB, T = VT, Tp = VTP, H = VH, gwp = gw > 1 ? mixer_pad(gw) : 1, M = H * gw, ld = M + 8;
    const long N = (long)B * T;
    const size_t nhm = (size_t)B * H * Tp * gwp, ntm = (size_t)N * M;
    const float bmax = kind == 0 ? 2.0f : 0.0f;
    LabRng rng(seed);
    std::vector<float> pre(ntm), alog(H), dtb(M), dout_hm(nhm, 0.0f), dlog0(H), ddt0(M);
    for (size_t i = 0; i < ntm; i++) { pre[i] = lab_round((float)(1.5 * rng.normal())); }
    for (int h = 0; h < H; h++) { alog[h] = lab_round((float)(0.5 * rng.normal())); dlog0[h] = (float)rng.normal(); }
    for (int c = 0; c < M; c++) { dtb[c] = lab_round((float)(0.5 * rng.normal())); ddt0[c] = (float)rng.normal(); }
    for (size_t i = 0; i < nhm; i++) { dout_hm[i] = (float)rng.normal(); }
    // reference forward (head-major) and backward; the backward's `out` input is the reference forward in fp32
    std::vector<double> out(nhm, 0.0), dpre(ntm), ddt(ddt0.begin(), ddt0.end()), dlog(dlog0.begin(), dlog0.end());
    std::vector<float> out_f(nhm, 0.0f);
    for (long r = 0; r < N; r++) {
        int b = (int)(r / T), t = (int)(r % T);
        for (int c = 0; c < M; c++) {
            int h = c / gw, j = c % gw;
            size_t ih = (((size_t)b * H + h) * Tp + t) * gwp + j, i = (size_t)r * M + c;
            double p = pre[i], d = dout_hm[ih], val, dp;
            if (kind == 0) {
                val = bmax * lab_sigmoid(p);
                double sg = (float)val / bmax;
                dp = d * bmax * sg * (1.0 - sg);
            } else {
                val = -exp((double)alog[h]) * lab_softplus(p + dtb[c]);
                dp = d * -exp((double)alog[h]) * lab_sigmoid(p + dtb[c]);
                ddt[c] += dp;
                dlog[h] += d * (double)(float)val;
            }
            out[ih] = val; out_f[ih] = (float)val; dpre[i] = dp;
        }
    }
    std::vector<floatX> prex(ntm), alogx(H), dtbx(M);
    for (size_t i = 0; i < ntm; i++) { prex[i] = lab_f2x(pre[i]); }
    for (int h = 0; h < H; h++) { alogx[h] = lab_f2x(alog[h]); }
    for (int c = 0; c < M; c++) { dtbx[c] = lab_f2x(dtb[c]); }
    floatX *d_pre = lab_upload(prex), *d_alog = lab_upload(alogx), *d_dtb = lab_upload(dtbx), *d_dpre;
    float *d_out, *d_outref = lab_upload(out_f), *d_dout = lab_upload(dout_hm), *d_ddt, *d_dlog, *d_tmp;
    cudaCheck(cudaMalloc(&d_out, nhm * sizeof(float))); cudaCheck(cudaMalloc(&d_dpre, (size_t)N * ld * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_ddt, M * sizeof(float))); cudaCheck(cudaMalloc(&d_dlog, H * sizeof(float)));
    cudaCheck(cudaMalloc(&d_tmp, M * sizeof(float)));
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        lab_poison(d_out, nhm * sizeof(float)); lab_poison(d_dpre, (size_t)N * ld * sizeof(floatX));
        cudaCheck(cudaMemcpy(d_ddt, ddt0.data(), M * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dlog, dlog0.data(), H * sizeof(float), cudaMemcpyHostToDevice));
        gt_forward(v, d_out, d_pre, kind ? d_alog : nullptr, kind ? d_dtb : nullptr, kind, bmax, B, T, H, gw, gwp, Tp);
        gate_backward(d_dpre, ld, kind ? d_ddt : nullptr, kind ? d_dlog : nullptr, kind ? d_tmp : nullptr, d_dout, d_outref, d_pre,
                      kind ? d_alog : nullptr, kind ? d_dtb : nullptr, kind, bmax, B, T, H, gw, gwp, Tp);
        cudaCheck(cudaDeviceSynchronize());
        char tag[64], what[128];
        snprintf(tag, sizeof tag, "v%d %s gw=%-3d", v, kind ? "decay  " : "sigmoid", gw);
        std::vector<float> g_out = lab_download(d_out, nhm);
        long touched = 0;
        for (size_t i = 0; i < nhm; i++) {
            if (i % gwp >= (size_t)gw || (i / gwp) % Tp >= (size_t)T) { uint32_t u; memcpy(&u, &g_out[i], 4); touched += u != 0xFFFFFFFFu; g_out[i] = 0.0f; }
        }
        snprintf(what, sizeof what, "%s out", tag); lab_check(what, rel_l2(g_out.data(), out.data(), nhm), TOL_F);
        snprintf(what, sizeof what, "%s out padding untouched", tag); lab_check_exact(what, touched, (long)(nhm - ntm));
        std::vector<float> g_dp = lab_download_x(d_dpre, (size_t)N * ld), dp(ntm);
        long stride_touched = 0;
        for (long r = 0; r < N; r++) {
            for (int c = 0; c < ld; c++) {
                float x = g_dp[(size_t)r * ld + c];
                if (c < M) { dp[(size_t)r * M + c] = x; } else { stride_touched += !std::isnan(x); }
            }
        }
        snprintf(what, sizeof what, "%s dpre", tag); lab_check(what, rel_l2(dp.data(), dpre.data(), ntm), TOL_X);
        snprintf(what, sizeof what, "%s dpre's row gap untouched", tag); lab_check_exact(what, stride_touched, N * (ld - M));
        if (kind) {
            std::vector<float> g_ddt = lab_download(d_ddt, M), g_dlog = lab_download(d_dlog, H);
            snprintf(what, sizeof what, "%s ddt_bias (+=)", tag); lab_check(what, rel_l2(g_ddt.data(), ddt.data(), M), TOL_SUM);
            snprintf(what, sizeof what, "%s dA_log (+=)", tag); lab_check(what, rel_l2(g_dlog.data(), dlog.data(), H), TOL_SUM);
        }
    }
    cudaCheck(cudaFree(d_pre)); cudaCheck(cudaFree(d_alog)); cudaCheck(cudaFree(d_dtb)); cudaCheck(cudaFree(d_dpre));
    cudaCheck(cudaFree(d_out)); cudaCheck(cudaFree(d_outref)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_ddt));
    cudaCheck(cudaFree(d_dlog)); cudaCheck(cudaFree(d_tmp));
}

// ----------------------------------------------------------------------------------------------------
// timing

static void bench(int version_sel, int B, int T, int H, int V) {
    int Vp = mixer_pad(V), Tp = T;
    long N = (long)B * T, rows = N * H;
    size_t nhm = (size_t)B * H * Tp * Vp, ntm = (size_t)rows * V;
    floatX *o, *w, *gz, *og, *dO, *dgz, *pre, *alog, *dtb, *dpre;
    float *rstd, *dog, *dgzf, *dw, *g, *dg, *ddt, *dlog, *tmp;
    cudaCheck(cudaMalloc(&o, nhm * sizeof(floatX))); cudaCheck(cudaMalloc(&w, V * sizeof(floatX)));
    cudaCheck(cudaMalloc(&gz, ntm * sizeof(floatX))); cudaCheck(cudaMalloc(&og, ntm * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dO, nhm * sizeof(floatX))); cudaCheck(cudaMalloc(&dgz, ntm * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, ntm * sizeof(floatX))); cudaCheck(cudaMalloc(&alog, H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dtb, H * V * sizeof(floatX))); cudaCheck(cudaMalloc(&dpre, ntm * sizeof(floatX)));
    cudaCheck(cudaMalloc(&rstd, rows * sizeof(float))); cudaCheck(cudaMalloc(&dog, ntm * sizeof(float)));
    cudaCheck(cudaMalloc(&dgzf, ntm * sizeof(float))); cudaCheck(cudaMalloc(&dw, V * sizeof(float)));
    cudaCheck(cudaMalloc(&g, nhm * sizeof(float))); cudaCheck(cudaMalloc(&dg, nhm * sizeof(float)));
    cudaCheck(cudaMalloc(&ddt, H * V * sizeof(float))); cudaCheck(cudaMalloc(&dlog, H * sizeof(float)));
    cudaCheck(cudaMalloc(&tmp, H * V * sizeof(float)));
    lab_fill(o, nhm, FILL_NORMAL, 0.0f, 1.0f, 41); lab_fill(w, V, FILL_NORMAL, 1.0f, 0.2f, 42);
    lab_fill(gz, ntm, FILL_NORMAL, 0.0f, 1.0f, 43); lab_fill(dog, ntm, FILL_NORMAL, 0.0f, 1.0f, 44);
    lab_fill(pre, ntm, FILL_NORMAL, 0.0f, 1.5f, 45); lab_fill(alog, H, FILL_NORMAL, 0.0f, 0.5f, 46);
    lab_fill(dtb, H * V, FILL_NORMAL, 0.0f, 0.5f, 47); lab_fill(dg, nhm, FILL_NORMAL, 0.0f, 1.0f, 48);
    cudaCheck(cudaMemset(dw, 0, V * sizeof(float))); cudaCheck(cudaMemset(ddt, 0, H * V * sizeof(float)));
    cudaCheck(cudaMemset(dlog, 0, H * sizeof(float)));
    double x = sizeof(floatX), n = (double)ntm;
    double b_onf = n * 3 * x, b_onb = n * (4 * x + 8); // o, gz in, og out; dog, o, gz in, dO, dgz, dgz_f out
    double b_gf = n * (x + 4), b_gb = n * (8 + 2 * x);  // pre in, out out; dout, out, pre in, dpre out
    printf("\n=== timing: gates (%s), B=%d T=%d H=%d V=K=%d (rows of %d); GB/s counts the minimal traffic ===\n", PRECISION_NAME,
           B, T, H, V, Vp);
    printf("%-12s %12s %7s %12s %7s %12s %7s %12s %7s\n", "version", "onorm fwd ms", "GB/s", "onorm bwd ms", "GB/s", "decay fwd ms",
           "GB/s", "decay bwd ms", "GB/s");
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        double t1 = bench_ms([&] { on_forward(v, nullptr, og, rstd, o, w, gz, B, T, H, V, Vp, Tp); });
        double t2 = bench_ms([&] { on_backward(v, dO, dgz, dgzf, dw, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp); });
        double t3 = bench_ms([&] { gt_forward(v, g, pre, alog, dtb, 1, 0.0f, B, T, H, V, Vp, Tp); });
        double t4 = bench_ms([&] { gate_backward(dpre, H * V, ddt, dlog, tmp, dg, g, pre, alog, dtb, 1, 0.0f, B, T, H, V, Vp, Tp); });
        printf("%-12s %12.4f %7.0f %12.4f %7.0f %12.4f %7.0f %12.4f %7.0f\n", VERSION_NAME[v], t1, b_onf / t1 / 1e6, t2,
               b_onb / t2 / 1e6, t3, b_gf / t3 / 1e6, t4, b_gb / t4 / 1e6);
        fflush(stdout);
    }
    for (void* p : {(void*)o, (void*)w, (void*)gz, (void*)og, (void*)dO, (void*)dgz, (void*)pre, (void*)alog, (void*)dtb,
                    (void*)dpre, (void*)rstd, (void*)dog, (void*)dgzf, (void*)dw, (void*)g, (void*)dg, (void*)ddt,
                    (void*)dlog, (void*)tmp}) {
        cudaCheck(cudaFree(p));
    }
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    if (a.validate) {
        printf("\n=== validation: gates (%s) vs the CPU reference in double; B=%d T=%d (Tp %d) H=%d ===\n", PRECISION_NAME, VB,
               VT, VTP, VH);
        uint64_t seed = 300;
        for (int V : {16, 64, 90, 120, 128, 256}) {
            for (int gated = 1; gated >= 0; gated--) { validate_onorm(a.version, V, gated, seed++); }
        }
        for (int gw : {1, 36, 120, 128}) { validate_gate(a.version, 1, gw, seed++); }
        validate_gate(a.version, 0, 1, seed++);
    }
    if (a.bench) {
        bench(a.version, 16, 2048, 8, 128);
        bench(a.version, 8, 2048, 14, 120);
    }
    return lab_finish("gates");
}
#endif
