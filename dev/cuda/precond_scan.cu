/*
Kernel lab: the diagonal preconditioner's statistic scan (MODEL.md §3.6, §4), forward and backward.
  forward:  a_t = exp(gP_t) a_{t-1} + betaP_t k̂_t²  (per key channel, a_0 = 0, updated before use)
            r = log(a_t + eps) - c, s = r / (1 + |r|), k̃ = exp(-ln(x) s) k̂        (x = 1.5, eps = 1e-6, c = log_atk_scale[h])
  backward: from dk̃: dk̂ += (direct path and through a), dgP, dbetaP (per token), dlog_atk_scale (per head) +=
Layout: head-major padded rows (B, H, Tp), as the trainer keeps them; padded rows have k̂ = 0, gP = 0, betaP = 0.

Versions:
  v1  one thread per channel, one block per (b, h), sequential over all Tp tokens (written here); the backward sums
      dgP and dbetaP over the channels with a block reduction per token, dlog_atk_scale per (b, h) then over b
      (the trainer's precond_dc_kernel with one "chunk" per sequence)
  v2  the trainer's kernels until 2026-12-01: chunk-parallel three passes (every chunk from zero, storing the
      local scan loc and GPc; the chunk-start values across chunks; pass 3 adds the carried part and forms k̃);
      backward likewise with a stored local reverse scan, dk updated in passes 1 and 3. 18 bytes per element forward,
      40 backward
  v3  the trainer's kernels until v4: the same passes without per-token scratch: pass 1 keeps only the chunk's end
      (forward) or first-row (backward) values, pass 3 runs the chunk's recurrence again from the carried value, dk is
      updated once: 10 bytes per element forward, 28 backward (a thread per channel, a block per chunk, accurate
      logf / expf / divisions). H200, 2026-12-01, B16 H8 T2048 K128: fwd 0.275 -> 0.190 ms, bwd 0.573 -> 0.533 ms
      against v2: far from the bytes' time; its accurate logf / expf / divisions cost ~220 instructions per element
      in the backward (an estimate; v5 measures what the fast forms give)
  v4  a warp per chunk in every pass (lane l owns channels l + 32 c, so the per-row decay is computed once per K / 32
      channels and the per-token channel sums are one warp sum, no shared memory) and __logf / __expf / __fdividef
      (relative error ~1e-6). H200, 2026-12-01: fwd 0.209 ms, bwd 0.431 ms; per pass (ncu): end 25 us, fix 163,
      first_bwd 159, fix_bwd 228
  v5  v3 with __logf / __expf / __fdividef (a thread per channel): fwd 0.145 ms, bwd 0.387 ms; per pass: end 41 us,
      fix 83, first_bwd 99, fix_bwd 245 (the carries ~15 us each; the dlog_atk_scale sum, then one block, 18 us: every
      version now uses v6's)
  v6  the trainer's kernels until 2026-12-07: the faster layout per pass (end and fix_bwd from v4: precond_end_kernel,
      precond_fix_bwd_kernel; fix and first_bwd from v5: precond_fix_kernel, precond_first_bwd_kernel) and the
      dlog_atk_scale sum by a block per head (precond_dc_kernel): fwd 0.145 ms, bwd 0.358 ms; then the carry passes
      with their loads off the sequential chain (restrict, unrolled): 0.140 / 0.351 ms, and at B1 T16384 0.125 ->
      0.087 / 0.301 -> 0.267 ms (the carries had taken ~0.1 ms each there). The trainer ran all three passes, the
      statistic stored, in the forward and again in the backward's remake of k̃ ("remake" column = fwd)
  v7  no statistic tensor at all (2026-12-07, not kept): the forward keeps its carries (nq, K) and stores no
  v8  statistic, the remake is pass 3 alone, and the backward's passes 1 and 3 (a thread per channel) make the
  v9  statistic again from the carries into shared memory, a segment of S rows at a time (v7 S = C, v8 C/2, v9 C/4),
      and walk it in reverse. H100, 2026-12-07, B16 T2048: fwd 0.166 -> 0.113, remake 0.166 -> 0.071, but bwd 0.430
      -> 0.752 / 0.551 / 0.541 ms: a layer 0.762 -> 0.936 / 0.734 / 0.725 ms; end to end with S = C, pgdn-340m
      117,560 / 116,908 against 118,577 / 118,844 tok/s (-1.2%)
  v10 the trainer's since 2026-12-07: v7's forward and remake, but the remake (or the forward of a layer whose backward
      makes nothing again) stores the statistic, and the backward is v6's: fwd 6 bytes an element, remake 8, bwd 28.
      In the trainer: the debug states equal v6's byte for byte (scripts/bitcmp.sh, 13 rows, H100), pgdn-340m
      16 x 2048 +0.6% (results/conv_precond_2026-12-07_h100/). This lab's v10 rows first ran on an H100 2026-12-07: 183/183 checks PASS.

CPU reference: precond_diag_forward / precond_diag_backward of train_pdn.c, in double, from the inputs as the device
sees them (k̂ and log_atk_scale rounded to floatX).
Validation: B=2, H=3, T=200 (partial last chunk), K = 32, 64, 128; kt, astat, dk, dgP, dbetaP, dlog_atk_scale.
Tolerances (relative L2): everything but k̃ is computed in fp32 from identical inputs, so 1e-4 in both builds
(measured differences of this kind are 1e-6..1e-5); k̃ is stored as floatX: 1e-2 in bf16 (one rounding, rms
relative error ~1e-3), 1e-4 in fp32.
Timing: B=16 H=8 T=2048 K=128 (a 340m training micro-batch) and B=1 H=8 T=16384 K=128 (long context: few heads,
so v1 has only 8 blocks).

Build and run (from the repository root):
  make -C dev/cuda precond_scan precond_scan_fp32
  dev/cuda/precond_scan [1..10] [--no-bench]
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 10
static const double TOL_F32 = 1e-4;
#ifdef ENABLE_FP32
static const double TOL_KT = 1e-4;
#else
static const double TOL_KT = 1e-2;
#endif
static const char* VERSION_NAME[11] = {"", "v1 sequential", "v2 chunked", "v3 recompute", "v4 warp/chunk", "v5 v3 + fast",
                                        "v6 v4/v5 mix", "v7 no stat C", "v8 no stat C/2", "v9 no stat C/4", "v10 carries"};
static const int SEG_DIV[11] = {0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 0}; // v7-v9: the backward's segment is C / SEG_DIV
static const int CHUNK = 64;
static const float PC_X = 1.5f, PC_EPS = 1e-6f;

// ----------------------------------------------------------------------------------------------------
// v1: one thread per channel, sequential over the whole sequence

// (the trainer's per-thread forward and key terms until v4, used by v1, v3 and v5; FAST: the hardware approximations)
template <bool FAST> __device__ __forceinline__ float lab_exp(float x) { return FAST ? __expf(x) : expf(x); }
template <bool FAST> __device__ __forceinline__ float lab_log(float x) { return FAST ? __logf(x) : logf(x); }
template <bool FAST> __device__ __forceinline__ float lab_div(float x, float y) { return FAST ? __fdividef(x, y) : x / y; }
// the statistic's recurrence over rows r0 .. r0+n-1 of channel j from a (the value before r0): astat, k̃
template <bool FAST>
__device__ __forceinline__ void precond_forward_rows(floatX* kt, float* astat, const floatX* k, const float* gp, const float* bp,
                                                     float a, float c, long r0, int n, int j, int K, float lnx, float eps) {
    #pragma unroll 4
    for (int i = 0; i < n; i++) {
        long row = r0 + i;
        float kj = tof(k[row * K + j]);
        a = lab_exp<FAST>(gp[row]) * a + bp[row] * kj * kj;
        float r = lab_log<FAST>(a + eps) - c;
        float s = lab_div<FAST>(r, 1.0f + fabsf(r));
        astat[row * K + j] = a;
        kt[row * K + j] = fromf<floatX>(lab_exp<FAST>(-lnx * s) * kj);
    }
}
// the write key's local terms at one (token, channel): m = exp(-ln(x) s(r)) (k̃ = m k̂) and dr = dL/dr from g = dL/dk̃
template <bool FAST>
__device__ __forceinline__ float precond_key_terms(float a, float kj, float g, float c, float lnx, float eps, float* m) {
    float r = lab_log<FAST>(a + eps) - c;
    float sq = lab_div<FAST>(r, 1.0f + fabsf(r));
    *m = lab_exp<FAST>(-lnx * sq);
    return lab_div<FAST>(g * kj * -lnx * *m, (1.0f + fabsf(r)) * (1.0f + fabsf(r)));
}
__global__ void precond_forward_seq_kernel(floatX* kt, float* astat, const floatX* k, const float* gp, const float* bp,
                                           const floatX* log_atk_scale, int H, int Tp, int K, float lnx, float eps) {
    int bh = blockIdx.x, j = threadIdx.x;
    if (j >= K) { return; }
    precond_forward_rows<false>(kt, astat, k, gp, bp, 0.0f, tof(log_atk_scale[bh % H]), (long)bh * Tp, Tp, j, K, lnx, eps);
}

// blockDim.x: K rounded up to a multiple of 32 (block_sum). dk +=; dgp, dbp =; dcs[bh] = Σ -dr (then precond_dc_kernel)
__global__ void precond_backward_seq_kernel(float* dk, float* dgp, float* dbp, float* dcs_out, const float* dkt, const floatX* k,
                                            const float* gp, const float* bp, const float* astat, const floatX* log_atk_scale,
                                            int H, int Tp, int K, float lnx, float eps) {
    int bh = blockIdx.x, j = threadIdx.x;
    bool on = j < K;
    float abar = 0.0f, dcs = 0.0f, c = tof(log_atk_scale[bh % H]);
    for (int t = Tp - 1; t >= 0; t--) {
        long row = (long)bh * Tp + t;
        float sg = 0.0f, sb = 0.0f;
        if (on) {
            long i = row * K + j;
            float kj = tof(k[i]), a = astat[i], g = dkt[i];
            float r = logf(a + eps) - c;
            float s = r / (1.0f + fabsf(r));
            float m = expf(-lnx * s);
            float dr = g * kj * -lnx * m / ((1.0f + fabsf(r)) * (1.0f + fabsf(r)));
            dcs -= dr;
            abar += dr / (a + eps);
            float decay = expf(gp[row]), aprev = t > 0 ? astat[i - K] : 0.0f;
            sg = abar * aprev * decay;
            sb = abar * kj * kj;
            dk[i] += g * m + 2.0f * bp[row] * kj * abar;
            abar *= decay;
        }
        sg = block_sum(sg);
        sb = block_sum(sb);
        if (threadIdx.x == 0) { dgp[row] = sg; dbp[row] = sb; }
    }
    float tot = block_sum(on ? dcs : 0.0f);
    if (threadIdx.x == 0) { dcs_out[bh] = tot; }
}

// the per-token sums of a block's warps (part: per row, per warp), in warp order, after a barrier: dgp = Σ, times exp(gP)
// where the warps summed without the decay (times_decay); dbp = Σ
__device__ __forceinline__ void rows_from_warps(float* dgp, float* dbp, float (*part)[GPU_CHUNK_MAX][8], const float* gp,
                                                long r0, int C, bool times_decay) {
    __syncthreads();
    int nw = blockDim.x / 32;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float tg = 0.0f, tb = 0.0f;
        for (int w = 0; w < nw; w++) { tg += part[0][i][w]; tb += part[1][i][w]; }
        dgp[r0 + i] = times_decay ? __expf(gp[r0 + i]) * tg : tg;
        dbp[r0 + i] = tb;
    }
}

// ----------------------------------------------------------------------------------------------------
// v2: the trainer's kernels until 2026-12-01: pass 1 stored the chunk-local scan (loc, and the chunk-local cumsum of
// gP, GPc) for pass 3 to add the carried part; the backward stored its local reverse scan (abl) the same way and
// updated dk in passes 1 and 3. Extra buffers: loc (rows, K) and GPc (rows).

// pass 1: loc (hm fp32, the chunk-local scan), GPc (rows: cumsum of gP in the chunk), cend (nq, K): loc at the chunk
// end, cdec (nq): exp(Σ gP over the chunk)
__global__ void precond_local_v2_kernel(float* __restrict__ loc, float* __restrict__ GPc, float* __restrict__ cend, float* __restrict__ cdec, const floatX* __restrict__ k, const float* __restrict__ gp,
                                     const float* __restrict__ bp, int C, int K) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    if (j >= K) { return; }
    float a = 0.0f, G = 0.0f;
    #pragma unroll 4
    for (int i = 0; i < C; i++) {
        long row = r0 + i;
        float kj = tof(k[row * K + j]), g = gp[row];
        a = expf(g) * a + bp[row] * kj * kj;
        G += g;
        loc[row * K + j] = a;
        if (j == 0) { GPc[row] = G; }
    }
    cend[q * K + j] = a;
    if (j == 0) { cdec[q] = expf(G); }
}

// pass 3: astat (hm fp32) = loc + exp(GPc) carry; k̃ (hm floatX)
__global__ void precond_fix_v2_kernel(floatX* __restrict__ kt, float* __restrict__ astat, const float* __restrict__ loc, const float* __restrict__ GPc, const float* __restrict__ carry,
                                   const floatX* __restrict__ k, const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx, float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    if (j >= K) { return; }
    float cj = carry[q * K + j], c = tof(log_atk_scale[(q / NC) % H]);
    #pragma unroll 4
    for (int i = 0; i < C; i++) {
        long row = r0 + i;
        float a = loc[row * K + j] + expf(GPc[row]) * cj;
        float r = logf(a + eps) - c;
        float sq = r / (1.0f + fabsf(r));
        astat[row * K + j] = a;
        kt[row * K + j] = fromf<floatX>(expf(-lnx * sq) * tof(k[row * K + j]));
    }
}

// the backward is the reverse recurrence abar_t = l_t + d_{t+1} abar_{t+1} (abar = dL/da_t) with the local term
// l_t = dr_t / (a_t + eps) from the write key, again in three passes. pass 1 (per chunk, reverse): dk += g m (the
// direct path), the local reverse scan abl (hm fp32, from zero at the chunk end), cfirst (nq, K) = abl at the chunk's
// first row, and dcp (nq) = this chunk's part of dlog_atk_scale = -Σ dr (block sum, fixed order)
__global__ void precond_local_bwd_v2_kernel(float* __restrict__ dk, float* __restrict__ abl, float* __restrict__ cfirst, float* __restrict__ dcp, const float* __restrict__ dkt, const floatX* __restrict__ k,
                                         const float* __restrict__ gp, const float* __restrict__ astat, const floatX* __restrict__ log_atk_scale, int H, int NC,
                                         int C, int K, float lnx, float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    float acc = 0.0f, dcs = 0.0f, c = tof(log_atk_scale[(q / NC) % H]);
    if (j < K) {
        #pragma unroll 4
        for (int i = C - 1; i >= 0; i--) {
            long row = r0 + i;
            float kj = tof(k[row * K + j]), a = astat[row * K + j], g = dkt[row * K + j];
            float r = logf(a + eps) - c;
            float sq = r / (1.0f + fabsf(r));
            float m = expf(-lnx * sq);
            float dr = g * kj * -lnx * m / ((1.0f + fabsf(r)) * (1.0f + fabsf(r)));
            dcs -= dr;
            dk[row * K + j] += g * m;
            acc = dr / (a + eps) + (i + 1 < C ? expf(gp[row + 1]) : 0.0f) * acc;
            abl[row * K + j] = acc;
        }
        cfirst[q * K + j] = acc;
    }
    float tot = block_sum(j < K ? dcs : 0.0f);
    if (threadIdx.x == 0) { dcp[q] = tot; }
}

// pass 2: incoming[q] = d_{first row of q+1} abar_{first row of q+1}, walking the chunks in reverse
__global__ void precond_carry_bwd_v2_kernel(float* incoming, const float* cfirst, const float* GPc, const float* gp, int NC, int C, int K) {
    int bh = blockIdx.x, j = threadIdx.x;
    if (j >= K) { return; }
    float in = 0.0f;
    for (int c = NC - 1; c >= 0; c--) {
        long q = (long)bh * NC + c, r0 = q * C;
        incoming[q * K + j] = in;
        // abar at this chunk's first row = local + (Π of the chunk's later decays) * incoming
        float first = cfirst[q * K + j] + expf(GPc[r0 + C - 1] - GPc[r0]) * in;
        in = expf(gp[r0]) * first;
    }
}

// pass 3: abar_t = abl_t + exp(GPc_last - GPc_t) incoming; dk += 2 betaP k abar; per token, dgP = Σ_j abar a_{t-1} d_t
// and dbetaP = Σ_j abar k² (block sums in channel order; K threads, K a multiple of 32)
__global__ void precond_fix_bwd_v2_kernel(float* __restrict__ dk, float* __restrict__ dgp, float* __restrict__ dbp, const float* __restrict__ abl, const float* __restrict__ incoming,
                                       const float* __restrict__ GPc, const float* __restrict__ gp, const float* __restrict__ bp, const float* __restrict__ astat, const floatX* __restrict__ k,
                                       int NC, int C, int K) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    __shared__ float part[2][GPU_CHUNK_MAX][8]; // per row, per warp (K <= 256): summed in warp order after the loop
    int lane = j % 32, warp = j / 32;
    float in = j < K ? incoming[q * K + j] : 0.0f, glast = GPc[r0 + C - 1];
    #pragma unroll 4
    for (int i = 0; i < C; i++) {
        long row = r0 + i;
        float sg = 0.0f, sb = 0.0f;
        if (j < K) {
            float ab = abl[row * K + j] + expf(glast - GPc[row]) * in;
            float kj = tof(k[row * K + j]);
            float aprev = (i > 0 || q % NC != 0) ? astat[(row - 1) * K + j] : 0.0f;
            sg = ab * aprev * expf(gp[row]);
            sb = ab * kj * kj;
            dk[row * K + j] += 2.0f * bp[row] * kj * ab;
        }
        sg = warp_sum(sg);
        sb = warp_sum(sb);
        if (lane == 0) { part[0][i][warp] = sg; part[1][i][warp] = sb; }
    }
    rows_from_warps(dgp, dbp, part, gp, r0, C, false);
}

static void precond_diag_forward_v2(floatX* kt, const PrecondBufs& pb, float* loc, float* gpc, const floatX* k, const float* gp,
                                    const float* bp, const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x,
                                    float eps) {
    int nq = B * H * NC;
    precond_local_v2_kernel<<<nq, K, 0, main_stream>>>(loc, gpc, pb.ca, pb.cc, k, gp, bp, C, K);
    precond_carry_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cc, nullptr, nullptr, NC, K);
    precond_fix_v2_kernel<<<nq, K, 0, main_stream>>>(kt, pb.astat, loc, gpc, pb.cb, k, log_atk_scale, H, NC, C, K, logf(x), eps);
    cudaCheck(cudaGetLastError());
}
static void precond_diag_backward_v2(float* dk, float* dgp, float* dbp, float* dlas, const PrecondBufs& pb, float* loc,
                                     const float* gpc, const float* dkt, const floatX* k, const float* gp, const float* bp,
                                     const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x, float eps) {
    int nq = B * H * NC, kthreads = std::max(32, (K + 31) / 32 * 32);
    precond_local_bwd_v2_kernel<<<nq, kthreads, 0, main_stream>>>(dk, loc, pb.ca, pb.cc, dkt, k, gp, pb.astat, log_atk_scale,
                                                                  H, NC, C, K, logf(x), eps);
    precond_carry_bwd_v2_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, gpc, gp, NC, C, K);
    precond_fix_bwd_v2_kernel<<<nq, kthreads, 0, main_stream>>>(dk, dgp, dbp, loc, pb.cb, gpc, gp, bp, pb.astat, k, NC, C, K);
    precond_dc_kernel<<<H, 256, 0, main_stream>>>(dlas, pb.cc, B, H, NC);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// v3: the trainer's kernels until v4 (2026-12-01): v2's passes without per-token scratch, a thread per channel and a
// block per chunk, accurate logf / expf / divisions, per-token sums by warp sums then the warps in shared memory;
// passes 2 (the carries) and the dlog_atk_scale sum are the trainer's. v5: the same with FAST (__logf, __expf,
// __fdividef), to tell the instructions' share from the layout's in v4

// forward pass 1: cend (nq, K) = the chunk's scan from zero at its last row, cdec (nq) = exp(Σ gP over the chunk)
template <bool FAST>
__global__ void precond_end_v3_kernel(float* __restrict__ cend, float* __restrict__ cdec, const floatX* __restrict__ k,
                                   const float* __restrict__ gp, const float* __restrict__ bp, int C, int K) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    if (j >= K) { return; }
    float a = 0.0f, G = 0.0f;
    #pragma unroll 8
    for (int i = 0; i < C; i++) {
        long row = r0 + i;
        float kj = tof(k[row * K + j]), g = gp[row];
        a = lab_exp<FAST>(g) * a + bp[row] * kj * kj;
        G += g;
    }
    cend[q * K + j] = a;
    if (j == 0) { cdec[q] = lab_exp<FAST>(G); }
}
// forward pass 3: from the chunk-start value carry, the recurrence again: astat (hm fp32), k̃ (hm floatX)
template <bool FAST>
__global__ void precond_fix_v3_kernel(floatX* __restrict__ kt, float* __restrict__ astat, const float* __restrict__ carry,
                                      const floatX* __restrict__ k, const float* __restrict__ gp, const float* __restrict__ bp,
                                      const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx,
                                      float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    if (j >= K) { return; }
    precond_forward_rows<FAST>(kt, astat, k, gp, bp, carry[q * K + j], tof(log_atk_scale[(q / NC) % H]), r0, C, j, K, lnx, eps);
}
// backward pass 1 (reverse, from zero at the chunk end): cfirst (nq, K) = the local abar at the chunk's first row;
// dcp (nq) = this chunk's part of dlog_atk_scale = -Σ dr (block sum, fixed order); cdl (nq) = exp(Σ gP over the
// chunk's rows after the first): the decay from its first row to its end
template <bool FAST>
__global__ void precond_first_bwd_v3_kernel(float* __restrict__ cfirst, float* __restrict__ dcp, float* __restrict__ cdl,
                                         const float* __restrict__ dkt, const floatX* __restrict__ k,
                                         const float* __restrict__ gp, const float* __restrict__ astat,
                                         const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx,
                                         float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    float acc = 0.0f, dcs = 0.0f, G1 = 0.0f, c = tof(log_atk_scale[(q / NC) % H]);
    if (j < K) {
        #pragma unroll 4
        for (int i = C - 1; i >= 0; i--) {
            long row = r0 + i;
            float kj = tof(k[row * K + j]), a = astat[row * K + j], m;
            float dr = precond_key_terms<FAST>(a, kj, dkt[row * K + j], c, lnx, eps, &m);
            dcs -= dr;
            float dn = 0.0f;
            if (i + 1 < C) { float gn = gp[row + 1]; dn = lab_exp<FAST>(gn); G1 += gn; }
            acc = lab_div<FAST>(dr, a + eps) + dn * acc;
        }
        cfirst[q * K + j] = acc;
    }
    float tot = block_sum(j < K ? dcs : 0.0f);
    if (threadIdx.x == 0) { dcp[q] = tot; cdl[q] = lab_exp<FAST>(G1); }
}
// backward pass 3 (reverse, from incoming): abar_t = dr_t / (a_t + eps) + d_{t+1} abar_{t+1};
// dk += g m + 2 betaP k abar; per token dgP = Σ_j abar a_{t-1} d_t, dbetaP = Σ_j abar k² (warp sums, then the warps
// in order)
template <bool FAST>
__global__ void precond_fix_bwd_v3_kernel(float* __restrict__ dk, float* __restrict__ dgp, float* __restrict__ dbp,
                                          const float* __restrict__ incoming, const float* __restrict__ dkt,
                                          const floatX* __restrict__ k, const float* __restrict__ gp,
                                          const float* __restrict__ bp, const float* __restrict__ astat,
                                          const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int K, float lnx,
                                          float eps) {
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    __shared__ float part[2][GPU_CHUNK_MAX][8]; // per row, per warp (K <= 256): summed in warp order after the loop
    int lane = j % 32, warp = j / 32;
    bool on = j < K;
    float c = tof(log_atk_scale[(q / NC) % H]);
    float nxt = on ? incoming[q * K + j] : 0.0f;                    // d_{t+1} abar_{t+1} for the chunk's last row
    float a = on ? astat[(r0 + C - 1) * K + j] : 0.0f;              // a_t, walking backwards: a_{t-1} is the next a
    #pragma unroll 4
    for (int i = C - 1; i >= 0; i--) {
        long row = r0 + i;
        float sg = 0.0f, sb = 0.0f;
        if (on) {
            float kj = tof(k[row * K + j]), g = dkt[row * K + j];
            float aprev = (i > 0 || q % NC != 0) ? astat[(row - 1) * K + j] : 0.0f;
            float m, dr = precond_key_terms<FAST>(a, kj, g, c, lnx, eps, &m);
            float ab = lab_div<FAST>(dr, a + eps) + nxt, d = lab_exp<FAST>(gp[row]);
            sg = ab * aprev * d;
            sb = ab * kj * kj;
            dk[row * K + j] += g * m + 2.0f * bp[row] * kj * ab;
            nxt = d * ab;
            a = aprev;
        }
        sg = warp_sum(sg);
        sb = warp_sum(sb);
        if (lane == 0) { part[0][i][warp] = sg; part[1][i][warp] = sb; }
    }
    rows_from_warps(dgp, dbp, part, gp, r0, C, false);
}
template <bool FAST>
static void precond_diag_forward_v3(floatX* kt, const PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                    const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x, float eps) {
    int nq = B * H * NC;
    precond_end_v3_kernel<FAST><<<nq, K, 0, main_stream>>>(pb.ca, pb.cc, k, gp, bp, C, K);
    precond_carry_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cc, nullptr, nullptr, NC, K);
    precond_fix_v3_kernel<FAST><<<nq, K, 0, main_stream>>>(kt, pb.astat, pb.cb, k, gp, bp, log_atk_scale, H, NC, C, K, logf(x), eps);
    cudaCheck(cudaGetLastError());
}
template <bool FAST>
static void precond_diag_backward_v3(float* dk, float* dgp, float* dbp, float* dlas, const PrecondBufs& pb, const float* dkt,
                                     const floatX* k, const float* gp, const float* bp, const floatX* log_atk_scale, int B,
                                     int H, int NC, int C, int K, float x, float eps) {
    int nq = B * H * NC, kthreads = std::max(32, (K + 31) / 32 * 32);
    precond_first_bwd_v3_kernel<FAST><<<nq, kthreads, 0, main_stream>>>(pb.ca, pb.cc, pb.cd, dkt, k, gp, pb.astat, log_atk_scale,
                                                                  H, NC, C, K, logf(x), eps);
    precond_carry_bwd_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cd, gp, NC, C, K);
    precond_fix_bwd_v3_kernel<FAST><<<nq, kthreads, 0, main_stream>>>(dk, dgp, dbp, pb.cb, dkt, k, gp, bp, pb.astat, log_atk_scale,
                                                                H, NC, C, K, logf(x), eps);
    precond_dc_kernel<<<H, 256, 0, main_stream>>>(dlas, pb.cc, B, H, NC);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// v4: a warp per chunk in every pass (2026-12-01). The forward's pass 1 and the backward's pass 3 are the trainer's
// (precond_end_kernel, precond_fix_bwd_kernel); these two were slower than v5's thread per channel and stay here

// forward pass 3: from the chunk-start value carry, the recurrence again: astat (hm fp32), k̃ (hm floatX)
template <int CPT>
__global__ void __launch_bounds__(32 * PC_WARPS, PC_MIN_BLOCKS(CPT)) precond_fix_v4_kernel(floatX* __restrict__ kt, float* __restrict__ astat, const float* __restrict__ carry,
                                   const floatX* __restrict__ k, const float* __restrict__ gp, const float* __restrict__ bp,
                                   const floatX* __restrict__ log_atk_scale, long nq, int H, int NC, int C, int K, float lnx,
                                   float eps) {
    long q = (long)blockIdx.x * PC_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (q >= nq) { return; }
    float a[CPT], cs = tof(log_atk_scale[(q / NC) % H]);
    #pragma unroll
    for (int c = 0; c < CPT; c++) { a[c] = lane + 32 * c < K ? carry[q * K + lane + 32 * c] : 0.0f; }
    #pragma unroll 2
    for (int i = 0; i < C; i++) {
        long row = q * C + i;
        float d = __expf(gp[row]), b = bp[row];
        #pragma unroll
        for (int c = 0; c < CPT; c++) {
            int j = lane + 32 * c;
            if (j < K) {
                float kj = tof(k[row * K + j]), inv;
                a[c] = d * a[c] + b * kj * kj;
                astat[row * K + j] = a[c];
                kt[row * K + j] = fromf<floatX>(precond_key_scale(a[c], cs, lnx, eps, &inv) * kj);
            }
        }
    }
}
// backward pass 1 (reverse, from zero at the chunk end): cfirst (nq, K) = the local abar at the chunk's first row;
// dcp (nq) = this chunk's part of dlog_atk_scale = -Σ dr (warp sum, fixed order); cdl (nq) = exp(Σ gP over the
// chunk's rows after the first): the decay from its first row to its end
template <int CPT>
__global__ void __launch_bounds__(32 * PC_WARPS, PC_MIN_BLOCKS(CPT)) precond_first_bwd_v4_kernel(float* __restrict__ cfirst, float* __restrict__ dcp, float* __restrict__ cdl,
                                         const float* __restrict__ dkt, const floatX* __restrict__ k,
                                         const float* __restrict__ gp, const float* __restrict__ astat,
                                         const floatX* __restrict__ log_atk_scale, long nq, int H, int NC, int C, int K,
                                         float lnx, float eps) {
    long q = (long)blockIdx.x * PC_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (q >= nq) { return; }
    float acc[CPT], dcs = 0.0f, G1 = 0.0f, dn = 0.0f, cs = tof(log_atk_scale[(q / NC) % H]); // dn: the next row's decay
    #pragma unroll
    for (int c = 0; c < CPT; c++) { acc[c] = 0.0f; }
    #pragma unroll 2
    for (int i = C - 1; i >= 0; i--) {
        long row = q * C + i;
        #pragma unroll
        for (int c = 0; c < CPT; c++) {
            int j = lane + 32 * c;
            if (j < K) {
                float m, dr, u = precond_key_grad(astat[row * K + j], tof(k[row * K + j]), dkt[row * K + j], cs, lnx, eps,
                                                  &m, &dr);
                dcs -= dr;
                acc[c] = u + dn * acc[c];
            }
        }
        float g = gp[row];
        if (i > 0) { G1 += g; }
        dn = __expf(g);
    }
    #pragma unroll
    for (int c = 0; c < CPT; c++) { if (lane + 32 * c < K) { cfirst[q * K + lane + 32 * c] = acc[c]; } }
    dcs = warp_sum(dcs);
    if (lane == 0) { dcp[q] = dcs; cdl[q] = __expf(G1); }
}
static void precond_diag_forward_v4(floatX* kt, const PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                    const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x, float eps) {
    long nq = (long)B * H * NC;
    PRECOND_PASS(precond_end_kernel, nq, K, pb.ca, pb.cc, k, gp, bp, nq, C, K);
    precond_carry_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cc, nullptr, nullptr, NC, K);
    PRECOND_PASS(precond_fix_v4_kernel, nq, K, kt, pb.astat, pb.cb, k, gp, bp, log_atk_scale, nq, H, NC, C, K, logf(x), eps);
    cudaCheck(cudaGetLastError());
}
static void precond_diag_backward_v4(float* dk, float* dgp, float* dbp, float* dlas, const PrecondBufs& pb, const float* dkt,
                                     const floatX* k, const float* gp, const float* bp, const floatX* log_atk_scale, int B,
                                     int H, int NC, int C, int K, float x, float eps) {
    long nq = (long)B * H * NC;
    PRECOND_PASS(precond_first_bwd_v4_kernel, nq, K, pb.ca, pb.cc, pb.cd, dkt, k, gp, pb.astat, log_atk_scale, nq, H, NC, C,
                 K, logf(x), eps);
    precond_carry_bwd_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cd, gp, NC, C, K);
    PRECOND_PASS(precond_fix_bwd_kernel, nq, K, dk, dgp, dbp, pb.cb, dkt, k, gp, bp, pb.astat, log_atk_scale, nq, H, NC, C,
                 K, logf(x), eps);
    precond_dc_kernel<<<H, 256, 0, main_stream>>>(dlas, pb.cc, B, H, NC);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// v6: the trainer's launch sequence until 2026-12-07 (every forward and remake: all three passes, the statistic stored)
static void precond_diag_forward_v6(floatX* kt, const PrecondBufs& pb, const floatX* k, const float* gp, const float* bp,
                                    const floatX* log_atk_scale, int B, int H, int NC, int C, int K, float x, float eps) {
    PrecondBufs t = pb;
    t.carry = pb.cb; // its carries were scratch
    precond_diag_forward(kt, t, k, gp, bp, log_atk_scale, nullptr, nullptr, B, H, NC, C, K, x, eps);
}

// ----------------------------------------------------------------------------------------------------
// v7-v9: no statistic tensor; the backward makes it again from the kept carries, a segment of S rows at a time

// The backward's walk over a chunk (a thread per channel j): the statistic of the segment's rows s0 .. s0+S-1 made
// again from the chunk's start value into seg (S, K) (this thread's column only: no barrier); returns the value
// before row s0. Rows before s0 are run through again without being kept (a segment of S < C rows keeps the shared
// memory small, at C (C/S + 1) / 2 steps per chunk instead of C).
__device__ __forceinline__ float precond_segment_v7(float* seg, float a, const floatX* __restrict__ k,
                                                 const float* __restrict__ gp, const float* __restrict__ bp, long r0, int s0,
                                                 int S, int j, int K) {
    float before = a;
    #pragma unroll 4
    for (int i = 0; i < s0 + S; i++) {
        long row = r0 + i;
        a = precond_step(a, __expf(gp[row]), bp[row], tof(k[row * K + j]));
        if (i == s0 - 1) { before = a; }
        if (i >= s0) { seg[(i - s0) * K + j] = a; }
    }
    return before;
}
// backward pass 1 (reverse, from zero at the chunk end; a thread per channel): cfirst (nq, K) = the local abar at the
// chunk's first row; dcp (nq) = this chunk's part of dlog_atk_scale = -Σ dr (block sum, fixed order); cdl (nq) =
// exp(Σ gP over the chunk's rows after the first): the decay from its first row to its end. Shared: (S, K) floats.
__global__ void precond_first_bwd_v7_kernel(float* __restrict__ cfirst, float* __restrict__ dcp, float* __restrict__ cdl,
                                         const float* __restrict__ carry, const float* __restrict__ dkt,
                                         const floatX* __restrict__ k, const float* __restrict__ gp,
                                         const float* __restrict__ bp, const floatX* __restrict__ log_atk_scale, int H,
                                         int NC, int C, int S, int K, float lnx, float eps) {
    extern __shared__ float pc_seg[];
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x;
    float acc = 0.0f, dcs = 0.0f, G1 = 0.0f, dn = 0.0f, cs = tof(log_atk_scale[(q / NC) % H]); // dn: the next row's decay
    if (j < K) {
        for (int s0 = C - S; s0 >= 0; s0 -= S) {
            precond_segment_v7(pc_seg, carry[q * K + j], k, gp, bp, r0, s0, S, j, K);
            #pragma unroll 4
            for (int i = s0 + S - 1; i >= s0; i--) {
                long row = r0 + i;
                float m, dr, u = precond_key_grad(pc_seg[(i - s0) * K + j], tof(k[row * K + j]), dkt[row * K + j], cs, lnx,
                                                  eps, &m, &dr);
                dcs -= dr;
                acc = u + dn * acc;
                float g = gp[row];
                if (i > 0) { G1 += g; }
                dn = __expf(g);
            }
        }
        cfirst[q * K + j] = acc;
    }
    float tot = block_sum(j < K ? dcs : 0.0f);
    if (threadIdx.x == 0) { dcp[q] = tot; cdl[q] = __expf(G1); }
}
// backward pass 3 (reverse, from incoming; a thread per channel): abar_t = dr_t / (a_t + eps) + d_{t+1} abar_{t+1};
// dk += g m + 2 betaP k abar; per token dgP = d_t Σ_j abar a_{t-1}, dbetaP = Σ_j abar k² (warp sums, then the warps
// in order after the walk). Shared: (S, K) floats.
__global__ void precond_fix_bwd_v7_kernel(float* __restrict__ dk, float* __restrict__ dgp, float* __restrict__ dbp,
                                       const float* __restrict__ carry, const float* __restrict__ incoming,
                                       const float* __restrict__ dkt, const floatX* __restrict__ k,
                                       const float* __restrict__ gp, const float* __restrict__ bp,
                                       const floatX* __restrict__ log_atk_scale, int H, int NC, int C, int S, int K,
                                       float lnx, float eps) {
    extern __shared__ float pc_seg[];
    __shared__ float part[2][GPU_CHUNK_MAX][8]; // per row, per warp (K <= 256)
    long q = blockIdx.x, r0 = q * C;
    int j = threadIdx.x, lane = j % 32, warp = j / 32;
    bool on = j < K;
    float cs = tof(log_atk_scale[(q / NC) % H]);
    float nxt = on ? incoming[q * K + j] : 0.0f; // d_{t+1} abar_{t+1}
    for (int s0 = C - S; s0 >= 0; s0 -= S) {
        float before = on ? precond_segment_v7(pc_seg, carry[q * K + j], k, gp, bp, r0, s0, S, j, K) : 0.0f;
        #pragma unroll 2
        for (int i = s0 + S - 1; i >= s0; i--) {
            long row = r0 + i;
            float d = __expf(gp[row]), sg = 0.0f, sb = 0.0f;
            if (on) {
                float kj = tof(k[row * K + j]), g = dkt[row * K + j];
                float aprev = i > s0 ? pc_seg[(i - 1 - s0) * K + j] : before; // a_{t-1} (the carry: 0 before a sequence)
                float m, dr, ab = precond_key_grad(pc_seg[(i - s0) * K + j], kj, g, cs, lnx, eps, &m, &dr) + nxt;
                sg = ab * aprev;
                sb = ab * kj * kj;
                dk[row * K + j] += g * m + 2.0f * bp[row] * kj * ab;
                nxt = d * ab;
            }
            sg = warp_sum(sg);
            sb = warp_sum(sb);
            if (lane == 0) { part[0][i][warp] = sg; part[1][i][warp] = sb; }
        }
    }
    rows_from_warps(dgp, dbp, part, gp, r0, C, true);
}
static void precond_diag_backward_v7(float* dk, float* dgp, float* dbp, float* dlas, const PrecondBufs& pb, const float* dkt,
                                     const floatX* k, const float* gp, const float* bp, const floatX* log_atk_scale, int B,
                                     int H, int NC, int C, int S, int K, float x, float eps) {
    long nq = (long)B * H * NC;
    int kthreads = (K + 31) / 32 * 32;
    size_t sm = (size_t)S * K * sizeof(float); // <= 32 KB at the lab's shapes (C = 64, K <= 128)
    precond_first_bwd_v7_kernel<<<nq, kthreads, sm, main_stream>>>(pb.ca, pb.cc, pb.cd, pb.carry, dkt, k, gp, bp,
                                                                   log_atk_scale, H, NC, C, S, K, logf(x), eps);
    precond_carry_bwd_kernel<<<B * H, K, 0, main_stream>>>(pb.cb, pb.ca, pb.cd, gp, NC, C, K);
    precond_fix_bwd_v7_kernel<<<nq, kthreads, sm, main_stream>>>(dk, dgp, dbp, pb.carry, pb.cb, dkt, k, gp, bp, log_atk_scale,
                                                                 H, NC, C, S, K, logf(x), eps);
    precond_dc_kernel<<<H, 256, 0, main_stream>>>(dlas, pb.cc, B, H, NC);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------
// buffers and the versions' launch sequences

struct PcDev {
    ChunkShape s;
    Arena ar;
    PrecondBufs pb;
    floatX *k, *kt, *las;
    float *gp, *bp, *dkt, *dk, *dgp, *dbp, *dlas, *dcs;
    float *loc, *gpc; // v2's per-token scratch
};

static void pc_alloc(PcDev& d, const ChunkShape& s) {
    memset(&d.pb, 0, sizeof d.pb);
    d.s = s;
    long rows = s.nq * s.C, nq = s.nq;
    int K = s.K;
    Arena& ar = d.ar;
    ar.add(&d.k, rows * K); ar.add(&d.kt, rows * K); ar.add(&d.las, s.H);
    ar.add(&d.gp, rows); ar.add(&d.bp, rows); ar.add(&d.dkt, rows * K); ar.add(&d.dk, rows * K);
    ar.add(&d.dgp, rows); ar.add(&d.dbp, rows); ar.add(&d.dlas, s.H); ar.add(&d.dcs, (long)s.B * s.H);
    precond_scratch_add(ar, &d.pb, nq, K);
    ar.add(&d.pb.astat, rows * K); ar.add(&d.pb.carry, nq * K); ar.add(&d.loc, rows * K); ar.add(&d.gpc, rows);
    ar.alloc();
}

static void pc_forward(PcDev& d, int v) {
    const ChunkShape& s = d.s;
    if (v == 1) {
        precond_forward_seq_kernel<<<s.B * s.H, s.K, 0, main_stream>>>(d.kt, d.pb.astat, d.k, d.gp, d.bp, d.las, s.H, s.Tp,
                                                                       s.K, logf(PC_X), PC_EPS);
        cudaCheck(cudaGetLastError());
    } else if (v == 2) {
        precond_diag_forward_v2(d.kt, d.pb, d.loc, d.gpc, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K, PC_X, PC_EPS);
    } else if (v == 3 || v == 5) {
        auto fwd = v == 3 ? precond_diag_forward_v3<false> : precond_diag_forward_v3<true>;
        fwd(d.kt, d.pb, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K, PC_X, PC_EPS);
    } else if (v == 4) {
        precond_diag_forward_v4(d.kt, d.pb, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K, PC_X, PC_EPS);
    } else if (v == 6) {
        precond_diag_forward_v6(d.kt, d.pb, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K, PC_X, PC_EPS);
    } else { // v7-v10: the trainer's forward of a layer whose backward makes the statistic again (none stored)
        PrecondBufs t = d.pb;
        t.astat = nullptr;
        lab_precond_diag_forward(d.kt, t, d.k, d.gp, d.bp, d.las, s, PC_X, PC_EPS);
    }
}
static void pc_backward(PcDev& d, int v) {
    const ChunkShape& s = d.s;
    if (v == 1) {
        int kthreads = std::max(32, (s.K + 31) / 32 * 32);
        precond_backward_seq_kernel<<<s.B * s.H, kthreads, 0, main_stream>>>(d.dk, d.dgp, d.dbp, d.dcs, d.dkt, d.k, d.gp, d.bp,
                                                                             d.pb.astat, d.las, s.H, s.Tp, s.K, logf(PC_X), PC_EPS);
        precond_dc_kernel<<<s.H, 256, 0, main_stream>>>(d.dlas, d.dcs, s.B, s.H, 1);
        cudaCheck(cudaGetLastError());
    } else if (v == 2) {
        precond_diag_backward_v2(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.loc, d.gpc, d.dkt, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC,
                                 s.C, s.K, PC_X, PC_EPS);
    } else if (v == 3 || v == 5) {
        auto bwd = v == 3 ? precond_diag_backward_v3<false> : precond_diag_backward_v3<true>;
        bwd(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.dkt, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K,
            PC_X, PC_EPS);
    } else if (v == 4) {
        precond_diag_backward_v4(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.dkt, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K,
                                 PC_X, PC_EPS);
    } else if (v >= 7 && v <= 9) {
        precond_diag_backward_v7(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.dkt, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C,
                                 s.C / SEG_DIV[v], s.K, PC_X, PC_EPS);
    } else { // v6, v10: the trainer's backward (the statistic from the forward (v6) or the remake (v10))
        lab_precond_diag_backward(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.dkt, d.k, d.gp, d.bp, d.las, s, PC_X, PC_EPS);
    }
}
// the backward's remake of k̃ in the trainer: v1-v6 the forward again; v7-v9 pass 3 from the kept carries; v10 the
// same storing the statistic (the backward's input)
static void pc_remake(PcDev& d, int v) {
    const ChunkShape& s = d.s;
    if (v <= 6) { pc_forward(d, v); return; }
    PrecondBufs t = d.pb;
    if (v < 10) { t.astat = nullptr; }
    precond_diag_remake(d.kt, t, d.k, d.gp, d.bp, d.las, s.B, s.H, s.NC, s.C, s.K, PC_X, PC_EPS);
}

// ----------------------------------------------------------------------------------------------------
// CPU reference (double), compact rows (bh, t < T)

struct PcHost {
    int B, H, T, Tp, K;
    std::vector<float> k, gp, bp, las, dkt; // hm padded rows (las: H)
};
struct PcRef { std::vector<double> kt, astat, dk, dgp, dbp, dlas; };

static void pc_reference(const PcHost& h, PcRef& r) {
    int K = h.K, T = h.T, BH = h.B * h.H;
    double lnx = log((double)PC_X), eps = PC_EPS;
    r.kt.assign((size_t)BH * T * K, 0.0); r.astat.assign((size_t)BH * T * K, 0.0); r.dk.assign((size_t)BH * T * K, 0.0);
    r.dgp.assign((size_t)BH * T, 0.0); r.dbp.assign((size_t)BH * T, 0.0); r.dlas.assign(h.H, 0.0);
    std::vector<double> dc(BH, 0.0);
    for (int bh = 0; bh < BH; bh++) {
        double c = h.las[bh % h.H];
        for (int j = 0; j < K; j++) {
            double a = 0.0;
            for (int t = 0; t < T; t++) {
                size_t row = (size_t)bh * h.Tp + t, cr = (size_t)bh * T + t;
                double kj = h.k[row * K + j];
                a = exp((double)h.gp[row]) * a + (double)h.bp[row] * kj * kj;
                double rr = log(a + eps) - c, s = rr / (1.0 + fabs(rr));
                r.astat[cr * K + j] = a;
                r.kt[cr * K + j] = exp(-lnx * s) * kj;
            }
        }
        std::vector<double> abar(K, 0.0);
        double dcs = 0.0;
        for (int t = T - 1; t >= 0; t--) {
            size_t row = (size_t)bh * h.Tp + t, cr = (size_t)bh * T + t;
            double decay = exp((double)h.gp[row]), bp = h.bp[row], dg = 0.0, db = 0.0;
            for (int j = 0; j < K; j++) {
                double kj = h.k[row * K + j], a = r.astat[cr * K + j];
                double rr = log(a + eps) - c, s = rr / (1.0 + fabs(rr)), m = exp(-lnx * s), g = h.dkt[row * K + j];
                r.dk[cr * K + j] += g * m;
                double dr = g * kj * -lnx * m / ((1.0 + fabs(rr)) * (1.0 + fabs(rr)));
                dcs -= dr;
                abar[j] += dr / (a + eps);
                double aprev = t > 0 ? r.astat[(cr - 1) * K + j] : 0.0;
                dg += abar[j] * aprev * decay;
                db += abar[j] * kj * kj;
                r.dk[cr * K + j] += 2.0 * bp * kj * abar[j];
                abar[j] *= decay;
            }
            r.dgp[cr] = dg;
            r.dbp[cr] = db;
        }
        dc[bh] = dcs;
    }
    for (int bh = 0; bh < BH; bh++) { r.dlas[bh % h.H] += dc[bh]; }
}

static std::vector<float> gather_rows(const std::vector<float>& hm, int BH, int T, int Tp, int X) {
    std::vector<float> out((size_t)BH * T * X);
    for (int bh = 0; bh < BH; bh++) {
        for (int t = 0; t < T; t++) { memcpy(&out[((size_t)bh * T + t) * X], &hm[((size_t)bh * Tp + t) * X], X * sizeof(float)); }
    }
    return out;
}

static void validate_case(int version_sel, int K, uint64_t seed) {
    const int B = 2, H = 3, T = 200;
    PcHost h;
    h.B = B; h.H = H; h.T = T; h.Tp = (T + CHUNK - 1) / CHUNK * CHUNK; h.K = K;
    int BH = B * H, NC = h.Tp / CHUNK;
    size_t rows = (size_t)BH * h.Tp;
    h.k.assign(rows * K, 0.0f); h.dkt.assign(rows * K, 0.0f); h.gp.assign(rows, 0.0f); h.bp.assign(rows, 0.0f); h.las.assign(H, 0.0f);
    LabRng rng(seed);
    for (int i = 0; i < H; i++) { h.las[i] = lab_round((float)(-0.2 + 0.6 * (rng.uniform() - 0.5))); } // init -0.2, learned
    std::vector<double> tmp(K);
    for (int bh = 0; bh < BH; bh++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)bh * h.Tp + t;
            double ss = 0.0;
            for (int j = 0; j < K; j++) { tmp[j] = rng.normal(); ss += tmp[j] * tmp[j]; }
            for (int j = 0; j < K; j++) { h.k[row * K + j] = lab_round((float)(tmp[j] / sqrt(ss + 1e-6))); }
            for (int j = 0; j < K; j++) { h.dkt[row * K + j] = (float)rng.normal(); }
            h.gp[row] = (float)-lab_softplus(-2.0 + 1.5 * rng.normal());
            h.bp[row] = (float)lab_sigmoid(rng.normal());
        }
    }
    PcRef r;
    pc_reference(h, r);
    ChunkShape s{B, H, T, h.Tp, CHUNK, NC, K, K, 0, (long)BH * NC, nullptr};
    PcDev d{};
    pc_alloc(d, s);
    std::vector<floatX> kx(rows * K), lx(H);
    for (size_t i = 0; i < kx.size(); i++) { kx[i] = lab_f2x(h.k[i]); }
    for (int i = 0; i < H; i++) { lx[i] = lab_f2x(h.las[i]); }
    cudaCheck(cudaMemcpy(d.k, kx.data(), kx.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.las, lx.data(), lx.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.gp, h.gp.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.bp, h.bp.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.dkt, h.dkt.data(), rows * K * sizeof(float), cudaMemcpyHostToDevice));
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        lab_poison(d.kt, rows * K * sizeof(floatX)); lab_poison(d.pb.astat, rows * K * sizeof(float));
        lab_poison(d.dgp, rows * sizeof(float)); lab_poison(d.dbp, rows * sizeof(float));
        cudaCheck(cudaMemset(d.dk, 0, rows * K * sizeof(float)));  // accumulated into (+=), as in the trainer
        cudaCheck(cudaMemset(d.dlas, 0, H * sizeof(float)));
        pc_forward(d, v);
        std::vector<floatX> kt_fwd = lab_download(d.kt, rows * K);
        if (v >= 7) { pc_remake(d, v); } // as the trainer's backward begins (v7-v10 need it)
        pc_backward(d, v);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        char tag[64], what[128];
        snprintf(tag, sizeof tag, "v%d K=%-3d", v, K);
        auto cmp = [&](const char* name, const std::vector<float>& hm, int X, const std::vector<double>& ref, double tol) {
            std::vector<float> g = gather_rows(hm, BH, T, h.Tp, X);
            snprintf(what, sizeof what, "%s %s", tag, name);
            lab_check(what, rel_l2(g.data(), ref.data(), g.size()), tol);
        };
        cmp("kt", lab_download_x(d.kt, rows * K), K, r.kt, TOL_KT);
        if (v <= 6 || v == 10) { cmp("astat", lab_download(d.pb.astat, rows * K), K, r.astat, TOL_F32); }
        if (v >= 7) { // the remake from the kept carries: the forward's k̃, bit for bit
            std::vector<floatX> kt_re = lab_download(d.kt, rows * K);
            long bad = 0;
            for (size_t i = 0; i < kt_re.size(); i++) { bad += memcmp(&kt_re[i], &kt_fwd[i], sizeof(floatX)) != 0; }
            snprintf(what, sizeof what, "%s kt remade = the forward's", tag);
            lab_check_exact(what, bad, (long)kt_re.size());
        }
        cmp("dk", lab_download(d.dk, rows * K), K, r.dk, TOL_F32);
        cmp("dgp", lab_download(d.dgp, rows), 1, r.dgp, TOL_F32);
        cmp("dbetap", lab_download(d.dbp, rows), 1, r.dbp, TOL_F32);
        std::vector<float> dl = lab_download(d.dlas, H);
        snprintf(what, sizeof what, "%s dlog_atk_scale", tag);
        lab_check(what, rel_l2(dl.data(), r.dlas.data(), H), TOL_F32);
    }
    d.ar.release();
}

static void bench(int version_sel) {
    struct Shape { int B, H, T, K; };
    const Shape shapes[2] = {{16, 8, 2048, 128}, {1, 8, 16384, 128}};
    printf("\n=== timing: precond_scan (%s); GB/s counts v6's traffic (fwd: k in, astat + kt out; bwd: dkt, k, astat in, "
           "dk in+out); remake: k̃ again in the trainer's backward (v1-v6: the forward again; v7-v10: pass 3 from the "
           "kept carries); layer = fwd + remake + bwd ===\n", PRECISION_NAME);
    printf("%-15s %3s %2s %6s %4s %10s %8s %10s %10s %8s %10s\n", "version", "B", "H", "T", "K", "fwd ms", "GB/s", "remake ms",
           "bwd ms", "GB/s", "layer ms");
    for (const Shape& sh : shapes) {
        int NC = sh.T / CHUNK;
        ChunkShape s{sh.B, sh.H, sh.T, sh.T, CHUNK, NC, sh.K, sh.K, 0, (long)sh.B * sh.H * NC, nullptr};
        PcDev d{};
        pc_alloc(d, s);
        long rows = s.nq * CHUNK, n = rows * sh.K;
        lab_fill(d.k, n, FILL_NORMAL, 0.0f, 1.0f, 21);
        lab_l2norm_rows(d.k, rows, sh.K, 1.0f);
        lab_fill(d.dkt, n, FILL_NORMAL, 0.0f, 1.0f, 22);
        lab_fill(d.gp, rows, FILL_NEG_SOFTPLUS, -2.0f, 1.5f, 23);
        lab_fill(d.bp, rows, FILL_SIGMOID, 0.0f, 1.0f, 24);
        lab_fill(d.las, sh.H, FILL_UNIFORM, -0.4f, 0.0f, 25);
        double fbytes = (double)n * (sizeof(floatX) * 2 + 4), bbytes = (double)n * (4 + sizeof(floatX) + 4 + 8);
        for (int v = 1; v <= NVERSIONS; v++) {
            if (version_sel && v != version_sel) { continue; }
            double tf = bench_ms([&] { pc_forward(d, v); });
            double tr = bench_ms([&] { pc_remake(d, v); });
            pc_forward(d, v); // the statistic (or the carries) for the backward
            if (v >= 7) { pc_remake(d, v); }
            double tb = bench_ms([&] { pc_backward(d, v); });
            printf("%-15s %3d %2d %6d %4d %10.3f %8.0f %10.3f %10.3f %8.0f %10.3f\n", VERSION_NAME[v], sh.B, sh.H, sh.T, sh.K,
                   tf, fbytes / tf / 1e6, tr, tb, bbytes / tb / 1e6, tf + tr + tb);
            fflush(stdout);
        }
        d.ar.release();
    }
    printf("\n");
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    if (a.validate) {
        printf("\n=== validation: precond_scan (%s) vs the CPU reference in double; B=2 H=3 T=200 chunk %d ===\n",
               PRECISION_NAME, CHUNK);
        uint64_t seed = 100;
        for (int K : {32, 64, 128}) { validate_case(a.version, K, seed++); }
    }
    if (a.bench) { bench(a.version); }
    return lab_finish("precond_scan");
}
#endif
