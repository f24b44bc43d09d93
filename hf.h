/*
hf.h: pdn.c checkpoints to and from the Hugging Face layout of fla (flash-linear-attention), Python-free.
defines:
- a small JSON reader (a node tree; duplicate keys refused) for config.json and safetensors headers
- the safetensors format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
  length N, N bytes of JSON {"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}
  (offsets relative to the byte after the header; the tensors tile the data without holes or overlaps), then
  the row-major data. st_write writes one; st_open validates one and st_read reads a tensor as fp32 from F32,
  BF16 or F16.
- the map from pdn.c's flat layout (pdn.h) to fla's state-dict keys and shapes, per variant (hf_tensors)
- config.json for fla's five classes (hf_write_config) and back (hf_read_config, with fla's defaults)
- the tokenizer files transformers needs (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)
- hf_export(DIR) and hf_import(DIR): what --export-hf and --import-hf run

Variants and fla classes (fla/models/<name>; checked against fla-org/flash-linear-attention bc3b101d):
  dn   -> delta_net               DeltaNetForCausalLM            (expand_k, expand_v are relative to hidden_size)
  gdn  -> gated_deltanet          GatedDeltaNetForCausalLM       (use_gate false: RMSNorm output, no g_proj)
  pgdn -> precond_gated_deltanet  PrecondGatedDeltaNetForCausalLM
  kda  -> kda                     KDAForCausalLM                 (its sigmoid output gate is pdn.c's --out-gate 1)
  pkda -> precond_kda             PrecondKDAForCausalLM
  kda, pkda with --out-gate 0 -> kda / precond_kda with the output gate held at exactly 1: g_proj's two weights 0
          and its bias 100, so the gate is sigmoid(100) = 1 / (1 + 3.7e-44), which is 1.0 in fp32 and bf16
  pdn  -> precond_gated_deltanet with the main decay held at exactly 1: fla's layer computes
          g = -exp(A_log) * softplus(a_proj(x) + dt_bias) in fp32 (layers/precond_gated_deltanet.py), so A_log = -inf
          gives exp(A_log) = 0, g = -0 and exp(g) = 1 exactly for every token, whatever a_proj and dt_bias hold (we
          write them as zeros). -inf survives bf16, AdamW's decoupled decay (a product) and a zero gradient. An import
          of a precond_gated_deltanet whose A_log are all -inf gives pdn back.
*/
#ifndef PDN_HF_H
#define PDN_HF_H

#include <stdint.h>
#include "pdn.h"
#include "tokenizer.h"

// ----------------------------------------------------------------------------------------------------
// 16-bit floats

// fp32 -> bf16, rounding to nearest, ties to even (NaN stays a quiet NaN)
static uint16_t float_to_bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) { return (uint16_t)((u >> 16) | 0x40); }
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// IEEE half -> fp32, exact (subnormals, infinities, NaN)
static float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF, u;
    if (e == 0x1F) { u = sign | 0x7F800000u | (m << 13); }
    else if (e) { u = sign | ((e + 112) << 23) | (m << 13); }
    else if (!m) { u = sign; }
    else {   // subnormal: m * 2^-24, normalised
        int s = 0;
        while (!(m & 0x400)) { m <<= 1; s++; }
        u = sign | ((uint32_t)(113 - s) << 23) | ((m & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ----------------------------------------------------------------------------------------------------
// JSON reader: the text becomes a tree of nodes (children linked by index). Errors are returned, not fatal, so
// that a caller can name the file and a test can check the reason.

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct {
    int type, n;            // n: number of children (arrays, objects)
    int child, next;        // first child, next sibling (-1: none)
    char* key;              // member name inside an object (NUL-terminated, may not contain NUL)
    char* str;              // J_STR
    double num;             // J_NUM (and J_BOOL: 0 or 1)
    int is_int;             // J_NUM written as an integer that fits in int64
    long long ival;
} JNode;
typedef struct { JNode* v; int n, cap; const char* s; size_t len, i; int depth; char err[200]; } JDoc;

static void jdoc_free(JDoc* d) {
    for (int k = 0; k < d->n; k++) { free(d->v[k].key); free(d->v[k].str); }
    free(d->v);
    memset(d, 0, sizeof(*d));
}

static int j_err(JDoc* d, const char* what) {
    if (!d->err[0]) { snprintf(d->err, sizeof d->err, "invalid JSON: %s at byte %zu", what, d->i); }
    return -1;
}

static void j_ws(JDoc* d) {
    while (d->i < d->len && (d->s[d->i] == ' ' || d->s[d->i] == '\t' || d->s[d->i] == '\n' || d->s[d->i] == '\r')) { d->i++; }
}

static int j_new(JDoc* d, int type) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->v = (JNode*)realloc(d->v, (size_t)d->cap * sizeof(JNode));
        if (!d->v) { fail(EXIT_SYSTEM, "out of memory parsing JSON"); }
    }
    JNode* x = &d->v[d->n];
    memset(x, 0, sizeof(*x));
    x->type = type; x->child = -1; x->next = -1;
    return d->n++;
}

// a JSON string into a malloc'ed UTF-8 C string; NUL (\u0000) is refused, every other escape decoded
static char* j_string(JDoc* d) {
    ByteBuf b;
    memset(&b, 0, sizeof b);
    d->i++;   // the opening quote
    for (;;) {
        if (d->i >= d->len) { bytebuf_free(&b); j_err(d, "unterminated string"); return NULL; }
        uint8_t c = (uint8_t)d->s[d->i++];
        if (c == '"') { break; }
        if (c < 0x20) { bytebuf_free(&b); j_err(d, "control character in a string"); return NULL; }
        if (c != '\\') { bytebuf_append(&b, &c, 1); continue; }
        if (d->i >= d->len) { bytebuf_free(&b); j_err(d, "unterminated escape"); return NULL; }
        c = (uint8_t)d->s[d->i++];
        const char* simple = c ? strchr("\"\\/bfnrt", c) : NULL;
        if (simple) {
            uint8_t v = (uint8_t)("\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]);
            bytebuf_append(&b, &v, 1);
            continue;
        }
        if (c != 'u' || d->len - d->i < 4) { bytebuf_free(&b); j_err(d, "bad escape"); return NULL; }
        uint32_t cp = 0;
        for (int pass = 0; pass < 2; pass++) {
            uint32_t v = 0;
            for (int k = 0; k < 4; k++) {
                char h = d->s[d->i++];
                int x = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (x < 0) { bytebuf_free(&b); j_err(d, "bad \\u escape"); return NULL; }
                v = v * 16 + (uint32_t)x;
            }
            if (pass == 0 && v >= 0xD800 && v <= 0xDBFF) {   // a surrogate pair: the low half must follow
                if (d->len - d->i < 6 || d->s[d->i] != '\\' || d->s[d->i + 1] != 'u') { bytebuf_free(&b); j_err(d, "lone surrogate"); return NULL; }
                d->i += 2;
                cp = v;
                continue;
            }
            if (pass == 1) {
                if (v < 0xDC00 || v > 0xDFFF) { bytebuf_free(&b); j_err(d, "bad low surrogate"); return NULL; }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (v - 0xDC00);
            } else {
                if (v >= 0xDC00 && v <= 0xDFFF) { bytebuf_free(&b); j_err(d, "lone surrogate"); return NULL; }
                cp = v;
            }
            break;
        }
        if (cp == 0) { bytebuf_free(&b); j_err(d, "NUL character in a string"); return NULL; }
        utf8_append(&b, cp);
    }
    uint8_t z = 0;
    bytebuf_append(&b, &z, 1);
    return (char*)b.b;
}

// JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static int j_number(JDoc* d) {
    size_t st = d->i, i = d->i;
    int frac = 0;
    if (i < d->len && d->s[i] == '-') { i++; }
    if (i >= d->len || d->s[i] < '0' || d->s[i] > '9') { return j_err(d, "bad number"); }
    if (d->s[i] == '0') { i++; } else { while (i < d->len && d->s[i] >= '0' && d->s[i] <= '9') { i++; } }
    if (i < d->len && d->s[i] == '.') {
        frac = 1; i++;
        if (i >= d->len || d->s[i] < '0' || d->s[i] > '9') { return j_err(d, "bad number"); }
        while (i < d->len && d->s[i] >= '0' && d->s[i] <= '9') { i++; }
    }
    if (i < d->len && (d->s[i] == 'e' || d->s[i] == 'E')) {
        frac = 1; i++;
        if (i < d->len && (d->s[i] == '+' || d->s[i] == '-')) { i++; }
        if (i >= d->len || d->s[i] < '0' || d->s[i] > '9') { return j_err(d, "bad number"); }
        while (i < d->len && d->s[i] >= '0' && d->s[i] <= '9') { i++; }
    }
    char buf[64];
    if (i - st >= sizeof buf) { d->i = i; return j_err(d, "number too long"); }
    memcpy(buf, d->s + st, i - st);
    buf[i - st] = 0;
    int k = j_new(d, J_NUM);
    d->v[k].num = strtod(buf, NULL);
    size_t digits = i - st - (buf[0] == '-');
    if (!frac && digits <= 18) { d->v[k].is_int = 1; d->v[k].ival = strtoll(buf, NULL, 10); }
    d->i = i;
    return k;
}

static int j_value(JDoc* d);

// an array or an object (members keep their order; a repeated key is an error)
static int j_container(JDoc* d, int obj) {
    if (++d->depth > 64) { return j_err(d, "nested too deeply"); }
    int k = j_new(d, obj ? J_OBJ : J_ARR), last = -1;
    d->i++;
    j_ws(d);
    if (d->i < d->len && d->s[d->i] == (obj ? '}' : ']')) { d->i++; d->depth--; return k; }
    for (;;) {
        char* key = NULL;
        if (obj) {
            j_ws(d);
            if (d->i >= d->len || d->s[d->i] != '"') { return j_err(d, "expected a member name"); }
            if (!(key = j_string(d))) { return -1; }
            for (int c = d->v[k].child; c >= 0; c = d->v[c].next) {
                if (strcmp(d->v[c].key, key) == 0) {
                    snprintf(d->err, sizeof d->err, "invalid JSON: key \"%.80s\" appears twice in one object", key);
                    free(key);
                    return -1;
                }
            }
            j_ws(d);
            if (d->i >= d->len || d->s[d->i] != ':') { free(key); return j_err(d, "expected ':'"); }
            d->i++;
        }
        int c = j_value(d);
        if (c < 0) { free(key); return -1; }
        d->v[c].key = key;
        if (last < 0) { d->v[k].child = c; } else { d->v[last].next = c; }
        last = c;
        d->v[k].n++;
        j_ws(d);
        if (d->i < d->len && d->s[d->i] == ',') { d->i++; continue; }
        if (d->i < d->len && d->s[d->i] == (obj ? '}' : ']')) { d->i++; break; }
        return j_err(d, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    d->depth--;
    return k;
}

static int j_value(JDoc* d) {
    j_ws(d);
    if (d->i >= d->len) { return j_err(d, "unexpected end"); }
    char c = d->s[d->i];
    if (c == '{' || c == '[') { return j_container(d, c == '{'); }
    if (c == '"') {
        char* s = j_string(d);
        if (!s) { return -1; }
        int k = j_new(d, J_STR);
        d->v[k].str = s;
        return k;
    }
    static const char* const words[3] = {"null", "true", "false"};
    for (int w = 0; w < 3; w++) {
        size_t n = strlen(words[w]);
        if (d->len - d->i >= n && memcmp(d->s + d->i, words[w], n) == 0) {
            d->i += n;
            int k = j_new(d, w == 0 ? J_NULL : J_BOOL);
            d->v[k].num = w == 1;
            return k;
        }
    }
    return j_number(d);
}

// Parses text[0..len) into d; returns NULL or the reason it is not JSON (the root is node 0).
static const char* jdoc_parse(JDoc* d, const char* text, size_t len) {
    memset(d, 0, sizeof(*d));
    d->s = text; d->len = len;
    if (j_value(d) < 0) { return d->err; }
    j_ws(d);
    if (d->i != d->len) { j_err(d, "text after the value"); return d->err; }
    return NULL;
}

// member `key` of object node o, or -1
static int j_get(const JDoc* d, int o, const char* key) {
    if (o < 0 || d->v[o].type != J_OBJ) { return -1; }
    for (int c = d->v[o].child; c >= 0; c = d->v[c].next) { if (strcmp(d->v[c].key, key) == 0) { return c; } }
    return -1;
}

// ----------------------------------------------------------------------------------------------------
// JSON writing: numbers as Python's json module prints them, so a float field reads back as the same fp32

// the shortest %g form that reads back as the same float (Python then holds that decimal as its float)
static void json_float(TextBuf* tb, float f) {
    char buf[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, f);
        if (strtof(buf, NULL) == f) { break; }
    }
    // JSON needs a digit after the point and has no "1e-06" problem; make integers look like floats (1.0)
    if (!strpbrk(buf, ".eEn")) { strcat(buf, ".0"); }
    tb_printf(tb, "%s", buf);
}

// ----------------------------------------------------------------------------------------------------
// safetensors

// dtypes of the format with their size in bits (sub-byte types pack; a tensor's bytes are numel * bits / 8)
typedef struct { const char* name; int bits; } StDtype;
static const StDtype ST_DTYPES[] = {
    {"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16},
    {"F16", 16}, {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64}, {"I64", 64},
    {"U64", 64}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
};
#define ST_NUM_DTYPES ((int)(sizeof(ST_DTYPES) / sizeof(ST_DTYPES[0])))
#define ST_MAX_HEADER 100000000ull   // the reference implementation's limit on N
#define ST_MAX_DIMS 8

typedef struct {
    char* name;
    int dtype;                       // index in ST_DTYPES
    int ndim;
    long long shape[ST_MAX_DIMS];
    unsigned long long begin, end;   // byte offsets in the data section
} StEntry;

typedef struct {
    FILE* f;
    char path[1200];
    unsigned long long header_len, data_len;
    StEntry* e;
    int n;
    int format_pt;                   // __metadata__ has "format": "pt" (transformers requires it)
} StFile;

static void st_close(StFile* s) {
    if (s->f) { fclose(s->f); }
    for (int i = 0; i < s->n; i++) { free(s->e[i].name); }
    free(s->e);
    memset(s, 0, sizeof(*s));
}

static int st_entry_cmp(const void* a, const void* b) {
    const StEntry *x = (const StEntry*)a, *y = (const StEntry*)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

// Opens and validates a safetensors file. Returns NULL, or the reason it is refused (a static buffer).
static const char* st_open(StFile* s, const char* path) {
    static char err[400];
    memset(s, 0, sizeof(*s));
    snprintf(s->path, sizeof s->path, "%s", path);
    s->f = fopen(path, "rb");
    if (!s->f) { snprintf(err, sizeof err, "cannot open: %s", strerror(errno)); return err; }
    long long size = file_size(s->f);
    uint8_t len8[8];
    if (size < 8 || fread(len8, 1, 8, s->f) != 8) {
        snprintf(err, sizeof err, "%lld bytes: too short for the 8-byte header length", size);
        st_close(s); return err;
    }
    unsigned long long N = 0;
    for (int k = 7; k >= 0; k--) { N = (N << 8) | len8[k]; }
    if (N < 2 || N > ST_MAX_HEADER) {
        snprintf(err, sizeof err, "bad header length %llu (a JSON object of 2 .. %llu bytes is expected)", N, ST_MAX_HEADER);
        st_close(s); return err;
    }
    if (N > (unsigned long long)size - 8) {
        snprintf(err, sizeof err, "header length %llu runs past the end of the file (%lld bytes): truncated or not safetensors", N, size);
        st_close(s); return err;
    }
    s->header_len = N;
    s->data_len = (unsigned long long)size - 8 - N;
    char* text = (char*)mallocCheck(N);
    freadCheck(text, 1, N, s->f, path);
    JDoc d;
    const char* jerr = text[0] == '{' ? jdoc_parse(&d, text, N) : "the header does not start with '{'";
    if (jerr) {
        snprintf(err, sizeof err, "header: %s", jerr);
        if (text[0] == '{') { jdoc_free(&d); }
        free(text); st_close(s); return err;
    }
    free(text);
    const char* bad = NULL;
    char what[300] = "";
    s->e = (StEntry*)callocCheck((size_t)d.v[0].n + 1, sizeof(StEntry));
    for (int c = d.v[0].child; c >= 0 && !bad; c = d.v[c].next) {
        const char* name = d.v[c].key;
        if (strcmp(name, "__metadata__") == 0) {   // a map of strings to strings
            if (d.v[c].type != J_OBJ) { bad = "__metadata__ is not an object"; break; }
            for (int m = d.v[c].child; m >= 0; m = d.v[m].next) {
                if (d.v[m].type != J_STR) { bad = "__metadata__ values must be strings"; break; }
                if (strcmp(d.v[m].key, "format") == 0 && strcmp(d.v[m].str, "pt") == 0) { s->format_pt = 1; }
            }
            continue;
        }
        snprintf(what, sizeof what, "tensor \"%.200s\"", name);
        int dt = j_get(&d, c, "dtype"), sh = j_get(&d, c, "shape"), off = j_get(&d, c, "data_offsets");
        if (d.v[c].type != J_OBJ || dt < 0 || sh < 0 || off < 0) {
            bad = "must be an object with dtype, shape and data_offsets"; break;
        }
        StEntry* e = &s->e[s->n];
        e->dtype = -1;
        if (d.v[dt].type == J_STR) {
            for (int k = 0; k < ST_NUM_DTYPES; k++) { if (strcmp(ST_DTYPES[k].name, d.v[dt].str) == 0) { e->dtype = k; } }
        }
        if (e->dtype < 0) {
            snprintf(what + strlen(what), sizeof what - strlen(what), " (dtype %.40s)", d.v[dt].type == J_STR ? d.v[dt].str : "not a string");
            bad = "has an unknown dtype"; break;
        }
        if (d.v[sh].type != J_ARR || d.v[sh].n > ST_MAX_DIMS) { bad = "has a shape that is not a list of at most 8 integers"; break; }
        unsigned long long numel = 1;
        for (int k = d.v[sh].child; k >= 0 && !bad; k = d.v[k].next) {
            if (d.v[k].type != J_NUM || !d.v[k].is_int || d.v[k].ival < 0 || d.v[k].ival > (1ll << 40)) { bad = "has a shape entry that is not an integer in 0 .. 2^40"; break; }
            e->shape[e->ndim++] = d.v[k].ival;
            numel *= (unsigned long long)d.v[k].ival;
            if (numel > (1ull << 56)) { bad = "has more than 2^56 elements"; }
        }
        if (bad) { break; }
        if (d.v[off].type != J_ARR || d.v[off].n != 2) { bad = "has data_offsets that are not [begin, end]"; break; }
        int b0 = d.v[off].child, b1 = d.v[b0].next;
        if (d.v[b0].type != J_NUM || !d.v[b0].is_int || d.v[b0].ival < 0 || d.v[b1].type != J_NUM || !d.v[b1].is_int ||
            d.v[b1].ival < d.v[b0].ival) {
            bad = "has data_offsets that are not integers 0 <= begin <= end"; break;
        }
        e->begin = (unsigned long long)d.v[b0].ival;
        e->end = (unsigned long long)d.v[b1].ival;
        unsigned long long bits = numel * (unsigned long long)ST_DTYPES[e->dtype].bits;
        if (bits % 8 || bits / 8 != e->end - e->begin) {
            snprintf(what + strlen(what), sizeof what - strlen(what), " (%llu elements of %s = %llu bytes, offsets give %llu)",
                     numel, ST_DTYPES[e->dtype].name, bits / 8, e->end - e->begin);
            bad = "has data_offsets that do not match its shape and dtype"; break;
        }
        if (e->end > s->data_len) {
            snprintf(what + strlen(what), sizeof what - strlen(what), " (ends at byte %llu, the data has %llu)", e->end, s->data_len);
            bad = "lies past the end of the file (out-of-range offsets, or a truncated file)"; break;
        }
        e->name = (char*)mallocCheck(strlen(name) + 1);
        strcpy(e->name, name);
        s->n++;
    }
    jdoc_free(&d);
    if (!bad) {   // the tensors must tile the data section exactly: no overlap, no hole, nothing after the last
        qsort(s->e, (size_t)s->n, sizeof(StEntry), st_entry_cmp);
        unsigned long long at = 0;
        for (int i = 0; i < s->n && !bad; i++) {
            if (s->e[i].begin < at) {
                snprintf(what, sizeof what, "tensors \"%.120s\" and \"%.120s\"", s->e[i - 1].name, s->e[i].name);
                bad = "overlap (their data_offsets share bytes)";
            } else if (s->e[i].begin > at) {
                snprintf(what, sizeof what, "bytes %llu .. %llu before tensor \"%.200s\"", at, s->e[i].begin, s->e[i].name);
                bad = "belong to no tensor (a hole in the data)";
            }
            at = s->e[i].end;
        }
        if (!bad && at != s->data_len) {
            snprintf(what, sizeof what, "the last %llu bytes of the data", s->data_len - at);
            bad = "belong to no tensor";
        }
    }
    if (bad) {
        snprintf(err, sizeof err, "%s %s", what, bad);
        st_close(s);
        return err;
    }
    return NULL;
}

static const StEntry* st_find(const StFile* s, const char* name) {
    for (int i = 0; i < s->n; i++) { if (strcmp(s->e[i].name, name) == 0) { return &s->e[i]; } }
    return NULL;
}

// Reads tensor `name` as fp32 into out, checking it has exactly the expected shape; F32, BF16 and F16 are read.
// Returns NULL or the reason.
static const char* st_read(StFile* s, const char* name, int ndim, const long long* shape, float* out) {
    static char err[400];
    const StEntry* e = st_find(s, name);
    if (!e) { snprintf(err, sizeof err, "tensor \"%.200s\" is missing", name); return err; }
    int same = e->ndim == ndim;
    for (int k = 0; k < ndim && same; k++) { same = e->shape[k] == shape[k]; }
    if (!same) {
        char got[128] = "", want[128] = "";
        for (int k = 0; k < e->ndim; k++) { snprintf(got + strlen(got), sizeof got - strlen(got), k ? ", %lld" : "%lld", e->shape[k]); }
        for (int k = 0; k < ndim; k++) { snprintf(want + strlen(want), sizeof want - strlen(want), k ? ", %lld" : "%lld", shape[k]); }
        snprintf(err, sizeof err, "tensor \"%.200s\" has shape [%s], the config needs [%s]", name, got, want);
        return err;
    }
    const char* dt = ST_DTYPES[e->dtype].name;
    int es = strcmp(dt, "F32") == 0 ? 4 : (strcmp(dt, "BF16") == 0 || strcmp(dt, "F16") == 0) ? 2 : 0;
    if (!es) { snprintf(err, sizeof err, "tensor \"%.200s\" is %s: pdn.c reads F32, BF16 or F16", name, dt); return err; }
    size_t n = (size_t)((e->end - e->begin) / (unsigned long long)es);
    uint8_t* raw = (uint8_t*)mallocCheck(n * (size_t)es + 1);
    if (fseeko(s->f, (off_t)(8 + s->header_len + e->begin), SEEK_SET) != 0 || fread(raw, (size_t)es, n, s->f) != n) {
        free(raw);
        snprintf(err, sizeof err, "cannot read tensor \"%.200s\" (file truncated while reading?)", name);
        return err;
    }
    for (size_t i = 0; i < n; i++) {   // little-endian data, read byte by byte so the host order does not matter
        const uint8_t* p = raw + i * (size_t)es;
        if (es == 4) { uint32_t u = p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; memcpy(&out[i], &u, 4); }
        else if (dt[0] == 'B') { out[i] = bf16_to_float((uint16_t)(p[0] | p[1] << 8)); }
        else { out[i] = f16_to_float((uint16_t)(p[0] | p[1] << 8)); }
    }
    free(raw);
    return NULL;
}

// one tensor to write: fp32 values (data, numel of them) or, with data NULL, numel copies of `fill`
typedef struct { const char* name; int ndim; long long shape[ST_MAX_DIMS]; const float* data; float fill; } StOut;

static size_t st_numel(const StOut* t) {
    size_t n = 1;
    for (int k = 0; k < t->ndim; k++) { n *= (size_t)t->shape[k]; }
    return n;
}

// Writes a safetensors file (atomically) of n tensors in this order, as F32 or BF16 (round to nearest even).
// The header is padded with spaces to a multiple of 8 bytes, so the data starts 8-byte aligned.
static void st_write(const char* path, const StOut* t, int n, int bf16) {
    TextBuf h;
    memset(&h, 0, sizeof h);
    size_t es = bf16 ? 2 : 4, at = 0;
    tb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = st_numel(&t[i]) * es;
        tb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, bf16 ? "BF16" : "F32");
        for (int k = 0; k < t[i].ndim; k++) { tb_printf(&h, k ? ",%lld" : "%lld", t[i].shape[k]); }
        tb_printf(&h, "],\"data_offsets\":[%zu,%zu]}", at, at + bytes);
        at += bytes;
    }
    tb_printf(&h, "}");
    while (h.len % 8) { tb_printf(&h, " "); }
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) { len8[k] = (uint8_t)((uint64_t)h.len >> (8 * k)); }
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(len8, 1, 8, af.f);
    fwriteCheck(h.s, 1, h.len, af.f);
    size_t chunk = 1 << 16;
    uint8_t* buf = (uint8_t*)mallocCheck(chunk * 4);
    for (int i = 0; i < n; i++) {
        size_t N = st_numel(&t[i]);
        for (size_t j0 = 0; j0 < N; j0 += chunk) {
            size_t m = N - j0 < chunk ? N - j0 : chunk;
            for (size_t j = 0; j < m; j++) {
                float v = t[i].data ? t[i].data[j0 + j] : t[i].fill;
                uint32_t u;
                memcpy(&u, &v, 4);
                if (bf16) { uint16_t b = float_to_bf16_rne(v); buf[2 * j] = (uint8_t)b; buf[2 * j + 1] = (uint8_t)(b >> 8); }
                else { for (int k = 0; k < 4; k++) { buf[4 * j + k] = (uint8_t)(u >> (8 * k)); } }
            }
            fwriteCheck(buf, es, m, af.f);
        }
    }
    free(buf);
    free(h.s);
    atomic_commit(&af);
}

// ----------------------------------------------------------------------------------------------------
// the map: pdn.c tensor -> fla key (after "model.layers.<l>." for per-layer tensors)

enum { HF_DN, HF_GDN, HF_PGDN, HF_KDA, HF_PKDA, HF_NUM_CLASSES };
static const char* const HF_MODEL_TYPE[HF_NUM_CLASSES] = {"delta_net", "gated_deltanet", "precond_gated_deltanet", "kda", "precond_kda"};
static const char* const HF_ARCH[HF_NUM_CLASSES] = {"DeltaNetForCausalLM", "GatedDeltaNetForCausalLM",
    "PrecondGatedDeltaNetForCausalLM", "KDAForCausalLM", "PrecondKDAForCausalLM"};

typedef struct { int id; const char* key; } HfKey;
// every class (fla/layers/<class>.py; ShortConvolution is an nn.Conv1d: weight [C, 1, size], no bias)
static const HfKey HF_KEYS_COMMON[] = {
    {T_ATTN_NORM, "attn_norm.weight"}, {T_WQ, "attn.q_proj.weight"}, {T_WK, "attn.k_proj.weight"},
    {T_WV, "attn.v_proj.weight"}, {T_WB, "attn.b_proj.weight"}, {T_CONV_Q, "attn.q_conv1d.weight"},
    {T_CONV_K, "attn.k_conv1d.weight"}, {T_CONV_V, "attn.v_conv1d.weight"}, {T_O_NORM, "attn.o_norm.weight"},
    {T_WO, "attn.o_proj.weight"}, {T_MLP_NORM, "mlp_norm.weight"}, {T_WGATE, "mlp.gate_proj.weight"},
    {T_WUP, "mlp.up_proj.weight"}, {T_WDOWN, "mlp.down_proj.weight"},
};
static const HfKey HF_KEYS_SCALAR[] = {{T_WA, "attn.a_proj.weight"}, {T_A_LOG, "attn.A_log"}, {T_DT_BIAS, "attn.dt_bias"}};
static const HfKey HF_KEYS_CHANNEL[] = {   // KDA: f_proj and g_proj are nn.Sequential(Linear, Linear)
    {T_WF1, "attn.f_proj.0.weight"}, {T_WF2, "attn.f_proj.1.weight"}, {T_A_LOG, "attn.A_log"}, {T_DT_BIAS, "attn.dt_bias"},
};
static const HfKey HF_KEYS_GATE[] = {   // KDA's output gate (pdn.c's --out-gate 1)
    {T_WG1, "attn.g_proj.0.weight"}, {T_WG2, "attn.g_proj.1.weight"}, {T_BG2, "attn.g_proj.1.bias"},
};
#define HF_GATE_OPEN 100.0f   // the bias of a gate held open: sigmoid(100) is 1.0 in fp32
static const HfKey HF_KEYS_PGDN_ATK[] = {
    {T_WAP, "attn.a_atk_proj.weight"}, {T_WBP, "attn.b_atk_proj.weight"}, {T_A_LOGP, "attn.A_log_atk"},
    {T_DT_BIASP, "attn.dt_bias_atk"}, {T_LOG_ATK_SCALE, "attn.log_atk_scale"},
};
static const HfKey HF_KEYS_PKDA_ATK[] = {   // PKDA's preconditioner gate is a_proj (its main gate is f_proj)
    {T_WAP, "attn.a_proj.weight"}, {T_WBP, "attn.b_atk_proj.weight"}, {T_A_LOGP, "attn.A_log_atk"},
    {T_DT_BIASP, "attn.dt_bias_atk"}, {T_LOG_ATK_SCALE, "attn.log_atk_scale"},
};
// an attention layer (fla/layers/attn.py, Attention with qkv_bias false) keeps the block's norms and MLP
static const HfKey HF_KEYS_ATTN[] = {
    {T_ATTN_NORM, "attn_norm.weight"}, {T_AQ, "attn.q_proj.weight"}, {T_AK, "attn.k_proj.weight"},
    {T_AV, "attn.v_proj.weight"}, {T_AO, "attn.o_proj.weight"}, {T_MLP_NORM, "mlp_norm.weight"},
    {T_WGATE, "mlp.gate_proj.weight"}, {T_WUP, "mlp.up_proj.weight"}, {T_WDOWN, "mlp.down_proj.weight"},
};
#define HF_NKEYS(a) ((int)(sizeof(a) / sizeof(a[0])))

// The fla class of a config, or -1 with *why set when fla has none for it.
static int hf_class_of(const PdnConfig* c, const char** why) {
    *why = NULL;
    if (c->precond == PRECOND_EXACT) { *why = "the exact preconditioner (--precond exact) has no fla class"; return -1; }
    int p = c->precond == PRECOND_DIAG;
    if (c->decay == DECAY_CHANNEL) {
        return p ? HF_PKDA : HF_KDA;   // --out-gate 0: the gate held open
    }
    if (c->out_gate) {
        *why = "fla's DeltaNet/GatedDeltaNet output gate is a full-rank swish gate, not pdn.c's --out-gate 1 (low-rank sigmoid)";
        return -1;
    }
    if (c->decay == DECAY_SCALAR) { return p ? HF_PGDN : HF_GDN; }
    return p ? HF_PGDN : HF_DN;   // pdn: PGDN with the main decay held at 1
}

// one fla tensor: where its values come from in the flat buffer (id >= 0: tensor id, layer l) or a constant
typedef struct {
    char name[96];
    int id, layer;       // id -1: every element is `fill` (PDN's main-decay tensors)
    float fill;
    int ndim;
    long long shape[3];
} HfTensor;

static void hf_put(HfTensor* t, int* n, const char* name, int layer, int id, float fill, int ndim, long long s0, long long s1, long long s2) {
    HfTensor* x = &t[(*n)++];
    if (layer >= 0) { snprintf(x->name, sizeof x->name, "model.layers.%d.%s", layer, name); }
    else { snprintf(x->name, sizeof x->name, "%s", name); }
    x->id = id; x->layer = layer; x->fill = fill; x->ndim = ndim;
    x->shape[0] = s0; x->shape[1] = s1; x->shape[2] = s2;
}

// The fla tensors of config c with `rows` vocabulary rows (<= vocab_size), in t (room for 3 + 32 per layer).
// Returns how many.
static int hf_tensors(const PdnConfig* c, int cls, int rows, HfTensor* t) {
    PdnLayout lay;
    pdn_build_layout(c, &lay);
    int n = 0, H = c->n_head;
    hf_put(t, &n, "model.embeddings.weight", -1, T_WTE, 0, 2, rows, c->d_model, 0);
    for (int l = 0; l < c->n_layer; l++) {
        if (pdn_is_attn(c, l)) {
            for (int k = 0; k < HF_NKEYS(HF_KEYS_ATTN); k++) {
                const PdnTensor* pt = &lay.t[HF_KEYS_ATTN[k].id];
                if (pt->ndim == 3) { hf_put(t, &n, HF_KEYS_ATTN[k].key, l, HF_KEYS_ATTN[k].id, 0, 2, pt->shape[1], pt->shape[2], 0); }
                else { hf_put(t, &n, HF_KEYS_ATTN[k].key, l, HF_KEYS_ATTN[k].id, 0, 1, pt->shape[1], 0, 0); }
            }
            continue;
        }
        const HfKey* sets[4] = {HF_KEYS_COMMON, NULL, NULL, NULL};
        int counts[4] = {HF_NKEYS(HF_KEYS_COMMON), 0, 0, 0};
        if (c->decay == DECAY_SCALAR) { sets[1] = HF_KEYS_SCALAR; counts[1] = HF_NKEYS(HF_KEYS_SCALAR); }
        if (c->decay == DECAY_CHANNEL) { sets[1] = HF_KEYS_CHANNEL; counts[1] = HF_NKEYS(HF_KEYS_CHANNEL); }
        if (cls == HF_PGDN) { sets[2] = HF_KEYS_PGDN_ATK; counts[2] = HF_NKEYS(HF_KEYS_PGDN_ATK); }
        if (cls == HF_PKDA) { sets[2] = HF_KEYS_PKDA_ATK; counts[2] = HF_NKEYS(HF_KEYS_PKDA_ATK); }
        if (c->out_gate) { sets[3] = HF_KEYS_GATE; counts[3] = HF_NKEYS(HF_KEYS_GATE); }
        for (int s = 0; s < 4; s++) {
            for (int k = 0; k < counts[s]; k++) {
                const PdnTensor* pt = &lay.t[sets[s][k].id];
                int id = sets[s][k].id, conv = id == T_CONV_Q || id == T_CONV_K || id == T_CONV_V;   // (L, C, size)
                if (conv) { hf_put(t, &n, sets[s][k].key, l, sets[s][k].id, 0, 3, pt->shape[1], 1, pt->shape[2]); }
                else if (pt->ndim == 3) { hf_put(t, &n, sets[s][k].key, l, sets[s][k].id, 0, 2, pt->shape[1], pt->shape[2], 0); }
                else { hf_put(t, &n, sets[s][k].key, l, sets[s][k].id, 0, 1, pt->shape[1], 0, 0); }
            }
        }
        if ((cls == HF_KDA || cls == HF_PKDA) && !c->out_gate) {   // the gate held open: sigmoid(0 x + 100) = 1
            int V = pdn_head_v(c);
            hf_put(t, &n, "attn.g_proj.0.weight", l, -1, 0.0f, 2, V, c->d_model, 0);
            hf_put(t, &n, "attn.g_proj.1.weight", l, -1, 0.0f, 2, (long long)H * V, V, 0);
            hf_put(t, &n, "attn.g_proj.1.bias", l, -1, HF_GATE_OPEN, 1, (long long)H * V, 0, 0);
        }
        if (cls == HF_PGDN && c->decay == DECAY_NONE) {   // pdn: g = -exp(-inf) * softplus(0 + 0) = -0
            hf_put(t, &n, "attn.a_proj.weight", l, -1, 0.0f, 2, H, c->d_model, 0);
            hf_put(t, &n, "attn.A_log", l, -1, -INFINITY, 1, H, 0, 0);
            hf_put(t, &n, "attn.dt_bias", l, -1, 0.0f, 1, H, 0, 0);
        }
    }
    hf_put(t, &n, "model.norm.weight", -1, T_FINAL_NORM, 0, 1, c->d_model, 0, 0);
    if (!c->tie_embeddings) { hf_put(t, &n, "lm_head.weight", -1, T_LM_HEAD, 0, 2, rows, c->d_model, 0); }
    return n;
}

// ----------------------------------------------------------------------------------------------------
// config.json

// DeltaNet sizes its keys and values by hidden_size: key_dim = int(hidden_size * expand_k). The ratio we write
// must give back H*K under Python's float arithmetic (the same IEEE double operations as here).
static int hf_dn_ratio_ok(int d, int dim, double* ratio) {
    *ratio = (double)dim / (double)d;
    return (long long)((double)d * *ratio) == dim;
}

// Writes DIR/config.json for config c of class cls; vocab = the exported rows; bos/eos: the tokenizer's
// end-of-text id (-1: null).
static void hf_write_config(const char* path, const PdnConfig* c, int cls, int vocab, int eot, int bf16) {
    TextBuf tb;
    memset(&tb, 0, sizeof tb);
    int H = c->n_head, K = c->head_k, V = pdn_head_v(c);
    tb_printf(&tb, "{\n  \"model_type\": \"%s\",\n  \"architectures\": [\"%s\"],\n", HF_MODEL_TYPE[cls], HF_ARCH[cls]);
    tb_printf(&tb, "  \"attn_mode\": \"chunk\",\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_heads\": %d,\n",
              c->d_model, c->n_layer, H);
    if (cls == HF_DN) {
        double ek, ev;
        hf_dn_ratio_ok(c->d_model, H * K, &ek);
        hf_dn_ratio_ok(c->d_model, H * V, &ev);
        tb_printf(&tb, "  \"expand_k\": %.17g,\n  \"expand_v\": %.17g,\n  \"use_beta\": true,\n  \"use_output_norm\": true,\n"
                  "  \"qk_norm\": \"l2\",\n  \"qk_activation\": \"silu\",\n", ek, ev);
    } else {
        tb_printf(&tb, "  \"head_dim\": %d,\n  \"expand_v\": %d.0,\n  \"num_v_heads\": %d,\n", K, c->expand_v, H);
    }
    if (cls == HF_DN || cls == HF_GDN || cls == HF_PGDN) { tb_printf(&tb, "  \"use_gate\": false,\n"); }
    if (cls == HF_KDA || cls == HF_PKDA) { tb_printf(&tb, "  \"safe_gate\": false,\n  \"lower_bound\": null,\n"); }
    tb_printf(&tb, "  \"use_short_conv\": true,\n  \"conv_size\": %d,\n  \"allow_neg_eigval\": %s,\n", c->conv_size,
              c->neg_eigval ? "true" : "false");
    tb_printf(&tb, "  \"hidden_ratio\": 4,\n  \"intermediate_size\": %d,\n  \"hidden_act\": \"swish\",\n  \"norm_eps\": ", c->mlp_hidden);
    json_float(&tb, c->norm_eps);
    tb_printf(&tb, ",\n");
    // the preconditioner's constants (PGDN, PKDA) and a_log_init_lower (read by their init only) are written for every
    // class: the others keep them as unused attributes, and an import gives pdn.c's whole config back
    tb_printf(&tb, "  \"squash_x\": ");
    json_float(&tb, c->squash_x);
    tb_printf(&tb, ",\n  \"squash_eps\": ");
    json_float(&tb, c->precond_eps);
    tb_printf(&tb, ",\n  \"log_atk_scale_init\": ");
    json_float(&tb, c->log_atk_scale_init);
    tb_printf(&tb, ",\n  \"a_log_init_lower\": ");
    json_float(&tb, c->a_log_lo);
    tb_printf(&tb, ",\n");
    tb_printf(&tb, "  \"vocab_size\": %d,\n  \"tie_word_embeddings\": %s,\n", vocab, c->tie_embeddings ? "true" : "false");
    if (eot >= 0) { tb_printf(&tb, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", eot, eot); }
    else { tb_printf(&tb, "  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n"); }
    tb_printf(&tb, "  \"pad_token_id\": null,\n  \"max_position_embeddings\": 2048,\n  \"initializer_range\": 0.02,\n");
    // fla's hybrid attention spec (fla/models/hybrid.py): one for every attention layer; window_size null = full causal
    if (layerset_count(&c->attn_layers)) {
        tb_printf(&tb, "  \"attn\": {\n    \"layers\": [");
        for (int l = 0, first = 1; l < c->n_layer; l++) {
            if (pdn_is_attn(c, l)) { tb_printf(&tb, first ? "%d" : ", %d", l); first = 0; }
        }
        tb_printf(&tb, "],\n    \"num_heads\": %d,\n    \"num_kv_heads\": %d,\n    \"qkv_bias\": false,\n", c->attn_heads,
                  c->attn_kv_heads);
        if (c->attn_window) { tb_printf(&tb, "    \"window_size\": %d,\n", c->attn_window); }
        else { tb_printf(&tb, "    \"window_size\": null,\n"); }
        tb_printf(&tb, "    \"rope_theta\": ");
        if (c->rope_theta == floorf(c->rope_theta) && c->rope_theta < 1e9f) { tb_printf(&tb, "%.1f", c->rope_theta); }   // 10000.0, as Python
        else { json_float(&tb, c->rope_theta); }
        tb_printf(&tb, "\n  },\n");
    } else {
        tb_printf(&tb, "  \"attn\": null,\n");
    }
    tb_printf(&tb, "  \"use_cache\": true,\n  \"fuse_norm\": true,\n  \"fuse_swiglu\": true,\n"
              "  \"fuse_cross_entropy\": true,\n  \"fuse_linear_cross_entropy\": false,\n  \"use_l2warp\": false,\n"
              "  \"torch_dtype\": \"%s\"\n}\n", bf16 ? "bfloat16" : "float32");
    ByteBuf b = {(uint8_t*)tb.s, tb.len, tb.cap};
    write_atomic(path, &b);
    free(tb.s);
}

// ---- reading a config: each field with fla's default for that class when it is absent

typedef struct { const JDoc* d; char err[300]; } HfCfg;

static int hfc_null(HfCfg* h, const char* key) { int k = j_get(h->d, 0, key); return k < 0 || h->d->v[k].type == J_NULL; }

// field `key` of the root if present, not null and of `type` (J_NUM with want_int: an integer); NULL otherwise, and
// a wrong type is remembered in h->err (the first one) so that the caller refuses the file
static const JNode* hfc_field(HfCfg* h, const char* key, int type, int want_int, const char* what) {
    int k = j_get(h->d, 0, key);
    if (k < 0 || h->d->v[k].type == J_NULL) { return NULL; }
    const JNode* x = &h->d->v[k];
    if (x->type == type && (!want_int || x->is_int)) { return x; }
    if (!h->err[0]) { snprintf(h->err, sizeof h->err, "\"%s\" must be %s", key, what); }
    return NULL;
}

static long long hfc_int(HfCfg* h, const char* key, long long def) { const JNode* x = hfc_field(h, key, J_NUM, 1, "an integer"); return x ? x->ival : def; }
static double hfc_num(HfCfg* h, const char* key, double def) { const JNode* x = hfc_field(h, key, J_NUM, 0, "a number"); return x ? x->num : def; }
static int hfc_bool(HfCfg* h, const char* key, int def) { const JNode* x = hfc_field(h, key, J_BOOL, 0, "true or false"); return x ? (int)x->num : def; }
static const char* hfc_str(HfCfg* h, const char* key, const char* def) { const JNode* x = hfc_field(h, key, J_STR, 0, "a string"); return x ? x->str : def; }

// fla's "attn" (one spec, or a list of them: fla/models/hybrid.py) into c's attention fields; NULL, or why pdn.c cannot
// hold it (pdn.c has one setting of heads, window and theta for all its attention layers). num_hidden_layers must
// be read first (the layer indices are checked against it by pdn_config_check).
static const char* hf_read_attn(const JDoc* d, int a, PdnConfig* c) {
    static char err[200];
    int specs[64], ns = 0;
    if (d->v[a].type == J_OBJ) { specs[ns++] = a; }
    else if (d->v[a].type == J_ARR) {
        for (int k = d->v[a].child; k >= 0 && ns < 64; k = d->v[k].next) { specs[ns++] = k; }
        if (d->v[a].n > 64 || ns == 0) { return "\"attn\" must hold 1 to 64 specifications"; }
    } else { return "\"attn\" must be null, an object or a list of objects"; }
    for (int i = 0; i < ns; i++) {
        int o = specs[i];
        if (d->v[o].type != J_OBJ) { return "each \"attn\" specification must be an object"; }
        int kl = j_get(d, o, "layers"), kh = j_get(d, o, "num_heads"), kkv = j_get(d, o, "num_kv_heads");
        int kb = j_get(d, o, "qkv_bias"), kw = j_get(d, o, "window_size"), kt = j_get(d, o, "rope_theta");
        if (kl < 0 || d->v[kl].type != J_ARR || kh < 0 || d->v[kh].type != J_NUM || !d->v[kh].is_int) {
            return "an \"attn\" specification needs \"layers\" (a list) and \"num_heads\" (an integer)";
        }
        int heads = (int)d->v[kh].ival, kv = heads, window = 0;
        if (d->v[kh].ival < 1 || d->v[kh].ival > PDN_MAX_HEADS) { return "\"attn\" num_heads must be in 1..1024"; }
        if (kkv >= 0 && d->v[kkv].type != J_NULL) {
            if (d->v[kkv].type != J_NUM || !d->v[kkv].is_int || d->v[kkv].ival < 1 || d->v[kkv].ival > PDN_MAX_HEADS) {
                return "\"attn\" num_kv_heads must be an integer in 1..1024";
            }
            kv = (int)d->v[kkv].ival;
        }
        if (kb >= 0 && !(d->v[kb].type == J_BOOL && d->v[kb].num == 0)) { return "\"attn\" qkv_bias true: pdn.c's attention has no biases"; }
        if (kw >= 0 && d->v[kw].type != J_NULL) {
            if (d->v[kw].type != J_NUM || !d->v[kw].is_int || d->v[kw].ival < 1 || d->v[kw].ival > 1000000000LL) {
                return "\"attn\" window_size must be null or a positive integer";
            }
            window = (int)d->v[kw].ival;
        }
        double theta = 10000.0;
        if (kt >= 0) {
            if (d->v[kt].type != J_NUM || !(d->v[kt].num > 0) || !isfinite((float)d->v[kt].num)) { return "\"attn\" rope_theta must be a positive number"; }
            theta = d->v[kt].num;
        }
        if (i > 0 && (heads != c->attn_heads || kv != c->attn_kv_heads || window != c->attn_window || (float)theta != c->rope_theta)) {
            return "\"attn\" specifications with different heads, window or rope_theta: pdn.c has one setting for all its attention layers";
        }
        c->attn_heads = heads; c->attn_kv_heads = kv; c->attn_window = window; c->rope_theta = (float)theta;
        for (int k = d->v[kl].child; k >= 0; k = d->v[k].next) {
            const JNode* x = &d->v[k];
            if (x->type != J_NUM || !x->is_int || x->ival < 0 || x->ival >= c->n_layer) {
                snprintf(err, sizeof err, "\"attn\" layers must be integers in [0, num_hidden_layers = %d)", c->n_layer);
                return err;
            }
            if (pdn_is_attn(c, (int)x->ival)) { snprintf(err, sizeof err, "\"attn\" names layer %lld twice", x->ival); return err; }
            c->attn_layers.w[x->ival >> 6] |= 1ull << (x->ival & 63);
        }
    }
    if (!layerset_count(&c->attn_layers)) { return "\"attn\" names no layers"; }
    return NULL;
}

// Reads config.json (text[0..n)) into c and *cls. Returns NULL, or the reason pdn.c cannot represent it.
// Defaults are fla's (fla/models/<class>/configuration_<class>.py) when a field is absent or null.
static const char* hf_read_config(const char* text, size_t n, PdnConfig* c, int* cls) {
    static char err[400];
    JDoc d;
    const char* jerr = jdoc_parse(&d, text, n);
    if (jerr) { snprintf(err, sizeof err, "%s", jerr); jdoc_free(&d); return err; }
    if (d.v[0].type != J_OBJ) { jdoc_free(&d); return "the file is not a JSON object"; }
    HfCfg h;
    memset(&h, 0, sizeof h);
    h.d = &d;
    const char* mt = hfc_str(&h, "model_type", "");
    *cls = -1;
    for (int k = 0; k < HF_NUM_CLASSES; k++) { if (strcmp(mt, HF_MODEL_TYPE[k]) == 0) { *cls = k; } }
    if (*cls < 0) {
        snprintf(err, sizeof err, "model_type \"%.60s\" is not one pdn.c can read (delta_net, gated_deltanet, "
                 "precond_gated_deltanet, kda, precond_kda)", mt);
        jdoc_free(&d);
        return err;
    }
    int k = *cls, kda = k == HF_KDA || k == HF_PKDA;
    pdn_config_defaults(c);
    c->decay = k == HF_DN ? DECAY_NONE : kda ? DECAY_CHANNEL : DECAY_SCALAR;
    c->precond = (k == HF_PGDN || k == HF_PKDA) ? PRECOND_DIAG : PRECOND_NONE;
    c->out_gate = kda;
    // fla's class defaults: DN d2048 H16 L24; GDN/PGDN d2048 H6 K256 expand_v 2 L21 use_gate; KDA/PKDA d2048 H16 K128 L24
    c->d_model = (int)hfc_int(&h, "hidden_size", 2048);
    c->n_layer = (int)hfc_int(&h, "num_hidden_layers", (k == HF_GDN || k == HF_PGDN) ? 21 : 24);
    c->n_head = (int)hfc_int(&h, "num_heads", (k == HF_GDN || k == HF_PGDN) ? 6 : 16);
    const char* why = NULL;
    if (c->d_model < 1 || c->n_head < 1 || c->n_layer < 1) { why = "hidden_size, num_heads and num_hidden_layers must be positive"; }
    if (!why && k == HF_DN) {
        double ek = hfc_num(&h, "expand_k", 1.0), ev = hfc_num(&h, "expand_v", 1.0);
        long long kd = (long long)((double)c->d_model * ek), vd = (long long)((double)c->d_model * ev);
        if (kd < 1 || vd < 1 || kd % c->n_head || vd % c->n_head) { why = "int(hidden_size * expand_k / expand_v) must be positive multiples of num_heads"; }
        else if ((vd / c->n_head) % (kd / c->n_head)) { why = "pdn.c needs the value head dim to be a multiple of the key head dim"; }
        else { c->head_k = (int)(kd / c->n_head); c->expand_v = (int)((vd / c->n_head) / c->head_k); }
        if (!hfc_bool(&h, "use_beta", 1)) { why = "use_beta false (beta = 1): pdn.c always learns beta"; }
        if (strcmp(hfc_str(&h, "qk_norm", "l2"), "l2") != 0) { why = "qk_norm other than \"l2\""; }
        if (strcmp(hfc_str(&h, "qk_activation", "silu"), "silu") != 0) { why = "qk_activation other than \"silu\""; }
    } else if (!why) {
        c->head_k = (int)hfc_int(&h, "head_dim", kda ? 128 : 256);
        double ev = hfc_num(&h, "expand_v", kda ? 1.0 : 2.0);
        if (c->head_k < 1 || !(ev >= 1) || ev != floor(ev) || ev > 64) { why = "pdn.c needs head_dim >= 1 and an integer expand_v >= 1"; }
        else { c->expand_v = (int)ev; }
        if (!hfc_null(&h, "num_v_heads") && hfc_int(&h, "num_v_heads", 0) != c->n_head) {
            why = "num_v_heads differs from num_heads (grouped value attention): pdn.c has one value head per key head";
        }
    }
    if (!why && (k == HF_DN || k == HF_GDN || k == HF_PGDN) && hfc_bool(&h, "use_gate", k != HF_DN)) {
        why = "use_gate true (fla's swish output gate with g_proj): pdn.c's models of this kind have no output gate "
              "(use_gate defaults to true in gated_deltanet and precond_gated_deltanet configs)";
    }
    if (!why && kda && (hfc_bool(&h, "safe_gate", 0) || !hfc_null(&h, "lower_bound"))) {
        why = "safe_gate / lower_bound (KDA's bounded gate lower_bound * sigmoid(...)): pdn.c has the plain softplus gate";
    }
    if (!why && !hfc_bool(&h, "use_short_conv", 1)) { why = "use_short_conv false: pdn.c always has the short convolutions"; }
    if (!why && !hfc_null(&h, "attn")) { why = hf_read_attn(&d, j_get(&d, 0, "attn"), c); }
    if (!why && !hfc_null(&h, "attnres_block_size")) { why = "attnres_block_size (attention residuals) is set: pdn.c has none"; }
    if (!why && strcmp(hfc_str(&h, "hidden_act", "swish"), "swish") != 0) { why = "hidden_act other than \"swish\" (SwiGLU)"; }
    c->conv_size = (int)hfc_int(&h, "conv_size", 4);
    c->neg_eigval = hfc_bool(&h, "allow_neg_eigval", 0);
    c->norm_eps = (float)hfc_num(&h, "norm_eps", 1e-6);
    c->vocab_size = (int)hfc_int(&h, "vocab_size", 32000);
    c->tie_embeddings = hfc_bool(&h, "tie_word_embeddings", 0);
    // GatedMLP: intermediate_size, else 256 * ceil(int(hidden_size * hidden_ratio * 2 / 3) / 256), hidden_ratio 4 if null
    if (!hfc_null(&h, "intermediate_size")) { c->mlp_hidden = (int)hfc_int(&h, "intermediate_size", 0); }
    else {
        double hr = hfc_num(&h, "hidden_ratio", 4);
        long long I = (long long)((double)c->d_model * hr * 2 / 3);
        c->mlp_hidden = (int)(256 * ((I + 255) / 256));
    }
    c->squash_x = (float)hfc_num(&h, "squash_x", 1.5);
    c->precond_eps = (float)hfc_num(&h, "squash_eps", 1e-6);
    c->log_atk_scale_init = (float)hfc_num(&h, "log_atk_scale_init", -0.2);
    // init only: PKDA's fla default is 1, PGDN's 0; GDN and KDA have no field (their init: U(0,16), U(1,16))
    c->a_log_lo = (float)hfc_num(&h, "a_log_init_lower", kda ? 1.0 : 0.0);
    if (!why && h.err[0]) { why = h.err; }
    if (!why) { why = pdn_config_check(c); }
    if (why) { snprintf(err, sizeof err, "%s", why); }
    jdoc_free(&d);
    return why ? err : NULL;
}

// ----------------------------------------------------------------------------------------------------
// tokenizer files: vocab.json + merges.txt (GPT-2's published form, which GPT2Tokenizer reads) and the config
// naming the class, so AutoTokenizer needs nothing else

static void hf_write_tokenizer(const char* dir, const Tokenizer* tok) {
    char p1[1200], p2[1200];
    snprintf(p1, sizeof p1, "%s/vocab.json", dir);
    snprintf(p2, sizeof p2, "%s/merges.txt", dir);
    tokenizer_save_gpt2(tok, p1, p2);
    TextBuf tb;
    memset(&tb, 0, sizeof tb);
    const char* eot = tok->eot_id >= 0 ? "\"<|endoftext|>\"" : "null";
    tb_printf(&tb, "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"add_prefix_space\": false,\n  \"add_bos_token\": false,\n"
              "  \"model_max_length\": 2048,\n  \"bos_token\": %s,\n  \"eos_token\": %s,\n  \"unk_token\": %s,\n"
              "  \"pad_token\": null,\n  \"clean_up_tokenization_spaces\": false,\n  \"errors\": \"replace\"", eot, eot, eot);
    if (tok->eot_id >= 0) {
        tb_printf(&tb, ",\n  \"added_tokens_decoder\": {\n    \"%d\": {\"content\": \"<|endoftext|>\", \"lstrip\": false, "
                  "\"normalized\": true, \"rstrip\": false, \"single_word\": false, \"special\": true}\n  }", tok->eot_id);
    }
    tb_printf(&tb, "\n}\n");
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    ByteBuf b = {(uint8_t*)tb.s, tb.len, tb.cap};
    write_atomic(p1, &b);
    tb.len = 0;
    tb_printf(&tb, "{\"bos_token\": %s, \"eos_token\": %s, \"unk_token\": %s}\n", eot, eot, eot);
    snprintf(p1, sizeof p1, "%s/special_tokens_map.json", dir);
    ByteBuf b2 = {(uint8_t*)tb.s, tb.len, tb.cap};
    write_atomic(p1, &b2);
    free(tb.s);
}

// ----------------------------------------------------------------------------------------------------
// export and import

// Writes DIR (created if needed): config.json, model.safetensors (F32 or BF16) and, with a tokenizer, its files.
// Only the tokenizer's rows of the vocabulary are exported (padding rows would enter lm-eval's softmax).
// Returns the number of tensors written; *cls_out gets the fla class, *rows_out the vocabulary rows exported.
static int hf_export(const char* dir, const PdnConfig* c, const real* params, int bf16, const Tokenizer* tok, int* cls_out,
                     int* rows_out) {
    const char* why;
    int cls = hf_class_of(c, &why);
    if (cls < 0) { fail(EXIT_USAGE, "--export-hf: %s", why); }
    double ratio;
    if (cls == HF_DN && (!hf_dn_ratio_ok(c->d_model, c->n_head * c->head_k, &ratio) ||
                         !hf_dn_ratio_ok(c->d_model, c->n_head * pdn_head_v(c), &ratio))) {
        fail(EXIT_USAGE, "--export-hf: fla's DeltaNet sizes heads as int(hidden_size * expand_k); no float expand_k gives "
             "H*K = %d from hidden_size %d", c->n_head * c->head_k, c->d_model);
    }
    int rows = c->vocab_size;
    if (tok) {
        if (tok->vocab_size > c->vocab_size) {
            fail(EXIT_USAGE, "--export-hf: the tokenizer has %d tokens, the model only %d", tok->vocab_size, c->vocab_size);
        }
        rows = tok->vocab_size;
    }
    PdnLayout lay;
    pdn_build_layout(c, &lay);
    ensure_dir(dir);
    HfTensor* ht = (HfTensor*)mallocCheck((size_t)(3 + 32 * c->n_layer) * sizeof(HfTensor));
    int n = hf_tensors(c, cls, rows, ht);
    // fp32 copies of the tensors (params is `real`, fp64 in the gradient-check build)
    float* f32 = (float*)mallocCheck(lay.num_elems * sizeof(float));
    for (size_t i = 0; i < lay.num_elems; i++) { f32[i] = (float)params[i]; }
    StOut* so = (StOut*)callocCheck((size_t)n, sizeof(StOut));
    for (int i = 0; i < n; i++) {
        so[i].name = ht[i].name;
        so[i].ndim = ht[i].ndim;
        for (int k = 0; k < ht[i].ndim; k++) { so[i].shape[k] = ht[i].shape[k]; }
        so[i].fill = ht[i].fill;
        so[i].data = ht[i].id < 0 ? NULL : PDN_PARAM(f32, &lay, ht[i].id, ht[i].layer < 0 ? 0 : ht[i].layer);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_write(path, so, n, bf16);
    snprintf(path, sizeof path, "%s/config.json", dir);
    hf_write_config(path, c, cls, rows, tok ? tok->eot_id : -1, bf16);
    if (tok) { hf_write_tokenizer(dir, tok); }
    free(so); free(f32); free(ht);
    *cls_out = cls;
    *rows_out = rows;
    return n;
}

enum { HF_IS_NEG_INF, HF_IS_ZERO, HF_IS_OPEN };

// whether every element of model.layers.<l>.<key> (shape s0 x s1, or s0 if s1 == 0) in every mixer layer is -inf, 0, or a
// gate bias b with sigmoid(b) == 1.0 in fp32 (fla's gate kernels compute in fp32); fails (exit 2) if one is unreadable
static int hf_all_layers(StFile* st, const char* path, const PdnConfig* c, const char* key, int ndim, long long s0,
                         long long s1, int what) {
    long long shape[2] = {s0, s1};
    size_t n = (size_t)s0 * (size_t)(s1 ? s1 : 1);
    float* a = (float*)mallocCheck(n * sizeof(float));
    int all = 1, seen = 0;
    for (int l = 0; l < c->n_layer && all; l++) {
        if (pdn_is_attn(c, l)) { continue; }   // an attention layer has no mixer tensors
        seen++;
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.%s", l, key);
        const char* why = st_read(st, name, ndim, shape, a);
        if (why) { fail(EXIT_BADFILE, "%s: %s", path, why); }
        for (size_t i = 0; i < n && all; i++) {
            if (what == HF_IS_NEG_INF) { all = isinf(a[i]) && a[i] < 0; }
            else if (what == HF_IS_ZERO) { all = a[i] == 0.0f; }
            else { all = 1.0f / (1.0f + expf(-a[i])) == 1.0f; }
        }
    }
    free(a);
    return all && seen;   // no mixer layer: nothing to tell, the class's own default stands
}

// Reads DIR/config.json and DIR/model.safetensors into a config and a flat fp32 buffer (*params, num_elems,
// padding zero). Every tensor the config implies must be there with its shape and no other may be (a tied
// lm_head.weight is ignored, as transformers does: *tied_head_ignored says so). Fails with exit 2 and the reason
// otherwise.
static void hf_import(const char* dir, PdnConfig* c, float** params, int* tied_head_ignored) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!file_exists(path)) { fail(EXIT_BADFILE, "%s: no config.json (is it a Hugging Face model directory?)", dir); }
    size_t n;
    uint8_t* text = slurp_file(path, &n);
    int cls;
    const char* why = hf_read_config((const char*)text, n, c, &cls);
    free(text);
    if (why) { fail(EXIT_BADFILE, "%s: %s", path, why); }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StFile st;
    why = st_open(&st, path);
    if (why) { fail(EXIT_BADFILE, "%s: %s", path, why); }
    // a precond_gated_deltanet whose main decay is exactly 1 in every layer (A_log = -inf) is pdn; a (precond_)kda
    // whose output gate is exactly 1 in every layer (zero weights, sigmoid(bias) = 1.0 in fp32) has --out-gate 0
    if (cls == HF_PGDN && hf_all_layers(&st, path, c, "attn.A_log", 1, c->n_head, 0, HF_IS_NEG_INF)) { c->decay = DECAY_NONE; }
    if (cls == HF_KDA || cls == HF_PKDA) {
        int V = pdn_head_v(c), HV = c->n_head * V;
        if (hf_all_layers(&st, path, c, "attn.g_proj.0.weight", 2, V, c->d_model, HF_IS_ZERO) &&
            hf_all_layers(&st, path, c, "attn.g_proj.1.weight", 2, HV, V, HF_IS_ZERO) &&
            hf_all_layers(&st, path, c, "attn.g_proj.1.bias", 1, HV, 0, HF_IS_OPEN)) {
            c->out_gate = 0;
        }
    }
    PdnLayout lay;
    pdn_build_layout(c, &lay);
    HfTensor* ht = (HfTensor*)mallocCheck((size_t)(3 + 32 * c->n_layer) * sizeof(HfTensor));
    int nt = hf_tensors(c, cls, c->vocab_size, ht);
    *params = (float*)callocCheck(lay.num_elems, sizeof(float));
    *tied_head_ignored = 0;
    int* used = (int*)callocCheck((size_t)st.n + 1, sizeof(int));
    for (int i = 0; i < nt; i++) {
        const StEntry* e = st_find(&st, ht[i].name);
        if (e) { used[e - st.e] = 1; }
        if (ht[i].id < 0) { continue; }   // constants (pdn's main decay, a gate held open): nothing to keep
        float* dst = PDN_PARAM(*params, &lay, ht[i].id, ht[i].layer < 0 ? 0 : ht[i].layer);
        why = st_read(&st, ht[i].name, ht[i].ndim, ht[i].shape, dst);
        if (why) { fail(EXIT_BADFILE, "%s: %s (config.json: %s)", path, why, HF_MODEL_TYPE[cls]); }
    }
    for (int i = 0; i < st.n; i++) {
        if (used[i]) { continue; }
        if (c->tie_embeddings && strcmp(st.e[i].name, "lm_head.weight") == 0) { *tied_head_ignored = 1; continue; }
        fail(EXIT_BADFILE, "%s: tensor \"%s\" is not part of the %s model config.json describes (an option pdn.c "
             "does not have?)", path, st.e[i].name, HF_MODEL_TYPE[cls]);
    }
    free(used); free(ht);
    st_close(&st);
}

#endif // PDN_HF_H
