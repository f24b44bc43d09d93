/*
dev/cuda/common.h: what the kernel-lab files share. Include it AFTER `#define TESTING` + `#include "../../train_pdn.cu"`:
it uses the trainer's cudaCheck, floatX, globals (main_stream, cublas handles, smem_optin) and device helpers.

  lab_setup()          the device state main() of train_pdn.cu sets up (cuBLAS/cuBLASLt handles and workspace,
                       no TF32 in the fp32 build, mixer_kernel_setup()), plus the L2-flush buffer for timing
  lab_check()          one validation line: PASS/FAIL, relative L2 error, tolerance; failures are counted
  rel_l2()             ||gpu - ref|| / ||ref|| (NaN/inf in the GPU result give NaN, which fails every check)
  bench_ms()           median time of a call: one warm-up, then repeats, the L2 cache flushed before each
                       (inputs never sit in L2), CUDA events around the call only
  lab_fill()           device-side random tensors (normal, sigmoid(normal), -softplus(normal), uniform)
  lab_l2norm_rows()    L2-normalise rows (keys, queries) in place, times a scale
  lab_precond_diag_*   the diagonal-preconditioner launch sequences of pdn_forward / pdn_backward
  lab_finish()         the RESULT line and the exit code (nonzero if any check failed)
*/
#ifndef PDN_LAB_COMMON_H
#define PDN_LAB_COMMON_H

#include <vector>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>

// ----------------------------------------------------------------------------------------------------
// setup

static void* lab_flush_buf = nullptr;
static size_t lab_flush_bytes = 0;

static void lab_setup(void) {
    cudaDeviceProp prop = gpu_setup(); // exactly what main() of train_pdn.cu does before the first kernel
    // twice the L2 size, written before every timed call, evicts whatever the previous call left in L2
    int l2 = 0;
    cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    lab_flush_bytes = (size_t)std::max(l2, 1 << 20) * 2;
    cudaCheck(cudaMalloc(&lab_flush_buf, lab_flush_bytes));
    printf("device: %s, %d SMs, L2 %.0f MiB, shared memory per block (opt-in) %d KiB; precision %s\n", prop.name,
           prop.multiProcessorCount, l2 / 1048576.0, smem_optin / 1024, PRECISION_NAME);
}

// ----------------------------------------------------------------------------------------------------
// host conversions (cuda_bf16.h's conversions are host + device)

static inline floatX lab_f2x(float v) {
#ifdef ENABLE_FP32
    return v;
#else
    return __float2bfloat16(v);
#endif
}
static inline float lab_x2f(floatX v) {
#ifdef ENABLE_FP32
    return v;
#else
    return __bfloat162float(v);
#endif
}
// the value the device will see after the upload
static inline float lab_round(float v) { return lab_x2f(lab_f2x(v)); }

template <typename T> static T* lab_upload(const std::vector<T>& h) {
    T* d = nullptr;
    cudaCheck(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
    if (!h.empty()) { cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
    return d;
}
template <typename T> static std::vector<T> lab_download(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static std::vector<float> lab_download_x(const floatX* d, size_t n) {
    std::vector<floatX> h = lab_download(d, n);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) { f[i] = lab_x2f(h[i]); }
    return f;
}
// fill with NaN (all bits set) so that a version that forgets to write an output cannot pass on stale values
static void lab_poison(void* d, size_t bytes) { cudaCheck(cudaMemset(d, 0xFF, bytes)); }

// ----------------------------------------------------------------------------------------------------
// validation

static int lab_checks = 0, lab_failures = 0;

// relative L2 error ||g - r|| / ||r|| (||g - r|| when r == 0); NaN when g holds a NaN or an inf
template <typename G, typename R> static double rel_l2(const G* g, const R* r, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - (double)r[i];
        num += d * d;
        den += (double)r[i] * (double)r[i];
    }
    if (!std::isfinite(num)) { return NAN; }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

// one PASS/FAIL line; `!(err <= tol)` so that a NaN error fails
static bool lab_check(const char* what, double err, double tol) {
    bool ok = err <= tol;
    lab_checks++;
    if (!ok) { lab_failures++; }
    printf("%s %-58s rel L2 err %9.2e  (tol %.0e)\n", ok ? "PASS" : "FAIL", what, err, tol);
    fflush(stdout);
    return ok;
}
// a check that is exact (counts of mismatches and the like): PASS iff bad == 0
static bool lab_check_exact(const char* what, long bad, long total) {
    bool ok = bad == 0;
    lab_checks++;
    if (!ok) { lab_failures++; }
    printf("%s %-58s %ld of %ld differ (must be 0)\n", ok ? "PASS" : "FAIL", what, bad, total);
    fflush(stdout);
    return ok;
}

// the last line of every lab binary, and its exit code
static int lab_finish(const char* name) {
    printf("RESULT %s (%s): %d checks, %d failed: %s\n", name, PRECISION_NAME, lab_checks, lab_failures,
           lab_failures ? "FAIL" : "PASS");
    return lab_failures ? 1 : 0;
}

// command line: [N] [--no-bench] [--no-validate]; N = 0 or absent: every version
struct LabArgs { int version; int bench; int validate; };
static LabArgs lab_args(int argc, char** argv, int nversions) {
    LabArgs a{0, 1, 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bench")) { a.bench = 0; }
        else if (!strcmp(argv[i], "--no-validate")) { a.validate = 0; }
        else {
            char* end = nullptr;
            long v = strtol(argv[i], &end, 10);
            if (!end || *end || v < 0 || v > nversions) {
                fprintf(stderr, "usage: %s [VERSION 1..%d] [--no-bench] [--no-validate]\n", argv[0], nversions);
                exit(EXIT_USAGE);
            }
            a.version = (int)v;
        }
    }
    return a;
}

// ----------------------------------------------------------------------------------------------------
// timing

static void lab_flush_l2(void) { cudaCheck(cudaMemsetAsync(lab_flush_buf, 0, lab_flush_bytes, main_stream)); }

// median over repeats of the time of fn() (ms). prep() runs before each call, untimed (restoring an input that the
// call overwrites, for example); the L2 is flushed after it. One warm-up call; the first timed call sizes the number
// of repeats to about budget_ms (between min_reps and max_reps).
template <typename P, typename F>
static double bench_ms(P prep, F fn, double budget_ms = 100.0, int min_reps = 3, int max_reps = 30) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    prep();
    fn();
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> t;
    int reps = max_reps;
    for (int r = 0; r < reps; r++) {
        prep();
        lab_flush_l2();
        cudaCheck(cudaEventRecord(a, main_stream));
        fn();
        cudaCheck(cudaEventRecord(b, main_stream));
        cudaCheck(cudaEventSynchronize(b));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
        if (r == 0) { reps = std::min(max_reps, std::max(min_reps, (int)(budget_ms / std::max(ms, 1e-3f)))); }
    }
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    size_t n = t.size();
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}
template <typename F> static double bench_ms(F fn, double budget_ms = 100.0) { return bench_ms([] {}, fn, budget_ms); }

// ----------------------------------------------------------------------------------------------------
// device-side random tensors: a counter-based hash (the trainer's squirrel()), so any size is cheap to make

enum { FILL_NORMAL, FILL_SIGMOID, FILL_NEG_SOFTPLUS, FILL_UNIFORM };

__device__ __forceinline__ float lab_hash_uniform(unsigned long long i, unsigned int seed) {
    unsigned int h = squirrel((unsigned int)i, seed ^ squirrel((unsigned int)(i >> 32), seed + 0x9E3779B9u));
    return ((h >> 8) + 0.5f) * (1.0f / 16777216.0f); // (0, 1)
}
// kind FILL_NORMAL: mu + sigma n; FILL_SIGMOID: sigmoid(mu + sigma n); FILL_NEG_SOFTPLUS: -softplus(mu + sigma n);
// FILL_UNIFORM: uniform in (mu, sigma)
template <typename T>
__global__ void lab_fill_kernel(T* out, long n, int kind, float mu, float sigma, unsigned int seed) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float u1 = lab_hash_uniform(2ull * i, seed), u2 = lab_hash_uniform(2ull * i + 1, seed);
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    float v;
    if (kind == FILL_NORMAL) { v = mu + sigma * z; }
    else if (kind == FILL_SIGMOID) { v = sigmoidf_(mu + sigma * z); }
    else if (kind == FILL_NEG_SOFTPLUS) { v = -softplusf_(mu + sigma * z); }
    else { v = mu + (sigma - mu) * u1; }
    out[i] = fromf<T>(v);
}
template <typename T> static void lab_fill(T* out, long n, int kind, float mu, float sigma, unsigned int seed) {
    lab_fill_kernel<T><<<cdiv(n, 256), 256, 0, main_stream>>>(out, n, kind, mu, sigma, seed);
    cudaCheck(cudaGetLastError());
}
// rows of width D scaled to L2 norm `scale` (one warp per row)
template <typename T> __global__ void lab_l2norm_rows_kernel(T* x, long rows, int D, float scale) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) { return; }
    T* p = x + row * D;
    float ss = 0.0f;
    for (int j = lane; j < D; j += 32) { float v = tof(p[j]); ss += v * v; }
    ss = warp_sum(ss);
    float r = scale * rsqrtf(ss + 1e-6f);
    for (int j = lane; j < D; j += 32) { p[j] = fromf<T>(tof(p[j]) * r); }
}
template <typename T> static void lab_l2norm_rows(T* x, long rows, int D, float scale) {
    lab_l2norm_rows_kernel<T><<<cdiv(rows, 8), 256, 0, main_stream>>>(x, rows, D, scale);
    cudaCheck(cudaGetLastError());
}

// host-side random inputs (validation: the CPU reference must see the same numbers)
struct LabRng {
    NormalRng n;
    explicit LabRng(uint64_t seed) { memset(&n, 0, sizeof n); rng_seed(&n.rng, seed); }
    double normal() { return rng_normal(&n); }
    double uniform() { return rng_uniform(&n.rng); }
};
static inline double lab_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline double lab_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

// ----------------------------------------------------------------------------------------------------
// the diagonal preconditioner (MODEL.md §3.6) through the trainer's launchers precond_diag_forward / _backward, with the
// lab's shape; head-major padded rows; scratch from precond_scratch_add, as the trainer allocates it
static void lab_precond_diag_forward(floatX* kt, PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                     const floatX* log_atk_scale, const ChunkShape& s, float x, float eps) {
    precond_diag_forward(kt, pb, k, gp, bp, log_atk_scale, nullptr, nullptr, s.B, s.H, s.NC, s.C, s.K, x, eps);
}
static void lab_precond_diag_backward(float* dk, float* dgp, float* dbp, float* dlas, PrecondBufs& pb, const float* dkt,
                                      const floatX* k, const float* gp, const float* bp, const floatX* log_atk_scale,
                                      const ChunkShape& s, float x, float eps) {
    precond_diag_backward(dk, dgp, dbp, dlas, pb, dkt, k, gp, bp, log_atk_scale, s.B, s.H, s.NC, s.C, s.K, x, eps);
}

#endif // PDN_LAB_COMMON_H
