/*
train_pdn.cu: the CUDA trainer of pdn.c, mirroring the CPU reference train_pdn.c (same command line, presets,
parameter layout, checkpoint format and training semantics; the model math is documented there and in
MODEL.md). Mixed precision like llm.c: parameters and activations in bf16 (floatX), fp32 master weights,
gradients and optimizer state, stochastic rounding of the bf16 parameters with per-tensor seeds. Build with
-DENABLE_FP32 (make train_pdncu_fp32) for an all-fp32 build (no TF32) that matches the CPU reference to 1e-4.

Read it top to bottom:
  1. CUDA utilities, cuBLASLt and batched-GEMM wrappers
  2. layer kernels, each with its launcher: encoder, RMSNorm (+ residual), short conv + SiLU, L2 norm (+ the
     head-major layout of the mixer), gates, output norm + gate, SwiGLU, fused classifier, reductions, AdamW
  3. the mixer: diagonal preconditioner scan, exact preconditioner, chunkwise delta rule forward/backward
  4. the model: parameters, activations, forward, backward, update
  5. training: the calls train_common.h's run makes on this model (a step, an evaluation batch, generation,
     what a checkpoint saves), main()

The mixer works in a head-major layout padded to whole chunks: (B, H, Tp, X) with Tp = NC * C. A chunk of one
head is then a contiguous (C, X) matrix, so every per-chunk product of MODEL.md §4 is one strided-batched GEMM over
all B*H*NC chunks (tensor cores in bf16, exact fp32 in the FP32 build); the parts that are not GEMMs (cumsums,
masks and decays, the unit-triangular inverse, the sequential state scans, channel-decay scores, reductions)
are custom kernels. Padded tokens have q = k = v = 0, beta = 0, g = 0: they change neither outputs nor states.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <mma.h>
#include <cuda_pipeline.h>
#include <vector>
#include <algorithm>
#include <atomic>
#include <pthread.h>
#ifdef ENABLE_NCCL
#include <nccl.h>
#endif
#ifdef ENABLE_MPI
#include <mpi.h>
#endif
#include "pdn.h"
#include "mqar.h"
#include "train_common.h"
#include "dist.h"

// ----------------------------------------------------------------------------------------------------
// 1. CUDA utilities

#ifdef ENABLE_FP32
typedef float floatX;
#define PRECISION_NAME "fp32"
#define CUDA_FLOATX CUDA_R_32F
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#define CUDA_FLOATX CUDA_R_16BF
#endif

static void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "error: CUDA: %s [%s:%d]\n", cudaGetErrorString(err), file, line);
        if (err == cudaErrorMemoryAllocation) { fprintf(stderr, "  hint: lower -b (micro-batch) or -t\n"); }
        exit(EXIT_SYSTEM);
    }
}
#define cudaCheck(err) cuda_check(err, __FILE__, __LINE__)
// cuDNN's fused attention: the bf16 build, where the Makefile found cuDNN (else it passes -DNO_CUDNN)
#if !defined(ENABLE_FP32) && !defined(NO_CUDNN)
#define USE_CUDNN
#endif

static void cublas_check(cublasStatus_t st, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS status %d [%s:%d]\n", (int)st, file, line);
        exit(EXIT_SYSTEM);
    }
}
#define cublasCheck(st) cublas_check(st, __FILE__, __LINE__)

static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }
#define L2NORM_EPS_F 1e-6f // MODEL.md §3.3, fixed
#define GPU_CHUNK_MAX 64  // --chunk limit on the GPU (per-chunk shared-memory arrays are sized by it)

__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T fromf(float x);
template <> __device__ __forceinline__ float fromf<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 fromf<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// sigmoid by the hardware approximations (ex2.approx, div.approx; relative error a few 1e-6, growing slowly with |x|):
// the accurate expf and the IEEE 1 / x take ~20 instructions a call, and the conv + SiLU kernels are short of issue
// slots (their lab's v6 at D = 128: forward and backward -14%, H100, 2026-12-07). x -> -inf gives 0 (__fdividef by
// inf or by > 2^126 is 0), +inf 1.
__device__ __forceinline__ float sigmoidf_(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

// 16-byte vectors of floatX for memory-bound kernels (8 bf16 or 4 fp32 per load/store)
#define XVEC ((int)(16 / sizeof(floatX)))
struct alignas(16) XPack { floatX v[16 / sizeof(floatX)]; };
// NV floatX in one access where possible (8 bf16: one 16-byte word; 8 fp32: two)
template <int NV> struct alignas(NV * sizeof(floatX) < 16 ? NV * sizeof(floatX) : 16) XV { floatX v[NV]; };
template <int NV> __device__ __forceinline__ void ldvf(float* d, const float* p) {
    #pragma unroll
    for (int q = 0; q < NV / 4; q++) {
        float4 a = *(const float4*)(p + 4 * q);
        d[4 * q] = a.x; d[4 * q + 1] = a.y; d[4 * q + 2] = a.z; d[4 * q + 3] = a.w;
    }
}
template <int NV> __device__ __forceinline__ void ldvx(float* d, const floatX* p) { // NV floatX as fp32
    XV<NV> x = *(const XV<NV>*)p;
    #pragma unroll
    for (int u = 0; u < NV; u++) { d[u] = tof(x.v[u]); }
}
template <int NV> __device__ __forceinline__ void stvf(float* p, const float* s) {
    #pragma unroll
    for (int q = 0; q < NV / 4; q++) { *(float4*)(p + 4 * q) = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]); }
}
static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// warp and block sums; fixed shuffle order, so deterministic
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffff, v, o); }
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o)); }
    return v;
}
// sum (or max) over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result
template <bool MAX> __device__ float block_reduce(float v) {
    __shared__ float sh[32];
    __shared__ float total;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) { sh[warp] = v; }
    __syncthreads();
    if (warp == 0) {
        float s = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.0f);
        s = MAX ? warp_max(s) : warp_sum(s);
        if (lane == 0) { total = s; }
    }
    __syncthreads();
    return total;
}
__device__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ float block_max(float v) { return block_reduce<true>(v); }

// stochastic rounding to bf16 (SquirrelNoise5-style hash of position and seed); identity in the FP32 build
__device__ __forceinline__ unsigned int squirrel(unsigned int pos, unsigned int seed) {
    const unsigned int N1 = 0xd2a80a3f, N2 = 0xa884f197, N3 = 0x6C736F4B, N4 = 0xB79F3ABB, N5 = 0x1b56c4f5;
    unsigned int m = pos;
    m *= N1; m += seed; m ^= (m >> 9); m += N2; m ^= (m >> 11); m *= N3; m ^= (m >> 13); m += N4; m ^= (m >> 15);
    m *= N5; m ^= (m >> 17);
    return m;
}
__device__ __forceinline__ floatX round_sr(float x, unsigned int pos, unsigned int seed) {
#ifdef ENABLE_FP32
    (void)pos; (void)seed;
    return x;
#else
    unsigned int r = squirrel(pos, seed) & 0xFFFF;
    unsigned int b = __float_as_uint(x);
    b = (b + r) & 0xFFFF0000u; // add noise below the kept bits, then truncate
    return __float2bfloat16_rz(__uint_as_float(b));
#endif
}

// one device allocation for many tensors (activations, scratch): a list of (pointer, bytes). An overlay holds tensors
// that are never alive at the same time: between overlay_begin() and overlay_end(), each overlay_next() starts another
// set of tensors at the overlay's first byte, and the overlay takes the bytes of its largest set.
struct Arena {
    struct Item { void** p; size_t bytes; int ov, set; }; // ov: the overlay (-1: none), set: which of its sets
    std::vector<Item> items;
    void* mem = nullptr;
    size_t bytes = 0;
    int ov = -1, set = 0, n_ov = 0;
    template <typename T> void add(T** p, size_t count) { items.push_back({(void**)p, count * sizeof(T), ov, set}); }
    void overlay_begin() { ov = n_ov++; set = 0; }
    void overlay_next() { set++; }
    void overlay_end() { ov = -1; set = 0; }
    // each tensor 256-byte aligned; with base, assigns the pointers. Returns the bytes of what has been added so far.
    size_t layout(char* base) const {
        size_t off = 0, start = 0, end = 0; // an overlay's first byte and the end of its largest set so far
        for (size_t i = 0; i < items.size(); i++) {
            const Item& it = items[i];
            if (it.ov >= 0 && (i == 0 || items[i - 1].ov != it.ov)) { start = end = off; }            // an overlay starts
            else if (it.ov >= 0 && items[i - 1].set != it.set) { end = std::max(end, off); off = start; } // its next set
            if (base) { *it.p = it.bytes ? (void*)(base + off) : nullptr; }
            off += (it.bytes + 255) / 256 * 256;
            if (it.ov >= 0 && (i + 1 == items.size() || items[i + 1].ov != it.ov)) { off = std::max(end, off); } // it ends
        }
        return off;
    }
    size_t pending() const { return layout(nullptr); }
    void alloc() {
        bytes = pending();
        cudaCheck(cudaMalloc(&mem, bytes ? bytes : 256));
        cudaCheck(cudaMemset(mem, 0, bytes ? bytes : 256));
        layout((char*)mem);
    }
    void release() { if (mem) { cudaCheck(cudaFree(mem)); } mem = nullptr; items.clear(); n_ov = 0; }
};

// ----------------------------------------------------------------------------------------------------
// where the time goes: with PDN_PROFILE=1 every PROF(name) scope is timed with CUDA events (asynchronously;
// resolved once per step) and a table of the regions is printed at the end of the run

struct ProfMark { const char* name; cudaEvent_t a, b; int parent; }; // parent: the enclosing open scope's mark, or -1
static int prof_on = 0;
static std::vector<ProfMark> prof_pending;
static std::vector<int> prof_open; // marks of the scopes open now, innermost last
static std::vector<cudaEvent_t> prof_pool;
static std::vector<std::pair<const char*, double>> prof_total; // name -> ms, in first-seen order
static cudaStream_t main_stream = 0; // every kernel and copy of the step (gpu_setup makes it: a high-priority stream)

static cudaEvent_t prof_event(void) {
    if (prof_pool.empty()) { cudaEvent_t e; cudaCheck(cudaEventCreate(&e)); return e; }
    cudaEvent_t e = prof_pool.back();
    prof_pool.pop_back();
    return e;
}
struct ProfScope {
    int idx = -1;
    ProfScope(const char* name) {
        if (!prof_on) { return; }
        ProfMark m{name, prof_event(), prof_event(), prof_open.empty() ? -1 : prof_open.back()};
        cudaCheck(cudaEventRecord(m.a, main_stream));
        prof_pending.push_back(m);
        idx = (int)prof_pending.size() - 1;
        prof_open.push_back(idx);
    }
    ~ProfScope() {
        if (idx < 0) { return; }
        cudaCheck(cudaEventRecord(prof_pending[idx].b, main_stream));
        prof_open.pop_back();
    }
};
#define PROF_CAT2(a, b) a##b
#define PROF_CAT(a, b) PROF_CAT2(a, b)
#define PROF(name) ProfScope PROF_CAT(prof_scope_, __LINE__)(name)

// resolve the pending marks (call after a synchronisation); `count` = 0 drops them (warm-up steps)
// A scope's own time excludes the scopes nested in it (mixer.remake inside bwd.recompute), so that the regions do
// not overlap and their sum is the step's timed time.
static void prof_flush(int count) {
    if (count) {
        std::vector<double> own(prof_pending.size());
        for (size_t k = 0; k < prof_pending.size(); k++) {
            float ms = 0.0f;
            cudaCheck(cudaEventElapsedTime(&ms, prof_pending[k].a, prof_pending[k].b));
            own[k] += ms;
            if (prof_pending[k].parent >= 0) { own[prof_pending[k].parent] -= ms; }
        }
        for (size_t k = 0; k < prof_pending.size(); k++) {
            size_t i = 0;
            while (i < prof_total.size() && strcmp(prof_total[i].first, prof_pending[k].name) != 0) { i++; }
            if (i == prof_total.size()) { prof_total.push_back({prof_pending[k].name, 0.0}); }
            prof_total[i].second += own[k];
        }
    }
    for (auto& m : prof_pending) {
        prof_pool.push_back(m.a);
        prof_pool.push_back(m.b);
    }
    prof_pending.clear();
}

static void prof_report(int steps) {
    if (!prof_on || steps == 0) { return; }
    double tot = 0.0;
    for (auto& r : prof_total) { tot += r.second; }
    std::vector<std::pair<const char*, double>> rows = prof_total;
    std::sort(rows.begin(), rows.end(), [](const std::pair<const char*, double>& x, const std::pair<const char*, double>& y) { return x.second > y.second; });
    printf("\nwhere the time goes (PDN_PROFILE=1, mean over %d steps; a region's time excludes the regions nested in it):\n", steps);
    printf("%-28s %10s %7s\n", "region", "ms/step", "share");
    for (auto& r : rows) { printf("%-28s %10.2f %6.1f%%\n", r.first, r.second / steps, 100.0 * r.second / tot); }
    printf("%-28s %10.2f\n", "total (timed regions)", tot / steps);
}

// ----------------------------------------------------------------------------------------------------
// cuBLASLt (projections, MLP, classifier) and cuBLAS strided-batched GEMMs (the mixer's per-chunk products).
// All wrappers take row-major shapes; cuBLAS is column-major, so a row-major C = A B is computed as the
// column-major Cᵀ = Bᵀ Aᵀ.

static cublasHandle_t cublas_handle;
static cublasLtHandle_t cublaslt_handle;
__attribute__((unused)) static int smem_optin = 48 * 1024; // the device's per-block shared-memory limit, set in mixer_kernel_setup
__attribute__((unused)) static int num_sms = 132;            // the device's multiprocessors, likewise
static void* cublaslt_workspace = nullptr;
static const size_t cublaslt_workspace_size = 64ull << 20;
#ifdef ENABLE_FP32
static const cublasComputeType_t cublas_compute = CUBLAS_COMPUTE_32F; // true fp32: no TF32
#else
static const cublasComputeType_t cublas_compute = CUBLAS_COMPUTE_32F;
#endif

// D (M, N) = alpha * op(A) op(B) + beta * D, row-major, with op(A) (M, K), op(B) (K, N).
// transA: A is stored (K, M); transB: B is stored (N, K). A, B floatX; D floatX or fp32 (d_fp32).
// bias (N, floatX) is added when given (only with beta = 0 and a floatX output).
// D (M, N) = alpha op(A) op(B) + beta D, row-major; lda / ldd: row strides of A and D when they are column slices
// of a wider matrix (0: packed)
// side: on the backward's second stream with its own workspace (side_stream below)
static cudaStream_t side_stream = nullptr;
static void* side_workspace = nullptr;
static void matmul_lt(void* D, bool d_fp32, const floatX* A, bool transA, const floatX* B, bool transB,
                      int M, int N, int K, float alpha, float beta, const floatX* bias, int lda = 0, int ldd = 0,
                      bool side = false) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, cublas_compute, CUDA_R_32F));
    // column-major view: D' (N, M) = op(B') op(A'), B' = B viewed column-major
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N, opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opB, sizeof(opB)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opA, sizeof(opA)));
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    // first operand of the column-major product is B': (N x K) if not transposed, stored with ld = N (row-major B is K x N)
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_FLOATX, transB ? K : N, transB ? N : K, transB ? K : N));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_FLOATX, transA ? M : K, transA ? K : M, lda ? lda : transA ? M : K));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, d_fp32 ? CUDA_R_32F : CUDA_FLOATX, N, M, ldd ? ldd : N));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cublaslt_workspace_size, sizeof(cublaslt_workspace_size)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0) { fail(EXIT_SYSTEM, "cuBLASLt found no algorithm for a %d x %d x %d matmul", M, N, K); }
    cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &heur.algo,
                               side ? side_workspace : cublaslt_workspace, cublaslt_workspace_size,
                               side ? side_stream : main_stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
}

// out (N, OC) floatX = inp (N, C) @ w (OC, C)ᵀ + bias
static void matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C, int OC) {
    matmul_lt(out, false, inp, false, w, true, N, OC, C, 1.0f, 0.0f, bias);
}

// dinp (N, C) = or += dout (N, OC) @ w (OC, C);  dw (OC, C) fp32 += doutᵀ @ inp.
// dinp's mode: ADD into fp32 (several contributions), SET fp32 (the first or only one: no memset needed), SETX floatX.
// ld_dout, ld_dinp: row strides when dout / dinp are column slices of a wider matrix (0: packed). dinp null: dw only;
// dw null: dinp only. side: dw on the backward's second stream (side_begin, side_join).
enum { DINP_ADD, DINP_SET, DINP_SETX };
static void matmul_backward(void* dinp, int mode, float* dw, const floatX* dout, const floatX* inp, const floatX* w,
                            int N, int C, int OC, int ld_dout = 0, int ld_dinp = 0, bool side = false) {
    if (dinp) {
        matmul_lt(dinp, mode != DINP_SETX, dout, false, w, false, N, C, OC, 1.0f, mode == DINP_ADD ? 1.0f : 0.0f, nullptr,
                  ld_dout, ld_dinp);
    }
    if (dw) { matmul_lt(dw, true, dout, true, inp, false, OC, C, N, 1.0f, 1.0f, nullptr, ld_dout, 0, side); }
}

// The backward's second stream. The weight gradients of a layer's MLP and output projection need only what the
// layer's backward has made before the mixer's, so they can run beside the mixer's backward scan, which leaves most
// multiprocessors idle where few (b, h, value-slice) blocks walk long chains (1 x 32768: 64 blocks of 16 columns on
// 132 SMs, ~2 ms a layer). The rule counts 32-column slices: on where B H V / 32 < the multiprocessors. They are
// queued after the mixer's backward and wait for side_begin, which the mixer's backward calls just before the scan,
// so they become ready with it: queued before the mixer's backward (the first version), they
// ran beside its full-device kernels and had finished before the scan started (+1% at 1 x 32768). side_stream has the
// lowest priority and main_stream the highest (gpu_setup), so the scan's blocks, and main's after it, are scheduled
// first. side_begin: side_stream waits for what main_stream has queued; side_join: main_stream waits for side_stream's
// work (before the layer's input norm is made again into the buffer those GEMMs read, and everything after). The GEMMs
// and their algorithms are the same on either stream, so the gradients are equal bit for bit. bwd_side_force
// (PDN_BWD_SIDE=0|1) overrides the rule in bwd_side_for.
static cudaEvent_t side_ready, side_done;
static int bwd_side_force = -1;
static bool bwd_side_for(long B, int H, int V) {
    if (bwd_side_force >= 0) { return bwd_side_force != 0; }
    return B * H * cdiv(V, 32) < num_sms;
}
static void side_setup() { // once: the stream, its events and its GEMM workspace
    if (side_stream) { return; }
    int lowest, highest;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    cudaCheck(cudaStreamCreateWithPriority(&side_stream, cudaStreamNonBlocking, lowest)); // no implicit sync
    cudaCheck(cudaEventCreateWithFlags(&side_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming));
    cudaCheck(cudaMalloc(&side_workspace, cublaslt_workspace_size));
}
static void side_begin() {
    side_setup();
    cudaCheck(cudaEventRecord(side_ready, main_stream));
    cudaCheck(cudaStreamWaitEvent(side_stream, side_ready, 0));
}
static void side_join() {
    cudaCheck(cudaEventRecord(side_done, side_stream));
    cudaCheck(cudaStreamWaitEvent(main_stream, side_done, 0));
}

// Batched, row-major: C[i] (M, N) = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, strides in elements.
static void bgemm(bool ta, bool tb, int M, int N, int K, const floatX* A, int lda, long sA, const floatX* B, int ldb,
                  long sB, void* C, bool c_fp32, int ldc, long sC, int batch, float alpha, float beta) {
    cublasCheck(cublasGemmStridedBatchedEx(cublas_handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           N, M, K, &alpha, B, CUDA_FLOATX, ldb, sB, A, CUDA_FLOATX, lda, sA, &beta, C,
                                           c_fp32 ? CUDA_R_32F : CUDA_FLOATX, ldc, sC, batch, cublas_compute,
                                           CUBLAS_GEMM_DEFAULT));
}

// ----------------------------------------------------------------------------------------------------
// 2. layer kernels. Shapes: N = B*T tokens; "hm" = head-major padded (B, H, Tp, X).

// out (N, d) = wte[tokens]
__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, int N, int d) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * d) { return; }
    long n = i / d;
    out[i] = wte[(long)tokens[n] * d + i % d];
}
static void encoder_forward(floatX* out, const int* tokens, const floatX* wte, int N, int d) {
    encoder_forward_kernel<<<cdiv((long)N * d, 256), 256, 0, main_stream>>>(out, tokens, wte, N, d);
    cudaCheck(cudaGetLastError());
}

// The classifier's rows (acts_target_rows): out (M, d) = rows rows[0..M) of inp (N, d)
__global__ void gather_rows_kernel(floatX* out, const floatX* inp, const int* rows, long M, int d) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * d) { return; }
    out[i] = inp[(long)rows[i / d] * d + i % d];
}
static void gather_rows(floatX* out, const floatX* inp, const int* rows, long M, int d) {
    gather_rows_kernel<<<cdiv(M * d, 256), 256, 0, main_stream>>>(out, inp, rows, M, d);
    cudaCheck(cudaGetLastError());
}
// and back: out (N, d) row n = row slot[n] of inp (M, d), zero where slot[n] < 0 (no target)
__global__ void scatter_rows_kernel(float* out, const float* inp, const int* slot, long N, int d) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * d) { return; }
    int r = slot[i / d];
    out[i] = r >= 0 ? inp[(long)r * d + i % d] : 0.0f;
}
static void scatter_rows(float* out, const float* inp, const int* slot, long N, int d) {
    scatter_rows_kernel<<<cdiv(N * d, 256), 256, 0, main_stream>>>(out, inp, slot, N, d);
    cudaCheck(cudaGetLastError());
}

// Deterministic embedding backward: the host groups positions by token (bucket_start/bucket_pos, positions in
// increasing order); each thread sums one channel of one token over its positions in that fixed order.
__global__ void encoder_backward_kernel(float* dwte, const float* dout, const int* bucket_tok, const int* bucket_start,
                                        const int* bucket_pos, int d) {
    int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= d) { return; }
    float s = 0.0f;
    for (int i = bucket_start[u]; i < bucket_start[u + 1]; i++) { s += dout[(long)bucket_pos[i] * d + c]; }
    dwte[(long)bucket_tok[u] * d + c] += s;
}

// Deterministic column sums: out[m] += Σ_n mat[n, m] over N rows, rows summed in chunks of COLSUM_ROWS then the
// chunk partials. Blocks of 32 columns x 8 row lanes: lane y sums rows y, y+8, ... of its range (independent loads,
// many in flight), then the 8 lane sums are added in order: a fixed order, so the result does not depend on timing.
// partial: scratch of ceil(N/COLSUM_ROWS) * M floats.
#define COLSUM_ROWS 256
__device__ __forceinline__ float colsum_block_reduce(float s) { // (32, 8) block -> total for column threadIdx.x (y == 0)
    __shared__ float red[8][33];
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.y == 0) {
        #pragma unroll
        for (int y = 0; y < 8; y++) { t += red[y][threadIdx.x]; }
    }
    return t;
}
__global__ void colsum_partial_kernel(float* partial, const float* mat, int N, int M) {
    int m = blockIdx.x * 32 + threadIdx.x, ch = blockIdx.y;
    int r1 = min(N, (ch + 1) * COLSUM_ROWS);
    float s = 0.0f;
    if (m < M) {
        #pragma unroll 8
        for (int r = ch * COLSUM_ROWS + threadIdx.y; r < r1; r += 8) { s += mat[(long)r * M + m]; }
    }
    s = colsum_block_reduce(s);
    if (threadIdx.y == 0 && m < M) { partial[(long)ch * M + m] = s; }
}
__global__ void colsum_final_kernel(float* out, const float* partial, int nch, int M) {
    int m = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (m < M) {
        #pragma unroll 8
        for (int c = threadIdx.y; c < nch; c += 8) { s += partial[(long)c * M + m]; }
    }
    s = colsum_block_reduce(s);
    if (threadIdx.y == 0 && m < M) { out[m] += s; }
}
// partial sums (nch, M) live in a grow-only scratch; kernels that can compute their summands on the fly write the
// partials themselves (rmsnorm, conv weights) and only call colsum_finish
static float* colsum_scratch = nullptr;
static size_t colsum_scratch_n = 0;
static float* colsum_partials(int nch, int M) {
    if ((size_t)nch * M > colsum_scratch_n) {
        if (colsum_scratch) { cudaCheck(cudaFree(colsum_scratch)); }
        colsum_scratch_n = (size_t)nch * M;
        cudaCheck(cudaMalloc(&colsum_scratch, colsum_scratch_n * sizeof(float)));
    }
    return colsum_scratch;
}
// off: where in the scratch the partials start (a kernel that writes two sets of partials puts the second after the first)
static void colsum_finish(float* out, int nch, int M, size_t off = 0) {
    colsum_final_kernel<<<cdiv(M, 32), dim3(32, 8), 0, main_stream>>>(out, colsum_scratch + off, nch, M);
    cudaCheck(cudaGetLastError());
}
static void colsum_add(float* out, const float* mat, long N, int M) {
    int nch = cdiv(N, COLSUM_ROWS);
    colsum_partial_kernel<<<dim3(cdiv(M, 32), nch), dim3(32, 8), 0, main_stream>>>(colsum_partials(nch, M), mat, (int)N, M);
    colsum_finish(out, nch, M);
}

// out += in, n elements (fp32)
__global__ void add_inplace_kernel(float* out, const float* in, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] += in[i]; }
}
static void add_inplace(float* out, const float* in, long n) {
    add_inplace_kernel<<<cdiv(n, 256), 256, 0, main_stream>>>(out, in, n);
    cudaCheck(cudaGetLastError());
}

// RMSNorm (MODEL.md §2), optionally fused with the residual add: resid_out = a + b (if b), out = RMSNorm(resid) * w.
// One warp per row; VEC: lanes over 16-byte vectors (C % XVEC == 0 and aligned rows), else over single elements.
// one row of the output from its input x (C) and its rstd r, by the warp's lanes
template <bool VEC>
__device__ __forceinline__ void rmsnorm_row_apply(floatX* out, const floatX* x, const floatX* w, float r, int C, int lane) {
    const int W = VEC ? XVEC : 1;
    for (int c = lane * W; c < C; c += 32 * W) {
        XPack xv, ww, o;
        if (VEC) { xv = *(const XPack*)(x + c); ww = *(const XPack*)(w + c); }
        else { xv.v[0] = x[c]; ww.v[0] = w[c]; }
        #pragma unroll
        for (int k = 0; k < W; k++) { o.v[k] = fromf<floatX>(tof(xv.v[k]) * r * tof(ww.v[k])); }
        if (VEC) { *(XPack*)(out + c) = o; } else { out[c] = o.v[0]; }
    }
}
template <bool VEC>
__global__ void rmsnorm_forward_kernel(floatX* resid_out, floatX* out, float* rstd, const floatX* a, const floatX* b,
                                       const floatX* w, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }
    const int W = VEC ? XVEC : 1;
    long base = (long)row * C;
    float ss = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        XPack xa, xb;
        if (VEC) { xa = *(const XPack*)(a + base + c); if (b) { xb = *(const XPack*)(b + base + c); } }
        else { xa.v[0] = a[base + c]; if (b) { xb.v[0] = b[base + c]; } }
        #pragma unroll
        for (int k = 0; k < W; k++) {
            float x = tof(xa.v[k]);
            // round the sum to floatX first: the stored residual is what the next layer and the backward see
            if (b) { xa.v[k] = fromf<floatX>(x + tof(xb.v[k])); x = tof(xa.v[k]); }
            ss += x * x;
        }
        if (b) {
            if (VEC) { *(XPack*)(resid_out + base + c) = xa; } else { resid_out[base + c] = xa.v[0]; }
        }
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    if (lane == 0) { rstd[row] = r; }
    rmsnorm_row_apply<VEC>(out + base, b ? resid_out + base : a + base, w, r, C, lane);
}
static void rmsnorm_forward(floatX* resid_out, floatX* out, float* rstd, const floatX* a, const floatX* b, const floatX* w,
                            long N, int C, float eps) {
    bool vec = C % XVEC == 0 && aligned16(out) && aligned16(a) && aligned16(w) && (!b || (aligned16(b) && aligned16(resid_out)));
    if (vec) { rmsnorm_forward_kernel<true><<<cdiv(N, 8), 256, 0, main_stream>>>(resid_out, out, rstd, a, b, w, (int)N, C, eps); }
    else { rmsnorm_forward_kernel<false><<<cdiv(N, 8), 256, 0, main_stream>>>(resid_out, out, rstd, a, b, w, (int)N, C, eps); }
    cudaCheck(cudaGetLastError());
}
// out = the norm's output again from the stored (rounded) input and rstd: bit-identical to the forward's, so the
// backward needs no per-layer copy of ln1 and ln2 (2 x (N, d) floatX per layer)
template <bool VEC>
__global__ void rmsnorm_apply_kernel(floatX* out, const floatX* x, const float* rstd, const floatX* w, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }
    rmsnorm_row_apply<VEC>(out + (long)row * C, x + (long)row * C, w, rstd[row], C, lane);
}
static void rmsnorm_apply(floatX* out, const floatX* x, const float* rstd, const floatX* w, long N, int C) {
    bool vec = C % XVEC == 0 && aligned16(out) && aligned16(x) && aligned16(w);
    if (vec) { rmsnorm_apply_kernel<true><<<cdiv(N, 8), 256, 0, main_stream>>>(out, x, rstd, w, (int)N, C); }
    else { rmsnorm_apply_kernel<false><<<cdiv(N, 8), 256, 0, main_stream>>>(out, x, rstd, w, (int)N, C); }
    cudaCheck(cudaGetLastError());
}

// dinp (fp32) += RMSNorm backward, or dinp = dbase + RMSNorm backward when dbase is given (the residual stream's
// gradient passed through without a copy); dinp_x (optional) gets a floatX copy of the new dinp (a GEMM operand).
// dout is fp32 (dout_f) or floatX (dout_x), whichever is given.
__global__ void rmsnorm_backward_kernel(float* __restrict__ dinp, const float* __restrict__ dbase, floatX* __restrict__ dinp_x,
                                        const float* __restrict__ dout_f, const floatX* __restrict__ dout_x,
                                        const floatX* __restrict__ inp, const float* __restrict__ inp_f, const floatX* __restrict__ w, const float* __restrict__ rstd,
                                        int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }
    long base = (long)row * C;
    float r = rstd[row], dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dy = dout_f ? dout_f[base + c] : tof(dout_x[base + c]);
        float x = inp_f ? inp_f[base + c] : tof(inp[base + c]);
        dot += dy * tof(w[c]) * x;
    }
    dot = warp_sum(dot);
    float k = r * r * r * dot / C;
    for (int c = lane; c < C; c += 32) {
        float dy = dout_f ? dout_f[base + c] : tof(dout_x[base + c]);
        float x = inp_f ? inp_f[base + c] : tof(inp[base + c]);
        float v = (dbase ? dbase[base + c] : dinp[base + c]) + (r * dy * tof(w[c]) - k * x);
        dinp[base + c] = v;
        if (dinp_x) { dinp_x[base + c] = fromf<floatX>(v); }
    }
}
// the weight's gradient Σ_n dy x rstd: partial sums over chunks of COLSUM_ROWS rows, one thread per column
__global__ void rmsnorm_dw_partial_kernel(float* partial, const float* dout_f, const floatX* dout_x, const floatX* inp,
                                          const float* inp_f, const float* rstd, int N, int C) {
    int c = blockIdx.x * 32 + threadIdx.x, ch = blockIdx.y;
    float s = 0.0f;
    int r1 = min(N, (ch + 1) * COLSUM_ROWS);
    if (c < C) {
        #pragma unroll 4
        for (int r = ch * COLSUM_ROWS + threadIdx.y; r < r1; r += 8) {
            long i = (long)r * C + c;
            float dy = dout_f ? dout_f[i] : tof(dout_x[i]);
            float x = inp_f ? inp_f[i] : tof(inp[i]);
            s += dy * x * rstd[r];
        }
    }
    s = colsum_block_reduce(s);
    if (threadIdx.y == 0 && c < C) { partial[(long)ch * C + c] = s; }
}
static void rmsnorm_backward_rows(float* dinp, float* dw, const float* dout_f, const floatX* dout_x, const floatX* inp,
                                  const float* inp_f, const floatX* w, const float* rstd, long N, int C,
                                  const float* dbase, floatX* dinp_x) {
    rmsnorm_backward_kernel<<<cdiv(N, 8), 256, 0, main_stream>>>(dinp, dbase, dinp_x, dout_f, dout_x, inp, inp_f, w, rstd, (int)N, C);
    int nch = cdiv(N, COLSUM_ROWS);
    rmsnorm_dw_partial_kernel<<<dim3(cdiv(C, 32), nch), dim3(32, 8), 0, main_stream>>>(colsum_partials(nch, C), dout_f, dout_x, inp,
                                                                               inp_f, rstd, (int)N, C);
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, C);
}

// The same backward in one pass for the trainer's combination (dy fp32, x floatX) when C is a multiple of 128 up to
// 2048: a warp per row with the row in registers (lane owns NPL groups of 4 columns: 16-byte fp32 and 8-byte bf16
// accesses), and the weight gradient summed on the fly (the two-kernel version re-read dy and x for it): each warp
// over its RMS_RPW rows into its own row of shared memory (each lane owns its columns; in registers the sums spilled
// at C = 1024), then the NW warps in a fixed order into one partial row per block. NW = 8 up to C = 1024; past it 4,
// so that the sums fit 48 KB of shared memory and the row (~4 NPL registers a lane for dy, 2 NPL each for x and w at
// bf16) the registers of 2 blocks per multiprocessor (the 1b presets' C = 1792 took the two-kernel path, 2x slower).
#define RMS_RPW 16
template <int NPL, int NW>
__global__ void __launch_bounds__(NW * 32, 2) rmsnorm_backward_fused_kernel(float* __restrict__ partial, float* __restrict__ dinp,
                                                                       const float* __restrict__ dbase, floatX* __restrict__ dinp_x,
                                                                       const float* __restrict__ dout, const floatX* __restrict__ inp,
                                                                       const floatX* __restrict__ w, const float* __restrict__ rstd,
                                                                       int N, int C) {
    __shared__ float red[NW][NPL * 128]; // (warp, C) the warps' weight-gradient sums
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    XV<4> wx[NPL], xx[NPL]; // w and the row's x kept as floatX; the warp's dw sums in its own row of red
    #pragma unroll
    for (int k = 0; k < NPL; k++) {
        wx[k] = *(const XV<4>*)(w + 4 * (lane + 32 * k));
        *(float4*)&red[warp][4 * (lane + 32 * k)] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    int row0 = (blockIdx.x * NW + warp) * RMS_RPW;
    for (int i = 0; i < RMS_RPW; i++) {
        int row = row0 + i;
        if (row >= N) { break; }
        long base = (long)row * C;
        float dy[NPL][4], dot = 0.0f, r = rstd[row];
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            int c = 4 * (lane + 32 * k);
            ldvf<4>(dy[k], dout + base + c);
            xx[k] = *(const XV<4>*)(inp + base + c);
        }
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            #pragma unroll
            for (int u = 0; u < 4; u++) { dot += dy[k][u] * tof(wx[k].v[u]) * tof(xx[k].v[u]); }
        }
        dot = warp_sum(dot);
        float kk = r * r * r * dot / C;
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            int c = 4 * (lane + 32 * k);
            float v[4], b[4];
            ldvf<4>(b, (dbase ? dbase : dinp) + base + c);
            XV<4> vx;
            float* dw = &red[warp][c];
            float4 s = *(float4*)dw;
            float sv[4] = {s.x, s.y, s.z, s.w};
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                float x = tof(xx[k].v[u]);
                v[u] = b[u] + (r * dy[k][u] * tof(wx[k].v[u]) - kk * x);
                vx.v[u] = fromf<floatX>(v[u]);
                sv[u] += dy[k][u] * x * r;
            }
            stvf<4>(dw, sv);
            stvf<4>(dinp + base + c, v);
            if (dinp_x) { *(XV<4>*)(dinp_x + base + c) = vx; }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += NW * 32) {
        float s = 0.0f;
        #pragma unroll
        for (int q = 0; q < NW; q++) { s += red[q][c]; }
        partial[(long)blockIdx.x * C + c] = s;
    }
}
// launch the instance for npl (1 ... NPL) without a case per width
template <int NPL>
static void rmsnorm_backward_fused(int npl, float* dinp, float* dw, const float* dbase, floatX* dinp_x, const float* dout_f,
                                   const floatX* inp, const floatX* w, const float* rstd, long N, int C) {
    if constexpr (NPL > 1) {
        if (npl < NPL) { rmsnorm_backward_fused<NPL - 1>(npl, dinp, dw, dbase, dinp_x, dout_f, inp, w, rstd, N, C); return; }
    }
    constexpr int NW = NPL <= 8 ? 8 : 4;
    int nch = cdiv(N, NW * RMS_RPW);
    float* partial = colsum_partials(nch, C);
    rmsnorm_backward_fused_kernel<NPL, NW><<<nch, NW * 32, 0, main_stream>>>(partial, dinp, dbase, dinp_x, dout_f, inp, w, rstd, (int)N, C);
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, C);
}
// dinp = (dbase or dinp) + the norm's backward (fp32, and its floatX copy if dinp_x), dw += the weight gradient
static void rmsnorm_backward(float* dinp, float* dw, const float* dout_f, const floatX* dout_x, const floatX* inp,
                             const float* inp_f, const floatX* w, const float* rstd, long N, int C,
                             const float* dbase = nullptr, floatX* dinp_x = nullptr) {
    int npl = C / 128;
    bool fused = dout_f && !inp_f && C % 128 == 0 && npl >= 1 && npl <= 16 && aligned16(dinp) && aligned16(dout_f) &&
                 aligned16(inp) && aligned16(w) && (!dbase || aligned16(dbase)) && (!dinp_x || aligned16(dinp_x));
    if (fused) { rmsnorm_backward_fused<16>(npl, dinp, dw, dbase, dinp_x, dout_f, inp, w, rstd, N, C); }
    else { rmsnorm_backward_rows(dinp, dw, dout_f, dout_x, inp, inp_f, w, rstd, N, C, dbase, dinp_x); }
}

// index of element (b, t, h, j) of a (B, T, H*D) tensor in the head-major padded layout (B, H, Tp, Dp), Dp >= D
__device__ __forceinline__ long hm_index(int b, int t, int c, int H, int D, int Dp, int Tp) {
    return (((long)b * H + c / D) * Tp + t) * Dp + c % D;
}

// new history = the last cs-1 rows of [old history; z], per sequence
__global__ void conv_history_kernel(floatX* hist, const floatX* z, int B, int T, int Ch, int cs) {
    int nh = cs - 1;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * Ch) { return; }
    int b = (int)(i / Ch), c = (int)(i % Ch);
    float tmp[16];
    for (int k = 0; k < nh; k++) {
        int s = T - nh + k;
        tmp[k] = s >= 0 ? tof(z[((long)b * T + s) * Ch + c]) : tof(hist[((long)b * nh + nh + s) * Ch + c]);
    }
    for (int k = 0; k < nh; k++) { hist[((long)b * nh + k) * Ch + c] = fromf<floatX>(tmp[k]); }
}

// Fused short convolution + SiLU (+ L2 norm over the head) for the mixer's q, k (norm) and v (no norm). One block of
// 256 threads per (b, h, tile of CONV_TR tokens): the tile's inputs and the cs-1 before it are staged in shared
// memory with all loads in flight at once, then each warp takes tokens (independent of each other: no serial chain
// through time), lanes over the head's D channels (lane, lane+32, ...). Head-major rows have Dp >= D columns (the
// mixer's padded head size; the columns after D are not touched). pre[t] = Σ_j w[cs-1-j] z[t-j], the conv
// output (token-major floatX), is written only if pre is given (the kernel lab checks it; the trainer's backward
// makes it again from z, bit for bit, instead of storing it); out is head-major padded.
#define CONV_TR 64
#define CONV_CS_MAX 4    // the presets' kernel size; larger ones are refused on the GPU
#define CONV_THREADS 256
// rows x row_bytes from src (row stride src_stride bytes) into dst (row stride dst_stride bytes), 16 bytes a copy.
// Where the copying threads are a whole number of rows' worth of copies (the usual case: 2 to 32 a row) each
// thread keeps one 16-byte column and steps its pointers down the rows: a division per copy (the general loop) was
// 40% of the backward scan's issue time at one sequence (Nsight Compute, H200, 2026-12-03). A power of two a row (every
// scan's operand) takes shifts, not divisions: the division and remainder by the runtime `per` were still 14% of the
// forward scan's instructions at 1 x 32768 (Nsight Compute, H100, 2026-12-07), five calls a chunk on the chain.
// tid, nt: the copying threads (nt of them, tid this one's index among them); by default the whole block.
__device__ __forceinline__ void stage_async(void* dst, int dst_stride, const void* src, long src_stride, int rows, int row_bytes,
                                            int tid = 0, int nt = 0) {
    if (nt == 0) { tid = threadIdx.x; nt = blockDim.x; }
    int per = row_bytes / 16, r, p, step;
    if ((per & (per - 1)) == 0 && (nt & (per - 1)) == 0) {
        int sh = __ffs(per) - 1;
        r = tid >> sh, p = tid & (per - 1), step = nt >> sh;
    } else if (per > 0 && nt % per == 0) {
        r = tid / per, p = tid % per, step = nt / per;
    } else {
        step = 0;
    }
    if (step > 0) {
        char* d = (char*)dst + (size_t)r * dst_stride + p * 16;
        const char* s = (const char*)src + r * src_stride + p * 16;
        for (; r < rows; r += step, d += (size_t)step * dst_stride, s += step * src_stride) { __pipeline_memcpy_async(d, s, 16); }
        return;
    }
    for (int i = tid; i < rows * per; i += nt) {
        int r = i / per, p = i % per;
        __pipeline_memcpy_async((char*)dst + (size_t)r * dst_stride + p * 16, (const char*)src + r * src_stride + p * 16, 16);
    }
}
// Stage rows ta .. ta+nrows-1 (columns c0 .. c0+D-1) of z (B, T, Ch) into zs (nrows, D): rows before 0 from the
// history (B, cs-1, Ch) or zeros, rows at or after tend zeros. Where the shapes and pointers allow 16-byte accesses,
// the rows inside z go by cp.async, all in flight at once (no registers held, no division per copy); the other rows
// (or all, unaligned) by loads, unrolled so that many are in flight. Each thread's copies are complete on return; the
// caller's barrier makes them the block's.
__device__ __forceinline__ void conv_stage(floatX* zs, const floatX* z, const floatX* hist, int b, int T, int Ch, int c0,
                                           int D, int ta, int nrows, int tend, int cs) {
    bool vec = D % XVEC == 0 && Ch % XVEC == 0 && c0 % XVEC == 0 && ((uintptr_t)z & 15) == 0 &&
               (!hist || ((uintptr_t)hist & 15) == 0);
    int W = vec ? XVEC : 1, per = D / W;
    int ra = vec ? max(0, -ta) : nrows, rb = vec ? max(ra, min(nrows, tend - ta)) : nrows; // rows [ra, rb) by cp.async
    if (rb > ra) {
        stage_async(zs + (size_t)ra * D, D * (int)sizeof(floatX), z + ((long)b * T + ta + ra) * Ch + c0,
                    (long)Ch * sizeof(floatX), rb - ra, D * (int)sizeof(floatX));
    }
    __pipeline_commit();
    int ne = nrows - (rb - ra); // the other rows: [0, ra) and [rb, nrows)
    #pragma unroll 4
    for (int i = threadIdx.x; i < ne * per; i += CONV_THREADS) {
        int r = i / per, c = (i % per) * W;
        r = r < ra ? r : rb + (r - ra);
        int t = ta + r;
        const floatX* src = nullptr;
        if (t >= 0 && t < tend) { src = z + ((long)b * T + t) * Ch + c0 + c; }
        else if (t < 0 && hist) { src = hist + ((long)b * (cs - 1) + (cs - 1 + t)) * Ch + c0 + c; }
        if (vec) {
            XPack v;
            if (src) { v = *(const XPack*)src; }
            else {
                #pragma unroll
                for (int k = 0; k < XVEC; k++) { v.v[k] = fromf<floatX>(0.0f); }
            }
            *(XPack*)(zs + r * D + c) = v;
        } else {
            zs[r * D + c] = src ? *src : fromf<floatX>(0.0f);
        }
    }
    __pipeline_wait_prior(0);
}

template <int CPL>
__global__ void __launch_bounds__(CONV_THREADS) conv_norm_forward_kernel(floatX* pre, floatX* out, float* rstd, const floatX* z,
                                                                          const floatX* w, const floatX* hist, int B, int T,
                                                                          int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                                                                          const unsigned char* dlen) {
    extern __shared__ float conv_smem[];
    float* ws = conv_smem;                         // (D, cs) the taps
    floatX* zs = (floatX*)(ws + D * cs);           // (CONV_TR + cs - 1, D): z[t0 - cs + 1 + r]
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = CONV_THREADS / 32;
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int t0 = blockIdx.y * CONV_TR, t1 = min(T, t0 + CONV_TR), nrows = t1 - t0 + cs - 1;
    conv_stage(zs, z, hist, b, T, Ch, h * D, D, t0 - (cs - 1), nrows, t1, cs);
    for (int i = threadIdx.x; i < D * cs; i += CONV_THREADS) { ws[i] = tof(w[(long)h * D * cs + i]); }
    __syncthreads();
    for (int t = t0 + warp; t < t1; t += nw) {
        float o[CPL], ss = 0.0f;
        long it = ((long)b * T + t) * Ch + h * D;
        int taps = dlen ? min(cs, dlen[(long)b * T + t] + 1) : cs; // documents: only taps inside t's document
        #pragma unroll
        for (int u = 0; u < CPL; u++) {
            int c = lane + 32 * u;
            o[u] = 0.0f;
            if (c >= D) { continue; }
            float acc = 0.0f;
            for (int j = 0; j < taps; j++) { acc += ws[c * cs + cs - 1 - j] * tof(zs[(t - t0 + cs - 1 - j) * D + c]); }
            floatX px = fromf<floatX>(acc);
            if (pre) { pre[it + c] = px; }
            float p = tof(px);
            o[u] = tof(fromf<floatX>(p * sigmoidf_(p))); // rounded like the unfused SiLU output
            ss += o[u] * o[u];
        }
        float r = 1.0f;
        if (norm) {
            ss = warp_sum(ss);
            r = rsqrtf(ss + L2NORM_EPS_F);
            if (lane == 0) { rstd[((long)b * T + t) * H + h] = r; }
        }
        long ob = (((long)b * H + h) * Tp + t) * Dp;
        #pragma unroll
        for (int u = 0; u < CPL; u++) {
            int c = lane + 32 * u;
            if (c < D) { out[ob + c] = fromf<floatX>(norm ? o[u] * r * scale : o[u]); }
        }
    }
}

// Backward of the above, same tiles: dy (head-major fp32, the gradient of out). Phase 1, a warp per token (the tile
// and the cs-1 tokens after it, a recomputed halo): with norm the L2 norm's backward dx = rstd (scale dy - out (dy·out)
// / scale), then dpre = dx silu'(pre), into shared memory. pre is read if given, else made again from the staged z
// (the tile's z and the cs-1 rows before and after it) exactly as the forward rounds it: a (N, D) floatX tensor per
// call less to store and to read. Phase 2, a thread per (channel, token group):
// dz[s] = Σ_j w[cs-1-j] dpre[s+j] (token-major floatX, for the projection's backward) and the weight gradient
// dw[cs-1-j] = Σ_t dpre[t] z[t-j], summed over the tile in a fixed order into partial (B * tiles, Ch * cs).
template <int CPL>
__global__ void __launch_bounds__(CONV_THREADS) conv_norm_backward_kernel(floatX* __restrict__ dz, int ldz, float* __restrict__ partial,
                                                                           const float* __restrict__ dy, const floatX* __restrict__ out,
                                                                           const float* __restrict__ rstd, const floatX* __restrict__ pre,
                                                                           const floatX* __restrict__ z, const floatX* __restrict__ w,
                                                                           int B, int T, int H, int D, int Dp, int cs, int Tp, int norm,
                                                                           float scale, int ntiles, const unsigned char* dlen) {
    extern __shared__ float conv_smem[];
    int nr = CONV_TR + cs - 1;
    float* dps = conv_smem;                        // (nr, D): dpre[t0 + r], zero at and after T
    float* ws = dps + nr * D;                      // (D, cs)
    floatX* zs = (floatX*)(ws + D * cs);           // (nr + cs - 1, D): z[t0 - cs + 1 + r]
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = CONV_THREADS / 32;
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int t0 = blockIdx.y * CONV_TR, t1 = min(T, t0 + CONV_TR);
    // with pre: rows ta .. t1-1 for the weight gradient; without: up to the halo's last row for phase 1 too
    conv_stage(zs, z, nullptr, b, T, Ch, h * D, D, t0 - (cs - 1), pre ? nr : nr + cs - 1, pre ? t1 : T, cs);
    for (int i = threadIdx.x; i < D * cs; i += CONV_THREADS) { ws[i] = tof(w[(long)h * D * cs + i]); }
    if (!pre) { __syncthreads(); } // phase 1 reads zs and ws
    // two tokens per warp at a time: both tokens' loads are in flight together
    for (int r0 = warp; r0 < nr; r0 += 2 * nw) {
        float dyv[2][CPL], ov[2][CPL], pv[2][CPL], dot[2], rr[2];
        #pragma unroll
        for (int p = 0; p < 2; p++) {
            int r = r0 + p * nw, t = t0 + r;
            bool ok = r < nr && t < T;
            long ob = (((long)b * H + h) * Tp + t) * Dp, tb = ((long)b * T + t) * Ch + h * D;
            int taps = ok && dlen ? min(cs, dlen[(long)b * T + t] + 1) : cs; // documents: the forward's taps
            dot[p] = 0.0f;
            rr[p] = (ok && norm) ? rstd[((long)b * T + t) * H + h] : 1.0f;
            #pragma unroll
            for (int u = 0; u < CPL; u++) {
                int c = lane + 32 * u;
                bool in = ok && c < D;
                dyv[p][u] = in ? dy[ob + c] : 0.0f;
                ov[p][u] = (in && norm) ? tof(out[ob + c]) : 0.0f;
                if (pre) { pv[p][u] = in ? tof(pre[tb + c]) : 0.0f; }
                else if (in) {
                    float acc = 0.0f; // the forward's sum, in its order
                    for (int j = 0; j < taps; j++) { acc += ws[c * cs + cs - 1 - j] * tof(zs[(r + cs - 1 - j) * D + c]); }
                    pv[p][u] = tof(fromf<floatX>(acc));
                } else { pv[p][u] = 0.0f; }
                dot[p] += dyv[p][u] * ov[p][u];
            }
        }
        if (norm) { dot[0] = warp_sum(dot[0]); dot[1] = warp_sum(dot[1]); }
        #pragma unroll
        for (int p = 0; p < 2; p++) {
            int r = r0 + p * nw;
            if (r >= nr) { continue; }
            float ds = dot[p] / scale; // one division a token
            #pragma unroll
            for (int u = 0; u < CPL; u++) {
                int c = lane + 32 * u;
                if (c >= D) { continue; }
                // rows at or after T: everything loaded as zero, so dpre = 0
                float dx = norm ? rr[p] * (scale * dyv[p][u] - ov[p][u] * ds) : dyv[p][u];
                float sg = sigmoidf_(pv[p][u]);
                dps[r * D + c] = dx * sg * (1.0f + pv[p][u] * (1.0f - sg));
            }
        }
    }
    __syncthreads();
    // phase 2: G token groups of D threads (D <= 256; G * cs <= nr so that dps can hold the group sums)
    int G = min(CONV_THREADS / D, nr / cs), c = threadIdx.x % D, g = threadIdx.x / D;
    float dwr[CONV_CS_MAX] = {0.0f, 0.0f, 0.0f, 0.0f}; // dwr[j]: Σ dpre[t] z[t - j]
    if (g < G) {
        for (int s = t0 + g; s < t1; s += G) {
            int r = s - t0;
            float acc = 0.0f, dp = dps[r * D + c];
            #pragma unroll
            for (int j = 0; j < CONV_CS_MAX; j++) {
                if (j < cs) {
                    // documents: token s + j reads s through tap j, and token s reads s - j, only inside their documents
                    if (!dlen || (s + j < T && j <= dlen[(long)b * T + s + j])) { acc += ws[c * cs + cs - 1 - j] * dps[(r + j) * D + c]; }
                    if (!dlen || j <= dlen[(long)b * T + s]) { dwr[j] += dp * tof(zs[(r + cs - 1 - j) * D + c]); }
                }
            }
            dz[((long)b * T + s) * ldz + h * D + c] = fromf<floatX>(acc);
        }
    }
    __syncthreads(); // dps is reused for the group sums
    if (g < G) {
        #pragma unroll
        for (int j = 0; j < CONV_CS_MAX; j++) { if (j < cs) { dps[(g * D + c) * cs + j] = dwr[j]; } }
    }
    __syncthreads();
    long prow = (long)b * ntiles + blockIdx.y;
    for (int i = threadIdx.x; i < D * cs; i += CONV_THREADS) {
        int cc = i / cs, j = i % cs;
        float s = 0.0f;
        for (int q = 0; q < G; q++) { s += dps[(q * D + cc) * cs + j]; }
        partial[prow * Ch * cs + (long)(h * D + cc) * cs + cs - 1 - j] = s;
    }
}

static size_t conv_smem_forward(int D, int cs) {
    return (size_t)D * cs * sizeof(float) + (size_t)(CONV_TR + cs - 1) * D * sizeof(floatX);
}
static size_t conv_smem_backward(int D, int cs) { // zs: room for the halo's z when pre is made again
    return (size_t)((CONV_TR + cs - 1) * D + D * cs) * sizeof(float) + (size_t)(CONV_TR + 2 * (cs - 1)) * D * sizeof(floatX);
}

static void conv_norm_forward_tiles(floatX* pre, floatX* out, float* rstd, const floatX* z, const floatX* w, const floatX* hist,
                                    int B, int T, int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                                    const unsigned char* dlen = nullptr) {
    dim3 grid(B * H, cdiv(T, CONV_TR));
    size_t sm = conv_smem_forward(D, cs);
    int c = cdiv(D, 32);
    if (c <= 1) { conv_norm_forward_kernel<1><<<grid, CONV_THREADS, sm, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen); }
    else if (c <= 2) { conv_norm_forward_kernel<2><<<grid, CONV_THREADS, sm, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen); }
    else if (c <= 4) { conv_norm_forward_kernel<4><<<grid, CONV_THREADS, sm, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen); }
    else { conv_norm_forward_kernel<8><<<grid, CONV_THREADS, sm, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen); }
    cudaCheck(cudaGetLastError());
}

static void conv_norm_backward_tiles(floatX* dz, int ldz, float* dw, const float* dy, const floatX* out, const float* rstd,
                                     const floatX* pre, const floatX* z, const floatX* w, int B, int T, int H, int D, int Dp,
                                     int cs, int Tp, int norm, float scale, const unsigned char* dlen = nullptr) {
    int ntiles = cdiv(T, CONV_TR), nch = B * ntiles, Ch = H * D;
    float* partial = colsum_partials(nch, Ch * cs);
    dim3 grid(B * H, ntiles);
    size_t sm = conv_smem_backward(D, cs);
    int c = cdiv(D, 32);
    if (c <= 1) { conv_norm_backward_kernel<1><<<grid, CONV_THREADS, sm, main_stream>>>(dz, ldz, partial, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, ntiles, dlen); }
    else if (c <= 2) { conv_norm_backward_kernel<2><<<grid, CONV_THREADS, sm, main_stream>>>(dz, ldz, partial, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, ntiles, dlen); }
    else if (c <= 4) { conv_norm_backward_kernel<4><<<grid, CONV_THREADS, sm, main_stream>>>(dz, ldz, partial, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, ntiles, dlen); }
    else { conv_norm_backward_kernel<8><<<grid, CONV_THREADS, sm, main_stream>>>(dz, ldz, partial, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, ntiles, dlen); }
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, Ch * cs);
}

// The same tiles with fewer instructions per element (the kernels above issue ~100 per element and reach ~40% of the
// memory bandwidth): a thread owns NV consecutive channels of a token (NV = 4: 8-byte floatX and 16-byte fp32
// accesses, 4 taps x NV weights in registers, <= 64 registers so that 4 blocks fit per SM as the shared memory
// allows), the kernel size is a template parameter (all loops unrolled), the D/NV threads of a token are
// consecutive lanes and reduce the norm's sums by shuffles. Weight gradient: per-thread sums, then the lanes of the
// same channels within the warp, then the 8 warps in a fixed order. Needs D/NV <= 32 (D <= 128 at NV = 4; a token's
// lanes are D/NV rounded up to a power of two, conv_lanes) and aligned rows; otherwise the kernels above run.
// Lab: dev/cuda/conv_norm.cu (v5; v3 is NV = 8; v6 lets D/NV be any count up to 32, for the 1b KDA's D = 120).

// lanes per token: D / NV rounded up to a power of two (<= 32); lanes past D / NV hold no channels and add zeros
// (D = 120 at NV = 4: 30 of 32 lanes)
__host__ __device__ __forceinline__ int conv_lanes(int D, int NV) {
    int n = 1;
    while (n < D / NV) { n *= 2; }
    return n;
}
// sum over the ng lanes of a token group (consecutive lanes, ng a power of two <= 32); every lane of the warp calls it
__device__ __forceinline__ float group_sum(float v, int ng) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) { // unrolled (a loop on ng is a branch per step); the order is ng / 2 ... 1
        if (o < ng) { v += __shfl_xor_sync(0xffffffff, v, o); }
    }
    return v;
}

template <int CS, int NV, bool DOC>
__global__ void __launch_bounds__(CONV_THREADS, NV == 4 ? 4 : 1) conv_norm_forward_vec_kernel(floatX* pre, floatX* out, float* rstd, const floatX* z,
                                                                             const floatX* w, const floatX* hist, int B, int T,
                                                                             int H, int D, int Dp, int Tp, int norm, float scale,
                                                                             const unsigned char* dlen) {
    if (!DOC) { dlen = nullptr; } // without documents the tests below vanish at compile time (they cost ~3% in registers)
    extern __shared__ float conv_smem[];
    float* ws = conv_smem;                         // (D, CS) the taps
    floatX* zs = (floatX*)(ws + D * CS);           // (CONV_TR + CS - 1, D): z[t0 - CS + 1 + r]
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int t0 = blockIdx.y * CONV_TR, t1 = min(T, t0 + CONV_TR), nrows = t1 - t0 + CS - 1;
    conv_stage(zs, z, hist, b, T, Ch, h * D, D, t0 - (CS - 1), nrows, t1, CS);
    for (int i = threadIdx.x; i < D * CS; i += CONV_THREADS) { ws[i] = tof(w[(long)h * D * CS + i]); }
    __syncthreads();
    int ng = conv_lanes(D, NV), g = threadIdx.x % ng, run = threadIdx.x / ng, nrun = CONV_THREADS / ng, c0 = NV * g;
    bool act = c0 < D; // a lane with channels
    float wr[NV][CS];
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int k = 0; k < CS; k++) { wr[u][k] = act ? ws[(c0 + u) * CS + k] : 0.0f; }
    }
    int iters = (CONV_TR + nrun - 1) / nrun; // the same count for every thread: the group sums are warp shuffles
    for (int it = 0; it < iters; it++) {
        int tr = run + it * nrun, t = t0 + tr;
        bool ok = t < t1;
        float acc[NV], o[NV], ss = 0.0f;
        #pragma unroll
        for (int u = 0; u < NV; u++) { acc[u] = 0.0f; }
        if (ok && act) {
            int reach = dlen ? dlen[(long)b * T + t] : CS; // documents: taps j <= reach only
            #pragma unroll
            for (int j = 0; j < CS; j++) { // the taps in v2's order: z[t - j] with w[CS - 1 - j]
                if (j > reach) { break; }
                XV<NV> zr = *(const XV<NV>*)(zs + (tr + CS - 1 - j) * D + c0);
                #pragma unroll
                for (int u = 0; u < NV; u++) { acc[u] += wr[u][CS - 1 - j] * tof(zr.v[u]); }
            }
        }
        XV<NV> px;
        #pragma unroll
        for (int u = 0; u < NV; u++) {
            px.v[u] = fromf<floatX>(acc[u]);
            float p = tof(px.v[u]);
            o[u] = tof(fromf<floatX>(p * sigmoidf_(p))); // rounded like the unfused SiLU output
            ss += o[u] * o[u];
        }
        float r = 1.0f;
        if (norm) {
            ss = group_sum(ss, ng);
            r = rsqrtf(ss + L2NORM_EPS_F);
        }
        if (!ok || !act) { continue; }
        if (pre) { *(XV<NV>*)(pre + ((long)b * T + t) * Ch + h * D + c0) = px; }
        if (norm && g == 0) { rstd[((long)b * T + t) * H + h] = r; }
        XV<NV> ov;
        #pragma unroll
        for (int u = 0; u < NV; u++) { ov.v[u] = fromf<floatX>(norm ? o[u] * r * scale : o[u]); }
        *(XV<NV>*)(out + (((long)b * H + h) * Tp + t) * Dp + c0) = ov;
    }
}

template <int CS, int NV, bool DOC>
__global__ void __launch_bounds__(CONV_THREADS, NV == 4 ? 4 : 1) conv_norm_backward_vec_kernel(floatX* __restrict__ dz, int ldz, float* __restrict__ partial,
                                                                              const float* __restrict__ dy, const floatX* __restrict__ out,
                                                                              const float* __restrict__ rstd, const floatX* __restrict__ pre,
                                                                              const floatX* __restrict__ z, const floatX* __restrict__ w,
                                                                              int B, int T, int H, int D, int Dp, int Tp, int norm, float scale,
                                                                              int ntiles, const unsigned char* dlen) {
    if (!DOC) { dlen = nullptr; } // as in the forward (11% of this kernel's time)
    extern __shared__ float conv_smem[];
    int nr = CONV_TR + CS - 1;
    float* dps = conv_smem;                        // (nr, D): dpre[t0 + r], zero at and after T; then the dw sums
    // (D, CS) unused here: the taps live in registers; the layout is conv_smem_backward's
    floatX* zs = (floatX*)(dps + nr * D + D * CS); // (nr + CS - 1, D): z[t0 - CS + 1 + r]
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int t0 = blockIdx.y * CONV_TR, t1 = min(T, t0 + CONV_TR);
    conv_stage(zs, z, nullptr, b, T, Ch, h * D, D, t0 - (CS - 1), pre ? nr : nr + CS - 1, pre ? t1 : T, CS); // as above
    int ng = conv_lanes(D, NV), g = threadIdx.x % ng, run = threadIdx.x / ng, nrun = CONV_THREADS / ng, c0 = NV * g;
    bool act = c0 < D; // a lane with channels
    float wr[NV][CS]; // this thread's taps (the forward's values: floatX weights as fp32)
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int k = 0; k < CS; k++) { wr[u][k] = act ? tof(w[((long)h * D + c0 + u) * CS + k]) : 0.0f; }
    }
    if (!pre) { __syncthreads(); } // phase 1 reads zs
    // phase 1: dpre of the tile and the CS-1 tokens after it (rows at or after T: zero); pre read or made again
    int iters = (nr + nrun - 1) / nrun;
    for (int it = 0; it < iters; it++) {
        int r = run + it * nrun, t = t0 + r;
        bool ok = r < nr && t < T;
        float dyv[NV], ov[NV], pv[NV], dot = 0.0f, rr = 1.0f;
        #pragma unroll
        for (int u = 0; u < NV; u++) { dyv[u] = 0.0f; ov[u] = 0.0f; pv[u] = 0.0f; }
        if (ok && act) {
            long ob = (((long)b * H + h) * Tp + t) * Dp + c0;
            ldvf<NV>(dyv, dy + ob);
            XV<NV> xo = *(const XV<NV>*)(out + ob), xp;
            if (pre) { xp = *(const XV<NV>*)(pre + ((long)b * T + t) * Ch + h * D + c0); }
            else {
                float acc[NV];
                int reach = dlen ? dlen[(long)b * T + t] : CS; // documents: the forward's taps
                #pragma unroll
                for (int u = 0; u < NV; u++) { acc[u] = 0.0f; }
                #pragma unroll
                for (int j = 0; j < CS; j++) { // the forward's sum, in its order
                    if (j > reach) { break; }
                    XV<NV> zr = *(const XV<NV>*)(zs + (r + CS - 1 - j) * D + c0);
                    #pragma unroll
                    for (int u = 0; u < NV; u++) { acc[u] += wr[u][CS - 1 - j] * tof(zr.v[u]); }
                }
                #pragma unroll
                for (int u = 0; u < NV; u++) { xp.v[u] = fromf<floatX>(acc[u]); }
            }
            #pragma unroll
            for (int u = 0; u < NV; u++) {
                ov[u] = norm ? tof(xo.v[u]) : 0.0f;
                pv[u] = tof(xp.v[u]);
                dot += dyv[u] * ov[u];
            }
            if (norm) { rr = rstd[((long)b * T + t) * H + h]; }
        }
        if (norm) { dot = group_sum(dot, ng); }
        if (r >= nr || !act) { continue; }
        float dp[NV], ds = dot / scale; // one division a token, not one an element
        #pragma unroll
        for (int u = 0; u < NV; u++) {
            float dx = norm ? rr * (scale * dyv[u] - ov[u] * ds) : dyv[u];
            float sg = sigmoidf_(pv[u]);
            dp[u] = dx * sg * (1.0f + pv[u] * (1.0f - sg));
        }
        stvf<NV>(dps + r * D + c0, dp);
    }
    __syncthreads();
    // phase 2: dz[s] = Σ_j w[CS-1-j] dpre[s+j] and the tap sums dwr[j] = Σ_s dpre[s] z[s-j], as v2 orders them
    float dwr[NV][CS];
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int k = 0; k < CS; k++) { dwr[u][k] = 0.0f; }
    }
    for (int s = t0 + run; act && s < t1; s += nrun) {
        int r = s - t0;
        float acc[NV], dp[NV];
        ldvf<NV>(dp, dps + r * D + c0);
        #pragma unroll
        for (int u = 0; u < NV; u++) { acc[u] = 0.0f; }
        int reach = dlen ? dlen[(long)b * T + s] : CS;
        #pragma unroll
        for (int j = 0; j < CS; j++) {
            float dn[NV];
            ldvf<NV>(dn, dps + (r + j) * D + c0);
            XV<NV> zr = *(const XV<NV>*)(zs + (r + CS - 1 - j) * D + c0);
            // documents: token s + j reads s through tap j, and token s reads s - j, only inside their documents
            bool in_next = !dlen || (s + j < T && j <= dlen[(long)b * T + s + j]), in_this = j <= reach;
            #pragma unroll
            for (int u = 0; u < NV; u++) {
                if (in_next) { acc[u] += wr[u][CS - 1 - j] * dn[u]; }
                if (in_this) { dwr[u][j] += dp[u] * tof(zr.v[u]); }
            }
        }
        XV<NV> xz;
        #pragma unroll
        for (int u = 0; u < NV; u++) { xz.v[u] = fromf<floatX>(acc[u]); }
        *(XV<NV>*)(dz + ((long)b * T + s) * ldz + h * D + c0) = xz;
    }
    // the tap sums: lanes with the same channels within the warp (offsets ng, 2 ng, ... 16), then the warps in order
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int j = 0; j < CS; j++) {
            for (int o = 16; o >= ng; o >>= 1) { dwr[u][j] += __shfl_xor_sync(0xffffffff, dwr[u][j], o); }
        }
    }
    __syncthreads(); // dps is reused for the warps' sums: (8 warps, D, CS)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = CONV_THREADS / 32;
    if (lane < ng && act) {
        #pragma unroll
        for (int u = 0; u < NV; u++) {
            #pragma unroll
            for (int j = 0; j < CS; j++) { dps[((long)warp * D + c0 + u) * CS + j] = dwr[u][j]; }
        }
    }
    __syncthreads();
    long prow = (long)b * ntiles + blockIdx.y;
    for (int i = threadIdx.x; i < D * CS; i += CONV_THREADS) {
        int cc = i / CS, j = i % CS;
        float sum = 0.0f;
        for (int q = 0; q < nw; q++) { sum += dps[((long)q * D + cc) * CS + j]; }
        partial[prow * Ch * CS + (long)(h * D + cc) * CS + CS - 1 - j] = sum;
    }
}

template <int NV> static bool conv_vec_ok(int H, int D, int cs, std::initializer_list<const void*> ptrs) {
    bool ok = D % NV == 0 && D >= NV && D / NV <= 32 && cs >= 1 && cs <= CONV_CS_MAX && (H * D) % 8 == 0;
    for (const void* p : ptrs) { ok = ok && (!p || aligned16(p)); }
    return ok;
}
// the vec kernels for cs taps (1 .. 4; conv_vec_ok refuses more) with documents or without
template <int NV, bool DOC> static decltype(&conv_norm_forward_vec_kernel<4, NV, DOC>) conv_fwd_vec_kernel(int cs) {
    return cs == 1 ? conv_norm_forward_vec_kernel<1, NV, DOC> : cs == 2 ? conv_norm_forward_vec_kernel<2, NV, DOC>
         : cs == 3 ? conv_norm_forward_vec_kernel<3, NV, DOC> : conv_norm_forward_vec_kernel<4, NV, DOC>;
}
template <int NV, bool DOC> static decltype(&conv_norm_backward_vec_kernel<4, NV, DOC>) conv_bwd_vec_kernel(int cs) {
    return cs == 1 ? conv_norm_backward_vec_kernel<1, NV, DOC> : cs == 2 ? conv_norm_backward_vec_kernel<2, NV, DOC>
         : cs == 3 ? conv_norm_backward_vec_kernel<3, NV, DOC> : conv_norm_backward_vec_kernel<4, NV, DOC>;
}
template <int NV>
static bool conv_norm_forward_vec(floatX* pre, floatX* out, float* rstd, const floatX* z, const floatX* w, const floatX* hist,
                                 int B, int T, int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                                 const unsigned char* dlen = nullptr) {
    if (!conv_vec_ok<NV>(H, D, cs, {pre, out, z, hist})) { return false; }
    dim3 grid(B * H, cdiv(T, CONV_TR));
    size_t sm = conv_smem_forward(D, cs);
    auto kernel = dlen ? conv_fwd_vec_kernel<NV, true>(cs) : conv_fwd_vec_kernel<NV, false>(cs);
    kernel<<<grid, CONV_THREADS, sm, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, Tp, norm, scale, dlen);
    cudaCheck(cudaGetLastError());
    return true;
}
template <int NV>
static bool conv_norm_backward_vec(floatX* dz, int ldz, float* dw, const float* dy, const floatX* out, const float* rstd,
                                  const floatX* pre, const floatX* z, const floatX* w, int B, int T, int H, int D, int Dp, int cs, int Tp,
                                  int norm, float scale, const unsigned char* dlen = nullptr) {
    if (!conv_vec_ok<NV>(H, D, cs, {dz, dy, out, pre, z}) || ldz % 8 != 0) { return false; }
    int ntiles = cdiv(T, CONV_TR), nch = B * ntiles, Ch = H * D;
    float* partial = colsum_partials(nch, Ch * cs);
    dim3 grid(B * H, ntiles);
    size_t sm = conv_smem_backward(D, cs);
    auto kernel = dlen ? conv_bwd_vec_kernel<NV, true>(cs) : conv_bwd_vec_kernel<NV, false>(cs);
    kernel<<<grid, CONV_THREADS, sm, main_stream>>>(dz, ldz, partial, dy, out, rstd, pre, z, w, B, T, H, D, Dp, Tp, norm, scale, ntiles,
                                                    dlen);
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, Ch * cs);
    return true;
}

// dlen (B, T) or null: packed documents, each token's earlier tokens in its document (doc_chunk_rel's conv): the taps
// that would reach before its document's first token are left out, in both directions
static void conv_norm_forward(floatX* pre, floatX* out, float* rstd, const floatX* z, const floatX* w, const floatX* hist,
                              int B, int T, int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                              const unsigned char* dlen = nullptr) {
    if (!conv_norm_forward_vec<4>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen)) {
        conv_norm_forward_tiles(pre, out, rstd, z, w, hist, B, T, H, D, Dp, cs, Tp, norm, scale, dlen);
    }
}
// dz (token-major floatX, row stride ldz: a slice of the packed projection gradients) and dw += from dy (head-major fp32)
static void conv_norm_backward(floatX* dz, int ldz, float* dw, const float* dy, const floatX* out, const float* rstd, const floatX* pre,
                               const floatX* z, const floatX* w, int B, int T, int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                               const unsigned char* dlen = nullptr) {
    if (!conv_norm_backward_vec<4>(dz, ldz, dw, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, dlen)) {
        conv_norm_backward_tiles(dz, ldz, dw, dy, out, rstd, pre, z, w, B, T, H, D, Dp, cs, Tp, norm, scale, dlen);
    }
}

// Gates (MODEL.md §3.4-3.6). pre: (B, T, H*gw) floatX from a projection; out head-major (B, H, Tp, gwp) fp32 (gwp >= gw:
// the mixer's padded width for a channel decay, whose extra columns are not touched).
// kind 0: sigmoid gate, out = bmax * sigmoid(pre). kind 1: log decay, out = -exp(A_log[h]) softplus(pre + dt_bias).
__global__ void gate_forward_kernel(float* out, const floatX* pre, const floatX* a_log, const floatX* dt_bias,
                                    int kind, float bmax, int B, int T, int H, int gw, int gwp, int Tp) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * T * H * gw) { return; }
    int c = (int)(i % (H * gw));
    long bt = i / (H * gw);
    int t = (int)(bt % T), b = (int)(bt / T), h = c / gw;
    float p = tof(pre[i]);
    float v = kind == 0 ? bmax * sigmoidf_(p) : -expf(tof(a_log[h])) * softplusf_(p + tof(dt_bias[c]));
    out[hm_index(b, t, c, H, gw, gwp, Tp)] = v;
}
// The channel decay (kind 1, gw % 4 == 0: N (H gw) elements, 55 M at the 1b KDA's 16 x 2048) by a thread per 4
// consecutive channels of a head: 8-byte floatX loads, a 16-byte store, 32-bit index arithmetic once per 4 (the
// kernel above spends most of its time in 64-bit divisions). The same arithmetic per element.
__global__ void decay_forward_vec_kernel(float* out, const floatX* pre, const floatX* a_log, const floatX* dt_bias,
                                         int N, int T, int H, int gw, int gwp, int Tp) {
    int M4 = H * gw / 4, i = blockIdx.x * blockDim.x + threadIdx.x; // i over (N, M4)
    if (i >= N * M4) { return; }
    int r = i / M4, m = 4 * (i - r * M4), h = m / gw, j = m - h * gw, t = r % T, b = r / T;
    float ea = -expf(tof(a_log[h])), p[4], v[4];
    ldvx<4>(p, pre + (long)r * H * gw + m);
    #pragma unroll
    for (int u = 0; u < 4; u++) { v[u] = ea * softplusf_(p[u] + tof(dt_bias[m + u])); }
    // __stwb: one 16-byte store (a plain float4 assignment compiled to four scalar stores here)
    __stwb((float4*)(out + (((long)b * H + h) * Tp + t) * gwp + j), make_float4(v[0], v[1], v[2], v[3]));
}
static void gate_forward(float* out, const floatX* pre, const floatX* a_log, const floatX* dt_bias, int kind, float bmax,
                         int B, int T, int H, int gw, int gwp, int Tp) {
    long n4 = (long)B * T * H * gw / 4;
    if (kind == 1 && gw % 4 == 0 && gwp % 4 == 0 && n4 <= INT_MAX - 256 && aligned16(out) && aligned16(pre)) {
        decay_forward_vec_kernel<<<cdiv(n4, 256), 256, 0, main_stream>>>(out, pre, a_log, dt_bias, B * T, T, H, gw, gwp, Tp);
    } else {
        gate_forward_kernel<<<cdiv((long)B * T * H * gw, 256), 256, 0, main_stream>>>(out, pre, a_log, dt_bias, kind, bmax, B, T, H,
                                                                                      gw, gwp, Tp);
    }
    cudaCheck(cudaGetLastError());
}

// backward of the sigmoid gate (kind 0), one thread per element: dout (head-major fp32) -> dpre (token-major floatX,
// row stride ld, for the projection)
__global__ void sigmoid_gate_backward_kernel(floatX* __restrict__ dpre, int ld, const float* __restrict__ dout,
                                             const float* __restrict__ out, float bmax, int B, int T, int H, int gw, int gwp, int Tp) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * T * H * gw) { return; }
    int c = (int)(i % (H * gw));
    long bt = i / (H * gw);
    int t = (int)(bt % T), b = (int)(bt / T);
    long ih = hm_index(b, t, c, H, gw, gwp, Tp);
    float sg = out[ih] / bmax;
    dpre[bt * ld + c] = fromf<floatX>(dout[ih] * bmax * sg * (1.0f - sg));
}
// backward of the log decay (kind 1): dpre, and the column sums over tokens of its parameters' gradient terms, dp
// (dt_bias's) and dout * out (A_log's, per channel), in one pass with colsum_partial_kernel's grid and order (32
// columns x 8 row lanes, chunks of COLSUM_ROWS rows): the (N, H gw) fp32 terms are not stored and read back.
// __fadd_rn keeps each term rounded before it is added, as a stored term was. partial: the dt_bias sums (nch, M),
// then the A_log ones (nch, M).
__global__ void decay_backward_kernel(float* __restrict__ partial, floatX* __restrict__ dpre, int ld, const float* __restrict__ dout,
                                      const float* __restrict__ out, const floatX* __restrict__ pre, const floatX* __restrict__ a_log,
                                      const floatX* __restrict__ dt_bias, int N, int T, int H, int gw, int gwp, int Tp) {
    int M = H * gw, m = blockIdx.x * 32 + threadIdx.x, ch = blockIdx.y;
    int r1 = min(N, (ch + 1) * COLSUM_ROWS);
    float sdt = 0.0f, sa = 0.0f;
    if (m < M) {
        int h = m / gw, j = m - h * gw;
        float ea = -expf(tof(a_log[h])), db = tof(dt_bias[m]);
        int r = ch * COLSUM_ROWS + threadIdx.y, t = r % T, b = r / T; // (b, t) of row r, stepped without a division
        #pragma unroll 4
        for (; r < r1; r += 8) {
            long ih = (((long)b * H + h) * Tp + t) * gwp + j;
            float d = dout[ih], o = out[ih];
            float dp = d * ea * sigmoidf_(tof(pre[(long)r * M + m]) + db);
            dpre[(long)r * ld + m] = fromf<floatX>(dp);
            sdt = __fadd_rn(sdt, dp);
            sa = __fadd_rn(sa, d * o);
            if (T >= 8) { t += 8; if (t >= T) { t -= T; b++; } } // at most one wrap: no loop, so the loads unroll
            else { t = (r + 8) % T; b = (r + 8) / T; }
        }
    }
    sdt = colsum_block_reduce(sdt);
    if (threadIdx.y == 0 && m < M) { partial[(long)ch * M + m] = sdt; }
    __syncthreads(); // colsum_block_reduce's shared rows are written again
    sa = colsum_block_reduce(sa);
    if (threadIdx.y == 0 && m < M) { partial[((long)gridDim.y + ch) * M + m] = sa; }
}
// out[h] += Σ_j in[h * gw + j] (A_log from the per-channel column sums of a channel decay)
__global__ void sum_groups_kernel(float* out, const float* in, int H, int gw) {
    int h = threadIdx.x;
    if (h >= H) { return; }
    float s = 0.0f;
    for (int j = 0; j < gw; j++) { s += in[h * gw + j]; }
    out[h] += s;
}
// gradient of a gate (dpre: row stride ld, a slice of the packed projection gradients, or H*gw); for the decay also
// of its parameters: ddt_bias (H*gw) and da_log (H) accumulate (tmp: H*gw floats of scratch)
static void gate_backward(floatX* dpre, int ld, float* ddt_bias, float* da_log, float* tmp, const float* dout, const float* out,
                          const floatX* pre, const floatX* a_log, const floatX* dt_bias, int kind, float bmax,
                          int B, int T, int H, int gw, int gwp, int Tp) {
    int N = B * T, M = H * gw;
    if (kind == 0) {
        sigmoid_gate_backward_kernel<<<cdiv((long)N * M, 256), 256, 0, main_stream>>>(dpre, ld, dout, out, bmax, B, T, H, gw, gwp, Tp);
        cudaCheck(cudaGetLastError());
        return;
    }
    int nch = cdiv(N, COLSUM_ROWS);
    float* partial = colsum_partials(2 * nch, M);
    decay_backward_kernel<<<dim3(cdiv(M, 32), nch), dim3(32, 8), 0, main_stream>>>(partial, dpre, ld, dout, out, pre, a_log,
                                                                                   dt_bias, N, T, H, gw, gwp, Tp);
    cudaCheck(cudaGetLastError());
    colsum_finish(ddt_bias, nch, M);
    if (gw == 1) { colsum_finish(da_log, nch, M, (size_t)nch * M); }
    else {
        cudaCheck(cudaMemsetAsync(tmp, 0, (size_t)M * sizeof(float), main_stream));
        colsum_finish(tmp, nch, M, (size_t)nch * M);
        sum_groups_kernel<<<1, 32 * cdiv(H, 32), 0, main_stream>>>(da_log, tmp, H, gw);
        cudaCheck(cudaGetLastError());
    }
}

// Output norm (RMSNorm over V, weight shared by the heads) and optional sigmoid gate (MODEL.md §3.8).
// o: mixer output head-major floatX; og = on ⊙ sigmoid(gz) (B*T, H*V) floatX, W_o's input. Ungated, og is on itself
// (pass on = og); gated, on is not stored (on = nullptr): the backward makes it again from o and rstd, bit for bit.
// o and dO have head-major rows of Vp >= V columns (the mixer's padded head size); the extra ones are not touched.
// One warp per (b, t, h).
__global__ void onorm_gate_forward_kernel(floatX* on, floatX* og, float* rstd, const floatX* o, const floatX* w,
                                          const floatX* gz, int B, int T, int H, int V, int Vp, int Tp, float eps) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (long)B * T * H) { return; }
    int h = (int)(row % H);
    long bt = row / H;
    int t = (int)(bt % T), b = (int)(bt / T);
    const floatX* x = o + (((long)b * H + h) * Tp + t) * Vp;
    float ss = 0.0f;
    for (int j = lane; j < V; j += 32) { ss += tof(x[j]) * tof(x[j]); }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / V + eps);
    if (lane == 0) { rstd[row] = r; }
    for (int j = lane; j < V; j += 32) {
        floatX n = fromf<floatX>(tof(x[j]) * r * tof(w[j]));
        if (on) { on[row * V + j] = n; }
        if (gz) { og[row * V + j] = fromf<floatX>(tof(n) * sigmoidf_(tof(gz[row * V + j]))); }
    }
}

// backward: dog (fp32, token-major) -> dgz (floatX + fp32 for the bias sum) if gated; dO (head-major floatX, the
// mixer's output gradient). o_norm's gradient Σ_rows dn o rstd: each block (8 warps, a row per warp at a time) sums
// ONORM_ROWS rows into partial[block] (V) in a fixed order; colsum_finish adds the blocks. 256 rows per block: with
// 64, the final sum over 4096 partial rows of only V = 128 columns took 33 us per layer (4 blocks doing all of it).
#define ONORM_ROWS 256
__global__ void onorm_gate_backward_kernel(floatX* __restrict__ dO, floatX* __restrict__ dgz, float* __restrict__ dgz_f, float* __restrict__ partial, const float* __restrict__ dog,
                                           const floatX* __restrict__ o, const floatX* __restrict__ w, const floatX* __restrict__ gz,
                                           const float* __restrict__ rstd, int B, int T, int H, int V, int Vp, int Tp) {
    __shared__ float wsum[8][256 + 1]; // per warp, per column (V <= 256)
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int j = lane; j < V; j += 32) { wsum[warp][j] = 0.0f; }
    long rows = (long)B * T * H, rend = min(rows, (long)(blockIdx.x + 1) * ONORM_ROWS);
    for (long row = (long)blockIdx.x * ONORM_ROWS + warp; row < rend; row += nw) {
        int h = (int)(row % H);
        long bt = row / H;
        int t = (int)(bt % T), b = (int)(bt / T);
        long hb = (((long)b * H + h) * Tp + t) * Vp;
        float r = rstd[row], dot = 0.0f;
        for (int j = lane; j < V; j += 32) {
            float dn = dog[row * V + j];
            if (gz) {
                float s = sigmoidf_(tof(gz[row * V + j]));
                float on_j = tof(fromf<floatX>(tof(o[hb + j]) * r * tof(w[j]))); // the forward's rounded on
                float dz = dn * on_j * s * (1.0f - s);
                dgz[row * V + j] = fromf<floatX>(dz);
                dgz_f[row * V + j] = dz;
                dn *= s;
            }
            dot += dn * tof(w[j]) * tof(o[hb + j]);
        }
        dot = warp_sum(dot);
        float k = r * r * r * dot / V;
        for (int j = lane; j < V; j += 32) {
            float dn = dog[row * V + j];
            if (gz) { dn *= sigmoidf_(tof(gz[row * V + j])); }
            dO[hb + j] = fromf<floatX>(r * dn * tof(w[j]) - k * tof(o[hb + j]));
            wsum[warp][j] += dn * tof(o[hb + j]) * r;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float tsum = 0.0f;
        for (int q = 0; q < nw; q++) { tsum += wsum[q][j]; }
        partial[(long)blockIdx.x * V + j] = tsum;
    }
}

// The same two kernels with the row in registers where V is a multiple of 4 (at most 256): each lane owns NPL =
// ceil(V / 128) groups of 4 consecutive columns (16-byte fp32, 8-byte floatX accesses), group 4 (lane + 32 k) if it is
// below V (at V = 120 lanes 30 and 31 idle), so a row is read once with all of its loads in flight (the loops above
// read o twice, 2 bytes per lane at a time: per element ~2.5x the time of these, H200, 1b KDA's V = 120). The backward's
// per-warp o_norm sums stay in shared memory (each lane owns its columns), then the warps in fixed order.
template <int NPL>
__global__ void onorm_gate_forward_vec_kernel(floatX* on, floatX* og, float* rstd, const floatX* o, const floatX* w,
                                              const floatX* gz, int B, int T, int H, int V, int Vp, int Tp, float eps) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (long)B * T * H) { return; }
    int h = (int)(row % H);
    long bt = row / H;
    int t = (int)(bt % T), b = (int)(bt / T);
    const floatX* x = o + (((long)b * H + h) * Tp + t) * Vp; // (V) of the head-major o
    float xv[NPL][4], ss = 0.0f;
    #pragma unroll
    for (int k = 0; k < NPL; k++) {
        if (4 * (lane + 32 * k) >= V) { continue; }
        ldvx<4>(xv[k], x + 4 * (lane + 32 * k));
        #pragma unroll
        for (int u = 0; u < 4; u++) { ss += xv[k][u] * xv[k][u]; }
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / V + eps);
    if (lane == 0) { rstd[row] = r; }
    #pragma unroll
    for (int k = 0; k < NPL; k++) {
        int c = 4 * (lane + 32 * k);
        if (c >= V) { continue; }
        XV<4> wx = *(const XV<4>*)(w + c), n;
        #pragma unroll
        for (int u = 0; u < 4; u++) { n.v[u] = fromf<floatX>(xv[k][u] * r * tof(wx.v[u])); }
        if (on) { *(XV<4>*)(on + row * V + c) = n; }
        if (gz) {
            XV<4> g = *(const XV<4>*)(gz + row * V + c), y;
            #pragma unroll
            for (int u = 0; u < 4; u++) { y.v[u] = fromf<floatX>(tof(n.v[u]) * sigmoidf_(tof(g.v[u]))); }
            *(XV<4>*)(og + row * V + c) = y;
        }
    }
}
template <int NPL>
__global__ void onorm_gate_backward_vec_kernel(floatX* __restrict__ dO, floatX* __restrict__ dgz, float* __restrict__ dgz_f,
                                               float* __restrict__ partial, const float* __restrict__ dog,
                                               const floatX* __restrict__ o, const floatX* __restrict__ w, const floatX* __restrict__ gz,
                                               const float* __restrict__ rstd, int B, int T, int H, int V, int Vp, int Tp) {
    __shared__ float wsum[8][NPL * 128]; // (warp, V) the warps' o_norm gradient sums
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    XV<4> wx[NPL];
    #pragma unroll
    for (int k = 0; k < NPL; k++) { // a group at or past V is never read or stored (its sums stay zero)
        if (4 * (lane + 32 * k) < V) { wx[k] = *(const XV<4>*)(w + 4 * (lane + 32 * k)); }
        *(float4*)&wsum[warp][4 * (lane + 32 * k)] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    long rows = (long)B * T * H, rend = min(rows, (long)(blockIdx.x + 1) * ONORM_ROWS);
    for (long row = (long)blockIdx.x * ONORM_ROWS + warp; row < rend; row += nw) {
        int h = (int)(row % H);
        long bt = row / H;
        int t = (int)(bt % T), b = (int)(bt / T);
        long hb = (((long)b * H + h) * Tp + t) * Vp;
        float r = rstd[row], dot = 0.0f, dn[NPL][4], ov[NPL][4];
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            int c = 4 * (lane + 32 * k);
            if (c >= V) { continue; }
            ldvf<4>(dn[k], dog + row * V + c);
            ldvx<4>(ov[k], o + hb + c);
        }
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            int c = 4 * (lane + 32 * k);
            if (c >= V) { continue; }
            if (gz) {
                XV<4> g = *(const XV<4>*)(gz + row * V + c), dzx;
                float dz[4];
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    float s = sigmoidf_(tof(g.v[u]));
                    float nn = tof(fromf<floatX>(ov[k][u] * r * tof(wx[k].v[u]))); // the forward's rounded on
                    dz[u] = dn[k][u] * nn * s * (1.0f - s);
                    dzx.v[u] = fromf<floatX>(dz[u]);
                    dn[k][u] *= s;
                }
                *(XV<4>*)(dgz + row * V + c) = dzx;
                stvf<4>(dgz_f + row * V + c, dz);
            }
            #pragma unroll
            for (int u = 0; u < 4; u++) { dot += dn[k][u] * tof(wx[k].v[u]) * ov[k][u]; }
        }
        dot = warp_sum(dot);
        float kk = r * r * r * dot / V;
        #pragma unroll
        for (int k = 0; k < NPL; k++) {
            int c = 4 * (lane + 32 * k);
            if (c >= V) { continue; }
            XV<4> d;
            float4 s = *(float4*)&wsum[warp][c];
            float sv[4] = {s.x, s.y, s.z, s.w};
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                d.v[u] = fromf<floatX>(r * dn[k][u] * tof(wx[k].v[u]) - kk * ov[k][u]);
                sv[u] += dn[k][u] * ov[k][u] * r;
            }
            stvf<4>(&wsum[warp][c], sv);
            *(XV<4>*)(dO + hb + c) = d;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float tsum = 0.0f;
        for (int q = 0; q < nw; q++) { tsum += wsum[q][j]; }
        partial[(long)blockIdx.x * V + j] = tsum;
    }
}
// launchers: the vector kernels where V allows (the arena aligns every buffer; V % 4 and Vp % 4 keep each row's groups
// aligned: 16 bytes of fp32, 8 of bf16)
static bool onorm_vec(int V, int Vp) { return V % 4 == 0 && Vp % 4 == 0 && V <= 256; }
static void onorm_gate_forward(floatX* on, floatX* og, float* rstd, const floatX* o, const floatX* w, const floatX* gz,
                               int B, int T, int H, int V, int Vp, int Tp, float eps) {
    long rows = (long)B * T * H;
    bool vec = onorm_vec(V, Vp) && aligned16(on) && aligned16(og) && aligned16(o) && aligned16(w) && (!gz || aligned16(gz));
    if (vec && V <= 128) { onorm_gate_forward_vec_kernel<1><<<cdiv(rows, 8), 256, 0, main_stream>>>(on, og, rstd, o, w, gz, B, T, H, V, Vp, Tp, eps); }
    else if (vec) { onorm_gate_forward_vec_kernel<2><<<cdiv(rows, 8), 256, 0, main_stream>>>(on, og, rstd, o, w, gz, B, T, H, V, Vp, Tp, eps); }
    else { onorm_gate_forward_kernel<<<cdiv(rows, 8), 256, 0, main_stream>>>(on, og, rstd, o, w, gz, B, T, H, V, Vp, Tp, eps); }
    cudaCheck(cudaGetLastError());
}
// dO, dgz (+ dgz_f), and dw += the o_norm weight's gradient
static void onorm_gate_backward(floatX* dO, floatX* dgz, float* dgz_f, float* dw, const float* dog, const floatX* o,
                                const floatX* w, const floatX* gz, const float* rstd, int B, int T, int H,
                                int V, int Vp, int Tp) {
    int nblk = cdiv((long)B * T * H, ONORM_ROWS);
    float* partial = colsum_partials(nblk, V);
    bool vec = onorm_vec(V, Vp) && aligned16(dO) && aligned16(dog) && aligned16(o) && aligned16(w) &&
               (!gz || (aligned16(gz) && aligned16(dgz) && aligned16(dgz_f)));
    if (vec && V <= 128) {
        onorm_gate_backward_vec_kernel<1><<<nblk, 256, 0, main_stream>>>(dO, dgz, dgz_f, partial, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp);
    } else if (vec) {
        onorm_gate_backward_vec_kernel<2><<<nblk, 256, 0, main_stream>>>(dO, dgz, dgz_f, partial, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp);
    } else {
        onorm_gate_backward_kernel<<<nblk, 256, 0, main_stream>>>(dO, dgz, dgz_f, partial, dog, o, w, gz, rstd, B, T, H, V, Vp, Tp);
    }
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nblk, V);
}

// SwiGLU (MODEL.md §2): out = silu(gate) * up. A thread per XVEC elements (16-byte accesses; the arena aligns every
// buffer, the launchers check it), the last thread takes a partial vector one element at a time.
__global__ void swiglu_forward_kernel(floatX* out, const floatX* gate, const floatX* up, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * XVEC;
    if (i >= n) { return; }
    if (i + XVEC > n) {
        for (; i < n; i++) { float gv = tof(gate[i]); out[i] = fromf<floatX>(gv * sigmoidf_(gv) * tof(up[i])); }
        return;
    }
    XPack g = *(const XPack*)(gate + i), u = *(const XPack*)(up + i), o;
    #pragma unroll
    for (int k = 0; k < XVEC; k++) {
        float gv = tof(g.v[k]);
        o.v[k] = fromf<floatX>(gv * sigmoidf_(gv) * tof(u.v[k]));
    }
    *(XPack*)(out + i) = o;
}
// out (optional): the forward's output again, bit for bit, from the same reads (W_down's weight gradient needs it)
__global__ void swiglu_backward_kernel(floatX* dgate, floatX* dup, floatX* out, const floatX* dout, const floatX* gate,
                                       const floatX* up, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * XVEC;
    if (i >= n) { return; }
    if (i + XVEC > n) {
        for (; i < n; i++) {
            float gv = tof(gate[i]), uv = tof(up[i]), s = sigmoidf_(gv), dv = tof(dout[i]);
            dgate[i] = fromf<floatX>(dv * uv * s * (1.0f + gv * (1.0f - s)));
            dup[i] = fromf<floatX>(dv * gv * s);
            if (out) { out[i] = fromf<floatX>(gv * sigmoidf_(gv) * uv); }
        }
        return;
    }
    XPack g = *(const XPack*)(gate + i), u = *(const XPack*)(up + i), d = *(const XPack*)(dout + i), dg, du, o;
    #pragma unroll
    for (int k = 0; k < XVEC; k++) {
        float gv = tof(g.v[k]), uv = tof(u.v[k]), s = sigmoidf_(gv), dv = tof(d.v[k]);
        dg.v[k] = fromf<floatX>(dv * uv * s * (1.0f + gv * (1.0f - s)));
        du.v[k] = fromf<floatX>(dv * gv * s);
        o.v[k] = fromf<floatX>(gv * sigmoidf_(gv) * uv); // the forward's expression (s is the same value)
    }
    *(XPack*)(dgate + i) = dg;
    *(XPack*)(dup + i) = du;
    if (out) { *(XPack*)(out + i) = o; }
}
static void swiglu_forward(floatX* out, const floatX* gate, const floatX* up, long n) {
    if (!aligned16(out) || !aligned16(gate) || !aligned16(up)) { fail(EXIT_SYSTEM, "swiglu: unaligned buffers"); }
    swiglu_forward_kernel<<<cdiv(cdiv(n, XVEC), 256), 256, 0, main_stream>>>(out, gate, up, n);
    cudaCheck(cudaGetLastError());
}
static void swiglu_backward(floatX* dgate, floatX* dup, floatX* out, const floatX* dout, const floatX* gate, const floatX* up,
                            long n) {
    if (!aligned16(dgate) || !aligned16(dup) || !aligned16(out) || !aligned16(dout) || !aligned16(gate) || !aligned16(up)) {
        fail(EXIT_SYSTEM, "swiglu: unaligned buffers");
    }
    swiglu_backward_kernel<<<cdiv(cdiv(n, XVEC), 256), 256, 0, main_stream>>>(dgate, dup, out, dout, gate, up, n);
    cudaCheck(cudaGetLastError());
}

// Fused classifier: per row, softmax cross-entropy without materialising probabilities. losses[n] (0 without a
// target); with dscale != 0 the logits row is overwritten by dlogits = (softmax - onehot) * dscale (rows without
// a target get zeros); argmax (optional) gets the row's argmax for accuracy.
template <bool VEC>
__global__ void classifier_kernel(floatX* logits, float* losses, int* argmax, const int* targets, int Vv, float dscale) {
    long row = blockIdx.x;
    floatX* x = logits + row * Vv;
    int t = targets[row];
    const int W = VEC ? XVEC : 1;
    // one pass for the max, its first index and the sum of exponentials (online: the sum is rescaled when the max
    // grows), 16-byte loads when the row allows
    float mx = -INFINITY, s = 0.0f;
    int best = 0;
    for (int i0 = threadIdx.x * W; i0 < Vv; i0 += blockDim.x * W) {
        XPack p;
        if (VEC) { p = *(const XPack*)(x + i0); } else { p.v[0] = x[i0]; }
        #pragma unroll
        for (int k = 0; k < W; k++) {
            float v = tof(p.v[k]);
            if (v > mx) { s = s * expf(mx - v) + 1.0f; mx = v; best = i0 + k; }
            else { s += expf(v - mx); }
        }
    }
    float gmax = block_max(mx);
    if (argmax) {
        // smallest index holding the max: ties resolved like the CPU's first-max scan
        __shared__ int sbest;
        if (threadIdx.x == 0) { sbest = Vv; }
        __syncthreads();
        if (mx == gmax) { atomicMin(&sbest, best); }
        __syncthreads();
        if (threadIdx.x == 0) { argmax[row] = sbest; }
    }
    float sum = block_sum(mx == -INFINITY ? 0.0f : s * expf(mx - gmax));
    if (threadIdx.x == 0) { losses[row] = t >= 0 ? logf(sum) - (tof(x[t]) - gmax) : 0.0f; }
    if (dscale != 0.0f) {
        __syncthreads(); // everyone has read x[t] before it is overwritten
        for (int i0 = threadIdx.x * W; i0 < Vv; i0 += blockDim.x * W) {
            XPack p;
            if (VEC) { p = *(const XPack*)(x + i0); } else { p.v[0] = x[i0]; }
            #pragma unroll
            for (int k = 0; k < W; k++) {
                float pr = t >= 0 ? expf(tof(p.v[k]) - gmax) / sum : 0.0f;
                p.v[k] = fromf<floatX>(t >= 0 ? (pr - (i0 + k == t ? 1.0f : 0.0f)) * dscale : 0.0f);
            }
            if (VEC) { *(XPack*)(x + i0) = p; } else { x[i0] = p.v[0]; }
        }
    }
}
static void classifier_launch(floatX* logits, float* losses, int* argmax, const int* targets, long rows, int Vv, float dscale) {
    if (Vv % XVEC == 0 && aligned16(logits)) {
        classifier_kernel<true><<<rows, 256, 0, main_stream>>>(logits, losses, argmax, targets, Vv, dscale);
    } else {
        classifier_kernel<false><<<rows, 256, 0, main_stream>>>(logits, losses, argmax, targets, Vv, dscale);
    }
    cudaCheck(cudaGetLastError());
}

// AdamW, one element: moments and master weight updated in place, the new master weight returned (one GPU and
// ZeRO-1 share it); *nonfinite is set when one of the three is no longer finite (a g*g that overflows, say)
__device__ __forceinline__ float adamw_element(float* master, float* m, float* v, float g, float lr, float beta1, float beta2,
                                               float bc1, float bc2, float eps, float wd, int* nonfinite) {
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    float p = *master;
    p -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p);
    *master = p;
    if (!(isfinite(p) && isfinite(mi) && isfinite(vi))) { *nonfinite = 1; }
    return p;
}

// AdamW on one tensor (MODEL.md §6 weight decay), gradient scaled by grad_scale (clipping). master fp32 is updated;
// the floatX parameter is its stochastically rounded copy (seed per tensor and step).
__global__ void adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, long n, float lr,
                             float beta1, float beta2, float bc1, float bc2, float eps, float wd, float grad_scale,
                             unsigned int seed, int* nonfinite) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float p = adamw_element(master + i, m + i, v + i, grads[i] * grad_scale, lr, beta1, beta2, bc1, bc2, eps, wd, nonfinite);
    params[i] = round_sr(p, (unsigned int)i, seed);
}

// fp32 master -> floatX params with the same rounding as adamw_kernel (resume and init use it)
__global__ void round_params_kernel(floatX* params, const float* master, long n, unsigned int seed) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { params[i] = round_sr(master[i], (unsigned int)i, seed); }
}

// ZeRO-1 (several GPUs; dist.h's plan). The last entry of a table sorted by KEY whose KEY is <= x, in [lo, hi)
// (lo if none): the tables are short (a range per tensor and layer, a segment per piece of one).
template <typename E, size_t E::*KEY> __device__ __forceinline__ int table_find(const E* t, int lo, int hi, size_t x) {
    hi--;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (t[mid].*KEY <= x) { lo = mid; } else { hi = mid - 1; }
    }
    return lo;
}

// packed[p0 .. p1) <-> the flat buffer, through the plan's ranges r0 .. r1 (to_packed: gather the flat buffer into
// the packed one; else scatter back). Padding between buckets is not touched.
template <typename T>
__global__ void zero_copy_kernel(T* packed, T* flat, const ZeroRange* ranges, int r0, int r1, size_t p0, size_t p1, int to_packed) {
    for (size_t p = p0 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < p1; p += (size_t)gridDim.x * blockDim.x) {
        ZeroRange r = ranges[table_find<ZeroRange, &ZeroRange::packed>(ranges, r0, r1, p)];
        if (p < r.packed || p >= r.packed + r.n) { continue; }
        size_t f = r.flat + (p - r.packed);
        if (to_packed) { packed[p] = flat[f]; } else { flat[f] = packed[p]; }
    }
}

// buckets b0 .. b1-1 of the plan, on `st`
template <typename T>
static void zero_copy(T* packed, T* flat, const ZeroPlan* zp, const ZeroRange* d_ranges, int b0, int b1, int to_packed,
                      cudaStream_t st) {
    size_t p0 = zp->bucket_off[b0], p1 = zp->bucket_off[b1];
    unsigned blocks = (unsigned)std::min<size_t>((p1 - p0 + 255) / 256, 16384);
    zero_copy_kernel<T><<<blocks, 256, 0, st>>>(packed, flat, d_ranges, zp->bucket_first[b0], zp->bucket_first[b1], p0, p1, to_packed);
    cudaCheck(cudaGetLastError());
}

// what the sharded AdamW needs to know of every tensor: its rounding seed this step, its weight decay, its offset
struct ZeroTensorInfo { unsigned int seed[NUM_TENSORS]; float wd[NUM_TENSORS]; unsigned long long offset[NUM_TENSORS]; };

// AdamW on this rank's shard: the same per-element update and the same rounding (seed per tensor and step, position
// inside the tensor) as adamw_kernel on one GPU; the new floatX parameter goes to its place in the packed buffer,
// ready for the all-gather. Shard padding belongs to no segment and is skipped.
__global__ void adamw_shard_kernel(floatX* packed_params, float* master, const float* grads, float* m, float* v,
                                   const ZeroSeg* segs, int nseg, size_t n, float lr, float beta1, float beta2, float bc1,
                                   float bc2, float eps, float grad_scale, ZeroTensorInfo ti, int* nonfinite) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) { return; }
    ZeroSeg s = segs[table_find<ZeroSeg, &ZeroSeg::shard>(segs, 0, nseg, j)];
    if (j < s.shard || j >= s.shard + s.n) { return; }
    int t = s.tensor;
    float p = adamw_element(master + j, m + j, v + j, grads[j] * grad_scale, lr, beta1, beta2, bc1, bc2, eps, ti.wd[t], nonfinite);
    size_t idx = s.flat + (j - s.shard) - (size_t)ti.offset[t];
    packed_params[s.packed + (j - s.shard)] = round_sr(p, (unsigned int)idx, ti.seed[t]);
}

// sum of squares, deterministic: fixed grid of partial sums, then one block sums them in order
#define NORM_BLOCKS 512
__global__ void sumsq_partial_kernel(float* partial, const float* g, long n) {
    float s = 0.0f;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) { s += g[i] * g[i]; }
    s = block_sum(s);
    if (threadIdx.x == 0) { partial[blockIdx.x] = s; }
}
__global__ void sumsq_final_kernel(float* out, const float* partial, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { s += partial[i]; }
    s = block_sum(s);
    if (threadIdx.x == 0) { *out = s; }
}

// sum of g[0 .. n)^2 on main_stream, to the host; scratch: NORM_BLOCKS + 1 floats
static float sum_squares(const float* g, long n, float* scratch) {
    sumsq_partial_kernel<<<NORM_BLOCKS, 256, 0, main_stream>>>(scratch, g, n);
    sumsq_final_kernel<<<1, 256, 0, main_stream>>>(scratch + NORM_BLOCKS, scratch, NORM_BLOCKS);
    cudaCheck(cudaGetLastError());
    float s;
    cudaCheck(cudaMemcpy(&s, scratch + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost));
    return s;
}

// AdamW's bias corrections for the 1-based step being completed
static void adam_bias_corrections(const TrainConfig* tc, long step, float* bc1, float* bc2) {
    *bc1 = (float)(1.0 - pow(tc->beta1, (double)step));
    *bc2 = (float)(1.0 - pow(tc->beta2, (double)step));
}

// ----------------------------------------------------------------------------------------------------
// 3. the mixer. Head-major padded layout: chunk q = (b*H + h)*NC + c owns rows q*C .. q*C+C-1 of every (rows, X)
// tensor, so its (C, X) matrix starts at X + q*C*X_width; per-chunk (C, C) matrices start at q*C*C and the
// states (K, V) at q*K*V.

// 3a. diagonal preconditioner (MODEL.md §3.6). The statistic is a linear recurrence per key channel,
// a_t = d_t a_{t-1} + u_t with d_t = exp(gP_t), u_t = betaP_t k̂_t², computed chunk-parallel in three passes:
// (1) every chunk scans from zero (all chunks at once) and keeps only its end value, (2) one short sequential pass
// carries the chunk-start values across the NC chunk boundaries (`carry`, (nq, K): the layer keeps it), (3) every
// chunk runs its recurrence again from its carried start value and forms the write key k̃ = exp(-ln(x) s(r)) k̂. The
// backward is the reverse recurrence in the same three passes. No per-token scratch: pass 3 recomputes instead of
// reading a stored local scan (the version that stored it is v2 of dev/cuda/precond_scan.cu). The backward reads the
// statistic a (rows, K) fp32, which only the pass 3 that precedes a backward writes: the backward's remake of k̃
// (pass 3 alone, from the kept carries) or the forward of a layer whose backward makes nothing again (the last, or
// under --recompute). So the forward moves 6 bytes an element, the remake 8, the backward 28 (dev/cuda/precond_scan.cu
// v10 against v6, which ran all three passes with the statistic in the forward and again in the remake; v7-v9, which
// never store it and make it again in the backward's passes, were slower there). Pass 2 is a block per head, a
// thread per channel. Rows are head-major padded (B, H, Tp); padded rows have k̂ = 0, gP = 0: they change nothing.

// The forward's pass 1 and the backward's pass 3 take a warp per chunk: lane l owns the channels j = l + 32 c (c < CPT,
// K <= 32 CPT), so every row is one coalesced warp access, the per-row decay exp(gP) is computed once per CPT channels
// and the backward's per-token sums over the channels are one warp sum. The forward's pass 3 and the backward's pass 1
// keep a thread per channel (more warps in flight; faster there). Each pass is the faster of the two layouts in
// dev/cuda/precond_scan.cu (v4 vs v5). log, exp and the divisions use the fast hardware approximations (relative error
// ~1e-6 here: exp's arguments are in [-0.41, 0.41] or are log-decays, r's error is absolute ~1e-7): the accurate
// library calls made these passes bound by instructions (v3 vs v5).
#define PC_WARPS 4 // chunks per block in the warp-per-chunk passes
// 8 blocks of 4 warps per SM (<= 64 registers) put the 340m shape's 4096 chunks in one wave on 132 SMs
#define PC_MIN_BLOCKS(CPT) ((CPT) <= 4 ? 8 : 4)

// the statistic's step (every pass that runs it forward: one expression)
__device__ __forceinline__ float precond_step(float a, float d, float b, float kj) { return d * a + b * kj * kj; }
// the write key's multiplier m = exp(-ln(x) s(r)), s = r / (1 + |r|), r = log(a + eps) - c; *inv = 1 / (1 + |r|)
__device__ __forceinline__ float precond_key_scale(float a, float c, float lnx, float eps, float* inv) {
    float r = __logf(a + eps) - c;
    *inv = __fdividef(1.0f, 1.0f + fabsf(r));
    return __expf(-lnx * r * *inv);
}
// forward pass 1: cend (nq, K) = the chunk's scan from zero at its last row, cdec (nq) = exp(Σ gP over the chunk)
template <int CPT>
__global__ void __launch_bounds__(32 * PC_WARPS, PC_MIN_BLOCKS(CPT))
precond_end_kernel(float* __restrict__ cend, float* __restrict__ cdec, const floatX* __restrict__ k,
                                   const float* __restrict__ gp, const float* __restrict__ bp, long nq, int C, int K) {
    long q = (long)blockIdx.x * PC_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (q >= nq) { return; }
    float a[CPT], G = 0.0f;
    #pragma unroll
    for (int c = 0; c < CPT; c++) { a[c] = 0.0f; }
    #pragma unroll 4
    for (int i = 0; i < C; i++) {
        long row = q * C + i;
        float g = gp[row], d = __expf(g), b = bp[row];
        G += g;
        #pragma unroll
        for (int c = 0; c < CPT; c++) {
            int j = lane + 32 * c;
            float kj = j < K ? tof(k[row * K + j]) : 0.0f;
            a[c] = precond_step(a[c], d, b, kj);
        }
    }
    #pragma unroll
    for (int c = 0; c < CPT; c++) { if (lane + 32 * c < K) { cend[q * K + lane + 32 * c] = a[c]; } }
    if (lane == 0) { cdec[q] = __expf(G); }
}
// forward pass 2: carry[q] = a at the start of chunk q (from a0 or 0); a_final optional (may equal a0). The loads do
// not depend on the chain (restrict, unrolled), so only the multiply-adds are sequential: with one block per head and
// hundreds of chunks (long sequences, small batches) the loop was a chain of dependent global loads (~100 us at
// B = 1, T = 16384)
__global__ void precond_carry_kernel(float* __restrict__ carry, const float* __restrict__ cend,
                                     const float* __restrict__ cdec, const float* a0, float* a_final, int NC, int K) {
    int bh = blockIdx.x, j = threadIdx.x;
    if (j >= K) { return; }
    float a = a0 ? a0[(long)bh * K + j] : 0.0f;
    #pragma unroll 16
    for (int c = 0; c < NC; c++) {
        long q = (long)bh * NC + c;
        carry[q * K + j] = a;
        a = cdec[q] * a + cend[q * K + j];
    }
    if (a_final) { a_final[(long)bh * K + j] = a; }
}
// forward pass 3: from the chunk-start value carry, the recurrence again: k̃ (hm floatX) and, unless null, astat (hm
// fp32). A thread per channel and a block per chunk here: this pass is bound by latency, and a warp per chunk (4x
// fewer warps in flight) took twice as long (dev/cuda/precond_scan.cu v4)
__global__ void precond_fix_kernel(floatX* __restrict__ kt, float* __restrict__ astat, const float* __restrict__ carry,
                                   const floatX* __restrict__ k, const float* __restrict__ gp, const float* __restrict__ bp,
                                   const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx,
                                   float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    if (j >= K) { return; }
    float a = carry[q * K + j], cs = tof(log_atk_scale[(q / NC) % H]);
    #pragma unroll 4
    for (int i = 0; i < C; i++) {
        long row = r0 + i;
        float kj = tof(k[row * K + j]), inv;
        a = precond_step(a, __expf(gp[row]), bp[row], kj);
        if (astat) { astat[row * K + j] = a; }
        kt[row * K + j] = fromf<floatX>(precond_key_scale(a, cs, lnx, eps, &inv) * kj);
    }
}
// the backward's local terms at one (token, channel) from g = dL/dk̃: returns u = dr / (a + eps), the reverse scan's
// input; *dr = dL/dr (dlog_atk_scale gets -Σ dr), *m = the multiplier (dk̂ gets g m on the direct path)
__device__ __forceinline__ float precond_key_grad(float a, float kj, float g, float c, float lnx, float eps, float* m,
                                                  float* dr) {
    float inv;
    *m = precond_key_scale(a, c, lnx, eps, &inv);
    *dr = g * kj * -lnx * *m * inv * inv;
    return __fdividef(*dr, a + eps);
}
// backward pass 1 (reverse, from zero at the chunk end; a thread per channel, as pass 3 of the forward):
// cfirst (nq, K) = the local abar at the chunk's first row; dcp (nq) = this chunk's part of dlog_atk_scale = -Σ dr
// (block sum, fixed order); cdl (nq) = exp(Σ gP over the chunk's rows after the first): the decay from its first row
// to its end
__global__ void precond_first_bwd_kernel(float* __restrict__ cfirst, float* __restrict__ dcp, float* __restrict__ cdl,
                                         const float* __restrict__ dkt, const floatX* __restrict__ k,
                                         const float* __restrict__ gp, const float* __restrict__ astat,
                                         const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx,
                                         float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    float acc = 0.0f, dcs = 0.0f, G1 = 0.0f, dn = 0.0f, cs = tof(log_atk_scale[(q / NC) % H]); // dn: the next row's decay
    #pragma unroll 4
    for (int i = C - 1; i >= 0; i--) {
        long row = r0 + i;
        if (j < K) {
            float m, dr, u = precond_key_grad(astat[row * K + j], tof(k[row * K + j]), dkt[row * K + j], cs, lnx, eps, &m, &dr);
            dcs -= dr;
            acc = u + dn * acc;
        }
        float g = gp[row];
        if (i > 0) { G1 += g; }
        dn = __expf(g);
    }
    if (j < K) { cfirst[q * K + j] = acc; }
    float tot = block_sum(j < K ? dcs : 0.0f);
    if (threadIdx.x == 0) { dcp[q] = tot; cdl[q] = __expf(G1); }
}
// backward pass 2: incoming[q] = d_{first row of q+1} abar_{first row of q+1}, walking the chunks in reverse (the
// loads off the chain, as in the forward's pass 2)
__global__ void precond_carry_bwd_kernel(float* __restrict__ incoming, const float* __restrict__ cfirst,
                                         const float* __restrict__ cdl, const float* __restrict__ gp, int NC, int C, int K) {
    int bh = blockIdx.x, j = threadIdx.x;
    if (j >= K) { return; }
    float in = 0.0f;
    #pragma unroll 16
    for (int c = NC - 1; c >= 0; c--) {
        long q = (long)bh * NC + c;
        incoming[q * K + j] = in;
        in = expf(gp[q * C]) * (cfirst[q * K + j] + cdl[q] * in);
    }
}
// backward pass 3 (reverse, from incoming): abar_t = dr_t / (a_t + eps) + d_{t+1} abar_{t+1};
// dk += g m + 2 betaP k abar; per token dgP = d_t Σ_j abar a_{t-1}, dbetaP = Σ_j abar k² (warp sums)
template <int CPT>
__global__ void __launch_bounds__(32 * PC_WARPS, PC_MIN_BLOCKS(CPT))
precond_fix_bwd_kernel(float* __restrict__ dk, float* __restrict__ dgp, float* __restrict__ dbp,
                                       const float* __restrict__ incoming, const float* __restrict__ dkt,
                                       const floatX* __restrict__ k, const float* __restrict__ gp,
                                       const float* __restrict__ bp, const float* __restrict__ astat,
                                       const floatX* __restrict__ log_atk_scale, long nq, int H, int NC, int C, int K,
                                       float lnx, float eps) {
    long q = (long)blockIdx.x * PC_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (q >= nq) { return; }
    long r0 = q * C;
    bool seq_start = q % NC == 0; // a_{t-1} = 0 before the sequence's first row
    float nxt[CPT], a[CPT], cs = tof(log_atk_scale[(q / NC) % H]); // nxt = d_{t+1} abar_{t+1}; a = a_t walking back
    #pragma unroll
    for (int c = 0; c < CPT; c++) {
        int j = lane + 32 * c;
        nxt[c] = j < K ? incoming[q * K + j] : 0.0f;
        a[c] = j < K ? astat[(r0 + C - 1) * K + j] : 0.0f;
    }
    #pragma unroll 2
    for (int i = C - 1; i >= 0; i--) {
        long row = r0 + i;
        float d = __expf(gp[row]), b2 = 2.0f * bp[row], sg = 0.0f, sb = 0.0f;
        #pragma unroll
        for (int c = 0; c < CPT; c++) {
            int j = lane + 32 * c;
            if (j < K) {
                float kj = tof(k[row * K + j]), g = dkt[row * K + j];
                float aprev = (i > 0 || !seq_start) ? astat[(row - 1) * K + j] : 0.0f;
                float m, dr, ab = precond_key_grad(a[c], kj, g, cs, lnx, eps, &m, &dr) + nxt[c];
                sg += ab * aprev;
                sb += ab * kj * kj;
                dk[row * K + j] += g * m + b2 * kj * ab;
                nxt[c] = d * ab;
                a[c] = aprev;
            }
        }
        sg = warp_sum(sg);
        sb = warp_sum(sb);
        if (lane == 0) { dgp[row] = d * sg; dbp[row] = sb; }
    }
}
// dlog_atk_scale[h] += Σ over (b, chunk) of dcp: a block per head, a fixed order (strided per thread, then block_sum)
__global__ void precond_dc_kernel(float* dlas, const float* dcp, int B, int H, int NC) {
    int h = blockIdx.x;
    float s = 0.0f;
    for (int i = threadIdx.x; i < B * NC; i += blockDim.x) { s += dcp[((long)(i / NC) * H + h) * NC + i % NC]; }
    s = block_sum(s);
    if (threadIdx.x == 0) { dlas[h] += s; }
}

// the buffers of the three-pass scan: the layer keeps carry (nq, K), the chunk-start statistic; astat (rows, K) is
// one buffer for all layers (the layer being differentiated); ca, cb (nq, K) and cc, cd (nq) are scratch (forward:
// chunk ends, chunk decays; backward: first-row values, incoming, dlog_atk_scale parts, decays)
struct PrecondBufs { float *ca, *cb, *cc, *cd, *astat, *carry; };

// a warp-per-chunk pass for CPT = K / 32 rounded up to 1, 2, 4 or 8 (K <= 256: checked at startup)
#define PRECOND_PASS(kernel, nq, K, ...)                                                                              \
    do {                                                                                                            \
        int blocks_ = cdiv((nq), PC_WARPS), threads_ = 32 * PC_WARPS;                                               \
        if ((K) <= 32) { kernel<1><<<blocks_, threads_, 0, main_stream>>>(__VA_ARGS__); }                           \
        else if ((K) <= 64) { kernel<2><<<blocks_, threads_, 0, main_stream>>>(__VA_ARGS__); }                      \
        else if ((K) <= 128) { kernel<4><<<blocks_, threads_, 0, main_stream>>>(__VA_ARGS__); }                     \
        else { kernel<8><<<blocks_, threads_, 0, main_stream>>>(__VA_ARGS__); }                                     \
    } while (0)

// pass 3 from the kept pb.carry: k̃ (hm floatX), and the statistic where pb.astat is not null. The forward's last pass,
// and the backward's remake of k̃ and the statistic (bit for bit the forward's: the same kernel on the same carry).
static void precond_diag_remake(floatX* kt, const PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x, float eps) {
    precond_fix_kernel<<<(long)B * H * NC, K, 0, main_stream>>>(kt, pb.astat, pb.carry, k, gp, bp, log_atk_scale, H, NC, C,
                                                                K, logf(x), eps);
    cudaCheck(cudaGetLastError());
}
// k̃ (hm floatX) and pb.carry from k̂, gP, betaP (rows), and the statistic where pb.astat is not null; a0 / a_final
// (B, H, K) optional (generation)
static void precond_diag_forward(floatX* kt, const PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                 const floatX* log_atk_scale, const float* a0, float* a_final, int B, int H, int NC, int C,
                                 int K, float x, float eps) {
    long nq = (long)B * H * NC;
    PRECOND_PASS(precond_end_kernel, nq, K, pb.ca, pb.cc, k, gp, bp, nq, C, K);
    precond_carry_kernel<<<B * H, K, 0, main_stream>>>(pb.carry, pb.ca, pb.cc, a0, a_final, NC, K);
    precond_diag_remake(kt, pb, k, gp, bp, log_atk_scale, B, H, NC, C, K, x, eps);
}

// from dk̃ (hm fp32): dk += (both paths), dgp, dbp (rows) written, dlog_atk_scale (H) +=
static void precond_diag_backward(float* dk, float* dgp, float* dbp, float* dlas, const PrecondBufs& pb, const float* dkt,
                                  const floatX* k, const float* gp, const float* bp, const floatX* log_atk_scale, int B,
                                  int H, int NC, int C, int K, float x, float eps) {
    long nq = (long)B * H * NC;
    int kthreads = (K + 31) / 32 * 32; // block_sum: whole warps
    precond_first_bwd_kernel<<<nq, kthreads, 0, main_stream>>>(pb.ca, pb.cc, pb.cd, dkt, k, gp, pb.astat, log_atk_scale, H, NC,
                                                               C, K, logf(x), eps);
    precond_carry_bwd_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cd, gp, NC, C, K);
    PRECOND_PASS(precond_fix_bwd_kernel, nq, K, dk, dgp, dbp, pb.cb, dkt, k, gp, bp, pb.astat, log_atk_scale, nq, H, NC, C,
                 K, logf(x), eps);
    precond_dc_kernel<<<H, 256, 0, main_stream>>>(dlas, pb.cc, B, H, NC);
    cudaCheck(cudaGetLastError());
}
// the scan's scratch (the layer's carry and the shared astat are added where the activations are)
static void precond_scratch_add(Arena& ar, PrecondBufs* pb, long nq, int K) {
    ar.add(&pb->ca, nq * K); ar.add(&pb->cb, nq * K); ar.add(&pb->cc, nq); ar.add(&pb->cd, nq);
}

// one Sherman-Morrison step's key, by the whole block: kv = k̂ (row), w = P k̂, returns den = 1 + k̂·w
__device__ float exact_key(const float* P, const floatX* krow, float* kv, float* w, int K) {
    for (int a = threadIdx.x; a < K; a += blockDim.x) { kv[a] = tof(krow[a]); }
    __syncthreads();
    float part = 0.0f;
    for (int a = threadIdx.x; a < K; a += blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < K; c++) { s += P[a * K + c] * kv[c]; }
        w[a] = s;
        part += kv[a] * s;
    }
    return 1.0f + block_sum(part); // block_sum synchronises: w and kv are complete after it
}

// 3b. exact preconditioner (MODEL.md §5): one block per (b, h), P (K x K fp32) in shared memory, sequential over tokens.
// Per token: w = P k, den = 1 + k·w, k̃ = w / den, P -= k̃ wᵀ. P at every chunk start goes to pstate (for the
// backward); P0 / P_final (B,H,K,K) optional.
// doc (ChunkShape.doc) or null: at a document's first token P restarts from I / ridge (after pstate took P)
__global__ void precond_exact_forward_kernel(floatX* kt, float* pstate, const floatX* k, const float* P0, float* P_final,
                                             int T, int Tp, int K, int C, int NC, float ridge, const signed char* doc, int H) {
    extern __shared__ float sm[];
    float* P = sm;            // K*K
    float* w = P + K * K;     // K
    float* kv = w + K;        // K
    int bh = blockIdx.x;
    long KK = (long)K * K;
    for (long e = threadIdx.x; e < KK; e += blockDim.x) { P[e] = P0 ? P0[bh * KK + e] : (e % (K + 1) == 0 ? 1.0f / ridge : 0.0f); }
    __syncthreads();
    for (int t = 0; t < T; t++) {
        long row = (long)bh * Tp + t;
        if (t % C == 0) { for (long e = threadIdx.x; e < KK; e += blockDim.x) { pstate[((long)bh * (NC + 1) + t / C) * KK + e] = P[e]; } }
        if (doc && doc[(long)(bh / H) * Tp + t] == t % C) {
            __syncthreads(); // pstate has read P
            for (long e = threadIdx.x; e < KK; e += blockDim.x) { P[e] = e % (K + 1) == 0 ? 1.0f / ridge : 0.0f; }
            __syncthreads();
        }
        float den = exact_key(P, k + row * K, kv, w, K);
        for (int a = threadIdx.x; a < K; a += blockDim.x) { kt[row * K + a] = fromf<floatX>(w[a] / den); }
        for (long e = threadIdx.x; e < KK; e += blockDim.x) { P[e] -= (w[e / K] / den) * w[e % K]; }
        __syncthreads();
    }
    int NCT = (T + C - 1) / C;
    for (long e = threadIdx.x; e < KK; e += blockDim.x) {
        pstate[((long)bh * (NC + 1) + NCT) * KK + e] = P[e];
        if (P_final) { P_final[bh * KK + e] = P[e]; }
    }
}

// backward: chunk by chunk in reverse, recompute P_{t-1} for the chunk's tokens into pbuf (global scratch,
// (C+1) K*K per head), then the adjoint of each Sherman-Morrison step; dP (K x K) lives in shared memory
// doc or null: at a document's first token P_{t-1} was I / ridge, a constant: dP is not carried past it
__global__ void precond_exact_backward_kernel(float* dk, float* pbuf, const float* dkt, const floatX* k, const float* pstate,
                                              int T, int Tp, int K, int C, int NC, float ridge, const signed char* doc, int H) {
    extern __shared__ float sm[];
    float* dP = sm;           // K*K
    float* w = dP + K * K;    // K
    float* kt = w + K;
    float* kv = kt + K;
    float* dw = kv + K;
    float* dktl = dw + K;
    __shared__ float sden;
    int bh = blockIdx.x;
    long KK = (long)K * K;
    float* Pb = pbuf + (long)bh * (C + 1) * KK;
    for (long e = threadIdx.x; e < KK; e += blockDim.x) { dP[e] = 0.0f; }
    int NCT = (T + C - 1) / C;
    for (int ch = NCT - 1; ch >= 0; ch--) {
        int t0 = ch * C, n = min(C, T - t0);
        for (long e = threadIdx.x; e < KK; e += blockDim.x) { Pb[e] = pstate[((long)bh * (NC + 1) + ch) * KK + e]; }
        __syncthreads();
        for (int i = 0; i < n; i++) { // forward over the chunk: Pb[i+1] = step(Pb[i]), Pb[i] first reset at a boundary
            long row = (long)bh * Tp + t0 + i;
            if (doc && doc[(long)(bh / H) * Tp + t0 + i] == i) {
                for (long e = threadIdx.x; e < KK; e += blockDim.x) { Pb[i * KK + e] = e % (K + 1) == 0 ? 1.0f / ridge : 0.0f; }
                __syncthreads();
            }
            const float* P = Pb + i * KK;
            float den = exact_key(P, k + row * K, kv, w, K);
            for (long e = threadIdx.x; e < KK; e += blockDim.x) { Pb[(i + 1) * KK + e] = P[e] - (w[e / K] / den) * w[e % K]; }
            __syncthreads();
        }
        for (int i = n - 1; i >= 0; i--) {
            long row = (long)bh * Tp + t0 + i;
            const float* P = Pb + i * KK; // P_{t-1}
            float den = exact_key(P, k + row * K, kv, w, K);
            for (int a = threadIdx.x; a < K; a += blockDim.x) { kt[a] = w[a] / den; }
            __syncthreads();
            // P_t = P - kt wᵀ: dkt -= dP w; dw = -dPᵀ kt
            float pd = 0.0f;
            for (int a = threadIdx.x; a < K; a += blockDim.x) {
                float s1 = 0.0f, s2 = 0.0f;
                for (int c = 0; c < K; c++) { s1 += dP[a * K + c] * w[c]; s2 += dP[c * K + a] * kt[c]; }
                dktl[a] = dkt[row * K + a] - s1;
                dw[a] = -s2;
                pd += dktl[a] * w[a];
            }
            // kt = w / den, den = 1 + k·w
            float dden = -block_sum(pd) / (den * den);
            if (threadIdx.x == 0) { sden = dden; }
            __syncthreads();
            for (int a = threadIdx.x; a < K; a += blockDim.x) {
                dw[a] += dktl[a] / den + sden * kv[a];
                dk[row * K + a] += sden * w[a];
            }
            __syncthreads();
            // w = P k: dP += dw kᵀ, dk += Pᵀ dw
            for (int c = threadIdx.x; c < K; c += blockDim.x) {
                float s = 0.0f;
                for (int a = 0; a < K; a++) { s += P[a * K + c] * dw[a]; }
                dk[row * K + c] += s;
            }
            bool cut = doc && doc[(long)(bh / H) * Tp + t0 + i] == i;
            for (long e = threadIdx.x; e < KK; e += blockDim.x) { dP[e] = cut ? 0.0f : dP[e] + dw[e / K] * kv[e % K]; }
            __syncthreads();
        }
    }
}

// 3c. the chunkwise delta rule (MODEL.md §4)
//
// forward, per chunk with start state S (K x V), G = inclusive cumsum of g inside the chunk, E_ij = exp(G_i - G_j):
//   Mk = (K̂ K̃ᵀ ⊙ E) strictly lower, A = diag(beta) Mk, Tinv = (I + A)^-1
//   X = diag(beta) (K̂ ⊙ e^G), Y = diag(beta) V, W = Tinv X, U = Tinv Y           (so V' = U - W S)
//   Qg = Q̂ ⊙ e^G, Kd = K̃ ⊙ exp(G_n - G), P = (Q̂ K̃ᵀ ⊙ E) lower with the diagonal
//   O = Qg S + P V',   S_next = e^G_n ⊙ S + Kdᵀ V'
// (the CPU reference solves (I + A) V' = diag(beta)(V - (K̂ ⊙ e^G) S) by substitution: the same V'.)

// gk: 0 none, 1 scalar, K channel; nq = B*H*NC. doc: packed documents (--doc-mask 1), else null: (B, Tp) per padded
// position, the row of its chunk where its document starts, or -1 (doc_chunk_rel in train_common.h says what follows
// from it). Every mask of train_pdn.c's chunk form comes from these values: the scores across documents are zero, the
// start state reaches only the rows before the chunk's first boundary (Qg, and W through X, zero after it), only the
// chunk's last document writes the next state (Kd zero before it) and the start state's decay into it is zero where
// the chunk holds a boundary. The masks are constants, so the backward's identities (dG, dbeta) hold term by term.
struct ChunkShape { int B, H, T, Tp, C, NC, K, V, gk; long nq; const signed char* doc; };
// the C document values of chunk q (b, h, chunk), or null without documents
__device__ __forceinline__ const signed char* chunk_docs(const ChunkShape& s, long q) {
    return s.doc ? s.doc + q / ((long)s.H * s.NC) * s.Tp + q % s.NC * s.C : nullptr;
}
// whether chunk q holds a document boundary (its start state then does not reach the next chunk)
__device__ __forceinline__ bool chunk_cut(const ChunkShape& s, long q) {
    return s.doc && s.doc[q / ((long)s.H * s.NC) * s.Tp + q % s.NC * s.C + s.C - 1] >= 0;
}

// One pack of row i, columns j0 .. j0 + VEC - 1: X = b e^G k̂, Qg = q e^G, Kd = k̃ e^(G_n - G) from the chunk's cumsum
// rows Gs (a scalar decay: one factor pair a row). Documents (dc): a row whose document started in this chunk does not
// see the start state (e^G = 0); a row outside the chunk's last document does not write the next one (e^(G_n - G) = 0).
template <int VEC, typename P>
__device__ __forceinline__ void prep_pack(P& xo, P& qo, P& ko, const P& qv, const P& khv, const P& ktv, const float* Gs,
                                          const ChunkShape& s, const signed char* dc, float b, int i, int j0) {
    int C = s.C, gw = s.gk ? s.gk : 1, chan = s.gk > 1;
    float eg_row = 1.0f, ed_row = 1.0f;
    if (s.gk && !chan) { float gi = Gs[i]; eg_row = expf(gi); ed_row = expf(Gs[C - 1] - gi); }
    bool sees = !dc || dc[i] < 0, last = !dc || dc[i] == dc[C - 1];
    #pragma unroll
    for (int u = 0; u < VEC; u++) {
        float eg = eg_row, ed = ed_row;
        if (chan) { float gi = Gs[i * gw + j0 + u]; eg = expf(gi); ed = expf(Gs[(C - 1) * gw + j0 + u] - gi); }
        eg = sees ? eg : 0.0f;
        ed = last ? ed : 0.0f;
        xo.v[u] = fromf<floatX>(b * tof(khv.v[u]) * eg);
        qo.v[u] = fromf<floatX>(tof(qv.v[u]) * eg);
        ko.v[u] = fromf<floatX>(tof(ktv.v[u]) * ed);
    }
}
// G (cumsum, hm (rows, gw) fp32), X, Y, Qg, Kd (hm floatX); with X null G alone. One block per chunk; VEC floatX per
// access (16 bytes where the widths allow: this kernel only moves memory).
template <int VEC>
__global__ void chunk_prep_kernel(float* __restrict__ G, floatX* __restrict__ X, floatX* __restrict__ Y, floatX* __restrict__ Qg, floatX* __restrict__ Kd, const floatX* __restrict__ Q, const floatX* __restrict__ Kh,
                                  const floatX* __restrict__ Kt, const floatX* __restrict__ Vv, const float* __restrict__ beta, const float* __restrict__ g, ChunkShape s) {
    struct alignas(VEC * sizeof(floatX)) Pk { floatX v[VEC]; };
    extern __shared__ float Gs[]; // C * gw
    long q = blockIdx.x;
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1;
    long r0 = q * C;
    if (s.gk) {
        // the chunk's gates in parallel (all loads in flight), then the in-chunk cumsum per channel in shared memory
        for (int e = threadIdx.x; e < C * gw; e += blockDim.x) { Gs[e] = g[r0 * gw + e]; }
        __syncthreads();
        for (int c = threadIdx.x; c < gw; c += blockDim.x) {
            float acc = 0.0f;
            for (int i = 0; i < C; i++) { acc += Gs[i * gw + c]; Gs[i * gw + c] = acc; }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < C * gw; e += blockDim.x) { G[r0 * gw + e] = Gs[e]; }
    }
    if (!X) { return; } // the gates alone (the forward before prep_wy_kernel)
    const signed char* dc = chunk_docs(s, q);
    #pragma unroll 2
    for (int e = threadIdx.x * VEC; e < C * K; e += blockDim.x * VEC) {
        int i = e / K, j0 = e % K;
        long idx = (r0 + i) * K + j0;
        Pk qv = *(const Pk*)(Q + idx), khv = *(const Pk*)(Kh + idx), ktv = *(const Pk*)(Kt + idx), xo, qo, ko;
        prep_pack<VEC>(xo, qo, ko, qv, khv, ktv, Gs, s, dc, beta[r0 + i], i, j0);
        *(Pk*)(X + idx) = xo;
        *(Pk*)(Qg + idx) = qo;
        *(Pk*)(Kd + idx) = ko;
    }
    #pragma unroll 2
    for (int e = threadIdx.x * VEC; e < C * V; e += blockDim.x * VEC) {
        int i = e / V;
        long idx = (r0 + i) * V + e % V;
        float b = beta[r0 + i];
        Pk vv = *(const Pk*)(Vv + idx), yo;
        #pragma unroll
        for (int u = 0; u < VEC; u++) { yo.v[u] = fromf<floatX>(b * tof(vv.v[u])); }
        *(Pk*)(Y + idx) = yo;
    }
}
static void chunk_prep(float* G, floatX* X, floatX* Y, floatX* Qg, floatX* Kd, const floatX* Q, const floatX* Kh, const floatX* Kt,
                       const floatX* Vv, const float* beta, const float* g, const ChunkShape& s) {
    size_t sm = (size_t)s.C * (s.gk ? s.gk : 1) * sizeof(float);
    bool vec = s.K % XVEC == 0 && s.V % XVEC == 0;
    for (const void* p : {(const void*)X, (const void*)Y, (const void*)Qg, (const void*)Kd, (const void*)Q, (const void*)Kh,
                          (const void*)Kt, (const void*)Vv}) { vec = vec && aligned16(p); }
    if (vec) {
        chunk_prep_kernel<XVEC><<<(unsigned)s.nq, 256, sm, main_stream>>>(G, X, Y, Qg, Kd, Q, Kh, Kt, Vv, beta, g, s);
    } else {
        chunk_prep_kernel<1><<<(unsigned)s.nq, 256, sm, main_stream>>>(G, X, Y, Qg, Kd, Q, Kh, Kt, Vv, beta, g, s);
    }
    cudaCheck(cudaGetLastError());
}

// scalar / no decay: from raw Kh Ktᵀ and Q Ktᵀ (fp32, batched GEMMs), Mk = strict-lower ⊙ E, A = beta Mk,
// P = lower-with-diagonal ⊙ E (floatX, a GEMM operand)
__global__ void scores_mask_kernel(float* Mk, float* A, floatX* P, const float* Mraw, const float* Praw, const float* G,
                                   const float* beta, ChunkShape s) {
    long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int C = s.C;
    if (e >= s.nq * C * C) { return; }
    long q = e / (C * C);
    int i = (int)(e % (C * C)) / C, j = (int)(e % C);
    float E = (s.gk && j <= i) ? expf(G[q * C + i] - G[q * C + j]) : 1.0f; // never above the diagonal: overflow
    const signed char* dc = chunk_docs(s, q);
    if (dc && dc[i] != dc[j]) { E = 0.0f; } // documents: no score across a boundary
    float m = j < i ? Mraw[e] * E : 0.0f;
    Mk[e] = m;
    A[e] = beta[q * C + i] * m;
    P[e] = fromf<floatX>(j <= i ? Praw[e] * E : 0.0f);
}

// channel decay: every score carries a per-channel decay, Σ_c x_i[c] y_j[c] exp(G_i[c] - G_j[c]). The chunk is cut
// into sub-blocks of 16 tokens. For sub-blocks I > J, with r the last token of J, the decay factors exactly as
// exp(G_i - G_r) exp(G_r - G_j), both <= 1 (G decreases): the scores are plain dot products of pre-scaled rows
// (k̂_i ⊙ exp(G_i - G_r)) · (k̃_j ⊙ exp(G_r - G_j)), and the exponent is never split at a point where it could
// overflow. Only the diagonal 16 x 16 blocks take an exp per (i, j, c). One block per chunk; C a multiple of 16.
#define SUB 16
// load chunk r0's q̂, k̂, k̃ and G (rows of K) into shared memory, row stride ld
__device__ void chunk_rows_to_smem(float* q_s, float* kh_s, float* kt_s, float* g_s, const floatX* Q, const floatX* Kh,
                                   const floatX* Kt, const float* G, long r0, int C, int K, int ld) {
    for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
        int i = e / K, c = e % K;
        long idx = (r0 + i) * K + c;
        q_s[i * ld + c] = tof(Q[idx]);
        kh_s[i * ld + c] = tof(Kh[idx]);
        kt_s[i * ld + c] = tof(Kt[idx]);
        g_s[i * ld + c] = G[idx];
    }
}
// the pre-scaled rows of sub-block J (columns side) and I (rows side) for the anchor r = last token of J:
// bh = k̃_J ⊙ exp(G_r - G_J); ah = k̂_I ⊙ exp(G_I - G_r), qh = q̂_I ⊙ exp(G_I - G_r)
__device__ void scaled_cols(float* bh, const float* kt_s, const float* g_s, int J, int r, int K, int ld) {
    for (int e = threadIdx.x; e < SUB * K; e += blockDim.x) {
        int j = e / K, c = e % K, row = J * SUB + j;
        bh[j * ld + c] = kt_s[row * ld + c] * expf(g_s[r * ld + c] - g_s[row * ld + c]);
    }
}
__device__ void scaled_rows(float* ah, float* qh, const float* kh_s, const float* q_s, const float* g_s, int I, int r, int K, int ld) {
    for (int e = threadIdx.x; e < SUB * K; e += blockDim.x) {
        int i = e / K, c = e % K, row = I * SUB + i;
        float ex = expf(g_s[row * ld + c] - g_s[r * ld + c]);
        ah[i * ld + c] = kh_s[row * ld + c] * ex;
        qh[i * ld + c] = q_s[row * ld + c] * ex;
    }
}

__global__ void scores_channel_kernel(float* Mk, float* A, floatX* P, const floatX* Q, const floatX* Kh, const floatX* Kt,
                                      const float* G, const float* beta, ChunkShape s) {
    extern __shared__ float sm[];
    int C = s.C, K = s.K, ld = K + 1, nb = C / SUB;
    float *q_s = sm, *kh_s = q_s + C * ld, *kt_s = kh_s + C * ld, *g_s = kt_s + C * ld;
    float *bh = g_s + C * ld, *ah = bh + SUB * ld, *qh = ah + SUB * ld;
    long q = blockIdx.x, r0 = q * C, o0 = q * C * C;
    const signed char* dc = chunk_docs(s, q); // documents: no score across a boundary
    chunk_rows_to_smem(q_s, kh_s, kt_s, g_s, Q, Kh, Kt, G, r0, C, K, ld);
    __syncthreads();
    // blocks above the diagonal are zero; diagonal blocks by direct per-channel decays
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        int i = e / C, j = e % C;
        if (j / SUB > i / SUB) { Mk[o0 + e] = 0.0f; A[o0 + e] = 0.0f; P[o0 + e] = fromf<floatX>(0.0f); continue; }
        if (j / SUB < i / SUB) { continue; }
        float m = 0.0f, p = 0.0f;
        if (j <= i && (!dc || dc[i] == dc[j])) {
            for (int c = 0; c < K; c++) {
                float ex = expf(g_s[i * ld + c] - g_s[j * ld + c]) * kt_s[j * ld + c];
                m += kh_s[i * ld + c] * ex;
                p += q_s[i * ld + c] * ex;
            }
        }
        m = j < i ? m : 0.0f;
        Mk[o0 + e] = m;
        A[o0 + e] = beta[r0 + i] * m;
        P[o0 + e] = fromf<floatX>(p);
    }
    for (int J = 0; J + 1 < nb; J++) {
        int r = J * SUB + SUB - 1;
        __syncthreads();
        scaled_cols(bh, kt_s, g_s, J, r, K, ld);
        for (int I = J + 1; I < nb; I++) {
            __syncthreads();
            scaled_rows(ah, qh, kh_s, q_s, g_s, I, r, K, ld);
            __syncthreads();
            for (int e = threadIdx.x; e < SUB * SUB; e += blockDim.x) {
                int i = e / SUB, j = e % SUB;
                float m = 0.0f, p = 0.0f;
                for (int c = 0; c < K; c++) { m += ah[i * ld + c] * bh[j * ld + c]; p += qh[i * ld + c] * bh[j * ld + c]; }
                if (dc && dc[I * SUB + i] != dc[J * SUB + j]) { m = 0.0f; p = 0.0f; }
                long o = o0 + (long)(I * SUB + i) * C + J * SUB + j;
                Mk[o] = m;
                A[o] = beta[r0 + I * SUB + i] * m;
                P[o] = fromf<floatX>(p);
            }
        }
    }
}

// Ts = (I + A)^-1 for a strictly lower A (C x C, row stride ld, all in shared memory; Rs: scratch of the same shape),
// blocked by 16 rows so that a whole block works instead of one thread per column: the diagonal 16 x 16 blocks by
// forward substitution (thread j owns column j, in registers), then the blocks below, one block diagonal d at a time, by
// T_IJ = -T_II Σ_{J<=k<I} A_Ik T_kJ (every T_kJ on the right is on a nearer diagonal). Any C <= blockDim.x.
__device__ void tri_inverse_smem(float* Ts, float* Rs, const float* As, int C, int ld) {
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) { Ts[(e / C) * ld + e % C] = 0.0f; }
    __syncthreads();
    int j = threadIdx.x;
    if (j < C) {
        // column j of its diagonal block in registers, fully unrolled: every thread runs the same FMAs (t is 0 above
        // the diagonal, so the sums start at the diagonal as in plain substitution), no divergence, no memory chain
        int b0 = j / SUB * SUB, jl = j - b0;
        float t[SUB];
        #pragma unroll
        for (int i = 0; i < SUB; i++) {
            float acc = 0.0f;
            #pragma unroll
            for (int k = 0; k < i; k++) { acc += (b0 + i < C ? As[(b0 + i) * ld + b0 + k] : 0.0f) * t[k]; }
            t[i] = i < jl ? 0.0f : i == jl ? 1.0f : -acc;
        }
        #pragma unroll
        for (int i = 0; i < SUB; i++) {
            if (b0 + i < C) { Ts[(b0 + i) * ld + j] = t[i]; }
        }
    }
    int nb = (C + SUB - 1) / SUB;
    for (int d = 1; d < nb; d++) {
        __syncthreads();
        int n = (nb - d) * SUB * SUB; // blocks (I, I - d), I = d .. nb - 1
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            int I = d + e / (SUB * SUB), i = I * SUB + (e / SUB) % SUB, j2 = (I - d) * SUB + e % SUB;
            if (i >= C) { continue; }
            float acc = 0.0f;
            for (int c = (I - d) * SUB; c < I * SUB; c++) { acc += As[i * ld + c] * Ts[c * ld + j2]; }
            Rs[i * ld + j2] = acc;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            int I = d + e / (SUB * SUB), i = I * SUB + (e / SUB) % SUB, j2 = (I - d) * SUB + e % SUB;
            if (i >= C) { continue; }
            float acc = 0.0f;
            for (int c = I * SUB; c <= i; c++) { acc += Ts[i * ld + c] * Rs[c * ld + j2]; }
            Ts[i * ld + j2] = -acc;
        }
    }
    __syncthreads();
}

// Tx = (I + A)^-1 (floatX: an operand of the GEMMs) for each chunk's strictly lower A (fp32). 256 threads, C <= 64.
#define TRI_LD(C) ((C) + 4)
__global__ void __launch_bounds__(256) tri_inverse_kernel(floatX* Tx, const float* A, int C) {
    extern __shared__ float sm[];
    int ld = TRI_LD(C);
    float *As = sm, *Ts = As + C * ld, *Rs = Ts + C * ld;
    long q = blockIdx.x;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) { As[(e / C) * ld + e % C] = A[q * C * C + e]; }
    __syncthreads();
    tri_inverse_smem(Ts, Rs, As, C, ld);
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) { Tx[q * C * C + e] = fromf<floatX>(Ts[(e / C) * ld + e % C]); }
}
static void tri_inverse(floatX* Tx, const float* A, long nq, int C) {
    tri_inverse_kernel<<<(unsigned)nq, 256, 3 * (size_t)C * TRI_LD(C) * sizeof(float), main_stream>>>(Tx, A, C);
    cudaCheck(cudaGetLastError());
}

// The sequential part: one block per (b, h, V-tile of SCAN_BV columns), walking the chunks in order.
// forward: hstate[c] = S; V'_c = U_c - W_c S; S = e^G_last ⊙ S + Kd_cᵀ V'_c. S (K x BV) fp32 in shared memory.
// SCAN_BV: the value columns of a SIMT scan block, and the unit of the V'/O remake's work items; the tensor-core scans
// take theirs (BV, 16 or 32) from the plan (MixerPlan.scan_bv)
#define SCAN_BV 32
__global__ void state_forward_kernel(floatX* hstate, floatX* Vn, const floatX* W, const floatX* U, const floatX* Kd,
                                     const float* G, const float* S0, float* S_final, ChunkShape s) {
    extern __shared__ float sm[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1;
    int bh = blockIdx.x, v0 = blockIdx.y * SCAN_BV, bv = min(SCAN_BV, V - v0);
    float* S = sm;                       // K * SCAN_BV
    float* Vp = S + K * SCAN_BV;         // C * SCAN_BV
    float* Ws = Vp + C * SCAN_BV;        // C * (K+1)   (W, then Kd)
    int ldw = K + 1;
    for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
        int a = e / SCAN_BV, c = e % SCAN_BV;
        S[e] = (S0 && c < bv) ? S0[((long)bh * K + a) * V + v0 + c] : 0.0f;
    }
    __syncthreads();
    for (int ch = 0; ch < s.NC; ch++) {
        long q = (long)bh * s.NC + ch, r0 = q * C;
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            if (c < bv) { hstate[(q * K + a) * V + v0 + c] = fromf<floatX>(S[e]); }
        }
        for (int e = threadIdx.x; e < C * K; e += blockDim.x) { Ws[(e / K) * ldw + e % K] = tof(W[r0 * K + e]); }
        __syncthreads();
        // V'_c = U - W S
        for (int e = threadIdx.x; e < C * SCAN_BV; e += blockDim.x) {
            int i = e / SCAN_BV, c = e % SCAN_BV;
            float acc = c < bv ? tof(U[(r0 + i) * V + v0 + c]) : 0.0f;
            for (int a = 0; a < K; a++) { acc -= Ws[i * ldw + a] * S[a * SCAN_BV + c]; }
            floatX vx = fromf<floatX>(acc);
            Vp[e] = tof(vx); // the state update uses V' as stored, like the output GEMM
            if (c < bv) { Vn[(r0 + i) * V + v0 + c] = vx; }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < C * K; e += blockDim.x) { Ws[(e / K) * ldw + e % K] = tof(Kd[r0 * K + e]); }
        __syncthreads();
        // S = e^G_last ⊙ S + Kdᵀ V' (documents: no e^G_last S across a boundary in the chunk)
        bool cut = chunk_cut(s, q);
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            float gl = s.gk ? G[(r0 + C - 1) * gw + (gw > 1 ? a : 0)] : 0.0f;
            float acc = (cut ? 0.0f : expf(gl)) * S[e];
            for (int i = 0; i < C; i++) { acc += Ws[i * ldw + a] * Vp[i * SCAN_BV + c]; }
            S[e] = acc;
        }
        __syncthreads();
    }
    if (S_final) {
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            if (c < bv) { S_final[((long)bh * K + a) * V + v0 + c] = S[e]; }
        }
    }
}

// backward of the scan, walking the chunks in reverse with dS = dL/d(state at the chunk's end):
//   dhstate[c] = dS;  dV'_c = dVloc_c + Kd_c dS;  dS = e^G_last ⊙ dS + Qg_cᵀ dO_c - W_cᵀ dV'_c
// dVloc = Pᵀ dO (batched GEMM before). dS0 (B,H,K,V) optional.
__global__ void state_backward_kernel(floatX* dhstate, floatX* dVn, const float* dVloc, const floatX* dO, const floatX* W,
                                      const floatX* Qg, const floatX* Kd, const float* G, float* dS0, ChunkShape s) {
    extern __shared__ float sm[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1;
    int bh = blockIdx.x, v0 = blockIdx.y * SCAN_BV, bv = min(SCAN_BV, V - v0);
    float* dS = sm;                      // K * SCAN_BV
    float* dVp = dS + K * SCAN_BV;       // C * SCAN_BV
    float* dOs = dVp + C * SCAN_BV;      // C * SCAN_BV
    float* Ms = dOs + C * SCAN_BV;       // C * (K+1): Kd, then Qg, then W
    float* Ns = Ms + C * (K + 1);        // C * (K+1)
    int ldw = K + 1;
    for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) { dS[e] = 0.0f; }
    __syncthreads();
    for (int ch = s.NC - 1; ch >= 0; ch--) {
        long q = (long)bh * s.NC + ch, r0 = q * C;
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            if (c < bv) { dhstate[(q * K + a) * V + v0 + c] = fromf<floatX>(dS[e]); }
        }
        for (int e = threadIdx.x; e < C * K; e += blockDim.x) { Ms[(e / K) * ldw + e % K] = tof(Kd[r0 * K + e]); }
        for (int e = threadIdx.x; e < C * SCAN_BV; e += blockDim.x) {
            int i = e / SCAN_BV, c = e % SCAN_BV;
            dOs[e] = c < bv ? tof(dO[(r0 + i) * V + v0 + c]) : 0.0f;
        }
        __syncthreads();
        // dV' = dVloc + Kd dS
        for (int e = threadIdx.x; e < C * SCAN_BV; e += blockDim.x) {
            int i = e / SCAN_BV, c = e % SCAN_BV;
            float acc = c < bv ? dVloc[(r0 + i) * V + v0 + c] : 0.0f;
            for (int a = 0; a < K; a++) { acc += Ms[i * ldw + a] * dS[a * SCAN_BV + c]; }
            floatX dx = fromf<floatX>(acc);
            dVp[e] = tof(dx);
            if (c < bv) { dVn[(r0 + i) * V + v0 + c] = dx; }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
            Ms[(e / K) * ldw + e % K] = tof(Qg[r0 * K + e]);
            Ns[(e / K) * ldw + e % K] = tof(W[r0 * K + e]);
        }
        __syncthreads();
        // dS = e^G_last ⊙ dS + Qgᵀ dO - Wᵀ dV' (documents: as the forward's decay)
        bool cut = chunk_cut(s, q);
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            float gl = s.gk ? G[(r0 + C - 1) * gw + (gw > 1 ? a : 0)] : 0.0f;
            float acc = (cut ? 0.0f : expf(gl)) * dS[e];
            for (int i = 0; i < C; i++) { acc += Ms[i * ldw + a] * dOs[i * SCAN_BV + c] - Ns[i * ldw + a] * dVp[i * SCAN_BV + c]; }
            dS[e] = acc;
        }
        __syncthreads();
    }
    if (dS0) {
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            if (c < bv) { dS0[((long)bh * K + a) * V + v0 + c] = dS[e]; }
        }
    }
}

// hsum[a] = Σ_v dS_av S_av, the row sums of chunk q's start state S and its gradient dS (K x V floatX, VEC-wide
// accesses): the last row's term e^G_n ⊙ hsum of dg (bwd_finish_kernel, and the channel-decay scores kernels' finish).
// A warp per state row, VEC columns per lane; a warp takes FIN_ROWS rows at a time, their loads all in flight before
// the first reduction: one row after another, each waiting for its own loads, the warps' 16 rows were a chain of 16
// global-memory latencies at the end of every block (Nsight Compute: long-scoreboard stalls, 12.6 cycles per issued
// instruction, kda-340m, H200, 2026-12-03). The block's threads all call it; hsum is complete after a __syncthreads.
template <int VEC>
__device__ void state_row_sums(float* hsum, const floatX* __restrict__ hstate, const floatX* __restrict__ dhstate, long q,
                               int K, int V) {
    struct alignas(VEC * sizeof(floatX)) X4 { floatX v[VEC]; };
    const int FIN_ROWS = 8;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int a0 = warp; a0 < K; a0 += nw * FIN_ROWS) {
        float sum[FIN_ROWS];
        #pragma unroll
        for (int t = 0; t < FIN_ROWS; t++) { sum[t] = 0.0f; }
        for (int c = lane * VEC; c < V; c += 32 * VEC) { // one pass at V = 128
            X4 h[FIN_ROWS], dh[FIN_ROWS];
            #pragma unroll
            for (int t = 0; t < FIN_ROWS; t++) {
                long o = (q * K + min(a0 + t * nw, K - 1)) * V + c; // rows past K: a valid row, not summed
                h[t] = *(const X4*)(hstate + o);
                dh[t] = *(const X4*)(dhstate + o);
            }
            #pragma unroll
            for (int t = 0; t < FIN_ROWS; t++) {
                #pragma unroll
                for (int u = 0; u < VEC; u++) { sum[t] += tof(dh[t].v[u]) * tof(h[t].v[u]); }
            }
        }
        #pragma unroll
        for (int t = 0; t < FIN_ROWS; t++) { // a0 + t nw is the same for the whole warp: every lane shuffles
            float r = warp_sum(sum[t]);
            if (lane == 0 && a0 + t * nw < K) { hsum[a0 + t * nw] = r; }
        }
    }
}

// the V'/O remake's work items, stage buffers and warps (state_outputs_wmma_kernel; none in the fp32 build)
struct OutsPlan { int bw, ns, nw; };
#ifndef ENABLE_FP32
// The same two scans on tensor cores (bf16 mma.sync m16n8k16 through mma_steps below, fp32 accumulation), for K and C
// multiples of 16 and V of SCAN_BV. One block per (b, h, BV value columns: 16 or 32, MixerPlan.scan_bv) on the grid
// (value slices, b h): a head's slices are neighbouring blocks, resident at the same time, so each chunk's W, Kd, Qg
// (the same for every slice) can come from the L2 after the first slice's read (on the H200 the order made no measurable difference, 2026-12-03).
// The state S stays fp32 in shared memory; its bf16 copy Sb is the MMA operand (and what hstate stores), as in the
// fp32 scan's use of the stored V'. The chunk's operands are staged in shared memory (below).
using namespace nvcuda;
// warps of a scan block; the output tiles of each product are dealt out among them. Measured on an H200 at the
// 340m shape: the forward is faster with 8 (19 vs 22 ms per step), the backward with 4 (28 vs 39 ms)
#ifndef SCAN_WARPS_FWD
#define SCAN_WARPS_FWD 16
#endif
#ifndef SCAN_WARPS_BWD
#define SCAN_WARPS_BWD 8
#endif
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragBT;
// The products run as mma.sync m16n8k16 (bf16, fp32 accumulation) on operands loaded from shared memory by ldmatrix
// (.trans where the operand is stored the other way round): WMMA's own loads compile to single 16- and 32-bit loads
// on sm_90 (no LDSM in the SASS), which kept these kernels waiting on shared memory and integer work. On the H200
// (2026-12-03, dev/cuda/delta_chunk) the V'/O remake went from 0.37 to 0.28 ms at 16 x 2048 with mma_steps alone, and
// with the scans and the scalar scores' backward too the mixer's forward + backward from 4.34 to 3.75 ms (pgdn,
// 16 x 2048) and from 4.27 to 3.39 ms (dn, B = 1, T = 16384). The channel-decay scores' kernels followed.
// The accumulator stays a WMMA fragment (filled, loaded and stored by WMMA): on sm_80 and later its 8 floats per lane
// are the two m16n8 accumulators of mma.sync, columns 0-7 then 8-15 (every kernel lab check against the double
// reference rests on it and fails loudly where it does not hold).
// ldmatrix x4 of a 16 x 16 bf16 block: p is this lane's row address (16-byte aligned rows)
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const __nv_bfloat16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned r[4], const __nv_bfloat16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// c (4 floats: one m16n8 accumulator) += a (16 x 16) b (16 x 8)
__device__ __forceinline__ void mma_16816(float* c, const unsigned a[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// this lane's row address in a 16 x 16 block at p (row stride ld) for ldmatrix x4: as stored (the A operand, or a
// transposed B through .trans), or for an operand used transposed (rows and columns of the four 8 x 8 blocks swapped)
__device__ __forceinline__ const __nv_bfloat16* ldsm_row(const __nv_bfloat16* p, int ld) {
    int l = threadIdx.x % 32;
    return p + (l % 16) * ld + (l / 16) * 8;
}
__device__ __forceinline__ const __nv_bfloat16* ldsm_row_t(const __nv_bfloat16* p, int ld) {
    int l = threadIdx.x % 32;
    return p + ((l & 7) + ((l >> 4) << 3)) * ld + ((l >> 3) & 1) * 8;
}
// acc += Σ_k A_k B_k over n steps of 16: A_k = the 16 x 16 block at a + 16 k (row-major, stride lda), B_k at
// b + k bstep (stride ldb; FB = FragB row-major, bstep 16 ldb, or FragBT for a transposed operand, bstep 16). Every
// tensor-core product that is made again elsewhere goes through this one loop: the same fragments in the same order
// give the same fp32 sums, which V', O and Mk made again in the backward rely on.
template <typename FB>
__device__ __forceinline__ void mma_steps(FragC& acc, const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, long bstep,
                                          int ldb, int n) {
    const bool bt = std::is_same<FB, FragBT>::value;
    const __nv_bfloat16 *pa = ldsm_row(a, lda), *pb = bt ? ldsm_row_t(b, ldb) : ldsm_row(b, ldb);
    for (int k = 0; k < n; k++) {
        unsigned ra[4], rb[4];
        ldsm_x4(ra, pa + 16 * k);
        if (bt) { ldsm_x4(rb, pb + k * bstep); } else { ldsm_x4_t(rb, pb + k * bstep); }
        mma_16816(acc.x, ra, rb[0], rb[1]);
        mma_16816(acc.x + 4, ra, rb[2], rb[3]);
    }
}
// acc += Σ_k A_kᵀ B_k: A_k the 16 x 16 block at a + 16 k lda (stored row-major, used transposed: Kdᵀ, Qgᵀ, Wᵀ,
// Pᵀ), B_k row-major at b + k bstep (stride ldb)
__device__ __forceinline__ void mma_steps_t(FragC& acc, const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, long bstep,
                                            int ldb, int n) {
    const __nv_bfloat16 *pa = ldsm_row_t(a, lda), *pb = ldsm_row(b, ldb);
    for (int k = 0; k < n; k++) {
        unsigned ra[4], rb[4];
        ldsm_x4_t(ra, pa + 16 * k * lda);
        ldsm_x4_t(rb, pb + k * bstep);
        mma_16816(acc.x, ra, rb[0], rb[1]);
        mma_16816(acc.x + 4, ra, rb[2], rb[3]);
    }
}
// The three product forms above on small integers (exact in bf16 and fp32; every row and every column of each of the
// three products distinct, so a swapped register or a misplaced block shows) with the results stored by WMMA, against the
// host's sums: at start (mixer_kernel_setup), so that a GPU or compiler on which the fragments or the accumulator's
// layout differ runs the exact SIMT / FMA kernels (mma_bad) instead of wrong tensor-core ones. out: 3 x 16 x 16.
#define MMA_LD 24 // bf16 rows of 16 + 8 (48 bytes: ldmatrix wants 16-byte aligned rows)
__device__ __host__ __forceinline__ float mma_test_a(int i, int j) { return (float)((i * 5 + j * 3 + i * j) % 17 - 8); }
__device__ __host__ __forceinline__ float mma_test_b(int i, int j) { return (float)((i * 3 + j * 7 + 2 * i * j + i * i + j * j) % 17 - 8); }
__global__ void mma_selftest_kernel(float* out) {
    __shared__ __align__(128) __nv_bfloat16 a[16 * MMA_LD], b[16 * MMA_LD];
    for (int e = threadIdx.x; e < 256; e += 32) {
        a[e / 16 * MMA_LD + e % 16] = __float2bfloat16(mma_test_a(e / 16, e % 16));
        b[e / 16 * MMA_LD + e % 16] = __float2bfloat16(mma_test_b(e / 16, e % 16));
    }
    __syncwarp();
    FragC c;
    wmma::fill_fragment(c, 0.0f);
    mma_steps<FragB>(c, a, MMA_LD, b, 16 * MMA_LD, MMA_LD, 1); // a b
    wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
    wmma::fill_fragment(c, 0.0f);
    mma_steps<FragBT>(c, a, MMA_LD, b, 16, MMA_LD, 1);          // a bᵀ
    wmma::store_matrix_sync(out + 256, c, 16, wmma::mem_row_major);
    wmma::fill_fragment(c, 0.0f);
    mma_steps_t(c, a, MMA_LD, b, 16 * MMA_LD, MMA_LD, 1);       // aᵀ b
    wmma::store_matrix_sync(out + 512, c, 16, wmma::mem_row_major);
}
static int mma_bad = 0; // set at start if the check failed: the plan then takes the exact kernels
static void mma_selftest(void) {
    float* d = nullptr;
    std::vector<float> h(768);
    cudaCheck(cudaMalloc(&d, 768 * sizeof(float)));
    mma_selftest_kernel<<<1, 32>>>(d);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpy(h.data(), d, 768 * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d));
    int bad = 0;
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) {
            float ab = 0.0f, abt = 0.0f, atb = 0.0f;
            for (int k = 0; k < 16; k++) {
                ab += mma_test_a(i, k) * mma_test_b(k, j);
                abt += mma_test_a(i, k) * mma_test_b(j, k);
                atb += mma_test_a(k, i) * mma_test_b(k, j);
            }
            bad += h[i * 16 + j] != ab || h[256 + i * 16 + j] != abt || h[512 + i * 16 + j] != atb;
        }
    }
    if (bad) {
        mma_bad = 1;
        fprintf(stderr, "warning: the tensor-core products (ldmatrix + mma.sync into WMMA accumulators) failed their start-up "
                        "check on this GPU (%d of 768 values wrong): the mixer runs its exact SIMT / FMA kernels instead "
                        "(correct, slower); please report the GPU and CUDA version\n", bad);
    }
}

// The chunk's operands are staged in shared memory with cp.async one chunk ahead (each buffer refilled as soon as
// the current chunk is done with it), so no global-memory latency sits on the chunk-to-chunk chain, which is what
// bounds these kernels. Every shared tile's rows are padded (K + 8 or 32 + 8 bf16, 32 + 4 fp32 elements) against
// shared-memory bank conflicts: unpadded 32-column state tiles put WMMA's 16 rows on the same few banks.
#define SCAN_PADK(K) ((K) + 8)
#define SCAN_PADV(bv) ((bv) + 8)
#define SCAN_PADF(bv) ((bv) + 4)
// the chunk's last-row decay: gw floats (1 or K)
__device__ __forceinline__ void stage_glast(float* dst, const float* G, long row, int gw, int tid, int nt) {
    if (gw == 1) {
        if (tid == 0) { __pipeline_memcpy_async(dst, G + row, 4); }
    } else {
        stage_async(dst, 0, G + row * gw, 0, 1, gw * 4, tid, nt);
    }
}
static __host__ __device__ size_t scan_align(size_t b) { return (b + 127) / 128 * 128; }
// 8 consecutive fp32 values (16-byte aligned, in shared memory) rounded to bf16: one 16-byte vector
__device__ __forceinline__ uint4 round8_bf16(const float* src) {
    float4 lo = *(const float4*)src, hi = *(const float4*)(src + 4);
    uint4 o;
    __nv_bfloat162* ob = (__nv_bfloat162*)&o;
    ob[0] = __floats2bfloat162_rn(lo.x, lo.y);
    ob[1] = __floats2bfloat162_rn(lo.z, lo.w);
    ob[2] = __floats2bfloat162_rn(hi.x, hi.y);
    ob[3] = __floats2bfloat162_rn(hi.z, hi.w);
    return o;
}
// V' = bf16(U - W Sb) for 8 consecutive columns: u their U (bf16), wsb their W Sb (fp32, 16-byte aligned, in shared
// memory). One definition for the forward scan and the V'/O remake, which must agree bit for bit.
__device__ __forceinline__ uint4 vprime8(uint4 u, const float* wsb) {
    float4 lo = *(const float4*)wsb, hi = *(const float4*)(wsb + 4);
    float w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const __nv_bfloat16* ub = (const __nv_bfloat16*)&u;
    uint4 o;
    __nv_bfloat16* ob = (__nv_bfloat16*)&o;
    #pragma unroll
    for (int k = 0; k < 8; k++) { ob[k] = __float2bfloat16(__bfloat162float(ub[k]) - w[k]); }
    return o;
}

// Shared memory of the tensor-core scans. Fixed part: the fp32 state and its bf16 copy (K x 36, K x 40), the chunk's
// V' (dV') in fp32 and bf16 (C x 36, C x 40). Then NS stage buffers, each with the staged operands of one chunk
// (ScanStage: byte offsets): W, Kd, Qg (C x K+8 each), nv slices of U (forward) or dO (backward) (C x 40), P
// (C x C+8), the last row's G and the decay factors made from it (2 gw). NS = 1 stages a chunk's operands in two halves while
// the chunk before it still runs (two blocks per multiprocessor fit at K = 128); NS = 2 stages the whole next chunk
// while this one runs (one block per multiprocessor): the chunk's full compute time to hide the loads' latency where
// few blocks walk long chains (one sequence, few heads); NS = 3 stages the chunk after next into the third buffer from
// warps idle in the chunk's first phase, so that no copy is issued between chunks. MixerPlan.scan_stages chooses.
struct ScanStage { size_t w, kd, qg, v, p, g, bytes; };
__host__ __device__ inline ScanStage scan_stage(int C, int K, int gw, int nv, int bv) {
    ScanStage t;
    size_t m = scan_align((size_t)C * SCAN_PADK(K) * 2);
    t.w = 0; t.kd = m; t.qg = 2 * m; t.v = 3 * m;
    t.p = t.v + nv * scan_align((size_t)C * SCAN_PADV(bv) * 2);
    t.g = t.p + scan_align((size_t)C * (C + 8) * 2);
    t.bytes = t.g + scan_align((size_t)2 * gw * 4); // G_last, then the decay factors made from it
    return t;
}
__host__ __device__ inline size_t scan_fixed_bytes(int C, int K, int bv) {
    return scan_align((size_t)K * SCAN_PADF(bv) * 4) + scan_align((size_t)C * SCAN_PADF(bv) * 4) +
           scan_align((size_t)K * SCAN_PADV(bv) * 2) + scan_align((size_t)C * SCAN_PADV(bv) * 2);
}
// U / dO slices per stage: the backward with one stage keeps two dO slices (the next chunk's copy starts while this
// chunk's dS update still reads its own)
__host__ __device__ inline int scan_nv(int backward, int ns) { return backward && ns == 1 ? 2 : 1; }

// Chunk groups of the two-level scans (dev/cuda/delta_chunk v3). Per chunk the state moves as S' = A S + B with
// A = e^G_last - Kdᵀ W (K x K) and B = Kdᵀ U: a scan over a group of chunks from zero gives the group's B, the same
// scan with U = 0 from the identity (a K x K "state") gives the product of its A's, a short pass over the groups
// composes them into each group's true start state, and a last scan per group from it makes the outputs. The block
// (bh, g) = blockIdx.y / G, % G walks chunks [g M, min(NC, (g + 1) M)); S0 / S_final (dS_in / dS0) are indexed by
// blockIdx.y. G = 1 with SCAN_OUT is the sequential scan.
enum { SCAN_OUT = 1, SCAN_HOMOG = 2, SCAN_IDENT = 4 }; // write the outputs; U (dO) zero; start from the identity
struct ScanGroups { int G, M, mode; };
static const ScanGroups SCAN_SEQ = {1, 1 << 30, SCAN_OUT};

// forward: per chunk, hstate = S; V' = U - W S; O = Qg S + P V'; S = e^G_last ⊙ S + Kdᵀ V'. The output O is made
// here too (the warps that W S leaves idle take Qg S, kept in registers until P V' is added): no batched GEMMs after.
// NS = 1: two blocks per multiprocessor (the 64-register cap) so that the 512 blocks of the 340m shape run in two
// waves; NS = 2, 3 (ScanStage): one.
template <int NS, int BV>
__global__ void __launch_bounds__(32 * SCAN_WARPS_FWD, NS == 1 ? 2 : 1) state_forward_wmma_kernel(floatX* hstate, floatX* Vn, floatX* O, const floatX* W,
                                                                     const floatX* U, const floatX* Kd, const floatX* Qg,
                                                                     const floatX* P, const float* G, const float* S0,
                                                                     float* S_final, ChunkShape s, ScanGroups sg) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1, kp = SCAN_PADK(K);
    int blk = blockIdx.y, bh = blk / sg.G, v0 = blockIdx.x * BV, warp = threadIdx.x / 32;
    int lo = blk % sg.G * sg.M, hi = min(s.NC, lo + sg.M); // this block's chunks
    bool outs = sg.mode & SCAN_OUT, homog = sg.mode & SCAN_HOMOG;
    unsigned char* p = smem_raw;
    float* S = (float*)p;                    p += scan_align((size_t)K * SCAN_PADF(BV) * 4); // K x 36 fp32
    float* Vt = (float*)p;                   p += scan_align((size_t)C * SCAN_PADF(BV) * 4); // C x 36 fp32
    __nv_bfloat16* Sb = (__nv_bfloat16*)p;   p += scan_align((size_t)K * SCAN_PADV(BV) * 2); // K x 40
    __nv_bfloat16* Vb = (__nv_bfloat16*)p;   p += scan_align((size_t)C * SCAN_PADV(BV) * 2); // C x 40
    const ScanStage lay = scan_stage(C, K, gw, scan_nv(0, NS), BV);
    unsigned char* stages = p;               // NS x lay.bytes: staged W, Kd, Qg (C x kp), U slice (C x 40), P, G_last
    // the staged operands of the chunk in stage buffer b (NS = 1: always 0)
    __nv_bfloat16 *Ws, *Kds, *Us, *Qgs, *Ps;
    float* Gl;
    auto use_stage = [&](int b) {
        unsigned char* q = stages + (size_t)b * lay.bytes;
        Ws = (__nv_bfloat16*)(q + lay.w); Kds = (__nv_bfloat16*)(q + lay.kd); Qgs = (__nv_bfloat16*)(q + lay.qg);
        Us = (__nv_bfloat16*)(q + lay.v); Ps = (__nv_bfloat16*)(q + lay.p); Gl = (float*)(q + lay.g);
    };
    int lp = C + 8;
    for (int e = threadIdx.x; e < K * BV; e += blockDim.x) {
        int a = e / BV, c = e % BV;
        float x = (sg.mode & SCAN_IDENT) ? (a == v0 + c ? 1.0f : 0.0f) : S0 ? S0[((long)blk * K + a) * V + v0 + c] : 0.0f;
        S[a * SCAN_PADF(BV) + c] = x;
        Sb[a * SCAN_PADV(BV) + c] = __float2bfloat16(x);
    }
    // half 1 of a chunk: W, Qg; half 2: U, G_last, Kd, P (Qg, U and P only where the outputs or U are needed), into
    // the buffers use_stage set, by threads st_tid of st_nt (the block; NS = 3: the warps idle in the chunk's first phase)
    long rb = ((long)bh * s.NC + lo) * C;
    int st_tid = threadIdx.x, st_nt = blockDim.x;
    auto stage1 = [&](long r) {
        stage_async(Ws, kp * 2, W + r * K, (long)K * 2, C, K * 2, st_tid, st_nt);
        if (outs) { stage_async(Qgs, kp * 2, Qg + r * K, (long)K * 2, C, K * 2, st_tid, st_nt); }
    };
    auto stage2 = [&](long r) {
        if (!homog) { stage_async(Us, SCAN_PADV(BV) * 2, U + r * V + v0, (long)V * 2, C, BV * 2, st_tid, st_nt); }
        if (s.gk) { stage_glast(Gl, G, r + C - 1, gw, st_tid, st_nt); }
        stage_async(Kds, kp * 2, Kd + r * K, (long)K * 2, C, K * 2, st_tid, st_nt);
        if (outs) { stage_async(Ps, lp * 2, P + r * C, (long)C * 2, C, C * 2, st_tid, st_nt); } // chunk q's P starts at q C C = r C
    };
    use_stage(0);
    stage1(rb);
    if (NS == 1) { __pipeline_commit(); }
    stage2(rb);
    __pipeline_commit();
    if (NS >= 2) { // and the whole second chunk into buffer 1 (an empty group if there is none)
        use_stage(1);
        if (lo + 1 < hi) { stage1(rb + C); stage2(rb + C); }
        __pipeline_commit();
    }
    int mt = C / 16, kt = K / 16, lane = threadIdx.x % 32;
    // element-wise work goes by 8 consecutive columns (16-byte accesses): lane l of a warp owning a 16 x 16 tile takes
    // row l / 2, columns (l % 2) * 8 .. + 7
    int tr = lane / 2, tc = (lane % 2) * 8;
    // the warps owning O tiles: where the state's tiles, O's and W Sb's together fit the warps (16 value columns),
    // those after the state's, so that P V' runs beside the state update instead of after it on the same warps;
    // otherwise from warp 0. The products and their order are the same either way.
    int ob = (kt + 2 * mt) * (BV / 16) <= SCAN_WARPS_FWD ? kt * (BV / 16) : 0;
    __syncthreads(); // Sb is complete
    for (int e = threadIdx.x; outs && e < K * BV / 8; e += blockDim.x) { // hstate of the first chunk
        int a = e / (BV / 8), c = e % (BV / 8) * 8;
        *(uint4*)(hstate + (((long)bh * s.NC + lo) * K + a) * V + v0 + c) = *(const uint4*)(Sb + a * SCAN_PADV(BV) + c);
    }
    for (int ch = lo; ch < hi; ch++) {
        long q = (long)bh * s.NC + ch, r0 = q * C;
        bool more = ch + 1 < hi, cut = chunk_cut(s, q); // cut: documents, a boundary in the chunk (read well before use)
        if (NS >= 2) { use_stage((ch - lo) % NS); } // (NS = 1: buffer 0 throughout)
        float* dec = Gl + gw; // the chunk's decay factor (one, or one per state row; 1 for no decay)
        __pipeline_wait_prior(1); // NS = 1: this chunk's W, Qg; NS = 2, 3: all of this chunk's operands
        __syncthreads();
        if (NS == 3) { // chunk ch + 2 into the buffer chunk ch - 1 has left, by the warps before the O tiles' (idle until
                       // the next barrier): no staging and no barrier for it at the chunk's end
            if (warp < ob && ch + 2 < hi) {
                use_stage((ch + 2 - lo) % 3);
                st_nt = 32 * ob;
                stage1(r0 + 2 * C);
                stage2(r0 + 2 * C);
                use_stage((ch - lo) % 3);
            }
            __pipeline_commit();
        }
        // O tile `warp - ob` starts as Qg Sb, in registers; Vt = W Sb on the warps counted from the other end
        bool own = outs && warp >= ob && warp - ob < mt * (BV / 16);
        int oi = (warp - ob) / (BV / 16), oj = (warp - ob) % (BV / 16);
        FragC oacc;
        if (own) {
            wmma::fill_fragment(oacc, 0.0f);
            mma_steps<FragB>(oacc, Qgs + 16 * oi * kp, kp, Sb + 16 * oj, 16 * SCAN_PADV(BV), SCAN_PADV(BV), kt);
        }
        for (int t = SCAN_WARPS_FWD - 1 - warp; t < mt * (BV / 16); t += SCAN_WARPS_FWD) {
            int i = t / (BV / 16), j = t % (BV / 16);
            FragC acc;
            wmma::fill_fragment(acc, 0.0f);
            mma_steps<FragB>(acc, Ws + 16 * i * kp, kp, Sb + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), kt);
            wmma::store_matrix_sync(Vt + 16 * i * SCAN_PADF(BV) + 16 * j, acc, SCAN_PADF(BV), wmma::mem_row_major);
        }
        if (NS == 1) { __pipeline_wait_prior(0); } // this chunk's U, G_last, Kd and P
        __syncthreads();
        if (NS == 1) {
            if (more) { stage1(r0 + C); } // W and Qg are free
            __pipeline_commit();
        }
        for (int e = threadIdx.x; e < C * BV / 8; e += blockDim.x) { // V' = U - W S, rounded once, 8 columns
            int i = e / (BV / 8), c = e % (BV / 8) * 8;
            uint4 o = vprime8(homog ? make_uint4(0, 0, 0, 0) : *(const uint4*)(Us + i * SCAN_PADV(BV) + c), Vt + i * SCAN_PADF(BV) + c);
            *(uint4*)(Vb + i * SCAN_PADV(BV) + c) = o;
            if (outs) { *(uint4*)(Vn + (r0 + i) * V + v0 + c) = o; }
        }
        for (int a = threadIdx.x; a < gw; a += blockDim.x) { dec[a] = cut ? 0.0f : s.gk ? expf(Gl[a]) : 1.0f; }
        if (gw > 1) { // channel decay: scale the rows of S here (a WMMA fragment does not say which row an element is)
            __syncthreads();
            for (int e = threadIdx.x; e < K * BV / 4; e += blockDim.x) {
                int a = e / (BV / 4), c = e % (BV / 4) * 4;
                float4* sp = (float4*)(S + a * SCAN_PADF(BV) + c);
                float4 x = *sp, f = make_float4(dec[a], dec[a], dec[a], dec[a]);
                *sp = make_float4(x.x * f.x, x.y * f.y, x.z * f.z, x.w * f.w);
            }
        }
        __syncthreads();
        // S = decay S + Kdᵀ V': (K x C)(C x BV), tiles (kt x NJ); the owning warp then rounds its tile into Sb and, if
        // another chunk follows, writes it as that chunk's hstate
        float fs = gw > 1 ? 1.0f : dec[0];
        for (int t = warp; t < kt * (BV / 16); t += SCAN_WARPS_FWD) {
            int i = t / (BV / 16), j = t % (BV / 16);
            FragC acc;
            wmma::load_matrix_sync(acc, S + 16 * i * SCAN_PADF(BV) + 16 * j, SCAN_PADF(BV), wmma::mem_row_major);
            for (int e = 0; e < acc.num_elements; e++) { acc.x[e] *= fs; }
            mma_steps_t(acc, Kds + 16 * i, kp, Vb + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), mt);
            wmma::store_matrix_sync(S + 16 * i * SCAN_PADF(BV) + 16 * j, acc, SCAN_PADF(BV), wmma::mem_row_major);
            __syncwarp();
            int a = 16 * i + tr, c = 16 * j + tc;
            uint4 o = round8_bf16(S + a * SCAN_PADF(BV) + c);
            *(uint4*)(Sb + a * SCAN_PADV(BV) + c) = o;
            if (outs && more) { *(uint4*)(hstate + ((q + 1) * K + a) * V + v0 + c) = o; }
        }
        if (own) { // O += P V' (P lower with diagonal: blocks k <= oi), rounded to bf16 through Vt (free until the
                   // next chunk's W S) and stored with 16-byte accesses
            mma_steps<FragB>(oacc, Ps + 16 * oi * lp, lp, Vb + 16 * oj, 16 * SCAN_PADV(BV), SCAN_PADV(BV), oi + 1);
            float* ot = Vt + 16 * oi * SCAN_PADF(BV) + 16 * oj;
            wmma::store_matrix_sync(ot, oacc, SCAN_PADF(BV), wmma::mem_row_major);
            __syncwarp();
            *(uint4*)(O + (r0 + 16 * oi + tr) * V + v0 + 16 * oj + tc) = round8_bf16(ot + tr * SCAN_PADF(BV) + tc);
        }
        if (NS != 3) {
            __syncthreads(); // U, Kd and P are free (NS = 2: the whole buffer)
            if (NS == 1 && more) { stage2(r0 + C); }
            if (NS == 2 && ch + 2 < hi) { stage1(r0 + 2 * C); stage2(r0 + 2 * C); } // the chunk after next, into this buffer
            __pipeline_commit();
        }
    }
    if (NS == 3) { __syncthreads(); } // every tile of S is stored (the loop's last barrier came before the update)
    if (S_final) {
        for (int e = threadIdx.x; e < K * BV; e += blockDim.x) {
            S_final[((long)blk * K + e / BV) * V + v0 + e % BV] = S[e / BV * SCAN_PADF(BV) + e % BV];
        }
    }
}

// The forward scan's V' and O made again for the backward from the kept chunk states (hstate is the bf16 state Sb
// each chunk started from) and the remade W, U, Qg, so they need not be kept per layer (2 x 64 MiB a layer at
// pgdn-340m 16 x 2048). Persistent blocks of NW warps walk work items (chunk, bw value columns), each staged into
// shared memory with 16-byte copies; with ns = 2 stage buffers the next item's copies run while this one computes.
// OutsPlan (bw, ns, NW) is the plan's choice (outs_plan_for); the kernel lab times the choices. The products
// (mma_steps), their order and the roundings are the forward scan's per 16 x 16 tile: V' = bf16(U - W Sb),
// O = bf16(Qg Sb + P V'), so both equal the forward's bit for bit (the kernel lab checks every choice).
#define OUTS_LDS 20 // a warp's fp32 tile scratch: 16 rows of 16 + 4 (16-byte rows for the 8-column reads)
struct OutsSmem { size_t w, qg, sb, u, p, stage, vb, scr, bytes; };
static __host__ __device__ OutsSmem outs_smem(int C, int K, OutsPlan o) {
    OutsSmem z;
    size_t m = scan_align((size_t)C * SCAN_PADK(K) * 2);
    z.w = 0; z.qg = m; z.sb = 2 * m;
    z.u = z.sb + scan_align((size_t)K * (o.bw + 8) * 2);
    z.p = z.u + scan_align((size_t)C * (o.bw + 8) * 2);
    z.stage = z.p + scan_align((size_t)C * (C + 8) * 2); // one stage buffer: W, Qg (C x K+8), Sb (K x bw+8), U (C x bw+8), P
    z.vb = o.ns * z.stage;                               // V' (C x bw+8), bf16: the B operand of P V'
    z.scr = z.vb + scan_align((size_t)C * (o.bw + 8) * 2);
    z.bytes = z.scr + (size_t)o.nw * 16 * OUTS_LDS * 4;
    return z;
}
template <int NW>
__global__ void __launch_bounds__(32 * NW) state_outputs_wmma_kernel(floatX* Vn, floatX* O, const floatX* hstate, const floatX* W,
                                                                    const floatX* U, const floatX* Qg, const floatX* P,
                                                                    ChunkShape s, OutsPlan op) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, bw = op.bw, kp = SCAN_PADK(K), lp = C + 8, vp = bw + 8, mt = C / 16, kt = K / 16;
    int nt = bw / 16, warp = threadIdx.x / 32, lane = threadIdx.x % 32, tr = lane / 2, tc = (lane % 2) * 8, parts = V / bw;
    OutsSmem z = outs_smem(C, K, op);
    __nv_bfloat16* Vb = (__nv_bfloat16*)(smem_raw + z.vb);                      // C x vp
    float* scr = (float*)(smem_raw + z.scr) + warp * 16 * OUTS_LDS;             // 16 x 20, this warp's
    long items = s.nq * parts;
    auto stage = [&](int b, long it) { // item it = (chunk q, columns v0 ..) into stage buffer b
        unsigned char* base = smem_raw + b * z.stage;
        long q = it / parts, r0 = q * C;
        int v0 = (int)(it % parts) * bw;
        stage_async(base + z.w, kp * 2, W + r0 * K, (long)K * 2, C, K * 2);
        stage_async(base + z.sb, vp * 2, hstate + q * K * V + v0, (long)V * 2, K, bw * 2);
        stage_async(base + z.u, vp * 2, U + r0 * V + v0, (long)V * 2, C, bw * 2);
        stage_async(base + z.qg, kp * 2, Qg + r0 * K, (long)K * 2, C, K * 2);
        stage_async(base + z.p, lp * 2, P + r0 * C, (long)C * 2, C, C * 2); // chunk q's P starts at q C C = r0 C
    };
    if (blockIdx.x < items) { stage(0, blockIdx.x); }
    __pipeline_commit();
    int b = 0;
    for (long it = blockIdx.x; it < items; it += gridDim.x) {
        long next = it + gridDim.x;
        if (op.ns == 2) { // the other buffer was freed by the last item's end
            if (next < items) { stage(b ^ 1, next); }
            __pipeline_commit();
            __pipeline_wait_prior(1); // this item's copies
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        unsigned char* base = smem_raw + b * z.stage;
        const __nv_bfloat16 *Ws = (const __nv_bfloat16*)(base + z.w), *Qgs = (const __nv_bfloat16*)(base + z.qg);
        const __nv_bfloat16 *Sb = (const __nv_bfloat16*)(base + z.sb), *Us = (const __nv_bfloat16*)(base + z.u);
        const __nv_bfloat16* Ps = (const __nv_bfloat16*)(base + z.p);
        long r0 = it / parts * C;
        int v0 = (int)(it % parts) * bw;
        for (int t = warp; t < mt * nt; t += NW) { // V' tiles
            int i = t / nt, j = t % nt;
            FragC acc;
            wmma::fill_fragment(acc, 0.0f);
            mma_steps<FragB>(acc, Ws + 16 * i * kp, kp, Sb + 16 * j, 16 * vp, vp, kt);
            wmma::store_matrix_sync(scr, acc, OUTS_LDS, wmma::mem_row_major);
            __syncwarp();
            int a = 16 * i + tr, c = 16 * j + tc;
            uint4 o = vprime8(*(const uint4*)(Us + a * vp + c), scr + tr * OUTS_LDS + tc);
            *(uint4*)(Vb + a * vp + c) = o;
            *(uint4*)(Vn + (r0 + a) * V + v0 + c) = o;
            __syncwarp(); // the scratch is read before the next tile's store
        }
        __syncthreads(); // every V' tile is in Vb
        for (int t = warp; t < mt * nt; t += NW) { // O tiles: Qg Sb, then P V' (P lower with diagonal: k <= oi)
            int oi = t / nt, oj = t % nt;
            FragC oacc;
            wmma::fill_fragment(oacc, 0.0f);
            mma_steps<FragB>(oacc, Qgs + 16 * oi * kp, kp, Sb + 16 * oj, 16 * vp, vp, kt);
            mma_steps<FragB>(oacc, Ps + 16 * oi * lp, lp, Vb + 16 * oj, 16 * vp, vp, oi + 1);
            wmma::store_matrix_sync(scr, oacc, OUTS_LDS, wmma::mem_row_major);
            __syncwarp();
            *(uint4*)(O + (r0 + 16 * oi + tr) * V + v0 + 16 * oj + tc) = round8_bf16(scr + tr * OUTS_LDS + tc);
            __syncwarp();
        }
        __syncthreads(); // this stage buffer and Vb are free
        if (op.ns == 2) { b ^= 1; }
        else {
            if (next < items) { stage(b, next); }
            __pipeline_commit();
        }
    }
}
// The remake's plan: OUTS_DEFAULT (bw 0 = all of V) where it fits, else the widest bw (V / n, a multiple of SCAN_BV)
// that does with the same warps, two stage buffers or else one (fewer, wider items copy W and Qg fewer times), else
// 32 columns, one stage, 8 warps; nw 0 if nothing fits. outs_force (the kernel lab): that choice where it fits.
// outs_grid_cap (the kernel lab): at most that many blocks, so that a small shape still has blocks that walk several
// work items (the prefetch and the buffers' reuse) under the lab's bit-for-bit check.
static const OutsPlan OUTS_DEFAULT = {0, 2, 16};
static OutsPlan outs_force = {0, 0, 0};
static int outs_grid_cap = 0;
static bool outs_fits(int C, int K, OutsPlan o) { return outs_smem(C, K, o).bytes + 1024 <= (size_t)smem_optin; }
static OutsPlan outs_plan_for(int C, int K, int V) {
    OutsPlan o = outs_force.nw ? outs_force : OUTS_DEFAULT;
    if (o.bw == 0) { o.bw = V; }
    if (outs_force.nw) {
        bool ok = o.bw > 0 && V % o.bw == 0 && o.bw % SCAN_BV == 0 && (o.ns == 1 || o.ns == 2) && (o.nw == 8 || o.nw == 16);
        return ok && outs_fits(C, K, o) ? o : OutsPlan{0, 0, 0};
    }
    for (int n = V / o.bw; n <= V / SCAN_BV; n++) {
        for (int ns = o.ns; ns >= 1; ns--) {
            OutsPlan t = {V / n, ns, o.nw};
            if (V % n == 0 && t.bw % SCAN_BV == 0 && outs_fits(C, K, t)) { return t; }
        }
    }
    OutsPlan t = {SCAN_BV, 1, 8};
    return outs_fits(C, K, t) ? t : OutsPlan{0, 0, 0};
}
static void state_outputs_wmma(floatX* Vn, floatX* O, const floatX* hstate, const floatX* W, const floatX* U, const floatX* Qg,
                               const floatX* P, const ChunkShape& s, OutsPlan op) {
    auto kernel = op.nw == 16 ? state_outputs_wmma_kernel<16> : state_outputs_wmma_kernel<8>;
    size_t sm = outs_smem(s.C, s.K, op).bytes;
    int per_sm = 0; // persistent blocks: as many as fit on the device at once
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * op.nw, sm));
    long items = s.nq * (s.V / op.bw);
    int grid = (int)std::min(items, (long)std::max(per_sm, 1) * num_sms);
    if (outs_grid_cap > 0) { grid = std::min(grid, outs_grid_cap); }
    kernel<<<grid, 32 * op.nw, sm, main_stream>>>(Vn, O, hstate, W, U, Qg, P, s, op);
    cudaCheck(cudaGetLastError());
}

// backward scan on tensor cores: dhstate[c] = dS; dV' = Pᵀ dO + Kd dS; dS = e^G_last ⊙ dS + Qgᵀ dO - Wᵀ dV'. The local
// part Pᵀ dO is made here from the staged P and dO slice (no batched GEMM and fp32 round trip before the scan); dO is
// double-buffered because the next chunk's copy starts while this chunk's dS update still reads it. With chunk groups
// (ScanGroups) the block walks its group's chunks down from dS_in (the gradient of the state after its last chunk; zero,
// or the identity with SCAN_IDENT) and leaves the gradient of the state before its first in dS0: per chunk
// dS <- Aᵀ dS + (Qgᵀ - Wᵀ Pᵀ) dO, the transpose of the forward's step.
// NS: the stage buffers (ScanStage), as in the forward.
template <int NS, int BV>
__global__ void __launch_bounds__(32 * SCAN_WARPS_BWD, 2) state_backward_wmma_kernel(floatX* dhstate, floatX* dVn, const floatX* P,
                                                                      const floatX* dO, const floatX* W, const floatX* Qg,
                                                                      const floatX* Kd, const float* G, const float* dS_in,
                                                                      float* dS0, ChunkShape s, ScanGroups sg) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1, kp = SCAN_PADK(K);
    int blk = blockIdx.y, bh = blk / sg.G, v0 = blockIdx.x * BV, warp = threadIdx.x / 32;
    int lo = blk % sg.G * sg.M, hi = min(s.NC, lo + sg.M); // this block's chunks, walked from hi - 1 down to lo
    bool outs = sg.mode & SCAN_OUT, homog = sg.mode & SCAN_HOMOG;
    unsigned char* p = smem_raw;
    float* dS = (float*)p;                   p += scan_align((size_t)K * SCAN_PADF(BV) * 4); // K x 36
    float* Vt = (float*)p;                   p += scan_align((size_t)C * SCAN_PADF(BV) * 4); // C x 36
    __nv_bfloat16* dSb = (__nv_bfloat16*)p;  p += scan_align((size_t)K * SCAN_PADV(BV) * 2); // K x 40
    __nv_bfloat16* Vb = (__nv_bfloat16*)p;   p += scan_align((size_t)C * SCAN_PADV(BV) * 2); // C x 40
    const ScanStage lay = scan_stage(C, K, gw, scan_nv(1, NS), BV);
    unsigned char* stages = p;               // NS x lay.bytes: staged W, Kd, Qg (C x kp), dO slice(s) (C x 40), P, G_last
    __nv_bfloat16 *Ws, *Kds, *Qgs, *Ps, *dOb;
    float* Gl;
    auto use_stage = [&](int b) {
        unsigned char* q = stages + (size_t)b * lay.bytes;
        Ws = (__nv_bfloat16*)(q + lay.w); Kds = (__nv_bfloat16*)(q + lay.kd); Qgs = (__nv_bfloat16*)(q + lay.qg);
        dOb = (__nv_bfloat16*)(q + lay.v); Ps = (__nv_bfloat16*)(q + lay.p); Gl = (float*)(q + lay.g);
    };
    int lp = C + 8;
    // NS = 1: the dO slice of chunk ch in slice ch % 2 of the one stage; NS = 2, 3: one slice per stage
    size_t dob = scan_align((size_t)C * SCAN_PADV(BV) * 2) / 2; // elements from one dO slice to the next
    auto dO_slot = [&](int ch) { return NS == 1 ? (ch % 2) * dob : (size_t)0; };
    for (int e = threadIdx.x; e < K * BV; e += blockDim.x) {
        int a = e / BV, c = e % BV;
        float x = (sg.mode & SCAN_IDENT) ? (a == v0 + c ? 1.0f : 0.0f) : dS_in ? dS_in[((long)blk * K + a) * V + v0 + c] : 0.0f;
        dS[a * SCAN_PADF(BV) + c] = x;
        dSb[a * SCAN_PADV(BV) + c] = __float2bfloat16(x);
    }
    // half 1 of a chunk: Kd, P, dO, G_last; half 2: Qg, W (P, dO and Qg only where dO is not zero), into the buffers
    // use_stage set, by threads st_tid of st_nt (the block; NS = 3: the warps idle in the chunk's first phase)
    int st_tid = threadIdx.x, st_nt = blockDim.x;
    auto stage1 = [&](long r, int ch) {
        stage_async(Kds, kp * 2, Kd + r * K, (long)K * 2, C, K * 2, st_tid, st_nt);
        if (!homog) {
            stage_async(Ps, lp * 2, P + r * C, (long)C * 2, C, C * 2, st_tid, st_nt); // chunk q's P starts at q C C = r C
            stage_async(dOb + dO_slot(ch), SCAN_PADV(BV) * 2, dO + r * V + v0, (long)V * 2, C, BV * 2, st_tid, st_nt);
        }
        if (s.gk) { stage_glast(Gl, G, r + C - 1, gw, st_tid, st_nt); }
    };
    auto stage2 = [&](long r) {
        if (!homog) { stage_async(Qgs, kp * 2, Qg + r * K, (long)K * 2, C, K * 2, st_tid, st_nt); }
        stage_async(Ws, kp * 2, W + r * K, (long)K * 2, C, K * 2, st_tid, st_nt);
    };
    long rl = ((long)bh * s.NC + hi - 1) * C;
    use_stage(0);
    stage1(rl, hi - 1);
    if (NS == 1) { __pipeline_commit(); }
    stage2(rl);
    __pipeline_commit();
    if (NS >= 2) { // and the whole chunk before it into buffer 1 (an empty group if there is none)
        use_stage(1);
        if (hi - 2 >= lo) { stage1(rl - C, hi - 2); stage2(rl - C); }
        __pipeline_commit();
    }
    int mt = C / 16, kt = K / 16, lane = threadIdx.x % 32;
    // as in the forward: the warp owning a 16 x 16 tile takes row lane / 2, columns (lane % 2) * 8 .. + 7 of it
    int tr = lane / 2, tc = (lane % 2) * 8;
    __syncthreads(); // dSb is complete
    for (int e = threadIdx.x; outs && e < K * BV / 8; e += blockDim.x) { // dhstate of the last chunk: the start
        int a = e / (BV / 8), c = e % (BV / 8) * 8;
        *(uint4*)(dhstate + (((long)bh * s.NC + hi - 1) * K + a) * V + v0 + c) = *(const uint4*)(dSb + a * SCAN_PADV(BV) + c);
    }
    for (int ch = hi - 1; ch >= lo; ch--) {
        long q = (long)bh * s.NC + ch, r0 = q * C;
        bool more = ch > lo, cut = chunk_cut(s, q); // as in the forward
        if (NS >= 2) { use_stage((hi - 1 - ch) % NS); }
        float* dec = Gl + gw; // the chunk's decay factor (one, or one per state row; 1 for no decay)
        const __nv_bfloat16* dOs = dOb + dO_slot(ch);
        __pipeline_wait_prior(1); // NS = 1: this chunk's Kd, P, dO, G_last; NS = 2, 3: all of this chunk's operands
        __syncthreads();
        if (NS == 3) { // chunk ch - 2 into the buffer chunk ch + 1 has left, by the warps after the dV' tiles' (idle until
                       // the next barrier): no staging and no barrier for it at the chunk's end
            int nb = mt * (BV / 16);
            if (warp >= nb && ch - 2 >= lo) {
                use_stage((hi + 1 - ch) % 3);
                st_tid = threadIdx.x - 32 * nb;
                st_nt = blockDim.x - 32 * nb;
                stage1(r0 - 2 * C, ch - 2);
                stage2(r0 - 2 * C);
                use_stage((hi - 1 - ch) % 3);
            }
            __pipeline_commit();
        }
        // dV' = Pᵀ dO + Kd dSb: (C x C)(C x BV) + (C x K)(K x BV); the owning warp rounds its tile into Vb and dVn
        for (int t = warp; t < mt * (BV / 16); t += SCAN_WARPS_BWD) {
            int i = t / (BV / 16), j = t % (BV / 16);
            FragC acc;
            wmma::fill_fragment(acc, 0.0f);
            if (!homog) { // P lower with diagonal: (Pᵀ)_ik nonzero for k >= i
                mma_steps_t(acc, Ps + 16 * i * lp + 16 * i, lp, dOs + 16 * i * SCAN_PADV(BV) + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), mt - i);
            }
            mma_steps<FragB>(acc, Kds + 16 * i * kp, kp, dSb + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), kt);
            wmma::store_matrix_sync(Vt + 16 * i * SCAN_PADF(BV) + 16 * j, acc, SCAN_PADF(BV), wmma::mem_row_major);
            __syncwarp();
            int row = 16 * i + tr, c = 16 * j + tc;
            uint4 o = round8_bf16(Vt + row * SCAN_PADF(BV) + c);
            *(uint4*)(Vb + row * SCAN_PADV(BV) + c) = o;
            if (outs) { *(uint4*)(dVn + (r0 + row) * V + v0 + c) = o; }
        }
        for (int a = threadIdx.x; a < gw; a += blockDim.x) { dec[a] = cut ? 0.0f : s.gk ? expf(Gl[a]) : 1.0f; }
        if (NS == 1) { __pipeline_wait_prior(0); } // this chunk's Qg, W
        __syncthreads();
        if (NS == 1) {
            if (more) { stage1(r0 - C, ch - 1); } // Kd, P, G_last and the other dO slice are free now
            __pipeline_commit();
        }
        if (gw > 1) { // channel decay: scale the rows of dS here (a WMMA fragment does not say which row an element is)
            for (int e = threadIdx.x; e < K * BV / 4; e += blockDim.x) {
                int a = e / (BV / 4), c = e % (BV / 4) * 4;
                float4* sp = (float4*)(dS + a * SCAN_PADF(BV) + c);
                float4 x = *sp;
                float f = dec[a];
                *sp = make_float4(x.x * f, x.y * f, x.z * f, x.w * f);
            }
            __syncthreads();
        }
        // dS = decay dS + Qgᵀ dO - Wᵀ dV': (K x C)(C x BV); the owning warp rounds its tile into dSb and, if an earlier
        // chunk follows, writes it as that chunk's dhstate
        float fs = gw > 1 ? 1.0f : dec[0];
        for (int t = warp; t < kt * (BV / 16); t += SCAN_WARPS_BWD) {
            int i = t / (BV / 16), j = t % (BV / 16);
            FragC acc, neg;
            wmma::load_matrix_sync(acc, dS + 16 * i * SCAN_PADF(BV) + 16 * j, SCAN_PADF(BV), wmma::mem_row_major);
            for (int e = 0; e < acc.num_elements; e++) { acc.x[e] *= fs; }
            wmma::fill_fragment(neg, 0.0f);
            if (!homog) { mma_steps_t(acc, Qgs + 16 * i, kp, dOs + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), mt); }
            mma_steps_t(neg, Ws + 16 * i, kp, Vb + 16 * j, 16 * SCAN_PADV(BV), SCAN_PADV(BV), mt);
            for (int e = 0; e < acc.num_elements; e++) { acc.x[e] -= neg.x[e]; }
            wmma::store_matrix_sync(dS + 16 * i * SCAN_PADF(BV) + 16 * j, acc, SCAN_PADF(BV), wmma::mem_row_major);
            __syncwarp();
            int a = 16 * i + tr, c = 16 * j + tc;
            uint4 o = round8_bf16(dS + a * SCAN_PADF(BV) + c);
            *(uint4*)(dSb + a * SCAN_PADV(BV) + c) = o;
            if (outs && more) { *(uint4*)(dhstate + ((q - 1) * K + a) * V + v0 + c) = o; }
        }
        if (NS != 3) {
            __syncthreads(); // Qg and W are free (NS = 2: the whole buffer)
            if (NS == 1 && more) { stage2(r0 - C); }
            if (NS == 2 && ch - 2 >= lo) { stage1(r0 - 2 * C, ch - 2); stage2(r0 - 2 * C); } // the chunk before the next
            __pipeline_commit();
        }
    }
    if (NS == 3) { __syncthreads(); } // every tile of dS is stored (the loop's last barrier came before the update)
    if (dS0) {
        for (int e = threadIdx.x; e < K * BV; e += blockDim.x) {
            dS0[((long)blk * K + e / BV) * V + v0 + e % BV] = dS[e / BV * SCAN_PADF(BV) + e % BV];
        }
    }
}

// The pass over the groups of a two-level scan: X starts as X0 (or zero) and moves one group at a time,
// X <- T[g] X + Bv[g] (T (K x K), Bv, X (K x V) fp32, indexed by bh * G + g); Xst[g] gets X before group g, X_end
// (optional) the X after the last. rev: the groups from the last to the first (the backward). A block per (bh, 32
// columns), fp32 throughout: G steps of a (K x K)(K x 32) product.
__global__ void scan_groups_combine_kernel(float* Xst, float* X_end, const float* T, const float* Bv, const float* X0, int G,
                                           int K, int V, int rev) {
    extern __shared__ float xs[]; // (K, SCAN_BV) X, then (K, SCAN_BV) the next X
    float* xn = xs + K * SCAN_BV;
    int bh = blockIdx.x, v0 = blockIdx.y * SCAN_BV;
    for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
        xs[e] = X0 ? X0[((long)bh * K + e / SCAN_BV) * V + v0 + e % SCAN_BV] : 0.0f;
    }
    __syncthreads();
    for (int i = 0; i < G; i++) {
        long blk = (long)bh * G + (rev ? G - 1 - i : i);
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            Xst[(blk * K + e / SCAN_BV) * V + v0 + e % SCAN_BV] = xs[e];
        }
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) {
            int a = e / SCAN_BV, c = e % SCAN_BV;
            const float* t = T + (blk * K + a) * K;
            float acc = Bv[(blk * K + a) * V + v0 + c];
            for (int b = 0; b < K; b++) { acc += t[b] * xs[b * SCAN_BV + c]; }
            xn[e] = acc;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < K * SCAN_BV; e += blockDim.x) { xs[e] = xn[e]; }
        __syncthreads();
    }
    for (int e = threadIdx.x; X_end && e < K * SCAN_BV; e += blockDim.x) {
        X_end[((long)bh * K + e / SCAN_BV) * V + v0 + e % SCAN_BV] = xs[e];
    }
}

// the scans' shared memory with ns stage buffers (ScanStage) and bv-column value slices; smem_scan_wmma: the larger
// direction's
static size_t smem_scan_wmma_dir(const ChunkShape& s, int backward, int ns, int bv) {
    int gw = s.gk ? s.gk : 1;
    return scan_fixed_bytes(s.C, s.K, bv) + ns * scan_stage(s.C, s.K, gw, scan_nv(backward, ns), bv).bytes;
}
static size_t smem_scan_wmma(const ChunkShape& s, int ns, int bv) {
    return std::max(smem_scan_wmma_dir(s, 0, ns, bv), smem_scan_wmma_dir(s, 1, ns, bv));
}
static int scan_force_simt = 0; // the kernel lab sets it to time and check the fp32 SIMT scans in the bf16 build
static bool scan_uses_wmma(const ChunkShape& s) {
    return !scan_force_simt && !mma_bad && s.K % 16 == 0 && s.C % 16 == 0 && s.V % SCAN_BV == 0 && (long)s.B * s.H <= 65535 &&
           smem_scan_wmma(s, 1, 32) + 1024 <= (size_t)smem_optin; // (b, h) is the grid's y; 16-column slices need less
}

// Channel-decay scores on tensor cores (bf16 build; the fp32 build keeps the exact FMA kernels above, which remain the
// reference for these). Same decomposition into 16-token sub-blocks, but the off-diagonal sub-block pairs (I > J) are
// bf16 WMMA products of pre-scaled rows, anchored where no factor exceeds 1:
//   rows side (dq, dk̂, and the forward): anchor f = the first token of I: k̂_I ⊙ e^(G_I - G_f), q̂_I ⊙ e^(G_I - G_f),
//     k̃_J ⊙ e^(G_f - G_J), and the row scale e^(G_i - G_f) after the product;
//   columns side (dk̃): anchor r = the last token of J: q̂_I ⊙ e^(G_I - G_r), k̂_I ⊙ e^(G_I - G_r), and the scale
//     e^(G_r - G_j) after the product (summed over I > J in the same accumulators: the scale depends on J only).
// The diagonal 16 x 16 blocks are exact in fp32: one exp per (i, j, channel) in the forward, the running products of
// the steps' decays in the backward (sc_diag_steps). Row strides are padded (bank conflicts);
// the three kernels fit two or three blocks per multiprocessor at K = 128.
// the lower-triangle pair (i, j), i >= j, with row-major index u = i (i + 1) / 2 + j (the tiles I >= J)
__device__ __forceinline__ int2 tri_pair(int u) {
    int i = 0;
    while ((i + 1) * (i + 2) / 2 <= u) { i++; }
    return make_int2(i, u - i * (i + 1) / 2);
}
#define SC_THREADS 256 // the three kernels' block: 8 warps, which their tile and row assignments count on
#define SC_LG(K) ((K) + 4) // fp32 G rows (16-byte multiples for cp.async)
#define SC_LK(K) ((K) + 8) // bf16 rows of K (WMMA operands: a multiple of 8)
#define SC_LC(C) ((C) + 8) // bf16 rows of C
#define SC_LO(K) ((K) + 4) // fp32 product tiles
struct ScoresSmem { size_t g, kt, qk, dpx, diag, sub, out, total; };
// byte sizes of the pieces; which kernel uses which is in the kernels
static __host__ __device__ ScoresSmem scores_tc_smem(int C, int K, int which) {
    ScoresSmem z;
    z.g = scan_align((size_t)C * SC_LG(K) * 4);
    z.kt = scan_align((size_t)C * SC_LK(K) * 2);
    z.qk = 2 * z.kt;                                           // q̂ and k̂ of the chunk (dk̃ kernel)
    z.dpx = 2 * scan_align((size_t)C * SC_LC(C) * 2);          // dP, dM in bf16
    z.diag = 2 * scan_align((size_t)C * SUB * 4);              // their diagonal blocks in fp32
    z.sub = scan_align((size_t)SUB * SC_LK(K) * 2);            // one 16-row bf16 operand
    z.out = scan_align((size_t)SUB * SC_LO(K) * 4);            // one 16 x K fp32 product
    if (which == 0) { z.total = z.g + z.kt + 3 * z.sub + 2 * scan_align((size_t)SUB * C * 4); }   // forward
    else if (which == 1) { z.total = z.g + z.kt + z.dpx + z.diag + z.sub + 2 * z.out + scan_align((size_t)2 * C * 4); } // dq, dk̂
    else { z.total = z.g + z.qk + z.dpx + z.diag + 2 * z.sub + z.out; }                          // dk̃
    return z;
}
// f(r, c) for every element of a rows x cols tile, spread over the block. Where the block is a whole number of rows
// (K = 64, 128, 256 on 256 threads) each thread keeps its column and steps down the rows, with no division per
// element (the general loop's e / cols, e % cols was 16-27% of these kernels' issue time, Nsight Compute, H200,
// 2026-12-03); the lanes of a warp then share a row, so per-row loop counts stay uniform within the warp.
template <typename F>
__device__ __forceinline__ void for_tile(int rows, int cols, F f) {
    int step = blockDim.x / cols;
    if (step * cols == (int)blockDim.x) {
        for (int r = threadIdx.x / cols, c = threadIdx.x % cols; r < rows; r += step) { f(r, c); }
    } else {
        for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) { f(e / cols, e % cols); }
    }
}
// chunk rows of G (fp32) and of a floatX tensor into padded shared rows: 16-byte cp.async copies, all in flight before
// the thread waits for them (a __syncthreads must still follow before other threads read them)
__device__ __forceinline__ void sc_stage_g(float* g_s, const float* G, long r0, int C, int K) {
    stage_async(g_s, SC_LG(K) * 4, G + r0 * K, (long)K * 4, C, K * 4);
    __pipeline_commit();
    __pipeline_wait_prior(0);
}
__device__ __forceinline__ void sc_stage_x(__nv_bfloat16* d, const floatX* X, long r0, int rows, int K) {
    stage_async(d, SC_LK(K) * 2, X + r0 * K, (long)K * 2, rows, K * 2);
    __pipeline_commit();
    __pipeline_wait_prior(0);
}
// dP (lower with diagonal) and dM = beta_i dA (strict lower): bf16 copies for the products, fp32 diagonal blocks
// (row i, column j - start of i's sub-block) for the exact part
// (for_tile's rows, SC_BATCH at a time with all their loads issued first: a row after another waiting for its own
// loads was 20-30% of the backward scores kernels' time, Nsight Compute, kda-340m, H200, 2026-12-03)
#define SC_BATCH 4
__device__ __forceinline__ void sc_stage_dpdm(__nv_bfloat16* dpx, __nv_bfloat16* dmx, float* dpd, float* dmd, const float* dP,
                                              const float* dA, const float* beta, const signed char* dc, long q, long r0,
                                              int C) {
    int lc = SC_LC(C);
    for (int e0 = threadIdx.x; e0 < C * C; e0 += SC_BATCH * blockDim.x) {
        float p[SC_BATCH], a[SC_BATCH], b[SC_BATCH];
        #pragma unroll
        for (int t = 0; t < SC_BATCH; t++) {
            int e = e0 + t * blockDim.x, i = e / C, j = e % C;
            bool in = e < C * C && (!dc || dc[i] == dc[j]); // documents: the forward's mask
            p[t] = in && j <= i ? dP[q * C * C + e] : 0.0f;
            a[t] = in && j < i ? dA[q * C * C + e] : 0.0f;
            b[t] = in ? beta[r0 + i] : 0.0f;
        }
        #pragma unroll
        for (int t = 0; t < SC_BATCH; t++) {
            int e = e0 + t * blockDim.x, i = e / C, j = e % C;
            if (e >= C * C) { break; }
            float vp = p[t], vm = j < i ? b[t] * a[t] : 0.0f;
            dpx[i * lc + j] = __float2bfloat16(vp);
            dmx[i * lc + j] = __float2bfloat16(vm);
            if (j / SUB == i / SUB) { dpd[i * SUB + j % SUB] = vp; dmd[i * SUB + j % SUB] = vm; }
        }
    }
}

__global__ void __launch_bounds__(SC_THREADS) scores_channel_tc_kernel(float* Mk, float* A, floatX* P, const floatX* Q, const floatX* Kh,
                                                               const floatX* Kt, const float* G, const float* beta, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, nb = C / SUB, lg = SC_LG(K), lk = SC_LK(K), warp = threadIdx.x / 32;
    ScoresSmem z = scores_tc_smem(C, K, 0);
    unsigned char* p = smem_raw;
    float* g_s = (float*)p;                  p += z.g;
    __nv_bfloat16* kt_s = (__nv_bfloat16*)p; p += z.kt;
    __nv_bfloat16* qI = (__nv_bfloat16*)p;   p += z.sub;   // q̂ rows of I, then scaled in place
    __nv_bfloat16* kI = (__nv_bfloat16*)p;   p += z.sub;   // k̂ rows of I, then scaled in place
    __nv_bfloat16* bh = (__nv_bfloat16*)p;   p += z.sub;   // k̃_J ⊙ e^(G_f - G_J)
    float* oM = (float*)p;                   p += scan_align((size_t)SUB * C * 4); // rows of I: Mk
    float* oP = (float*)p;                                                          // rows of I: P
    long q = blockIdx.x, r0 = q * C, o0 = q * C * C;
    const signed char* dc = chunk_docs(s, q);
    sc_stage_g(g_s, G, r0, C, K);
    sc_stage_x(kt_s, Kt, r0, C, K);
    for (int I = 0; I < nb; I++) {
        int f = I * SUB;
        __syncthreads(); // the previous I's rows are written out; qI, kI, oM, oP are free
        sc_stage_x(qI, Q, r0 + f, SUB, K);
        sc_stage_x(kI, Kh, r0 + f, SUB, K);
        for (int e = threadIdx.x; e < SUB * C; e += blockDim.x) {
            if (e % C >= f + SUB) { oM[e] = 0.0f; oP[e] = 0.0f; } // above the diagonal
        }
        __syncthreads();
        // the diagonal block, exact: the SUB (SUB + 1) / 2 pairs j <= i on as many consecutive threads (the lanes of
        // a thread per (i, j) above the diagonal idled through the channel loop: 40% of this kernel's issue time,
        // Nsight Compute, H200, 2026-12-03); the threads after them write the zeros above the diagonal
        static_assert(SUB * (SUB + 1) / 2 < SC_THREADS, "the diagonal's pairs, then the zeros above it");
        int np = SUB * (SUB + 1) / 2, t = threadIdx.x;
        if (t < np) {
            int2 ij = tri_pair(t);
            int i = ij.x, j = ij.y;
            float m = 0.0f, pp = 0.0f;
            const float* gi = g_s + (f + i) * lg;
            const float* gj = g_s + (f + j) * lg;
            for (int c = 0; c < K; c++) {
                float ex = __expf(gi[c] - gj[c]) * __bfloat162float(kt_s[(f + j) * lk + c]);
                m += __bfloat162float(kI[i * lk + c]) * ex;
                pp += __bfloat162float(qI[i * lk + c]) * ex;
            }
            oM[i * C + f + j] = j < i ? m : 0.0f;
            oP[i * C + f + j] = pp;
        } else {
            for (int e = t - np; e < SUB * SUB; e += blockDim.x - np) {
                int i = e / SUB, j = e % SUB;
                if (j > i) { oM[i * C + f + j] = 0.0f; oP[i * C + f + j] = 0.0f; }
            }
        }
        if (I > 0) {
        __syncthreads(); // the diagonal is done with the unscaled rows
        for_tile(SUB, K, [&](int i, int c) {
            float ex = __expf(g_s[(f + i) * lg + c] - g_s[f * lg + c]);
            qI[i * lk + c] = __float2bfloat16(__bfloat162float(qI[i * lk + c]) * ex);
            kI[i * lk + c] = __float2bfloat16(__bfloat162float(kI[i * lk + c]) * ex);
        });
        for (int J = 0; J < I; J++) {
            __syncthreads(); // the previous J's products are done with bh
            for_tile(SUB, K, [&](int j, int c) {
                int rj = J * SUB + j;
                bh[j * lk + c] = __float2bfloat16(__bfloat162float(kt_s[rj * lk + c]) * __expf(g_s[f * lg + c] - g_s[rj * lg + c]));
            });
            __syncthreads();
            if (warp < 2) { // warp 0: Mk_IJ = (k̂ scaled)(k̃ scaled)ᵀ, warp 1: P_IJ = (q̂ scaled)(k̃ scaled)ᵀ
                FragC acc;
                wmma::fill_fragment(acc, 0.0f);
                mma_steps<FragBT>(acc, warp == 0 ? kI : qI, lk, bh, 16, lk, K / 16);
                wmma::store_matrix_sync((warp == 0 ? oM : oP) + J * SUB, acc, C, wmma::mem_row_major);
            }
        }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < SUB * C; e += blockDim.x) {
            int row = f + e / C;
            long o = o0 + (long)row * C + e % C;
            bool cross = dc && dc[row] != dc[e % C]; // documents: no score across a boundary
            float m = cross ? 0.0f : oM[e];
            Mk[o] = m;
            A[o] = beta[r0 + row] * m;
            P[o] = fromf<floatX>(cross ? 0.0f : oP[e]);
        }
    }
}
// Scalar or no decay on tensor cores, the inverse included: per chunk K̂K̃ᵀ and Q̂K̃ᵀ (the lower 16 x 16 tiles, WMMA
// on rows staged with cp.async), the decay mask, then (I + A)^-1 in shared memory. Writes Mk, P and Tx; the unfused
// path (fp32 build) goes through Mraw, Praw and A in global memory and a separate inverse kernel.
#define SS_LD(C) ((C) + 4)
#define SS_THREADS 256
#define SS_TILES 3 // product tiles a warp holds (C <= 64: 2 x 10 tiles over 8 warps)
static_assert(2 * (GPU_CHUNK_MAX / 16) * (GPU_CHUNK_MAX / 16 + 1) / 2 <= SS_TILES * (SS_THREADS / 32), "scores_scalar_tc_kernel's tiles");
static __host__ __device__ size_t smem_scores_scalar_tc(int C, int K) {
    size_t ab = scan_align((size_t)C * SCAN_PADK(K) * 2), fb = scan_align((size_t)C * SS_LD(C) * 4);
    return (ab > fb ? 3 * ab : 3 * fb) + 2 * (size_t)C * 4; // the staged rows, then the fp32 tiles over them
}
template <bool DOC> // documents (s.doc); without, their masks vanish at compile time (~4% of this kernel)
__global__ void __launch_bounds__(SS_THREADS) scores_scalar_tc_kernel(float* Mk, floatX* P, floatX* Tx, const floatX* Q, const floatX* Kh,
                                                              const floatX* Kt, const float* G, const float* beta, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, kp = SCAN_PADK(K), ld = SS_LD(C), nb = C / 16, warp = threadIdx.x / 32;
    // the staged q̂, k̂, k̃ and the fp32 tiles made from them share one region: the products stay in registers until
    // every warp is done reading the staged rows (a third of the shared memory: more blocks per multiprocessor)
    size_t ab = scan_align((size_t)C * kp * 2), fb = scan_align((size_t)C * ld * 4);
    unsigned char* p = smem_raw;
    __nv_bfloat16* Qs = (__nv_bfloat16*)p;        // C x kp staged q̂
    __nv_bfloat16* Khs = (__nv_bfloat16*)(p + ab); // C x kp staged k̂
    __nv_bfloat16* Kts = (__nv_bfloat16*)(p + 2 * ab); // C x kp staged k̃
    float* Ms = (float*)p;                        // C x ld K̂K̃ᵀ, then A = diag(beta) Mk (over the staged rows)
    float* Ps = (float*)(p + fb);                 // C x ld Q̂K̃ᵀ, then the inverse
    float* Rs = (float*)(p + 2 * fb);             // C x ld the inverse's scratch
    float* gs = (float*)(p + (ab > fb ? 3 * ab : 3 * fb)); // C: G of the chunk
    float* bs = gs + C;                                 // C: beta
    long q = blockIdx.x, r0 = q * C, o0 = q * C * C;
    stage_async(Qs, kp * 2, Q + r0 * K, (long)K * 2, C, K * 2);
    stage_async(Khs, kp * 2, Kh + r0 * K, (long)K * 2, C, K * 2);
    stage_async(Kts, kp * 2, Kt + r0 * K, (long)K * 2, C, K * 2);
    __pipeline_commit();
    for (int i = threadIdx.x; i < C; i += blockDim.x) { gs[i] = s.gk ? G[r0 + i] : 0.0f; bs[i] = beta[r0 + i]; }
    __pipeline_wait_prior(0);
    __syncthreads();
    int nt = nb * (nb + 1) / 2, nw = SS_THREADS / 32; // tiles I >= J of each product
    FragC acc[SS_TILES];
    #pragma unroll
    for (int k = 0; k < SS_TILES; k++) {
        int t = warp + k * nw;
        if (t >= 2 * nt) { continue; }
        int2 ij = tri_pair(t % nt);
        int I = ij.x, J = ij.y;
        wmma::fill_fragment(acc[k], 0.0f);
        mma_steps<FragBT>(acc[k], (t < nt ? Khs : Qs) + 16 * I * kp, kp, Kts + 16 * J * kp, 16, kp, K / 16);
    }
    __syncthreads(); // the staged rows are dead: their region takes the tiles
    #pragma unroll
    for (int k = 0; k < SS_TILES; k++) {
        int t = warp + k * nw;
        if (t >= 2 * nt) { continue; }
        int2 ij = tri_pair(t % nt);
        int I = ij.x, J = ij.y;
        wmma::store_matrix_sync((t < nt ? Ms : Ps) + 16 * I * ld + 16 * J, acc[k], ld, wmma::mem_row_major);
    }
    __syncthreads();
    const signed char* dc = DOC ? chunk_docs(s, q) : nullptr;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) { // only j <= i was computed; nothing above is read
        int i = e / C, j = e % C;
        float E = (s.gk && j <= i) ? expf(gs[i] - gs[j]) : 1.0f; // never above the diagonal: overflow
        if (dc && dc[i] != dc[j]) { E = 0.0f; } // documents: no score across a boundary
        float m = j < i ? Ms[i * ld + j] * E : 0.0f;
        if (Mk) { Mk[o0 + e] = m; } // the trainer's backward makes it again (bwd_scores_scalar_tc_kernel)
        P[o0 + e] = fromf<floatX>(j <= i ? Ps[i * ld + j] * E : 0.0f);
        Ms[i * ld + j] = bs[i] * m; // in place: each element is read and written by its own thread
    }
    __syncthreads();
    tri_inverse_smem(Ps, Rs, Ms, C, ld);
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) { Tx[o0 + e] = fromf<floatX>(Ps[(e / C) * ld + e % C]); }
}

// Its backward on tensor cores: the masked dPm = dP ⊙ E (lower with diagonal) and dMm = beta_i dA ⊙ E (strictly
// lower) in bf16 shared memory (as the unfused path rounds them for its GEMMs), dbetaA_i = Σ_j dA_ij Mk_ij, then
// dq_s = dPm K̃, dk̂_s = dMm K̃, dk̃_s = dPmᵀ Q̂ + dMmᵀ K̂ as WMMA tiles over the nonzero blocks, stored straight to
// global memory. Replaces the mask kernel and four batched GEMMs with their bf16 round trips. Mk is made again here
// from the staged k̂, k̃ with the forward's products and mask (bit for bit), not kept per layer (64 MiB a layer at
// pgdn-340m 16 x 2048).
#define SB_LC(C) ((C) + 8)
static __host__ __device__ size_t smem_bwd_scores_scalar_tc(int C, int K) {
    return 3 * scan_align((size_t)C * SCAN_PADK(K) * 2) + 2 * scan_align((size_t)C * SB_LC(C) * 2) +
           scan_align((size_t)C * SS_LD(C) * 4) + (size_t)C * 4;
}
template <bool DOC> // as scores_scalar_tc_kernel
__global__ void __launch_bounds__(256) bwd_scores_scalar_tc_kernel(float* dq_s, float* dkh_s, float* dkt_s, float* dbetaA,
                                                                  const float* dP, const float* dA,
                                                                  const floatX* Q, const floatX* Kh, const floatX* Kt,
                                                                  const float* G, const float* beta, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, kp = SCAN_PADK(K), lc = SB_LC(C), ld = SS_LD(C), nb = C / 16, kt = K / 16;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    unsigned char* p = smem_raw;
    __nv_bfloat16* Qs = (__nv_bfloat16*)p;  p += scan_align((size_t)C * kp * 2);  // C x kp staged q̂
    __nv_bfloat16* Khs = (__nv_bfloat16*)p; p += scan_align((size_t)C * kp * 2);  // C x kp staged k̂
    __nv_bfloat16* Kts = (__nv_bfloat16*)p; p += scan_align((size_t)C * kp * 2);  // C x kp staged k̃
    __nv_bfloat16* dPx = (__nv_bfloat16*)p; p += scan_align((size_t)C * lc * 2);  // C x lc dPm
    __nv_bfloat16* dMx = (__nv_bfloat16*)p; p += scan_align((size_t)C * lc * 2);  // C x lc dMm
    float* Ms = (float*)p;                  p += scan_align((size_t)C * ld * 4);  // C x ld K̂K̃ᵀ (lower tiles)
    float* gs = (float*)p;                                                        // C: G of the chunk
    long q = blockIdx.x, r0 = q * C, o0 = q * C * C;
    stage_async(Qs, kp * 2, Q + r0 * K, (long)K * 2, C, K * 2);
    stage_async(Khs, kp * 2, Kh + r0 * K, (long)K * 2, C, K * 2);
    stage_async(Kts, kp * 2, Kt + r0 * K, (long)K * 2, C, K * 2);
    __pipeline_commit();
    for (int i = threadIdx.x; i < C; i += blockDim.x) { gs[i] = s.gk ? G[r0 + i] : 0.0f; }
    __pipeline_wait_prior(0);
    __syncthreads();
    int nlow = nb * (nb + 1) / 2; // K̂K̃ᵀ's tiles I >= J, as scores_scalar_tc_kernel makes them
    for (int t = warp; t < nlow; t += nw) {
        int2 ij = tri_pair(t);
        int I = ij.x, J = ij.y;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, Khs + 16 * I * kp, kp, Kts + 16 * J * kp, 16, kp, kt);
        wmma::store_matrix_sync(Ms + 16 * I * ld + 16 * J, acc, ld, wmma::mem_row_major);
    }
    __syncthreads();
    const signed char* dc = DOC ? chunk_docs(s, q) : nullptr;
    for (int i = warp; i < C; i += nw) { // a warp per row, lanes over j: the same order of the dbetaA sum as the mask kernel
        float b = beta[r0 + i], db = 0.0f;
        for (int j = lane; j < C; j += 32) {
            long e = o0 + (long)i * C + j;
            float E = (s.gk && j <= i) ? expf(gs[i] - gs[j]) : 1.0f; // never above the diagonal: overflow
            if (dc && dc[i] != dc[j]) { E = 0.0f; } // documents: the forward's mask
            dPx[i * lc + j] = __float2bfloat16(j <= i ? dP[e] * E : 0.0f);
            float da = j < i ? dA[e] : 0.0f;
            float mk = j < i ? Ms[i * ld + j] * E : 0.0f; // the forward's Mk (only tiles I >= J were made)
            db += da * mk;
            dMx[i * lc + j] = __float2bfloat16(b * da * E);
        }
        db = warp_sum(db);
        if (lane == 0) { dbetaA[r0 + i] = db; }
    }
    __syncthreads();
    int ntile = nb * kt; // output tiles (16 rows x 16 channels) of each of the three products
    for (int t = warp; t < 3 * ntile; t += nw) {
        int which = t / ntile, I = (t % ntile) / kt, n = t % kt;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        if (which < 2) { // dq_s = dPm K̃ or dk̂_s = dMm K̃: row block I needs column blocks J <= I
            const __nv_bfloat16* Dx = which == 0 ? dPx : dMx;
            mma_steps<FragB>(acc, Dx + 16 * I * lc, lc, Kts + 16 * n, 16 * kp, kp, I + 1);
            wmma::store_matrix_sync((which == 0 ? dq_s : dkh_s) + (r0 + 16 * I) * K + 16 * n, acc, K, wmma::mem_row_major);
        } else { // dk̃_s = dPmᵀ Q̂ + dMmᵀ K̂: row block I of the output takes the blocks (J, I), J >= I, transposed
            for (int J = I; J < nb; J++) { // one step each, alternating, in the order of the sums
                mma_steps_t(acc, dPx + 16 * J * lc + 16 * I, lc, Qs + 16 * J * kp + 16 * n, 0, kp, 1);
                mma_steps_t(acc, dMx + 16 * J * lc + 16 * I, lc, Khs + 16 * J * kp + 16 * n, 0, kp, 1);
            }
            wmma::store_matrix_sync(dkt_s + (r0 + 16 * I) * K + 16 * n, acc, K, wmma::mem_row_major);
        }
    }
}

// The backward's exact diagonal blocks: a thread per channel walks each of its rows (or columns) along the block with
// e^(G_i - G_j) as the running product of the steps' decays e^(G_t - G_t-1) <= 1, an exp a step and channel instead of
// one a (i, j, channel), with the chunk's k̃ (or q̂, k̂) in registers instead of a shared load a pair: the exps and
// loads a pair were ~40% of these kernels (README, the fifth session's profile); H100, 2026-12-07: kda-340m +2.0%,
// pkda +1.9% end to end. The product's rounding (<= 15 factors, each within a few ulp) is of the order of the exp of
// a difference of cumsums it replaces (~1e-6 relative). The forward's sums over the channels stay a thread per pair:
// a thread per (row, channels) with running products and a reduction over the row's lanes made it 7.5% slower
// (results/kdadiag_2026-12-07_h100).
// R threads a channel, each taking the rows i ≡ its part (mod R): 256 / K of them (2 at K = 128; K <= 256).
__device__ __forceinline__ int sc_diag_parts(int K) { return K < SC_THREADS ? SC_THREADS / K : 1; }
// dcy[t] = e^(G_f+t - G_f+t-1) for t >= 1, dcy[0] = 1, from the column g (row stride lg) of the block's first row f
__device__ __forceinline__ void sc_diag_steps(float* dcy, const float* g, int lg) {
    float prev = g[0];
    dcy[0] = 1.0f;
    #pragma unroll
    for (int t = 1; t < SUB; t++) {
        float cur = g[t * lg];
        dcy[t] = __expf(cur - prev);
        prev = cur;
    }
}
// the entries 0 .. i of a 16-float shared row (16-byte aligned) into registers, four at a time
template <int N> __device__ __forceinline__ void sc_diag_row(float* d, const float* row, int i) {
    #pragma unroll
    for (int t = 0; t < N / 4; t++) {
        if (4 * t > i) { break; }
        float4 v = ((const float4*)row)[t];
        d[4 * t] = v.x; d[4 * t + 1] = v.y; d[4 * t + 2] = v.z; d[4 * t + 3] = v.w;
    }
}

// backward, rows side: dq_s_i = Σ_{j<=i} dP_ij k̃_j ⊙ e^(G_i - G_j), dk̂_s_i = Σ_{j<i} dM_ij k̃_j ⊙ e^(G_i - G_j) (dM = beta dA),
// and dbetaA_i = Σ_j dA_ij Mk_ij. Each warp owns output tiles n = warp, warp + 8 (K <= 256) across the J loop.
// FIN (MixerPlan.scores_fin): also the finish's rows side (bwd_finish_kernel's formulas), so that dq_s, dk̂_s and
// dbetaA never reach device memory: dq_s, dkh_s, dbetaA then receive dq = dQg ⊙ e^G + dq_s, dk̂ = beta dX ⊙ e^G +
// dk̂_s (without dk̃: the columns side adds it where k̃ = k̂) and dbeta = Σ_c dX ⊙ k̂ e^G + Σ_v dY ⊙ v + dbetaA; gc the
// rows' part of dG, q̂ ⊙ dq + k̂ ⊙ dk̂, for the columns side; dv = beta dY. Without FIN those pointers are unused.
template <bool FIN>
__global__ void __launch_bounds__(SC_THREADS) scores_channel_dq_tc_kernel(float* dq_s, float* dkh_s, float* dbetaA, float* gc, float* dv,
                                                                  const float* dP, const float* dA, const float* Mk, const floatX* Kt,
                                                                  const float* G, const float* beta, const float* dQg,
                                                                  const float* dX, const float* dY, const floatX* Q,
                                                                  const floatX* Kh, const floatX* Vv, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, nb = C / SUB, lg = SC_LG(K), lk = SC_LK(K), lc = SC_LC(C), lo = SC_LO(K), nt = K / 16;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    ScoresSmem z = scores_tc_smem(C, K, 1);
    unsigned char* p = smem_raw;
    float* g_s = (float*)p;                  p += z.g;
    __nv_bfloat16* kt_s = (__nv_bfloat16*)p; p += z.kt;
    __nv_bfloat16* dpx = (__nv_bfloat16*)p;  p += z.dpx / 2;
    __nv_bfloat16* dmx = (__nv_bfloat16*)p;  p += z.dpx / 2;
    float* dpd = (float*)p;                  p += z.diag / 2;
    float* dmd = (float*)p;                  p += z.diag / 2;
    __nv_bfloat16* bh = (__nv_bfloat16*)p;   p += z.sub;
    float* oq = (float*)p;                   p += z.out;
    float* ok = (float*)p;                   p += z.out;
    float* dba = (float*)p;                  // FIN: C rows of dbetaA, then C rows of Σ_v dY ⊙ v
    float* dyv = dba + C;
    float* rp = (float*)bh;                  // FIN: the rows' partial sums of dbeta, SUB x K / 4 (bh is free then)
    long q = blockIdx.x, r0 = q * C;
    const signed char* dc = chunk_docs(s, q);
    sc_stage_g(g_s, G, r0, C, K);
    sc_stage_x(kt_s, Kt, r0, C, K);
    sc_stage_dpdm(dpx, dmx, dpd, dmd, dP, dA, beta, dc, q, r0, C);
    for (int i0 = warp; i0 < C; i0 += 8 * SC_BATCH) { // dbetaA, a warp per row, SC_BATCH rows' loads in flight
        float da[SC_BATCH][2], mk[SC_BATCH][2];
        static_assert(GPU_CHUNK_MAX <= 64, "dbetaA's rows are read as two 32-column halves");
        #pragma unroll
        for (int t = 0; t < SC_BATCH; t++) { // j = lane, lane + 32
            int i = i0 + 8 * t;
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int j = lane + 32 * h;
                bool in = i < C && j < i;
                da[t][h] = in ? dA[q * C * C + (long)i * C + j] : 0.0f;
                mk[t][h] = in ? Mk[q * C * C + (long)i * C + j] : 0.0f;
            }
        }
        #pragma unroll
        for (int t = 0; t < SC_BATCH; t++) {
            int i = i0 + 8 * t;
            float db = 0.0f;
            #pragma unroll
            for (int h = 0; h < 2; h++) { if (lane + 32 * h < i) { db += da[t][h] * mk[t][h]; } }
            db = warp_sum(db);
            if (lane == 0 && i < C) {
                if (FIN) { dba[i] = db; } else { dbetaA[r0 + i] = db; }
            }
        }
    }
    if (FIN) { // dv = beta dY and Σ_v dY ⊙ v, a warp per row, four columns a lane, SC_BATCH rows' loads in flight
        for (int i0 = warp; i0 < C; i0 += 8 * SC_BATCH) {
            float acc[SC_BATCH];
            #pragma unroll
            for (int t = 0; t < SC_BATCH; t++) { acc[t] = 0.0f; }
            for (int v = 4 * lane; v < V; v += 128) { // one pass at V = 128
                float4 y[SC_BATCH];
                XV<4> x[SC_BATCH];
                #pragma unroll
                for (int t = 0; t < SC_BATCH; t++) {
                    long o = (r0 + min(i0 + 8 * t, C - 1)) * V + v; // rows past C: a valid row, not used
                    y[t] = *(const float4*)(dY + o);
                    x[t] = *(const XV<4>*)(Vv + o);
                }
                #pragma unroll
                for (int t = 0; t < SC_BATCH; t++) {
                    int i = i0 + 8 * t;
                    if (i >= C) { break; }
                    float b = beta[r0 + i];
                    *(float4*)(dv + (r0 + i) * V + v) = make_float4(b * y[t].x, b * y[t].y, b * y[t].z, b * y[t].w);
                    acc[t] += y[t].x * tof(x[t].v[0]) + y[t].y * tof(x[t].v[1]) + y[t].z * tof(x[t].v[2]) + y[t].w * tof(x[t].v[3]);
                }
            }
            #pragma unroll
            for (int t = 0; t < SC_BATCH; t++) { // i0 + 8 t is the same for the whole warp: every lane shuffles
                float r = warp_sum(acc[t]);
                if (lane == 0 && i0 + 8 * t < C) { dyv[i0 + 8 * t] = r; }
            }
        }
    }
    for (int I = 0; I < nb; I++) {
        int f = I * SUB;
        FragC accq[2], acck[2];
        for (int t = 0; t < 2; t++) { wmma::fill_fragment(accq[t], 0.0f); wmma::fill_fragment(acck[t], 0.0f); }
        for (int J = 0; J < I; J++) {
            __syncthreads(); // bh is free (and, the first time, the staging above is complete)
            for_tile(SUB, K, [&](int j, int c) {
                int rj = J * SUB + j;
                bh[j * lk + c] = __float2bfloat16(__bfloat162float(kt_s[rj * lk + c]) * __expf(g_s[f * lg + c] - g_s[rj * lg + c]));
            });
            __syncthreads();
            for (int t = 0; t < 2; t++) {
                int n = warp + 8 * t;
                if (n >= nt) { break; }
                mma_steps<FragB>(accq[t], dpx + f * lc + J * SUB, lc, bh + 16 * n, 0, lk, 1);
                mma_steps<FragB>(acck[t], dmx + f * lc + J * SUB, lc, bh + 16 * n, 0, lk, 1);
            }
        }
        __syncthreads(); // oq, ok (and with FIN rp = bh) are free; the staging is complete (I = 0)
        for (int t = 0; t < 2; t++) {
            int n = warp + 8 * t;
            if (n >= nt) { break; }
            wmma::store_matrix_sync(oq + 16 * n, accq[t], lo, wmma::mem_row_major);
            wmma::store_matrix_sync(ok + 16 * n, acck[t], lo, wmma::mem_row_major);
        }
        __syncthreads();
        // the diagonal block, exact, plus the scaled products: a thread per channel c and rows i ≡ pr (mod R)
        int R = sc_diag_parts(K), c = threadIdx.x % K, pr = threadIdx.x / K;
        if (pr < R) {
            float dcy[SUB], kv[SUB]; // the rows' step decays e^(G_t - G_t-1) (dcy[0] = 1) and k̃ in this channel
            sc_diag_steps(dcy, g_s + f * lg + c, lg);
            #pragma unroll
            for (int t = 0; t < SUB; t++) { kv[t] = __bfloat162float(kt_s[(f + t) * lk + c]); }
            #pragma unroll
            for (int i = 0; i < SUB; i++) {
                if (i % R != pr) { continue; }
                float pd[SUB], pm[SUB], aq = 0.0f, ak = 0.0f, e = 1.0f;
                sc_diag_row<SUB>(pd, dpd + (f + i) * SUB, i);
                sc_diag_row<SUB>(pm, dmd + (f + i) * SUB, i);
                #pragma unroll
                for (int j = i; j >= 0; j--) { // e = e^(G_i - G_j), walking j down
                    float x = e * kv[j];
                    aq += pd[j] * x;
                    ak += pm[j] * x;
                    e *= dcy[j];
                }
                // e = e^(G_i - G_f): the products' row scale. FIN: the sums stay in place for the finish below
                if (FIN) {
                    oq[i * lo + c] = aq + e * oq[i * lo + c];
                    ok[i * lo + c] = ak + e * ok[i * lo + c];
                } else {
                    long idx = (r0 + f + i) * K + c;
                    dq_s[idx] = aq + e * oq[i * lo + c];
                    dkh_s[idx] = ak + e * ok[i * lo + c];
                }
            }
        }
        if (FIN) { // the finish's rows side for the SUB rows, four channels a thread, then dbeta a warp per row
            __syncthreads();
            int k4 = K / 4;
            for (int e = threadIdx.x; e < SUB * k4; e += blockDim.x) {
                int i = e / k4, c0 = 4 * (e % k4), row = f + i;
                long idx = (r0 + row) * K + c0;
                float b = beta[r0 + row], bsum = 0.0f;
                bool sees = !dc || dc[row] < 0; // documents: the forward's mask on e^G (S's rows)
                float4 vq = *(const float4*)(dQg + idx), vx = *(const float4*)(dX + idx);
                XV<4> xq = *(const XV<4>*)(Q + idx), xk = *(const XV<4>*)(Kh + idx);
                float gq[4] = {vq.x, vq.y, vq.z, vq.w}, gx[4] = {vx.x, vx.y, vx.z, vx.w}, oqv[4], okv[4], ogc[4];
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    float eg = sees ? expf(g_s[row * lg + c0 + u]) : 0.0f;
                    float qv = tof(xq.v[u]), khv = tof(xk.v[u]);
                    float dqv = gq[u] * eg + oq[i * lo + c0 + u];
                    float dkhv = b * gx[u] * eg + ok[i * lo + c0 + u];
                    oqv[u] = dqv;
                    okv[u] = dkhv;
                    ogc[u] = qv * dqv + khv * dkhv;
                    bsum += gx[u] * khv * eg; // dbeta: Σ_c dX ⊙ k̂ e^G
                }
                *(float4*)(dq_s + idx) = make_float4(oqv[0], oqv[1], oqv[2], oqv[3]);
                *(float4*)(dkh_s + idx) = make_float4(okv[0], okv[1], okv[2], okv[3]);
                *(float4*)(gc + idx) = make_float4(ogc[0], ogc[1], ogc[2], ogc[3]);
                rp[e] = bsum;
            }
            __syncthreads();
            for (int i = warp; i < SUB; i += SC_THREADS / 32) {
                float t = 0.0f;
                for (int k = lane; k < k4; k += 32) { t += rp[i * k4 + k]; }
                t = warp_sum(t);
                if (lane == 0) { dbetaA[r0 + f + i] = t + dyv[f + i] + dba[f + i]; }
            }
        }
    }
}

// backward, columns side: dk̃_s_j = Σ_{i>=j} (dP_ij q̂_i + dM_ij k̂_i) ⊙ e^(G_i - G_j)
// FIN (MixerPlan.scores_fin): also the rest of the finish, after the rows side's kernel (gc, dkh from it): dk̃ = dk̃_s +
// dKd ⊙ exp(G_n - G) into dkt_s (or, fold_kt, added to dkh), and dg = the reverse cumsum over the chunk of
// dG = gc - k̃ ⊙ dk̃, from the last row's term Σ_j k̃_j ⊙ dKd_j exp(G_n - G_j) + e^G_n ⊙ Σ_v dS ⊙ S. The column blocks
// run from the last to the first, so the cumsum walks down with them.
template <bool FIN>
__global__ void __launch_bounds__(SC_THREADS) scores_channel_dkt_tc_kernel(float* dkt_s, float* dkh, float* dg, const float* dP,
                                                                   const float* dA, const floatX* Q, const floatX* Kh,
                                                                   const float* G, const float* beta, const float* gc,
                                                                   const float* dKd, const floatX* Kt, const floatX* hstate,
                                                                   const floatX* dhstate, int fold_kt, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, nb = C / SUB, lg = SC_LG(K), lk = SC_LK(K), lc = SC_LC(C), lo = SC_LO(K), nt = K / 16, n1 = C - 1;
    int warp = threadIdx.x / 32;
    ScoresSmem z = scores_tc_smem(C, K, 2);
    unsigned char* p = smem_raw;
    float* g_s = (float*)p;                  p += z.g;
    __nv_bfloat16* q_s = (__nv_bfloat16*)p;  p += z.kt;
    __nv_bfloat16* kh_s = (__nv_bfloat16*)p; p += z.kt;
    __nv_bfloat16* dpx = (__nv_bfloat16*)p;  p += z.dpx / 2;
    __nv_bfloat16* dmx = (__nv_bfloat16*)p;  p += z.dpx / 2;
    float* dpd = (float*)p;                  p += z.diag / 2;
    float* dmd = (float*)p;                  p += z.diag / 2;
    __nv_bfloat16* qh = (__nv_bfloat16*)p;   p += z.sub;
    __nv_bfloat16* khh = (__nv_bfloat16*)p;  p += z.sub;
    float* ot = (float*)p;
    long q = blockIdx.x, r0 = q * C;
    const signed char* dc = chunk_docs(s, q);
    sc_stage_g(g_s, G, r0, C, K);
    sc_stage_x(q_s, Q, r0, C, K);
    sc_stage_x(kh_s, Kh, r0, C, K);
    sc_stage_dpdm(dpx, dmx, dpd, dmd, dP, dA, beta, dc, q, r0, C);
    float dgacc = 0.0f; // FIN, threads c < K: dg of channel c at the row below the current one
    if (FIN) { // the last row's term per channel, before the column blocks (qh, ot are free until the first of them)
        float* ex = ot;         // R x K: the parts of Σ_j k̃_j ⊙ dKd_j exp(G_n - G_j), rows j ≡ part (mod R)
        float* hs = (float*)qh; // K: Σ_v dS ⊙ S
        __syncthreads(); // g_s
        int R = sc_diag_parts(K), c = threadIdx.x % K, pr = threadIdx.x / K;
        if (pr < R) {
            float kx = 0.0f, gn = g_s[n1 * lg + c];
            #pragma unroll 8
            for (int j = pr; j < C; j += R) {
                long idx = (r0 + j) * K + c;
                bool last = !dc || dc[j] == dc[n1]; // documents: the forward's mask on exp(G_n - G) (Kd's rows)
                float ed = last ? expf(gn - g_s[j * lg + c]) : 0.0f;
                kx += tof(Kt[idx]) * (dKd[idx] * ed);
            }
            ex[pr * K + c] = kx;
        }
        state_row_sums<4>(hs, hstate, dhstate, q, K, s.V);
        __syncthreads();
        if (threadIdx.x < K) {
            bool cut = dc && dc[n1] >= 0; // documents: S reached the next chunk only without a boundary in this one
            float kx = 0.0f;
            for (int t = 0; t < R; t++) { kx += ex[t * K + threadIdx.x]; }
            dgacc = kx + (cut ? 0.0f : expf(g_s[n1 * lg + threadIdx.x])) * hs[threadIdx.x];
        }
    }
    for (int J = nb - 1; J >= 0; J--) {
        int r = J * SUB + SUB - 1;
        FragC acc[2];
        for (int t = 0; t < 2; t++) { wmma::fill_fragment(acc[t], 0.0f); }
        for (int I = J + 1; I < nb; I++) {
            __syncthreads(); // qh, khh are free (and, the first time, the staging is complete)
            for_tile(SUB, K, [&](int i, int c) {
                int ri = I * SUB + i;
                float ex = __expf(g_s[ri * lg + c] - g_s[r * lg + c]);
                qh[i * lk + c] = __float2bfloat16(__bfloat162float(q_s[ri * lk + c]) * ex);
                khh[i * lk + c] = __float2bfloat16(__bfloat162float(kh_s[ri * lk + c]) * ex);
            });
            __syncthreads();
            for (int t = 0; t < 2; t++) { // dP_IJᵀ, dM_IJᵀ: the (I, J) blocks used transposed
                int n = warp + 8 * t;
                if (n >= nt) { break; }
                mma_steps_t(acc[t], dpx + I * SUB * lc + J * SUB, lc, qh + 16 * n, 0, lk, 1);
                mma_steps_t(acc[t], dmx + I * SUB * lc + J * SUB, lc, khh + 16 * n, 0, lk, 1);
            }
        }
        __syncthreads(); // ot is free; the staging is complete (J = nb - 1)
        for (int t = 0; t < 2; t++) {
            int n = warp + 8 * t;
            if (n >= nt) { break; }
            wmma::store_matrix_sync(ot + 16 * n, acc[t], lo, wmma::mem_row_major);
        }
        __syncthreads();
        // the diagonal block, exact, plus the scaled products: a thread per channel c and columns j ≡ pr (mod R)
        int R = sc_diag_parts(K), c = threadIdx.x % K, pr = threadIdx.x / K, f = J * SUB;
        if (pr < R) {
            float dcy[SUB], qv[SUB], kv[SUB]; // as in the dq kernel; q̂ and k̂ in this channel
            sc_diag_steps(dcy, g_s + f * lg + c, lg);
            #pragma unroll
            for (int t = 0; t < SUB; t++) {
                qv[t] = __bfloat162float(q_s[(f + t) * lk + c]);
                kv[t] = __bfloat162float(kh_s[(f + t) * lk + c]);
            }
            #pragma unroll
            for (int j = 0; j < SUB; j++) {
                if (j % R != pr) { continue; }
                float at = 0.0f, e = 1.0f;
                #pragma unroll
                for (int i = j; i < SUB; i++) { // e = e^(G_i - G_j), walking i up
                    if (i > j) { e *= dcy[i]; }
                    at += (dpd[(f + i) * SUB + j] * qv[i] + dmd[(f + i) * SUB + j] * kv[i]) * e;
                }
                // e = e^(G_r - G_j): the products' scale. FIN: the sum stays in place for the finish below
                if (FIN) { ot[j * lo + c] = at + e * ot[j * lo + c]; } else { dkt_s[(r0 + f + j) * K + c] = at + e * ot[j * lo + c]; }
            }
        }
        if (FIN) { // dk̃ and dG for the block's SUB rows, four channels a thread, then dg a thread per channel
            __syncthreads();
            int k4 = K / 4;
            for (int e = threadIdx.x; e < SUB * k4; e += blockDim.x) {
                int j = e / k4, c0 = 4 * (e % k4), row = f + j;
                long idx = (r0 + row) * K + c0;
                bool last = !dc || dc[row] == dc[n1];
                float4 vkd = *(const float4*)(dKd + idx), vg = *(const float4*)(gc + idx);
                XV<4> xkt = *(const XV<4>*)(Kt + idx);
                float gkd[4] = {vkd.x, vkd.y, vkd.z, vkd.w}, ggc[4] = {vg.x, vg.y, vg.z, vg.w}, okt[4];
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    float ed = last ? expf(g_s[n1 * lg + c0 + u] - g_s[row * lg + c0 + u]) : 0.0f;
                    float dktv = ot[j * lo + c0 + u] + gkd[u] * ed;
                    okt[u] = dktv;
                    ot[j * lo + c0 + u] = ggc[u] - tof(xkt.v[u]) * dktv; // dG, in place of dk̃_s (this thread's)
                }
                if (fold_kt) {
                    float4 h = *(const float4*)(dkh + idx);
                    *(float4*)(dkh + idx) = make_float4(h.x + okt[0], h.y + okt[1], h.z + okt[2], h.w + okt[3]);
                } else {
                    *(float4*)(dkt_s + idx) = make_float4(okt[0], okt[1], okt[2], okt[3]);
                }
            }
            __syncthreads();
            if (threadIdx.x < K) {
                for (int j = SUB - 1; j >= 0; j--) { dgacc += ot[j * lo + threadIdx.x]; dg[(r0 + f + j) * K + threadIdx.x] = dgacc; }
            }
        }
    }
}
#endif

#ifndef ENABLE_FP32
// The backward's chunk-local products in one tensor-core kernel (MixerPlan.gemms_fused), a block per chunk, in place of
// ten batched GEMMs. From the chunk's dO, start state h, V', state gradient dS, dV', Tx, W and U (bf16):
//   dQg = dO hᵀ, dP = dO V'ᵀ, dKd = V' dSᵀ, dW = -dV' hᵀ (bf16, in shared memory only), dX = Txᵀ dW, dY = Txᵀ dV',
//   dZ = dW Wᵀ + dV' Uᵀ (bf16, shared memory only), dA = -Txᵀ dZ,
// the six outputs fp32 as the GEMMs wrote them, with dW and dZ rounded to bf16 where the GEMMs stored them so. The
// GEMMs' round trips of dW and dZ through device memory and their second and third reads of dO, h, V', dV', Tx go:
// at pgdn-340m 16 x 2048 a layer moves ~1.3 GB instead of ~2.6 GB. Operands arrive by cp.async into six regions,
// each refilled once its last reader is past a barrier (r1 dO then W, r2 h then dS then dZ, r4 V' then U), so that
// two blocks fit a multiprocessor at K = V = 128 (111 KiB each): one block's copies in flight while the other computes.
#define BG_WARPS 16
struct BgLayout { size_t r1, r2, r3, r4, r5, r6, bytes; }; // byte offsets: dO / W, h / dS / dZ, dV', V' / U, Tx, dW
static __host__ __device__ BgLayout bg_layout(int C, int K, int V) {
    size_t lk = K + 8, lv = V + 8, lc = C + 8;
    BgLayout z;
    z.r1 = 0;
    z.r2 = z.r1 + scan_align(2 * C * (lk > lv ? lk : lv));
    z.r3 = z.r2 + scan_align(2 * (K * lv > C * lc ? K * lv : C * lc));
    z.r4 = z.r3 + scan_align(2 * C * lv);
    z.r5 = z.r4 + scan_align(2 * C * lv);
    z.r6 = z.r5 + scan_align(2 * C * lc);
    z.bytes = z.r6 + scan_align(2 * C * lk);
    return z;
}
// a 16 x 16 accumulator tile times f into bf16 rows (stride ld): the mma.sync m16n8 layout of FragC (see mma_steps)
__device__ __forceinline__ void frag_store_bf16(__nv_bfloat16* d, int ld, const FragC& acc, float f) {
    int l = threadIdx.x % 32, g = l / 4, c = 2 * (l % 4);
    for (int h = 0; h < 2; h++) { // columns 0-7, then 8-15
        *(__nv_bfloat162*)(d + g * ld + 8 * h + c) = __floats2bfloat162_rn(f * acc.x[4 * h], f * acc.x[4 * h + 1]);
        *(__nv_bfloat162*)(d + (g + 8) * ld + 8 * h + c) = __floats2bfloat162_rn(f * acc.x[4 * h + 2], f * acc.x[4 * h + 3]);
    }
}
// this warp's tiles t of the (rows / 16) x (cols / 16) tiles of a product: f(i, j) for each
template <typename F> __device__ __forceinline__ void bg_tiles(int rows, int cols, F f) {
    int nj = cols / 16;
    for (int t = threadIdx.x / 32; t < rows / 16 * nj; t += BG_WARPS) { f(t / nj, t % nj); }
}
// tile (i, j) of dZ = dW Wᵀ + dV' Uᵀ (C x C) in bf16; dW, W rows of lk, dV', U rows of lv, dZ rows of lc
__device__ __forceinline__ void bg_dz_tile(__nv_bfloat16* dz, int lc, const __nv_bfloat16* dw, const __nv_bfloat16* w, int lk,
                                           int mk, const __nv_bfloat16* dvn, const __nv_bfloat16* u, int lv, int mv, int i, int j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    mma_steps<FragBT>(acc, dw + 16 * i * lk, lk, w + 16 * j * lk, 16, lk, mk);
    mma_steps<FragBT>(acc, dvn + 16 * i * lv, lv, u + 16 * j * lv, 16, lv, mv);
    frag_store_bf16(dz + 16 * i * lc + 16 * j, lc, acc, 1.0f);
}
__global__ void __launch_bounds__(32 * BG_WARPS, 2) bwd_gemms_tc_kernel(float* dQg, float* dP, float* dKd, float* dX, float* dY, float* dA,
                                                                        const floatX* dO, const floatX* hst, const floatX* Vn,
                                                                        const floatX* dhst, const floatX* dVn, const floatX* Tx,
                                                                        const floatX* W, const floatX* U, ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, lk = K + 8, lv = V + 8, lc = C + 8, mc = C / 16, mk = K / 16, mv = V / 16;
    long q = blockIdx.x, r0 = q * C, CC = (long)C * C, KV = (long)K * V;
    BgLayout z = bg_layout(C, K, V);
    __nv_bfloat16 *r1 = (__nv_bfloat16*)(smem_raw + z.r1), *r2 = (__nv_bfloat16*)(smem_raw + z.r2);
    __nv_bfloat16 *dvn_s = (__nv_bfloat16*)(smem_raw + z.r3), *r4 = (__nv_bfloat16*)(smem_raw + z.r4);   // (C, V+8)
    __nv_bfloat16 *tx_s = (__nv_bfloat16*)(smem_raw + z.r5), *dw_s = (__nv_bfloat16*)(smem_raw + z.r6); // (C, C+8), (C, K+8)
    __nv_bfloat16 *do_s = r1, *h_s = r2, *vn_s = r4;  // (C, V+8), (K, V+8), (C, V+8)
    __nv_bfloat16 *w_s = r1, *ds_s = r2, *u_s = r4;   // later: (C, K+8), (K, V+8), (C, V+8)
    __nv_bfloat16* dz_s = r2;                         // last: (C, C+8)
    stage_async(do_s, 2 * lv, dO + r0 * V, 2L * V, C, 2 * V);
    stage_async(h_s, 2 * lv, hst + q * KV, 2L * V, K, 2 * V);
    stage_async(dvn_s, 2 * lv, dVn + r0 * V, 2L * V, C, 2 * V);
    stage_async(tx_s, 2 * lc, Tx + q * CC, 2L * C, C, 2 * C);
    __pipeline_commit();
    stage_async(vn_s, 2 * lv, Vn + r0 * V, 2L * V, C, 2 * V);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();
    bg_tiles(C, K, [&](int i, int j) { // dQg = dO hᵀ, dW = -dV' hᵀ
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, do_s + 16 * i * lv, lv, h_s + 16 * j * lv, 16, lv, mv);
        wmma::store_matrix_sync(dQg + (r0 + 16 * i) * K + 16 * j, acc, K, wmma::mem_row_major);
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, dvn_s + 16 * i * lv, lv, h_s + 16 * j * lv, 16, lv, mv);
        frag_store_bf16(dw_s + 16 * i * lk + 16 * j, lk, acc, -1.0f);
    });
    __syncthreads();
    stage_async(ds_s, 2 * lv, dhst + q * KV, 2L * V, K, 2 * V); // h is done with
    __pipeline_commit();
    __pipeline_wait_prior(1); // V'
    __syncthreads();
    bg_tiles(C, C, [&](int i, int j) { // dP = dO V'ᵀ
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, do_s + 16 * i * lv, lv, vn_s + 16 * j * lv, 16, lv, mv);
        wmma::store_matrix_sync(dP + q * CC + 16 * i * C + 16 * j, acc, C, wmma::mem_row_major);
    });
    bg_tiles(C, K + V, [&](int i, int j) { // dX = Txᵀ dW, dY = Txᵀ dV'
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        if (j < mk) {
            mma_steps_t(acc, tx_s + 16 * i, lc, dw_s + 16 * j, 16 * lk, lk, mc);
            wmma::store_matrix_sync(dX + (r0 + 16 * i) * K + 16 * j, acc, K, wmma::mem_row_major);
        } else {
            mma_steps_t(acc, tx_s + 16 * i, lc, dvn_s + 16 * (j - mk), 16 * lv, lv, mc);
            wmma::store_matrix_sync(dY + (r0 + 16 * i) * V + 16 * (j - mk), acc, V, wmma::mem_row_major);
        }
    });
    __syncthreads();
    stage_async(w_s, 2 * lk, W + r0 * K, 2L * K, C, 2 * K); // dO is done with
    __pipeline_commit();
    __pipeline_wait_prior(1); // dS
    __syncthreads();
    bg_tiles(C, K, [&](int i, int j) { // dKd = V' dSᵀ
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, vn_s + 16 * i * lv, lv, ds_s + 16 * j * lv, 16, lv, mv);
        wmma::store_matrix_sync(dKd + (r0 + 16 * i) * K + 16 * j, acc, K, wmma::mem_row_major);
    });
    __syncthreads();
    stage_async(u_s, 2 * lv, U + r0 * V, 2L * V, C, 2 * V); // V' and dS are done with
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    bg_tiles(C, C, [&](int i, int j) { bg_dz_tile(dz_s, lc, dw_s, w_s, lk, mk, dvn_s, u_s, lv, mv, i, j); }); // dZ
    __syncthreads();
    bg_tiles(C, C, [&](int i, int j) { // dA = -Txᵀ dZ
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps_t(acc, tx_s + 16 * i, lc, dz_s + 16 * j, 16 * lc, lc, mc);
        for (int e = 0; e < acc.num_elements; e++) { acc.x[e] = -acc.x[e]; }
        wmma::store_matrix_sync(dA + q * CC + 16 * i * C + 16 * j, acc, C, wmma::mem_row_major);
    });
}
// BWD_GEMMS_FUSED_DEFAULT 1: the plan takes the fused kernel wherever it fits. gemms_force (the kernel lab): 1 the ten
// batched GEMMs, 2 the fused kernel wherever it fits, whatever the default.
#define BWD_GEMMS_FUSED_DEFAULT 1
static int gemms_force = 0;
static bool bwd_gemms_fused(const ChunkShape& s) {
    bool want = gemms_force == 2 || (gemms_force == 0 && BWD_GEMMS_FUSED_DEFAULT);
    return want && !mma_bad && s.C % 16 == 0 && s.K % 16 == 0 && s.V % 16 == 0 &&
           bg_layout(s.C, s.K, s.V).bytes + 1024 <= (size_t)smem_optin;
}
#endif

// scalar / no decay: dPm = lower-with-diagonal(dP) ⊙ E (floatX); from dA (fp32, the sum of the two GEMMs):
// strict lower, dbetaA_i = Σ_j dA_ij Mk_ij, dMm = beta_i dA ⊙ E (floatX). One warp per row.
__global__ void bwd_scores_mask_kernel(floatX* dPm, floatX* dMm, float* dbetaA, const float* dP, const float* dA,
                                       const float* Mk, const float* G, const float* beta, ChunkShape s) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32, C = s.C;
    if (row >= s.nq * C) { return; }
    long q = row / C;
    int i = (int)(row % C);
    const signed char* dc = chunk_docs(s, q);
    float b = beta[row], db = 0.0f;
    for (int j = lane; j < C; j += 32) {
        long e = row * C + j;
        // E only inside the mask: above the diagonal G_i - G_j > 0 and exp can overflow (0 * inf = NaN)
        float E = (s.gk && j <= i) ? expf(G[row] - G[q * C + j]) : 1.0f;
        if (dc && dc[i] != dc[j]) { E = 0.0f; } // documents: the forward's mask
        dPm[e] = fromf<floatX>(j <= i ? dP[e] * E : 0.0f);
        float da = j < i ? dA[e] : 0.0f;
        db += da * Mk[e];
        dMm[e] = fromf<floatX>(b * da * E);
    }
    db = warp_sum(db);
    if (lane == 0) { dbetaA[row] = db; }
}

// channel decay: the same products with a per-channel decay inside, so no GEMM:
//   dq_i += Σ_j dP_ij E_ij ⊙ k̃_j,  dk̃_j += Σ_i dP_ij E_ij ⊙ q̂_i   (j <= i)
//   dk̂_i += Σ_j dM_ij E_ij ⊙ k̃_j,  dk̃_j += Σ_i dM_ij E_ij ⊙ k̂_i   (j < i), dM = beta_i dA_ij
// with the same sub-block factorisation as the forward: diagonal blocks per (i, j, c), blocks I > J as products of
// pre-scaled rows. One block per chunk; every output element has one owning thread per phase (deterministic).
__global__ void scores_channel_backward_kernel(float* dq_s, float* dkh_s, float* dkt_s, float* dbetaA, const float* dP,
                                               const float* dA, const float* Mk, const floatX* Q, const floatX* Kh,
                                               const floatX* Kt, const float* G, const float* beta, ChunkShape s) {
    extern __shared__ float sm[];
    int C = s.C, K = s.K, ld = K + 1, nb = C / SUB;
    float *q_s = sm, *kh_s = q_s + C * ld, *kt_s = kh_s + C * ld, *g_s = kt_s + C * ld, *dp_s = g_s + C * ld, *dm_s = dp_s + C * C;
    float *bh = dm_s + C * C, *ah = bh + SUB * ld, *qh = ah + SUB * ld;
    long q = blockIdx.x, r0 = q * C;
    chunk_rows_to_smem(q_s, kh_s, kt_s, g_s, Q, Kh, Kt, G, r0, C, K, ld);
    const signed char* dc = chunk_docs(s, q);
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        int i = e / C, j = e % C;
        bool in = !dc || dc[i] == dc[j]; // documents: the forward's mask
        dp_s[e] = in && j <= i ? dP[q * C * C + e] : 0.0f;
        dm_s[e] = in && j < i ? beta[r0 + i] * dA[q * C * C + e] : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) { // dbeta from A = beta Mk, one thread per row
        float db = 0.0f;
        for (int j = 0; j < i; j++) { db += dA[q * C * C + i * C + j] * Mk[q * C * C + i * C + j]; }
        dbetaA[r0 + i] = db;
    }
    // diagonal blocks: thread per (row, channel)
    for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
        int i = e / K, c = e % K, blk = i / SUB * SUB;
        float gi = g_s[i * ld + c], aq = 0.0f, ak = 0.0f, at = 0.0f;
        for (int j = blk; j <= i; j++) {
            float ex = expf(gi - g_s[j * ld + c]) * kt_s[j * ld + c];
            aq += dp_s[i * C + j] * ex;
            ak += dm_s[i * C + j] * ex;
        }
        for (int r = i; r < blk + SUB; r++) {
            float ex = expf(g_s[r * ld + c] - gi);
            at += (dp_s[r * C + i] * q_s[r * ld + c] + dm_s[r * C + i] * kh_s[r * ld + c]) * ex;
        }
        long idx = (r0 + i) * K + c;
        dq_s[idx] = aq;
        dkh_s[idx] = ak;
        dkt_s[idx] = at;
    }
    // blocks I > J: r = the last token of J
    for (int J = 0; J + 1 < nb; J++) {
        int r = J * SUB + SUB - 1;
        __syncthreads();
        scaled_cols(bh, kt_s, g_s, J, r, K, ld);
        for (int I = J + 1; I < nb; I++) {
            __syncthreads();
            scaled_rows(ah, qh, kh_s, q_s, g_s, I, r, K, ld);
            __syncthreads();
            for (int e = threadIdx.x; e < SUB * K; e += blockDim.x) {
                int x = e / K, c = e % K;
                // rows of I: dq, dk̂ += exp(G_i - G_r) ⊙ (dP_IJ, dM_IJ) · (k̃_J ⊙ exp(G_r - G_J))
                int i = I * SUB + x;
                float sq = 0.0f, sk = 0.0f;
                for (int j = 0; j < SUB; j++) {
                    float b = bh[j * ld + c];
                    sq += dp_s[i * C + J * SUB + j] * b;
                    sk += dm_s[i * C + J * SUB + j] * b;
                }
                float ei = expf(g_s[i * ld + c] - g_s[r * ld + c]);
                long idx = (r0 + i) * K + c;
                dq_s[idx] += ei * sq;
                dkh_s[idx] += ei * sk;
                // rows of J: dk̃ += exp(G_r - G_j) ⊙ (dP_IJᵀ (q̂_I ⊙ exp(G_I - G_r)) + dM_IJᵀ (k̂_I ⊙ exp(G_I - G_r)))
                int j = J * SUB + x;
                float st = 0.0f;
                for (int ii = 0; ii < SUB; ii++) {
                    int row = I * SUB + ii;
                    st += dp_s[row * C + j] * qh[ii * ld + c] + dm_s[row * C + j] * ah[ii * ld + c];
                }
                dkt_s[(r0 + j) * K + c] += expf(g_s[r * ld + c] - g_s[j * ld + c]) * st;
            }
        }
    }
}

// Combine one chunk's gradients (all hm fp32 outputs written, not accumulated; dkt only without fold_kt):
//   dq = dQg ⊙ e^G + dq_s;  dk̂ = beta dX ⊙ e^G + dkh_s (+ dk̃ without a preconditioner);  dk̃ = dkt_s + dKd ⊙ exp(G_n - G)
//   dv = beta dY;  dbeta = Σ dX ⊙ K̂e^G + Σ dY ⊙ V + dbetaA
//   dG_i = q̂_i ⊙ dq_i + k̂_i ⊙ dk̂_i - k̃_i ⊙ dk̃_i, plus at i = n: Σ_j k̃_j ⊙ dKd_j exp(G_n - G_j) + e^G_n ⊙ Σ_v dS ⊙ S
//   dg = reverse cumsum of dG inside the chunk (summed over channels for a scalar decay)
template <int VEC>
__global__ void bwd_finish_kernel(float* __restrict__ dq, float* __restrict__ dkh, float* __restrict__ dkt, float* __restrict__ dv, float* __restrict__ dbeta, float* __restrict__ dg,
                                  const float* __restrict__ dQg, const float* __restrict__ dq_s, const float* __restrict__ dX, const float* __restrict__ dkh_s, const float* __restrict__ dkt_s,
                                  const float* __restrict__ dKd, const float* __restrict__ dY, const float* __restrict__ dbetaA, const floatX* __restrict__ Q, const floatX* __restrict__ Kh,
                                  const floatX* __restrict__ Kt, const floatX* __restrict__ Vv, const float* __restrict__ G, const float* __restrict__ beta,
                                  const floatX* __restrict__ hstate, const floatX* __restrict__ dhstate, int fold_kt, ChunkShape s) {
    // VEC consecutive channels per thread: 16-byte fp32 and VEC-wide floatX accesses (this kernel only moves memory)
    struct alignas(VEC * 4) F4 { float v[VEC]; };
    struct alignas(VEC * sizeof(floatX)) X4 { floatX v[VEC]; };
    extern __shared__ float sm[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1, chan = s.gk > 1, kv = K / VEC, vv = V / VEC;
    float* Gc = sm;              // C * K: per-element dG contributions
    float* Kx = Gc + C * K;      // C * K: k̃ ⊙ (dKd exp(G_n - G)), for the last row's extra term
    float* bk = Kx + C * K;      // C * kv: dbeta's key-side partial sums, VEC channels each
    float* bv = bk + C * kv;     // C * vv: dbeta's value-side partial sums
    float* extra = bv + C * vv;  // K
    float* rows = extra + K;     // C: scalar decay, dG per row
    float* hsum = rows + C;      // K: Σ_v dS ⊙ S per state row
    long q = blockIdx.x, r0 = q * C;
    int n1 = C - 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const signed char* dc = chunk_docs(s, q); // documents: the forward's masks on e^G (S's rows) and exp(G_n - G) (Kd's)
    #pragma unroll 2
    for (int e = threadIdx.x * VEC; e < C * K; e += blockDim.x * VEC) {
        int i = e / K, c0 = e % K;
        long idx = (r0 + i) * K + c0;
        float b = beta[r0 + i], bsum = 0.0f, eg_row = 1.0f, ed_row = 1.0f; // a scalar decay: one factor pair per row
        if (s.gk && !chan) { float gi = G[r0 + i]; eg_row = expf(gi); ed_row = expf(G[r0 + n1] - gi); }
        bool sees = !dc || dc[i] < 0, last = !dc || dc[i] == dc[n1];
        F4 vq = *(const F4*)(dQg + idx), vqs = *(const F4*)(dq_s + idx), vkd = *(const F4*)(dKd + idx);
        F4 vkts = *(const F4*)(dkt_s + idx), vx = *(const F4*)(dX + idx), vkhs = *(const F4*)(dkh_s + idx);
        X4 xq = *(const X4*)(Q + idx), xkh = *(const X4*)(Kh + idx), xkt = *(const X4*)(Kt + idx);
        F4 oq, okt, okh, gc, kx;
        #pragma unroll
        for (int u = 0; u < VEC; u++) {
            float eg = eg_row, ed = ed_row;
            if (chan) {
                float gi = G[(r0 + i) * gw + c0 + u];
                eg = expf(gi);
                ed = expf(G[(r0 + n1) * gw + c0 + u] - gi);
            }
            eg = sees ? eg : 0.0f;
            ed = last ? ed : 0.0f;
            float qv = tof(xq.v[u]), khv = tof(xkh.v[u]), ktv = tof(xkt.v[u]);
            float dqv = vq.v[u] * eg + vqs.v[u];
            float dkd = vkd.v[u] * ed;
            float dktv = vkts.v[u] + dkd;
            float dkhv = b * vx.v[u] * eg + vkhs.v[u];
            oq.v[u] = dqv;
            okt.v[u] = dktv;
            okh.v[u] = fold_kt ? dkhv + dktv : dkhv;
            gc.v[u] = qv * dqv + khv * dkhv - ktv * dktv;
            kx.v[u] = ktv * dkd;
            bsum += vx.v[u] * khv * eg; // dbeta: Σ_c dX ⊙ K̂ e^G
        }
        *(F4*)(dq + idx) = oq;
        if (!fold_kt) { *(F4*)(dkt + idx) = okt; }
        *(F4*)(dkh + idx) = okh;
        *(F4*)(Gc + e) = gc;
        *(F4*)(Kx + e) = kx;
        bk[e / VEC] = bsum;
    }
    #pragma unroll 2
    for (int e = threadIdx.x * VEC; e < C * V; e += blockDim.x * VEC) {
        int i = e / V;
        long idx = (r0 + i) * V + e % V;
        float b = beta[r0 + i], bsum = 0.0f;
        F4 y = *(const F4*)(dY + idx), o;
        X4 xv = *(const X4*)(Vv + idx);
        #pragma unroll
        for (int u = 0; u < VEC; u++) {
            o.v[u] = b * y.v[u];
            bsum += y.v[u] * tof(xv.v[u]); // dbeta: Σ_v dY ⊙ V
        }
        *(F4*)(dv + idx) = o;
        bv[e / VEC] = bsum;
    }
    __syncthreads();
    // dbeta_i = the partial sums of row i + dbetaA, a warp per row, fixed order
    for (int i = warp; i < C; i += nw) {
        float sacc = 0.0f;
        for (int k = lane; k < kv; k += 32) { sacc += bk[i * kv + k]; }
        for (int k = lane; k < vv; k += 32) { sacc += bv[i * vv + k]; }
        sacc = warp_sum(sacc);
        if (lane == 0) { dbeta[r0 + i] = sacc + dbetaA[r0 + i]; }
    }
    if (!s.gk) { return; }
    // the last row's extra terms, per channel: Σ_j k̃_j ⊙ dKd_j exp(G_n - G_j) (Kx's column sums, below) and
    // e^G_n ⊙ Σ_v dS ⊙ S
    state_row_sums<VEC>(hsum, hstate, dhstate, q, K, V);
    __syncthreads();
    bool cut = dc && dc[n1] >= 0; // documents: S reached the next chunk only without a boundary in this one
    for (int a = threadIdx.x; a < K; a += blockDim.x) {
        float kx = 0.0f;
        for (int i = 0; i < C; i++) { kx += Kx[i * K + a]; }
        extra[a] = kx + (cut ? 0.0f : expf(G[(r0 + n1) * gw + (chan ? a : 0)])) * hsum[a];
    }
    __syncthreads();
    if (chan) {
        for (int a = threadIdx.x; a < K; a += blockDim.x) {
            float acc = extra[a];
            for (int i = n1; i >= 0; i--) { acc += Gc[i * K + a]; dg[(r0 + i) * K + a] = acc; }
        }
        return;
    }
    // scalar decay: dG per row (a warp per row: a thread per row would read Gc with a stride of K, one bank for the
    // whole warp), then the reverse cumsum over rows, by warp 0: lane l owns rows l*per .. l*per+per-1
    for (int i = warp; i < C; i += nw) {
        float sr = 0.0f;
        for (int a = lane; a < K; a += 32) { sr += Gc[i * K + a]; }
        sr = warp_sum(sr);
        if (lane == 0) { rows[i] = sr; }
    }
    __syncthreads();
    if (warp == 0) {
        float tot = 0.0f;
        for (int a = lane; a < K; a += 32) { tot += extra[a]; }
        tot = warp_sum(tot);
        int per = (C + 31) / 32, lo = min(lane * per, C), hi = min(lo + per, C);
        float part = 0.0f;
        for (int i = lo; i < hi; i++) { part += rows[i]; }
        float suf = part; // inclusive suffix sum over lanes
        for (int o = 1; o < 32; o <<= 1) {
            float v = __shfl_down_sync(0xffffffff, suf, o);
            if (lane + o < 32) { suf += v; }
        }
        float acc = tot + (suf - part);
        for (int i = hi - 1; i >= lo; i--) { acc += rows[i]; dg[r0 + i] = acc; }
    }
}

// The same for a scalar or no decay with K = V = 128 (the 340m and 1b presets): a warp owns a row (lane l: channels
// 4 l .. 4 l + 3, 16-byte accesses), so the per-row sums over channels (dG_i, dbeta_i) are warp sums and the last
// row's column sums Σ_j k̃_j ⊙ dKd_j exp(G_n - G_j) stay in each lane's registers until the warps are combined in
// fixed order. No (C, K) shared-memory tensors (the general kernel keeps ~70 KB of them, 3 blocks per
// SM): 8 blocks of 8 warps fit an SM.
#define FIN_WARPS 8
template <bool DOC> // as scores_scalar_tc_kernel
__global__ void __launch_bounds__(32 * FIN_WARPS) bwd_finish_rows_kernel(
    float* __restrict__ dq, float* __restrict__ dkh, float* __restrict__ dkt, float* __restrict__ dv, float* __restrict__ dbeta,
    float* __restrict__ dg, const float* __restrict__ dQg, const float* __restrict__ dq_s, const float* __restrict__ dX,
    const float* __restrict__ dkh_s, const float* __restrict__ dkt_s, const float* __restrict__ dKd, const float* __restrict__ dY,
    const float* __restrict__ dbetaA, const floatX* __restrict__ Q, const floatX* __restrict__ Kh, const floatX* __restrict__ Kt,
    const floatX* __restrict__ Vv, const float* __restrict__ G, const float* __restrict__ beta, const floatX* __restrict__ hstate,
    const floatX* __restrict__ dhstate, int fold_kt, ChunkShape s) {
    struct alignas(16) F4 { float v[4]; };
    struct alignas(4 * sizeof(floatX)) X4 { floatX v[4]; };
    __shared__ float kxp[FIN_WARPS][128]; // per warp: Σ over its rows of k̃ ⊙ dKd exp(G_n - G)
    __shared__ float hsum[128];           // Σ_v dS ⊙ S per state row
    __shared__ float rowg[GPU_CHUNK_MAX]; // dG per row (summed over channels)
    const int K = 128, V = 128;
    int C = s.C, n1 = C - 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    long q = blockIdx.x, r0 = q * C;
    const signed char* dc = DOC ? chunk_docs(s, q) : nullptr; // documents: the forward's masks, as in bwd_finish_kernel
    float kxa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = warp; i < C; i += FIN_WARPS) {
        float b = beta[r0 + i], eg = 1.0f, ed = 1.0f, gsum = 0.0f, bsum = 0.0f;
        if (s.gk) { float gi = G[r0 + i]; eg = expf(gi); ed = expf(G[r0 + n1] - gi); }
        if (dc && dc[i] >= 0) { eg = 0.0f; }
        if (dc && dc[i] != dc[n1]) { ed = 0.0f; }
        {
            long idx = (r0 + i) * K + 4 * lane;
            F4 vq = *(const F4*)(dQg + idx), vqs = *(const F4*)(dq_s + idx), vkd = *(const F4*)(dKd + idx);
            F4 vkts = *(const F4*)(dkt_s + idx), vx = *(const F4*)(dX + idx), vkhs = *(const F4*)(dkh_s + idx);
            X4 xq = *(const X4*)(Q + idx), xkh = *(const X4*)(Kh + idx), xkt = *(const X4*)(Kt + idx);
            F4 oq, okt, okh;
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                float qv = tof(xq.v[u]), khv = tof(xkh.v[u]), ktv = tof(xkt.v[u]);
                float dqv = vq.v[u] * eg + vqs.v[u], dkd = vkd.v[u] * ed, dktv = vkts.v[u] + dkd;
                float dkhv = b * vx.v[u] * eg + vkhs.v[u];
                oq.v[u] = dqv;
                okt.v[u] = dktv;
                okh.v[u] = fold_kt ? dkhv + dktv : dkhv;
                gsum += qv * dqv + khv * dkhv - ktv * dktv;
                kxa[u] += ktv * dkd;
                bsum += vx.v[u] * khv * eg; // dbeta: Σ_c dX ⊙ K̂ e^G
            }
            *(F4*)(dq + idx) = oq;
            *(F4*)(dkh + idx) = okh;
            if (!fold_kt) { *(F4*)(dkt + idx) = okt; }
        }
        {
            long idx = (r0 + i) * V + 4 * lane;
            F4 y = *(const F4*)(dY + idx), o;
            X4 xv = *(const X4*)(Vv + idx);
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                o.v[u] = b * y.v[u];
                bsum += y.v[u] * tof(xv.v[u]); // dbeta: Σ_v dY ⊙ V
            }
            *(F4*)(dv + idx) = o;
        }
        gsum = warp_sum(gsum);
        bsum = warp_sum(bsum);
        if (lane == 0) { rowg[i] = gsum; dbeta[r0 + i] = bsum + dbetaA[r0 + i]; }
    }
    if (!s.gk) { return; }
    #pragma unroll
    for (int u = 0; u < 4; u++) { kxp[warp][4 * lane + u] = kxa[u]; }
    for (int a = warp; a < K; a += FIN_WARPS) { // a warp per state row, 4 columns per lane
        long idx = (q * K + a) * V + 4 * lane;
        X4 h = *(const X4*)(hstate + idx), dh = *(const X4*)(dhstate + idx);
        float sum = 0.0f;
        #pragma unroll
        for (int u = 0; u < 4; u++) { sum += tof(dh.v[u]) * tof(h.v[u]); }
        sum = warp_sum(sum);
        if (lane == 0) { hsum[a] = sum; }
    }
    __syncthreads();
    if (warp != 0) { return; }
    // the last row's extra term summed over channels, then dg = the reverse cumsum of dG over the rows: lane l owns
    // rows l*per .. l*per+per-1 (an inclusive suffix sum over the lanes carries the later rows' total)
    float egn = dc && dc[n1] >= 0 ? 0.0f : expf(G[r0 + n1]), tot = 0.0f;
    for (int a = lane; a < K; a += 32) {
        float kx = 0.0f;
        for (int w = 0; w < FIN_WARPS; w++) { kx += kxp[w][a]; }
        tot += kx + egn * hsum[a];
    }
    tot = warp_sum(tot);
    int per = (C + 31) / 32, lo = min(lane * per, C), hi = min(lo + per, C);
    float part = 0.0f;
    for (int i = lo; i < hi; i++) { part += rowg[i]; }
    float suf = part;
    for (int o = 1; o < 32; o <<= 1) {
        float v = __shfl_down_sync(0xffffffff, suf, o);
        if (lane + o < 32) { suf += v; }
    }
    float acc = tot + (suf - part);
    for (int i = hi - 1; i >= lo; i--) { acc += rowg[i]; dg[r0 + i] = acc; }
}

#ifndef ENABLE_FP32
// The whole chunk backward after the state scan in one kernel (MixerPlan.bwd_fused; scalar or no decay, K = V = 128,
// the fused scalar scores): bwd_gemms_tc_kernel's products, bwd_scores_scalar_tc_kernel's and bwd_finish_rows_kernel's
// work for one chunk in one block, so that dQg, dKd, dX, dY, dq_s, dkh_s, dkt_s, dP and dA never reach device memory and
// h, dS, q̂, k̂, k̃ are read once. Each warp keeps its output tiles of dq, dk̂ and dk̃ (fp32 mma accumulators) in
// registers from the first product to the last; the per-row and per-column sums of the finish (dG, dbeta, the last
// row's k̃ ⊙ dKd) go through shared memory in a fixed order, so the results are deterministic (not the unfused
// kernels' bits: their sums run in other orders).
#define FB_WARPS 16
#define FB_SLOTS 2 // output tiles of each of dq, dk̂, dk̃ a warp: (64 / 16) x (128 / 16) = 32 tiles, 16 warps
struct FbLayout { size_t r1, r2, r3, r4, r5, r6, dw, dpx, q, kh, kt, f, bytes; };
// r1 dO then W; r2 h then dZ and dMm; r3 dV'; r4 Tx; r5 V' then U; r6 dS then V; dw dW; dpx dPm; q, kh, kt the keys;
// f the fp32 rows (G, beta, e^G, the last row's decay over each row's, the partial sums)
#define FB_F_PER_ROW (4 + 8 + 16 + 4) // g, b, eg, ed; dG parts (K / 16); dbeta parts ((K + V) / 16); dbetaA parts (C / 16)
static __host__ __device__ FbLayout fb_layout(int C) {
    const size_t K = 128, V = 128, lk = K + 8, lv = V + 8, lc = C + 8;
    FbLayout z;
    z.r1 = 0;
    z.r2 = z.r1 + scan_align(2 * C * lv);
    z.r3 = z.r2 + scan_align(2 * K * lv);
    z.r4 = z.r3 + scan_align(2 * C * lv);
    z.r5 = z.r4 + scan_align(2 * C * lc);
    z.r6 = z.r5 + scan_align(2 * C * lv);
    z.dw = z.r6 + scan_align(2 * K * lv);
    z.dpx = z.dw + scan_align(2 * C * lk);
    z.q = z.dpx + scan_align(2 * C * lc);
    z.kh = z.q + scan_align(2 * C * lk);
    z.kt = z.kh + scan_align(2 * C * lk);
    z.f = z.kt + scan_align(2 * C * lk);
    // + (C / 16) x K column parts of the last row's term, K sums of dS ⊙ h, C row totals
    z.bytes = z.f + scan_align(4 * ((size_t)C * FB_F_PER_ROW + (C / 16) * K + K + C));
    return z;
}
// the row and column of a FragC element e within its 16 x 16 tile (the mma.sync m16n8 layout, see mma_steps)
__device__ __forceinline__ int frag_row(int e) { return (threadIdx.x % 32) / 4 + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int frag_col(int e) { return 2 * (threadIdx.x % 4) + (e & 1) + 8 * (e >> 2); }
// the sums of a tile's rows over its 16 columns (v: this lane's 8 values as FragC holds them) into out[r * stride]
// for r < 16 (lanes 4 g write rows g and g + 8): a fixed order
__device__ __forceinline__ void frag_row_sums(const float v[8], float* out, int stride) {
    float a = v[0] + v[1] + v[4] + v[5], b = v[2] + v[3] + v[6] + v[7];
    a += __shfl_xor_sync(0xffffffff, a, 1); b += __shfl_xor_sync(0xffffffff, b, 1);
    a += __shfl_xor_sync(0xffffffff, a, 2); b += __shfl_xor_sync(0xffffffff, b, 2);
    int l = threadIdx.x % 32;
    if (l % 4 == 0) { out[(l / 4) * stride] = a; out[(l / 4 + 8) * stride] = b; }
}
// the sums of a tile's columns over its 16 rows into out[c] for c < 16 (lanes 0..3 write): a fixed order
__device__ __forceinline__ void frag_col_sums(const float v[8], float* out) {
    float c[4] = {v[0] + v[2], v[1] + v[3], v[4] + v[6], v[5] + v[7]};
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        for (int o = 4; o < 32; o <<= 1) { c[k] += __shfl_xor_sync(0xffffffff, c[k], o); }
    }
    int l = threadIdx.x % 32;
    if (l < 4) { out[2 * l] = c[0]; out[2 * l + 1] = c[1]; out[8 + 2 * l] = c[2]; out[9 + 2 * l] = c[3]; }
}
template <bool DOC>
__global__ void __launch_bounds__(32 * FB_WARPS, 1) bwd_chunk_fused_kernel(
    float* dq, float* dkh, float* dkt, float* dv, float* dbeta, float* dg, const floatX* dO, const floatX* hst,
    const floatX* Vn, const floatX* dhst, const floatX* dVn, const floatX* Tx, const floatX* W, const floatX* U,
    const floatX* Q, const floatX* Kh, const floatX* Kt, const floatX* Vv, const float* G, const float* beta, int fold_kt,
    ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int K = 128, V = 128, lk = K + 8, lv = V + 8, mk = K / 16, mv = V / 16;
    int C = s.C, lc = C + 8, mc = C / 16, n1 = C - 1, warp = threadIdx.x / 32;
    long q = blockIdx.x, r0 = q * C, KV = (long)K * V;
    FbLayout z = fb_layout(C);
    typedef __nv_bfloat16 bf;
    bf *do_s = (bf*)(smem_raw + z.r1), *h_s = (bf*)(smem_raw + z.r2), *dvn_s = (bf*)(smem_raw + z.r3);
    bf *tx_s = (bf*)(smem_raw + z.r4), *vn_s = (bf*)(smem_raw + z.r5), *ds_s = (bf*)(smem_raw + z.r6);
    bf *dw_s = (bf*)(smem_raw + z.dw), *dpx = (bf*)(smem_raw + z.dpx);
    bf *q_s = (bf*)(smem_raw + z.q), *kh_s = (bf*)(smem_raw + z.kh), *kt_s = (bf*)(smem_raw + z.kt);
    bf *w_s = do_s, *u_s = vn_s, *v_s = ds_s, *dz_s = h_s, *dmx = h_s + C * lc; // later tenants
    float* gs = (float*)(smem_raw + z.f);     // (C) G
    float* bs = gs + C;                        // (C) beta
    float* egs = bs + C;                       // (C) e^G_i (0 where row i's document starts in this chunk)
    float* eds = egs + C;                      // (C) e^(G_n - G_i) (0 across a document boundary)
    float* pg = eds + C;                       // (C, mk) dG parts: q̂·dq + k̂·dk̂ - k̃·dk̃ per tile column
    float* pb = pg + C * mk;                   // (C, mk + mv) dbeta parts: dX·k̂ e^G, then dY·v
    float* pa = pb + C * (mk + mv);            // (C, mc) dbetaA parts: Σ_j dA ⊙ Mk per tile
    float* pk = pa + C * mc;                   // (mc, K) the last row's term k̃ ⊙ dKd e^(G_n - G) per tile row
    float* hsum = pk + mc * K;                 // (K) Σ_v dS ⊙ h
    float* rowg = hsum + K;                    // (C) dG per row
    const signed char* dc = DOC ? chunk_docs(s, q) : nullptr;
    stage_async(do_s, 2 * lv, dO + r0 * V, 2L * V, C, 2 * V);
    stage_async(h_s, 2 * lv, hst + q * KV, 2L * V, K, 2 * V);
    stage_async(dvn_s, 2 * lv, dVn + r0 * V, 2L * V, C, 2 * V);
    stage_async(tx_s, 2 * lc, Tx + q * C * C, 2L * C, C, 2 * C);
    stage_async(vn_s, 2 * lv, Vn + r0 * V, 2L * V, C, 2 * V);
    stage_async(ds_s, 2 * lv, dhst + q * KV, 2L * V, K, 2 * V);
    stage_async(q_s, 2 * lk, Q + r0 * K, 2L * K, C, 2 * K);
    stage_async(kh_s, 2 * lk, Kh + r0 * K, 2L * K, C, 2 * K);
    stage_async(kt_s, 2 * lk, Kt + r0 * K, 2L * K, C, 2 * K);
    __pipeline_commit();
    for (int i = threadIdx.x; i < C; i += blockDim.x) { gs[i] = s.gk ? G[r0 + i] : 0.0f; bs[i] = beta[r0 + i]; }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) { // the finish's row factors (bwd_finish_rows_kernel)
        float eg = s.gk ? expf(gs[i]) : 1.0f, ed = s.gk ? expf(gs[n1] - gs[i]) : 1.0f;
        if (dc && dc[i] >= 0) { eg = 0.0f; }
        if (dc && dc[i] != dc[n1]) { ed = 0.0f; }
        egs[i] = eg; eds[i] = ed;
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    FragC aq[FB_SLOTS], akh[FB_SLOTS], akt[FB_SLOTS]; // this warp's tiles (i, j) = t / mk, t % mk, t = warp + FB_WARPS u
    const int ntile = mc * mk;
    // 1. dQg = dO hᵀ (into dq's tiles), dKd = V' dSᵀ (into dk̃'s: scaled by e^(G_n - G_i), and the last row's term),
    //    dW = -dV' hᵀ (bf16); dPm = lower-with-diagonal(dO V'ᵀ) ⊙ E (bf16); Σ_v dS ⊙ h
    #pragma unroll
    for (int u = 0; u < FB_SLOTS; u++) {
        int t = warp + FB_WARPS * u, i = t / mk, j = t % mk;
        wmma::fill_fragment(aq[u], 0.0f);
        wmma::fill_fragment(akh[u], 0.0f);
        wmma::fill_fragment(akt[u], 0.0f);
        if (t >= ntile) { continue; }
        mma_steps<FragBT>(aq[u], do_s + 16 * i * lv, lv, h_s + 16 * j * lv, 16, lv, mv);
        mma_steps<FragBT>(akt[u], vn_s + 16 * i * lv, lv, ds_s + 16 * j * lv, 16, lv, mv);
        for (int e = 0; e < 8; e++) { akt[u].x[e] *= eds[16 * i + frag_row(e)]; }
        if (s.gk) { // the last row's term feeds only dg
            float v[8];
            for (int e = 0; e < 8; e++) {
                int r = 16 * i + frag_row(e), c = 16 * j + frag_col(e);
                v[e] = __bfloat162float(kt_s[r * lk + c]) * akt[u].x[e];
            }
            frag_col_sums(v, pk + i * K + 16 * j);
        }
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps<FragBT>(acc, dvn_s + 16 * i * lv, lv, h_s + 16 * j * lv, 16, lv, mv);
        frag_store_bf16(dw_s + 16 * i * lk + 16 * j, lk, acc, -1.0f);
    }
    for (int t = warp; t < mc * mc; t += FB_WARPS) {
        int I = t / mc, J = t % mc;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        if (J <= I) { mma_steps<FragBT>(acc, do_s + 16 * I * lv, lv, vn_s + 16 * J * lv, 16, lv, mv); }
        for (int e = 0; e < 8; e++) {
            int r = 16 * I + frag_row(e), c = 16 * J + frag_col(e);
            float E = (s.gk && c <= r) ? expf(gs[r] - gs[c]) : 1.0f; // never above the diagonal: overflow
            if (dc && dc[r] != dc[c]) { E = 0.0f; }
            acc.x[e] = c <= r ? acc.x[e] * E : 0.0f;
        }
        frag_store_bf16(dpx + 16 * I * lc + 16 * J, lc, acc, 1.0f);
    }
    for (int a = warp; s.gk && a < K; a += FB_WARPS) { // a warp per state row (Σ_v dS ⊙ h feeds only dg)
        float sum = 0.0f;
        for (int c = threadIdx.x % 32; c < V; c += 32) { sum += __bfloat162float(ds_s[a * lv + c]) * __bfloat162float(h_s[a * lv + c]); }
        sum = warp_sum(sum);
        if (threadIdx.x % 32 == 0) { hsum[a] = sum; }
    }
    __syncthreads();
    // 2. W, U, V into the rows dO, V', dS left; meanwhile dX = Txᵀ dW (into dk̂'s tiles: b e^G dX, and dbeta's part)
    stage_async(w_s, 2 * lk, W + r0 * K, 2L * K, C, 2 * K);
    stage_async(u_s, 2 * lv, U + r0 * V, 2L * V, C, 2 * V);
    stage_async(v_s, 2 * lv, Vv + r0 * V, 2L * V, C, 2 * V);
    __pipeline_commit();
    #pragma unroll
    for (int u = 0; u < FB_SLOTS; u++) {
        int t = warp + FB_WARPS * u, i = t / mk, j = t % mk;
        if (t >= ntile) { continue; }
        mma_steps_t(akh[u], tx_s + 16 * i, lc, dw_s + 16 * j, 16 * lk, lk, mc);
        float v[8];
        for (int e = 0; e < 8; e++) {
            int r = 16 * i + frag_row(e), c = 16 * j + frag_col(e);
            v[e] = akh[u].x[e] * __bfloat162float(kh_s[r * lk + c]) * egs[r];
            akh[u].x[e] *= bs[r] * egs[r];
        }
        frag_row_sums(v, pb + 16 * i * (mk + mv) + j, mk + mv);
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    // 3. dY = Txᵀ dV' (dv = beta dY, and dbeta's part); dZ = dW Wᵀ + dV' Uᵀ (bf16, over h's rows)
    for (int t = warp; t < mc * mv; t += FB_WARPS) {
        int i = t / mv, j = t % mv;
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_steps_t(acc, tx_s + 16 * i, lc, dvn_s + 16 * j, 16 * lv, lv, mc);
        float v[8];
        for (int e = 0; e < 8; e++) {
            int r = 16 * i + frag_row(e), c = 16 * j + frag_col(e);
            v[e] = acc.x[e] * __bfloat162float(v_s[r * lv + c]);
            acc.x[e] *= bs[r];
        }
        frag_row_sums(v, pb + 16 * i * (mk + mv) + mk + j, mk + mv);
        wmma::store_matrix_sync(dv + (r0 + 16 * i) * V + 16 * j, acc, V, wmma::mem_row_major);
    }
    for (int t = warp; t < mc * mc; t += FB_WARPS) { bg_dz_tile(dz_s, lc, dw_s, w_s, lk, mk, dvn_s, u_s, lv, mv, t / mc, t % mc); }
    __syncthreads();
    // 4. dA = -Txᵀ dZ, strict lower: dMm = beta_i dA ⊙ E (bf16) and dbetaA's parts Σ_j dA ⊙ Mk (Mk = (K̂ K̃ᵀ) ⊙ E as
    //    scores_scalar_tc_kernel makes it)
    for (int t = warp; t < mc * mc; t += FB_WARPS) {
        int I = t / mc, J = t % mc;
        FragC acc, mk_;
        wmma::fill_fragment(acc, 0.0f);
        wmma::fill_fragment(mk_, 0.0f);
        if (J <= I) {
            mma_steps_t(acc, tx_s + 16 * I, lc, dz_s + 16 * J, 16 * lc, lc, mc);
            mma_steps<FragBT>(mk_, kh_s + 16 * I * lk, lk, kt_s + 16 * J * lk, 16, lk, mk);
        }
        float v[8];
        for (int e = 0; e < 8; e++) {
            int r = 16 * I + frag_row(e), c = 16 * J + frag_col(e);
            float E = (s.gk && c < r) ? expf(gs[r] - gs[c]) : 1.0f;
            if (dc && dc[r] != dc[c]) { E = 0.0f; }
            float da = c < r ? -acc.x[e] : 0.0f;
            v[e] = c < r ? da * (mk_.x[e] * E) : 0.0f;
            acc.x[e] = bs[r] * da * E;
        }
        frag_row_sums(v, pa + 16 * I * mc + J, mc);
        frag_store_bf16(dmx + 16 * I * lc + 16 * J, lc, acc, 1.0f);
    }
    __syncthreads();
    // 5. the scores' products into the kept tiles: dq += dPm K̃, dk̂ += dMm K̃, dk̃ += dPmᵀ Q̂ + dMmᵀ K̂; dG's parts; out
    #pragma unroll
    for (int u = 0; u < FB_SLOTS; u++) {
        int t = warp + FB_WARPS * u, I = t / mk, n = t % mk;
        if (t >= ntile) { continue; }
        for (int e = 0; e < 8; e++) { aq[u].x[e] *= egs[16 * I + frag_row(e)]; }
        mma_steps<FragB>(aq[u], dpx + 16 * I * lc, lc, kt_s + 16 * n, 16 * lk, lk, I + 1);
        mma_steps<FragB>(akh[u], dmx + 16 * I * lc, lc, kt_s + 16 * n, 16 * lk, lk, I + 1);
        for (int J = I; J < mc; J++) {
            mma_steps_t(akt[u], dpx + 16 * J * lc + 16 * I, lc, q_s + 16 * J * lk + 16 * n, 0, lk, 1);
            mma_steps_t(akt[u], dmx + 16 * J * lc + 16 * I, lc, kh_s + 16 * J * lk + 16 * n, 0, lk, 1);
        }
        if (s.gk) { // dG's parts feed only dg
            float v[8];
            for (int e = 0; e < 8; e++) {
                int r = 16 * I + frag_row(e), c = 16 * n + frag_col(e);
                v[e] = __bfloat162float(q_s[r * lk + c]) * aq[u].x[e] + __bfloat162float(kh_s[r * lk + c]) * akh[u].x[e] -
                       __bfloat162float(kt_s[r * lk + c]) * akt[u].x[e];
            }
            frag_row_sums(v, pg + 16 * I * mk + n, mk);
        }
        long o = (r0 + 16 * I) * K + 16 * n;
        wmma::store_matrix_sync(dq + o, aq[u], K, wmma::mem_row_major);
        if (fold_kt) {
            for (int e = 0; e < 8; e++) { akh[u].x[e] += akt[u].x[e]; }
        } else {
            wmma::store_matrix_sync(dkt + o, akt[u], K, wmma::mem_row_major);
        }
        wmma::store_matrix_sync(dkh + o, akh[u], K, wmma::mem_row_major);
    }
    __syncthreads();
    // 6. per row: dbeta = Σ dbeta parts + Σ dbetaA parts; dG_i; dg = the reverse cumsum of dG plus the last row's term
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float b = 0.0f, a = 0.0f, gsum = 0.0f;
        for (int j = 0; j < mk + mv; j++) { b += pb[i * (mk + mv) + j]; }
        for (int j = 0; j < mc; j++) { a += pa[i * mc + j]; }
        for (int j = 0; s.gk && j < mk; j++) { gsum += pg[i * mk + j]; }
        dbeta[r0 + i] = b + a;
        rowg[i] = gsum;
    }
    if (!s.gk) { return; }
    __syncthreads();
    if (warp != 0) { return; }
    int lane = threadIdx.x % 32;
    float egn = dc && dc[n1] >= 0 ? 0.0f : expf(gs[n1]), tot = 0.0f;
    for (int a = lane; a < K; a += 32) {
        float kx = 0.0f;
        for (int i = 0; i < mc; i++) { kx += pk[i * K + a]; }
        tot += kx + egn * hsum[a];
    }
    tot = warp_sum(tot);
    if (lane == 0) {
        float acc = tot;
        for (int i = n1; i >= 0; i--) { acc += rowg[i]; dg[r0 + i] = acc; }
    }
}
// BWD_FUSED_DEFAULT 1: the plan takes bwd_chunk_fused_kernel wherever it fits (lab v8 on an H100, 2026-12-07: every
// check PASS, pgdn-340m +6% end to end). bwd_fused_force (the kernel lab): 1 runs it where the plan's other conditions
// hold (the fused products and scalar scores, K = V = 128), 2 never. -DBWD_FUSED_DEFAULT=0 builds the three steps.
#ifndef BWD_FUSED_DEFAULT
#define BWD_FUSED_DEFAULT 1
#endif
static int bwd_fused_force = 0;
static bool bwd_fused_fits(const ChunkShape& s) {
    return (bwd_fused_force == 1 || (bwd_fused_force == 0 && BWD_FUSED_DEFAULT)) && s.C % 16 == 0 && s.C <= 64 &&
           fb_layout(s.C).bytes + 1024 <= (size_t)smem_optin;
}

// The WY form with its inputs made on chip: per chunk X = beta e^G k̂ and Y = beta v, rounded to bf16 as chunk_prep
// stores them, stay in shared memory; W = Tx X and U = Tx Y on tensor cores (fp32 sums, bf16 out, as the batched GEMMs
// give them); Qg and Kd as chunk_prep writes them. Saves X and Y's round trip (4 x 64 MiB a layer at pgdn-340m
// 16 x 2048) in the forward and again in the remake. G (the in-chunk cumsum) is already in place: chunk_prep's gates
// pass in the forward, kept per layer for the remake. The forward and the remake both run this kernel, so W and U
// made again are the forward's bit for bit. One block a chunk, 8 warps over the (C / 16) x ((K + V) / 16) tiles.
#define PW_WARPS 8
struct PwLayout { size_t x, y, g, bytes; }; // byte offsets: Tx (C, C + 8) at 0, X (C, K + 8), Y (C, V + 8), G + beta
static __host__ __device__ PwLayout pw_layout(int C, int K, int V, int gw) {
    PwLayout z;
    z.x = scan_align(2 * (size_t)C * (C + 8));
    z.y = z.x + scan_align(2 * (size_t)C * (K + 8));
    z.g = z.y + scan_align(2 * (size_t)C * (V + 8));
    z.bytes = z.g + scan_align(sizeof(float) * (size_t)C * (gw + 1));
    return z;
}
__global__ void __launch_bounds__(32 * PW_WARPS) prep_wy_kernel(floatX* W, floatX* U, floatX* Qg, floatX* Kd, const floatX* Tx,
                                                                const floatX* Q, const floatX* Kh, const floatX* Kt,
                                                                const floatX* Vv, const float* beta, const float* G,
                                                                ChunkShape s) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    int C = s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1, lk = K + 8, lv = V + 8, lc = C + 8;
    int mc = C / 16, mk = K / 16, mv = V / 16;
    long q = blockIdx.x, r0 = q * C;
    PwLayout z = pw_layout(C, K, V, gw);
    __nv_bfloat16 *tx_s = (__nv_bfloat16*)smem_raw, *x_s = (__nv_bfloat16*)(smem_raw + z.x); // (C, C + 8), (C, K + 8)
    __nv_bfloat16* y_s = (__nv_bfloat16*)(smem_raw + z.y);                                      // (C, V + 8)
    float *gs = (float*)(smem_raw + z.g), *bs = gs + C * gw;                                    // (C, gw), (C)
    stage_async(tx_s, 2 * lc, Tx + q * C * C, 2L * C, C, 2 * C); // in flight while X, Y are made
    __pipeline_commit();
    for (int e = threadIdx.x; e < C * gw; e += blockDim.x) { gs[e] = s.gk ? G[r0 * gw + e] : 0.0f; }
    for (int i = threadIdx.x; i < C; i += blockDim.x) { bs[i] = beta[r0 + i]; }
    __syncthreads();
    const signed char* dc = chunk_docs(s, q);
    for (int e = threadIdx.x * XVEC; e < C * K; e += blockDim.x * XVEC) { // chunk_prep_kernel's arithmetic, X on chip
        int i = e / K, j0 = e % K;
        long idx = (r0 + i) * K + j0;
        XPack qv = *(const XPack*)(Q + idx), khv = *(const XPack*)(Kh + idx), ktv = *(const XPack*)(Kt + idx), xo, qo, ko;
        prep_pack<XVEC>(xo, qo, ko, qv, khv, ktv, gs, s, dc, bs[i], i, j0);
        *(XPack*)(x_s + i * lk + j0) = xo;
        *(XPack*)(Qg + idx) = qo;
        *(XPack*)(Kd + idx) = ko;
    }
    for (int e = threadIdx.x * XVEC; e < C * V; e += blockDim.x * XVEC) {
        int i = e / V, j0 = e % V;
        float b = bs[i];
        XPack vv = *(const XPack*)(Vv + (r0 + i) * V + j0), yo;
        #pragma unroll
        for (int u = 0; u < XVEC; u++) { yo.v[u] = fromf<floatX>(b * tof(vv.v[u])); }
        *(XPack*)(y_s + i * lv + j0) = yo;
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int t = threadIdx.x / 32; t < mc * (mk + mv); t += PW_WARPS) { // tile (i, j): W's columns, then U's
        int i = t / (mk + mv), j = t % (mk + mv);
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        if (j < mk) {
            mma_steps<FragB>(acc, tx_s + 16 * i * lc, lc, x_s + 16 * j, 16 * lk, lk, mc);
            frag_store_bf16(W + (r0 + 16 * i) * K + 16 * j, K, acc, 1.0f);
        } else {
            mma_steps<FragB>(acc, tx_s + 16 * i * lc, lc, y_s + 16 * (j - mk), 16 * lv, lv, mc);
            frag_store_bf16(U + (r0 + 16 * i) * V + 16 * (j - mk), V, acc, 1.0f);
        }
    }
}
// PREP_WY_DEFAULT 1: the plan takes prep_wy_kernel for a scalar or no decay (one H100, 2026-12-07: lab v9 every check
// PASS, pgdn-340m 16 x 2048 +1.2% end to end). Not with channel decay: there the gates' cumsum (C x K fp32 a chunk)
// makes one more round trip and the block needs 77 KiB, and kda-340m lost 1.5% (the lab's kda forward at 16 x 2048
// 1.65 -> 1.85 ms), so the plan keeps chunk_prep + GEMMs. prep_wy_force (the kernel lab's v9): 1 runs it wherever it
// fits, 2 never.
#ifndef PREP_WY_DEFAULT
#define PREP_WY_DEFAULT 1
#endif
static int prep_wy_force = 0;
static bool prep_wy_fits(const ChunkShape& s) {
    bool want = prep_wy_force == 1 || (prep_wy_force == 0 && PREP_WY_DEFAULT && s.gk <= 1);
    return want && !mma_bad && s.C % 16 == 0 && s.K % 16 == 0 && s.V % 16 == 0 &&
           pw_layout(s.C, s.K, s.V, s.gk > 1 ? s.gk : 1).bytes + 1024 <= (size_t)smem_optin;
}
#endif

// floatX copy of an fp32 buffer, XVEC elements per thread (16-byte stores), a partial vector at the end
__global__ void to_floatX_kernel(floatX* out, const float* in, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * XVEC;
    if (i >= n) { return; }
    if (i + XVEC > n) {
        for (; i < n; i++) { out[i] = fromf<floatX>(in[i]); }
        return;
    }
    XPack o;
    #pragma unroll
    for (int k = 0; k < XVEC; k += 4) {
        float4 v = *(const float4*)(in + i + k);
        o.v[k] = fromf<floatX>(v.x); o.v[k + 1] = fromf<floatX>(v.y); o.v[k + 2] = fromf<floatX>(v.z); o.v[k + 3] = fromf<floatX>(v.w);
    }
    *(XPack*)(out + i) = o;
}
static void to_floatX(floatX* out, const float* in, long n) {
    if (!aligned16(out) || !aligned16(in)) { fail(EXIT_SYSTEM, "to_floatX: unaligned buffers"); }
    to_floatX_kernel<<<cdiv(cdiv(n, XVEC), 256), 256, 0, main_stream>>>(out, in, n);
    cudaCheck(cudaGetLastError());
}

// Per-layer mixer tensors kept from the forward for the backward (head-major padded unless noted)
// (the trainer allocates only what its plan needs: no Mk with the fused scalar scores, whose backward makes it again;
// with the tensor-core scans Vn and O point at one pair for all layers, Acts::vn / Acts::o, made again by mixer_remake)
struct MixerSaved {
    float *G, *Mk;                  // (rows, gw) cumsum; (nq, C, C) decayed K̂K̃ᵀ, strictly lower
    floatX *Tx, *P;                 // (nq, C, C) (I + A)^-1 and the decayed Q̂K̃ᵀ
    floatX* Vn;                     // (rows, V) the chunks' new values V'
    floatX* hstate;                 // (nq, K, V) state at each chunk start
    floatX* O;                      // (rows, V) mixer output
};

// scratch shared by all layers
struct MixerScratch {
    float *Mraw, *Praw, *A;                         // (nq, C, C)
    floatX *X, *Y;                                  // (rows, K | V)
    // the WY form W = Tx X, U = Tx Y and the decayed Qg, Kd (rows, K | V): made again in the backward from the saved
    // Tx and G (chunk_prep and two batched GEMMs, bit for bit the forward's) instead of kept per layer (4 x 64 MiB a
    // layer at pgdn-340m, 16 x 2048)
    floatX *W, *U, *Qg, *Kd;
    float *dVloc, *dQg, *dKd, *dX, *dY;             // (rows, V | K)
    floatX *dhstate, *dVn, *dWx, *dZx;
    float *dP, *dA, *dZ, *dbetaA;                   // (nq, C, C), dZ = dW Wᵀ + dV' Uᵀ; dbetaA (rows)
    floatX *dPm, *dMm;
    float *dq_s, *dkh_s, *dkt_s;
    PrecondBufs pc;                                 // diagonal preconditioner scan scratch (carry: the layer's)
    float* Of;                                      // (rows, V) O in fp32 where batched GEMMs make it (bf16, no WMMA scan)
    float *gB, *gT, *gS;                            // two-level scans: (B H G, K, V) the groups' B, (B H G, K, K) their
                                                    // transitions, (B H G, K, V) their start states (forward, then backward)
};

static size_t smem_scores_channel(const ChunkShape& s) { return (size_t)(4 * s.C + 3 * SUB) * (s.K + 1) * sizeof(float); }
static size_t smem_scores_channel_bwd(const ChunkShape& s) {
    return (size_t)((4 * s.C + 3 * SUB) * (s.K + 1) + 2 * s.C * s.C) * sizeof(float);
}
static size_t smem_state_fwd(const ChunkShape& s) { return (size_t)(s.K * SCAN_BV + s.C * SCAN_BV + s.C * (s.K + 1)) * sizeof(float); }
static size_t smem_state_bwd(const ChunkShape& s) { return (size_t)(s.K * SCAN_BV + 2 * s.C * SCAN_BV + 2 * s.C * (s.K + 1)) * sizeof(float); }
static int finish_vec(const ChunkShape& s) { return s.K % 4 == 0 && s.V % 4 == 0 ? 4 : 1; }
static size_t smem_finish(const ChunkShape& s) {
    int v = finish_vec(s);
    return (size_t)(2 * s.C * s.K + s.C * (s.K / v) + s.C * (s.V / v) + 2 * s.K + s.C) * sizeof(float);
}

// raise the dynamic shared-memory limits once (above 48 KB needs an opt-in); the limit is what the device allows a
// block minus the kernel's own static shared memory
template <typename F> static void allow_dynamic_smem(F* kernel, int optin) {
    cudaFuncAttributes at;
    cudaCheck(cudaFuncGetAttributes(&at, (const void*)kernel));
    cudaCheck(cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)at.sharedSizeBytes));
}
// the conv_norm_*_vec kernels' opt-in, every kernel size
template <int NV> static void conv_vec_setup(void) {
    for (int cs = 1; cs <= 4; cs++) {
        allow_dynamic_smem(conv_fwd_vec_kernel<NV, false>(cs), smem_optin);
        allow_dynamic_smem(conv_fwd_vec_kernel<NV, true>(cs), smem_optin);
        allow_dynamic_smem(conv_bwd_vec_kernel<NV, false>(cs), smem_optin);
        allow_dynamic_smem(conv_bwd_vec_kernel<NV, true>(cs), smem_optin);
    }
}
static void mixer_kernel_setup(void) {
    int optin = 0;
    cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    smem_optin = optin;
    cudaCheck(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
    allow_dynamic_smem(conv_norm_forward_kernel<1>, optin);
    allow_dynamic_smem(conv_norm_forward_kernel<2>, optin);
    allow_dynamic_smem(conv_norm_forward_kernel<4>, optin);
    allow_dynamic_smem(conv_norm_forward_kernel<8>, optin);
    allow_dynamic_smem(conv_norm_backward_kernel<1>, optin);
    allow_dynamic_smem(conv_norm_backward_kernel<2>, optin);
    allow_dynamic_smem(conv_norm_backward_kernel<4>, optin);
    allow_dynamic_smem(conv_norm_backward_kernel<8>, optin);
    conv_vec_setup<4>();
    allow_dynamic_smem(scores_channel_kernel, optin);
    allow_dynamic_smem(scores_channel_backward_kernel, optin);
    allow_dynamic_smem(state_forward_kernel, optin);
    allow_dynamic_smem(state_backward_kernel, optin);
    allow_dynamic_smem(bwd_finish_kernel<1>, optin);
    allow_dynamic_smem(bwd_finish_kernel<4>, optin);
    allow_dynamic_smem(tri_inverse_kernel, optin);
    allow_dynamic_smem(chunk_prep_kernel<1>, optin);     // channel decay: C x K fp32 (64 KiB at K = 256)
    allow_dynamic_smem(chunk_prep_kernel<XVEC>, optin);
#ifndef ENABLE_FP32
    mma_selftest();
    allow_dynamic_smem(scores_channel_tc_kernel, optin);
    allow_dynamic_smem(scores_channel_dq_tc_kernel<false>, optin);
    allow_dynamic_smem(scores_channel_dq_tc_kernel<true>, optin);
    allow_dynamic_smem(scores_channel_dkt_tc_kernel<false>, optin);
    allow_dynamic_smem(scores_channel_dkt_tc_kernel<true>, optin);
    allow_dynamic_smem(scores_scalar_tc_kernel<false>, optin);
    allow_dynamic_smem(scores_scalar_tc_kernel<true>, optin);
    allow_dynamic_smem(bwd_scores_scalar_tc_kernel<false>, optin);
    allow_dynamic_smem(bwd_scores_scalar_tc_kernel<true>, optin);
    allow_dynamic_smem(state_forward_wmma_kernel<1, 16>, optin);
    allow_dynamic_smem(state_forward_wmma_kernel<2, 16>, optin);
    allow_dynamic_smem(state_forward_wmma_kernel<3, 16>, optin);
    allow_dynamic_smem(state_forward_wmma_kernel<1, 32>, optin);
    allow_dynamic_smem(state_forward_wmma_kernel<2, 32>, optin);
    allow_dynamic_smem(state_backward_wmma_kernel<1, 16>, optin);
    allow_dynamic_smem(state_backward_wmma_kernel<2, 16>, optin);
    allow_dynamic_smem(state_backward_wmma_kernel<3, 16>, optin);
    allow_dynamic_smem(state_backward_wmma_kernel<1, 32>, optin);
    allow_dynamic_smem(state_backward_wmma_kernel<2, 32>, optin);
    allow_dynamic_smem(scan_groups_combine_kernel, optin);
    allow_dynamic_smem(state_outputs_wmma_kernel<8>, optin);
    allow_dynamic_smem(state_outputs_wmma_kernel<16>, optin);
    allow_dynamic_smem(bwd_gemms_tc_kernel, optin); // two blocks a multiprocessor: all of its shared memory for them
    allow_dynamic_smem(bwd_chunk_fused_kernel<false>, optin);
    allow_dynamic_smem(bwd_chunk_fused_kernel<true>, optin);
    allow_dynamic_smem(prep_wy_kernel, optin);
    cudaCheck(cudaFuncSetAttribute((const void*)bwd_gemms_tc_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
#endif
    allow_dynamic_smem(precond_exact_forward_kernel, optin);
    allow_dynamic_smem(precond_exact_backward_kernel, optin);
}

#ifndef ENABLE_FP32
static int scores_force_fma = 0; // the lab sets it to time and check the unfused scores in the bf16 build (FMA channel scores; scalar: GEMMs + mask + inverse)
static bool scores_use_tc(const ChunkShape& s) {
    size_t need = 0;
    for (int w = 0; w < 3; w++) { need = std::max(need, scores_tc_smem(s.C, s.K, w).total); }
    return !scores_force_fma && !mma_bad && s.gk > 1 && s.K % 16 == 0 && s.K <= 256 && s.C % SUB == 0 && need + 1024 <= (size_t)smem_optin;
}
// SCORES_FIN_DEFAULT 1: with the channel-decay scores on tensor cores, the backward's finish runs inside the two scores
// kernels (their FIN instantiations: the rows side with dq, dk̂, dbeta, dv; the columns side with dk̃ and dg) instead of
// bwd_finish_kernel, so dq_s, dk̂_s, dk̃_s and dbetaA never reach device memory (lab v10 on an H100, 2026-12-07: every
// check PASS, kda-340m +0.7%, pkda-340m +0.8% end to end). scores_fin_force (the kernel lab): 1 on wherever the
// tensor-core scores run, 2 off. -DSCORES_FIN_DEFAULT=0 builds the separate finish.
#ifndef SCORES_FIN_DEFAULT
#define SCORES_FIN_DEFAULT 1
#endif
static int scores_fin_force = 0;
static bool scores_fin_for(const ChunkShape& s) {
    return (scores_fin_force == 1 || (scores_fin_force == 0 && SCORES_FIN_DEFAULT)) && s.K % 4 == 0 && s.V % 4 == 0;
}
static bool scores_scalar_fused(const ChunkShape& s) {
    size_t need = std::max(smem_scores_scalar_tc(s.C, s.K), smem_bwd_scores_scalar_tc(s.C, s.K));
    return !scores_force_fma && !mma_bad && s.gk <= 1 && s.K % 16 == 0 && s.C % 16 == 0 && need + 1024 <= (size_t)smem_optin;
}
#endif

// The mixer's kernel plan for a shape: which flavour of each step runs. A function of the shape alone (and of the
// kernel lab's force flags), so the trainer decides it once, prints it, and allocates only the scratch it needs.
struct MixerPlan {
    bool scan_wmma;     // tensor-core state scans that also make O (forward) and Pᵀ dO (backward); else SIMT + GEMMs
    int scan_groups;    // chunk groups of the two-level scans (1: the sequential scan; ScanGroups)
    int scan_stages;    // the tensor-core scans' stage buffers (ScanStage): 1, or 2 or 3 for few blocks on long chains
    int scan_bv;        // the tensor-core scans' value columns a block: 32, or 16 for few blocks on long chains
    bool scores_fused;  // scalar / no decay: scores + (I + A)^-1 in one tensor-core kernel, and one for the backward
    bool scores_tc;     // channel decay: tensor-core scores; else the exact FMA kernels
    bool finish_rows;   // the backward's finishing kernel with a warp per row (scalar / no decay, K = V = 128)
    bool scores_fin;    // channel decay: the finish inside the two tensor-core scores kernels; else bwd_finish_kernel
    bool gemms_fused;   // the backward's chunk-local products in one tensor-core kernel; else ten batched GEMMs
    bool bwd_fused;     // products, scores and finish in one kernel (bwd_chunk_fused_kernel); else three steps
    bool prep_wy;       // X, Y made on chip and W, U with Qg, Kd in one kernel (prep_wy_kernel); else chunk_prep + GEMMs
    OutsPlan outs;      // with scan_wmma: the V'/O remake's work items, stage buffers and warps (outs_plan_for)
};
// Chunk groups for the tensor-core scans: enough (b, h, 32-column) blocks for two per multiprocessor, with at least 4
// chunks a group; 1 where the sequential scan already fills the device (the 16 x 2048 training shape has 512 blocks).
// SCAN_GROUPS_DEFAULT is 0: dev/cuda/delta_chunk's v3 found the two-level scans correct but slower than the sequential
// scan at every length on the H200 (2026-12-02; README "GPU numbers"), so the trainer runs the sequential scan. scan_groups_force (the kernel lab): > 0 that many groups, -1 the rule below anyway.
#define SCAN_GROUPS_DEFAULT 0
#ifndef ENABLE_FP32
static int scan_groups_force = 0;
static int scan_groups_for(const ChunkShape& s, int bv) {
    int blocks = s.B * s.H * (s.V / bv), want = 2 * num_sms, G;
    if (s.K % bv != 0) { return 1; }
    if (scan_groups_force > 0) { G = std::min(scan_groups_force, s.NC); }
    else if (!(SCAN_GROUPS_DEFAULT || scan_groups_force < 0) || blocks >= want || s.NC < 8) { return 1; }
    else { G = std::min(cdiv(want, blocks), s.NC / 4); }
    G = std::max(1, std::min(G, 65535 / (s.B * s.H))); // (b, h, group) is the grid's y
    int M = cdiv(s.NC, G);
    return cdiv(s.NC, M); // no empty group
}
// Two stage buffers where the scan has fewer blocks than two per multiprocessor (one sequence, few heads: each block
// walks a long chain, and the one-stage kernel leaves the loads' latency on it) and they fit (K <= 128 at chunk 64).
// On the H200 (2026-12-03, dev/cuda/delta_chunk v4 vs v2) two stages are 2-3% faster at B = 1, H = 8 (32 blocks) and
// slower at the 16 x 2048 training shape (512 blocks): the rule below. Three where they fit (16 value columns, K <= 128
// at chunk 64) and each direction has warps idle in a chunk's first phase (the forward's before its O tiles, `ob`; the
// backward's after its dV' tiles): those warps stage the chunk after next into the third buffer while the others
// compute, which takes the copies' issue and a barrier off the chunk-to-chunk chain (dev/cuda/delta_chunk v12).
// scan_stages_force (the kernel lab): 1, 2 or 3 whatever the rule says, where they fit.
#define SCAN_STAGES_DEFAULT 1
#define SCAN_STAGES3_DEFAULT 1
static int scan_stages_force = 0;
static bool scan3_fits(const ChunkShape& s, int bv) {
    int mt = s.C / 16, kt = s.K / 16, nb = bv / 16;
    return bv == 16 && (kt + 2 * mt) * nb <= SCAN_WARPS_FWD && mt * nb < SCAN_WARPS_BWD &&
           smem_scan_wmma(s, 3, bv) + 1024 <= (size_t)smem_optin;
}
static int scan_stages_for(const ChunkShape& s, int groups, int bv) {
    bool fits = smem_scan_wmma(s, 2, bv) + 1024 <= (size_t)smem_optin, fits3 = scan3_fits(s, bv);
    if (scan_stages_force) { return scan_stages_force == 3 && fits3 ? 3 : scan_stages_force >= 2 && fits ? 2 : 1; }
    int blocks = s.B * s.H * (s.V / bv) * groups;
    if (!(SCAN_STAGES_DEFAULT && fits && blocks < 2 * num_sms)) { return 1; }
    return SCAN_STAGES3_DEFAULT && fits3 ? 3 : 2;
}
// The value columns of a tensor-core scan block: 16 where even 16-column blocks (B H V / 16) leave each one a
// multiprocessor of its own (one sequence, few heads: every block walks a long chain, and the narrower slice halves
// the products on each chunk's step while twice the blocks still run at once), else 32 (more blocks would only queue).
// The products are the same 16 x 16 tiles either way, so the results are bit for bit the same (dev/cuda/delta_chunk
// v5). On the H200 (2026-12-04, dev/cuda/delta_chunk at B = 1, H = 8): fwd+bwd 13-15% faster at T = 2048 .. 16384 for
// dn, pdn, gdn; 8-9% slower at B = 16, T = 2048 (1,024 blocks of 16). scan_bv_force (the lab, PDN_SCAN_BV): 16 or 32.
static int scan_bv_force = 0;
static int scan_bv_for(const ChunkShape& s) {
    if (scan_bv_force == 16 || scan_bv_force == 32) { return scan_bv_force; }
    return (long)s.B * s.H * (s.V / 16) <= num_sms ? 16 : 32;
}
#endif
static MixerPlan mixer_plan(const ChunkShape& s) {
    MixerPlan p{};
    p.scan_groups = 1;
    p.scan_stages = 1;
    p.scan_bv = SCAN_BV;
#ifndef ENABLE_FP32 // the fp32 build runs the exact SIMT / FMA kernels everywhere
    p.outs = outs_plan_for(s.C, s.K, s.V);
    p.scan_wmma = scan_uses_wmma(s) && p.outs.nw > 0;
    if (p.scan_wmma) {
        p.scan_bv = scan_bv_for(s);
        p.scan_groups = scan_groups_for(s, p.scan_bv);
        p.scan_stages = scan_stages_for(s, p.scan_groups, p.scan_bv);
    }
    p.scores_fused = scores_scalar_fused(s);
    p.scores_tc = scores_use_tc(s);
    p.scores_fin = p.scores_tc && scores_fin_for(s);
    p.gemms_fused = bwd_gemms_fused(s);
    p.prep_wy = prep_wy_fits(s);
#endif
    p.finish_rows = s.gk <= 1 && s.K == 128 && s.V == 128;
#ifndef ENABLE_FP32
    p.bwd_fused = p.gemms_fused && p.scores_fused && p.finish_rows && bwd_fused_fits(s);
#endif
    return p;
}
// K, V: the model's head sizes (s has the padded ones, mixer_pad)
static void mixer_plan_print(const ChunkShape& s, int K, int V) {
    MixerPlan p = mixer_plan(s);
    char pad[96] = "";
    if (K != s.K || V != s.V) { snprintf(pad, sizeof pad, " (the model's %d, %d with zero columns)", K, V); }
    const char* scores = s.gk > 1 ? (p.scores_tc ? "channel-decay scores on tensor cores" : "channel-decay scores by FMA (exact)")
                                  : (p.scores_fused ? "scores + inverse fused on tensor cores"
                                                    : "scores by batched GEMMs + mask, blocked inverse");
    char scan[256];
    snprintf(scan, sizeof scan, "%s%s", p.scan_wmma ? "state scans on tensor cores (they make O and P^T dO too)"
                                                    : "SIMT fp32 state scans + batched GEMMs",
             p.scan_groups > 1 ? ", two-level" : "");
    if (p.scan_groups > 1) { snprintf(scan + strlen(scan), sizeof scan - strlen(scan), " in %d chunk groups", p.scan_groups); }
    if (p.scan_stages == 2) { snprintf(scan + strlen(scan), sizeof scan - strlen(scan), ", next chunk staged whole"); }
    if (p.scan_stages == 3) {
        snprintf(scan + strlen(scan), sizeof scan - strlen(scan), ", chunk after next staged whole by idle warps");
    }
    if (p.scan_wmma) {
        snprintf(scan + strlen(scan), sizeof scan - strlen(scan),
                 ", %d value columns a block; V', O made again by %d columns, %d stage%s, %d warps", p.scan_bv, p.outs.bw,
                 p.outs.ns, p.outs.ns > 1 ? "s" : "", p.outs.nw);
    }
    const char* wy = p.prep_wy ? "W, U from X, Y on chip (one kernel with Qg, Kd)" : "W, U by batched GEMMs";
    if (p.bwd_fused) {
        printf("mixer kernels (K %d, V %d%s, chunk %d): %s; %s; %s; backward after the scan in one kernel a chunk "
               "(products, scores, finish)\n", s.K, s.V, pad, s.C, scan, scores, wy);
        return;
    }
    printf("mixer kernels (K %d, V %d%s, chunk %d): %s; %s; %s; backward products %s; backward finish %s\n", s.K, s.V,
           pad, s.C, scan, scores, wy, p.gemms_fused ? "in one tensor-core kernel" : "by batched GEMMs",
           p.scores_fin ? "in the scores kernels" : p.finish_rows ? "a warp per row" : "a block per chunk");
}

#ifndef ENABLE_FP32
// The tensor-core scans over all chunks: sequential (ng = 1) or two-level in ng chunk groups (ScanGroups): the groups'
// B and transitions, their start states, then every group's scan from its start state with the outputs.
static void state_forward_wmma(MixerSaved* sv, MixerScratch* sc, const float* S0, float* S_final, const ChunkShape& s,
                               const MixerPlan& p) {
    int ng = p.scan_groups, ns = p.scan_stages, bv = p.scan_bv;
    size_t sm = smem_scan_wmma_dir(s, 0, ns, bv);
    auto scan_kernel = bv == 16 ? (ns == 3   ? state_forward_wmma_kernel<3, 16>
                                   : ns == 2 ? state_forward_wmma_kernel<2, 16>
                                             : state_forward_wmma_kernel<1, 16>)
                                : (ns == 2 ? state_forward_wmma_kernel<2, 32> : state_forward_wmma_kernel<1, 32>);
    int BH = s.B * s.H, nt = 32 * SCAN_WARPS_FWD, K = s.K, V = s.V;
    if (ng > 1 && s.doc) { fail(EXIT_SYSTEM, "the two-level scans do not take packed documents (a kernel-lab setting)"); }
    if (ng <= 1) {
        scan_kernel<<<dim3(V / bv, BH), nt, sm, main_stream>>>(
            sv->hstate, sv->Vn, sv->O, sc->W, sc->U, sc->Kd, sc->Qg, sv->P, sv->G, S0, S_final, s, SCAN_SEQ);
        cudaCheck(cudaGetLastError());
        return;
    }
    int M = cdiv(s.NC, ng);
    ChunkShape sk = s;
    sk.V = K; // the transition's scan: a K x K state
    scan_kernel<<<dim3(V / bv, BH * ng), nt, sm, main_stream>>>(
        nullptr, nullptr, nullptr, sc->W, sc->U, sc->Kd, nullptr, nullptr, sv->G, nullptr, sc->gB, s, ScanGroups{ng, M, 0});
    scan_kernel<<<dim3(K / bv, BH * ng), nt, sm, main_stream>>>(
        nullptr, nullptr, nullptr, sc->W, nullptr, sc->Kd, nullptr, nullptr, sv->G, nullptr, sc->gT, sk,
        ScanGroups{ng, M, SCAN_HOMOG | SCAN_IDENT});
    scan_groups_combine_kernel<<<dim3(BH, V / SCAN_BV), 256, 2 * K * SCAN_BV * sizeof(float), main_stream>>>(
        sc->gS, S_final, sc->gT, sc->gB, S0, ng, K, V, 0);
    scan_kernel<<<dim3(V / bv, BH * ng), nt, sm, main_stream>>>(
        sv->hstate, sv->Vn, sv->O, sc->W, sc->U, sc->Kd, sc->Qg, sv->P, sv->G, sc->gS, nullptr, s, ScanGroups{ng, M, SCAN_OUT});
    cudaCheck(cudaGetLastError());
}
static void state_backward_wmma(MixerScratch* sc, const MixerSaved* sv, const floatX* dO, const ChunkShape& s,
                                const MixerPlan& p) {
    int ng = p.scan_groups, ns = p.scan_stages, bv = p.scan_bv;
    size_t sm = smem_scan_wmma_dir(s, 1, ns, bv);
    auto scan_kernel = bv == 16 ? (ns == 3   ? state_backward_wmma_kernel<3, 16>
                                   : ns == 2 ? state_backward_wmma_kernel<2, 16>
                                             : state_backward_wmma_kernel<1, 16>)
                                : (ns == 2 ? state_backward_wmma_kernel<2, 32> : state_backward_wmma_kernel<1, 32>);
    int BH = s.B * s.H, nt = 32 * SCAN_WARPS_BWD, K = s.K, V = s.V;
    if (ng > 1 && s.doc) { fail(EXIT_SYSTEM, "the two-level scans do not take packed documents (a kernel-lab setting)"); }
    if (ng <= 1) {
        scan_kernel<<<dim3(V / bv, BH), nt, sm, main_stream>>>(
            sc->dhstate, sc->dVn, sv->P, dO, sc->W, sc->Qg, sc->Kd, sv->G, nullptr, nullptr, s, SCAN_SEQ);
        cudaCheck(cudaGetLastError());
        return;
    }
    int M = cdiv(s.NC, ng);
    ChunkShape sk = s;
    sk.V = K;
    scan_kernel<<<dim3(V / bv, BH * ng), nt, sm, main_stream>>>(
        nullptr, nullptr, sv->P, dO, sc->W, sc->Qg, sc->Kd, sv->G, nullptr, sc->gB, s, ScanGroups{ng, M, 0});
    scan_kernel<<<dim3(K / bv, BH * ng), nt, sm, main_stream>>>(
        nullptr, nullptr, nullptr, nullptr, sc->W, nullptr, sc->Kd, sv->G, nullptr, sc->gT, sk,
        ScanGroups{ng, M, SCAN_HOMOG | SCAN_IDENT});
    scan_groups_combine_kernel<<<dim3(BH, V / SCAN_BV), 256, 2 * K * SCAN_BV * sizeof(float), main_stream>>>(
        sc->gS, nullptr, sc->gT, sc->gB, nullptr, ng, K, V, 1);
    scan_kernel<<<dim3(V / bv, BH * ng), nt, sm, main_stream>>>(
        sc->dhstate, sc->dVn, sv->P, dO, sc->W, sc->Qg, sc->Kd, sv->G, sc->gS, nullptr, s, ScanGroups{ng, M, SCAN_OUT});
    cudaCheck(cudaGetLastError());
}
#endif

// W = Tx X, U = Tx Y (chunk_prep's X = diag(beta) K̃-side rows and Y = diag(beta) V, decayed), per chunk. With the
// plan's prep_wy one kernel makes X and Y on chip and writes Qg and Kd too (chunk_prep has made only G); else chunk_prep
// has made X, Y, Qg, Kd and two batched GEMMs make W and U.
static void mixer_wy(MixerScratch* sc, const MixerSaved* sv, const floatX* Q, const floatX* Kh, const floatX* Kt,
                     const floatX* Vv, const float* beta, const ChunkShape& s, const MixerPlan& p) {
    int C = s.C, K = s.K, V = s.V;
    long CC = (long)C * C, CK = (long)C * K, CV = (long)C * V;
#ifndef ENABLE_FP32
    if (p.prep_wy) {
        for (const void* x : {(const void*)Q, (const void*)Kh, (const void*)Kt, (const void*)Vv, (const void*)sc->Qg,
                              (const void*)sc->Kd, (const void*)sc->W, (const void*)sc->U, (const void*)sv->Tx}) {
            if (!aligned16(x)) { fail(EXIT_SYSTEM, "prep_wy_kernel: unaligned buffers"); }
        }
        prep_wy_kernel<<<(unsigned)s.nq, 32 * PW_WARPS, pw_layout(C, K, V, s.gk > 1 ? s.gk : 1).bytes, main_stream>>>(
            sc->W, sc->U, sc->Qg, sc->Kd, sv->Tx, Q, Kh, Kt, Vv, beta, sv->G, s);
        cudaCheck(cudaGetLastError());
        return;
    }
#else
    (void)Q; (void)Kh; (void)Kt; (void)Vv; (void)beta; (void)p;
#endif
    bgemm(false, false, C, K, C, sv->Tx, C, CC, sc->X, K, CK, sc->W, false, K, CK, (int)s.nq, 1.0f, 0.0f);
    bgemm(false, false, C, V, C, sv->Tx, C, CC, sc->Y, V, CV, sc->U, false, V, CV, (int)s.nq, 1.0f, 0.0f);
}

// What the mixer's backward reads from the scratch, made again for a layer whose forward is no longer the last one
// run (bit for bit the forward's): W, U, Qg, Kd (chunk_prep, G rewritten with the values it holds, and two batched
// GEMMs) from the kept Tx and G, and with the tensor-core scans V' and O from the kept chunk states. The trainer
// calls it before the layer's output-norm backward, which reads O.
static void mixer_remake(MixerSaved* sv, MixerScratch* sc, const floatX* Q, const floatX* Kh, const floatX* Kt,
                         const floatX* Vv, const float* beta, const float* g, const ChunkShape& s) {
    PROF("mixer.remake");
    MixerPlan p = mixer_plan(s);
    if (!p.prep_wy) { chunk_prep(sv->G, sc->X, sc->Y, sc->Qg, sc->Kd, Q, Kh, Kt, Vv, beta, s.gk ? g : nullptr, s); } // else G is kept
    mixer_wy(sc, sv, Q, Kh, Kt, Vv, beta, s, p);
#ifndef ENABLE_FP32
    if (p.scan_wmma) { state_outputs_wmma(sv->Vn, sv->O, sv->hstate, sc->W, sc->U, sc->Qg, sv->P, s, p.outs); }
#endif
}

// Forward of the mixer core: Q (q̂ scaled), Kh (k̂), Kt (k̃), Vv, beta, g (null without decay) -> sv->O (and the
// tensors the backward needs). S0 / S_final (B,H,K,V fp32) optional (generation).
static void delta_chunk_forward(MixerSaved* sv, MixerScratch* sc, const floatX* Q, const floatX* Kh, const floatX* Kt,
                                const floatX* Vv, const float* beta, const float* g, const float* S0, float* S_final,
                                const ChunkShape& s) {
    int C = s.C, K = s.K, V = s.V;
    long CC = (long)C * C, CK = (long)C * K, CV = (long)C * V, KV = (long)K * V;
    int nq = (int)s.nq;
    MixerPlan p = mixer_plan(s);
    {
    PROF("mixer.fwd.prep");
    if (!p.prep_wy) {
        chunk_prep(sv->G, sc->X, sc->Y, sc->Qg, sc->Kd, Q, Kh, Kt, Vv, beta, s.gk ? g : nullptr, s);
    } else if (s.gk) { // the scores' G alone; X, Y, Qg, Kd come with W and U (mixer_wy)
        chunk_prep(sv->G, nullptr, nullptr, nullptr, nullptr, Q, Kh, Kt, Vv, beta, g, s);
    }
    }
    bool fused = p.scores_fused; // scores and inverse in one kernel
    {
    PROF("mixer.fwd.scores");
#ifndef ENABLE_FP32
    if (fused) {
        (s.doc ? scores_scalar_tc_kernel<true> : scores_scalar_tc_kernel<false>)<<<nq, SS_THREADS, smem_scores_scalar_tc(C, K), main_stream>>>(sv->Mk, sv->P, sv->Tx, Q, Kh, Kt, sv->G,
                                                                                      beta, s);
    } else
#endif
    if (s.gk > 1) {
#ifndef ENABLE_FP32
        if (p.scores_tc) {
            scores_channel_tc_kernel<<<nq, SC_THREADS, scores_tc_smem(C, K, 0).total, main_stream>>>(sv->Mk, sc->A, sv->P, Q, Kh, Kt,
                                                                                             sv->G, beta, s);
        } else
#endif
        scores_channel_kernel<<<nq, 256, smem_scores_channel(s), main_stream>>>(sv->Mk, sc->A, sv->P, Q, Kh, Kt, sv->G, beta, s);
    } else {
        bgemm(false, true, C, C, K, Kh, K, CK, Kt, K, CK, sc->Mraw, true, C, CC, nq, 1.0f, 0.0f);
        bgemm(false, true, C, C, K, Q, K, CK, Kt, K, CK, sc->Praw, true, C, CC, nq, 1.0f, 0.0f);
        scores_mask_kernel<<<cdiv(s.nq * CC, 256), 256, 0, main_stream>>>(sv->Mk, sc->A, sv->P, sc->Mraw, sc->Praw, sv->G, beta, s);
    }
    cudaCheck(cudaGetLastError());
    }
    if (!fused) {
    PROF("mixer.fwd.inverse");
    tri_inverse(sv->Tx, sc->A, nq, C);
    }
    {
    PROF("mixer.fwd.gemms");
    mixer_wy(sc, sv, Q, Kh, Kt, Vv, beta, s, p);
    }
    bool o_done = p.scan_wmma; // the tensor-core scan also makes O
    {
    PROF("mixer.fwd.scan");
#ifndef ENABLE_FP32
    if (o_done) { state_forward_wmma(sv, sc, S0, S_final, s, p); } else
#endif
    state_forward_kernel<<<dim3(s.B * s.H, cdiv(V, SCAN_BV)), 256, smem_state_fwd(s), main_stream>>>(
        sv->hstate, sv->Vn, sc->W, sc->U, sc->Kd, sv->G, S0, S_final, s);
    cudaCheck(cudaGetLastError());
    }
    if (!o_done) { // O = Qg S + P V' in fp32, then floatX (in the fp32 build O is that fp32 result)
    PROF("mixer.fwd.gemms");
    float* Of = sizeof(floatX) == sizeof(float) ? (float*)sv->O : sc->Of;
    bgemm(false, false, C, V, K, sc->Qg, K, CK, sv->hstate, V, KV, Of, true, V, CV, nq, 1.0f, 0.0f);
    bgemm(false, false, C, V, C, sv->P, C, CC, sv->Vn, V, CV, Of, true, V, CV, nq, 1.0f, 1.0f);
    if ((void*)Of != (void*)sv->O) { to_floatX(sv->O, Of, s.nq * CV); }
    }
}

// Backward of the mixer core from dO (hm floatX, zero in padded rows). Writes (not accumulates) dq, dkh, dkt,
// dv (hm fp32), dbeta (rows), dg (rows, gw; if gk). fold_kt: no preconditioner, so k̃ = k̂ and dkh gets dkt too
// (dkt is then not written). Reads the forward's W, U, Qg, Kd (and, with the tensor-core scans, V' and O) from the
// scratch: after other layers' forwards, mixer_remake makes them again first.
static void delta_chunk_backward(float* dq, float* dkh, float* dkt, float* dv, float* dbeta, float* dg, MixerScratch* sc,
                                 const MixerSaved* sv, const floatX* dO, const floatX* Q, const floatX* Kh, const floatX* Kt,
                                 const floatX* Vv, const float* beta, int fold_kt, const ChunkShape& s, bool side = false) {
    int C = s.C, K = s.K, V = s.V;
    long CC = (long)C * C, CK = (long)C * K, CV = (long)C * V, KV = (long)K * V, rows = s.nq * C;
    int nq = (int)s.nq;
    MixerPlan p = mixer_plan(s);
    bool wmma_scan = p.scan_wmma; // the tensor-core scan makes Pᵀ dO itself
    if (!wmma_scan) {
    PROF("mixer.bwd.gemms");
    bgemm(true, false, C, V, C, sv->P, C, CC, dO, V, CV, sc->dVloc, true, V, CV, nq, 1.0f, 0.0f);
    }
    {
    PROF("mixer.bwd.scan");
    if (side) { side_begin(); } // the second stream's work may run from here, beside the scan (pdn_backward)
#ifndef ENABLE_FP32
    if (wmma_scan) { state_backward_wmma(sc, sv, dO, s, p); } else
#endif
    state_backward_kernel<<<dim3(s.B * s.H, cdiv(V, SCAN_BV)), 256, smem_state_bwd(s), main_stream>>>(
        sc->dhstate, sc->dVn, sc->dVloc, dO, sc->W, sc->Qg, sc->Kd, sv->G, nullptr, s);
    cudaCheck(cudaGetLastError());
    }
#ifndef ENABLE_FP32
    if (p.bwd_fused) { // products, scores and finish in one kernel
        PROF("mixer.bwd.fused");
        (s.doc ? bwd_chunk_fused_kernel<true> : bwd_chunk_fused_kernel<false>)<<<nq, 32 * FB_WARPS, fb_layout(C).bytes, main_stream>>>(
            dq, dkh, dkt, dv, dbeta, dg, dO, sv->hstate, sv->Vn, sc->dhstate, sc->dVn, sv->Tx, sc->W, sc->U, Q, Kh, Kt, Vv,
            sv->G, beta, fold_kt, s);
        cudaCheck(cudaGetLastError());
        return;
    }
#endif
    {
    PROF("mixer.bwd.gemms");
#ifndef ENABLE_FP32
    if (p.gemms_fused) {
        bwd_gemms_tc_kernel<<<nq, 32 * BG_WARPS, bg_layout(C, K, V).bytes, main_stream>>>(
            sc->dQg, sc->dP, sc->dKd, sc->dX, sc->dY, sc->dA, dO, sv->hstate, sv->Vn, sc->dhstate, sc->dVn, sv->Tx, sc->W,
            sc->U, s);
        cudaCheck(cudaGetLastError());
    } else
#endif
    {
        bgemm(false, true, C, K, V, dO, V, CV, sv->hstate, V, KV, sc->dQg, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(false, true, C, C, V, dO, V, CV, sv->Vn, V, CV, sc->dP, true, C, CC, nq, 1.0f, 0.0f);
        bgemm(false, true, C, K, V, sv->Vn, V, CV, sc->dhstate, V, KV, sc->dKd, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(false, true, C, K, V, sc->dVn, V, CV, sv->hstate, V, KV, sc->dWx, false, K, CK, nq, -1.0f, 0.0f); // only its floatX copy is used
        bgemm(true, false, C, K, C, sv->Tx, C, CC, sc->dWx, K, CK, sc->dX, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(true, false, C, V, C, sv->Tx, C, CC, sc->dVn, V, CV, sc->dY, true, V, CV, nq, 1.0f, 0.0f);
        // dA = -dX Wᵀ - dY Uᵀ = -Txᵀ (dW Wᵀ + dV' Uᵀ): the C x C sum first, so dX and dY need no floatX copies
        bgemm(false, true, C, C, K, sc->dWx, K, CK, sc->W, K, CK, sc->dZ, true, C, CC, nq, 1.0f, 0.0f);
        bgemm(false, true, C, C, V, sc->dVn, V, CV, sc->U, V, CV, sc->dZ, true, C, CC, nq, 1.0f, 1.0f);
        to_floatX(sc->dZx, sc->dZ, nq * CC);
        bgemm(true, false, C, C, C, sv->Tx, C, CC, sc->dZx, C, CC, sc->dA, true, C, CC, nq, -1.0f, 0.0f);
    }
    }
    {
    PROF(p.scores_fin ? "mixer.bwd.scores+finish" : "mixer.bwd.scores");
    if (s.gk > 1) {
#ifndef ENABLE_FP32
        if (p.scores_fin) { // the finish too: dq, dk̂, dbeta, dv, then dk̃ (or into dk̂), dg; sc->dq_s carries dG's rows part
            scores_channel_dq_tc_kernel<true><<<nq, SC_THREADS, scores_tc_smem(C, K, 1).total, main_stream>>>(
                dq, dkh, dbeta, sc->dq_s, dv, sc->dP, sc->dA, sv->Mk, Kt, sv->G, beta, sc->dQg, sc->dX, sc->dY, Q, Kh, Vv, s);
            scores_channel_dkt_tc_kernel<true><<<nq, SC_THREADS, scores_tc_smem(C, K, 2).total, main_stream>>>(
                dkt, dkh, dg, sc->dP, sc->dA, Q, Kh, sv->G, beta, sc->dq_s, sc->dKd, Kt, sv->hstate, sc->dhstate, fold_kt, s);
            cudaCheck(cudaGetLastError());
            return;
        }
        if (p.scores_tc) {
            scores_channel_dq_tc_kernel<false><<<nq, SC_THREADS, scores_tc_smem(C, K, 1).total, main_stream>>>(
                sc->dq_s, sc->dkh_s, sc->dbetaA, nullptr, nullptr, sc->dP, sc->dA, sv->Mk, Kt, sv->G, beta, nullptr, nullptr,
                nullptr, nullptr, nullptr, nullptr, s);
            scores_channel_dkt_tc_kernel<false><<<nq, SC_THREADS, scores_tc_smem(C, K, 2).total, main_stream>>>(
                sc->dkt_s, nullptr, nullptr, sc->dP, sc->dA, Q, Kh, sv->G, beta, nullptr, nullptr, nullptr, nullptr, nullptr,
                fold_kt, s);
        } else
#endif
        scores_channel_backward_kernel<<<nq, 256, smem_scores_channel_bwd(s), main_stream>>>(
            sc->dq_s, sc->dkh_s, sc->dkt_s, sc->dbetaA, sc->dP, sc->dA, sv->Mk, Q, Kh, Kt, sv->G, beta, s);
        cudaCheck(cudaGetLastError());
    } else
#ifndef ENABLE_FP32
    if (p.scores_fused) {
        (s.doc ? bwd_scores_scalar_tc_kernel<true> : bwd_scores_scalar_tc_kernel<false>)<<<nq, 256, smem_bwd_scores_scalar_tc(C, K), main_stream>>>(
            sc->dq_s, sc->dkh_s, sc->dkt_s, sc->dbetaA, sc->dP, sc->dA, Q, Kh, Kt, sv->G, beta, s);
        cudaCheck(cudaGetLastError());
    } else
#endif
    {
        bwd_scores_mask_kernel<<<cdiv(rows, 8), 256, 0, main_stream>>>(sc->dPm, sc->dMm, sc->dbetaA, sc->dP, sc->dA, sv->Mk,
                                                                       sv->G, beta, s);
        cudaCheck(cudaGetLastError());
        bgemm(false, false, C, K, C, sc->dPm, C, CC, Kt, K, CK, sc->dq_s, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(true, false, C, K, C, sc->dPm, C, CC, Q, K, CK, sc->dkt_s, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(false, false, C, K, C, sc->dMm, C, CC, Kt, K, CK, sc->dkh_s, true, K, CK, nq, 1.0f, 0.0f);
        bgemm(true, false, C, K, C, sc->dMm, C, CC, Kh, K, CK, sc->dkt_s, true, K, CK, nq, 1.0f, 1.0f);
    }
    }
    PROF("mixer.bwd.finish");
    if (p.finish_rows) {
        (s.doc ? bwd_finish_rows_kernel<true> : bwd_finish_rows_kernel<false>)<<<nq, 32 * FIN_WARPS, 0, main_stream>>>(dq, dkh, dkt, dv, dbeta, dg, sc->dQg, sc->dq_s, sc->dX, sc->dkh_s,
                                                       sc->dkt_s, sc->dKd, sc->dY, sc->dbetaA, Q, Kh, Kt, Vv, sv->G, beta,
                                                       sv->hstate, sc->dhstate, fold_kt, s);
    } else {
        auto finish = finish_vec(s) == 4 ? bwd_finish_kernel<4> : bwd_finish_kernel<1>;
        finish<<<nq, 256, smem_finish(s), main_stream>>>(dq, dkh, dkt, dv, dbeta, dg, sc->dQg, sc->dq_s, sc->dX, sc->dkh_s,
                                                         sc->dkt_s, sc->dKd, sc->dY, sc->dbetaA, Q, Kh, Kt, Vv, sv->G, beta,
                                                         sv->hstate, sc->dhstate, fold_kt, s);
    }
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// 3b. softmax attention layers (issue 19; train_pdn.c section 2b is the reference): the rotary embedding and causal
// (optionally windowed) grouped-query attention. These kernels are the FP32 build's, generation's (the KV cache) and
// the bf16 build's when cuDNN's fused attention is not available (section 3c). Layouts: q, o (B, T, Hq, D) = the
// projections' rows; k, v (B, Tcap, Hkv, D); lse (B, Hq, T) fp32, each row's log-sum-exp (cuDNN's stats layout).

#define ATTN_MAX_D 256   // head dims up to this (8 elements a lane)

// The angle of fla's RotaryEmbedding as train_pdn.c's rope_angle makes it (fp32), its cosine and sine in double. The
// frequencies 1 / theta^(2i/D) are made on the host with the CPU reference's expression (CUDA's powf may differ from
// glibc's by a few ulp, and the angle's error grows with the position), so the angle is one fp32 product on both.
__constant__ float rope_inv_freq[ATTN_MAX_D / 2];
static void rope_freqs(int D, float theta) {
    static int D0 = 0;
    static float theta0 = 0.0f;
    if (D == D0 && theta == theta0) { return; }
    float f[ATTN_MAX_D / 2];
    for (int i = 0; i < D / 2; i++) { f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D); }
    cudaCheck(cudaMemcpyToSymbol(rope_inv_freq, f, (D / 2) * sizeof(float)));
    D0 = D; theta0 = theta;
}
__device__ __forceinline__ void rope_cs(int pos, int i, float* cs, float* sn) {
    float ang = (float)pos * rope_inv_freq[i];
    double s, c;
    sincos((double)ang, &s, &c);
    *cs = (float)c; *sn = (float)s;
}

// out (N, nh, D) = rotate(inp) by the angles times dir (-1: the transpose, for the backward); a thread per pair (i, i +
// D/2) of a row; out may be inp
template <typename Tin, typename Tout>
__global__ void rope_kernel(Tout* out, const Tin* inp, long N, int T, int nh, int D, int pos0, float dir) {
    int half = D / 2;
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * nh * half) { return; }
    int i = (int)(idx % half);
    long r = idx / half, n = r / nh;
    float cs, sn;
    rope_cs(pos0 + (int)(n % T), i, &cs, &sn);
    sn *= dir;
    long base = r * D;
    float x1 = tof(inp[base + i]), x2 = tof(inp[base + half + i]);
    out[base + i] = fromf<Tout>(x1 * cs - x2 * sn);
    out[base + half + i] = fromf<Tout>(x2 * cs + x1 * sn);
}

template <typename Tin, typename Tout>
static void rope_launch(Tout* out, const Tin* inp, long N, int T, int nh, int D, int pos0, float theta, float dir) {
    long n = N * nh * (D / 2);
    rope_freqs(D, theta);
    rope_kernel<Tin, Tout><<<cdiv(n, 256), 256, 0, main_stream>>>(out, inp, N, T, nh, D, pos0, dir);
    cudaCheck(cudaGetLastError());
}

// the first key the query at position pos sees (window W counts the query's own token; 0: all)
__device__ __forceinline__ int attn_first_key(int pos, int W) { return W > 0 && pos - W + 1 > 0 ? pos - W + 1 : 0; }

// Forward, a warp per (b, t, h) query row with an online softmax over its keys (the T queries are the last T of Tk
// positions: Tk = T in training, the tokens so far with a KV cache). Each lane holds D/32 columns.
__global__ void attention_forward_kernel(floatX* o, float* lse, const floatX* q, const floatX* k, const floatX* v, int B,
                                         int T, int Tk, int Tcap, int Hq, int Hkv, int D, int W, float scale) {
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long)B * T * Hq) { return; }
    int h = (int)(warp % Hq), t = (int)((warp / Hq) % T), b = (int)(warp / ((long)Hq * T));
    int hk = h / (Hq / Hkv), pos = Tk - T + t, ne = (D + 31) / 32;
    const floatX* qr = q + (((long)b * T + t) * Hq + h) * D;
    float qv[ATTN_MAX_D / 32], acc[ATTN_MAX_D / 32];
    for (int e = 0; e < ne; e++) { int c = lane + 32 * e; qv[e] = c < D ? tof(qr[c]) : 0.0f; acc[e] = 0.0f; }
    float mx = -INFINITY, sum = 0.0f;
    for (int j = attn_first_key(pos, W); j <= pos; j++) {
        const floatX* kr = k + (((long)b * Tcap + j) * Hkv + hk) * D;
        const floatX* vr = v + (((long)b * Tcap + j) * Hkv + hk) * D;
        float dot = 0.0f;
        for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { dot += qv[e] * tof(kr[c]); } }
        float s = warp_sum(dot) * scale, mnew = fmaxf(mx, s), corr = expf(mx - mnew), p = expf(s - mnew);
        sum = sum * corr + p;
        for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { acc[e] = acc[e] * corr + p * tof(vr[c]); } }
        mx = mnew;
    }
    floatX* orow = o + (((long)b * T + t) * Hq + h) * D;
    for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { orow[c] = fromf<floatX>(acc[e] / sum); } }
    if (lane == 0) { lse[((long)b * Hq + h) * T + t] = mx + logf(sum); }
}

// Backward (training: Tk = Tcap = T), with P = exp(S - lse) and Di = rowsum(dO ⊙ O):
// dQ = scale * Σ_j P (dO·v_j - Di) k_j, a warp per query row (it also stores Di for the second kernel)
__global__ void attention_backward_dq_kernel(float* dq, float* Di, const floatX* dout, const floatX* q, const floatX* k,
                                             const floatX* v, const floatX* o, const float* lse, int B, int T, int Hq,
                                             int Hkv, int D, int W, float scale) {
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long)B * T * Hq) { return; }
    int h = (int)(warp % Hq), t = (int)((warp / Hq) % T), b = (int)(warp / ((long)Hq * T));
    int hk = h / (Hq / Hkv), ne = (D + 31) / 32;
    long qi = (((long)b * T + t) * Hq + h) * D;
    float qv[ATTN_MAX_D / 32], dov[ATTN_MAX_D / 32], acc[ATTN_MAX_D / 32], di = 0.0f;
    for (int e = 0; e < ne; e++) {
        int c = lane + 32 * e;
        qv[e] = c < D ? tof(q[qi + c]) : 0.0f; dov[e] = c < D ? tof(dout[qi + c]) : 0.0f; acc[e] = 0.0f;
        if (c < D) { di += dov[e] * tof(o[qi + c]); }
    }
    di = warp_sum(di);
    float l = lse[((long)b * Hq + h) * T + t];
    for (int j = attn_first_key(t, W); j <= t; j++) {
        long ki = (((long)b * T + j) * Hkv + hk) * D;
        float dot = 0.0f, dp = 0.0f;
        for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { dot += qv[e] * tof(k[ki + c]); dp += dov[e] * tof(v[ki + c]); } }
        dot = warp_sum(dot); dp = warp_sum(dp);
        float ds = expf(dot * scale - l) * (dp - di);
        for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { acc[e] += ds * tof(k[ki + c]); } }
    }
    for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { dq[qi + c] = acc[e] * scale; } }
    if (lane == 0) { Di[((long)b * Hq + h) * T + t] = di; }
}

// dK_j = scale * Σ P (dO·v_j - Di) q, dV_j = Σ P dO over the queries that see key j (t in [j, j + W - 1]) of every
// query head of its group: a warp per key row, so each sum runs in one order
__global__ void attention_backward_dkdv_kernel(float* dk, floatX* dv, const floatX* dout, const floatX* q, const floatX* k,
                                               const floatX* v, const float* lse, const float* Di, int B, int T, int Hq,
                                               int Hkv, int D, int W, float scale) {
    long warp = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long)B * T * Hkv) { return; }
    int hk = (int)(warp % Hkv), j = (int)((warp / Hkv) % T), b = (int)(warp / ((long)Hkv * T));
    int G = Hq / Hkv, ne = (D + 31) / 32, t1 = W > 0 && j + W - 1 < T - 1 ? j + W - 1 : T - 1;
    long ki = (((long)b * T + j) * Hkv + hk) * D;
    float kv[ATTN_MAX_D / 32], vv[ATTN_MAX_D / 32], dka[ATTN_MAX_D / 32], dva[ATTN_MAX_D / 32];
    for (int e = 0; e < ne; e++) {
        int c = lane + 32 * e;
        kv[e] = c < D ? tof(k[ki + c]) : 0.0f; vv[e] = c < D ? tof(v[ki + c]) : 0.0f; dka[e] = dva[e] = 0.0f;
    }
    for (int g = 0; g < G; g++) {
        int h = hk * G + g;
        for (int t = j; t <= t1; t++) {
            long qi = (((long)b * T + t) * Hq + h) * D;
            float dot = 0.0f, dp = 0.0f;
            for (int e = 0; e < ne; e++) { int c = lane + 32 * e; if (c < D) { dot += tof(q[qi + c]) * kv[e]; dp += tof(dout[qi + c]) * vv[e]; } }
            dot = warp_sum(dot); dp = warp_sum(dp);
            long r = ((long)b * Hq + h) * T + t;
            float p = expf(dot * scale - lse[r]), ds = p * (dp - Di[r]);
            for (int e = 0; e < ne; e++) {
                int c = lane + 32 * e;
                if (c < D) { dva[e] += p * tof(dout[qi + c]); dka[e] += ds * tof(q[qi + c]); }
            }
        }
    }
    for (int e = 0; e < ne; e++) {
        int c = lane + 32 * e;
        if (c < D) { dk[ki + c] = dka[e] * scale; dv[ki + c] = fromf<floatX>(dva[e]); }
    }
}

static void attention_forward_own(floatX* o, float* lse, const floatX* q, const floatX* k, const floatX* v, int B, int T,
                                  int Tk, int Tcap, int Hq, int Hkv, int D, int W) {
    long warps = (long)B * T * Hq;
    attention_forward_kernel<<<cdiv(warps * 32, 256), 256, 0, main_stream>>>(o, lse, q, k, v, B, T, Tk, Tcap, Hq, Hkv, D, W,
                                                                             1.0f / sqrtf((float)D));
    cudaCheck(cudaGetLastError());
}

// dq, dk fp32 (before the rotary embedding's backward), dv floatX; Di: (B, Hq, T) scratch
static void attention_backward_own(float* dq, float* dk, floatX* dv, float* Di, const floatX* dout, const floatX* q,
                                   const floatX* k, const floatX* v, const floatX* o, const float* lse, int B, int T, int Hq,
                                   int Hkv, int D, int W) {
    float scale = 1.0f / sqrtf((float)D);
    long wq = (long)B * T * Hq, wk = (long)B * T * Hkv;
    attention_backward_dq_kernel<<<cdiv(wq * 32, 256), 256, 0, main_stream>>>(dq, Di, dout, q, k, v, o, lse, B, T, Hq, Hkv,
                                                                              D, W, scale);
    cudaCheck(cudaGetLastError());
    attention_backward_dkdv_kernel<<<cdiv(wk * 32, 256), 256, 0, main_stream>>>(dk, dv, dout, q, k, v, lse, Di, B, T, Hq,
                                                                                Hkv, D, W, scale);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// 3c. cuDNN's fused flash attention (bf16 build), through the backend graph API in this one place. The operation graph
// is the SDPA pattern cuDNN's fused engine matches: S = Q Kᵀ (fp32), S *= 1/sqrt(D), the causal mask (row and column
// indices, row >= col, and with a window col + W > row; else -inf), the softmax with its stats (max, sub, exp, sum, log, add -> Stats; div -> P), O = P V.
// Built once for the training shape at startup (sdpa_setup); when it cannot be finalized there the reason is printed
// and the own kernels of section 3b run. The FP32 build always runs the own kernels (the fp32 comparison with the CPU).
// The backward graph is cuDNN's fused backward pattern (one key/value head per query head; grouped-query heads run
// the own kernels, which read cuDNN's O and Stats: their layout (B, H, T, 1) is the own kernels' lse).

#ifdef USE_CUDNN
#include <cudnn_graph.h>

static void cudnn_check(cudnnStatus_t st, const char* file, int line) {
    if (st != CUDNN_STATUS_SUCCESS) {
        char msg[512] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        fprintf(stderr, "error: cuDNN %s [%s:%d] %s\n", cudnnGetErrorString(st), file, line, msg);
        exit(EXIT_SYSTEM);
    }
}
#define cudnnCheck(st) cudnn_check(st, __FILE__, __LINE__)

// a built plan: its workspace, the descriptors it was made from (kept while it lives) and the shape it is for (ok = 0:
// not built; why says what failed). One handle for all of them.
struct SdpaPlan {
    int ok, B, T, Hq, Hkv, D, W;
    cudnnBackendDescriptor_t plan;
    void* ws; int64_t ws_bytes;
    std::vector<cudnnBackendDescriptor_t>* graph;
    char why[400];
};
static cudnnHandle_t sdpa_handle = nullptr;
static SdpaPlan sdpa_fwd = {}, sdpa_bwd = {};
static float* sdpa_softmax_sum = nullptr;   // the backward graph's fp32 tensor in memory (B, H, T)
// grouped-query attention's backward (Hq > Hkv): K, V repeated to every query head and dK, dV per query head, for the
// one backward graph (B, T, Hq, D); each group's dK, dV are then summed in head order (kv_group_sum)
static floatX *sdpa_kr = nullptr, *sdpa_vr = nullptr, *sdpa_dkr = nullptr, *sdpa_dvr = nullptr;

// a graph under construction: every descriptor made, so that all are destroyed at the end; the first failure is kept
struct SdpaBuild {
    std::vector<cudnnBackendDescriptor_t> made;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    char where[96] = "";
    bool fine() const { return st == CUDNN_STATUS_SUCCESS; }
    void check(cudnnStatus_t s, const char* what) {
        if (fine() && s != CUDNN_STATUS_SUCCESS) { st = s; snprintf(where, sizeof where, "%s", what); }
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char* what) {
        cudnnBackendDescriptor_t d = nullptr;
        check(cudnnBackendCreateDescriptor(type, &d), what);
        if (d) { made.push_back(d); }
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
             const void* v, const char* what) {
        if (fine()) { check(cudnnBackendSetAttribute(d, a, t, n, v), what); }
    }
    void finalize(cudnnBackendDescriptor_t d, const char* what) { if (fine()) { check(cudnnBackendFinalize(d), what); } }
    // a 4-d tensor; virtual ones are the graph's intermediates, by-value ones scalars passed from the host
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const int64_t* dim, const int64_t* stride,
                                    bool is_virtual, bool by_value = false) {
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
        int64_t align = 16;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor type");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
        if (by_value) { set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value"); }
        finalize(t, "tensor");
        return t;
    }
    // y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX; prec: the compute type (boolean for comparisons, as cuDNN's
    // own SDPA graphs have them)
    cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t tsel, cudnnBackendDescriptor_t y, int64_t axis = -1,
                                       cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
        if (axis >= 0) { set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis"); }
        finalize(pw, "pointwise");
        return op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                  {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x}, {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                  {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tsel}, {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}}, "pointwise op");
    }
    cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
        cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
        finalize(mm, "matmul");
        return op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                  {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b}, {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                  {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}}, "matmul op");
    }
    cudnnBackendDescriptor_t reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
        cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
        set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
        finalize(rd, "reduction");
        return op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                  {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y}, {CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd}}, "reduction op");
    }
    // an operation node: its descriptor attributes (the null ones left unset), finalized
    cudnnBackendDescriptor_t op(cudnnBackendDescriptorType_t type,
                                std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attrs,
                                const char* what) {
        cudnnBackendDescriptor_t o = make(type, what);
        for (auto& a : attrs) {
            if (a.second) { set(o, a.first, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.second, what); }
        }
        finalize(o, what);
        return o;
    }
    // The masks as cuDNN's SDPA patterns have them (row, col from gen_index over the scores): causal, row >= col, and
    // with a window (window: its by-value tensor, else null) also col + W > row, i.e. row - col < W; masked scores
    // become -inf. The operations go into ops, the intermediates take uids from *uid.
    void causal_mask(std::vector<cudnnBackendDescriptor_t>& ops, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t neginf,
                     cudnnBackendDescriptor_t window, cudnnBackendDescriptor_t y, const int64_t* dim, const int64_t* stride,
                     int64_t* uid) {
        auto row = tensor((*uid)++, CUDNN_DATA_INT32, dim, stride, true), col = tensor((*uid)++, CUDNN_DATA_INT32, dim, stride, true);
        auto mask = tensor((*uid)++, CUDNN_DATA_BOOLEAN, dim, stride, true);
        auto yc = window ? tensor((*uid)++, CUDNN_DATA_FLOAT, dim, stride, true) : y;
        ops.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, 2));
        ops.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, 3));
        ops.push_back(pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, mask, -1, CUDNN_DATA_BOOLEAN));
        ops.push_back(pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neginf, mask, yc));
        if (!window) { return; }
        auto row2 = tensor((*uid)++, CUDNN_DATA_INT32, dim, stride, true), col2 = tensor((*uid)++, CUDNN_DATA_INT32, dim, stride, true);
        auto colw = tensor((*uid)++, CUDNN_DATA_FLOAT, dim, stride, true), mask2 = tensor((*uid)++, CUDNN_DATA_BOOLEAN, dim, stride, true);
        ops.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, yc, nullptr, nullptr, row2, 2));
        ops.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, yc, nullptr, nullptr, col2, 3));
        ops.push_back(pointwise(CUDNN_POINTWISE_ADD, col2, window, nullptr, colw));
        ops.push_back(pointwise(CUDNN_POINTWISE_CMP_GT, colw, row2, nullptr, mask2, -1, CUDNN_DATA_BOOLEAN));
        ops.push_back(pointwise(CUDNN_POINTWISE_BINARY_SELECT, yc, neginf, mask2, y));
    }
    // a plan was made from them: they stay with it (sdpa_release destroys them), else they go now
    bool keep = false;
    ~SdpaBuild() { if (!keep) { for (auto d : made) { cudnnBackendDestroyDescriptor(d); } } }
};

// whether an engine config's engine says its results may differ from run to run (atomics)
static bool engine_nondeterministic(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t eng;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) { return false; }
    int64_t n = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    bool nd = false;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                 &n, notes) == CUDNN_STATUS_SUCCESS) {
        for (int64_t i = 0; i < n; i++) { nd = nd || notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC; }
    }
    cudnnBackendDestroyDescriptor(eng);
    return nd;
}

// The operation graph of ops, cuDNN's heuristics (mode A) over it, and the first engine config whose plan finalizes
// and whose engine is deterministic, into p. Returns 1, or 0 with p.why.
static int sdpa_plan(SdpaBuild& g, cudnnBackendDescriptor_t* ops, int nops, SdpaPlan& p, int B, int T, int Hq, int Hkv,
                     int D, int W) {
    auto graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops, "graph ops");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &sdpa_handle, "graph handle");
    g.finalize(graph, "operation graph");
    auto heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics graph");
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm, "heuristics mode");
    g.finalize(heur, "heuristics (no engine matches the graph?)");
    // the engine configs the heuristics rank, tried in order until one's plan finalizes
    const int want = 8;
    cudnnBackendDescriptor_t cfgs[want];
    for (int i = 0; i < want; i++) { cfgs[i] = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"); }
    int64_t got = 0;
    if (g.fine()) { g.check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, want, &got, cfgs), "heuristics results"); }
    if (g.fine() && got == 0) { snprintf(p.why, sizeof p.why, "cuDNN's heuristics offer no engine for the graph"); return 0; }
    cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
    int skipped = 0;
    for (int64_t i = 0; g.fine() && i < got; i++) {
        if (engine_nondeterministic(cfgs[i])) { skipped++; continue; } // runs must be bit-reproducible
        cudnnBackendDescriptor_t plan = nullptr;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) { continue; }
        cudnnStatus_t s1 = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &sdpa_handle);
        cudnnStatus_t s2 = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        last = s1 != CUDNN_STATUS_SUCCESS ? s1 : s2 != CUDNN_STATUS_SUCCESS ? s2 : cudnnBackendFinalize(plan);
        if (last != CUDNN_STATUS_SUCCESS) { cudnnBackendDestroyDescriptor(plan); continue; }
        int64_t n = 0;
        cudnnCheck(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p.ws_bytes));
        if (p.ws_bytes > 0) { cudaCheck(cudaMalloc(&p.ws, (size_t)p.ws_bytes)); }
        p.plan = plan;
        p.graph = new std::vector<cudnnBackendDescriptor_t>(g.made);
        g.keep = true;
        p.ok = 1; p.B = B; p.T = T; p.Hq = Hq; p.Hkv = Hkv; p.D = D; p.W = W;
        return 1;
    }
    if (!g.fine()) {
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        snprintf(p.why, sizeof p.why, "%s failed: %s %s", g.where, cudnnGetErrorString(g.st), msg);
    } else {
        char msg[160] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        snprintf(p.why, sizeof p.why, "none of the %lld engine configs finalized (%d skipped as nondeterministic; last: %s %s)",
                 (long long)got, skipped, cudnnGetErrorString(last), msg);
    }
    return 0;
}

// run a plan with its tensors (uids[i] at ptrs[i]; by-value scalars as host pointers)
static void sdpa_run(const SdpaPlan& p, const int64_t* uids, void* const* ptrs, int n) {
    cudnnBackendDescriptor_t vp;
    cudnnCheck(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    cudnnCheck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
    cudnnCheck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    cudnnCheck(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &p.ws));
    cudnnCheck(cudnnBackendFinalize(vp));
    cudnnCheck(cudnnBackendExecute(sdpa_handle, p.plan, vp));
    cudnnCheck(cudnnBackendDestroyDescriptor(vp));
}

// the tensors' unique ids in the variant pack
enum { SDPA_Q = 1, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_SCALE, SDPA_NEGINF, SDPA_DO, SDPA_DQ, SDPA_DK, SDPA_DV,
       SDPA_ONE, SDPA_SOFTMAX_SUM, SDPA_WINDOW };

// Build the forward graph and its plan for (B, T, Hq, Hkv, D), causal, in a window of W tokens if W > 0; q, o (B, T, Hq, D) and k, v (B, T, Hkv,
// D) as the projections write them (cuDNN's BSHD strides), Stats (B, Hq, T, 1) fp32. Returns 1, or 0 with sdpa_fwd.why.
static int sdpa_build_forward(int B, int T, int Hq, int Hkv, int D, int W) {
    SdpaBuild g;
    int64_t b = B, s = T, h = Hq, hk = Hkv, d = D;
    int64_t dq[4] = {b, h, s, d}, sq[4] = {s * h * d, d, h * d, 1};          // Q, O
    int64_t dkt[4] = {b, hk, d, s}, skt[4] = {s * hk * d, d, 1, hk * d};    // Kᵀ: K's memory with the last two swapped
    int64_t dv[4] = {b, hk, s, d}, sv[4] = {s * hk * d, d, hk * d, 1};      // V
    int64_t ds[4] = {b, h, s, s}, ss[4] = {h * s * s, s * s, s, 1};         // the scores (virtual)
    int64_t dr[4] = {b, h, s, 1}, sr[4] = {h * s, s, 1, 1};                  // per row: max, sum, Stats
    int64_t d1[4] = {1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};                      // scalars
    int64_t uid = 100;                                                       // virtual tensors from 100 on
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, fl = CUDNN_DATA_FLOAT;
    auto Q = g.tensor(SDPA_Q, bf, dq, sq, false), K = g.tensor(SDPA_K, bf, dkt, skt, false);
    auto V = g.tensor(SDPA_V, bf, dv, sv, false), O = g.tensor(SDPA_O, bf, dq, sq, false);
    auto Stats = g.tensor(SDPA_STATS, fl, dr, sr, false);
    auto scale = g.tensor(SDPA_SCALE, fl, d1, s1, false, true), neginf = g.tensor(SDPA_NEGINF, fl, d1, s1, false, true);
    auto S1 = g.tensor(uid++, fl, ds, ss, true), S2 = g.tensor(uid++, fl, ds, ss, true), S3 = g.tensor(uid++, fl, ds, ss, true);
    auto M = g.tensor(uid++, fl, dr, sr, true), S4 = g.tensor(uid++, fl, ds, ss, true), E = g.tensor(uid++, fl, ds, ss, true);
    // P in bf16: the fused engines take the second matmul's A operand in the I/O type (the lab's tolerances allow it)
    auto Z = g.tensor(uid++, fl, dr, sr, true), logZ = g.tensor(uid++, fl, dr, sr, true), P = g.tensor(uid++, bf, ds, ss, true);
    auto window = W ? g.tensor(SDPA_WINDOW, fl, d1, s1, false, true) : nullptr;
    std::vector<cudnnBackendDescriptor_t> ops = {g.matmul(Q, K, S1), g.pointwise(CUDNN_POINTWISE_MUL, S1, scale, nullptr, S2)};
    g.causal_mask(ops, S2, neginf, window, S3, ds, ss, &uid);
    ops.insert(ops.end(), {
        g.reduction(CUDNN_REDUCE_TENSOR_MAX, S3, M),
        g.pointwise(CUDNN_POINTWISE_SUB, S3, M, nullptr, S4),
        g.pointwise(CUDNN_POINTWISE_EXP, S4, nullptr, nullptr, E),
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z),
        g.pointwise(CUDNN_POINTWISE_LOG, Z, nullptr, nullptr, logZ),
        g.pointwise(CUDNN_POINTWISE_ADD, M, logZ, nullptr, Stats),
        g.pointwise(CUDNN_POINTWISE_DIV, E, Z, nullptr, P),
        g.matmul(P, V, O),
    });
    return sdpa_plan(g, ops.data(), (int)ops.size(), sdpa_fwd, B, T, Hq, Hkv, D, W);
}

// Build the backward graph (the pattern of cuDNN's fused flash-attention backward) for H heads with one key/value head
// each (grouped-query attention repeats K and V to H heads first: sdpa_backward): softmax_sum = rowsum(dO ⊙ O); P = exp(mask(Q Kᵀ · scale) - Stats);
// dV = Pᵀ dO; dS = P ⊙ (dO Vᵀ - softmax_sum) · scale; dK = dSᵀ Q; dQ = dS K, written directly: the other pattern (an
// fp32 dQ accumulator, then its copy) runs engines that add into it atomically, in no fixed order, and the trainer's
// runs are bit-reproducible; this one's engines keep dS in a workspace (B·H·T² bf16) instead. Engines that still say
// they are nondeterministic are skipped (sdpa_plan). K and V come in transposed views (D, T) as in the forward;
// softmax_sum is a tensor in memory (sdpa_softmax_sum). Returns 1, or 0 with sdpa_bwd.why.
static int sdpa_build_backward(int B, int T, int H, int Hkv, int D, int W) {
    SdpaBuild g;
    int64_t b = B, s = T, h = H, d = D;
    int64_t dq[4] = {b, h, s, d}, sq[4] = {s * h * d, d, h * d, 1};          // Q, O, dO, dQ, dK, dV (BSHD)
    int64_t dkt[4] = {b, h, d, s}, skt[4] = {s * h * d, d, 1, h * d};       // Kᵀ, Vᵀ views
    int64_t ds[4] = {b, h, s, s}, ss[4] = {h * s * s, s * s, s, 1};         // scores (virtual)
    int64_t dst[4] = {b, h, s, s}, sst[4] = {h * s * s, s * s, 1, s};       // their transposes (reshape)
    int64_t dr[4] = {b, h, s, 1}, sr[4] = {h * s, s, 1, 1};                  // per row
    int64_t d1[4] = {1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};
    int64_t uid = 100;
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, fl = CUDNN_DATA_FLOAT;
    auto Q = g.tensor(SDPA_Q, bf, dq, sq, false), K = g.tensor(SDPA_K, bf, dkt, skt, false);
    auto V = g.tensor(SDPA_V, bf, dkt, skt, false), O = g.tensor(SDPA_O, bf, dq, sq, false);
    auto dO = g.tensor(SDPA_DO, bf, dq, sq, false), Stats = g.tensor(SDPA_STATS, fl, dr, sr, false);
    auto dQ = g.tensor(SDPA_DQ, bf, dq, sq, false), dK = g.tensor(SDPA_DK, bf, dq, sq, false);
    auto dV = g.tensor(SDPA_DV, bf, dq, sq, false);
    auto scale = g.tensor(SDPA_SCALE, fl, d1, s1, false, true), neginf = g.tensor(SDPA_NEGINF, fl, d1, s1, false, true);
    auto one = g.tensor(SDPA_ONE, fl, d1, s1, false, true);
    auto ssum = g.tensor(SDPA_SOFTMAX_SUM, fl, dr, sr, false);
    auto dOO = g.tensor(uid++, fl, dq, sq, true), rsum = g.tensor(uid++, fl, dr, sr, true);
    auto S1 = g.tensor(uid++, fl, ds, ss, true), S2 = g.tensor(uid++, fl, ds, ss, true), S3 = g.tensor(uid++, fl, ds, ss, true);
    auto S4 = g.tensor(uid++, fl, ds, ss, true), P = g.tensor(uid++, fl, ds, ss, true);
    auto PT = g.tensor(uid++, bf, dst, sst, true);
    auto dP = g.tensor(uid++, fl, ds, ss, true), dP2 = g.tensor(uid++, fl, ds, ss, true), dS = g.tensor(uid++, fl, ds, ss, true);
    auto dS2 = g.tensor(uid++, fl, ds, ss, true), dST = g.tensor(uid++, bf, dst, sst, true);
    auto Kr = g.tensor(uid++, bf, dq, sq, true);   // K in its own (T, D) view
    std::vector<cudnnBackendDescriptor_t> ops = {
        g.pointwise(CUDNN_POINTWISE_MUL, dO, O, nullptr, dOO),
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, rsum),
        g.pointwise(CUDNN_POINTWISE_MUL, rsum, one, nullptr, ssum),
        g.matmul(Q, K, S1),
        g.pointwise(CUDNN_POINTWISE_MUL, S1, scale, nullptr, S2),
        g.pointwise(CUDNN_POINTWISE_SUB, S2, Stats, nullptr, S3),
    };
    auto window = W ? g.tensor(SDPA_WINDOW, fl, d1, s1, false, true) : nullptr;
    g.causal_mask(ops, S3, neginf, window, S4, ds, ss, &uid);
    ops.insert(ops.end(), {
        g.pointwise(CUDNN_POINTWISE_EXP, S4, nullptr, nullptr, P),
        g.op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, P},
             {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, PT}}, "reshape P"),
        g.matmul(PT, dO, dV),
        g.matmul(dO, V, dP),
        g.pointwise(CUDNN_POINTWISE_SUB, dP, ssum, nullptr, dP2),
        g.pointwise(CUDNN_POINTWISE_MUL, dP2, P, nullptr, dS),
        g.pointwise(CUDNN_POINTWISE_MUL, dS, scale, nullptr, dS2),
        g.op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, dS2},
             {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, dST}}, "reshape dS"),
        g.matmul(dST, Q, dK),
        g.op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, K},
             {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, Kr}}, "reshape K"),
        g.matmul(dS2, Kr, dQ),
    });
    if (!sdpa_plan(g, ops.data(), (int)ops.size(), sdpa_bwd, B, T, H, Hkv, D, W)) { return 0; }
    cudaCheck(cudaMalloc(&sdpa_softmax_sum, (size_t)B * H * T * sizeof(float)));
    if (Hkv != H) {
        size_t n = (size_t)B * T * H * D * sizeof(floatX);
        cudaCheck(cudaMalloc(&sdpa_kr, n)); cudaCheck(cudaMalloc(&sdpa_vr, n));
        cudaCheck(cudaMalloc(&sdpa_dkr, n)); cudaCheck(cudaMalloc(&sdpa_dvr, n));
    }
    return 1;
}

// drop the built plans (the kernel lab builds them per shape)
static void sdpa_release(void) {
    for (SdpaPlan* p : {&sdpa_fwd, &sdpa_bwd}) {
        if (p->plan) { cudnnCheck(cudnnBackendDestroyDescriptor(p->plan)); }
        if (p->graph) { for (auto d : *p->graph) { cudnnBackendDestroyDescriptor(d); } delete p->graph; }
        if (p->ws) { cudaCheck(cudaFree(p->ws)); }
        memset(p, 0, sizeof(*p));
    }
    for (void* x : {(void*)sdpa_softmax_sum, (void*)sdpa_kr, (void*)sdpa_vr, (void*)sdpa_dkr, (void*)sdpa_dvr}) {
        if (x) { cudaCheck(cudaFree(x)); }
    }
    sdpa_softmax_sum = nullptr; sdpa_kr = sdpa_vr = sdpa_dkr = sdpa_dvr = nullptr;
}

// the plans for a shape (B, T, Hq, Hkv, D) and window W (0: full causal), where the fused engines apply (head dim a
// multiple of 8 up to 128); a failure leaves its reason in the plan's why
static void sdpa_build(int B, int T, int Hq, int Hkv, int D, int W) {
    sdpa_release();
    if (!sdpa_handle) {
        cudnnStatus_t st = cudnnCreate(&sdpa_handle);
        if (st == CUDNN_STATUS_SUCCESS) { st = cudnnSetStream(sdpa_handle, main_stream); }
        if (st != CUDNN_STATUS_SUCCESS) { // e.g. a cuDNN library that does not match the GPU: the own kernels run
            if (sdpa_handle) { cudnnDestroy(sdpa_handle); sdpa_handle = nullptr; }
            snprintf(sdpa_fwd.why, sizeof sdpa_fwd.why, "cudnnCreate / cudnnSetStream failed: %s", cudnnGetErrorString(st));
            snprintf(sdpa_bwd.why, sizeof sdpa_bwd.why, "%s", sdpa_fwd.why);
            return;
        }
    }
    if (D % 8 || D > 128) {
        snprintf(sdpa_fwd.why, sizeof sdpa_fwd.why, "head dim %d: the fused engine here takes multiples of 8 up to 128", D);
        snprintf(sdpa_bwd.why, sizeof sdpa_bwd.why, "%s", sdpa_fwd.why);
        return;
    }
    sdpa_build_forward(B, T, Hq, Hkv, D, W);
    sdpa_build_backward(B, T, Hq, Hkv, D, W);
}

// at startup: the plans for the training shape
static void sdpa_setup(const PdnConfig* c, int B, int T) {
    if (!layerset_count(&c->attn_layers)) { return; }
    sdpa_build(B, T, c->attn_heads, c->attn_kv_heads, pdn_attn_head_dim(c), c->attn_window);
}

static bool sdpa_fits(const SdpaPlan& p, int B, int T, int Hq, int Hkv, int D, int W) {
    return p.ok && p.W == W && p.B == B && p.T == T && p.Hq == Hq && p.Hkv == Hkv && p.D == D;
}

// run the plans (shapes already matched)
static void sdpa_forward(floatX* o, float* stats, const floatX* q, const floatX* k, const floatX* v, int D) {
    float scale = 1.0f / sqrtf((float)D), neginf = -INFINITY, window = (float)sdpa_fwd.W;
    int64_t uids[8] = {SDPA_Q, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_SCALE, SDPA_NEGINF, SDPA_WINDOW};
    void* ptrs[8] = {(void*)q, (void*)k, (void*)v, (void*)o, (void*)stats, &scale, &neginf, &window};
    sdpa_run(sdpa_fwd, uids, ptrs, sdpa_fwd.W ? 8 : 7);
}

// grouped-query attention (G = Hq / Hkv query heads per key/value head, query head h reads kv head h / G):
// x (B, T, Hkv, D) -> xr (B, T, Hq, D)
__global__ void kv_repeat_kernel(floatX* xr, const floatX* x, long n, int Hq, int Hkv, int D) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    long r = i / D, bt = r / Hq;
    int e = (int)(i % D), h = (int)(r % Hq);
    xr[i] = x[(bt * Hkv + h / (Hq / Hkv)) * D + e];
}
// and back for the gradients: dx (B, T, Hkv, D) = the sum of dxr (B, T, Hq, D) over each group, in head order (fp32)
__global__ void kv_group_sum_kernel(floatX* dx, const floatX* dxr, long n, int Hq, int Hkv, int D) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    long r = i / D, bt = r / Hkv;
    int e = (int)(i % D), hk = (int)(r % Hkv), G = Hq / Hkv;
    float sum = 0.0f;
    for (int g = 0; g < G; g++) { sum += tof(dxr[(bt * Hq + hk * G + g) * D + e]); }
    dx[i] = fromf<floatX>(sum);
}

static void sdpa_backward(floatX* dq, floatX* dk, floatX* dv, const floatX* dout, const floatX* q, const floatX* k,
                          const floatX* v, const floatX* o, const float* stats, int D) {
    const SdpaPlan& p = sdpa_bwd;
    bool gqa = p.Hq != p.Hkv;
    long nr = (long)p.B * p.T * p.Hq * D, nk = (long)p.B * p.T * p.Hkv * D;
    floatX* dk_g = dk; floatX* dv_g = dv;
    if (gqa) {
        kv_repeat_kernel<<<cdiv(nr, 256), 256, 0, main_stream>>>(sdpa_kr, k, nr, p.Hq, p.Hkv, D);
        kv_repeat_kernel<<<cdiv(nr, 256), 256, 0, main_stream>>>(sdpa_vr, v, nr, p.Hq, p.Hkv, D);
        cudaCheck(cudaGetLastError());
        k = sdpa_kr; v = sdpa_vr; dk = sdpa_dkr; dv = sdpa_dvr;
    }
    float scale = 1.0f / sqrtf((float)D), neginf = -INFINITY, one = 1.0f, window = (float)p.W;
    int64_t uids[14] = {SDPA_Q, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_DO, SDPA_DQ, SDPA_DK, SDPA_DV, SDPA_SCALE,
                        SDPA_NEGINF, SDPA_ONE, SDPA_SOFTMAX_SUM, SDPA_WINDOW};
    void* ptrs[14] = {(void*)q, (void*)k, (void*)v, (void*)o, (void*)stats, (void*)dout, dq, dk, dv, &scale, &neginf, &one,
                      sdpa_softmax_sum, &window};
    sdpa_run(p, uids, ptrs, p.W ? 14 : 13);
    if (gqa) {
        kv_group_sum_kernel<<<cdiv(nk, 256), 256, 0, main_stream>>>(dk_g, sdpa_dkr, nk, p.Hq, p.Hkv, D);
        kv_group_sum_kernel<<<cdiv(nk, 256), 256, 0, main_stream>>>(dv_g, sdpa_dvr, nk, p.Hq, p.Hkv, D);
        cudaCheck(cudaGetLastError());
    }
}
#endif

// ----------------------------------------------------------------------------------------------------
// 3d. the training path of attention: which implementation runs (decided once at startup, printed in the kernel plan)

// training (Tk = Tcap = T): o (B, T, Ha, D), lse (B, Ha, T)
static void attention_forward(floatX* o, float* lse, const floatX* q, const floatX* k, const floatX* v, int B, int T,
                              int Hq, int Hkv, int D, int W) {
#ifdef USE_CUDNN
    if (sdpa_fits(sdpa_fwd, B, T, Hq, Hkv, D, W)) { sdpa_forward(o, lse, q, k, v, D); return; }
#endif
    attention_forward_own(o, lse, q, k, v, B, T, T, T, Hq, Hkv, D, W);
}

// The gradients of q and k before the rotary embedding's backward: cuDNN writes them as floatX into dq_x, dk_x
// (returns 1), the own kernels as fp32 into dq, dk (returns 0); dv floatX either way. Di: the own kernels' scratch.
static int attention_backward(floatX* dq_x, floatX* dk_x, float* dq, float* dk, floatX* dv, float* Di, const floatX* dout,
                              const floatX* q, const floatX* k, const floatX* v, const floatX* o, const float* lse, int B,
                              int T, int Hq, int Hkv, int D, int W) {
#ifdef USE_CUDNN
    if (sdpa_fits(sdpa_bwd, B, T, Hq, Hkv, D, W)) { sdpa_backward(dq_x, dk_x, dv, dout, q, k, v, o, lse, D); return 1; }
#else
    (void)dq_x; (void)dk_x;
#endif
    attention_backward_own(dq, dk, dv, Di, dout, q, k, v, o, lse, B, T, Hq, Hkv, D, W);
    return 0;
}

static void attention_plan_print(const PdnConfig* c) {
    if (!layerset_count(&c->attn_layers)) { return; }
    char win[48] = "full causal";
    if (c->attn_window) { snprintf(win, sizeof win, "a sliding window of %d tokens", c->attn_window); }
    printf("attention layers: %d of %d, %d query heads of %d, %d key/value heads, %s; rotary theta %g\n",
           layerset_count(&c->attn_layers), c->n_layer, c->attn_heads, pdn_attn_head_dim(c), c->attn_kv_heads, win,
           c->rope_theta);
#ifndef USE_CUDNN
    printf("  forward and backward: own kernels (%s); generation: own kernels over the KV cache\n",
           sizeof(floatX) == 4 ? "fp32 build" : "built without cuDNN: its headers or library were not found");
#else
    const SdpaPlan* ps[2] = {&sdpa_fwd, &sdpa_bwd};
    const char* nm[2] = {"forward", "backward"};
    for (int i = 0; i < 2; i++) {
        if (ps[i]->ok) {
            printf("  %s: cuDNN fused flash attention (backend graph, %lld bytes of workspace)\n", nm[i],
                   (long long)ps[i]->ws_bytes);
        } else {
            printf("  %s: own kernels (cuDNN's graph not used: %s)\n", nm[i], ps[i]->why);
        }
    }
    printf("  generation: own kernels over the KV cache\n");
#endif
}

// ----------------------------------------------------------------------------------------------------
// 4. the model

struct Model {
    PdnConfig cfg;
    PdnLayout lay;
    floatX* params;      // (num_elems) the flat buffer of pdn.h, floatX
    float* master;       // (n_opt) fp32 master weights (what checkpoints store)
    float* grads;        // (num_elems) fp32
    float* m;            // (n_opt) AdamW moments, fp32
    float* v;
    size_t n_opt;        // num_elems on one GPU; with ZeRO-1 this rank's shard (dist.h), in its packed order
    int C;               // chunk size
    uint64_t seed;       // for the per-tensor rounding seeds
};

// per-tensor, per-step seed of the stochastic rounding: the same step gives the same bf16 parameters, so a resumed
// run re-creates them exactly from the fp32 master weights
static unsigned int tensor_seed(uint64_t seed, long step, int tensor) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)step * 1000003ull + (uint64_t)tensor * 7919ull;
    return (unsigned int)(splitmix64(&x) >> 32);
}

// the floatX parameters of `step` from full fp32 master weights on the device (flat layout)
static void round_params(Model* m, const float* master_full, long step) {
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &m->lay.t[i];
        if (!t->numel) { continue; }
        round_params_kernel<<<cdiv(t->numel, 256), 256, 0, main_stream>>>(m->params + t->offset, master_full + t->offset,
                                                                          (long)t->numel, tensor_seed(m->seed, step, i));
    }
    cudaCheck(cudaGetLastError());
}

// n_opt: elements of master weights and moments kept here (num_elems, or this rank's ZeRO-1 shard)
static void model_init(Model* m, const PdnConfig* c, int C, uint64_t seed, size_t n_opt) {
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    pdn_build_layout(c, &m->lay);
    m->C = C;
    m->seed = seed;
    m->n_opt = n_opt;
    size_t n = m->lay.num_elems;
    cudaCheck(cudaMalloc(&m->params, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&m->master, n_opt * sizeof(float)));
    cudaCheck(cudaMalloc(&m->grads, n * sizeof(float)));
    cudaCheck(cudaMalloc(&m->m, n_opt * sizeof(float)));
    cudaCheck(cudaMalloc(&m->v, n_opt * sizeof(float)));
    cudaCheck(cudaMemset(m->params, 0, n * sizeof(floatX)));
    cudaCheck(cudaMemset(m->grads, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(m->master, 0, n_opt * sizeof(float)));
    cudaCheck(cudaMemset(m->m, 0, n_opt * sizeof(float)));
    cudaCheck(cudaMemset(m->v, 0, n_opt * sizeof(float)));
}

// upload full fp32 master weights (and AdamW moments, or NULL for zeros) from the host, keep what this process owns
// (zp: its ZeRO-1 shard; NULL: everything), and derive the floatX parameters of `step` exactly as the run did
static void model_upload(Model* m, const ZeroPlan* zp, const float* master, const float* mom1, const float* mom2, long step) {
    size_t n = m->lay.num_elems;
    if (!zp) {
        cudaCheck(cudaMemcpy(m->master, master, n * sizeof(float), cudaMemcpyHostToDevice));
        if (mom1) { cudaCheck(cudaMemcpy(m->m, mom1, n * sizeof(float), cudaMemcpyHostToDevice)); }
        if (mom2) { cudaCheck(cudaMemcpy(m->v, mom2, n * sizeof(float), cudaMemcpyHostToDevice)); }
        round_params(m, m->master, step);
        return;
    }
    cudaCheck(cudaMemcpy(m->grads, master, n * sizeof(float), cudaMemcpyHostToDevice)); // scratch: the full master
    round_params(m, m->grads, step);
    std::vector<float> shard(zp->shard_total);
    const float* src[3] = {master, mom1, mom2};
    float* dst[3] = {m->master, m->m, m->v};
    for (int k = 0; k < 3; k++) {
        if (!src[k]) { continue; }
        zero_shard_from_flat(zp, src[k], shard.data());
        cudaCheck(cudaMemcpy(dst[k], shard.data(), shard.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    cudaCheck(cudaMemset(m->grads, 0, n * sizeof(float)));
}

static void model_free(Model* m) {
    cudaCheck(cudaFree(m->params)); cudaCheck(cudaFree(m->master)); cudaCheck(cudaFree(m->grads));
    cudaCheck(cudaFree(m->m)); cudaCheck(cudaFree(m->v));
}

// What a layer keeps for its backward. Cheap things are made again there instead: ln1 and ln2 from the residual
// stream and their rstd (rmsnorm_apply), the MLP's activation from its two projections, the gated output norm from
// o and its rstd; they live in Acts' shared buffers. With --recompute (and without gradients) every layer shares one
// LayerActs, and the backward runs each layer's forward again first.
struct LayerActs {
    float* ln1_rstd;                           // (N)
    floatX *qp, *kp, *vp;                      // projections
    floatX *qn, *kn, *kt, *v;                  // hm: q̂ (scaled), k̂, k̃ (= kn without preconditioner), v
    float *q_rstd, *k_rstd;                    // (N, H)
    floatX* beta_pre; float* beta;             // (N, H); hm rows
    floatX *f1, *g_pre; float* g;              // (N, V); (N, H*gw); hm (rows, gw)
    floatX *gp_pre, *bp_pre; float *gp, *betap, *pstate;
    float* astat;                              // hm (rows, Kp) the diagonal preconditioner's statistic (Acts' shared one)
    float* pcarry;                             // (nq, Kp) the diagonal preconditioner's statistic at each chunk's start
    MixerSaved mx;
    float* o_rstd;                             // (N*H)
    floatX *g1, *gz, *og;                      // output gate (N, V), (N, HV); og (N, HV) W_o's input (gz, og: Acts' shared ones)
    floatX* h; float* ln2_rstd;                // (N, d), (N)
    floatX *mg, *mu;                           // (N, I)
    // an attention layer's instead of the mixer's (section 3b): q, k after the rotary embedding, v, the output
    floatX *aq, *ak, *av, *ao;                 // (N, d), (N, KVD), (N, KVD), (N, d)
    float* alse;                               // (B, Ha, T) the softmax rows' log-sum-exp
};

struct GradBufs {
    float *dresid, *dh, *dog, *dgz_f, *wprod;
    float* dln;             // (N, d) the gradient of the norm output at hand (lnf, then each layer's ln2 and ln1)
    floatX *dresid_x, *dh_x, *dma_x, *dmg_x, *dmu_x, *dgz_x, *dO_x, *dg_pre_x;
    floatX *din_x, *win_x;  // (N, ip.width) the packed gradients of ln1's projections, (ip.width, d) their weights
    float* dwin;            // (ip.width, d) the packed weights' gradients
    float *dq, *dkh, *dkt, *dv, *dbeta, *dg, *dgp, *dbp, *pbuf;
    int *bucket_tok, *bucket_start, *bucket_pos;
    // attention layers: dO (floatX), dq / dk before the rotary embedding's backward (fp32), the projections' output
    // gradients (floatX), Di = rowsum(dO ⊙ O) (B, Ha, T)
    floatX *dao_x, *daq_x, *dak_x, *dav_x;
    float *daq, *dak, *adi;
};

// The projections that read ln1 (q, k, v, the gates, f1, g1) in one packed order: their output gradients are column
// slices of one (N, width) floatX matrix and their weights are copied into one (width, d) matrix, so that ln1's
// gradient is one GEMM instead of one per projection (most are skinny, N x 8, and each was a full read-modify-write
// of the fp32 dln1). Slices start at multiples of 8 columns (16-byte rows for cuBLASLt); the pads stay zero.
struct InProj { int n, width, id[9], rows[9], off[9]; };
static InProj in_proj_layout(const PdnLayout* lay) {
    static const int ids[] = {T_WQ, T_WK, T_WV, T_WB, T_WA, T_WF1, T_WAP, T_WBP, T_WG1};
    InProj p;
    memset(&p, 0, sizeof(p));
    for (int id : ids) {
        if (lay->t[id].numel == 0) { continue; }
        p.id[p.n] = id;
        p.rows[p.n] = lay->t[id].shape[1]; // per-layer tensors: (L, rows, d)
        p.off[p.n] = p.width;
        p.width += (p.rows[p.n] + 7) / 8 * 8;
        p.n++;
    }
    return p;
}

struct Acts {
    int B, T, Tp, NC;
    ChunkShape cs;
    InProj ip;
    Arena arena;
    std::vector<LayerActs> L;
    floatX* resid;                // (L+1, N, d)
    floatX* ln;                   // (N, d) the layer's ln1, then its ln2 (forward; made again in the backward)
    floatX* ma;                   // (N, I) the MLP's activation, W_down's input (likewise)
    int recompute;                // the backward runs each layer's forward again (one LayerActs for all layers)
    bool side;                    // the backward's second stream (bwd_side_for): dmg_x, dmu_x outside the overlay
    int nstore; size_t layer_bytes; // layers with their own LayerActs, and the bytes of one
    floatX* lnf; float* lnf_rstd;
    floatX* logits; float* losses; int* argmax; // (M, vocab), (M), (M)
    floatX *ymix, *ymlp;          // (N, d) W_o and W_down outputs
    // the classifier's rows: M = N is every row; else rows[0..M) only, the positions with a target (MQAR's answers:
    // the classifier is most of a small model's work, and rows without a target give it no gradient)
    long M;
    int *rows, *slot, *row_y;     // (N) device: the rows' positions, each position's row (or -1), the rows' targets
    std::vector<int> rows_h, slot_h, row_y_h; // their host copies (acts_target_rows)
    floatX* og;                   // (N, HV) the gated output norm; every layer's LayerActs points here
    floatX* gz;                   // (N, HV) the output gate's pre-activation (with --out-gate), likewise
    floatX *vn, *o;               // hm (rows, Vp) the mixer's V' and O with the tensor-core scans (mixer_remake), likewise
    floatX* kt; float* astat;     // hm (rows, Kp) k̃ and the diagonal preconditioner's statistic, likewise
    floatX* lnf_rows;             // (M, d) those rows of lnf: aliases ymix, which is free from the last layer's
                                  // residual add until the classifier's backward is done
    int *tokens, *targets;        // (N) device copies of the batch
    // packed documents (--doc-mask 1; allocated with docs, set per batch by acts_docs): cs.doc points at doc while the
    // batch has them (else null); doc_h, dlen_h their host copies (doc_chunk_rel)
    signed char* doc = nullptr;   // (B, Tp) each position's document start in its chunk, or -1
    unsigned char* dlen = nullptr; // (N) each token's earlier tokens in its document (the short convolution's reach)
    float* gpm = nullptr;         // hm (rows) the preconditioner's gP with -inf at documents' first tokens (doc_gate)
    std::vector<signed char> doc_h; std::vector<unsigned char> dlen_h;
    MixerScratch sc;
    int with_grads;
    GradBufs gb;
};

// The mixer's head sizes on the GPU: K and V rounded up to a multiple of 16, the tensor cores' tile (the paper's 1b
// KDA has K = V = 120). Head-major rows carry the extra columns as zeros that nothing writes: zero keys, queries and
// values (and a zero log-decay) leave the state's extra rows and columns zero, so the outputs and the gradients of
// the real columns are those of the unpadded mixer, on the fast kernels. Both builds pad (gpu_check compares both).
static int mixer_pad(int X) { return (X + 15) / 16 * 16; }

// the mixer's buffers, in one place for the trainer and the kernel lab: what a layer keeps for its backward, and the
// scratch all layers share (the backward's part only with grads; the diagonal preconditioner's only with diag)
// p: the plan they are for (the kernel lab passes MixerPlan{} and gets them all). The fused scalar scores' backward
// makes Mk again, and with the tensor-core scans mixer_remake makes V' and O again: the trainer then points Vn and O
// at one pair for all layers.
static void mixer_saved_add(Arena& ar, MixerSaved* mx, const ChunkShape& s, const MixerPlan& p) {
    long rows = s.nq * s.C, CC = (long)s.C * s.C, K = s.K, V = s.V, gw = s.gk ? s.gk : 1;
    memset(mx, 0, sizeof(*mx));
    ar.add(&mx->G, rows * gw); ar.add(&mx->Tx, s.nq * CC); ar.add(&mx->P, s.nq * CC); ar.add(&mx->hstate, s.nq * K * V);
    if (!p.scores_fused) { ar.add(&mx->Mk, s.nq * CC); }
    if (!p.scan_wmma) { ar.add(&mx->Vn, rows * V); ar.add(&mx->O, rows * V); }
}
// p: the plan the buffers are for (the kernel lab passes MixerPlan{}, every fallback's, to run all flavours). The
// forward's part (also read by the backward); mixer_scratch_grads_add adds the backward's own.
static void mixer_scratch_add(Arena& ar, MixerScratch* sc, const ChunkShape& s, int diag, const MixerPlan& p) {
    long rows = s.nq * s.C, CC = (long)s.C * s.C, K = s.K, V = s.V, nq = s.nq;
    bool gemm_scores = s.gk <= 1 && !p.scores_fused; // scalar / no decay by batched GEMMs + mask
    memset(sc, 0, sizeof(*sc));
    if (gemm_scores) { ar.add(&sc->Mraw, nq * CC); ar.add(&sc->Praw, nq * CC); }
    if (!p.scores_fused) { ar.add(&sc->A, nq * CC); }
    if (!p.scan_wmma && sizeof(floatX) != sizeof(float)) { ar.add(&sc->Of, rows * V); }
    if (!p.prep_wy) { ar.add(&sc->X, rows * K); ar.add(&sc->Y, rows * V); }
    ar.add(&sc->W, rows * K); ar.add(&sc->U, rows * V); ar.add(&sc->Qg, rows * K); ar.add(&sc->Kd, rows * K);
    if (diag) { precond_scratch_add(ar, &sc->pc, nq, (int)K); }
    if (p.scan_groups > 1) {
        long bg = (long)s.B * s.H * p.scan_groups;
        ar.add(&sc->gB, bg * K * V); ar.add(&sc->gT, bg * K * K); ar.add(&sc->gS, bg * K * V);
    }
}
// every one of these is written in full before it is read in each backward call (the trainer overlays them)
static void mixer_scratch_grads_add(Arena& ar, MixerScratch* sc, const ChunkShape& s, const MixerPlan& p) {
    long rows = s.nq * s.C, CC = (long)s.C * s.C, K = s.K, V = s.V, nq = s.nq;
    bool gemm_scores = s.gk <= 1 && !p.scores_fused;
    if (!p.scan_wmma) { ar.add(&sc->dVloc, rows * V); }
    ar.add(&sc->dhstate, nq * K * V); ar.add(&sc->dVn, rows * V);
    if (p.bwd_fused) { return; } // the rest stays on chip
    ar.add(&sc->dQg, rows * K); ar.add(&sc->dKd, rows * K); ar.add(&sc->dX, rows * K); ar.add(&sc->dY, rows * V);
    if (!p.gemms_fused) { ar.add(&sc->dWx, rows * K); ar.add(&sc->dZx, nq * CC); ar.add(&sc->dZ, nq * CC); }
    ar.add(&sc->dP, nq * CC); ar.add(&sc->dA, nq * CC);
    if (gemm_scores) { ar.add(&sc->dPm, nq * CC); ar.add(&sc->dMm, nq * CC); }
    ar.add(&sc->dq_s, rows * K); // with scores_fin: the rows side's part of dG for the columns side
    if (p.scores_fin) { return; }
    ar.add(&sc->dbetaA, rows); ar.add(&sc->dkh_s, rows * K); ar.add(&sc->dkt_s, rows * K);
}

// docs: room for packed documents (acts_docs)
static Acts acts_alloc(const Model* m, int B, int T, int with_grads, int recompute, int docs = 0) {
    const PdnConfig* c = &m->cfg;
    Acts a;
    a.B = B; a.T = T; a.with_grads = with_grads; a.recompute = with_grads && recompute;
    int C = m->C, NC = (T + C - 1) / C, Tp = NC * C;
    a.Tp = Tp; a.NC = NC;
    int d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c), I = c->mlp_hidden, L = c->n_layer;
    int gk = pdn_decay_width(c), gw = gk ? gk : 1, HK = H * K, HV = H * V;
    int Kp = mixer_pad(K), Vp = mixer_pad(V), gwp = gk > 1 ? Kp : 1; // head-major widths (mixer_pad)
    a.cs = ChunkShape{B, H, T, Tp, C, NC, Kp, Vp, gk > 1 ? Kp : gk, (long)B * H * NC, nullptr};
    a.side = with_grads && layerset_count(&c->attn_layers) < c->n_layer && bwd_side_for(B, H, Vp);
    if (a.side) { side_setup(); } // its stream and GEMM workspace now, before the memory is counted
    a.ip = in_proj_layout(&m->lay);
    long N = (long)B * T, rows = (long)B * H * Tp;
    int diag = c->precond == PRECOND_DIAG, exact = c->precond == PRECOND_EXACT, chan = c->decay == DECAY_CHANNEL;
    Arena& ar = a.arena;
    a.L.resize(L);
    ar.add(&a.resid, (L + 1) * N * d);
    ar.add(&a.ln, N * d); ar.add(&a.ma, N * I);
    int nstore = (!with_grads || recompute) ? 1 : L; // layers with their own activations; the others share L[0]'s
    a.nstore = nstore;
    MixerPlan plan = mixer_plan(a.cs);
    int n_attn = layerset_count(&c->attn_layers), Ha = c->attn_heads, KVD = pdn_attn_kv_dim(c);
    size_t before_layers = ar.pending();
    for (int l = 0; l < nstore; l++) {
        LayerActs& la = a.L[l];
        memset(&la, 0, sizeof(la));
        ar.add(&la.ln1_rstd, N);
        ar.add(&la.h, N * d); ar.add(&la.ln2_rstd, N);
        ar.add(&la.mg, N * I); ar.add(&la.mu, N * I);
        // a layer's own kind; one LayerActs shared by all layers holds both
        bool attn = nstore == 1 ? n_attn > 0 : pdn_is_attn(c, l), mix = nstore == 1 ? n_attn < L : !pdn_is_attn(c, l);
        if (attn) {
            ar.add(&la.aq, N * d); ar.add(&la.ak, N * KVD); ar.add(&la.av, N * KVD); ar.add(&la.ao, N * d);
            ar.add(&la.alse, N * Ha);
        }
        if (!mix) { continue; }
        ar.add(&la.qp, N * HK); ar.add(&la.kp, N * HK); ar.add(&la.vp, N * HV);
        ar.add(&la.qn, rows * Kp); ar.add(&la.kn, rows * Kp); ar.add(&la.v, rows * Vp);
        if (exact) { ar.add(&la.kt, rows * Kp); } // (diag: one k̃ for all layers, made again in the backward)
        ar.add(&la.q_rstd, N * H); ar.add(&la.k_rstd, N * H);
        ar.add(&la.beta_pre, N * H); ar.add(&la.beta, rows);
        if (chan) { ar.add(&la.f1, N * V); }
        if (gk) { ar.add(&la.g_pre, N * H * gw); ar.add(&la.g, rows * gwp); }
        if (diag) {
            ar.add(&la.gp_pre, N * H); ar.add(&la.bp_pre, N * H); ar.add(&la.gp, rows); ar.add(&la.betap, rows);
            ar.add(&la.pcarry, (long)B * H * NC * Kp); // 2 MiB at the 340m shape: k̃'s remake is then one pass
        }
        if (exact) { ar.add(&la.pstate, (long)B * H * (NC + 1) * Kp * Kp); }
        mixer_saved_add(ar, &la.mx, a.cs, plan);
        ar.add(&la.o_rstd, N * H);
        if (c->out_gate) { ar.add(&la.g1, N * V); }
    }
    a.layer_bytes = (ar.pending() - before_layers) / nstore;
    // cheap to make again, so one for all layers: the backward makes a layer's again from what it keeps
    if (n_attn < L) { ar.add(&a.og, N * HV); }                        // the gated output norm, W_o's input
    if (n_attn < L && c->out_gate) { ar.add(&a.gz, N * HV); }          // the output gate's pre-activation
    if (n_attn < L && plan.scan_wmma) { ar.add(&a.vn, rows * Vp); ar.add(&a.o, rows * Vp); } // V', O (mixer_remake)
    if (diag) { ar.add(&a.kt, rows * Kp); if (with_grads) { ar.add(&a.astat, rows * Kp); } } // k̃, the statistic
    ar.add(&a.lnf, N * d); ar.add(&a.lnf_rstd, N);
    ar.add(&a.losses, N); ar.add(&a.argmax, N);
    ar.add(&a.ymix, N * d); ar.add(&a.ymlp, N * d);
    ar.add(&a.tokens, N); ar.add(&a.targets, N);
    ar.add(&a.rows, N); ar.add(&a.slot, N); ar.add(&a.row_y, N);
    if (docs) { ar.add(&a.doc, (long)B * Tp); ar.add(&a.dlen, N); }
    if (docs && diag) { ar.add(&a.gpm, rows); }
    mixer_scratch_add(ar, &a.sc, a.cs, diag, plan);
    GradBufs& g = a.gb;
    memset(&g, 0, sizeof(g));
    // One overlay for three sets that are never alive at once (in main_stream's order): the logits, from the
    // classifier's forward to its backward; the MLP backward's (N, I) gradients; the mixer backward's scratch and
    // its outputs. Only tensors that are written in full before every read go there: nothing in it relies on the
    // zeros of the allocation (the padded rows and columns of dO, which the mixer reads, stay outside). With the
    // backward's second stream, dmg_x and dmu_x stay outside too: its W_gate and W_up GEMMs read them while the
    // mixer's backward writes its scratch.
    ar.overlay_begin();
    ar.add(&a.logits, N * c->vocab_size);
    if (with_grads) {
        ar.overlay_next();
        ar.add(&g.dma_x, N * I);
        if (!a.side) { ar.add(&g.dmg_x, N * I); ar.add(&g.dmu_x, N * I); }
        ar.overlay_next();
        mixer_scratch_grads_add(ar, &a.sc, a.cs, plan);
        ar.add(&g.dog, N * HV);
        ar.add(&g.dq, rows * Kp); ar.add(&g.dkh, rows * Kp); ar.add(&g.dkt, rows * Kp); ar.add(&g.dv, rows * Vp);
    }
    ar.overlay_end();
    if (with_grads) {
        long wp = (long)H * gw; // the gates' small scratch
        if (a.side) { ar.add(&g.dmg_x, N * I); ar.add(&g.dmu_x, N * I); }
        ar.add(&g.dresid, N * d); ar.add(&g.dh, N * d); ar.add(&g.dln, N * d);
        ar.add(&g.wprod, wp);
        ar.add(&g.dresid_x, N * d); ar.add(&g.dh_x, N * d);
        ar.add(&g.dO_x, rows * Vp);
        ar.add(&g.din_x, N * a.ip.width); ar.add(&g.win_x, (long)a.ip.width * d);
        ar.add(&g.dwin, (long)a.ip.width * d);
        if (c->out_gate) { ar.add(&g.dgz_f, N * HV); ar.add(&g.dgz_x, N * HV); }
        if (chan) { ar.add(&g.dg_pre_x, N * H * gw); } // W_f2's output gradient (f1's goes into din_x)
        if (gk) { ar.add(&g.dg, rows * gwp); }
        if (diag) { ar.add(&g.dgp, rows); ar.add(&g.dbp, rows); }
        if (exact) { ar.add(&g.pbuf, (long)B * H * (C + 1) * Kp * Kp); }
        ar.add(&g.dbeta, rows);
        ar.add(&g.bucket_tok, N); ar.add(&g.bucket_start, N + 1); ar.add(&g.bucket_pos, N);
        if (n_attn) {
            ar.add(&g.dao_x, N * d); ar.add(&g.daq_x, N * d); ar.add(&g.dak_x, N * KVD); ar.add(&g.dav_x, N * KVD);
            ar.add(&g.daq, N * d); ar.add(&g.dak, N * KVD); ar.add(&g.adi, N * Ha);
        }
    }
    ar.alloc();
    a.M = N;
    a.lnf_rows = a.ymix;
    for (int l = 0; l < L; l++) {
        if (l >= nstore) { a.L[l] = a.L[0]; }
        a.L[l].og = a.og;
        a.L[l].gz = a.gz;
        if (plan.scan_wmma) { a.L[l].mx.Vn = a.vn; a.L[l].mx.O = a.o; }
        if (diag) { a.L[l].kt = a.kt; a.L[l].astat = a.astat; }
        else if (!exact) { a.L[l].kt = a.L[l].kn; }
    }
    return a;
}

static void acts_free(Acts* a) { a->arena.release(); }

// Recurrent state for generation: everything a layer needs to continue a sequence (device)
struct RecState {
    int B;
    floatX *hq, *hk, *hv;   // (L, B, cs-1, HK | HK | HV)
    float *S, *a, *P;       // (L, B, H, Kp, Vp), (L, B, H, Kp), (L, B, H, Kp, Kp): the mixer's padded head sizes
    floatX *kc, *vc;        // (attention layers, B, Tcap, KVD): the KV cache, keys after the rotary embedding
    int Tcap, pos;          // the cache's room in tokens; tokens fed so far
    Arena arena;
};

// Tcap: the most tokens the sequence will hold (the KV cache)
static RecState recstate_alloc(const PdnConfig* c, int B, int Tcap) {
    RecState r;
    r.B = B;
    r.Tcap = Tcap;
    r.pos = 0;
    long kv = (long)layerset_count(&c->attn_layers) * B * Tcap * pdn_attn_kv_dim(c);
    r.arena.add(&r.kc, kv + 1); r.arena.add(&r.vc, kv + 1);
    long L = c->n_layer, H = c->n_head, K = c->head_k, V = pdn_head_v(c), cs1 = c->conv_size - 1;
    long Kp = mixer_pad((int)K), Vp = mixer_pad((int)V);
    r.arena.add(&r.hq, L * B * cs1 * H * K + 1); r.arena.add(&r.hk, L * B * cs1 * H * K + 1);
    r.arena.add(&r.hv, L * B * cs1 * H * V + 1); r.arena.add(&r.S, L * B * H * Kp * Vp); r.arena.add(&r.a, L * B * H * Kp);
    r.arena.add(&r.P, c->precond == PRECOND_EXACT ? L * B * H * Kp * Kp : 1);
    r.arena.alloc();
    if (c->precond == PRECOND_EXACT) {
        std::vector<float> P((size_t)(L * B * H * Kp * Kp), 0.0f); // I / ridge (the padding's block too: it stays apart)
        for (size_t e = 0; e < P.size(); e++) { P[e] = (e % (Kp * Kp)) % (Kp + 1) == 0 ? 1.0f / c->ridge : 0.0f; }
        cudaCheck(cudaMemcpy(r.P, P.data(), P.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    return r;
}

// ----------------------------------------------------------------------------------------------------
// 4b. several GPUs: one process per GPU, NCCL data parallelism with ZeRO-1 (dist.h: the launcher environments, the
// rendezvous, the shard plan). In the last micro-step of a step, pdn_backward hands over each bucket of gradients as
// soon as it is final: dist.stream packs it and reduce-scatters it while the backward goes on. Each rank then runs
// AdamW on its shard of fp32 master weights and moments, and the new floatX parameters are all-gathered in place and
// unpacked. Every collective goes to dist.stream in the same order on every rank. A watchdog thread ends the process
// (exit 5) when a phase makes no progress within --dist-timeout seconds or NCCL reports an error, so a rank that dies
// ends the job with a message instead of hanging it. With one process none of this runs.

#ifdef ENABLE_NCCL
static void nccl_check(ncclResult_t r, const char* file, int line) {
    if (r != ncclSuccess) {
        fail(EXIT_DIST, "NCCL: %s [%s:%d]\n  hint: NCCL_DEBUG=WARN says more; if another rank failed first, its message is "
             "the one that matters", ncclGetErrorString(r), file, line);
    }
}
#define ncclCheck(r) nccl_check(r, __FILE__, __LINE__)
#ifdef ENABLE_FP32
#define NCCL_FLOATX ncclFloat
#else
#define NCCL_FLOATX ncclBfloat16
#endif
#endif

struct Dist {
    DistEnv env;                   // rank, world, local GPU, where they came from
    int on;                        // world > 1 and connected
    int used_mpi;                  // MPI_Init was called (mpirun): MPI_Finalize at the end
    char how[160];                 // the rendezvous, for the printout
    double timeout;                // --dist-timeout
#ifdef ENABLE_NCCL
    ncclComm_t comm;
#endif
    cudaStream_t stream;           // every collective, and the packing around them
    ZeroPlan zp;
    ZeroRange* d_ranges;           // the plan's tables on the device
    ZeroSeg* d_segs;
    float* packed_grads;           // (packed_total) the reduce-scatter's input; a save's gather buffer
    floatX* packed_params;         // (packed_total) the all-gather's buffer
    float* sgrad;                  // (shard_total) this rank's summed gradients
    double* scal;                  // (8) device scalars to all-reduce
    double* scal_host;             // (8) pinned
    int reduce_now;                // set during the last micro-step: pdn_backward hands its buckets over
    std::vector<cudaEvent_t> ev_ready, ev_rs0, ev_rs1;   // per bucket: gradients final (main), reduce-scatter start/end
    cudaEvent_t bwd_end, opt_done, ag0, ag1, params_done;
    double rs_ms, exposed_ms, ag_ms;   // summed over timed steps
};
static Dist dist;

// the watchdog: a deadline per phase; past it, or on an NCCL error, the process ends with a message
static std::atomic<double> watchdog_deadline(0.0);
static std::atomic<const char*> watchdog_phase("starting");

static void watch(const char* phase, double seconds) {
    watchdog_phase.store(phase);
    watchdog_deadline.store(wall_seconds() + seconds);
}

#ifdef ENABLE_NCCL
static pthread_mutex_t watchdog_mu = PTHREAD_MUTEX_INITIALIZER;

static void* watchdog_main(void*) {
    for (;;) {
        dist_sleep_ms(200);
        double d = watchdog_deadline.load();
        if (d > 0 && wall_seconds() > d) {
            fprintf(stderr, "error (rank %d): no progress for %.0f s during %s: another process of the job has probably "
                    "failed or hangs; ending this one\n  hint: the first error of the other ranks says why; raise "
                    "--dist-timeout if this phase legitimately takes longer\n", dist.env.rank, dist.timeout, watchdog_phase.load());
            fflush(stdout);
            _exit(EXIT_DIST);
        }
        ncclResult_t r = ncclSuccess;
        pthread_mutex_lock(&watchdog_mu); // dist_finish clears dist.on under it before the communicator goes away
        if (dist.on && ncclCommGetAsyncError(dist.comm, &r) != ncclSuccess) { r = ncclSuccess; }
        pthread_mutex_unlock(&watchdog_mu);
        if (r != ncclSuccess && r != ncclInProgress) {
            fprintf(stderr, "error (rank %d): NCCL reports '%s' during %s: a peer process or link failed; ending this one\n",
                    dist.env.rank, ncclGetErrorString(r), watchdog_phase.load());
            _exit(EXIT_DIST);
        }
    }
    return nullptr;
}
#endif

// who this process is (before anything else: the data source needs rank and world); ranks > 0 print nothing to stdout
static void dist_identify(const TrainConfig* tc) {
    dist_env_detect(&dist.env, tc->rank, tc->world_size, tc->local_rank);
    dist.timeout = tc->dist_timeout;
    if (dist.env.world == 1) { return; }
    if (tc->dist_timeout < 1) { fail(EXIT_USAGE, "--dist-timeout must be >= 1 second"); }
    fail_rank = dist.env.rank;
    if (dist.env.rank != 0 && !freopen("/dev/null", "w", stdout)) { fail(EXIT_SYSTEM, "cannot silence stdout of rank %d", dist.env.rank); }
}

// the GPU of this process: the launcher's local rank, else rank % visible GPUs
static int dist_device(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fail(EXIT_SYSTEM, "no CUDA device found (this needs a GPU; train_pdn is the CPU trainer)");
    }
    int dev = dist.env.local_rank >= 0 ? dist.env.local_rank : dist.env.rank % ndev;
    if (dev >= ndev && ndev == 1) { dev = 0; } // the launcher shows each process only its own GPU
    if (dev >= ndev) {
        fail(EXIT_USAGE, "local rank %d, but this node shows %d GPU(s)\n  hint: start at most one process per GPU per node "
             "(check CUDA_VISIBLE_DEVICES and the launcher's tasks per node)", dev, ndev);
    }
    return dev;
}

// the rendezvous (a file directory, else TCP, else MPI under mpirun) and the NCCL communicator
static void dist_connect(const TrainConfig* tc, int device) {
    const DistEnv* e = &dist.env;
    if (e->world == 1) { return; }
#ifndef ENABLE_NCCL
    (void)tc; (void)device;
    fail(EXIT_USAGE, "%d processes (%s), but this train_pdncu was built without NCCL and runs on one GPU\n  hint: install "
         "NCCL and rebuild; 'make train_pdncu' says what it found", e->world, e->source);
#else
    pthread_t th;
    if (pthread_create(&th, nullptr, watchdog_main, nullptr) != 0) { fail(EXIT_SYSTEM, "cannot start the watchdog thread"); }
    pthread_detach(th);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (e->rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
    const char* host = tc->dist_host[0] ? tc->dist_host : getenv("MASTER_ADDR");
    int port = tc->dist_port > 0 ? tc->dist_port : getenv("MASTER_PORT") ? atoi(getenv("MASTER_PORT")) : 29500;
    watch("the rendezvous", dist.timeout + 30); // the rendezvous has its own deadline and a better message
    if (tc->dist_dir[0]) {
        ensure_dir(tc->dist_dir);
        dist_file_rendezvous(tc->dist_dir, e->rank, e->world, &id, sizeof id, dist.timeout);
        snprintf(dist.how, sizeof dist.how, "shared directory %s", tc->dist_dir);
    } else if (host && host[0]) {
        if (port < 1 || port > 65535) { fail(EXIT_USAGE, "--dist-port (or MASTER_PORT) must be in 1..65535, got %d", port); }
        if (e->rank == 0) { dist_tcp_serve(port, e->world, &id, sizeof id, dist.timeout); }
        else { dist_tcp_join(host, port, e->rank, e->world, &id, sizeof id, dist.timeout); }
        snprintf(dist.how, sizeof dist.how, "TCP %s:%d", host, port);
    } else {
#ifdef ENABLE_MPI
        if (strstr(e->source, "Open MPI") || strstr(e->source, "PMI")) {
            MPI_Init(nullptr, nullptr);
            dist.used_mpi = 1;
            int r, w;
            MPI_Comm_rank(MPI_COMM_WORLD, &r);
            MPI_Comm_size(MPI_COMM_WORLD, &w);
            if (r != e->rank || w != e->world) {
                fail(EXIT_USAGE, "MPI says rank %d of %d, the environment %d of %d", r, w, e->rank, e->world);
            }
            MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
            snprintf(dist.how, sizeof dist.how, "MPI");
        } else
#endif
        fail(EXIT_USAGE, "%d processes (%s) but no way to meet: give --dist-host HOST (rank 0's node, or set MASTER_ADDR) "
             "or --dist-dir DIR (a directory all nodes share)%s", e->world, e->source,
#ifdef ENABLE_MPI
             ", or launch with mpirun"
#else
             " (this build has no MPI, so mpirun alone cannot be used)"
#endif
             );
    }
    watch("NCCL initialisation", dist.timeout);
    cudaCheck(cudaSetDevice(device));
    ncclCheck(ncclCommInitRank(&dist.comm, e->world, id, e->rank));
    pthread_mutex_lock(&watchdog_mu);
    dist.on = 1;
    pthread_mutex_unlock(&watchdog_mu);
    int lowest, highest; // the collectives at main_stream's (the highest) priority, not behind its blocks
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    cudaCheck(cudaStreamCreateWithPriority(&dist.stream, cudaStreamNonBlocking, highest));
#endif
}

// the plan's device tables and the communication buffers (after the model)
static void dist_buffers(void) {
    if (!dist.on) { return; }
    const ZeroPlan* zp = &dist.zp;
    cudaCheck(cudaMalloc(&dist.d_ranges, zp->n_ranges * sizeof(ZeroRange)));
    cudaCheck(cudaMalloc(&dist.d_segs, (zp->n_segs ? zp->n_segs : 1) * sizeof(ZeroSeg)));
    cudaCheck(cudaMemcpy(dist.d_ranges, zp->ranges, zp->n_ranges * sizeof(ZeroRange), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dist.d_segs, zp->segs, zp->n_segs * sizeof(ZeroSeg), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&dist.packed_grads, zp->packed_total * sizeof(float)));
    cudaCheck(cudaMalloc(&dist.packed_params, zp->packed_total * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dist.sgrad, zp->shard_total * sizeof(float)));
    cudaCheck(cudaMemset(dist.packed_grads, 0, zp->packed_total * sizeof(float))); // padding stays 0
    cudaCheck(cudaMemset(dist.packed_params, 0, zp->packed_total * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dist.scal, 8 * sizeof(double)));
    cudaCheck(cudaMallocHost(&dist.scal_host, 8 * sizeof(double)));
    int nb = zp->n_buckets;
    dist.ev_ready.resize(nb); dist.ev_rs0.resize(nb); dist.ev_rs1.resize(nb);
    for (int b = 0; b < nb; b++) {
        cudaCheck(cudaEventCreateWithFlags(&dist.ev_ready[b], cudaEventDisableTiming));
        cudaCheck(cudaEventCreate(&dist.ev_rs0[b]));
        cudaCheck(cudaEventCreate(&dist.ev_rs1[b]));
    }
    cudaCheck(cudaEventCreate(&dist.bwd_end)); cudaCheck(cudaEventCreate(&dist.opt_done));
    cudaCheck(cudaEventCreate(&dist.ag0)); cudaCheck(cudaEventCreate(&dist.ag1)); cudaCheck(cudaEventCreate(&dist.params_done));
}

#ifdef ENABLE_NCCL
// `st` waits for what main_stream has queued so far (ev: an event to use for it)
static void stream_after_main(cudaStream_t st, cudaEvent_t ev) {
    cudaCheck(cudaEventRecord(ev, main_stream));
    cudaCheck(cudaStreamWaitEvent(st, ev, 0));
}
#endif

// pdn_backward calls it when bucket b's gradients are final (dist.h's order): pack and reduce-scatter it now
static void dist_grads_ready(const Model* m, int b) {
    if (!dist.reduce_now) { return; }
#ifdef ENABLE_NCCL
    const ZeroPlan* zp = &dist.zp;
    stream_after_main(dist.stream, dist.ev_ready[b]);
    cudaCheck(cudaEventRecord(dist.ev_rs0[b], dist.stream));
    zero_copy<float>(dist.packed_grads, m->grads, zp, dist.d_ranges, b, b + 1, 1, dist.stream);
    ncclCheck(ncclReduceScatter(dist.packed_grads + zp->bucket_off[b], dist.sgrad + zp->bucket_off[b] / zp->world,
                                zero_piece(zp, b), ncclFloat, ncclSum, dist.comm, dist.stream));
    cudaCheck(cudaEventRecord(dist.ev_rs1[b], dist.stream));
#else
    (void)m; (void)b;
#endif
}

// sums v[0 .. n) over all ranks, in place (host doubles; a few per step)
static void dist_sum(double* v, int n) {
#ifdef ENABLE_NCCL
    memcpy(dist.scal_host, v, n * sizeof(double));
    cudaCheck(cudaMemcpyAsync(dist.scal, dist.scal_host, n * sizeof(double), cudaMemcpyHostToDevice, dist.stream));
    ncclCheck(ncclAllReduce(dist.scal, dist.scal, n, ncclDouble, ncclSum, dist.comm, dist.stream));
    cudaCheck(cudaMemcpyAsync(dist.scal_host, dist.scal, n * sizeof(double), cudaMemcpyDeviceToHost, dist.stream));
    cudaCheck(cudaStreamSynchronize(dist.stream));
    memcpy(v, dist.scal_host, n * sizeof(double));
#else
    (void)v; (void)n;
#endif
}

// after the last micro-step: the mean loss over ranks (in: this rank's), the global gradient norm, and whether any
// rank was asked to stop (in: this rank's request; all ranks then stop after the same step)
static double dist_loss_and_norm(double* loss, int* stop, float* norm_scratch) {
    cudaCheck(cudaEventRecord(dist.bwd_end, main_stream));
    cudaCheck(cudaStreamWaitEvent(main_stream, dist.ev_rs1[dist.zp.n_buckets - 1], 0)); // this rank's reduced gradients
    double v[3] = {*loss, (double)sum_squares(dist.sgrad, (long)dist.zp.shard_total, norm_scratch), (double)*stop};
    dist_sum(v, 3);
    *loss = v[0] / dist.env.world;
    *stop = v[2] > 0;
    return sqrt(v[1]);
}

// AdamW on this rank's shard, then the new parameters all-gathered and unpacked into m->params
static void dist_adamw(Model* m, const TrainConfig* tc, float lr, long step, float grad_scale, int* nonfinite) {
#ifdef ENABLE_NCCL
    const ZeroPlan* zp = &dist.zp;
    ZeroTensorInfo ti;
    for (int i = 0; i < NUM_TENSORS; i++) {
        ti.seed[i] = tensor_seed(m->seed, step, i);
        ti.wd[i] = m->lay.t[i].wd ? tc->weight_decay : 0.0f;
        ti.offset[i] = m->lay.t[i].offset;
    }
    float bc1, bc2;
    adam_bias_corrections(tc, step, &bc1, &bc2);
    adamw_shard_kernel<<<cdiv((long)zp->shard_total, 256), 256, 0, main_stream>>>(dist.packed_params, m->master, dist.sgrad,
        m->m, m->v, dist.d_segs, zp->n_segs, zp->shard_total, lr, tc->beta1, tc->beta2, bc1, bc2, tc->adam_eps, grad_scale, ti,
        nonfinite);
    cudaCheck(cudaGetLastError());
    stream_after_main(dist.stream, dist.opt_done);
    cudaCheck(cudaEventRecord(dist.ag0, dist.stream));
    ncclCheck(ncclGroupStart());
    for (int b = 0; b < zp->n_buckets; b++) {
        size_t s = zero_piece(zp, b);
        floatX* buf = dist.packed_params + zp->bucket_off[b];
        ncclCheck(ncclAllGather(buf + (size_t)zp->rank * s, buf, s, NCCL_FLOATX, dist.comm, dist.stream));
    }
    ncclCheck(ncclGroupEnd());
    cudaCheck(cudaEventRecord(dist.ag1, dist.stream));
    zero_copy<floatX>(dist.packed_params, m->params, zp, dist.d_ranges, 0, zp->n_buckets, 0, dist.stream);
    cudaCheck(cudaEventRecord(dist.params_done, dist.stream));
    cudaCheck(cudaStreamWaitEvent(main_stream, dist.params_done, 0));
#else
    (void)m; (void)tc; (void)lr; (void)step; (void)grad_scale; (void)nonfinite;
#endif
}

// the communication of the step just synchronised, into the running sums
static void dist_time_step(void) {
    float ms;
    for (size_t b = 0; b < dist.ev_rs0.size(); b++) {
        cudaCheck(cudaEventElapsedTime(&ms, dist.ev_rs0[b], dist.ev_rs1[b]));
        dist.rs_ms += ms;
    }
    cudaCheck(cudaEventElapsedTime(&ms, dist.bwd_end, dist.ev_rs1.back()));
    dist.exposed_ms += ms > 0 ? ms : 0;
    cudaCheck(cudaEventElapsedTime(&ms, dist.ag0, dist.ag1));
    dist.ag_ms += ms;
}

// a full fp32 buffer (flat layout) from every rank's shard into m->grads on every rank: all ranks take part; out (host,
// num_elems; NULL: none) gets a copy.
// m->grads is the scratch (free between steps; its alignment gaps are never written, so they stay 0, and the next
// step zeroes it anyway).
static void dist_gather_full(Model* m, const float* shard, float* out) {
#ifdef ENABLE_NCCL
    const ZeroPlan* zp = &dist.zp;
    size_t n = m->lay.num_elems;
    stream_after_main(dist.stream, dist.opt_done);
    ncclCheck(ncclGroupStart());
    for (int b = 0; b < zp->n_buckets; b++) {
        size_t s = zero_piece(zp, b);
        ncclCheck(ncclAllGather(shard + zp->bucket_off[b] / zp->world, dist.packed_grads + zp->bucket_off[b], s, ncclFloat,
                                dist.comm, dist.stream));
    }
    ncclCheck(ncclGroupEnd());
    zero_copy<float>(dist.packed_grads, m->grads, zp, dist.d_ranges, 0, zp->n_buckets, 0, dist.stream);
    cudaCheck(cudaStreamSynchronize(dist.stream));
    if (out) { cudaCheck(cudaMemcpy(out, m->grads, n * sizeof(float), cudaMemcpyDeviceToHost)); }
#else
    (void)m; (void)shard; (void)out;
#endif
}

// the end of a job: all ranks meet (so nobody tears down a communicator a peer still uses), then NCCL and MPI close
static void dist_finish(void) {
    if (!dist.on) { return; }
#ifdef ENABLE_NCCL
    watch("the end of the job", dist.timeout);
    double one = 1.0;
    dist_sum(&one, 1);
    pthread_mutex_lock(&watchdog_mu);
    dist.on = 0;
    pthread_mutex_unlock(&watchdog_mu);
    watchdog_deadline.store(0.0);
    ncclCheck(ncclCommDestroy(dist.comm));
#endif
#ifdef ENABLE_MPI
    if (dist.used_mpi) { MPI_Finalize(); }
#endif
}

#define PP(id, l) PDN_PARAM(m->params, lay, id, l)
#define GG(id, l) PDN_PARAM(m->grads, lay, id, l)

// An attention layer's part between its norms (train_pdn.c's attn_layer_forward): from ln1 (a->ln) to o_proj's
// output a->ymix. With rs the keys and values join its KV cache after the rs->pos tokens before them and the queries
// attend over the whole cache (own kernel); training runs attention_forward (cuDNN's fused attention or own kernel).
static void attn_layer_forward(const Model* m, Acts* a, int l, RecState* rs) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    int B = a->B, T = a->T, d = c->d_model, Ha = c->attn_heads, Hkv = c->attn_kv_heads, D = pdn_attn_head_dim(c);
    int KVD = pdn_attn_kv_dim(c), pos0 = rs ? rs->pos : 0;
    long N = (long)B * T;
    LayerActs& la = a->L[l];
    { PROF("fwd.attn.qkv+rope");
    matmul_forward(la.aq, a->ln, PP(T_AQ, l), nullptr, (int)N, d, d);
    matmul_forward(la.ak, a->ln, PP(T_AK, l), nullptr, (int)N, d, KVD);
    matmul_forward(la.av, a->ln, PP(T_AV, l), nullptr, (int)N, d, KVD);
    rope_launch(la.aq, la.aq, N, T, Ha, D, pos0, c->rope_theta, 1.0f);
    rope_launch(la.ak, la.ak, N, T, Hkv, D, pos0, c->rope_theta, 1.0f); }
    PROF("fwd.attn");
    if (rs) {
        if (pos0 + T > rs->Tcap) { fail(EXIT_SYSTEM, "internal: the KV cache holds %d tokens, %d were asked for", rs->Tcap, pos0 + T); }
        long cb = (long)lay->slot[l] * rs->B * rs->Tcap * KVD; // this layer's cache
        for (int b = 0; b < B; b++) {
            long dst = cb + ((long)b * rs->Tcap + pos0) * KVD, src = (long)b * T * KVD;
            size_t bytes = (size_t)T * KVD * sizeof(floatX);
            cudaCheck(cudaMemcpyAsync(rs->kc + dst, la.ak + src, bytes, cudaMemcpyDeviceToDevice, main_stream));
            cudaCheck(cudaMemcpyAsync(rs->vc + dst, la.av + src, bytes, cudaMemcpyDeviceToDevice, main_stream));
        }
        attention_forward_own(la.ao, la.alse, la.aq, rs->kc + cb, rs->vc + cb, B, T, pos0 + T, rs->Tcap, Ha, Hkv, D,
                              c->attn_window);
    } else {
        attention_forward(la.ao, la.alse, la.aq, la.ak, la.av, B, T, Ha, Hkv, D, c->attn_window);
    }
    matmul_forward(a->ymix, la.ao, PP(T_AO, l), nullptr, (int)N, d, d);
}

// its backward: g.dh_x holds dL/dh (floatX); leaves ln1's gradient in g.dln (fp32) and accumulates the layer's
// parameter gradients. a->ln holds ln2 on entry (ln1 is made again here, as the mixer's path does).
static void attn_layer_backward(Model* m, Acts* a, int l) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    int B = a->B, T = a->T, d = c->d_model, Ha = c->attn_heads, Hkv = c->attn_kv_heads, D = pdn_attn_head_dim(c);
    int KVD = pdn_attn_kv_dim(c);
    long N = (long)B * T;
    LayerActs& la = a->L[l];
    GradBufs& g = a->gb;
    const floatX* x = a->resid + (long)l * N * d;
    { PROF("bwd.attn");
    matmul_backward(g.dao_x, DINP_SETX, GG(T_AO, l), g.dh_x, la.ao, PP(T_AO, l), (int)N, d, d);
    if (attention_backward(g.daq_x, g.dak_x, g.daq, g.dak, g.dav_x, g.adi, g.dao_x, la.aq, la.ak, la.av, la.ao, la.alse,
                           B, T, Ha, Hkv, D, c->attn_window)) {
        rope_launch(g.daq_x, g.daq_x, N, T, Ha, D, 0, c->rope_theta, -1.0f);   // cuDNN's floatX gradients, in place
        rope_launch(g.dak_x, g.dak_x, N, T, Hkv, D, 0, c->rope_theta, -1.0f);
    } else {
        rope_launch(g.daq_x, g.daq, N, T, Ha, D, 0, c->rope_theta, -1.0f);
        rope_launch(g.dak_x, g.dak, N, T, Hkv, D, 0, c->rope_theta, -1.0f);
    } }
    PROF("bwd.attn.in_proj+norm");
    rmsnorm_apply(a->ln, x, la.ln1_rstd, PP(T_ATTN_NORM, l), N, d);
    matmul_backward(g.dln, DINP_SET, GG(T_AQ, l), g.daq_x, a->ln, PP(T_AQ, l), (int)N, d, d);
    matmul_backward(g.dln, DINP_ADD, GG(T_AK, l), g.dak_x, a->ln, PP(T_AK, l), (int)N, d, KVD);
    matmul_backward(g.dln, DINP_ADD, GG(T_AV, l), g.dav_x, a->ln, PP(T_AV, l), (int)N, d, KVD);
}

// Forward over a->tokens (B, T) into a->logits. rs: null for training, else the recurrent state, read and advanced.
// One layer from its ln1 (in a->ln) to the MLP's activation (a->ma) and, unless for_backward (the backward's
// recompute needs no W_down output), the MLP's output a->ymlp. Writes the layer's LayerActs.
// the diagonal preconditioner: k̃ of layer l (la.kt) and its chunk-start statistic (la.pcarry) from its k̂ and gates,
// and the statistic (la.astat) where the backward reads this forward's (stat: the last layer, or --recompute's run
// in the backward); remake (the backward): k̃ and the statistic again from the kept la.pcarry
// Packed documents: the diagonal preconditioner's statistic restarts from 0 at a document's first token, which is its
// recurrence a_t = exp(gP_t) a_{t-1} + u_t with the decay exp(gP_t) = 0 there. So its scans run unchanged on a copy of
// gP with -inf at those tokens: every exp of a sum through one is 0, and the backward's dgP there, exp(gP_t) times a
// finite sum, is 0 as the CPU reference's is (the gate's own backward reads the true gP with it).
__global__ void doc_gate_kernel(float* out, const float* gp, ChunkShape s) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= s.nq * s.C) { return; }
    int i = (int)(r % s.C);
    out[r] = chunk_docs(s, r / s.C)[i] == i ? -INFINITY : gp[r];
}
// layer l's gP as the preconditioner's scans read it: la.gp, or with documents its copy from doc_gate_kernel
static const float* doc_gate(Acts* a, const LayerActs& la) {
    if (!a->cs.doc) { return la.gp; }
    long rows = a->cs.nq * a->cs.C;
    doc_gate_kernel<<<cdiv(rows, 256), 256, 0, main_stream>>>(a->gpm, la.gp, a->cs);
    cudaCheck(cudaGetLastError());
    return a->gpm;
}

// The batch's packed documents (doc (B, T), train_pdn.c's), or none (null): their chunk values and the convolution's
// reach (doc_chunk_rel) on the device, and cs.doc set or cleared, for every kernel that takes the shape
static void acts_docs(Acts* a, const int* doc) {
    a->cs.doc = nullptr;
    if (!doc) { return; }
    if (!a->doc) { fail(EXIT_SYSTEM, "internal: packed documents without their buffers (acts_alloc's docs)"); }
    a->doc_h.resize((size_t)a->B * a->Tp);
    a->dlen_h.resize((size_t)a->B * a->T);
    doc_chunk_rel(doc, a->B, a->T, a->cs.C, a->doc_h.data(), a->dlen_h.data());
    // the host vectors live in Acts, so the copies may still be in flight when this returns
    cudaCheck(cudaMemcpyAsync(a->doc, a->doc_h.data(), a->doc_h.size(), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(a->dlen, a->dlen_h.data(), a->dlen_h.size(), cudaMemcpyHostToDevice, main_stream));
    a->cs.doc = a->doc;
}

static void precond_layer_forward(const Model* m, Acts* a, int l, RecState* rs, int stat, int remake) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    LayerActs& la = a->L[l];
    int H = c->n_head, Kp = a->cs.K;
    float* a0 = rs ? rs->a + (long)l * rs->B * H * Kp : nullptr; // (the padded channels: zero keys, statistic and k̃)
    PrecondBufs pb = a->sc.pc;
    pb.carry = la.pcarry;
    pb.astat = stat || remake ? la.astat : nullptr;
    const float* gp = doc_gate(a, la);
    if (remake) {
        precond_diag_remake(la.kt, pb, la.kn, gp, la.betap, PP(T_LOG_ATK_SCALE, l), a->B, H, a->NC, m->C, Kp, c->squash_x,
                            c->precond_eps);
    } else {
        precond_diag_forward(la.kt, pb, la.kn, gp, la.betap, PP(T_LOG_ATK_SCALE, l), a0, a0, a->B, H, a->NC, m->C, Kp,
                             c->squash_x, c->precond_eps);
    }
}

// the output norm of layer l's mixer output, times the output gate if the variant has one (its pre-activation
// gz = W_g2 g1 + b_g2 made here, from the kept g1): la.og (and la.o_rstd)
static void onorm_layer_forward(const Model* m, Acts* a, int l) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    LayerActs& la = a->L[l];
    if (c->out_gate) {
        matmul_forward(la.gz, la.g1, PP(T_WG2, l), PP(T_BG2, l), (int)(a->B * a->T), pdn_head_v(c), c->n_head * pdn_head_v(c));
    }
    onorm_gate_forward(c->out_gate ? nullptr : la.og, la.og, la.o_rstd, la.mx.O, PP(T_O_NORM, l), c->out_gate ? la.gz : nullptr,
                       a->B, a->T, c->n_head, pdn_head_v(c), a->cs.V, a->Tp, c->norm_eps);
}

static void layer_forward(const Model* m, Acts* a, int l, RecState* rs, int for_backward) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    int B = a->B, T = a->T, Tp = a->Tp, d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    int HK = H * K, HV = H * V, I = c->mlp_hidden, cs = c->conv_size;
    long N = (long)B * T;
    float eps = c->norm_eps, qscale = 1.0f / sqrtf((float)K), bmax = c->neg_eigval ? 2.0f : 1.0f;
    const ChunkShape& s = a->cs;
    int Kp = s.K, Vp = s.V; // head-major widths (mixer_pad)
    LayerActs& la = a->L[l];
    const floatX* x = a->resid + (long)l * N * d;
    long lb = (long)l * (rs ? rs->B : 0);
    if (pdn_is_attn(c, l)) {
        attn_layer_forward(m, a, l, rs);
    } else {
    { PROF("fwd.matmul.qkv");
    matmul_forward(la.qp, a->ln, PP(T_WQ, l), nullptr, (int)N, d, HK);
    matmul_forward(la.kp, a->ln, PP(T_WK, l), nullptr, (int)N, d, HK);
    matmul_forward(la.vp, a->ln, PP(T_WV, l), nullptr, (int)N, d, HV); }
    { PROF("fwd.conv+l2norm");
    floatX* hq = rs ? rs->hq + lb * (cs - 1) * HK : nullptr;
    floatX* hk = rs ? rs->hk + lb * (cs - 1) * HK : nullptr;
    floatX* hv = rs ? rs->hv + lb * (cs - 1) * HV : nullptr;
    // (the conv outputs before SiLU are not kept: the backward makes them again from qp, kp, vp)
    const unsigned char* dlen = s.doc ? a->dlen : nullptr; // packed documents: the taps stay inside each one
    conv_norm_forward(nullptr, la.qn, la.q_rstd, la.qp, PP(T_CONV_Q, l), hq, B, T, H, K, Kp, cs, Tp, 1, qscale, dlen);
    conv_norm_forward(nullptr, la.kn, la.k_rstd, la.kp, PP(T_CONV_K, l), hk, B, T, H, K, Kp, cs, Tp, 1, 1.0f, dlen);
    conv_norm_forward(nullptr, la.v, nullptr, la.vp, PP(T_CONV_V, l), hv, B, T, H, V, Vp, cs, Tp, 0, 1.0f, dlen);
    if (rs && cs > 1) {
        conv_history_kernel<<<cdiv((long)B * HK, 256), 256, 0, main_stream>>>(hq, la.qp, B, T, HK, cs);
        conv_history_kernel<<<cdiv((long)B * HK, 256), 256, 0, main_stream>>>(hk, la.kp, B, T, HK, cs);
        conv_history_kernel<<<cdiv((long)B * HV, 256), 256, 0, main_stream>>>(hv, la.vp, B, T, HV, cs);
        cudaCheck(cudaGetLastError());
    }
    }
    { PROF("fwd.gates");
    matmul_forward(la.beta_pre, a->ln, PP(T_WB, l), nullptr, (int)N, d, H);
    gate_forward(la.beta, la.beta_pre, nullptr, nullptr, 0, bmax, B, T, H, 1, 1, Tp);
    if (c->decay == DECAY_SCALAR) {
        matmul_forward(la.g_pre, a->ln, PP(T_WA, l), nullptr, (int)N, d, H);
        gate_forward(la.g, la.g_pre, PP(T_A_LOG, l), PP(T_DT_BIAS, l), 1, 0.0f, B, T, H, 1, 1, Tp);
    } else if (c->decay == DECAY_CHANNEL) {
        matmul_forward(la.f1, a->ln, PP(T_WF1, l), nullptr, (int)N, d, V);
        matmul_forward(la.g_pre, la.f1, PP(T_WF2, l), nullptr, (int)N, V, HK);
        gate_forward(la.g, la.g_pre, PP(T_A_LOG, l), PP(T_DT_BIAS, l), 1, 0.0f, B, T, H, K, Kp, Tp);
    }
    if (c->precond == PRECOND_DIAG) {
        matmul_forward(la.gp_pre, a->ln, PP(T_WAP, l), nullptr, (int)N, d, H);
        matmul_forward(la.bp_pre, a->ln, PP(T_WBP, l), nullptr, (int)N, d, H);
        gate_forward(la.gp, la.gp_pre, PP(T_A_LOGP, l), PP(T_DT_BIASP, l), 1, 0.0f, B, T, H, 1, 1, Tp);
        gate_forward(la.betap, la.bp_pre, nullptr, nullptr, 0, 1.0f, B, T, H, 1, 1, Tp);
    } }
    { PROF("fwd.precond");
    if (c->precond == PRECOND_DIAG) {
        // the backward reads this statistic unless it makes the layer's again (mixer_remake's layers)
        int stat = a->with_grads && (l == m->cfg.n_layer - 1 || for_backward);
        precond_layer_forward(m, a, l, rs, stat, 0);
    } else if (c->precond == PRECOND_EXACT) {
        float* P0 = rs ? rs->P + lb * H * Kp * Kp : nullptr;
        size_t sm = ((size_t)Kp * Kp + 2 * Kp) * sizeof(float);
        precond_exact_forward_kernel<<<B * H, 256, sm, main_stream>>>(la.kt, la.pstate, la.kn, P0, P0, T, Tp, Kp, m->C,
                                                                      a->NC, c->ridge, s.doc, H);
        cudaCheck(cudaGetLastError());
    }
    }
    float* S0 = rs ? rs->S + lb * H * Kp * Vp : nullptr;
    delta_chunk_forward(&la.mx, &a->sc, la.qn, la.kn, la.kt, la.v, la.beta, la.g, S0, S0, s);
    { PROF("fwd.onorm+gate+o");
    if (c->out_gate) { matmul_forward(la.g1, a->ln, PP(T_WG1, l), nullptr, (int)N, d, V); }
    onorm_layer_forward(m, a, l);
    matmul_forward(a->ymix, la.og, PP(T_WO, l), nullptr, (int)N, HV, d); }
    }
    PROF("fwd.mlp");
    rmsnorm_forward(la.h, a->ln, la.ln2_rstd, x, a->ymix, PP(T_MLP_NORM, l), N, d, eps);
    matmul_forward(la.mg, a->ln, PP(T_WGATE, l), nullptr, (int)N, d, I);
    matmul_forward(la.mu, a->ln, PP(T_WUP, l), nullptr, (int)N, d, I);
    swiglu_forward(a->ma, la.mg, la.mu, N * I);
    if (!for_backward) { matmul_forward(a->ymlp, a->ma, PP(T_WDOWN, l), nullptr, (int)N, I, d); }
}

// The classifier's rows for host targets y (N): the positions with a target when some have none (and at least one
// has one), else every row; uploaded to the device. Returns the rows' targets (host); acts_all_rows goes back.
static const int* acts_target_rows(Acts* a, const int* y) {
    long N = (long)a->B * a->T, M = 0;
    a->rows_h.resize((size_t)N); a->slot_h.resize((size_t)N); a->row_y_h.resize((size_t)N);
    for (long n = 0; n < N; n++) {
        a->slot_h[(size_t)n] = y[n] >= 0 ? (int)M : -1;
        if (y[n] >= 0) { a->rows_h[(size_t)M] = (int)n; a->row_y_h[(size_t)M] = y[n]; M++; }
    }
    a->M = M > 0 && M < N ? M : N;
    if (a->M == N) { return y; }
    // the host vectors live in Acts, so the copies may still be in flight when this returns
    cudaCheck(cudaMemcpyAsync(a->rows, a->rows_h.data(), M * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(a->slot, a->slot_h.data(), N * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(a->row_y, a->row_y_h.data(), M * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    return a->row_y_h.data();
}
static void acts_all_rows(Acts* a) { a->M = (long)a->B * a->T; }
// generation reads the last row's logits only
static void acts_last_row(Acts* a) {
    long N = (long)a->B * a->T;
    a->M = 1;
    if (N == 1) { return; }
    a->rows_h.assign(1, (int)(N - 1));
    cudaCheck(cudaMemcpyAsync(a->rows, a->rows_h.data(), sizeof(int), cudaMemcpyHostToDevice, main_stream));
}

// logits (M, vocab) = lnf's classifier rows (all N with all_rows) times the head
static void logits_forward(const Model* m, Acts* a, bool all_rows) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    long N = (long)a->B * a->T, M = all_rows ? N : a->M;
    int d = c->d_model;
    const floatX* x = a->lnf;
    if (M < N) {
        gather_rows(a->lnf_rows, a->lnf, a->rows, M, d);
        x = a->lnf_rows;
    }
    matmul_forward(a->logits, x, PP(c->tie_embeddings ? T_WTE : T_LM_HEAD, 0), nullptr, (int)M, d, c->vocab_size);
}

static void pdn_forward(const Model* m, Acts* a, RecState* rs) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    int d = c->d_model, L = c->n_layer;
    long N = (long)a->B * a->T;
    float eps = c->norm_eps;
    { PROF("fwd.embed+norms");
    encoder_forward(a->resid, a->tokens, PP(T_WTE, 0), (int)N, d);
    rmsnorm_forward(nullptr, a->ln, a->L[0].ln1_rstd, a->resid, nullptr, PP(T_ATTN_NORM, 0), N, d, eps); }
    for (int l = 0; l < L; l++) {
        layer_forward(m, a, l, rs, 0);
        PROF("fwd.mlp");
        // the residual stream after the layer, and the next layer's ln1 (or the final norm)
        floatX* xo = a->resid + (long)(l + 1) * N * d;
        if (l + 1 < L) {
            rmsnorm_forward(xo, a->ln, a->L[l + 1].ln1_rstd, a->L[l].h, a->ymlp, PP(T_ATTN_NORM, l + 1), N, d, eps);
        } else {
            rmsnorm_forward(xo, a->lnf, a->lnf_rstd, a->L[l].h, a->ymlp, PP(T_FINAL_NORM, 0), N, d, eps);
        }
    }
    PROF("fwd.classifier.matmul");
    logits_forward(m, a, false);
    if (rs) { rs->pos += a->T; }
}

// Backward: a->logits holds dlogits (classifier_kernel with dscale). host_tokens: the batch on the host, for the
// deterministic embedding backward. Accumulates into m->grads.
static void pdn_backward(Model* m, Acts* a, const int* host_tokens) {
    const PdnConfig* c = &m->cfg;
    const PdnLayout* lay = &m->lay;
    int B = a->B, T = a->T, Tp = a->Tp, d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    int HK = H * K, HV = H * V, I = c->mlp_hidden, cs = c->conv_size, gk = pdn_decay_width(c), L = c->n_layer;
    long N = (long)B * T;
    float eps = c->norm_eps, qscale = 1.0f / sqrtf((float)K), bmax = c->neg_eigval ? 2.0f : 1.0f;
    int Kp = a->cs.K, Vp = a->cs.V; // head-major widths (mixer_pad)
    GradBufs& g = a->gb;
    int head = c->tie_embeddings ? T_WTE : T_LM_HEAD;
    const InProj& ip = a->ip;
    int ldi = ip.width;
    auto din = [&](int id) { // the column slice of projection id in the packed gradients
        for (int i = 0; i < ip.n; i++) { if (ip.id[i] == id) { return g.din_x + ip.off[i]; } }
        fail(EXIT_SYSTEM, "internal: projection %d is not in the packed layout", id);
        return (floatX*)nullptr;
    };
    { PROF("bwd.classifier+final_norm");
    cudaCheck(cudaMemsetAsync(g.dresid, 0, N * d * sizeof(float), main_stream));
    if (a->M < N) { // the classifier's rows only (acts_target_rows): their gradient in g.dh (free here), then in place
        matmul_backward(g.dh, DINP_SET, GG(head, 0), a->logits, a->lnf_rows, PP(head, 0), (int)a->M, d, c->vocab_size);
        scatter_rows(g.dln, g.dh, a->slot, N, d);
    } else {
        matmul_backward(g.dln, DINP_SET, GG(head, 0), a->logits, a->lnf, PP(head, 0), (int)N, d, c->vocab_size);
    }
    rmsnorm_backward(g.dresid, GG(T_FINAL_NORM, 0), g.dln, nullptr, a->resid + (long)L * N * d, nullptr,
                     PP(T_FINAL_NORM, 0), a->lnf_rstd, N, d, nullptr, g.dresid_x); }
    dist_grads_ready(m, 0); // several GPUs: the classifier's and the final norm's gradients are final
    for (int l = L - 1; l >= 0; l--) {
        LayerActs& la = a->L[l];
        const floatX* x = a->resid + (long)l * N * d;
        // The last layer's activations, a->ln (its ln2) and a->ma among them, are still those of the forward just
        // run; for the others, --recompute runs the layer again from its input, else ln2 is made again here and ma
        // by the SwiGLU backward (from the reads it makes anyway).
        bool fresh = l == L - 1 || a->recompute;
        if (l < L - 1) {
            PROF("bwd.recompute");
            if (a->recompute) {
                rmsnorm_forward(nullptr, a->ln, la.ln1_rstd, x, nullptr, PP(T_ATTN_NORM, l), N, d, eps);
                layer_forward(m, a, l, nullptr, 1);
            } else {
                rmsnorm_apply(a->ln, la.h, la.ln2_rstd, PP(T_MLP_NORM, l), N, d);
                // what all mixer layers share (Acts' kt, the mixer scratch, vn, o, gz, og) holds layer l + 1's:
                // layer l's again, bit for bit, in dependency order (k̃, then W U Qg Kd V' O, then the output norm)
                if (!pdn_is_attn(c, l)) {
                    if (c->precond == PRECOND_DIAG) { precond_layer_forward(m, a, l, nullptr, 0, 1); }
                    mixer_remake(&la.mx, &a->sc, la.qn, la.kn, la.kt, la.v, la.beta, la.g, a->cs);
                    onorm_layer_forward(m, a, l);
                }
            }
        }
        // MLP: out = h + W_down (silu(W_gate ln2) ⊙ W_up ln2); g.dresid = dL/dout, g.dresid_x its floatX copy
        // side: the MLP's and W_o's weight gradients are made on the second stream during the mixer's backward scan
        bool side = a->side && !pdn_is_attn(c, l);
        { PROF("bwd.mlp+norm");
        matmul_backward(g.dma_x, DINP_SETX, nullptr, g.dresid_x, nullptr, PP(T_WDOWN, l), (int)N, I, d);
        swiglu_backward(g.dmg_x, g.dmu_x, fresh ? nullptr : a->ma, g.dma_x, la.mg, la.mu, N * I);
        if (!side) { matmul_backward(nullptr, 0, GG(T_WDOWN, l), g.dresid_x, a->ma, nullptr, (int)N, I, d); }
        matmul_backward(g.dln, DINP_SET, side ? nullptr : GG(T_WGATE, l), g.dmg_x, a->ln, PP(T_WGATE, l), (int)N, d, I);
        matmul_backward(g.dln, DINP_ADD, side ? nullptr : GG(T_WUP, l), g.dmu_x, a->ln, PP(T_WUP, l), (int)N, d, I);
        // dh = dresid + the norm's backward (and its floatX copy for the output projection)
        rmsnorm_backward(g.dh, GG(T_MLP_NORM, l), g.dln, nullptr, la.h, nullptr, PP(T_MLP_NORM, l), la.ln2_rstd, N, d,
                         g.dresid, g.dh_x);
        }
        if (pdn_is_attn(c, l)) {
            attn_layer_backward(m, a, l);
        } else {
        // mixer: h = x + W_o og
        { PROF("bwd.o+onorm+gate");
        matmul_backward(g.dog, DINP_SET, side ? nullptr : GG(T_WO, l), g.dh_x, la.og, PP(T_WO, l), (int)N, HV, d);
        onorm_gate_backward(g.dO_x, g.dgz_x, g.dgz_f, GG(T_O_NORM, l), g.dog, la.mx.O, PP(T_O_NORM, l),
                            c->out_gate ? la.gz : nullptr, la.o_rstd, B, T, H, V, Vp, Tp);
        if (c->out_gate) {
            colsum_add(GG(T_BG2, l), g.dgz_f, N, HV);
            matmul_backward(din(T_WG1), DINP_SETX, GG(T_WG2, l), g.dgz_x, la.g1, PP(T_WG2, l), (int)N, V, HV, 0, ldi);
        }
        }
        delta_chunk_backward(g.dq, g.dkh, g.dkt, g.dv, g.dbeta, gk ? g.dg : nullptr, &a->sc, &la.mx, g.dO_x, la.qn, la.kn,
                             la.kt, la.v, la.beta, c->precond == PRECOND_NONE, a->cs, side);
        if (side) { // queued here, they start with the scan (delta_chunk_backward's side_begin) and end at side_join
            matmul_backward(nullptr, 0, GG(T_WDOWN, l), g.dresid_x, a->ma, nullptr, (int)N, I, d, 0, 0, true);
            matmul_backward(nullptr, 0, GG(T_WGATE, l), g.dmg_x, a->ln, nullptr, (int)N, d, I, 0, 0, true);
            matmul_backward(nullptr, 0, GG(T_WUP, l), g.dmu_x, a->ln, nullptr, (int)N, d, I, 0, 0, true);
            matmul_backward(nullptr, 0, GG(T_WO, l), g.dh_x, la.og, nullptr, (int)N, HV, d, 0, 0, true);
        }
        { PROF("bwd.precond");
        if (c->precond == PRECOND_DIAG) {
            PrecondBufs pb = a->sc.pc;
            pb.astat = la.astat;
            precond_diag_backward(g.dkh, g.dgp, g.dbp, GG(T_LOG_ATK_SCALE, l), pb, g.dkt, la.kn, doc_gate(a, la), la.betap,
                                  PP(T_LOG_ATK_SCALE, l), B, H, a->NC, m->C, Kp, c->squash_x, c->precond_eps);
        } else if (c->precond == PRECOND_EXACT) {
            size_t sm = ((size_t)Kp * Kp + 5 * Kp) * sizeof(float);
            precond_exact_backward_kernel<<<B * H, 256, sm, main_stream>>>(g.dkh, g.pbuf, g.dkt, la.kn, la.pstate, T, Tp, Kp,
                                                                           m->C, a->NC, c->ridge, a->cs.doc, H);
            cudaCheck(cudaGetLastError());
        } }
        { PROF("bwd.gates");
        if (c->precond == PRECOND_DIAG) {
            gate_backward(din(T_WAP), ldi, GG(T_DT_BIASP, l), GG(T_A_LOGP, l), g.wprod, g.dgp, la.gp,
                          la.gp_pre, PP(T_A_LOGP, l), PP(T_DT_BIASP, l), 1, 1.0f, B, T, H, 1, 1, Tp);
            gate_backward(din(T_WBP), ldi, nullptr, nullptr, nullptr, g.dbp, la.betap, la.bp_pre, nullptr,
                          nullptr, 0, 1.0f, B, T, H, 1, 1, Tp);
        }
        if (c->decay == DECAY_SCALAR) {
            gate_backward(din(T_WA), ldi, GG(T_DT_BIAS, l), GG(T_A_LOG, l), g.wprod, g.dg, la.g, la.g_pre,
                          PP(T_A_LOG, l), PP(T_DT_BIAS, l), 1, 0.0f, B, T, H, 1, 1, Tp);
        } else if (c->decay == DECAY_CHANNEL) {
            gate_backward(g.dg_pre_x, HK, GG(T_DT_BIAS, l), GG(T_A_LOG, l), g.wprod, g.dg, la.g, la.g_pre,
                          PP(T_A_LOG, l), PP(T_DT_BIAS, l), 1, 0.0f, B, T, H, K, Kp, Tp);
            matmul_backward(din(T_WF1), DINP_SETX, GG(T_WF2, l), g.dg_pre_x, la.f1, PP(T_WF2, l), (int)N, V, HK, 0, ldi);
        }
        gate_backward(din(T_WB), ldi, nullptr, nullptr, nullptr, g.dbeta, la.beta, la.beta_pre, nullptr, nullptr,
                      0, bmax, B, T, H, 1, 1, Tp); }
        { PROF("bwd.l2norm+conv");
        const unsigned char* dlen = a->cs.doc ? a->dlen : nullptr; // packed documents
        conv_norm_backward(din(T_WQ), ldi, GG(T_CONV_Q, l), g.dq, la.qn, la.q_rstd, nullptr, la.qp, PP(T_CONV_Q, l), B, T, H, K, Kp, cs, Tp, 1, qscale, dlen);
        conv_norm_backward(din(T_WK), ldi, GG(T_CONV_K, l), g.dkh, la.kn, la.k_rstd, nullptr, la.kp, PP(T_CONV_K, l), B, T, H, K, Kp, cs, Tp, 1, 1.0f, dlen);
        conv_norm_backward(din(T_WV), ldi, GG(T_CONV_V, l), g.dv, la.v, nullptr, nullptr, la.vp, PP(T_CONV_V, l), B, T, H, V, Vp, cs, Tp, 0, 1.0f, dlen); }
        if (side) { side_join(); } // the second stream's GEMMs are done with ln (and everything else they read)
        PROF("bwd.matmul.in_proj+norm");
        // the weights' gradients in one GEMM over the packed slices (the gates' are 8 rows: alone they ran as slow
        // split-K GEMMs), each added to its tensor; ln1's (made again) gradient in one GEMM over the packed weights
        rmsnorm_apply(a->ln, x, la.ln1_rstd, PP(T_ATTN_NORM, l), N, d);
        matmul_lt(g.dwin, true, g.din_x, true, a->ln, false, ldi, d, (int)N, 1.0f, 0.0f, nullptr, ldi);
        for (int i = 0; i < ip.n; i++) {
            cudaCheck(cudaMemcpyAsync(g.win_x + (size_t)ip.off[i] * d, PP(ip.id[i], l), (size_t)ip.rows[i] * d * sizeof(floatX),
                                      cudaMemcpyDeviceToDevice, main_stream));
            add_inplace(GG(ip.id[i], l), g.dwin + (size_t)ip.off[i] * d, (long)ip.rows[i] * d);
        }
        matmul_lt(g.dln, true, g.din_x, false, g.win_x, false, (int)N, d, ldi, 1.0f, 0.0f, nullptr);
        }
        // dresid = dh + the norm's backward: the gradient of this layer's input (and its floatX copy for the next)
        rmsnorm_backward(g.dresid, GG(T_ATTN_NORM, l), g.dln, nullptr, x, nullptr, PP(T_ATTN_NORM, l), la.ln1_rstd, N, d,
                         g.dh, g.dresid_x);
        dist_grads_ready(m, L - l); // layer l's gradients are final
    }
    // embedding: group positions by token on the host (a counting sort: positions stay in increasing order within
    // a token, O(N + vocab); std::stable_sort took ~2 ms a step at 32K tokens), sum on the device
    PROF("bwd.embed");
    std::vector<int> count((size_t)c->vocab_size + 1, 0), tok, start, pos((size_t)N);
    for (long n = 0; n < N; n++) { count[(size_t)host_tokens[n] + 1]++; }
    for (int v = 0; v < c->vocab_size; v++) {
        if (count[(size_t)v + 1] > 0) { tok.push_back(v); start.push_back(count[(size_t)v]); }
        count[(size_t)v + 1] += count[(size_t)v]; // count[v]: where token v's positions begin
    }
    start.push_back((int)N);
    for (long n = 0; n < N; n++) { pos[(size_t)count[(size_t)host_tokens[n]]++] = (int)n; }
    cudaCheck(cudaMemcpyAsync(g.bucket_tok, tok.data(), tok.size() * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(g.bucket_start, start.data(), start.size() * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(g.bucket_pos, pos.data(), pos.size() * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    encoder_backward_kernel<<<dim3((unsigned)tok.size(), cdiv(d, 128)), 128, 0, main_stream>>>(GG(T_WTE, 0), g.dresid,
                                                                                              g.bucket_tok, g.bucket_start,
                                                                                              g.bucket_pos, d);
    cudaCheck(cudaGetLastError());
    dist_grads_ready(m, L + 1);
    cudaCheck(cudaStreamSynchronize(main_stream)); // the host vectors above must outlive the copies
}

// ----------------------------------------------------------------------------------------------------
// 5. training

// classifier over a->logits' M rows with their host targets y (acts_target_rows): losses (and dlogits in place when
// dscale != 0); returns the sum of losses over rows with a target, *count those rows; argmax_host (M) optional
static double classifier(Acts* a, int Vv, const int* y, float dscale, long* count, int* argmax_host) {
    long N = a->M;
    classifier_launch(a->logits, a->losses, argmax_host ? a->argmax : nullptr, a->M < (long)a->B * a->T ? a->row_y : a->targets,
                      N, Vv, dscale);
    std::vector<float> losses((size_t)N);
    cudaCheck(cudaMemcpy(losses.data(), a->losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    if (argmax_host) { cudaCheck(cudaMemcpy(argmax_host, a->argmax, N * sizeof(int), cudaMemcpyDeviceToHost)); }
    double s = 0.0;
    long c = 0;
    for (long n = 0; n < N; n++) { if (y[n] >= 0) { s += losses[(size_t)n]; c++; } }
    *count = c;
    return s;
}

static void upload_batch(Acts* a, const int* x, const int* y) {
    long N = (long)a->B * a->T;
    cudaCheck(cudaMemcpyAsync(a->tokens, x, N * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(a->targets, y, N * sizeof(int), cudaMemcpyHostToDevice, main_stream));
}

static void check_tokens(const int* x, long N, int vocab) {
    for (long n = 0; n < N; n++) {
        if (x[n] < 0 || x[n] >= vocab) { fail(EXIT_BADFILE, "token id %d at position %ld is outside the model's vocabulary [0, %d)", x[n], n, vocab); }
    }
}

static std::vector<float> to_host_float(const floatX* d, long n) {
    std::vector<floatX> tmp((size_t)n);
    cudaCheck(cudaMemcpy(tmp.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out((size_t)n);
    for (long i = 0; i < n; i++) { out[(size_t)i] = (float)tmp[(size_t)i]; }
    return out;
}

// one micro-batch: forward, loss, backward; returns the mean loss over positions with a target. doc: the packed
// documents (--doc-mask 1) or NULL. logits: if not NULL, gets the (N, vocab) logits before the softmax (--debug-state;
// every row)
static double forward_backward(Model* m, Acts* a, const int* x, const int* y, const int* doc, int grad_accum, float* logits) {
    long N = (long)a->B * a->T, count = 0;
    check_tokens(x, N, m->cfg.vocab_size);
    for (long n = 0; n < N; n++) { count += y[n] >= 0; }
    upload_batch(a, x, y);
    acts_docs(a, doc);
    const int* yr = acts_target_rows(a, y);
    pdn_forward(m, a, nullptr);
    if (logits) {
        logits_forward(m, a, true);
        std::vector<float> lg = to_host_float(a->logits, N * m->cfg.vocab_size);
        memcpy(logits, lg.data(), lg.size() * sizeof(float));
        logits_forward(m, a, false);
    }
    double sum;
    { PROF("classifier.softmax+loss");
    sum = classifier(a, m->cfg.vocab_size, yr, count ? (float)(1.0 / ((double)count * grad_accum)) : 0.0f, &count, nullptr); }
    if (count) { pdn_backward(m, a, x); }
    else { for (int b = 0; dist.reduce_now && b < dist.zp.n_buckets; b++) { dist_grads_ready(m, b); } } // zero gradients, same collectives
    acts_all_rows(a);
    return count ? sum / count : 0.0;
}

static double grad_norm(Model* m, float* scratch) {
    return sqrt((double)sum_squares(m->grads, (long)m->lay.num_elems, scratch));
}

// AdamW over every tensor; `step` is the 1-based step being completed (bias correction and rounding seeds);
// nonfinite: a device flag set if a parameter or moment is no longer finite
static void adamw_update(Model* m, const TrainConfig* tc, float lr, long step, float grad_scale, int* nonfinite) {
    float bc1, bc2;
    adam_bias_corrections(tc, step, &bc1, &bc2);
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &m->lay.t[i];
        if (!t->numel) { continue; }
        long o = (long)t->offset;
        adamw_kernel<<<cdiv(t->numel, 256), 256, 0, main_stream>>>(m->params + o, m->master + o, m->grads + o, m->m + o,
                                                                    m->v + o, (long)t->numel, lr, tc->beta1, tc->beta2, bc1, bc2,
                                                                    tc->adam_eps, t->wd ? tc->weight_decay : 0.0f, grad_scale,
                                                                    tensor_seed(m->seed, step, i), nonfinite);
    }
    cudaCheck(cudaGetLastError());
}

// The calls of train_common.h's run (evaluation, generation, checkpoints, the loop) for a model on this GPU (with
// ZeRO-1: this rank's shard of the fp32 master weights and moments).
struct Trainer {
    Model m;
    Acts acts;                 // (B, T) with gradients: training, evaluation, --debug-state
    const TrainConfig* tc;
    float* norm_scratch;       // (NORM_BLOCKS + 1)
    int* nonfinite;            // (1) set by the update when a parameter or moment is no longer finite
    cudaEvent_t ev0, ev1;      // the step's start and end on main_stream
    Acts eval;                 // (eval_B, eval_T) without gradients: tr_logprobs (--eval)
    int eval_B = 0, eval_T = 0;
};

static void tr_step_begin(Trainer* tr) {
    cudaCheck(cudaEventRecord(tr->ev0, main_stream));
    cudaCheck(cudaMemsetAsync(tr->m.grads, 0, tr->m.lay.num_elems * sizeof(float), main_stream));
}

static double tr_forward_backward(Trainer* tr, const int* x, const int* y, const int* doc, int accum, int last,
                                  float* logits) {
    dist.reduce_now = dist.on && last; // the last micro-step hands its buckets to NCCL
    double loss = forward_backward(&tr->m, &tr->acts, x, y, doc, accum, logits);
    dist.reduce_now = 0;
    return loss;
}

static double tr_grad_norm(Trainer* tr, double* loss, int* stop) {
    PROF("optimizer (norm+adamw)");
    return dist.on ? dist_loss_and_norm(loss, stop, tr->norm_scratch) : grad_norm(&tr->m, tr->norm_scratch);
}

static int tr_update(Trainer* tr, float lr, long step, double grad_scale) {
    PROF("optimizer (norm+adamw)");
    cudaCheck(cudaMemsetAsync(tr->nonfinite, 0, sizeof(int), main_stream));
    if (dist.on) { dist_adamw(&tr->m, tr->tc, lr, step, (float)grad_scale, tr->nonfinite); }
    else { adamw_update(&tr->m, tr->tc, lr, step, (float)grad_scale, tr->nonfinite); }
    int bad = 0;
    cudaCheck(cudaMemcpy(&bad, tr->nonfinite, sizeof(int), cudaMemcpyDeviceToHost)); // (waits for the update)
    if (dist.on) { double b = bad; dist_sum(&b, 1); bad = b > 0; } // each rank updated its shard
    return bad;
}

// a dropped update: the master weights stay; the floatX parameters become those of `step`, rounded as a resume from
// this step's checkpoint re-creates them (with ZeRO-1 from the gathered master weights, as model_upload does)
static void tr_skip(Trainer* tr, long step) {
    Model* m = &tr->m;
    if (dist.on) { dist_gather_full(m, m->master, nullptr); round_params(m, m->grads, step); }
    else { round_params(m, m->master, step); }
}

static double tr_step_end(Trainer* tr, int timed) {
    cudaCheck(cudaEventRecord(tr->ev1, main_stream));
    cudaCheck(cudaEventSynchronize(tr->ev1));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, tr->ev0, tr->ev1));
    prof_flush(timed);
    if (timed && dist.on) { dist_time_step(); }
    return ms / 1e3;
}

static double tr_eval_batch(Trainer* tr, const int* x, const int* y, const int* doc, long* count, long* hits) {
    Model* m = &tr->m;
    Acts* a = &tr->acts;
    long N = (long)a->B * a->T;
    std::vector<int> am((size_t)N);
    check_tokens(x, N, m->cfg.vocab_size);
    upload_batch(a, x, y);
    acts_docs(a, doc);
    const int* yr = acts_target_rows(a, y);
    pdn_forward(m, a, nullptr);
    double sum = classifier(a, m->cfg.vocab_size, yr, 0.0f, count, am.data());
    *hits = 0;
    for (long n = 0; n < a->M; n++) { if (yr[n] >= 0) { *hits += am[(size_t)n] == yr[n]; } }
    acts_all_rows(a);
    return sum;
}

static void tr_sum(Trainer* tr, double* v, int n) { (void)tr; if (dist.on) { dist_sum(v, n); } }

// the fp32 master weights and moments, gathered from the shards with ZeRO-1: the files do not depend on the number
// of processes
static void tr_host_state(Trainer* tr, real* params, real* mom1, real* mom2) {
    Model* m = &tr->m;
    if (dist.on) {
        dist_gather_full(m, m->master, params);
        dist_gather_full(m, m->m, mom1);
        dist_gather_full(m, m->v, mom2);
        return;
    }
    size_t n = m->lay.num_elems;
    cudaCheck(cudaMemcpy(params, m->master, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(mom1, m->m, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(mom2, m->v, n * sizeof(float), cudaMemcpyDeviceToHost));
}

static void tr_grads(Trainer* tr, float* out) {
    cudaCheck(cudaMemcpy(out, tr->m.grads, tr->m.lay.num_elems * sizeof(float), cudaMemcpyDeviceToHost));
}

// generation: the recurrent state lives on the GPU
struct GenState { Model* m; RecState rs; Acts ap, a1; };

static GenState* tr_gen_open(Trainer* tr, int P, int total) {
    GenState* g = new GenState();
    g->m = &tr->m;
    g->rs = recstate_alloc(&tr->m.cfg, 1, total);
    g->ap = acts_alloc(g->m, 1, P, 0, 0);
    g->a1 = acts_alloc(g->m, 1, 1, 0, 0);
    return g;
}

static void tr_gen_feed(GenState* g, const int* tokens, int n, float* row) {
    Acts* a = n == 1 ? &g->a1 : &g->ap;
    int Vv = g->m->cfg.vocab_size;
    cudaCheck(cudaMemcpy(a->tokens, tokens, n * sizeof(int), cudaMemcpyHostToDevice));
    acts_last_row(a);
    pdn_forward(g->m, a, &g->rs);
    acts_all_rows(a);
    std::vector<float> last = to_host_float(a->logits, Vv);
    memcpy(row, last.data(), Vv * sizeof(float));
}

static void tr_gen_close(GenState* g) { acts_free(&g->ap); acts_free(&g->a1); g->rs.arena.release(); delete g; }

// the fused classifier's losses (fp32 from the floatX logits) at the targets, negated
static void tr_logprobs(Trainer* tr, int B, int T, const int* x, const int* y, float* lp) {
    Model* m = &tr->m;
    if (tr->eval_B != B || tr->eval_T != T) {
        if (tr->eval_B) { acts_free(&tr->eval); }
        tr->eval = acts_alloc(m, B, T, 0, 0);
        tr->eval_B = B; tr->eval_T = T;
    }
    Acts* a = &tr->eval;
    long N = (long)B * T;
    int Vv = m->cfg.vocab_size;
    check_tokens(x, N, Vv);
    std::vector<int> yy(y, y + N);
    for (long n = 0; n < N; n++) { if (yy[(size_t)n] >= Vv) { yy[(size_t)n] = -1; } }
    upload_batch(a, x, yy.data());
    pdn_forward(m, a, nullptr);
    classifier_launch(a->logits, a->losses, nullptr, a->targets, N, Vv, 0.0f);
    cudaCheck(cudaMemcpy(lp, a->losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    for (long n = 0; n < N; n++) { lp[n] = yy[(size_t)n] >= 0 ? -lp[n] : 0.0f; }
}

static void tr_watch(Trainer* tr, const char* phase) { (void)tr; if (dist.on) { watch(phase, dist.timeout); } }

// Peak dense bf16 tensor FLOP/s for MFU. Known cards by name (vendor figures); otherwise SMs x clock x the
// architecture's dense bf16 FLOP per clock per SM (Hopper 4096, Ampere/Ada 2048 for data-center parts);
// < 0 when unknown (then no MFU is printed rather than a wrong one).
static double peak_bf16_flops(const cudaDeviceProp* p) {
    struct { const char* name; double tflops; } known[] = {
        {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H200 NVL", 835.0}, {"H100", 989.4}, {"H200", 989.4},
        {"GH200", 989.4}, {"A100", 312.0}, {"L40S", 362.0}, {"A10", 125.0},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strstr(p->name, known[i].name)) { return known[i].tflops * 1e12; }
    }
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    double per_sm = p->major == 9 ? 4096 : (p->major == 8 && p->minor == 0) ? 2048 : -1;
    return per_sm < 0 ? -1.0 : per_sm * p->multiProcessorCount * clock_khz * 1e3;
}

// model FLOPs per training token: 6 per matmul parameter (the tied classifier counts through wte) plus the
// chunkwise mixer's products, forward 2C(3K+2V) + 6KV per head and mixer layer, and attention's q kᵀ and P v, forward
// 4 D per key a query sees (on average (T+1)/2, or the window), per head and attention layer; times 3 for fwd + bwd
static double flops_per_token(const PdnConfig* c, const PdnLayout* lay, int C, int T) {
    double K = c->head_k, V = pdn_head_v(c), keys = (T + 1) / 2.0;
    if (c->attn_window && c->attn_window < keys) { keys = c->attn_window; }
    double mixer = 3.0 * lay->n_mix * c->n_head * (2.0 * C * (3 * K + 2 * V) + 6 * K * V);
    double attn = 3.0 * lay->n_attn * c->attn_heads * 4.0 * pdn_attn_head_dim(c) * keys;
    return 6.0 * (double)lay->num_params + mixer + attn;
}

// the device, cuBLAS handles and workspace, kernel attributes: what runs before the first kernel (trainer and lab)
// (device: this process's GPU, dist_device(); the lab takes 0)
static cudaDeviceProp gpu_setup(int device = 0) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fail(EXIT_SYSTEM, "no CUDA device found (this needs a GPU; train_pdn is the CPU trainer)");
    }
    cudaDeviceProp prop;
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    // main_stream: a blocking stream, so it orders with the legacy default stream as stream 0 did (cudaMemcpy and the
    // like still wait for its work), at the highest priority (the backward's second stream has the lowest)
    int lowest, highest;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    cudaCheck(cudaStreamCreateWithPriority(&main_stream, cudaStreamDefault, highest));
    cublasCheck(cublasCreate(&cublas_handle));
    cublasCheck(cublasSetStream(cublas_handle, main_stream));
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cudaCheck(cudaMalloc(&cublaslt_workspace, cublaslt_workspace_size));
    cublasCheck(cublasSetWorkspace(cublas_handle, cublaslt_workspace, cublaslt_workspace_size));
#ifdef ENABLE_FP32
    cublasCheck(cublasSetMathMode(cublas_handle, CUBLAS_PEDANTIC_MATH)); // no TF32 anywhere
#endif
    mixer_kernel_setup();
    return prop;
}

#ifndef TESTING
int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); // a line at a time even into a pipe (| tee): each step shows as it ends
    PdnConfig mc;
    TrainConfig tc;
    parse_args(argc, argv, &mc, &tc);
    dist_identify(&tc); // rank and world size (one process unless a launcher or --world-size says otherwise)
    int world = dist.env.world, rank = dist.env.rank;
    train_config_check(&tc, world);
    if (hf_command(&tc)) { return 0; }
    if (world > 1 && (tc.generate || tc.debug_state[0] || tc.eval[0])) {
        fail(EXIT_USAGE, "--generate, --eval and --debug-state run in one process (this is rank %d of %d)", rank, world);
    }
    if (!tc.chunk_form) { fail(EXIT_USAGE, "the CUDA trainer runs the chunkwise mixer only (--mixer chunk); the per-token form is the CPU reference's"); }
    if (tc.chunk > GPU_CHUNK_MAX || tc.chunk % 16) {
        fail(EXIT_USAGE, "--chunk must be a multiple of 16, at most %d, on the GPU (got %d)", GPU_CHUNK_MAX, tc.chunk);
    }

    // the model: from a checkpoint (-e, or -y 1 with one in -o), else from the flags; a vocabulary the preset leaves at
    // 0 comes from the data source (MQAR: --mqar-vocab; text: the tokenizer, else the shards)
    real* loaded = nullptr;
    uint32_t loaded_crc = 0;
    char resume_state[1100];
    Tokenizer tok_mem;
    DataSource ds;
    Tokenizer* tok = run_setup(&tc, &mc, &loaded, &loaded_crc, resume_state, sizeof resume_state, &tok_mem, &ds, rank, world);
    if (tc.count_params) { print_param_table(&mc); return 0; }
    if (layerset_count(&mc.attn_layers) && pdn_attn_head_dim(&mc) > ATTN_MAX_D) {
        fail(EXIT_USAGE, "the GPU trainer's attention needs a head dim (--d-model / --attn-heads) of at most %d (got %d)",
             ATTN_MAX_D, pdn_attn_head_dim(&mc));
    }
    if (mc.precond == PRECOND_EXACT && mixer_pad(mc.head_k) > 128) { fail(EXIT_USAGE, "the exact preconditioner on the GPU needs --head-dim <= 128"); }
    if (mc.conv_size > CONV_CS_MAX) { fail(EXIT_USAGE, "--conv-size must be <= %d on the GPU", CONV_CS_MAX); }
    if (mc.head_k > 256 || pdn_head_v(&mc) > 256) {
        fail(EXIT_USAGE, "the GPU trainer needs key and value head dims of at most 256 (got K %d, V %d)", mc.head_k, pdn_head_v(&mc));
    }

    int device = dist_device();
    cudaDeviceProp prop = gpu_setup(device);
    dist_connect(&tc, device); // several processes: rendezvous and NCCL (fails with a message, never hangs)
    if (mc.decay == DECAY_CHANNEL) {
        int Kp = mixer_pad(mc.head_k);
        ChunkShape cs{1, 1, 1, tc.chunk, tc.chunk, 1, Kp, mixer_pad(pdn_head_v(&mc)), Kp, 1, nullptr};
        bool exact_fits = smem_scores_channel_bwd(cs) <= (size_t)smem_optin; // the FMA kernels (fp32 build, fallback)
#ifndef ENABLE_FP32
        if (!exact_fits && !scores_use_tc(cs)) {
            fail(EXIT_USAGE, "channel decay on this GPU supports key head dims up to 256 (got %d)", mc.head_k);
        }
#else
        if (!exact_fits) {
            fail(EXIT_USAGE, "channel decay in the fp32 build supports key head dims up to about 160 on this GPU (got %d; the "
                             "bf16 build takes up to 256)", mc.head_k);
        }
#endif
    }
    prof_on = getenv("PDN_PROFILE") && atoi(getenv("PDN_PROFILE")) != 0;
#ifndef ENABLE_FP32
    // a kernel-plan experiment without a rebuild: PDN_SCAN_STAGES=1|2|3 forces the scans' stage buffers (MixerPlan)
    if (getenv("PDN_SCAN_STAGES")) { scan_stages_force = atoi(getenv("PDN_SCAN_STAGES")); }
    if (getenv("PDN_SCAN_BV")) { scan_bv_force = atoi(getenv("PDN_SCAN_BV")); } // 16 | 32: the scans' value columns
#endif
    // likewise PDN_BWD_SIDE=0|1: the backward's second stream off or on whatever bwd_side_for says
    if (getenv("PDN_BWD_SIDE")) { bwd_side_force = atoi(getenv("PDN_BWD_SIDE")) != 0; }

    Trainer tr;
    tr.tc = &tc;
    Model* m = &tr.m;
    PdnLayout lay;
    pdn_build_layout(&mc, &lay);
    if (dist.on) { zero_plan_build(&mc, &lay, world, rank, &dist.zp); }
    model_init(m, &mc, tc.chunk, (uint64_t)tc.seed, dist.on ? dist.zp.shard_total : lay.num_elems);
    dist_buffers();
    std::vector<float> host(m->lay.num_elems), hm, hv;
    if (loaded) { memcpy(host.data(), loaded, host.size() * sizeof(float)); free(loaded); }
    else { pdn_init_params(&mc, &m->lay, host.data(), (uint64_t)tc.seed); }
    char precision[32];
    snprintf(precision, sizeof precision, "cuda-%s", PRECISION_NAME);
    Run run;
    run_init(&run, &tc, &mc, &m->lay, &ds, tok, rank, world, precision);
    if (resume_state[0] && !tc.generate) { // the optimizer moments, the step and the data position
        hm.resize(m->lay.num_elems); hv.resize(m->lay.num_elems);
        run.start_step = resume_state_read(resume_state, &tc, world, loaded_crc, &ds, hm.data(), hv.data(), m->lay.num_elems, "f32");
    }
    // the floatX parameters of that step, rounded as the run did; with ZeRO-1 each rank keeps its shard of the rest
    model_upload(m, dist.on ? &dist.zp : nullptr, host.data(), hm.empty() ? nullptr : hm.data(),
                 hv.empty() ? nullptr : hv.data(), run.start_step);

    if (tc.eval[0]) {
        run_eval(&tr, &run);
        if (tr.eval_B) { acts_free(&tr.eval); }
        if (tok) { tokenizer_free(tok); }
        return 0;
    }
    if (tc.generate) {
        run_generate(&tr, &run);
        if (tok) { tokenizer_free(tok); }
        return 0;
    }
    run_check(&run);
    double peak = peak_bf16_flops(&prop);
    char device_name[320];
    snprintf(device_name, sizeof device_name, "%s (%d SMs)%s", prop.name, prop.multiProcessorCount, world > 1 ? " per process" : "");
    print_config_box(&mc, &tc, &m->lay, device_name, PRECISION_NAME);
    if (peak > 0) { printf("peak dense bf16: %.0f TFLOP/s per GPU (for MFU)\n", peak / 1e12); }
    if (dist.on) {
        printf("data parallel: %d processes, one GPU each (%s; rendezvous: %s); ZeRO-1: each keeps 1/%d of the fp32 master "
               "weights and AdamW moments; %d gradient buckets reduce-scattered during the backward\n", world,
               dist.env.source, dist.how, world, dist.zp.n_buckets);
    }

    tr.acts = acts_alloc(m, tc.B, tc.T, 1, tc.recompute, ds.doc != nullptr);
#ifdef USE_CUDNN
    sdpa_setup(&mc, tc.B, tc.T); // cuDNN's attention plan for the training shape, if it builds here
#endif
    mixer_plan_print(tr.acts.cs, mc.head_k, pdn_head_v(&mc));
    printf("backward: the MLP's and W_o's weight gradients %s\n",
           tr.acts.side
               ? "on a second stream, beside the mixer's backward (its scans leave multiprocessors idle at this shape)"
               : "on the main stream (the mixer's scans fill the device at this shape)");
    attention_plan_print(&mc);
    printf("device memory: parameters + optimizer %.1f MiB, activations %.1f MiB (%d x %.1f MiB kept per layer%s, %.1f MiB "
           "shared)%s\n",
           (m->lay.num_elems * (sizeof(floatX) + 4.0) + m->n_opt * 12.0 +
            (dist.on ? dist.zp.packed_total * (4.0 + sizeof(floatX)) + dist.zp.shard_total * 4.0 : 0.0)) / 1048576.0,
           tr.acts.arena.bytes / 1048576.0, tr.acts.nstore, tr.acts.layer_bytes / 1048576.0,
           tr.acts.recompute ? ", --recompute 1: all layers share it" : "",
           (tr.acts.arena.bytes - (double)tr.acts.nstore * tr.acts.layer_bytes) / 1048576.0,
           dist.on ? " (per GPU, with the communication buffers)" : "");
    cudaCheck(cudaMalloc(&tr.norm_scratch, (NORM_BLOCKS + 1) * sizeof(float)));
    cudaCheck(cudaMalloc(&tr.nonfinite, sizeof(int)));
    cudaCheck(cudaEventCreate(&tr.ev0));
    cudaCheck(cudaEventCreate(&tr.ev1));
    if (tc.debug_state[0]) { // one micro-batch, the first of this run's data stream, as the CPU trainer does
        run_debug_state(&tr, &run);
        dist_finish();
        acts_free(&tr.acts);
        model_free(m);
        data_free(&ds);
        if (tok) { tokenizer_free(tok); }
        return 0;
    }
    run.flops_per_token = flops_per_token(&mc, &m->lay, tc.chunk, tc.T);
    run.peak_flops = peak > 0 ? peak * world : -1.0;
    int rc = run_train(&tr, &run);
    prof_report(run.timed);
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    char extra[160];
    snprintf(extra, sizeof extra, "; %.0f tok/s averaged over the timed steps; device memory in use %.1f GiB",
             run.timed ? tc.total_batch / (run.t_steps / run.timed) : 0.0, (total_b - free_b) / 1073741824.0);
    print_done(&run, extra);
    if (dist.on && run.timed) {
        printf("communication per step (rank 0): reduce-scatter %.2f ms (bucket packing included; overlapped with the backward), "
               "of it exposed after the backward %.2f ms; all-gather %.2f ms\n", dist.rs_ms / run.timed,
               dist.exposed_ms / run.timed, dist.ag_ms / run.timed);
    }
    dist_finish();
#ifdef USE_CUDNN
    sdpa_release();
#endif
    acts_free(&tr.acts);
    model_free(m);
    data_free(&ds);
    if (tok) { tokenizer_free(tok); }
    return rc;
}
#endif
