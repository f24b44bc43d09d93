/*
pdn.h: the model definition shared by train_pdn.c (CPU reference) and train_pdn.cu (CUDA trainer).
defines:
- PdnConfig and its field table PDN_CONFIG_FIELDS: every model knob once, used by the command line,
  the checkpoint header and the boxed printout
- the presets (MODEL.md §7 for the paper's sizes, plus tiny/small ones for CPU work)
- the parameter layout: one table of tensors (name, shape, offset, weight-decay flag, init) derived from the
  config. Every tensor lives in one flat buffer at its offset; per-layer tensors are stacked with a leading L.
- parameter initialisation (MODEL.md §6), deterministic per tensor
- the checkpoint file (self-describing text header + raw parameters, CRC-32, atomic write)
The math of the model is in train_pdn.c and MODEL.md.
*/
#ifndef PDN_H
#define PDN_H

#include <stddef.h>
#include <ctype.h>
#include "utils.h"

// the element type of the CPU reference: fp32, or fp64 in the gradient-check build (-DPDN_DOUBLE)
#ifdef PDN_DOUBLE
typedef double real;
#define REAL_DTYPE "f64"
#else
typedef float real;
#define REAL_DTYPE "f32"
#endif

// ----------------------------------------------------------------------------------------------------
// configuration

enum { DECAY_NONE = 0, DECAY_SCALAR = 1, DECAY_CHANNEL = 2 };      // the D of DGPS
enum { PRECOND_NONE = 0, PRECOND_DIAG = 1, PRECOND_EXACT = 2 };    // the P of DGPS
static const char* DECAY_NAMES[] = {"none", "scalar", "channel", NULL};
static const char* PRECOND_NAMES[] = {"none", "diag", "exact", NULL};

// the layers that are softmax attention (issue 19) instead of the recurrent mixer: a set of layer indices
typedef struct { uint64_t w[1024 / 64]; } PdnLayerSet;   // bit l: layer l (PDN_MAX_LAYERS = 1024 below)
static int layerset_has(const PdnLayerSet* s, int l) { return (int)((s->w[l >> 6] >> (l & 63)) & 1); }
static int layerset_count(const PdnLayerSet* s) {
    int n = 0;
    for (int l = 0; l < 1024; l++) { n += layerset_has(s, l); }
    return n;
}

// X(type, field, flag, help). type: I int, F float, D decay enum, P precond enum, A a layer set.
#define PDN_CONFIG_FIELDS(X) \
    X(I, vocab_size,         "--vocab",        "vocabulary size (0: take it from the data)") \
    X(I, d_model,            "--d-model",      "model width d") \
    X(I, n_layer,            "--n-layer",      "number of layers L") \
    X(I, n_head,             "--n-head",       "number of heads H") \
    X(I, head_k,             "--head-dim",     "key head dim K") \
    X(I, expand_v,           "--expand-v",     "value head dim V = K * expand_v") \
    X(I, mlp_hidden,         "--mlp-hidden",   "MLP width I (0: 256*ceil(floor(8d/3)/256))") \
    X(I, conv_size,          "--conv-size",    "short convolution kernel size") \
    X(I, tie_embeddings,     "--tie",          "1: logits use wte, 0: separate lm_head") \
    X(D, decay,              "--decay",        "decay: none | scalar | channel") \
    X(P, precond,            "--precond",      "preconditioner: none | diag | exact") \
    X(I, out_gate,           "--out-gate",     "1: sigmoid output gate (KDA style)") \
    X(I, neg_eigval,         "--neg-eigval",   "1: allow_neg_eigval, beta in (0, 2)") \
    X(F, norm_eps,           "--norm-eps",     "RMSNorm epsilon") \
    X(F, squash_x,           "--squash-x",     "diag preconditioner bound x: b in (1/x, x)") \
    X(F, precond_eps,        "--precond-eps",  "epsilon inside log(a + eps)") \
    X(F, log_atk_scale_init, "--log-atk-scale-init", "initial log_atk_scale c") \
    X(F, a_log_lo,           "--a-log-lo",     "A_log init: log U(lo, 16)") \
    X(F, ridge,              "--ridge",        "exact preconditioner ridge lambda (P_0 = I/lambda)") \
    X(A, attn_layers,        "--attn-layers",  "layers that are softmax attention: LIST of indices (5,11,17,23) or none") \
    X(I, attn_heads,         "--attn-heads",   "attention query heads (0: --n-head); head dim = d_model / heads") \
    X(I, attn_kv_heads,      "--attn-kv-heads", "attention key/value heads, grouped-query (0: --attn-heads)") \
    X(I, attn_window,        "--attn-window",  "attention sliding window in tokens, itself included (0: full causal)") \
    X(F, rope_theta,         "--rope-theta",   "rotary embedding base of the attention layers")

#define PDN_CTYPE_I int
#define PDN_CTYPE_F float
#define PDN_CTYPE_D int
#define PDN_CTYPE_P int
#define PDN_CTYPE_A PdnLayerSet
#define PDN_DECLARE_FIELD(type, field, flag, help) PDN_CTYPE_##type field;

typedef struct {
    PDN_CONFIG_FIELDS(PDN_DECLARE_FIELD)
} PdnConfig;

typedef struct { const char* name; const char* flag; const char* help; char type; size_t offset; } PdnField;
#define PDN_FIELD_ENTRY(type, field, flag, help) {#field, flag, help, #type[0], offsetof(PdnConfig, field)},
static const PdnField PDN_FIELDS[] = { PDN_CONFIG_FIELDS(PDN_FIELD_ENTRY) };
#define PDN_NUM_FIELDS ((int)(sizeof(PDN_FIELDS) / sizeof(PDN_FIELDS[0])))

static int pdn_head_v(const PdnConfig* c) { return c->head_k * c->expand_v; }
static int pdn_is_attn(const PdnConfig* c, int l) { return layerset_has(&c->attn_layers, l); }
// the attention layers' head dim (fla's Attention: hidden_size / num_heads) and key/value width
static int pdn_attn_head_dim(const PdnConfig* c) { return c->attn_heads ? c->d_model / c->attn_heads : 0; }
static int pdn_attn_kv_dim(const PdnConfig* c) { return c->attn_kv_heads * pdn_attn_head_dim(c); }

// the longest text of a field: a layer set of 1024 layers as "0,1,...,1023"
#define PDN_VALUE_MAX 5120
// the log-decay's width per head: none 0, scalar 1, channel K
static int pdn_decay_width(const PdnConfig* c) { return c->decay == DECAY_NONE ? 0 : c->decay == DECAY_SCALAR ? 1 : c->head_k; }

// MODEL.md §2: I = 256 * ceil(floor(d * 4 * 2/3) / 256)
static int pdn_default_mlp_hidden(int d) {
    int h = (d * 8) / 3;
    return 256 * ((h + 255) / 256);
}

static int enum_lookup(const char* const* names, const char* s) {
    for (int i = 0; names[i]; i++) { if (strcmp(names[i], s) == 0) { return i; } }
    return -1;
}

// Set one field from text; returns 0 on success, -1 on a bad value (the caller reports it).
static int pdn_field_set(PdnConfig* c, const PdnField* f, const char* val) {
    char* end = NULL;
    void* p = (char*)c + f->offset;
    if (f->type == 'I') {
        long v = strtol(val, &end, 10);
        if (end == val || *end != 0 || v < -1000000000L || v > 1000000000L) { return -1; }
        *(int*)p = (int)v;
    } else if (f->type == 'F') {
        float v = strtof(val, &end);
        if (end == val || *end != 0 || !isfinite(v)) { return -1; }
        *(float*)p = v;
    } else if (f->type == 'A') {
        // "none" (or empty), else indices separated by commas, each in 0..1023 and given once
        PdnLayerSet s;
        memset(&s, 0, sizeof s);
        if (strcmp(val, "none") != 0 && val[0]) {
            const char* q = val;
            for (;;) {
                if (!isdigit((unsigned char)*q)) { return -1; }
                long l = strtol(q, &end, 10);
                if (l < 0 || l >= 1024 || layerset_has(&s, (int)l)) { return -1; }
                s.w[l >> 6] |= 1ull << (l & 63);
                if (*end == 0) { break; }
                if (*end != ',') { return -1; }
                q = end + 1;
            }
        }
        *(PdnLayerSet*)p = s;
    } else {
        int v = enum_lookup(f->type == 'D' ? DECAY_NAMES : PRECOND_NAMES, val);
        if (v < 0) { return -1; }
        *(int*)p = v;
    }
    return 0;
}

// Text form of one field (for the checkpoint header and the printout). Floats use %.9g: exact round trip.
static void pdn_field_str(const PdnConfig* c, const PdnField* f, char* out, size_t n) {
    const void* p = (const char*)c + f->offset;
    if (f->type == 'I') { snprintf(out, n, "%d", *(const int*)p); }
    else if (f->type == 'F') { snprintf(out, n, "%.9g", *(const float*)p); }
    else if (f->type == 'D') { snprintf(out, n, "%s", DECAY_NAMES[*(const int*)p]); }
    else if (f->type == 'A') {   // ascending, "none" when empty
        size_t len = 0;
        out[0] = 0;
        for (int l = 0; l < 1024; l++) {
            if (layerset_has((const PdnLayerSet*)p, l) && len < n) { len += snprintf(out + len, n - len, len ? ",%d" : "%d", l); }
        }
        if (!len) { snprintf(out, n, "none"); }
    }
    else { snprintf(out, n, "%s", PRECOND_NAMES[*(const int*)p]); }
}

// the variant's short name: dn pdn gdn pgdn kda pkda, with suffixes for off-paper combinations
static void pdn_variant_name(const PdnConfig* c, char* out, size_t n) {
    const char* base = c->decay == DECAY_NONE ? "dn" : c->decay == DECAY_SCALAR ? "gdn" : "kda";
    int std_gate = c->decay == DECAY_CHANNEL;
    snprintf(out, n, "%s%s%s%s%s", c->precond != PRECOND_NONE ? "p" : "", base,
             c->precond == PRECOND_EXACT ? "-exact" : "",
             c->out_gate != std_gate ? (c->out_gate ? "+gate" : "-gate") : "",
             c->neg_eigval ? "+neg" : "");
    int na = layerset_count(&c->attn_layers);
    if (na) { size_t l = strlen(out); snprintf(out + l, n > l ? n - l : 0, "+attn%d", na); }
}

static void pdn_config_defaults(PdnConfig* c) {
    memset(c, 0, sizeof(*c));
    c->vocab_size = 0; c->d_model = 64; c->n_layer = 2; c->n_head = 2; c->head_k = 32; c->expand_v = 1;
    c->mlp_hidden = 0; c->conv_size = 4; c->tie_embeddings = 1;
    c->decay = DECAY_SCALAR; c->precond = PRECOND_DIAG; c->out_gate = 0; c->neg_eigval = 0;
    c->norm_eps = 1e-6f; c->squash_x = 1.5f; c->precond_eps = 1e-6f; c->log_atk_scale_init = -0.2f;
    c->a_log_lo = 0.0f; c->ridge = 1.0f;
    c->attn_heads = 0; c->attn_kv_heads = 0; c->attn_window = 0; c->rope_theta = 10000.0f;   // no attention layers
}

// ----------------------------------------------------------------------------------------------------
// presets: NAME = variant-size, e.g. pgdn-340m. Sizes: tiny and small for CPU work, 340m and 1b from MODEL.md §7.

typedef struct { const char* name; int decay, precond, out_gate; } PdnVariant;
static const PdnVariant PDN_VARIANTS[] = {
    {"dn", DECAY_NONE, PRECOND_NONE, 0},      {"pdn", DECAY_NONE, PRECOND_DIAG, 0},
    {"gdn", DECAY_SCALAR, PRECOND_NONE, 0},   {"pgdn", DECAY_SCALAR, PRECOND_DIAG, 0},
    {"kda", DECAY_CHANNEL, PRECOND_NONE, 1},  {"pkda", DECAY_CHANNEL, PRECOND_DIAG, 1},
};
#define PDN_NUM_VARIANTS 6

typedef struct { const char* name; int d, H, K, L, vocab, paper; } PdnSize;
static const PdnSize PDN_SIZES[] = {
    {"tiny", 64, 2, 32, 2, 0, 0},
    {"small", 128, 4, 32, 4, 0, 0},
    {"340m", 1024, 8, 128, 24, 32000, 1},
    {"1b", 1792, 14, 128, 24, 32000, 1},
};
#define PDN_NUM_SIZES 4

static int pdn_variant_apply(PdnConfig* c, const char* name) {
    for (int i = 0; i < PDN_NUM_VARIANTS; i++) {
        if (strcmp(PDN_VARIANTS[i].name, name) == 0) {
            c->decay = PDN_VARIANTS[i].decay; c->precond = PDN_VARIANTS[i].precond;
            c->out_gate = PDN_VARIANTS[i].out_gate;
            return 0;
        }
    }
    return -1;
}

// Apply a preset to the model config. Returns the size entry (so the caller can apply the paper's training
// recipe for paper sizes) or NULL if the name is unknown. NAME-hybrid (pgdn-340m-hybrid) makes every sixth layer
// softmax attention (5, 11, 17, 23 of 24; the last layer of a model under 6 layers) with the model's head count.
static const PdnSize* pdn_preset_apply(PdnConfig* c, const char* name) {
    const char* dash = strchr(name, '-');
    if (!dash || dash - name >= 16) { return NULL; }
    char var[16], size[32];
    memcpy(var, name, dash - name);
    var[dash - name] = 0;
    snprintf(size, sizeof size, "%s", dash + 1);
    size_t sl = strlen(size);
    int hybrid = sl > 7 && strcmp(size + sl - 7, "-hybrid") == 0;
    if (hybrid) { size[sl - 7] = 0; }
    for (int s = 0; s < PDN_NUM_SIZES; s++) {
        const PdnSize* sz = &PDN_SIZES[s];
        if (strcmp(sz->name, size) != 0) { continue; }
        if (pdn_variant_apply(c, var) != 0) { return NULL; }
        c->d_model = sz->d; c->n_head = sz->H; c->head_k = sz->K; c->n_layer = sz->L;
        c->vocab_size = sz->vocab; c->expand_v = 1; c->mlp_hidden = 0; c->conv_size = 4;
        c->tie_embeddings = 1; c->neg_eigval = 0; c->norm_eps = 1e-6f; c->squash_x = 1.5f;
        c->precond_eps = 1e-6f; c->log_atk_scale_init = -0.2f; c->a_log_lo = 0.0f;
        // MODEL.md §7: the 1b KDA and PKDA use K = 120 (14 heads x 120 keeps the parameter count near GDN's)
        if (strcmp(sz->name, "1b") == 0 && c->decay == DECAY_CHANNEL) { c->head_k = 120; }
        memset(&c->attn_layers, 0, sizeof c->attn_layers);
        c->attn_heads = 0; c->attn_kv_heads = 0; c->attn_window = 0; c->rope_theta = 10000.0f;
        for (int l = 0; hybrid && l < sz->L; l++) {
            if (sz->L < 6 ? l == sz->L - 1 : l % 6 == 5) { c->attn_layers.w[l >> 6] |= 1ull << (l & 63); }
        }
        return sz;
    }
    return NULL;
}

static void pdn_list_presets(FILE* f) {
    fprintf(f, "presets:");
    for (int s = 0; s < PDN_NUM_SIZES; s++) {
        fprintf(f, "\n ");
        for (int v = 0; v < PDN_NUM_VARIANTS; v++) { fprintf(f, " %s-%s", PDN_VARIANTS[v].name, PDN_SIZES[s].name); }
    }
    fprintf(f, "\n  any of them + -hybrid (pgdn-340m-hybrid): every sixth layer softmax attention (see --attn-layers)\n");
}

// Upper bounds of the dimensions, far above any model this code trains (the paper's largest: vocab 32000, d 1792,
// 24 layers, 14 heads of 128, MLP 4864), so that every product of dimensions the code forms fits: H*K and H*V in
// an int, a tensor (vocab x d, L x I x d) and the activations of a micro-batch (PDN_MAX_TOKENS tokens) in 64 bits.
// They hold for the flags and for a checkpoint's header alike (both go through pdn_config_check).
#define PDN_MAX_VOCAB (1 << 24)
#define PDN_MAX_D_MODEL 65536
#define PDN_MAX_LAYERS 1024
#define PDN_MAX_HEADS 1024
#define PDN_MAX_HEAD_DIM 1024
#define PDN_MAX_EXPAND_V 8
#define PDN_MAX_MLP (1 << 20)

// Fill derived fields and check that the configuration describes a model we can build.
// Returns NULL if fine, else a static message saying what to change.
static const char* pdn_config_check(PdnConfig* c) {
    static char msg[256];
    struct { const char* flag; int v, lo, hi; } dims[] = {
        {"--d-model", c->d_model, 1, PDN_MAX_D_MODEL}, {"--n-layer", c->n_layer, 1, PDN_MAX_LAYERS},
        {"--n-head", c->n_head, 1, PDN_MAX_HEADS}, {"--head-dim", c->head_k, 1, PDN_MAX_HEAD_DIM},
        {"--expand-v", c->expand_v, 1, PDN_MAX_EXPAND_V}, {"--mlp-hidden", c->mlp_hidden, 0, PDN_MAX_MLP},   // 0: from d
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        if (dims[i].v < dims[i].lo || dims[i].v > dims[i].hi) {
            snprintf(msg, sizeof msg, "%s must be in %d..%d (got %d)", dims[i].flag, dims[i].lo, dims[i].hi, dims[i].v);
            return msg;
        }
    }
    if (c->mlp_hidden == 0) { c->mlp_hidden = pdn_default_mlp_hidden(c->d_model); }
    if (c->vocab_size < 2 || c->vocab_size > PDN_MAX_VOCAB) {
        snprintf(msg, sizeof msg, "--vocab must be in 2..%d (got %d)", PDN_MAX_VOCAB, c->vocab_size);
        return msg;
    }
    if (c->conv_size < 1 || c->conv_size > 16) { snprintf(msg, sizeof msg, "--conv-size must be in 1..16"); return msg; }
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1) { snprintf(msg, sizeof msg, "--tie must be 0 or 1"); return msg; }
    if (c->out_gate != 0 && c->out_gate != 1) { snprintf(msg, sizeof msg, "--out-gate must be 0 or 1"); return msg; }
    if (c->neg_eigval != 0 && c->neg_eigval != 1) { snprintf(msg, sizeof msg, "--neg-eigval must be 0 or 1"); return msg; }
    if (!(c->norm_eps > 0) || !(c->precond_eps > 0)) { snprintf(msg, sizeof msg, "--norm-eps and --precond-eps must be > 0"); return msg; }
    if (!(c->squash_x > 1.0f)) { snprintf(msg, sizeof msg, "--squash-x must be > 1 (got %g)", c->squash_x); return msg; }
    if (!(c->ridge > 0)) { snprintf(msg, sizeof msg, "--ridge must be > 0"); return msg; }
    if (!(c->a_log_lo >= 0 && c->a_log_lo < 16)) { snprintf(msg, sizeof msg, "--a-log-lo must be in [0, 16)"); return msg; }
    // attention layers (issue 19): fla's Attention splits d_model into heads; GQA needs whole groups; the rotary
    // embedding rotates pairs (i, i + D/2), so the head dim is even
    for (int l = c->n_layer; l < PDN_MAX_LAYERS; l++) {
        if (pdn_is_attn(c, l)) { snprintf(msg, sizeof msg, "--attn-layers names layer %d, the model has %d (0..%d)", l, c->n_layer, c->n_layer - 1); return msg; }
    }
    if (c->attn_heads < 0 || c->attn_heads > PDN_MAX_HEADS || c->attn_kv_heads < 0 || c->attn_kv_heads > PDN_MAX_HEADS) {
        snprintf(msg, sizeof msg, "--attn-heads and --attn-kv-heads must be in 0..%d", PDN_MAX_HEADS);
        return msg;
    }
    if (c->attn_window < 0) { snprintf(msg, sizeof msg, "--attn-window must be >= 0 (0: full causal)"); return msg; }
    if (!(c->rope_theta > 0)) { snprintf(msg, sizeof msg, "--rope-theta must be > 0"); return msg; }
    if (layerset_count(&c->attn_layers)) {
        if (c->attn_heads == 0) { c->attn_heads = c->n_head; }
        if (c->attn_kv_heads == 0) { c->attn_kv_heads = c->attn_heads; }
        int D = c->d_model / c->attn_heads;
        if (c->d_model % c->attn_heads || D % 2) {
            snprintf(msg, sizeof msg, "--attn-heads %d must split --d-model %d into heads of an even size (got %d/%d)",
                     c->attn_heads, c->d_model, c->d_model, c->attn_heads);
            return msg;
        }
        if (c->attn_heads % c->attn_kv_heads) {
            snprintf(msg, sizeof msg, "--attn-kv-heads %d must divide --attn-heads %d (grouped-query attention)",
                     c->attn_kv_heads, c->attn_heads);
            return msg;
        }
    }
    return NULL;
}

// The eigenvalue argument of the paper (App. E.3) needs beta * x <= 2 for the diagonal preconditioner.
static int pdn_eigen_bound_broken(const PdnConfig* c) {
    return c->precond == PRECOND_DIAG && (c->neg_eigval ? 2.0f : 1.0f) * c->squash_x > 2.0f;
}

// ----------------------------------------------------------------------------------------------------
// the parameter layout, defined once

enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS, INIT_ALOG, INIT_DTBIAS, INIT_LOGATK };

// X(id, name, per_layer, weight_decay, init). Order = order in the flat buffer (and the tensor's index seeds its
// init, so new tensors go at the end). per_layer: 0 one tensor for the model, 1 one slice per layer, 2 one per
// recurrent-mixer layer, 3 one per attention layer (issue 19: an attention layer has q/k/v/o projections in place
// of the mixer's tensors, and keeps its norms and MLP).
#define PDN_TENSORS(X) \
    X(WTE,           "wte",           0, 1, INIT_NORMAL) \
    X(ATTN_NORM,     "attn_norm",     1, 0, INIT_ONES)   \
    X(WQ,            "w_q",           2, 1, INIT_NORMAL) \
    X(WK,            "w_k",           2, 1, INIT_NORMAL) \
    X(WV,            "w_v",           2, 1, INIT_NORMAL) \
    X(CONV_Q,        "conv_q",        2, 0, INIT_NORMAL) \
    X(CONV_K,        "conv_k",        2, 0, INIT_NORMAL) \
    X(CONV_V,        "conv_v",        2, 0, INIT_NORMAL) \
    X(WB,            "w_b",           2, 1, INIT_NORMAL) \
    X(WA,            "w_a",           2, 1, INIT_NORMAL) \
    X(WF1,           "w_f1",          2, 1, INIT_NORMAL) \
    X(WF2,           "w_f2",          2, 1, INIT_NORMAL) \
    X(A_LOG,         "a_log",         2, 0, INIT_ALOG)   \
    X(DT_BIAS,       "dt_bias",       2, 0, INIT_DTBIAS) \
    X(WAP,           "w_ap",          2, 1, INIT_NORMAL) \
    X(WBP,           "w_bp",          2, 1, INIT_NORMAL) \
    X(A_LOGP,        "a_log_p",       2, 0, INIT_ALOG)   \
    X(DT_BIASP,      "dt_bias_p",     2, 0, INIT_DTBIAS) \
    X(LOG_ATK_SCALE, "log_atk_scale", 2, 0, INIT_LOGATK) \
    X(O_NORM,        "o_norm",        2, 0, INIT_ONES)   \
    X(WG1,           "w_g1",          2, 1, INIT_NORMAL) \
    X(WG2,           "w_g2",          2, 1, INIT_NORMAL) \
    X(BG2,           "b_g2",          2, 0, INIT_ZEROS)  \
    X(WO,            "w_o",           2, 1, INIT_NORMAL) \
    X(MLP_NORM,      "mlp_norm",      1, 0, INIT_ONES)   \
    X(WGATE,         "w_gate",        1, 1, INIT_NORMAL) \
    X(WUP,           "w_up",          1, 1, INIT_NORMAL) \
    X(WDOWN,         "w_down",        1, 1, INIT_NORMAL) \
    X(FINAL_NORM,    "final_norm",    0, 0, INIT_ONES)   \
    X(LM_HEAD,       "lm_head",       0, 1, INIT_NORMAL) \
    X(AQ,            "attn_wq",       3, 1, INIT_NORMAL) \
    X(AK,            "attn_wk",       3, 1, INIT_NORMAL) \
    X(AV,            "attn_wv",       3, 1, INIT_NORMAL) \
    X(AO,            "attn_wo",       3, 1, INIT_NORMAL)

#define PDN_TENSOR_ENUM(id, name, per_layer, wd, init) T_##id,
enum { PDN_TENSORS(PDN_TENSOR_ENUM) NUM_TENSORS };

typedef struct {
    const char* name;
    int per_layer, wd, init;
    int ndim;
    int shape[3];        // full shape: (layers, rows, cols) for per-layer tensors, (rows, cols) or (n) otherwise
    size_t layer_numel;  // elements of one layer's slice (of the whole tensor if global)
    size_t numel;        // elements of the tensor; 0 if this variant does not have it
    size_t offset;       // start in the flat buffer, in elements
} PdnTensor;

typedef struct {
    PdnTensor t[NUM_TENSORS];
    size_t num_params;   // sum of numel: the model's parameter count
    size_t num_elems;    // size of the flat buffer (tensors start at multiples of PDN_ALIGN elements)
    int n_mix, n_attn;   // recurrent-mixer and attention layers
    int slot[PDN_MAX_LAYERS];  // layer l's index among the layers of its kind (its slice of a per_layer 2 or 3 tensor)
} PdnLayout;

// tensors start on 64-byte boundaries (16 fp32 / 32 bf16 elements) so the GPU can use wide loads
#define PDN_ALIGN 32

// Per-layer shape (rows, cols) of each tensor for this config; rows = 0 means the variant lacks it.
static void pdn_tensor_shape(const PdnConfig* c, int id, int* rows, int* cols) {
    int d = c->d_model, H = c->n_head, K = c->head_k, V = pdn_head_v(c), I = c->mlp_hidden;
    int HK = H * K, HV = H * V, cs = c->conv_size;
    int scalar = c->decay == DECAY_SCALAR, channel = c->decay == DECAY_CHANNEL, diag = c->precond == PRECOND_DIAG;
    int r = 0, k = 0; // k = 0 for vectors
    switch (id) {
        case T_WTE: r = c->vocab_size; k = d; break;
        case T_ATTN_NORM: case T_MLP_NORM: case T_FINAL_NORM: r = d; break;
        case T_WQ: case T_WK: r = HK; k = d; break;
        case T_WV: r = HV; k = d; break;
        case T_CONV_Q: case T_CONV_K: r = HK; k = cs; break;
        case T_CONV_V: r = HV; k = cs; break;
        case T_WB: r = H; k = d; break;
        case T_WA: if (scalar) { r = H; k = d; } break;
        case T_WF1: if (channel) { r = V; k = d; } break;
        case T_WF2: if (channel) { r = HK; k = V; } break;
        case T_A_LOG: if (scalar || channel) { r = H; } break;
        case T_DT_BIAS: r = scalar ? H : channel ? HK : 0; break;
        case T_WAP: case T_WBP: if (diag) { r = H; k = d; } break;
        case T_A_LOGP: case T_DT_BIASP: case T_LOG_ATK_SCALE: if (diag) { r = H; } break;
        case T_O_NORM: r = V; break;
        case T_WG1: if (c->out_gate) { r = V; k = d; } break;
        case T_WG2: if (c->out_gate) { r = HV; k = V; } break;
        case T_BG2: if (c->out_gate) { r = HV; } break;
        case T_WO: r = d; k = HV; break;
        case T_WGATE: case T_WUP: r = I; k = d; break;
        case T_WDOWN: r = d; k = I; break;
        case T_LM_HEAD: if (!c->tie_embeddings) { r = c->vocab_size; k = d; } break;
        case T_AQ: case T_AO: r = d; k = d; break;          // fla: q_proj (d, d), o_proj (d, d)
        case T_AK: case T_AV: r = pdn_attn_kv_dim(c); k = d; break;   // k_proj, v_proj (kv_heads * D, d)
    }
    *rows = r; *cols = k;
}

static void pdn_build_layout(const PdnConfig* c, PdnLayout* lay) {
    static const char* names[] = {
#define PDN_TENSOR_NAME(id, name, per_layer, wd, init) name,
        PDN_TENSORS(PDN_TENSOR_NAME)
    };
    static const int flags[][3] = {
#define PDN_TENSOR_FLAGS(id, name, per_layer, wd, init) {per_layer, wd, init},
        PDN_TENSORS(PDN_TENSOR_FLAGS)
    };
    memset(lay, 0, sizeof(*lay));
    for (int l = 0; l < c->n_layer; l++) { lay->slot[l] = pdn_is_attn(c, l) ? lay->n_attn++ : lay->n_mix++; }
    size_t off = 0;
    for (int i = 0; i < NUM_TENSORS; i++) {
        PdnTensor* t = &lay->t[i];
        t->name = names[i];
        t->per_layer = flags[i][0]; t->wd = flags[i][1]; t->init = flags[i][2];
        int rows, cols;
        pdn_tensor_shape(c, i, &rows, &cols);
        t->layer_numel = mulCheck((size_t)rows, (size_t)(cols ? cols : 1), names[i]);
        size_t nl = t->per_layer == 0 ? 1 : t->per_layer == 1 ? (size_t)c->n_layer : t->per_layer == 2 ? (size_t)lay->n_mix
                  : (size_t)lay->n_attn;
        t->numel = rows && nl ? mulCheck(nl, t->layer_numel, names[i]) : 0;
        t->ndim = 0;
        if (t->per_layer) { t->shape[t->ndim++] = (int)nl; }
        t->shape[t->ndim++] = rows;
        if (cols) { t->shape[t->ndim++] = cols; }
        off = (off + PDN_ALIGN - 1) / PDN_ALIGN * PDN_ALIGN;
        t->offset = off;
        off += t->numel;
        lay->num_params += t->numel;
    }
    lay->num_elems = (off + PDN_ALIGN - 1) / PDN_ALIGN * PDN_ALIGN;
}

// pointer to layer l's slice of tensor id inside a flat buffer (l = 0 for a model-wide tensor); a mixer tensor of
// an attention layer, or the reverse, does not exist
static size_t pdn_slice(const PdnLayout* lay, int id, int l) {
    const PdnTensor* t = &lay->t[id];
    return t->offset + (t->per_layer == 0 ? 0 : t->per_layer == 1 ? (size_t)l : (size_t)lay->slot[l]) * t->layer_numel;
}
#define PDN_PARAM(buf, lay, id, l) ((buf) + pdn_slice(lay, id, l))
// whether layer l has a slice of tensor t (a per-layer tensor of its kind)
static int pdn_layer_has(const PdnConfig* c, const PdnTensor* t, int l) {
    return t->numel && (t->per_layer == 1 || (t->per_layer == 2 && !pdn_is_attn(c, l)) || (t->per_layer == 3 && pdn_is_attn(c, l)));
}

// ----------------------------------------------------------------------------------------------------
// initialisation (MODEL.md §6). Each tensor draws from its own stream seeded by (seed, tensor index), so a
// tensor's initial values do not depend on which other tensors the variant has.

static void pdn_init_params(const PdnConfig* c, const PdnLayout* lay, real* params, uint64_t seed) {
    memset(params, 0, lay->num_elems * sizeof(real));
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &lay->t[i];
        if (t->numel == 0) { continue; }
        NormalRng nr;
        memset(&nr, 0, sizeof nr);
        rng_seed(&nr.rng, seed * 1000003ull + (uint64_t)i * 7919ull + 12345ull);
        real* p = params + t->offset;
        for (size_t j = 0; j < t->numel; j++) {
            double v = 0.0;
            switch (t->init) {
                case INIT_NORMAL: v = 0.02 * rng_normal(&nr); break;
                case INIT_ONES: v = 1.0; break;
                case INIT_ZEROS: v = 0.0; break;
                case INIT_ALOG: {
                    // A_log = log U(lo, 16); keep the draw away from 0 so log stays finite when lo = 0
                    double u = c->a_log_lo + (16.0 - c->a_log_lo) * rng_uniform(&nr.rng);
                    v = log(u < 1e-4 ? 1e-4 : u);
                    break;
                }
                case INIT_DTBIAS: {
                    // dt log-uniform in [1e-3, 1e-1], clamped >= 1e-4; dt_bias = softplus^-1(dt)
                    double u = rng_uniform(&nr.rng);
                    double dt = exp(u * (log(0.1) - log(0.001)) + log(0.001));
                    if (dt < 1e-4) { dt = 1e-4; }
                    v = dt + log(-expm1(-dt));
                    break;
                }
                case INIT_LOGATK: v = c->log_atk_scale_init; break;
            }
            p[j] = (real)v;
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// the checkpoint file
//
//   PDNCKPT                       <- magic line
//   version 1
//   header_bytes 0000004096       <- the parameters start at this byte (a multiple of 4096)
//   dtype f32                     <- f32 | f64 | bf16, little-endian
//   num_elems N                   <- elements stored (the flat buffer, alignment padding included, zeros)
//   num_params P
//   step S
//   config <field> <value>        <- one line per PDN_CONFIG_FIELDS entry
//   tensor <name> <shape AxBxC> offset <elements> wd <0|1>    <- one line per tensor present
//   crc32 XXXXXXXX                <- CRC-32 of every header byte before this line, then of the data
//   end
//   <zero padding up to header_bytes> <N elements of dtype>
//
// A reader rebuilds the layout from the config lines and requires the tensor lines to match it exactly.

#define PDN_CKPT_MAGIC "PDNCKPT"
#define PDN_STATE_MAGIC "PDNSTATE"
#define PDN_CKPT_VERSION 1
#define PDN_HEADER_ALIGN 4096

static size_t dtype_size(const char* dt) {
    if (strcmp(dt, "f32") == 0) { return 4; }
    if (strcmp(dt, "f64") == 0) { return 8; }
    if (strcmp(dt, "bf16") == 0) { return 2; }
    return 0;
}

static float bf16_to_float(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

// Finish a header: pad to a multiple of PDN_HEADER_ALIGN, patch the fixed-width header_bytes field.
// The header must contain "header_bytes 0000000000" (exactly ten digits) and end with "crc32 " + 8 hex + "end\n"
// placeholder written by the caller after computing the CRC; here we only pad and patch.
static size_t header_finish(TextBuf* tb) {
    size_t total = (tb->len + PDN_HEADER_ALIGN - 1) / PDN_HEADER_ALIGN * PDN_HEADER_ALIGN;
    char* hb = strstr(tb->s, "header_bytes ");
    char num[32];
    snprintf(num, sizeof num, "%010zu", total);
    memcpy(hb + 13, num, 10);
    while (tb->len < total) { tb_printf(tb, "%c", 0); }
    return total;
}

// The text-header file used for checkpoints, state and debug files: header lines in `tb` (without crc/end), then
// `nbuf` buffers of data. headed_finish adds the crc32 and end lines and the padding and returns the CRC (the state
// file records the model's CRC to pair the two files) and the header's size; headed_write_tmp writes the file to its
// temporary (atomic_try_*), returning 0 or an errno value with the temporary removed.
static uint32_t headed_finish(TextBuf* tb, const void* const* bufs, const size_t* nbytes, int nbuf, size_t* hbytes) {
    // the CRC covers the header text written so far (with header_bytes patched) and the data; the header size
    // depends on the crc line, so reserve it first with a fixed width and fill it in after computing the CRC
    size_t crc_pos = tb->len;
    tb_printf(tb, "crc32 00000000\nend\n");
    *hbytes = header_finish(tb);
    uint32_t crc = crc32_update(0, tb->s, crc_pos);
    for (int i = 0; i < nbuf; i++) { crc = crc32_update(crc, bufs[i], nbytes[i]); }
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", crc);
    memcpy(tb->s + crc_pos + 6, hex, 8);
    return crc;
}

static int headed_write_tmp(AtomicFile* af, const char* path, const TextBuf* tb, size_t hbytes, const void* const* bufs,
                            const size_t* nbytes, int nbuf) {
    int err = atomic_try_open(af, path);
    if (!err) { err = atomic_try_write(af, tb->s, hbytes); }
    for (int i = 0; i < nbuf && !err; i++) { err = atomic_try_write(af, bufs[i], nbytes[i]); }
    if (!err) { err = atomic_try_finish(af); }
    if (err) { atomic_discard(af); }
    return err;
}

// the whole file, atomically; fails (exit 4) naming it. Returns its CRC.
static uint32_t write_headed_file(const char* path, TextBuf* tb, const void* const* bufs, const size_t* nbytes, int nbuf) {
    size_t hbytes;
    uint32_t crc = headed_finish(tb, bufs, nbytes, nbuf, &hbytes);
    AtomicFile af;
    int err = headed_write_tmp(&af, path, tb, hbytes, bufs, nbytes, nbuf);
    if (!err) { err = atomic_try_rename(&af); }
    if (err) { atomic_fail(&af, err); }
    return crc;
}

// A parsed header: the text (NUL-terminated, padding cut) and where the data starts.
typedef struct { char* text; size_t header_bytes; size_t crc_pos; uint32_t crc; long long file_bytes; } Header;

// Find "key " at the start of a line; returns the rest of that line (up to '\n') copied into val.
static int header_get(const Header* h, const char* key, char* val, size_t n) {
    size_t kl = strlen(key);
    const char* p = h->text;
    while (p && *p) {
        if (strncmp(p, key, kl) == 0 && p[kl] == ' ') {
            const char* v = p + kl + 1;
            const char* e = strchr(v, '\n');
            size_t len = e ? (size_t)(e - v) : strlen(v);
            if (len >= n) { len = n - 1; }
            memcpy(val, v, len);
            val[len] = 0;
            return 1;
        }
        p = strchr(p, '\n');
        if (p) { p++; }
    }
    return 0;
}

static long long header_get_ll(const Header* h, const char* key, const char* path) {
    char v[64];
    char* end;
    if (!header_get(h, key, v, sizeof v)) { fail(EXIT_BADFILE, "%s: header has no '%s' line (corrupted file?)", path, key); }
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != 0) { fail(EXIT_BADFILE, "%s: bad value '%s' for '%s' in header", path, v, key); }
    return x;
}

// Read and check the header of a checkpoint or state file: magic, version, header size, crc line present.
static void header_read(FILE* f, const char* path, const char* magic, Header* h) {
    memset(h, 0, sizeof(*h));
    h->file_bytes = file_size(f);
    char first[128] = {0};
    size_t got = fread(first, 1, 100, f);
    size_t ml = strlen(magic);
    if (got < ml + 1 || memcmp(first, magic, ml) != 0 || first[ml] != '\n') {
        fail(EXIT_BADFILE, "%s: not a pdn %s file (bad magic; expected a first line '%s')", path,
             strcmp(magic, PDN_CKPT_MAGIC) == 0 ? "checkpoint" : strcmp(magic, PDN_STATE_MAGIC) == 0 ? "training-state" : "debug-state",
             magic);
    }
    int version = 0;
    char hb[32] = {0};
    if (sscanf(first + ml + 1, "version %d\nheader_bytes %20s", &version, hb) != 2) {
        fail(EXIT_BADFILE, "%s: header is corrupted (cannot read version and header_bytes)", path);
    }
    if (version != PDN_CKPT_VERSION) {
        fail(EXIT_BADFILE, "%s: file version %d, this build reads version %d", path, version, PDN_CKPT_VERSION);
    }
    h->header_bytes = (size_t)strtoull(hb, NULL, 10);
    if (h->header_bytes == 0 || h->header_bytes % PDN_HEADER_ALIGN || h->header_bytes > (64u << 20)) {
        fail(EXIT_BADFILE, "%s: header is corrupted (header_bytes %s)", path, hb);
    }
    if ((long long)h->header_bytes > h->file_bytes) {
        fail(EXIT_BADFILE, "%s: file is truncated (%lld bytes, its header alone is %zu)", path, h->file_bytes, h->header_bytes);
    }
    h->text = (char*)mallocCheck(h->header_bytes + 1);
    fseek(f, 0, SEEK_SET);
    freadCheck(h->text, 1, h->header_bytes, f, path);
    h->text[h->header_bytes] = 0;
    char* crcline = strstr(h->text, "\ncrc32 ");
    if (!crcline || !strstr(crcline, "\nend\n")) { fail(EXIT_BADFILE, "%s: header is corrupted (no crc32/end lines)", path); }
    h->crc_pos = (size_t)(crcline + 1 - h->text);
    h->crc = (uint32_t)strtoul(crcline + 7, NULL, 16);
}

// Read `nbytes` of data following the header into dst (streaming the CRC); fails on truncation or bad CRC.
// The caller passes the expected total data size so a truncated file is reported before any read.
static void headed_read_data(FILE* f, const char* path, Header* h, void* const* dsts, const size_t* nbytes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) { total += nbytes[i]; }
    if ((long long)(h->header_bytes + total) != h->file_bytes) {
        fail(EXIT_BADFILE, "%s: file size %lld bytes, header says %zu (file is %s)", path, h->file_bytes,
             h->header_bytes + total, (long long)(h->header_bytes + total) > h->file_bytes ? "truncated" : "too long");
    }
    uint32_t crc = crc32_update(0, h->text, h->crc_pos);
    fseek(f, (long)h->header_bytes, SEEK_SET);
    for (int i = 0; i < n; i++) {
        freadCheck(dsts[i], 1, nbytes[i], f, path);
        crc = crc32_update(crc, dsts[i], nbytes[i]);
    }
    if (crc != h->crc) {
        fail(EXIT_BADFILE, "%s: checksum mismatch (stored %08x, computed %08x): the file is corrupted", path, h->crc, crc);
    }
}

static void pdn_config_to_header(const PdnConfig* c, TextBuf* tb) {
    char v[PDN_VALUE_MAX];
    for (int i = 0; i < PDN_NUM_FIELDS; i++) {
        pdn_field_str(c, &PDN_FIELDS[i], v, sizeof v);
        tb_printf(tb, "config %s %s\n", PDN_FIELDS[i].name, v);
    }
}

static void pdn_config_from_header(PdnConfig* c, const Header* h, const char* path) {
    pdn_config_defaults(c);
    char key[80], v[PDN_VALUE_MAX];
    for (int i = 0; i < PDN_NUM_FIELDS; i++) {
        snprintf(key, sizeof key, "config %s", PDN_FIELDS[i].name);
        // checkpoints from before the attention layers (issue 19) have no attn_* / rope_theta lines: no attention
        int since_attn = strncmp(PDN_FIELDS[i].name, "attn_", 5) == 0 || strcmp(PDN_FIELDS[i].name, "rope_theta") == 0;
        if (!header_get(h, key, v, sizeof v)) {
            if (since_attn) { continue; }
            fail(EXIT_BADFILE, "%s: header lacks '%s'", path, key);
        }
        if (pdn_field_set(c, &PDN_FIELDS[i], v) != 0) { fail(EXIT_BADFILE, "%s: bad value '%s' for %s", path, v, key); }
    }
    const char* err = pdn_config_check(c);
    if (err) { fail(EXIT_BADFILE, "%s: stored config is invalid: %s", path, err); }
}

static void tensor_shape_str(const PdnTensor* t, char* out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int k = 0; k < t->ndim; k++) { len += snprintf(out + len, n - len, k ? "x%d" : "%d", t->shape[k]); }
}

// a checkpoint's header lines (before the crc32 line) into tb
static void pdn_checkpoint_header(TextBuf* tb, const PdnConfig* c, const PdnLayout* lay, const char* dtype, long step) {
    tb_printf(tb, "%s\nversion %d\nheader_bytes 0000000000\ndtype %s\nnum_elems %zu\nnum_params %zu\nstep %ld\n",
              PDN_CKPT_MAGIC, PDN_CKPT_VERSION, dtype, lay->num_elems, lay->num_params, step);
    pdn_config_to_header(c, tb);
    char shape[64];
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &lay->t[i];
        if (t->numel == 0) { continue; }
        tensor_shape_str(t, shape, sizeof shape);
        tb_printf(tb, "tensor %s %s offset %zu wd %d\n", t->name, shape, t->offset, t->wd);
    }
}

// Write a checkpoint of the parameters (`params` holds num_elems elements of `dtype`, "f32"/"f64"/"bf16").
// Returns its CRC.
static uint32_t pdn_checkpoint_write(const char* path, const PdnConfig* c, const PdnLayout* lay,
                                     const void* params, const char* dtype, long step) {
    TextBuf tb;
    memset(&tb, 0, sizeof tb);
    pdn_checkpoint_header(&tb, c, lay, dtype, step);
    const void* bufs[1] = {params};
    size_t nb[1] = {lay->num_elems * dtype_size(dtype)};
    uint32_t crc = write_headed_file(path, &tb, bufs, nb, 1);
    free(tb.s);
    return crc;
}

// The first element of a flat buffer (num_elems reals, the layout's order) that is not finite: its index, or -1.
// *tensor gets the name of the tensor holding it (NULL for alignment padding).
static long pdn_find_nonfinite(const PdnLayout* lay, const real* x, const char** tensor) {
    for (size_t i = 0; i < lay->num_elems; i++) {
        if (isfinite(x[i])) { continue; }
        *tensor = NULL;
        for (int k = 0; k < NUM_TENSORS; k++) {
            const PdnTensor* t = &lay->t[k];
            if (t->numel && i >= t->offset && i < t->offset + t->numel) { *tensor = t->name; }
        }
        return (long)i;
    }
    return -1;
}

// Read a checkpoint: config, layout (checked against the stored tensor table) and parameters converted to
// `real`. *params is allocated here. Returns the step stored; *crc_out (if not NULL) gets the file's CRC.
static long pdn_checkpoint_read(const char* path, PdnConfig* c, PdnLayout* lay, real** params, uint32_t* crc_out) {
    FILE* f = fopenCheck(path, "rb");
    Header h;
    header_read(f, path, PDN_CKPT_MAGIC, &h);
    pdn_config_from_header(c, &h, path);
    pdn_build_layout(c, lay);
    char dtype[16] = {0};
    if (!header_get(&h, "dtype", dtype, sizeof dtype) || dtype_size(dtype) == 0) {
        fail(EXIT_BADFILE, "%s: unknown dtype '%s' (expected f32, f64 or bf16)", path, dtype);
    }
    long long ne = header_get_ll(&h, "num_elems", path);
    if ((size_t)ne != lay->num_elems) {
        fail(EXIT_BADFILE, "%s: stores %lld elements but its config needs %zu (corrupted header?)", path, ne, lay->num_elems);
    }
    // the stored tensor table must be exactly the one this build derives from the config
    char key[96], want[160], got[160], shape[64];
    for (int i = 0; i < NUM_TENSORS; i++) {
        const PdnTensor* t = &lay->t[i];
        snprintf(key, sizeof key, "tensor %s", t->name);
        int present = header_get(&h, key, got, sizeof got);
        if (t->numel == 0) {
            if (present) { fail(EXIT_BADFILE, "%s: has tensor %s that its config does not use", path, t->name); }
            continue;
        }
        tensor_shape_str(t, shape, sizeof shape);
        snprintf(want, sizeof want, "%s offset %zu wd %d", shape, t->offset, t->wd);
        if (!present || strcmp(want, got) != 0) {
            fail(EXIT_BADFILE, "%s: tensor %s is '%s', this build expects '%s' (layout mismatch)", path, t->name,
                 present ? got : "missing", want);
        }
    }
    size_t es = dtype_size(dtype);
    void* raw = mallocCheck(lay->num_elems * es);
    void* dsts[1] = {raw};
    size_t nb[1] = {lay->num_elems * es};
    headed_read_data(f, path, &h, dsts, nb, 1);
    fclose(f);
    *params = (real*)mallocCheck(lay->num_elems * sizeof(real));
    for (size_t i = 0; i < lay->num_elems; i++) {
        if (es == 4) { (*params)[i] = (real)((float*)raw)[i]; }
        else if (es == 8) { (*params)[i] = (real)((double*)raw)[i]; }
        else { (*params)[i] = (real)bf16_to_float(((uint16_t*)raw)[i]); }
    }
    free(raw);
    // a diverged run's parameters (or ones this build's precision cannot hold) would only make NaNs
    const char* tname;
    long bad = pdn_find_nonfinite(lay, *params, &tname);
    if (bad >= 0) {
        fail(EXIT_BADFILE, "%s: parameter %s (flat element %ld) is %g: a checkpoint with non-finite values is refused "
             "(it comes from a run that diverged, or was edited)\n  hint: use an earlier checkpoint", path,
             tname ? tname : "(padding)", bad, (double)(*params)[bad]);
    }
    long step = (long)header_get_ll(&h, "step", path);
    if (crc_out) { *crc_out = h.crc; }
    free(h.text);
    return step;
}

#endif // PDN_H
