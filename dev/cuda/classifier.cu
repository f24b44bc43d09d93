/*
Kernel lab: the fused classifier (softmax + cross-entropy + dlogits in place), as train_pdn.cu runs it.
Per row of logits (N, Vv) with target t (t < 0: no target, e.g. MQAR positions that are not answers):
  loss = logsumexp(x) - x[t]   (0 without a target)
  with dscale != 0 the row is overwritten by dlogits = (softmax(x) - onehot(t)) * dscale (zeros without a target)
  argmax (optional, evaluation): the smallest index of the row's maximum

Versions:
  v1  three separate passes, one block per row each: row max (+ argmax), then sum of exp (+ the loss), then the
      dlogits write; reads the logits three times from global memory, keeps max and sum in global buffers
  v2  the trainer's classifier_kernel through classifier_launch (what classifier() in train_pdn.cu calls; that one
      also copies the losses to the host): one block of 256 threads per row, one pass for the max, its index and the
      online sum of exponentials, a second for the dlogits; 16-byte accesses when Vv % 8 == 0 (the odd 50257 takes
      the element-wise path)

CPU reference in double from the logits as the device sees them (floatX). Validation: N = 777 rows (about one in
five without a target), Vv = 32000 (the paper's vocabulary), 50257 (GPT-2's, odd) and 512 (the tiny BPE); with dscale
(training: losses, dlogits, argmax) and without (evaluation: losses, argmax, logits untouched).
Tolerances (relative L2): losses 1e-4 (fp32 sums of Vv exps); dlogits (floatX) 1e-2 in bf16 (one rounding), 1e-4 in
fp32; argmax, the no-target rows (loss and dlogits exactly 0) and the untouched logits are exact.
Timing: N = 32768 rows (16 x 2048 tokens), Vv = 32000, training mode (dscale != 0, no argmax); the logits are
restored before every call (untimed); GB/s counts one read and one write of the logits.

Build and run (from the repository root):
  make -C dev/cuda classifier classifier_fp32
  dev/cuda/classifier [1|2] [--no-bench]
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 2
#ifdef ENABLE_FP32
static const double TOL_D = 1e-4;
#else
static const double TOL_D = 1e-2;
#endif
static const double TOL_LOSS = 1e-4;
static const char* VERSION_NAME[3] = {"", "v1 3 passes", "v2 fused"};

// ----------------------------------------------------------------------------------------------------
// v1: three passes (blockDim.x = 256)

__global__ void classifier_max_kernel(float* rowmax, int* argmax, const floatX* logits, int Vv) {
    __shared__ float sv[256];
    __shared__ int si[256];
    const floatX* x = logits + (long)blockIdx.x * Vv;
    float mx = -INFINITY;
    int best = Vv;
    for (int i = threadIdx.x; i < Vv; i += blockDim.x) {
        float v = tof(x[i]);
        if (v > mx) { mx = v; best = i; }
    }
    sv[threadIdx.x] = mx;
    si[threadIdx.x] = best;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) {
            float o = sv[threadIdx.x + st];
            int oi = si[threadIdx.x + st];
            if (o > sv[threadIdx.x] || (o == sv[threadIdx.x] && oi < si[threadIdx.x])) { sv[threadIdx.x] = o; si[threadIdx.x] = oi; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        rowmax[blockIdx.x] = sv[0];
        if (argmax) { argmax[blockIdx.x] = si[0]; }
    }
}

__global__ void classifier_sum_kernel(float* rowsum, float* losses, const floatX* logits, const float* rowmax,
                                      const int* targets, int Vv) {
    __shared__ float ss[256];
    const floatX* x = logits + (long)blockIdx.x * Vv;
    float mx = rowmax[blockIdx.x], s = 0.0f;
    for (int i = threadIdx.x; i < Vv; i += blockDim.x) { s += expf(tof(x[i]) - mx); }
    ss[threadIdx.x] = s;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) { ss[threadIdx.x] += ss[threadIdx.x + st]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int t = targets[blockIdx.x];
        rowsum[blockIdx.x] = ss[0];
        losses[blockIdx.x] = t >= 0 ? logf(ss[0]) - (tof(x[t]) - mx) : 0.0f;
    }
}

__global__ void classifier_write_kernel(floatX* logits, const float* rowmax, const float* rowsum, const int* targets,
                                        int Vv, float dscale) {
    floatX* x = logits + (long)blockIdx.x * Vv;
    int t = targets[blockIdx.x];
    float mx = rowmax[blockIdx.x], sum = rowsum[blockIdx.x];
    for (int i = threadIdx.x; i < Vv; i += blockDim.x) {
        float d = t >= 0 ? (expf(tof(x[i]) - mx) / sum - (i == t ? 1.0f : 0.0f)) * dscale : 0.0f;
        x[i] = fromf<floatX>(d);
    }
}

struct ClsDev { floatX *logits, *pristine; float *losses, *rowmax, *rowsum; int *targets, *argmax; };

static void cls_alloc(ClsDev& d, long N, int Vv) {
    cudaCheck(cudaMalloc(&d.logits, (size_t)N * Vv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.pristine, (size_t)N * Vv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.losses, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d.rowmax, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d.rowsum, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d.targets, N * sizeof(int)));
    cudaCheck(cudaMalloc(&d.argmax, N * sizeof(int)));
}
static void cls_free(ClsDev& d) {
    cudaCheck(cudaFree(d.logits)); cudaCheck(cudaFree(d.pristine)); cudaCheck(cudaFree(d.losses));
    cudaCheck(cudaFree(d.rowmax)); cudaCheck(cudaFree(d.rowsum)); cudaCheck(cudaFree(d.targets)); cudaCheck(cudaFree(d.argmax));
}
static void cls_restore(ClsDev& d, long N, int Vv) {
    cudaCheck(cudaMemcpyAsync(d.logits, d.pristine, (size_t)N * Vv * sizeof(floatX), cudaMemcpyDeviceToDevice, main_stream));
}

static void cls_run(ClsDev& d, int v, long N, int Vv, float dscale, int* argmax) {
    if (v == 1) {
        classifier_max_kernel<<<N, 256, 0, main_stream>>>(d.rowmax, argmax, d.logits, Vv);
        classifier_sum_kernel<<<N, 256, 0, main_stream>>>(d.rowsum, d.losses, d.logits, d.rowmax, d.targets, Vv);
        if (dscale != 0.0f) {
            classifier_write_kernel<<<N, 256, 0, main_stream>>>(d.logits, d.rowmax, d.rowsum, d.targets, Vv, dscale);
        }
    } else {
        classifier_launch(d.logits, d.losses, argmax, d.targets, N, Vv, dscale); // as classifier() does
    }
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------

static void validate_case(int version_sel, int Vv, uint64_t seed) {
    const long N = 777;
    size_t n = (size_t)N * Vv;
    LabRng rng(seed);
    std::vector<float> x(n);
    std::vector<floatX> xx(n);
    std::vector<int> tg(N);
    for (size_t i = 0; i < n; i++) { xx[i] = lab_f2x((float)(2.0 * rng.normal())); x[i] = lab_x2f(xx[i]); }
    long count = 0;
    for (long r = 0; r < N; r++) {
        tg[r] = rng.uniform() < 0.2 ? -1 : (int)(rng.uniform() * Vv) % Vv;
        if (tg[r] >= 0) {
            count++;
            if (r % 3 == 0) { // a confident row: the target holds the largest logit, as after some training
                xx[(size_t)r * Vv + tg[r]] = lab_f2x(12.0f);
                x[(size_t)r * Vv + tg[r]] = lab_x2f(xx[(size_t)r * Vv + tg[r]]);
            }
        }
    }
    float dscale = 1.0f / (float)count; // the trainer's 1 / (count * grad_accum)
    // reference
    std::vector<double> loss(N), dl(n);
    std::vector<int> am(N);
    for (long r = 0; r < N; r++) {
        const float* p = &x[(size_t)r * Vv];
        double mx = p[0];
        int best = 0;
        for (int i = 1; i < Vv; i++) { if (p[i] > mx) { mx = p[i]; best = i; } }
        am[r] = best;
        double s = 0.0;
        for (int i = 0; i < Vv; i++) { s += exp((double)p[i] - mx); }
        int t = tg[r];
        loss[r] = t >= 0 ? log(s) - ((double)p[t] - mx) : 0.0;
        for (int i = 0; i < Vv; i++) {
            dl[(size_t)r * Vv + i] = t >= 0 ? (exp((double)p[i] - mx) / s - (i == t ? 1.0 : 0.0)) * dscale : 0.0;
        }
    }
    ClsDev d;
    cls_alloc(d, N, Vv);
    cudaCheck(cudaMemcpy(d.pristine, xx.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.targets, tg.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        char tag[64], what[128];
        for (int train = 1; train >= 0; train--) {
            snprintf(tag, sizeof tag, "v%d Vv=%-5d %s", v, Vv, train ? "train" : "eval ");
            cls_restore(d, N, Vv);
            lab_poison(d.losses, N * sizeof(float));
            lab_poison(d.argmax, N * sizeof(int));
            cls_run(d, v, N, Vv, train ? dscale : 0.0f, d.argmax);
            cudaCheck(cudaGetLastError());
            std::vector<float> gl = lab_download(d.losses, N), gd = lab_download_x(d.logits, n);
            std::vector<int> ga = lab_download(d.argmax, N);
            snprintf(what, sizeof what, "%s losses", tag);
            lab_check(what, rel_l2(gl.data(), loss.data(), N), TOL_LOSS);
            long bad = 0;
            for (long r = 0; r < N; r++) { bad += ga[r] != am[r]; }
            snprintf(what, sizeof what, "%s argmax", tag);
            lab_check_exact(what, bad, N);
            if (train) {
                snprintf(what, sizeof what, "%s dlogits", tag);
                lab_check(what, rel_l2(gd.data(), dl.data(), n), TOL_D);
                bad = 0;
                long rows0 = 0;
                for (long r = 0; r < N; r++) {
                    if (tg[r] >= 0) { continue; }
                    rows0++;
                    bad += !(gl[r] == 0.0f);
                    for (int i = 0; i < Vv; i++) { bad += !(gd[(size_t)r * Vv + i] == 0.0f); }
                }
                snprintf(what, sizeof what, "%s rows without target: loss, dlogits = 0", tag);
                lab_check_exact(what, bad, rows0 * (Vv + 1));
            } else {
                bad = 0;
                for (size_t i = 0; i < n; i++) { bad += !(gd[i] == x[i]); }
                snprintf(what, sizeof what, "%s logits untouched (dscale 0)", tag);
                lab_check_exact(what, bad, (long)n);
            }
        }
    }
    cls_free(d);
}

static void bench(int version_sel) {
    const long N = 32768;
    const int Vv = 32000;
    ClsDev d;
    cls_alloc(d, N, Vv);
    lab_fill(d.pristine, N * Vv, FILL_NORMAL, 0.0f, 2.0f, 41);
    std::vector<int> tg(N);
    LabRng rng(42);
    for (long r = 0; r < N; r++) { tg[r] = rng.uniform() < 0.1 ? -1 : (int)(rng.uniform() * Vv) % Vv; }
    cudaCheck(cudaMemcpy(d.targets, tg.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    double bytes = 2.0 * N * Vv * sizeof(floatX);
    printf("\n=== timing: classifier (%s), N=%ld rows, Vv=%d, training mode; GB/s = one read + one write of the logits ===\n",
           PRECISION_NAME, N, Vv);
    printf("%-14s %10s %8s\n", "version", "ms", "GB/s");
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        double t = bench_ms([&] { cls_restore(d, N, Vv); }, [&] { cls_run(d, v, N, Vv, 1.0f / N, nullptr); });
        printf("%-14s %10.3f %8.0f\n", VERSION_NAME[v], t, bytes / t / 1e6);
        fflush(stdout);
    }
    printf("\n");
    cls_free(d);
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    if (a.validate) {
        printf("\n=== validation: classifier (%s) vs the CPU reference in double; N=777 ===\n", PRECISION_NAME);
        uint64_t seed = 300;
        for (int Vv : {32000, 50257, 512}) { validate_case(a.version, Vv, seed++); }
    }
    if (a.bench) { bench(a.version); }
    return lab_finish("classifier");
}
#endif
