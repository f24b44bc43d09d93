/*
Kernel lab: the fused short convolution + SiLU (+ L2 norm over the head) of the mixer's q, k (norm) and v (no norm),
forward and backward, as train_pdn.cu runs it (conv_norm_forward / conv_norm_backward).
  forward:  pre[t] = Σ_k w[k] z[t-cs+1+k] (z before 0: the history, or zeros), stored as floatX;
            o = silu(pre) rounded to floatX; with norm out = scale o / sqrt(Σ_head o² + 1e-6) (rstd kept), else out = o
  backward: from dy (the gradient of out): dx = scale r dy - scale r³ o (dy·o) with norm, else dy;
            dpre = dx silu'(pre); dz[s] = Σ_k w[k] dpre[s+cs-1-k] (floatX); dw[k] += Σ_t dpre[t] z[t-cs+1+k]
Layouts as in the trainer: z, pre, dz token-major (B, T, H*D); out, dy head-major padded (B, H, Tp, D); rstd (B*T, H).

Versions:
  v1  the trainer's kernels until 2026-12-01: a warp per (b, h, 64-token range) walking its tokens one after the
      other with a register window (one token's loads in flight at a time)
  v2  the trainer's general kernels (conv_norm_*_tiles: any D <= 256): a block per (b, h, 64-token tile), the tile
      (and the cs-1 tokens around it) staged in shared memory with all loads in flight, tokens independent of each
      other; the weight gradient summed per tile in a fixed order (partials, then colsum_finish). ~100 instructions
      per element (per channel and tap a 2-byte shared load and the tap weight from shared memory): ~40% of the
      memory bandwidth at the 340m shape
  v3  v2's tiles, a thread per NV = 8 consecutive channels (16-byte accesses), the taps in registers, the kernel size
      a template parameter; the D/NV threads of one token are consecutive lanes and reduce the norm's sums by
      shuffles; weight gradient per thread, then lanes within the warp, then the 8 warps in a fixed order (the
      trainer's conv_norm_*_vec<8>). Fewer instructions but 126 registers in the backward: 2 blocks per SM, slower
      than v2 there (H200, 2026-12-01: fwd 0.160 vs 0.151 ms, bwd 0.369 vs 0.257)
  v4  v3 with NV = 4 (8-byte floatX, 16-byte fp32 accesses; <= 64 registers, 4 blocks per SM as the shared memory
      allows): fwd 0.112 ms, bwd 0.221 ms at the timing shape (H200, 2026-12-01). Needs D/NV a power of two <= 32
      and 16-byte aligned rows, else v2 runs (D = 36 and 256 below take that path). The backward reads pre.
  v5  the trainer's kernels: v4 (and v2 where v4 cannot run) with a backward that makes pre again from the staged z
      (the tile's rows and cs-1 more on each side, the forward's sum in its order, so bit for bit the same): pre is
      neither stored nor read (one (N, D) floatX tensor per call less: 4.5 GiB of pgdn-340m's 16 x 2048 step).
      H200, 2026-12-01: fwd 0.109 ms, bwd 0.203 ms (v4 0.114 / 0.197) at the timing shape.
  v6  the trainer's kernels: v5 with the vector kernels for any D/NV up to 32, not only powers of two (a token's lanes
      are D/NV rounded up to one; the extra lanes hold no channels and add zeros to the group sums), so the 1b
      KDA's D = 120 (30 of 32 lanes) leaves the v2 tiles (at that shape the tiles took fwd 0.155 / bwd 0.438 ms
      against v4's 0.114 / 0.197 at D = 128). The timing shape also runs at D = 120 (rows of 128).
  v7  streams (lab only): v6's lanes (4 channels each, D/4 up to 32), but each token group
      walks 32 consecutive tokens with the taps' rows in a register window instead of a block staging a 64-token tile
      in shared memory: every z row is loaded once (v6 reads it cs times from shared memory), no barrier, the next rows'
      loads in flight while the current ones are computed. The backward walks in reverse (dpre's window ahead of the
      token, z's behind it). pre, out, rstd and dz are v6's bit for bit (the same sums in the same order: checked
      here); dw's per-stream partials sum in another order.
  v8  v7 with 64 tokens a stream. Measured on an H100 (2026-12-07, results/conv_precond_2026-12-07_h100/), v6 / v7 /
      v8 in ms, D = 128: fwd 0.125 / 0.123 / 0.118, bwd 0.206 / 0.254 / 0.227; D = 120: fwd 0.117 / 0.122 / 0.121, bwd
      0.185 / 0.244 / 0.228. The forward gains what one load a row saves, the backward loses more: its windows take 128
      registers and spill (2 blocks of 8 warps an SM against v6's 4), and each step's loads wait on the step before.
      In the trainer, pgdn-340m 16 x 2048 lost 0.7% with v7 (119,823 / 119,925 against 120,934 / 120,466 tok/s).
Since 2026-12-07 (evening) every version's SiLU is the trainer's sigmoidf_ on the hardware approximations (__expf,
__fdividef) instead of the accurate expf and the IEEE division, and every version's backward but v1's divides by the
scale once a token. v6 on an H100
(results/sigmoid_2026-12-07_h100/), before / after in ms: D = 128 fwd 0.1250 / 0.1080, bwd 0.2060 / 0.1778; D = 120
fwd 0.1171 / 0.1056, bwd 0.1859 / 0.1600. The timings quoted above for v1-v8 are from before it.

CPU reference in double from the inputs as the device sees them (z, w, history rounded to floatX; pre and o rounded
to floatX where the device stores or rounds them).
Validation: B=2, H=3, T=200 (a partial last tile of 8 tokens), D = 16, 32, 36 (not a multiple of 8: the element-wise
staging path and the v2 fallback), 120 (the 1b KDA), 128, 256 (v3 at 32 lanes per token; v4 falls back to v2); cs = 4
and 2; head-major rows of D rounded up to a multiple of 16 (36 -> 48, 120 -> 128: the trainer's padded mixer rows;
v1 only where that is D); with and without the norm (q is scaled by 1/sqrt(D)); the forward also with a
history (generation); and with packed documents (--doc-mask 1: no tap reaches before its token's document, forward
and backward; not v1). Tolerances (relative L2): pre, out, dz are floatX: 1e-2 in bf16 (one rounding, rms ~1e-3;
the backward also starts from the rounded out), 1e-5 / 1e-4 in fp32; rstd 1e-3 in bf16 (from rounded o), 1e-5 in
fp32; dw (fp32 sums over B*T tokens of a gradient that carries bf16 inputs) 1e-2 in bf16, 1e-4 in fp32.
Timing: B=16, H=8, T=2048, D=128, cs=4, with norm (one of q, k at the 340m shape); GB/s counts the minimal traffic.

Build and run (from the repository root):
  make -C dev/cuda conv_norm conv_norm_fp32
  dev/cuda/conv_norm [1|2|3|4|5|6|7|8] [--no-bench]   (v7, v8 alone also run v6, the reference of their bit comparison)
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#define NVERSIONS 8
#ifdef ENABLE_FP32
static const double TOL_X = 1e-5, TOL_DX = 1e-4, TOL_RSTD = 1e-5, TOL_DW = 1e-4;
#else
static const double TOL_X = 1e-2, TOL_DX = 1e-2, TOL_RSTD = 1e-3, TOL_DW = 1e-2;
#endif
static const char* VERSION_NAME[9] = {"", "v1 token chain", "v2 smem tiles", "v3 8-channel thr", "v4 4-channel thr",
                                     "v5 pre made again", "v6 any lane count", "v7 streams of 32", "v8 streams of 64"};

// ----------------------------------------------------------------------------------------------------
// v1: the trainer's kernels until 2026-12-01 (4 warps per block, one 64-token range per warp)

template <int CONV_CPL_MAX>
__global__ void __launch_bounds__(128) conv_norm_forward_v1_kernel(floatX* pre, floatX* out, float* rstd, const floatX* z,
                                                                 const floatX* w, const floatX* hist, int B, int T, int H,
                                                                 int D, int cs, int Tp, int norm, float scale) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int cpl = lane < D % 32 ? D / 32 + 1 : D / 32; // channels of this lane: lane, lane + 32, ... below D
    int t0 = (blockIdx.y * 4 + warp) * CONV_TR;
    if (t0 >= T) { return; }
    int t1 = min(T, t0 + CONV_TR);
    float win[CONV_CPL_MAX][CONV_CS_MAX], wrev[CONV_CPL_MAX][CONV_CS_MAX];
    #pragma unroll
    for (int u = 0; u < CONV_CPL_MAX; u++) {
        int c = h * D + lane + 32 * u;
        #pragma unroll
        for (int j = 0; j < CONV_CS_MAX; j++) {
            wrev[u][j] = (u < cpl && j < cs) ? tof(w[(long)c * cs + cs - 1 - j]) : 0.0f;
            // before t0: win[j] = z[t0 - 1 - j] (history or zeros before the sequence); shifted once more below
            int src = t0 - 1 - j;
            float v = 0.0f;
            if (u < cpl && j < cs - 1) {
                if (src >= 0) { v = tof(z[((long)b * T + src) * Ch + c]); }
                else if (hist) { v = tof(hist[((long)b * (cs - 1) + (cs - 1 + src)) * Ch + c]); }
            }
            win[u][j] = v;
        }
    }
    for (int t = t0; t < t1; t++) {
        float o[CONV_CPL_MAX], ss = 0.0f;
        #pragma unroll
        for (int u = 0; u < CONV_CPL_MAX; u++) {
            o[u] = 0.0f;
            if (u >= cpl) { continue; }
            long it = ((long)b * T + t) * Ch + h * D + lane + 32 * u;
            #pragma unroll
            for (int j = CONV_CS_MAX - 1; j > 0; j--) { win[u][j] = win[u][j - 1]; }
            win[u][0] = tof(z[it]);
            float acc = 0.0f;
            #pragma unroll
            for (int j = 0; j < CONV_CS_MAX; j++) { acc += wrev[u][j] * win[u][j]; }
            floatX px = fromf<floatX>(acc);
            pre[it] = px;
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
        long ob = (((long)b * H + h) * Tp + t) * D;
        #pragma unroll
        for (int u = 0; u < CONV_CPL_MAX; u++) {
            if (u < cpl) { out[ob + lane + 32 * u] = fromf<floatX>(norm ? o[u] * r * scale : o[u]); }
        }
    }
}

// Backward of the above, in reverse time: dy (head-major fp32, the gradient of out) -> with norm, the L2 norm's
// backward dx = rstd (scale dy - out (dy·out) / scale); then dpre = dx silu'(pre); dz[s] = Σ_j wrev[j] dpre[s + j]
// (token-major floatX, for the projection's backward); and the weight gradient dw[k] = Σ_t dpre[t] z[t - cs+1 + k]
// as partial sums per (b, range): partial (B * ranges, Ch * cs). The cs-1 tokens after the range are a recomputed halo.
// Windows (register arrays, compile-time indices): dwin[j] = dpre[t + j], zwin[j] = z[t - j]; the next (earlier)
// token's operands are loaded before the current one is used, so memory latency overlaps the arithmetic.
template <int CONV_CPL_MAX>
__global__ void __launch_bounds__(128) conv_norm_backward_v1_kernel(floatX* __restrict__ dz, float* __restrict__ partial,
                                                                  const float* __restrict__ dy, const floatX* __restrict__ out,
                                                                  const float* __restrict__ rstd, const floatX* __restrict__ pre,
                                                                  const floatX* __restrict__ z, const floatX* __restrict__ w,
                                                                  int B, int T, int H, int D, int cs, int Tp, int norm,
                                                                  float scale, int nranges) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int bh = blockIdx.x, b = bh / H, h = bh % H, Ch = H * D;
    int cpl = lane < D % 32 ? D / 32 + 1 : D / 32; // channels of this lane: lane, lane + 32, ... below D
    int range = blockIdx.y * 4 + warp, t0 = range * CONV_TR;
    if (t0 >= T) { return; }
    int t1 = min(T, t0 + CONV_TR), thi = min(T, t1 + cs - 1);
    float dwin[CONV_CPL_MAX][CONV_CS_MAX], zwin[CONV_CPL_MAX][CONV_CS_MAX], wrev[CONV_CPL_MAX][CONV_CS_MAX];
    float dwr[CONV_CPL_MAX][CONV_CS_MAX]; // dwr[j] accumulates dw[cs - 1 - j] = Σ dpre[t] z[t - j]
    #pragma unroll
    for (int u = 0; u < CONV_CPL_MAX; u++) {
        int c = h * D + lane + 32 * u;
        #pragma unroll
        for (int j = 0; j < CONV_CS_MAX; j++) {
            dwin[u][j] = 0.0f;
            dwr[u][j] = 0.0f;
            wrev[u][j] = (u < cpl && j < cs) ? tof(w[(long)c * cs + cs - 1 - j]) : 0.0f;
            // z window for the first in-range token t1 - 1 (halo tokens do not need z)
            int src = t1 - 1 - j;
            zwin[u][j] = (u < cpl && j < cs && src >= 0) ? tof(z[((long)b * T + src) * Ch + c]) : 0.0f;
        }
    }
    float ndy[CONV_CPL_MAX], nout[CONV_CPL_MAX], npre[CONV_CPL_MAX], nr = 1.0f;
    // load token TT's operands into the n* registers (a macro, not a lambda: the arrays must stay in registers)
#define CONV_V1_LOAD(TT) do { \
        long ob_ = (((long)b * H + h) * Tp + (TT)) * D, tb_ = ((long)b * T + (TT)) * Ch + h * D + lane; \
        _Pragma("unroll") for (int u = 0; u < CONV_CPL_MAX; u++) { \
            ndy[u] = u < cpl ? dy[ob_ + lane + 32 * u] : 0.0f; \
            nout[u] = (norm && u < cpl) ? tof(out[ob_ + lane + 32 * u]) : 0.0f; \
            npre[u] = u < cpl ? tof(pre[tb_ + 32 * u]) : 0.0f; \
        } \
        if (norm) { nr = rstd[((long)b * T + (TT)) * H + h]; } \
    } while (0)
    CONV_V1_LOAD(thi - 1);
    for (int t = thi - 1; t >= t0; t--) {
        float dyv[CONV_CPL_MAX], ov[CONV_CPL_MAX], pv[CONV_CPL_MAX], r = nr, dot = 0.0f;
        #pragma unroll
        for (int u = 0; u < CONV_CPL_MAX; u++) { dyv[u] = ndy[u]; ov[u] = nout[u]; pv[u] = npre[u]; dot += dyv[u] * ov[u]; }
        if (t > t0) { CONV_V1_LOAD(t - 1); }
        if (norm) { dot = warp_sum(dot); }
        long tb = ((long)b * T + t) * Ch + h * D + lane;
        int src = t - cs; // the z entering the window when it slides one token earlier
        #pragma unroll
        for (int u = 0; u < CONV_CPL_MAX; u++) {
            float dx = norm ? r * (scale * dyv[u] - ov[u] * dot / scale) : dyv[u];
            float sg = sigmoidf_(pv[u]);
            float dp = u < cpl ? dx * sg * (1.0f + pv[u] * (1.0f - sg)) : 0.0f;
            #pragma unroll
            for (int j = CONV_CS_MAX - 1; j > 0; j--) { dwin[u][j] = dwin[u][j - 1]; }
            dwin[u][0] = dp;
            if (t < t1) {
                float acc = 0.0f;
                #pragma unroll
                for (int j = 0; j < CONV_CS_MAX; j++) { acc += wrev[u][j] * dwin[u][j]; dwr[u][j] += dp * zwin[u][j]; }
                if (u < cpl) { dz[tb + 32 * u] = fromf<floatX>(acc); }
                float znew = (u < cpl && src >= 0) ? tof(z[((long)b * T + src) * Ch + h * D + lane + 32 * u]) : 0.0f;
                #pragma unroll
                for (int j = 0; j < CONV_CS_MAX; j++) { zwin[u][j] = j + 1 < cs ? zwin[u][j + 1 < CONV_CS_MAX ? j + 1 : j] : (j + 1 == cs ? znew : 0.0f); }
            }
        }
    }
    long prow = (long)b * nranges + range;
    #pragma unroll
    for (int u = 0; u < CONV_CPL_MAX; u++) {
        int c = h * D + lane + 32 * u;
        #pragma unroll
        for (int j = 0; j < CONV_CS_MAX; j++) {
            if (u < cpl && j < cs) { partial[prow * Ch * cs + (long)c * cs + cs - 1 - j] = dwr[u][j]; }
        }
    }
}

static void conv_norm_forward_v1(floatX* pre, floatX* out, float* rstd, const floatX* z, const floatX* w, const floatX* hist,
                              int B, int T, int H, int D, int cs, int Tp, int norm, float scale) {
    dim3 grid(B * H, cdiv(cdiv(T, CONV_TR), 4));
    int c = cdiv(D, 32);
    if (c <= 1) { conv_norm_forward_v1_kernel<1><<<grid, 128, 0, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, cs, Tp, norm, scale); }
    else if (c <= 2) { conv_norm_forward_v1_kernel<2><<<grid, 128, 0, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, cs, Tp, norm, scale); }
    else if (c <= 4) { conv_norm_forward_v1_kernel<4><<<grid, 128, 0, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, cs, Tp, norm, scale); }
    else { conv_norm_forward_v1_kernel<8><<<grid, 128, 0, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, cs, Tp, norm, scale); }
    cudaCheck(cudaGetLastError());
}

// dz (token-major floatX) and dw += from dy (head-major fp32)
static void conv_norm_backward_v1(floatX* dz, float* dw, const float* dy, const floatX* out, const float* rstd, const floatX* pre,
                               const floatX* z, const floatX* w, int B, int T, int H, int D, int cs, int Tp, int norm, float scale) {
    int nranges = cdiv(T, CONV_TR), nch = B * nranges, Ch = H * D;
    float* partial = colsum_partials(nch, Ch * cs);
    dim3 grid(B * H, cdiv(nranges, 4));
    int c = cdiv(D, 32);
    if (c <= 1) { conv_norm_backward_v1_kernel<1><<<grid, 128, 0, main_stream>>>(dz, partial, dy, out, rstd, pre, z, w, B, T, H, D, cs, Tp, norm, scale, nranges); }
    else if (c <= 2) { conv_norm_backward_v1_kernel<2><<<grid, 128, 0, main_stream>>>(dz, partial, dy, out, rstd, pre, z, w, B, T, H, D, cs, Tp, norm, scale, nranges); }
    else if (c <= 4) { conv_norm_backward_v1_kernel<4><<<grid, 128, 0, main_stream>>>(dz, partial, dy, out, rstd, pre, z, w, B, T, H, D, cs, Tp, norm, scale, nranges); }
    else { conv_norm_backward_v1_kernel<8><<<grid, 128, 0, main_stream>>>(dz, partial, dy, out, rstd, pre, z, w, B, T, H, D, cs, Tp, norm, scale, nranges); }
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, Ch * cs);
}


// ----------------------------------------------------------------------------------------------------
// v7 (TOK = 32) and v8 (TOK = 64): streams. A token group's D/NV lanes (NV = 4 channels a lane, as v4) walk TOK
// consecutive tokens one after another with the taps' rows in a register window: each z row is loaded once per
// stream (v4-v6 load every row CS times from shared memory), no shared memory, no barrier, and the next U rows'
// loads are issued before the current U rows are computed. The forward's sums run in v6's order (bit for bit the
// same pre, out, rstd); the backward walks its tokens in reverse (dpre's window ahead, z's behind), its dz in v6's
// order (bit for bit), its tap sums per stream (one partial row per TOK tokens: another order than v6's, same values
// to rounding).
#define CV7_U 4  // the forward's rows loaded ahead
#define CV7_UB 2 // the backward's: its windows take more registers (at 2 still 40-88 bytes spilled under 128 registers)

template <int CS, int NV, bool DOC, int TOK>
__global__ void __launch_bounds__(256) conv_norm_forward_stream_kernel(floatX* pre, floatX* out, float* rstd, const floatX* z,
                                                                      const floatX* w, const floatX* hist, int B, int T, int H,
                                                                      int D, int Dp, int Tp, int norm, float scale,
                                                                      const unsigned char* dlen) {
    if (!DOC) { dlen = nullptr; }
    int ng = conv_lanes(D, NV), g = threadIdx.x % ng, c0 = NV * g, Ch = H * D, ntile = (T + TOK - 1) / TOK;
    long sid = (long)blockIdx.x * (blockDim.x / ng) + threadIdx.x / ng; // (b, h, tile)
    bool act = c0 < D && sid < (long)B * H * ntile;                     // lanes past D and streams past the end: shuffles only
    int tile = (int)(sid % ntile), bh = (int)(sid / ntile), b = bh / H, h = bh % H;
    if (!act) { b = 0; h = 0; }
    int ts = tile * TOK;
    float wr[NV][CS], zw[CS][NV]; // zw[i]: z[t - CS + 1 + i] (zero before 0 without history)
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int k = 0; k < CS; k++) { wr[u][k] = act ? tof(w[((long)h * D + c0 + u) * CS + k]) : 0.0f; }
    }
    #pragma unroll
    for (int u = 0; u < NV; u++) { zw[0][u] = 0.0f; }
    #pragma unroll
    for (int i = 0; i < CS - 1; i++) { // the rows before the first token: z, the history or zeros
        int t = ts - CS + 1 + i;       // (shifted to zw[i] when the first token's row comes in)
        const floatX* src = nullptr;
        if (act && t >= 0 && t < T) { src = z + ((long)b * T + t) * Ch + h * D + c0; }
        else if (act && t < 0 && hist) { src = hist + ((long)b * (CS - 1) + (CS - 1 + t)) * Ch + h * D + c0; }
        #pragma unroll
        for (int u = 0; u < NV; u++) { zw[i + 1][u] = 0.0f; }
        if (src) { ldvx<NV>(zw[i + 1], src); }
    }
    const floatX* zrow = z + ((long)b * T + ts) * Ch + h * D + c0;
    XV<NV> nx[CV7_U];
    #pragma unroll
    for (int q = 0; q < CV7_U; q++) { if (act && ts + q < T) { nx[q] = *(const XV<NV>*)(zrow + (long)q * Ch); } }
    for (int k0 = 0; k0 < TOK; k0 += CV7_U) {
        XV<NV> cur[CV7_U];
        #pragma unroll
        for (int q = 0; q < CV7_U; q++) { cur[q] = nx[q]; }
        #pragma unroll
        for (int q = 0; q < CV7_U; q++) { // the next rows' loads in flight while these are computed
            int t = ts + k0 + CV7_U + q;
            if (act && k0 + CV7_U < TOK && t < T) { nx[q] = *(const XV<NV>*)(zrow + (long)(k0 + CV7_U + q) * Ch); }
        }
        float o[CV7_U][NV], ss[CV7_U];
        XV<NV> px[CV7_U];
        #pragma unroll
        for (int q = 0; q < CV7_U; q++) {
            int t = ts + k0 + q;
            bool ok = act && t < T;
            #pragma unroll
            for (int i = 0; i < CS - 1; i++) {
                #pragma unroll
                for (int u = 0; u < NV; u++) { zw[i][u] = zw[i + 1][u]; }
            }
            #pragma unroll
            for (int u = 0; u < NV; u++) { zw[CS - 1][u] = ok ? tof(cur[q].v[u]) : 0.0f; }
            float acc[NV];
            #pragma unroll
            for (int u = 0; u < NV; u++) { acc[u] = 0.0f; }
            int reach = dlen && ok ? dlen[(long)b * T + t] : CS; // documents: taps j <= reach only
            #pragma unroll
            for (int j = 0; j < CS; j++) { // v2's order: z[t - j] with w[CS - 1 - j]
                if (j > reach) { break; }
                #pragma unroll
                for (int u = 0; u < NV; u++) { acc[u] += wr[u][CS - 1 - j] * zw[CS - 1 - j][u]; }
            }
            ss[q] = 0.0f;
            #pragma unroll
            for (int u = 0; u < NV; u++) {
                px[q].v[u] = fromf<floatX>(acc[u]);
                float p = tof(px[q].v[u]);
                o[q][u] = tof(fromf<floatX>(p * sigmoidf_(p)));
                ss[q] += o[q][u] * o[q][u];
            }
        }
        #pragma unroll
        for (int q = 0; q < CV7_U; q++) {
            int t = ts + k0 + q;
            float r = 1.0f;
            if (norm) { r = rsqrtf(group_sum(ss[q], ng) + L2NORM_EPS_F); }
            if (!act || t >= T) { continue; }
            if (pre) { *(XV<NV>*)(pre + ((long)b * T + t) * Ch + h * D + c0) = px[q]; }
            if (norm && g == 0) { rstd[((long)b * T + t) * H + h] = r; }
            XV<NV> ov;
            #pragma unroll
            for (int u = 0; u < NV; u++) { ov.v[u] = fromf<floatX>(norm ? o[q][u] * r * scale : o[q][u]); }
            *(XV<NV>*)(out + (((long)b * H + h) * Tp + t) * Dp + c0) = ov;
        }
    }
}

// Backward: tokens te + CS - 2 down to ts (te = min(ts + TOK, T)); dpw[j] = dpre[t + j], zw[i] = z[t - CS + 1 + i]
template <int CS, int NV, bool DOC, int TOK>
__global__ void __launch_bounds__(256, 2) conv_norm_backward_stream_kernel(floatX* __restrict__ dz, int ldz, float* __restrict__ partial,
                                                                       const float* __restrict__ dy, const floatX* __restrict__ out,
                                                                       const float* __restrict__ rstd, const floatX* __restrict__ z,
                                                                       const floatX* __restrict__ w, int B, int T, int H, int D,
                                                                       int Dp, int Tp, int norm, float scale,
                                                                       const unsigned char* dlen) {
    if (!DOC) { dlen = nullptr; }
    int ng = conv_lanes(D, NV), g = threadIdx.x % ng, c0 = NV * g, Ch = H * D, ntile = (T + TOK - 1) / TOK;
    long sid = (long)blockIdx.x * (blockDim.x / ng) + threadIdx.x / ng;
    bool act = c0 < D && sid < (long)B * H * ntile;
    int tile = (int)(sid % ntile), bh = (int)(sid / ntile), b = bh / H, h = bh % H;
    if (!act) { b = 0; h = 0; }
    int ts = tile * TOK, te = min(T, ts + TOK), tl = min(T - 1, te + CS - 2); // the walk: tl down to ts
    float wr[NV][CS], zw[CS][NV], dpw[CS][NV], dwr[NV][CS];
    int rw[CS]; // rw[j]: the reach of token t + j (documents)
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int k = 0; k < CS; k++) { wr[u][k] = act ? tof(w[((long)h * D + c0 + u) * CS + k]) : 0.0f; dwr[u][k] = 0.0f; }
    }
    #pragma unroll
    for (int j = 0; j < CS; j++) {
        rw[j] = -1;
        #pragma unroll
        for (int u = 0; u < NV; u++) { dpw[j][u] = 0.0f; }
    }
    const floatX* zb = z + (long)b * T * Ch + h * D + c0;
    #pragma unroll
    for (int i = 0; i < CS; i++) { // the window of token tl + 1: z[tl - CS + 2 + i] (its last row is never read)
        int t = tl - CS + 2 + i;
        #pragma unroll
        for (int u = 0; u < NV; u++) { zw[i][u] = 0.0f; }
        if (act && i < CS - 1 && t >= 0) { ldvx<NV>(zw[i], zb + t * Ch); }
    }
    // the stream's rows by 32-bit offsets from its own pointers
    const float* dyb = dy + ((long)b * H + h) * Tp * Dp + c0;
    const floatX* outb = out + ((long)b * H + h) * Tp * Dp + c0;
    const float* rb = rstd ? rstd + (long)b * T * H + h : nullptr;
    floatX* dzb = dz + (long)b * T * ldz + h * D + c0;
    const unsigned char* dl = dlen ? dlen + (long)b * T : nullptr;
    int nsteps = TOK + CS - 1; // the same count for every stream (the shuffles); steps past the walk do nothing
    for (int k0 = 0; k0 < nsteps; k0 += CV7_UB) {
        float dyv[CV7_UB][NV], rr[CV7_UB];
        XV<NV> xo[CV7_UB], xz[CV7_UB];
        #pragma unroll
        for (int q = 0; q < CV7_UB; q++) { // this group's rows, all loads in flight
            int t = tl - k0 - q;
            bool ok = act && k0 + q < nsteps && t >= ts;
            #pragma unroll
            for (int u = 0; u < NV; u++) { dyv[q][u] = 0.0f; }
            if (ok) {
                ldvf<NV>(dyv[q], dyb + t * Dp);
                xo[q] = *(const XV<NV>*)(outb + t * Dp);
                rr[q] = norm ? rb[t * H] : 1.0f;
            }
            if (ok && t - CS + 1 >= 0) { xz[q] = *(const XV<NV>*)(zb + (t - CS + 1) * Ch); }
        }
        #pragma unroll
        for (int q = 0; q < CV7_UB; q++) {
            int t = tl - k0 - q;
            bool ok = act && k0 + q < nsteps && t >= ts;
            // the window: z[t - CS + 1] in, dpre[t] (below) in
            #pragma unroll
            for (int i = CS - 1; i > 0; i--) {
                #pragma unroll
                for (int u = 0; u < NV; u++) { zw[i][u] = zw[i - 1][u]; }
            }
            #pragma unroll
            for (int u = 0; u < NV; u++) { zw[0][u] = ok && t - CS + 1 >= 0 ? tof(xz[q].v[u]) : 0.0f; }
            // zw now holds z[t - CS + 1 .. t]
            float pv[NV], ov[NV], dot = 0.0f;
            int reach = dl && ok ? dl[t] : CS;
            float acc[NV];
            #pragma unroll
            for (int u = 0; u < NV; u++) { acc[u] = 0.0f; }
            #pragma unroll
            for (int j = 0; j < CS; j++) { // the forward's sum, in its order
                if (j > reach) { break; }
                #pragma unroll
                for (int u = 0; u < NV; u++) { acc[u] += wr[u][CS - 1 - j] * zw[CS - 1 - j][u]; }
            }
            #pragma unroll
            for (int u = 0; u < NV; u++) {
                pv[u] = tof(fromf<floatX>(acc[u]));
                ov[u] = norm && ok ? tof(xo[q].v[u]) : 0.0f;
                dot += dyv[q][u] * ov[u];
            }
            if (norm) { dot = group_sum(dot, ng); }
            if (!ok) { continue; }
            float dp[NV], ds = dot / scale; // v6's expression
            #pragma unroll
            for (int u = 0; u < NV; u++) {
                float dx = norm ? rr[q] * (scale * dyv[q][u] - ov[u] * ds) : dyv[q][u];
                float sg = sigmoidf_(pv[u]);
                dp[u] = dx * sg * (1.0f + pv[u] * (1.0f - sg));
            }
            #pragma unroll
            for (int j = CS - 1; j > 0; j--) {
                rw[j] = rw[j - 1];
                #pragma unroll
                for (int u = 0; u < NV; u++) { dpw[j][u] = dpw[j - 1][u]; }
            }
            rw[0] = reach;
            #pragma unroll
            for (int u = 0; u < NV; u++) { dpw[0][u] = dp[u]; }
            if (t >= te) { continue; } // the tokens after the tile: their dpre only
            float a2[NV];
            #pragma unroll
            for (int u = 0; u < NV; u++) { a2[u] = 0.0f; }
            #pragma unroll
            for (int j = 0; j < CS; j++) {
                // documents: token t + j reads t through tap j, and token t reads t - j, only inside their documents
                bool in_next = !dl || (t + j < T && j <= rw[j]), in_this = j <= reach;
                #pragma unroll
                for (int u = 0; u < NV; u++) {
                    if (in_next) { a2[u] += wr[u][CS - 1 - j] * dpw[j][u]; }
                    if (in_this) { dwr[u][j] += dp[u] * zw[CS - 1 - j][u]; }
                }
            }
            XV<NV> xd;
            #pragma unroll
            for (int u = 0; u < NV; u++) { xd.v[u] = fromf<floatX>(a2[u]); }
            *(XV<NV>*)(dzb + t * ldz) = xd;
        }
    }
    if (!act) { return; }
    float* prow = partial + ((long)b * ntile + tile) * Ch * CS + (long)(h * D + c0) * CS;
    #pragma unroll
    for (int u = 0; u < NV; u++) {
        #pragma unroll
        for (int j = 0; j < CS; j++) { prow[u * CS + CS - 1 - j] = dwr[u][j]; }
    }
}

template <int TOK, bool DOC> static decltype(&conv_norm_forward_stream_kernel<4, 4, DOC, TOK>) cv_stream_fwd_kernel(int cs) {
    return cs == 1 ? conv_norm_forward_stream_kernel<1, 4, DOC, TOK> : cs == 2 ? conv_norm_forward_stream_kernel<2, 4, DOC, TOK>
         : cs == 3 ? conv_norm_forward_stream_kernel<3, 4, DOC, TOK> : conv_norm_forward_stream_kernel<4, 4, DOC, TOK>;
}
template <int TOK, bool DOC> static decltype(&conv_norm_backward_stream_kernel<4, 4, DOC, TOK>) cv_stream_bwd_kernel(int cs) {
    return cs == 1 ? conv_norm_backward_stream_kernel<1, 4, DOC, TOK> : cs == 2 ? conv_norm_backward_stream_kernel<2, 4, DOC, TOK>
         : cs == 3 ? conv_norm_backward_stream_kernel<3, 4, DOC, TOK> : conv_norm_backward_stream_kernel<4, 4, DOC, TOK>;
}
// the stream kernels where the vector kernels' conditions hold (else false: the caller runs the tiles)
template <int TOK>
static bool conv_norm_forward_stream(floatX* pre, floatX* out, float* rstd, const floatX* z, const floatX* w, const floatX* hist,
                                     int B, int T, int H, int D, int Dp, int cs, int Tp, int norm, float scale,
                                     const unsigned char* dlen) {
    if (!conv_vec_ok<4>(H, D, cs, {pre, out, z, hist})) { return false; }
    long streams = (long)B * H * cdiv(T, TOK);
    int per = 256 / conv_lanes(D, 4);
    auto kernel = dlen ? cv_stream_fwd_kernel<TOK, true>(cs) : cv_stream_fwd_kernel<TOK, false>(cs);
    kernel<<<(unsigned)cdiv(streams, per), 256, 0, main_stream>>>(pre, out, rstd, z, w, hist, B, T, H, D, Dp, Tp, norm, scale, dlen);
    cudaCheck(cudaGetLastError());
    return true;
}
template <int TOK>
static bool conv_norm_backward_stream(floatX* dz, int ldz, float* dw, const float* dy, const floatX* out, const float* rstd,
                                      const floatX* pre, const floatX* z, const floatX* w, int B, int T, int H, int D, int Dp,
                                      int cs, int Tp, int norm, float scale, const unsigned char* dlen) {
    if (pre || !conv_vec_ok<4>(H, D, cs, {dz, dy, out, z}) || ldz % 8 != 0) { return false; }
    int ntile = cdiv(T, TOK), nch = B * ntile, Ch = H * D;
    float* partial = colsum_partials(nch, Ch * cs);
    long streams = (long)B * H * ntile;
    int per = 256 / conv_lanes(D, 4);
    auto kernel = dlen ? cv_stream_bwd_kernel<TOK, true>(cs) : cv_stream_bwd_kernel<TOK, false>(cs);
    kernel<<<(unsigned)cdiv(streams, per), 256, 0, main_stream>>>(dz, ldz, partial, dy, out, rstd, z, w, B, T, H, D, Dp, Tp, norm,
                                                                 scale, dlen);
    cudaCheck(cudaGetLastError());
    colsum_finish(dw, nch, Ch * cs);
    return true;
}

// ----------------------------------------------------------------------------------------------------

struct CvShape { int B, T, H, D, cs, Tp, Dp; }; // Dp: the head-major row width (the trainer pads the mixer's heads)
struct CvDev { floatX *z, *w, *hist, *pre, *out, *dz; float *rstd, *dy, *dw; };

static void cv_alloc(CvDev& d, const CvShape& s) {
    size_t n = (size_t)s.B * s.T * s.H * s.D, nh = (size_t)s.B * s.H * s.Tp * s.Dp, Ch = (size_t)s.H * s.D;
    cudaCheck(cudaMalloc(&d.z, n * sizeof(floatX))); cudaCheck(cudaMalloc(&d.w, Ch * s.cs * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.hist, (size_t)s.B * (s.cs - 1 + 1) * Ch * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.pre, n * sizeof(floatX))); cudaCheck(cudaMalloc(&d.out, nh * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d.dz, n * sizeof(floatX))); cudaCheck(cudaMalloc(&d.rstd, (size_t)s.B * s.T * s.H * sizeof(float)));
    cudaCheck(cudaMalloc(&d.dy, nh * sizeof(float))); cudaCheck(cudaMalloc(&d.dw, Ch * s.cs * sizeof(float)));
}
static void cv_free(CvDev& d) {
    cudaCheck(cudaFree(d.z)); cudaCheck(cudaFree(d.w)); cudaCheck(cudaFree(d.hist)); cudaCheck(cudaFree(d.pre));
    cudaCheck(cudaFree(d.out)); cudaCheck(cudaFree(d.dz)); cudaCheck(cudaFree(d.rstd)); cudaCheck(cudaFree(d.dy));
    cudaCheck(cudaFree(d.dw));
}
// v4 and v5 ran the vector kernels only where D/4 is a power of two (else the v2 tiles); v6 is the trainer's dispatch
static bool cv_pow2_lanes(int D) { return D % 4 == 0 && conv_lanes(D, 4) == D / 4; }
// dlen: packed documents (the trainer's conv reach, doc_chunk_rel), or null; v1 takes none
// store_pre: the validation checks pre; the timing of v5-v8 runs as the trainer does, without it
static void cv_forward(CvDev& d, int v, const CvShape& s, int norm, float scale, int hist, const unsigned char* dlen = nullptr,
                       bool store_pre = true) {
    const floatX* h = hist ? d.hist : nullptr;
    float* r = norm ? d.rstd : nullptr;
    floatX* pre = store_pre ? d.pre : nullptr;
    bool vec = v == 3 || ((v == 4 || v == 5) && cv_pow2_lanes(s.D));
    if (v == 7 || v == 8) {
        bool ran = v == 7 ? conv_norm_forward_stream<32>(pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen)
                          : conv_norm_forward_stream<64>(pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen);
        if (!ran) { conv_norm_forward_tiles(pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen); }
    } else if (v == 1) { conv_norm_forward_v1(d.pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.cs, s.Tp, norm, scale); }
    else if (v == 6) { conv_norm_forward(pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen); }
    else if (!vec || !(v == 3 ? conv_norm_forward_vec<8>(d.pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen)
                              : conv_norm_forward_vec<4>(d.pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen))) {
        conv_norm_forward_tiles(d.pre, d.out, r, d.z, d.w, h, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen);
    }
}
static void cv_backward(CvDev& d, int v, const CvShape& s, int norm, float scale, const unsigned char* dlen = nullptr) {
    const float* r = norm ? d.rstd : nullptr;
    const floatX* pre = v >= 5 ? nullptr : d.pre; // v5-v8: pre made again from z
    int ld = s.H * s.D;
    bool vec = v == 3 || ((v == 4 || v == 5) && cv_pow2_lanes(s.D));
    if (v == 7 || v == 8) {
        bool ran = v == 7 ? conv_norm_backward_stream<32>(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen)
                          : conv_norm_backward_stream<64>(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen);
        if (!ran) { conv_norm_backward_tiles(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen); }
    } else if (v == 1) { conv_norm_backward_v1(d.dz, d.dw, d.dy, d.out, r, d.pre, d.z, d.w, s.B, s.T, s.H, s.D, s.cs, s.Tp, norm, scale); }
    else if (v == 6) { conv_norm_backward(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen); }
    else if (!vec || !(v == 3 ? conv_norm_backward_vec<8>(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen)
                              : conv_norm_backward_vec<4>(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen))) {
        conv_norm_backward_tiles(d.dz, ld, d.dw, d.dy, d.out, r, pre, d.z, d.w, s.B, s.T, s.H, s.D, s.Dp, s.cs, s.Tp, norm, scale, dlen);
    }
}

// docs: packed documents (--doc-mask 1), starting every 7 tokens in row 0 and at 1, 2, 3, 64, 65, 150 in row 1 (one-token
// documents, and boundaries inside a tile and at its first row): no tap reaches before its token's document
static void validate_case(int version_sel, const CvShape& s, int norm, int hist, uint64_t seed, int docs = 0) {
    int B = s.B, T = s.T, H = s.H, D = s.D, cs = s.cs, Tp = s.Tp, Dp = s.Dp, Ch = H * D;
    std::vector<int> doc((size_t)B * T, 0);
    for (int b = 0; docs && b < B; b++) {
        for (int t = 1; t < T; t++) {
            bool start = b % 2 == 0 ? t % 7 == 0 : (t <= 3 || t == 64 || t == 65 || t == 150);
            doc[(size_t)b * T + t] = start ? t : doc[(size_t)b * T + t - 1];
        }
    }
    float scale = norm ? 1.0f / sqrtf((float)D) : 1.0f;
    size_t n = (size_t)B * T * Ch, nh = (size_t)B * H * Tp * Dp, nw = (size_t)Ch * cs, nhist = (size_t)B * (cs - 1) * Ch;
    LabRng rng(seed);
    std::vector<float> z(n), w(nw), hs(nhist), dy(nh, 0.0f), dw0(nw);
    for (auto& x : z) { x = lab_round((float)rng.normal()); }
    for (auto& x : w) { x = lab_round((float)(0.5 * rng.normal())); }
    for (auto& x : hs) { x = lab_round((float)rng.normal()); }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < D; j++) { dy[(((size_t)b * H + h) * Tp + t) * Dp + j] = (float)rng.normal(); }
            }
        }
    }
    for (auto& x : dw0) { x = (float)rng.normal(); }
    // reference forward
    auto zat = [&](int b, int t, int c) -> double {
        if (t >= 0) { return z[((size_t)b * T + t) * Ch + c]; }
        return hist ? hs[((size_t)b * (cs - 1) + (cs - 1 + t)) * Ch + c] : 0.0;
    };
    std::vector<float> pre(n), o(n);
    std::vector<double> out(n), rstd((size_t)B * T * H, 1.0);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int c = 0; c < Ch; c++) {
                double p = 0.0;
                for (int k = 0; k < cs; k++) {
                    if (docs && t - cs + 1 + k < doc[(size_t)b * T + t]) { continue; } // (history taps are negative)
                    p += (double)w[(size_t)c * cs + k] * zat(b, t - cs + 1 + k, c);
                }
                size_t i = ((size_t)b * T + t) * Ch + c;
                pre[i] = lab_round((float)p);
                o[i] = lab_round((float)(pre[i] * lab_sigmoid(pre[i])));
            }
            for (int h = 0; h < H; h++) {
                size_t i0 = ((size_t)b * T + t) * Ch + (size_t)h * D;
                double ss = 0.0, r = 1.0;
                for (int j = 0; j < D; j++) { ss += (double)o[i0 + j] * o[i0 + j]; }
                if (norm) { r = 1.0 / sqrt(ss + (double)L2NORM_EPS_F); rstd[((size_t)b * T + t) * H + h] = r; }
                for (int j = 0; j < D; j++) { out[i0 + j] = norm ? o[i0 + j] * r * scale : o[i0 + j]; }
            }
        }
    }
    // reference backward (no history: the trainer's backward is for training only)
    std::vector<double> dpre(n), dz(n, 0.0), dw(nw);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                size_t i0 = ((size_t)b * T + t) * Ch + (size_t)h * D, d0 = (((size_t)b * H + h) * Tp + t) * Dp;
                double dot = 0.0, r = rstd[((size_t)b * T + t) * H + h];
                for (int j = 0; j < D; j++) { dot += (double)dy[d0 + j] * o[i0 + j]; }
                for (int j = 0; j < D; j++) {
                    double dx = norm ? scale * r * dy[d0 + j] - scale * r * r * r * o[i0 + j] * dot : dy[d0 + j];
                    double p = pre[i0 + j], sg = lab_sigmoid(p);
                    dpre[i0 + j] = dx * sg * (1.0 + p * (1.0 - sg));
                }
            }
        }
    }
    for (size_t i = 0; i < nw; i++) { dw[i] = dw0[i]; }
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int c = 0; c < Ch; c++) {
                double g = dpre[((size_t)b * T + t) * Ch + c];
                for (int k = 0; k < cs; k++) {
                    int src = t - cs + 1 + k;
                    if (src < 0 || src < doc[(size_t)b * T + t]) { continue; }
                    dz[((size_t)b * T + src) * Ch + c] += w[(size_t)c * cs + k] * g;
                    dw[(size_t)c * cs + k] += g * z[((size_t)b * T + src) * Ch + c];
                }
            }
        }
    }
    // device
    CvDev d;
    cv_alloc(d, s);
    std::vector<floatX> zx(n), wx(nw), hx(nhist);
    for (size_t i = 0; i < n; i++) { zx[i] = lab_f2x(z[i]); }
    for (size_t i = 0; i < nw; i++) { wx[i] = lab_f2x(w[i]); }
    for (size_t i = 0; i < nhist; i++) { hx[i] = lab_f2x(hs[i]); }
    cudaCheck(cudaMemcpy(d.z, zx.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.w, wx.data(), nw * sizeof(floatX), cudaMemcpyHostToDevice));
    if (nhist) { cudaCheck(cudaMemcpy(d.hist, hx.data(), nhist * sizeof(floatX), cudaMemcpyHostToDevice)); }
    cudaCheck(cudaMemcpy(d.dy, dy.data(), nh * sizeof(float), cudaMemcpyHostToDevice));
    unsigned char* dlen = nullptr;
    if (docs) {
        std::vector<signed char> rel((size_t)B * ((T + 63) / 64 * 64));
        std::vector<unsigned char> reach((size_t)B * T);
        doc_chunk_rel(doc.data(), B, T, 64, rel.data(), reach.data());
        cudaCheck(cudaMalloc(&dlen, reach.size()));
        cudaCheck(cudaMemcpy(dlen, reach.data(), reach.size(), cudaMemcpyHostToDevice));
    }
    std::vector<floatX> v6_bits[4]; // v6's pre, out, dz and rstd (as bytes): v7, v8 must equal them bit for bit
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel && !(v == 6 && version_sel >= 7)) { continue; }
        if (v == 1 && (Dp != D || docs)) { continue; } // v1 has no row stride and no documents
        lab_poison(d.pre, n * sizeof(floatX)); lab_poison(d.out, nh * sizeof(floatX)); lab_poison(d.dz, n * sizeof(floatX));
        lab_poison(d.rstd, (size_t)B * T * H * sizeof(float));
        cudaCheck(cudaMemcpy(d.dw, dw0.data(), nw * sizeof(float), cudaMemcpyHostToDevice));
        cv_forward(d, v, s, norm, scale, hist, dlen);
        if (!hist) { cv_backward(d, v, s, norm, scale, dlen); }
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        char tag[96], what[160];
        snprintf(tag, sizeof tag, "v%d D=%-3d cs=%d %s%s", v, D, cs, norm ? "norm  " : "nonorm", hist ? " hist" : docs ? " docs" : "     ");
        std::vector<float> gp = lab_download_x(d.pre, n), gh = lab_download_x(d.out, nh);
        std::vector<float> go(n);
        for (int b = 0; b < B; b++) { // the head-major rows back to token-major for the comparison
            for (int h = 0; h < H; h++) {
                for (int t = 0; t < T; t++) {
                    for (int j = 0; j < D; j++) {
                        go[((size_t)b * T + t) * Ch + (size_t)h * D + j] = gh[(((size_t)b * H + h) * Tp + t) * Dp + j];
                    }
                }
            }
        }
        snprintf(what, sizeof what, "%s pre", tag);
        lab_check(what, rel_l2(gp.data(), pre.data(), n), TOL_X);
        snprintf(what, sizeof what, "%s out", tag);
        lab_check(what, rel_l2(go.data(), out.data(), n), TOL_X);
        if (norm) {
            std::vector<float> gr = lab_download(d.rstd, (size_t)B * T * H);
            snprintf(what, sizeof what, "%s rstd", tag);
            lab_check(what, rel_l2(gr.data(), rstd.data(), gr.size()), TOL_RSTD);
        }
        { // the forward's sums and dz in v6's order: v7, v8 bit for bit
            std::vector<floatX> bits[4];
            size_t cnt[4] = {n, nh, n, (size_t)B * T * H * sizeof(float) / sizeof(floatX)};
            const void* src[4] = {d.pre, d.out, d.dz, d.rstd};
            for (int q = 0; q < 4; q++) {
                bits[q].resize(cnt[q]);
                cudaCheck(cudaMemcpy(bits[q].data(), src[q], cnt[q] * sizeof(floatX), cudaMemcpyDeviceToHost));
            }
            const char* names[4] = {"pre", "out", "dz", "rstd"};
            for (int q = 0; q < 4; q++) {
                if (v == 6) { v6_bits[q] = bits[q]; continue; }
                if (v < 7 || v6_bits[q].empty() || (q == 2 && hist) || (q == 3 && !norm)) { continue; }
                // (out's padded columns and rstd without norm are poison in both: compared as well where written)
                size_t nd = 0;
                for (size_t i = 0; i < cnt[q]; i++) { nd += memcmp(&bits[q][i], &v6_bits[q][i], sizeof(floatX)) != 0; }
                snprintf(what, sizeof what, "%s %s = v6's bit for bit", tag, names[q]);
                lab_check_exact(what, (long)nd, (long)cnt[q]);
            }
            if (version_sel >= 7 && v == 6) { continue; } // v6 ran only as the reference of the bit comparison
        }
        if (!hist) {
            std::vector<float> gz = lab_download_x(d.dz, n), gw = lab_download(d.dw, nw);
            snprintf(what, sizeof what, "%s dz", tag);
            lab_check(what, rel_l2(gz.data(), dz.data(), n), TOL_DX);
            snprintf(what, sizeof what, "%s dw (+=)", tag);
            lab_check(what, rel_l2(gw.data(), dw.data(), nw), TOL_DW);
        }
    }
    if (dlen) { cudaCheck(cudaFree(dlen)); }
    cv_free(d);
}

// the 340m shape (one of q, k) and the 1b KDA's (14 heads of 120 in rows of 128, 8 x 2048 tokens)
static void bench_shape(int version_sel, const CvShape& s) {
    CvDev d;
    cv_alloc(d, s);
    long n = (long)s.B * s.T * s.H * s.D, nh = (long)s.B * s.H * s.Tp * s.Dp;
    lab_fill(d.z, n, FILL_NORMAL, 0.0f, 1.0f, 41);
    lab_fill(d.w, (long)s.H * s.D * s.cs, FILL_NORMAL, 0.0f, 0.5f, 42);
    lab_fill(d.dy, nh, FILL_NORMAL, 0.0f, 1.0f, 43);
    cudaCheck(cudaMemset(d.dw, 0, (size_t)s.H * s.D * s.cs * sizeof(float)));
    double xs = sizeof(floatX);
    printf("\n=== timing: conv_norm (%s), B=%d H=%d T=%d D=%d (rows of %d) cs=%d, with norm; GB/s counts the minimal traffic ===\n",
           PRECISION_NAME, s.B, s.H, s.T, s.D, s.Dp, s.cs);
    printf("%-18s %10s %8s %10s %8s\n", "version", "fwd ms", "GB/s", "bwd ms", "GB/s");
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        if (v == 1 && s.Dp != s.D) { continue; }
        bool nopre = v >= 5; // as the trainer runs them: the forward writes no pre, the backward makes it again
        double tf = bench_ms([&] { cv_forward(d, v, s, 1, 1.0f, 0, nullptr, !nopre); });
        double fb = n * (nopre ? 2 : 3) * xs; // fwd: z in, (pre +) out out
        cv_forward(d, v, s, 1, 1.0f, 0);
        double tb = bench_ms([&] { cv_backward(d, v, s, 1, 1.0f); });
        double bbytes = n * (4 + (nopre ? 3 : 4) * xs); // bwd: dy, out, (pre,) z in, dz out
        printf("%-18s %10.4f %8.0f %10.4f %8.0f\n", VERSION_NAME[v], tf, fb / tf / 1e6, tb, bbytes / tb / 1e6);
        fflush(stdout);
    }
    printf("\n");
    cv_free(d);
}
static void bench(int version_sel) {
    bench_shape(version_sel, CvShape{16, 2048, 8, 128, 4, 2048, 128});
    bench_shape(version_sel, CvShape{8, 2048, 14, 120, 4, 2048, 128});
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    conv_vec_setup<8>(); // v4's (NV = 4) opt-in is in mixer_kernel_setup
    if (a.validate) {
        printf("\n=== validation: conv_norm (%s) vs the CPU reference in double; B=2 H=3 T=200 ===\n", PRECISION_NAME);
        uint64_t seed = 300;
        for (int D : {16, 32, 36, 120, 128, 256}) {
            for (int cs : {4, 2}) {
                CvShape s{2, 200, 3, D, cs, 256, (D + 15) / 16 * 16}; // 120: the 1b KDA's heads, rows padded to 128
                validate_case(a.version, s, 1, 0, seed++);
                validate_case(a.version, s, 0, 0, seed++);
                validate_case(a.version, s, 1, 1, seed++);
                validate_case(a.version, s, 1, 0, seed++, 1); // packed documents
            }
        }
    }
    if (a.bench) { bench(a.version); }
    return lab_finish("conv_norm");
}
#endif
