/*
Kernel lab: the chunkwise delta rule (MODEL.md §3.7 and §4), forward and backward, exactly as train_pdn.cu runs it
(delta_chunk_forward / delta_chunk_backward: strided-batched GEMMs + chunk_prep, scores, tri_inverse, state scan,
bwd_finish kernels), for no decay (gk = 0), a scalar decay (gk = 1) and a channel decay (gk = K), with one key
(k̃ = k̂, DN/GDN/KDA: dk̂ gets dk̃ folded in) and two keys (k̃ != k̂, PDN/PGDN/PKDA).

Versions (everything else is the trainer's code):
  v1  SIMT / unfused: state_forward_kernel / state_backward_kernel (fp32 state in shared memory, fp32 FMA loops; O
      and Pᵀ dO by batched GEMMs); for the channel decay the fp32 FMA score kernels scores_channel_kernel /
      scores_channel_backward_kernel; for scalar and no decay the scores as batched GEMMs + scores_mask_kernel /
      bwd_scores_mask_kernel, and tri_inverse_kernel on its own
  v2  tensor cores: state_forward_wmma_kernel (also makes O) / state_backward_wmma_kernel (also makes Pᵀ dO), bf16
      mma.sync m16n8k16 on ldmatrix loads (mma_steps, mma_steps_t; until 2026-12-03 WMMA's loads) with fp32 state;
      channel-decay scores scores_channel_tc_kernel / scores_channel_dq_tc_kernel /
      scores_channel_dkt_tc_kernel; scalar/no-decay scores with the inverse scores_scalar_tc_kernel and their
      backward bwd_scores_scalar_tc_kernel: what the bf16 trainer runs whenever scan_uses_wmma() / scores_use_tc() /
      scores_scalar_fused() allow it. Not compiled in the fp32 build.
  v3  v2 with the two-level state scans (ScanGroups in train_pdn.cu): the chunks split into groups; per group its
      B (the scan from zero) and its transition (the scan with U = 0, resp. dO = 0, from the identity: a K x K state)
      in parallel, the groups' start states composed in fp32 (scan_groups_combine_kernel), then each group's scan from
      its start state with the outputs. Validation forces groups of 2 chunks (the last one shorter where NC is odd);
      the timing takes the trainer's rule (two blocks per multiprocessor, >= 4 chunks a group: 9 groups at B=1 H=8).
      On the H200 (2026-12-02) correct but slower than v2 at every length: the trainer keeps the sequential scan
      (SCAN_GROUPS_DEFAULT 0).
  v4  v2 with two stage buffers in the state scans (MixerPlan.scan_stages = 2, ScanStage in train_pdn.cu): all of
      the next chunk's operands are staged while this chunk runs (one block per multiprocessor), instead of its two
      halves at two points of this chunk (two blocks per multiprocessor). The arithmetic is v2's, so its outputs
      must equal v2's bit for bit (checked when both run) besides the reference. On the H200 (2026-12-03): equal,
      2-3% faster at B=1 H=8, slower at the training micro-batch B=16 T=2048 (512 scan blocks): the trainer takes
      two stages only where the scan has fewer than two blocks per multiprocessor.
  v5  v2 with 16 value columns a scan block instead of 32 (MixerPlan.scan_bv = 16): twice the blocks, each with half
      the products on a chunk's step. The products are the same 16 x 16 tiles, so its outputs must equal v2's bit for
      bit (checked when both run). On the H200 (2026-12-04): fwd+bwd 13-15% faster at B = 1, H = 8 for T = 2048 ..
      16384, 8-9% slower at B = 16, T = 2048: the trainer takes 16 columns only where the 16-column blocks (B H V / 16)
      are no more than the multiprocessors. v2 .. v4 force 32 columns.
  v6  v5 with two stage buffers: what the trainer ran (until v12) where B H V / 16 blocks are fewer than the SMs
      (one sequence, few heads: v5 and v4 together; until 2026-12-04 no version here ran it). Its outputs must equal
      v2's bit for bit (checked when both run). Since 2026-12-04 a 16-column forward block puts its O tiles on warps
      the state update leaves idle (train_pdn.cu `ob`), so P V' runs beside the update instead of after it: on the
      H200 the forward at B = 1, H = 8, T = 16384 -1 .. 3% (dn 1.01 -> 0.98 ms, pkda 1.57 -> 1.54), fwd+bwd < 1%.
      The same move in the backward (dS's decay and Qgᵀ dO made by the warps dV' leaves idle) changed nothing
      measurable (dn bwd 1.68 vs 1.69 ms) and was not kept.
  v7  v2 with the backward's chunk-local products (dQg, dP, dKd, dX, dY, dA; MixerPlan.gemms_fused) in one
      tensor-core kernel a chunk (bwd_gemms_tc_kernel) instead of ten batched GEMMs: dW and dZ stay in shared memory
      (rounded to bf16 where the GEMMs stored them so) and dO, h, V', dV', Tx are read once; two blocks a
      multiprocessor at K = V = 128 (shared regions refilled behind barriers). v1 .. v6 run the GEMMs.
      Checked against the reference and against v2's outputs at 1e-3 (not bit for bit: dZ's two products share one
      accumulator here). On an H100 (2026-12-07): 3,443 checks PASS, equal to v2 bit for bit at 40 of 48 shapes
      (the tensor cores sum over k in cuBLAS's order) and within 1.8e-6 at the rest; fwd+bwd at B = 16 T = 2048
      pgdn 4.33 -> 4.03 ms, dn 3.47 -> 3.13; at B = 1 T = 16384 pgdn 4.05 -> 3.97. The trainer's plan since then.
  v8  v7 with the rest of the backward after the state scan in the same kernel (MixerPlan.bwd_fused,
      bwd_chunk_fused_kernel; scalar or no decay, K = V = 128): the products, the scalar scores' backward and the
      finish in one block a chunk, dq, dk̂, dk̃ kept in registers from the first product to the last, so that dQg,
      dKd, dX, dY, dq_s, dkh_s, dkt_s, dP, dA never reach device memory. Its sums run in other orders than the
      unfused kernels': checked against the reference and against v2 at 1e-3. Written 2026-12-07 without a GPU,
      run the same day on an H100: 168/168 checks PASS (its errors against the reference equal v7's to three
      digits), fwd+bwd at B = 16 T = 2048 pgdn 4.03 -> 3.22 ms, dn 3.14 -> 2.39; at B = 1 T = 16384 pgdn 3.87 ->
      3.61 (v7 -> v8 in one job). The trainer's plan since then (BWD_FUSED_DEFAULT 1).
  v9  v8 (v7 where v8 does not run: channel decay, K != 128; v2's GEMMs where v7's do not fit: K = 256) with
      the WY form's inputs made on chip
      (MixerPlan.prep_wy, prep_wy_kernel): X = beta e^G k̂ and Y = beta v stay in shared memory, W = Tx X and
      U = Tx Y on tensor cores in the same kernel as Qg and Kd, in the forward and in the remake (the chunk prep
      before the scores makes G alone). W, U sum in another order than cuBLAS's: checked against v2 at 1e-3, and V', O
      made again against the forward's bit for bit. Written 2026-12-07 without a GPU, run the same day on an H100:
      4,076 checks PASS in all (v9's 441, within 1.84e-6 of v2 at 54 shapes); fwd+bwd v8 -> v9 at B = 16 T = 2048
      pgdn 3.23 -> 3.12 ms, dn 2.38 -> 2.22; at B = 1 within +-3% either way. kda at B = 16 T = 2048: fwd 1.85 ms
      against v7's 1.65 (another job), so the trainer takes it for a scalar or no decay only (PREP_WY_DEFAULT 1).
  v10 v7 for a channel decay (KDA, PKDA) with the backward's finish inside the two tensor-core scores kernels
      (MixerPlan.scores_fin, their FIN instantiations) instead of bwd_finish_kernel: the rows side (dq, dk̂ and the
      dbeta rows from dQg, dX, dY, and the rows' part of dG) after its sub-blocks, the columns side (dk̃, or dk̃ added
      into dk̂ for one key, and dg, the reverse cumsum walking down with the column blocks) after its own, so dq_s,
      dk̂_s, dk̃_s and dbetaA never reach device memory. Sums over channels in another order: checked against the
      reference and against v2 at 1e-3. Written 2026-12-07 without a GPU, run the same day on an H100: 153/153
      checks PASS (within 5.4e-9 of v2), fwd+bwd at B = 16 T = 2048 kda 4.93 -> 4.83 ms, pkda 5.62 -> 5.51 (v7 -> v10
      in one job); kda-340m +0.7% end to end. The trainer's plan since then (SCORES_FIN_DEFAULT 1).
  v11 the trainer's plan for each shape, nothing forced: whichever of the versions above (or their combination, such
      as v12's scans with v9's or v10's backward at B = 1) mixer_plan picks, so its timing is the mixer as train_pdncu
      runs it (scripts/bench_gpu.sh prints v11's table). Checked against the reference and against v2 at 1e-3 (v2
      when it runs in the same call). Run alone on an H100 (bf16, 2026-12-07, results/sigmoid_2026-12-07_h100/): 387
      checks PASS against the reference; first timed the same night (results/stages3_2026-12-07_h100/).
  v12 v6 (its backward too: the batched GEMMs) with three stage buffers in the state scans (MixerPlan.scan_stages
      = 3): the warps idle in a chunk's first phase (the forward's before its O tiles, the backward's after its
      dV' tiles) stage the chunk after next into the third buffer, so the copies are no longer issued by every
      warp between chunks and the barrier that freed the buffer for them is gone. The arithmetic is v6's, so its
      outputs must equal v2's bit for bit (checked when both run); validation at chunks of 16 walks 13 chunks, so
      the three buffers turn over several times. Where it fits (16 value columns, K <= 128 at chunk 64) it is the
      trainer's plan in place of v6's (SCAN_STAGES3_DEFAULT). Written 2026-12-07 after Nsight Compute showed the
      copies' issue (stage_async's divisions and loops) at ~40% of the scans' instructions at 1 x 32768, with
      stage_async's divisions by shifts in the same change. On an H100 the same day: 5,062 checks PASS in the whole
      lab (v12 = v2 bit for bit); fwd+bwd at B = 1, T = 16384 v6 -> v12 pgdn 3.34 -> 3.23 ms, dn 2.76 -> 2.64 (one
      build); v11 (the trainer's plan) against the build before both changes pgdn 2.85 -> 2.58, dn 2.22 -> 2.03.
Every version's backward starts with mixer_remake, as the trainer's does for a layer whose forward is not the last
one run; with the tensor-core scans it makes V' and O again, which must equal the forward's bit for bit (checked).
v2 also runs the remake under every choice of OUTS_LAB (state_outputs_wmma_kernel's value columns per work item,
stage buffers, warps: MixerPlan.outs) and checks each bit for bit, on the device's grid and on 3 blocks (outs_grid_cap:
at these small shapes the device's grid has a block per work item, so only the cap makes blocks walk several); the timing ends with a table of the remake alone
under each choice (on the H200, 2026-12-03: all of V, two stage buffers, 16 warps is the fastest at B = 16 T = 2048
and B = 1 T = 16384, the trainer's OUTS_DEFAULT).
The trainer picks inside delta_chunk_forward/backward with those tests; the lab forces v1 by making them fail
(scan_force_simt, scores_force_fma) and checks which path was taken.

CPU reference: the per-token recurrence of MODEL.md §3.7 in double (S̄ = exp(g) S, u = beta (v - S̄ᵀ k̂),
S = S̄ + k̃ uᵀ, o = Sᵀ q̂) and its backward by hand (the model is delta_token_backward_bh in train_pdn.c), from the
inputs as the device sees them (already rounded to floatX).

Validation: B=2, H=2, T=200 (the last chunk of 64 is partial: 8 tokens), K=V=64, 128 and 256, every decay, one
and two keys, plus chunks of 32 and 16 at K=V=128 (the tile loops of the fused kernels at other --chunk values);
outputs o and gradients dq, dk, dkt (two keys only: with one it is folded into dk and not written), dv, dbeta, dg
compared by relative L2 error. Packed documents (--doc-mask 1): the same at chunks of 64 (K = V = 64, 128), 32 and
16 (K = V = 128) with documents starting at chunks' first, second and last rows, three in a row, mid-chunk, and
chunks without a boundary (doc_starts_at); the reference restarts the state at each document's first token, the
device gets the trainer's chunk values (doc_chunk_rel). v3 refuses documents (its groups compose whole chunk ranges).
Tolerances. fp32 build: 1e-4 (fp32 throughout, no TF32; the chunk form and the token form agree to rounding).
bf16 build: 2e-2. Every tensor the chunk algorithm stores between kernels (X, Y, Qg, Kd, P, Tinv, W, U, V', the
chunk-start states, dP/dM, dW/dX/dY, dV', dstates) is rounded to bf16 (unit roundoff 2^-9 = 2e-3, rms relative
error of one rounding ~1e-3), and a value passes through several such roundings. Calibration (a CPU emulation of
exactly this pipeline, rounding to bf16 where the GPU stores bf16, against this file's reference, at these shapes
and inputs, not committed): 2.4e-3 .. 5.0e-3 for every tensor, dg included, in both scan flavours; without
rounding 1e-7 .. 7e-7. So 2e-2 leaves a margin of 4x over the expected bf16 error and 1e-4 over 100x over fp32
rounding, while an indexing, masking or missing-term bug gives errors of order 1.

Timing: the paper's Fig. 4 setting B=1, H=8, K=V=128, T = 2048 .. 16384, for dn, pdn, gdn, pgdn, kda, pkda;
"fwd" = (diagonal preconditioner scan, for the p* variants) + delta_chunk_forward, "fwd+bwd" = fwd +
delta_chunk_backward + (preconditioner backward). Median of repeats, L2 flushed before each.

Build and run (from the repository root):
  make -C dev/cuda delta_chunk delta_chunk_fp32
  dev/cuda/delta_chunk            validate every version, then time them
  dev/cuda/delta_chunk 2          only v2 (validation and timing)
  dev/cuda/delta_chunk_fp32 --no-bench
Exit code: 0 if every check passed, 1 if any failed.
*/
#define TESTING
#include "../../train_pdn.cu"
#include "common.h"

#ifdef ENABLE_FP32
#define NVERSIONS 1
static const double TOL = 1e-4;
#else
#define NVERSIONS 12
static const double TOL = 2e-2;
#endif
static const char* VERSION_NAME[13] = {"", "v1 SIMT", "v2 tensor cores", "v3 two-level scans", "v4 staged scans",
                                       "v5 16-column scans", "v6 16 col, staged", "v7 v2 + bwd products",
                                       "v8 v7 + fused bwd", "v9 v8 + prep/WY", "v10 v7 + scores fin",
                                       "v11 trainer's plan", "v12 v6, 3 stages"};
#ifndef ENABLE_FP32
static int lab_groups = -1; // v3's scan_groups_force: validation sets groups of 2 chunks, timing the trainer's rule (-1)
#endif
#define LAB_MAX_GROUPS 16   // the group buffers' size (validation: <= 7 groups; timing at T = 16384: 9)
static const int CHUNK = 64; // the trainer's default --chunk
#ifndef ENABLE_FP32
#define MMA_BAD mma_bad // the trainer's start-up check of the tensor-core products failed (bf16 build only)
// the V'/O remake's choices (OutsPlan: value columns a work item, stage buffers, warps) that validation checks bit for
// bit and the timing compares (bw 0: all of V)
static const OutsPlan OUTS_LAB[] = {{32, 1, 8}, {32, 2, 8}, {32, 1, 16}, {64, 1, 8}, {64, 2, 8}, {64, 2, 16},
                                    {128, 1, 16}, {128, 2, 8}, {128, 2, 16}};
#else
#define MMA_BAD 0
#endif
static const float PC_X = 1.5f, PC_EPS = 1e-6f; // MODEL.md §3.6: squash x, eps

// v1: make the tensor-core tests fail; v2: the device's real limits. Returns whether `s` then runs version v.
static bool select_version(int v, const ChunkShape& s) {
#ifdef ENABLE_FP32
    (void)s;
    return v == 1;
#else
    if (v == 11) { // the trainer's plan for the shape: no choice forced (MixerPlan as mixer_plan makes it)
        scan_force_simt = scores_force_fma = 0;
        scan_groups_force = scan_stages_force = scan_bv_force = gemms_force = bwd_fused_force = prep_wy_force = 0;
        scores_fin_force = 0;
        return mixer_plan(s).scan_wmma;
    }
    scan_force_simt = v == 1; // v1: the SIMT scans and unfused scores, v2: the tensor-core ones, v3: v2 in chunk groups,
    scores_force_fma = v == 1; // v4: v2 with two stage buffers, v5: v2 with 16-column scan blocks
    scan_groups_force = v == 3 ? lab_groups : 0;
    scan_stages_force = v == 4 || v == 6 ? 2 : v == 12 ? 3 : 1; // v12: v6 with three stage buffers
    scan_bv_force = v == 5 || v == 6 || v == 12 ? 16 : 32;
    gemms_force = v >= 7 && v != 12 ? 2 : 1; // v7: v2 with the backward's products in one kernel (MixerPlan.gemms_fused)
    bwd_fused_force = v >= 8 && v != 12 ? 1 : 2; // v8: products, scores, finish in one kernel (MixerPlan.bwd_fused)
    prep_wy_force = v == 9 ? 1 : 2;   // v9: v8 (v7 where v8 does not run) with X, Y on chip (MixerPlan.prep_wy)
    scores_fin_force = v == 10 ? 1 : 2; // v10: channel decay, v7 with the finish in the scores kernels (MixerPlan.scores_fin)
    MixerPlan p = mixer_plan(s);
    bool w = p.scan_wmma && (s.gk > 1 ? scores_use_tc(s) : scores_scalar_fused(s));
    if (v == 3) { return w && p.scan_groups > 1; }
    if (v == 4) { return w && p.scan_groups == 1 && p.scan_stages == 2; }
    if (v == 5) { return w && p.scan_groups == 1 && p.scan_bv == 16; }
    if (v == 6) { return w && p.scan_groups == 1 && p.scan_bv == 16 && p.scan_stages == 2; }
    if (v == 7) { return w && p.scan_groups == 1 && p.gemms_fused && !p.bwd_fused; }
    if (v == 8) { return w && p.scan_groups == 1 && p.bwd_fused; }
    if (v == 9) { return w && p.scan_groups == 1 && p.prep_wy; } // with the GEMMs where the fused products do not fit
    if (v == 10) { return w && p.scan_groups == 1 && p.scores_fin; } // channel decay only
    if (v == 12) { return w && p.scan_groups == 1 && p.scan_bv == 16 && p.scan_stages == 3; }
    return v == 1 ? !w : (w && p.scan_groups == 1);
#endif
}

// ----------------------------------------------------------------------------------------------------
// inputs (head-major padded rows, B*H*Tp; padded rows zero) as the device sees them

struct DeltaHost {
    int B, H, T, Tp, K, V, gk, gw;
    std::vector<float> q, k, kt, v, dO, beta, g;
    std::vector<int> doc; // (B, T) packed documents: every token's document start in its row (train_pdn.c's doc), or empty
};

// Packed documents for row b of a window of chunks of C: documents start at a chunk's first row, its second, its last,
// at three consecutive rows (one-token documents), and two chunks have none (row 0: the third; row 1: the first)
static bool doc_starts_at(int b, int t, int C) {
    int ch = t / C, i = t % C;
    if (t == 0) { return false; }
    if (b % 2 == 0) { return ch % 3 == 0 ? (i <= 2 || i == C - 1) : ch % 3 == 1 ? i == C / 2 + 3 : false; }
    return ch == 0 ? false : ch % 2 == 1 ? (i == 0 || i == C - 2) : (i == 5 || i == 6 || i == 7);
}

static DeltaHost make_inputs(int B, int H, int T, int C, int K, int V, int gk, int two_keys, int docs, uint64_t seed) {
    DeltaHost h;
    h.B = B; h.H = H; h.T = T; h.Tp = (T + C - 1) / C * C; h.K = K; h.V = V; h.gk = gk; h.gw = gk ? gk : 1;
    if (docs) {
        h.doc.assign((size_t)B * T, 0);
        for (int b = 0; b < B; b++) {
            for (int t = 1; t < T; t++) { h.doc[(size_t)b * T + t] = doc_starts_at(b, t, C) ? t : h.doc[(size_t)b * T + t - 1]; }
        }
    }
    size_t rows = (size_t)B * H * h.Tp;
    h.q.assign(rows * K, 0.0f); h.k.assign(rows * K, 0.0f); h.kt.assign(rows * K, 0.0f); h.v.assign(rows * V, 0.0f);
    h.dO.assign(rows * V, 0.0f); h.beta.assign(rows, 0.0f); h.g.assign(rows * h.gw, 0.0f);
    LabRng rng(seed);
    std::vector<double> tmp(K);
    double lnx = log((double)PC_X);
    for (int bh = 0; bh < B * H; bh++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)bh * h.Tp + t;
            // q̂ = q / |q| * K^-1/2 and k̂ = k / |k| (MODEL.md §3.3)
            for (int pass = 0; pass < 2; pass++) {
                double ss = 0.0;
                for (int j = 0; j < K; j++) { tmp[j] = rng.normal(); ss += tmp[j] * tmp[j]; }
                double sc = (pass == 0 ? 1.0 / sqrt((double)K) : 1.0) / sqrt(ss + 1e-6);
                float* dst = pass == 0 ? &h.q[row * K] : &h.k[row * K];
                for (int j = 0; j < K; j++) { dst[j] = lab_round((float)(tmp[j] * sc)); }
            }
            // k̃ = b ⊙ k̂ with b = exp(-ln(x) s), s in (-1, 1): b in (2/3, 3/2) as the preconditioner makes it
            for (int j = 0; j < K; j++) {
                double b = two_keys ? exp(-lnx * (2.0 * rng.uniform() - 1.0)) : 1.0;
                h.kt[row * K + j] = two_keys ? lab_round((float)(b * h.k[row * K + j])) : h.k[row * K + j];
            }
            for (int c = 0; c < V; c++) { h.v[row * V + c] = lab_round((float)rng.normal()); }
            for (int c = 0; c < V; c++) { h.dO[row * V + c] = lab_round((float)rng.normal()); }
            h.beta[row] = (float)lab_sigmoid(rng.normal()); // in (0, 1)
            // log decays -softplus(z), z ~ N(-2, 1.5): mostly in [-1, 0), median -0.13 (the model's -exp(A) sp(.))
            for (int j = 0; j < (gk ? h.gw : 0); j++) { h.g[row * h.gw + j] = (float)-lab_softplus(-2.0 + 1.5 * rng.normal()); }
        }
    }
    return h;
}

// ----------------------------------------------------------------------------------------------------
// CPU reference in double: the per-token recurrence and its backward. Outputs compact (bh, t) rows, t < T. With
// packed documents the state restarts from zero at every document's first token: S̄ = 0 there (its decay 0).

struct DeltaRef { std::vector<double> o, dq, dk, dkt, dv, dbeta, dg; };

static void delta_reference(const DeltaHost& h, DeltaRef& r) {
    int K = h.K, V = h.V, T = h.T, gk = h.gk, gw = h.gw, BH = h.B * h.H;
    size_t KV = (size_t)K * V;
    r.o.assign((size_t)BH * T * V, 0.0); r.dv.assign((size_t)BH * T * V, 0.0);
    r.dq.assign((size_t)BH * T * K, 0.0); r.dk.assign((size_t)BH * T * K, 0.0); r.dkt.assign((size_t)BH * T * K, 0.0);
    r.dbeta.assign((size_t)BH * T, 0.0); r.dg.assign((size_t)BH * T * gw, 0.0);
    std::vector<double> St((size_t)(T + 1) * KV), Sb(KV), dS(KV), u(V), rr(V), du(V), dr(V);
    auto boundary = [&](int bh, int t) { return !h.doc.empty() && t > 0 && h.doc[(size_t)(bh / h.H) * T + t] == t; };
    for (int bh = 0; bh < BH; bh++) {
        std::fill(St.begin(), St.begin() + KV, 0.0);
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)bh * h.Tp + t, cr = (size_t)bh * T + t;
            const float *q = &h.q[row * K], *k = &h.k[row * K], *kt = &h.kt[row * K], *v = &h.v[row * V];
            const double* Sp = &St[(size_t)t * KV];
            double* S = &St[(size_t)(t + 1) * KV];
            for (int j = 0; j < K; j++) {
                double e = boundary(bh, t) ? 0.0 : gk ? exp((double)h.g[row * gw + (gk == 1 ? 0 : j)]) : 1.0;
                for (int c = 0; c < V; c++) { S[j * V + c] = e * Sp[j * V + c]; }
            }
            std::fill(rr.begin(), rr.end(), 0.0);
            for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { rr[c] += S[j * V + c] * k[j]; } }
            for (int c = 0; c < V; c++) { u[c] = h.beta[row] * (v[c] - rr[c]); }
            for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { S[j * V + c] += kt[j] * u[c]; } }
            for (int c = 0; c < V; c++) {
                double s = 0.0;
                for (int j = 0; j < K; j++) { s += S[j * V + c] * q[j]; }
                r.o[cr * V + c] = s;
            }
        }
        std::fill(dS.begin(), dS.end(), 0.0);
        for (int t = T - 1; t >= 0; t--) {
            size_t row = (size_t)bh * h.Tp + t, cr = (size_t)bh * T + t;
            const float *q = &h.q[row * K], *k = &h.k[row * K], *kt = &h.kt[row * K], *v = &h.v[row * V];
            const float* dO = &h.dO[row * V];
            const double* Sp = &St[(size_t)t * KV];
            const double* S = &St[(size_t)(t + 1) * KV];
            double b = h.beta[row];
            bool cut = boundary(bh, t);
            for (int j = 0; j < K; j++) {
                double e = cut ? 0.0 : gk ? exp((double)h.g[row * gw + (gk == 1 ? 0 : j)]) : 1.0;
                for (int c = 0; c < V; c++) { Sb[j * V + c] = e * Sp[j * V + c]; }
            }
            std::fill(rr.begin(), rr.end(), 0.0);
            for (int j = 0; j < K; j++) { for (int c = 0; c < V; c++) { rr[c] += Sb[j * V + c] * k[j]; } }
            for (int c = 0; c < V; c++) { u[c] = b * (v[c] - rr[c]); }
            // o = Sᵀ q
            for (int j = 0; j < K; j++) {
                double s = 0.0;
                for (int c = 0; c < V; c++) { s += S[j * V + c] * dO[c]; dS[j * V + c] += q[j] * dO[c]; }
                r.dq[cr * K + j] = s;
            }
            // S = S̄ + k̃ uᵀ
            std::fill(du.begin(), du.end(), 0.0);
            for (int j = 0; j < K; j++) {
                double s = 0.0;
                for (int c = 0; c < V; c++) { s += dS[j * V + c] * u[c]; du[c] += dS[j * V + c] * kt[j]; }
                r.dkt[cr * K + j] = s;
            }
            // u = beta (v - r), r = S̄ᵀ k̂
            double db = 0.0;
            for (int c = 0; c < V; c++) {
                db += du[c] * (v[c] - rr[c]);
                r.dv[cr * V + c] = b * du[c];
                dr[c] = -b * du[c];
            }
            r.dbeta[cr] = db;
            for (int j = 0; j < K; j++) {
                double s = 0.0;
                for (int c = 0; c < V; c++) { s += Sb[j * V + c] * dr[c]; dS[j * V + c] += k[j] * dr[c]; }
                r.dk[cr * K + j] = s;
            }
            // S̄ = exp(g) S_prev: dg = Σ dS̄ ⊙ S̄ (per row for a channel decay), dS_prev = exp(g) dS̄ (0 at a boundary)
            if (gk || cut) {
                for (int j = 0; j < K; j++) {
                    double s = 0.0;
                    for (int c = 0; c < V; c++) { s += dS[j * V + c] * Sb[j * V + c]; }
                    if (gk) { r.dg[cr * gw + (gk == 1 ? 0 : j)] += s; }
                    double e = cut ? 0.0 : exp((double)h.g[row * gw + (gk == 1 ? 0 : j)]);
                    for (int c = 0; c < V; c++) { dS[j * V + c] *= e; }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// device buffers: the mixer tensors of acts_alloc (MixerSaved, MixerScratch with grads), the inputs, the
// gradients and the preconditioner's, for shape s (any shape with rows and nq no larger runs in them)

struct DeltaDev {
    Arena ar;
    MixerSaved sv;
    MixerScratch sc;
    PrecondBufs pb;
    floatX *q, *k, *kt, *v, *dO, *las;
    float *beta, *g, *gp, *bp;
    float *dq, *dk, *dkt, *dv, *dbeta, *dg, *dgp, *dbp, *dlas;
};

static void delta_dev_alloc(DeltaDev& d, const ChunkShape& s, int precond) {
    memset(&d.sv, 0, sizeof d.sv);
    memset(&d.sc, 0, sizeof d.sc);
    memset(&d.pb, 0, sizeof d.pb);
    int K = s.K, V = s.V, C = s.C, gw = s.gk ? s.gk : 1, H = s.H;
    long rows = s.nq * C;
    Arena& ar = d.ar;
    ar.add(&d.q, rows * K); ar.add(&d.k, rows * K); ar.add(&d.kt, rows * K); ar.add(&d.v, rows * V);
    ar.add(&d.dO, rows * V); ar.add(&d.beta, rows); ar.add(&d.g, rows * gw);
    ar.add(&d.dq, rows * K); ar.add(&d.dk, rows * K); ar.add(&d.dkt, rows * K); ar.add(&d.dv, rows * V);
    ar.add(&d.dbeta, rows); ar.add(&d.dg, rows * gw);
    mixer_saved_add(ar, &d.sv, s, MixerPlan{}); // the trainer's own buffer lists (all of them: the lab keeps V', O)
    // every flavour's buffers (the versions below run them all), the scalar scores' too whatever s's decay (gk 0)
    ChunkShape every = s;
    every.gk = 0;
    MixerPlan all{};
    all.scan_groups = LAB_MAX_GROUPS;
    mixer_scratch_add(ar, &d.sc, every, 0, all);
    mixer_scratch_grads_add(ar, &d.sc, every, all);
    if (precond) {
        precond_scratch_add(ar, &d.pb, s.nq, K);
        ar.add(&d.pb.astat, rows * K); ar.add(&d.pb.carry, s.nq * K);
        ar.add(&d.gp, rows); ar.add(&d.bp, rows); ar.add(&d.las, H);
        ar.add(&d.dgp, rows); ar.add(&d.dbp, rows); ar.add(&d.dlas, H);
    }
    ar.alloc();
}

static void delta_forward(DeltaDev& d, const ChunkShape& s, const floatX* kt, int precond) {
    if (precond) { lab_precond_diag_forward(d.kt, d.pb, d.k, d.gp, d.bp, d.las, s, PC_X, PC_EPS); }
    delta_chunk_forward(&d.sv, &d.sc, d.q, d.k, kt, d.v, d.beta, s.gk ? d.g : nullptr, nullptr, nullptr, s);
}
// fold = one key (k̃ = k̂): dk gets dkt too, as the trainer does without a preconditioner. As for a layer other than
// the last: what the backward reads from the scratch is made again first (mixer_remake; with the tensor-core scans
// V' and O too, over the forward's own, which validate_case checks are unchanged bit for bit)
static void delta_backward(DeltaDev& d, const ChunkShape& s, const floatX* kt, int fold, int precond) {
    mixer_remake(&d.sv, &d.sc, d.q, d.k, kt, d.v, d.beta, s.gk ? d.g : nullptr, s);
    delta_chunk_backward(d.dq, d.dk, d.dkt, d.dv, d.dbeta, s.gk ? d.dg : nullptr, &d.sc, &d.sv, d.dO, d.q, d.k, kt, d.v,
                         d.beta, fold, s);
    if (precond) {
        lab_precond_diag_backward(d.dk, d.dgp, d.dbp, d.dlas, d.pb, d.dkt, d.k, d.gp, d.bp, d.las, s, PC_X, PC_EPS);
    }
}

// valid rows (t < T) of a head-major padded (BH, Tp, X) tensor, in the reference's compact order
static std::vector<float> gather_rows(const std::vector<float>& hm, int BH, int T, int Tp, int X) {
    std::vector<float> out((size_t)BH * T * X);
    for (int bh = 0; bh < BH; bh++) {
        for (int t = 0; t < T; t++) {
            memcpy(&out[((size_t)bh * T + t) * X], &hm[((size_t)bh * Tp + t) * X], X * sizeof(float));
        }
    }
    return out;
}

// ----------------------------------------------------------------------------------------------------
// validation

static const char* decay_name(int gk) { return gk == 0 ? "none" : gk == 1 ? "scalar" : "channel"; }

static void validate_case(int version_sel, int C, int K, int gk_kind, int two_keys, int docs, uint64_t seed) {
    const int B = 2, H = 2, T = 200, V = K;
    int gk = gk_kind == 2 ? K : gk_kind;
    DeltaHost h = make_inputs(B, H, T, C, K, V, gk, two_keys, docs, seed);
    DeltaRef r;
    delta_reference(h, r);
    if (!two_keys) { for (size_t i = 0; i < r.dk.size(); i++) { r.dk[i] += r.dkt[i]; } } // the fold
    int NC = h.Tp / C, BH = B * H;
    ChunkShape s{B, H, T, h.Tp, C, NC, K, V, gk, (long)BH * NC, nullptr};
#ifndef ENABLE_FP32
    lab_groups = cdiv(NC, 2); // v3: groups of 2 chunks (NC = 4, 7, 13: the last group shorter where NC is odd)
#endif
    DeltaDev d{};
    delta_dev_alloc(d, s, 0);
    size_t rows = (size_t)BH * h.Tp;
    signed char* doc_dev = nullptr; // the trainer's packed documents (acts_docs): their chunk values
    if (docs) {
        std::vector<signed char> rel((size_t)B * h.Tp);
        std::vector<unsigned char> reach((size_t)B * T);
        doc_chunk_rel(h.doc.data(), B, T, C, rel.data(), reach.data());
        cudaCheck(cudaMalloc(&doc_dev, rel.size()));
        cudaCheck(cudaMemcpy(doc_dev, rel.data(), rel.size(), cudaMemcpyHostToDevice));
        s.doc = doc_dev;
    }
    auto up_x = [](floatX* dst, const std::vector<float>& src) {
        std::vector<floatX> x(src.size());
        for (size_t i = 0; i < src.size(); i++) { x[i] = lab_f2x(src[i]); } // exact: src is already rounded
        cudaCheck(cudaMemcpy(dst, x.data(), x.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    };
    up_x(d.q, h.q); up_x(d.k, h.k); up_x(d.kt, h.kt); up_x(d.v, h.v); up_x(d.dO, h.dO);
    cudaCheck(cudaMemcpy(d.beta, h.beta.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.g, h.g.data(), h.g.size() * sizeof(float), cudaMemcpyHostToDevice));
    const floatX* kt = two_keys ? d.kt : d.k;
    std::vector<float> out_v2; // v2's outputs, for v4's, v5's, v6's and v12's bit-for-bit checks and v7's near one
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        char tag[96];
        snprintf(tag, sizeof tag, "v%d C=%-2d decay=%-7s keys=%d K=V=%-3d%s", v, C, decay_name(gk), two_keys ? 2 : 1, K,
                 docs ? " docs" : "");
        if (v == 3 && docs) { // the two-level scans compose whole chunk ranges: the trainer refuses them with documents
            printf("skip %s: %s: not with packed documents\n", tag, VERSION_NAME[v]);
            continue;
        }
        if (v == 1 && gk > 1 && smem_scores_channel_bwd(s) > (size_t)smem_optin) { // the trainer refuses it (fp32 build)
            printf("skip %s: %s: the exact channel-decay kernels do not fit at K = %d\n", tag, VERSION_NAME[v], K);
            continue;
        }
#ifndef ENABLE_FP32
        if ((v == 4 || v == 6) && smem_scan_wmma(s, 2, v == 6 ? 16 : 32) + 1024 > (size_t)smem_optin) { // by design: the plan then keeps one stage
            printf("skip %s: %s: two stage buffers do not fit at K = %d\n", tag, VERSION_NAME[v], K);
            continue;
        }
        if (v == 12 && !scan3_fits(s, 16)) { // by design: the plan then keeps two stages or one
            printf("skip %s: %s: three stage buffers do not fit at K = %d\n", tag, VERSION_NAME[v], K);
            continue;
        }
        if ((v == 7 || v == 8) && bg_layout(C, K, V).bytes + 1024 > (size_t)smem_optin) { // by design: the plan then runs the GEMMs
            printf("skip %s: %s: the fused products do not fit at K = %d\n", tag, VERSION_NAME[v], K);
            continue;
        }
        if (v == 8 && (gk > 1 || K != 128)) { // by design: scalar or no decay at K = V = 128 only
            printf("skip %s: %s: only for a scalar or no decay at K = V = 128\n", tag, VERSION_NAME[v]);
            continue;
        }
        if (v == 10 && gk <= 1) { // by design: the channel decay's scores kernels
            printf("skip %s: %s: only for a channel decay\n", tag, VERSION_NAME[v]);
            continue;
        }
#endif
        if (!select_version(v, s)) {
            printf("FAIL %s: %s does not run at this shape (the plan decided otherwise%s)\n", tag, VERSION_NAME[v],
                   MMA_BAD ? "; the tensor-core products failed their start-up check" : "");
            lab_checks++;
            lab_failures++;
            continue;
        }
        lab_poison(d.sv.O, rows * V * sizeof(floatX));
        lab_poison(d.dq, rows * K * sizeof(float)); lab_poison(d.dk, rows * K * sizeof(float));
        lab_poison(d.dkt, rows * K * sizeof(float)); lab_poison(d.dv, rows * V * sizeof(float));
        lab_poison(d.dbeta, rows * sizeof(float)); lab_poison(d.dg, h.g.size() * sizeof(float));
        delta_forward(d, s, kt, 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<floatX> fwd_vo = lab_download(d.sv.Vn, rows * V), fo = lab_download(d.sv.O, rows * V);
        fwd_vo.insert(fwd_vo.end(), fo.begin(), fo.end());
        delta_backward(d, s, kt, !two_keys, 0);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        char what[256];
        { // mixer_remake wrote V' and O again (the tensor-core scans' versions): they must be the forward's, bit for bit
            std::vector<floatX> vo = lab_download(d.sv.Vn, rows * V), o2 = lab_download(d.sv.O, rows * V);
            vo.insert(vo.end(), o2.begin(), o2.end());
            long bad = 0;
            for (size_t i = 0; i < vo.size(); i++) { bad += memcmp(&vo[i], &fwd_vo[i], sizeof(floatX)) != 0; }
            snprintf(what, sizeof what, "%s V', O made again = the forward's bit for bit", tag);
            lab_check_exact(what, bad, (long)vo.size());
        }
        auto cmp = [&](const char* name, const float* dev, int X, const std::vector<double>& ref, double tol) {
            std::vector<float> g = gather_rows(lab_download(dev, rows * X), BH, T, h.Tp, X);
            snprintf(what, sizeof what, "%s %s", tag, name);
            lab_check(what, rel_l2(g.data(), ref.data(), g.size()), tol);
        };
        { // o is floatX (rounded once, like every stored activation)
            std::vector<float> g = gather_rows(lab_download_x(d.sv.O, rows * V), BH, T, h.Tp, V);
            snprintf(what, sizeof what, "%s o", tag);
            lab_check(what, rel_l2(g.data(), r.o.data(), g.size()), TOL);
        }
        cmp("dq", d.dq, K, r.dq, TOL);
        cmp(two_keys ? "dk" : "dk (+dkt)", d.dk, K, r.dk, TOL);
        if (two_keys) { cmp("dkt", d.dkt, K, r.dkt, TOL); } // one key: folded into dk, dkt not written
        cmp("dv", d.dv, V, r.dv, TOL);
        cmp("dbeta", d.dbeta, 1, r.dbeta, TOL);
        if (gk) { cmp("dg", d.dg, h.gw, r.dg, TOL); }
        if (v == 2 || v >= 4) { // every output, as stored (o floatX, the gradients fp32)
            std::vector<float> all = lab_download_x(d.sv.O, rows * V);
            auto add = [&](const float* dev, size_t n) { std::vector<float> x = lab_download(dev, n); all.insert(all.end(), x.begin(), x.end()); };
            add(d.dq, rows * K); add(d.dk, rows * K); add(d.dv, rows * V); add(d.dbeta, rows);
            if (two_keys) { add(d.dkt, rows * K); }
            if (gk) { add(d.dg, h.g.size()); }
            if (v == 2) { out_v2 = all; }
            else if (v >= 7 && v != 12 && !out_v2.empty()) {
                // v2's bits are not expected (the products sum in another order), but nearly: fp32 sums in another
                // order differ by ~1e-6 relative, and the few dW, dZ elements whose bf16 rounding then flips move by one
                // bf16 step (2^-8 relative) each; a wrong tile or a missing term moves them by order 1
                snprintf(what, sizeof what, "%s ~ v2 (o, dq, dk, dkt, dv, dbeta, dg; products in another order)", tag);
                lab_check(what, rel_l2(all.data(), out_v2.data(), all.size()), 1e-3);
            } else if (!out_v2.empty()) {
                long bad = 0;
                for (size_t i = 0; i < all.size(); i++) { bad += memcmp(&all[i], &out_v2[i], sizeof(float)) != 0; }
                snprintf(what, sizeof what, "%s = v2 bit for bit (o, dq, dk, dkt, dv, dbeta, dg)", tag);
                lab_check_exact(what, bad, (long)all.size());
            }
        }
#ifndef ENABLE_FP32
        for (OutsPlan o : OUTS_LAB) { // every remake choice the timing compares makes the forward's V' and O
            if (v != 2 || o.bw > V) { continue; }
            outs_force = o;
            OutsPlan op = mixer_plan(s).outs;
            for (int cap : {0, 3}) { // the device's grid, then 3 blocks: each walks many work items
                if (!op.nw) { break; }
                outs_grid_cap = cap;
                lab_poison(d.sv.Vn, rows * V * sizeof(floatX));
                lab_poison(d.sv.O, rows * V * sizeof(floatX));
                mixer_remake(&d.sv, &d.sc, d.q, d.k, kt, d.v, d.beta, s.gk ? d.g : nullptr, s);
                cudaCheck(cudaDeviceSynchronize());
                std::vector<floatX> vo = lab_download(d.sv.Vn, rows * V), o2 = lab_download(d.sv.O, rows * V);
                vo.insert(vo.end(), o2.begin(), o2.end());
                long bad = 0;
                for (size_t i = 0; i < vo.size(); i++) { bad += memcmp(&vo[i], &fwd_vo[i], sizeof(floatX)) != 0; }
                snprintf(what, sizeof what, "%s V', O made again (%d columns, %d stages, %d warps%s) = the forward's", tag,
                         op.bw, op.ns, op.nw, cap ? ", 3 blocks" : "");
                lab_check_exact(what, bad, (long)vo.size());
            }
            outs_force = OutsPlan{0, 0, 0};
            outs_grid_cap = 0;
        }
#endif
    }
    if (doc_dev) { cudaCheck(cudaFree(doc_dev)); }
    d.ar.release();
}

// ----------------------------------------------------------------------------------------------------
// timing: the paper's Fig. 4 shape

// The device memory the trainer's buffer lists give the mixer at shape s under its plan, in MiB: kept per layer for
// the backward (mixer_saved_add), and the scratch all layers share (forward and backward parts, V' and O where the
// tensor-core scans make them again, the preconditioner's statistic) counted without the trainer's overlays, so an
// upper bound; the preconditioner's chunk-start statistic is kept. Sizes only: nothing is allocated.
static void mixer_mib(const ChunkShape& s, int precond, double* kept, double* shared) {
    MixerPlan p = mixer_plan(s);
    Arena a, b;
    MixerSaved sv;
    MixerScratch sc;
    mixer_saved_add(a, &sv, s, p);
    mixer_scratch_add(b, &sc, s, precond, p);
    mixer_scratch_grads_add(b, &sc, s, p);
    long rows = s.nq * s.C;
    floatX *vn, *o;
    float *astat, *carry;
    if (p.scan_wmma) { b.add(&vn, rows * s.V); b.add(&o, rows * s.V); }
    if (precond) { b.add(&astat, rows * s.K); a.add(&carry, s.nq * s.K); } // the layer keeps the chunk-start statistic
    *kept = a.pending() / 1048576.0;
    *shared = b.pending() / 1048576.0;
}

static void bench(int version_sel) {
#ifndef ENABLE_FP32
    lab_groups = -1; // v3: the trainer's rule
#endif
    // the paper's Fig. 4 (one sequence, T = 2048 ... 16384), then the training micro-batch 16 x 2048 (512 scan blocks)
    const int H = 8, K = 128, V = 128, NSH = 5;
    const int Bs[NSH] = {1, 1, 1, 1, 16}, Ts[NSH] = {2048, 4096, 8192, 16384, 2048};
    ChunkShape smax{2, H, 16384, 16384, CHUNK, 16384 / CHUNK, K, V, K, (long)2 * H * (16384 / CHUNK), nullptr}; // as many rows
    DeltaDev d{};
    delta_dev_alloc(d, smax, 1);
    long rows = smax.nq * CHUNK;
    lab_fill(d.q, rows * K, FILL_NORMAL, 0.0f, 1.0f, 11);
    lab_l2norm_rows(d.q, rows, K, 1.0f / sqrtf((float)K));
    lab_fill(d.k, rows * K, FILL_NORMAL, 0.0f, 1.0f, 12);
    lab_l2norm_rows(d.k, rows, K, 1.0f);
    lab_fill(d.v, rows * V, FILL_NORMAL, 0.0f, 1.0f, 13);
    lab_fill(d.dO, rows * V, FILL_NORMAL, 0.0f, 1.0f, 14);
    lab_fill(d.beta, rows, FILL_SIGMOID, 0.0f, 1.0f, 15);
    lab_fill(d.g, rows * K, FILL_NEG_SOFTPLUS, -2.0f, 1.5f, 16);
    lab_fill(d.gp, rows, FILL_NEG_SOFTPLUS, -2.0f, 1.5f, 17);
    lab_fill(d.bp, rows, FILL_SIGMOID, 0.0f, 1.0f, 18);
    lab_fill(d.las, H, FILL_UNIFORM, -0.4f, 0.0f, 19);
    cudaCheck(cudaMemset(d.dlas, 0, H * sizeof(float)));
    cudaCheck(cudaDeviceSynchronize());
    struct Var { const char* name; int gk, precond; };
    const Var vars[6] = {{"dn", 0, 0}, {"pdn", 0, 1}, {"gdn", 1, 0}, {"pgdn", 1, 1}, {"kda", K, 0}, {"pkda", K, 1}};
    printf("\n=== timing: delta_chunk (%s), H=%d K=V=%d chunk %d; p*: + diagonal preconditioner scan ===\n",
           PRECISION_NAME, H, K, CHUNK);
    printf("(MiB: the mixer's device memory under the trainer's plan for the shape, kept per layer / shared scratch, "
           "mixer_mib; inputs and gradients not counted)\n");
    printf("%-18s %-6s %4s %6s %10s %12s %14s %14s\n", "version", "variant", "B", "T", "fwd ms", "fwd+bwd ms", "fwd+bwd Mtok/s",
           "MiB layer/all");
    for (int v = 1; v <= NVERSIONS; v++) {
        if (version_sel && v != version_sel) { continue; }
        for (const Var& var : vars) {
            for (int i = 0; i < NSH; i++) {
                int B = Bs[i], T = Ts[i];
                ChunkShape s{B, H, T, T, CHUNK, T / CHUNK, K, V, var.gk, (long)B * H * (T / CHUNK), nullptr};
                if (!select_version(v, s)) {
                    printf("%-18s %-6s %4d %6d   (does not run at this shape)\n", VERSION_NAME[v], var.name, B, T);
                    continue;
                }
                const floatX* kt = var.precond ? d.kt : d.k;
                auto fwd = [&] { delta_forward(d, s, kt, var.precond); };
                auto fwdbwd = [&] { delta_forward(d, s, kt, var.precond); delta_backward(d, s, kt, !var.precond, var.precond); };
                double tf = bench_ms(fwd), tfb = bench_ms(fwdbwd), kept, shared;
                mixer_mib(s, var.precond, &kept, &shared);
                printf("%-18s %-6s %4d %6d %10.3f %12.3f %14.2f %7.0f / %-6.0f\n", VERSION_NAME[v], var.name, B, T, tf, tfb,
                       (double)B * T / tfb / 1e3, kept, shared);
                fflush(stdout);
            }
        }
    }
#ifndef ENABLE_FP32
    if (!version_sel || version_sel == 2) { // the V'/O remake alone, every choice (gdn; the remake does not see the decay)
        printf("\n=== timing: the V'/O remake alone (state_outputs_wmma), gdn, H=%d K=V=%d; the plan's default: ", H, K);
        OutsPlan def = outs_plan_for(CHUNK, K, V);
        printf("%d columns, %d stages, %d warps ===\n", def.bw, def.ns, def.nw);
        printf("%4s %6s %8s %7s %6s %10s %8s\n", "B", "T", "columns", "stages", "warps", "ms", "GB/s");
        for (int i = 0; i < NSH; i++) {
            int B = Bs[i], T = Ts[i];
            if (T < 8192 && B == 1) { continue; }
            ChunkShape s{B, H, T, T, CHUNK, T / CHUNK, K, V, 1, (long)B * H * (T / CHUNK), nullptr};
            select_version(2, s);
            delta_forward(d, s, d.k, 0);
            mixer_remake(&d.sv, &d.sc, d.q, d.k, d.k, d.v, d.beta, d.g, s);
            // bytes read and written once: W, Qg, U, the states, P; V', O
            double gb = ((double)s.nq * CHUNK * (2 * K + V) + (double)s.nq * K * V + (double)s.nq * CHUNK * CHUNK +
                         2.0 * s.nq * CHUNK * V) * sizeof(floatX) / 1e9;
            for (OutsPlan o : OUTS_LAB) {
                outs_force = o;
                OutsPlan op = mixer_plan(s).outs;
                outs_force = OutsPlan{0, 0, 0};
                if (!op.nw) { continue; }
                double t = bench_ms([&] { state_outputs_wmma(d.sv.Vn, d.sv.O, d.sv.hstate, d.sc.W, d.sc.U, d.sc.Qg, d.sv.P, s, op); });
                printf("%4d %6d %8d %7d %6d %10.3f %8.0f\n", B, T, op.bw, op.ns, op.nw, t, gb / t * 1e3);
                fflush(stdout);
            }
        }
    }
#endif
    printf("\n");
    d.ar.release();
}

#ifndef LAB_NO_MAIN
int main(int argc, char** argv) {
    LabArgs a = lab_args(argc, argv, NVERSIONS);
    lab_setup();
    double t0 = wall_seconds();
    if (a.validate) {
        printf("\n=== validation: delta_chunk (%s) vs the per-token recurrence in double; B=2 H=2 T=200, chunk %d (and 32, "
               "16 at K=V=128: the tile loops at other --chunk values) ===\n", PRECISION_NAME, CHUNK);
        uint64_t seed = 1;
        for (int K : {64, 128, 256}) { // 256: the largest head the tensor-core kernels take (issue 13's head sizes)
            for (int gk_kind = 0; gk_kind < 3; gk_kind++) {
                for (int two_keys = 1; two_keys >= 0; two_keys--) { validate_case(a.version, CHUNK, K, gk_kind, two_keys, 0, seed++); }
            }
        }
        for (int C : {32, 16}) {
            for (int gk_kind = 0; gk_kind < 3; gk_kind++) {
                for (int two_keys = 1; two_keys >= 0; two_keys--) { validate_case(a.version, C, 128, gk_kind, two_keys, 0, seed++); }
            }
        }
        // packed documents (--doc-mask 1): boundaries at chunks' first, second and last rows and three in a row
        for (int C : {64, 32, 16}) {
            for (int K : {64, 128}) {
                if (C != CHUNK && K != 128) { continue; }
                for (int gk_kind = 0; gk_kind < 3; gk_kind++) {
                    for (int two_keys = 1; two_keys >= 0; two_keys--) { validate_case(a.version, C, K, gk_kind, two_keys, 1, seed++); }
                }
            }
        }
        printf("validation took %.1f s\n", wall_seconds() - t0);
    }
    if (a.bench) { bench(a.version); }
    return lab_finish("delta_chunk");
}
#endif
