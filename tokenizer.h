/*
tokenizer.h: a byte-level BPE tokenizer (GPT-2's scheme), encode and decode, header-only C.

Files it reads:
  - GPT-2's published form: encoder.json (token string -> id, strings in GPT-2's byte->unicode alphabet) and
    vocab.bpe ("#version" line, then one merge "A B" per line, in rank order)
  - our binary form (.bin, magic "PDNTOKEN", described below; tokenizer_save writes it)
  - llm.c's gpt2_tokenizer.bin (decode only: it has no merges)
tokenizer_load(path) tells them apart: a directory means encoder.json + vocab.bpe inside it (or, in a Hugging Face
model directory, the same files named vocab.json + merges.txt); a file is recognised by its magic.

API (all functions fail() with a one-line reason and exit code 2 on a bad file):
  void   tokenizer_load(Tokenizer* t, const char* path);          // directory, our .bin or llm.c's .bin
  void   tokenizer_load_gpt2(Tokenizer* t, const char* encoder_json, const char* vocab_bpe);
  void   tokenizer_save(const Tokenizer* t, const char* path);    // our binary form (atomic write)
  void   tokenizer_save_gpt2(const Tokenizer* t, const char* encoder_json, const char* vocab_bpe);
  void   tokenizer_build(Tokenizer* t, const TokenizerParts* p, const char* what); // from tokens + merges
  void   tokenizer_free(Tokenizer* t);
  void   tokenizer_encode(Tokenizer* t, const void* text, size_t len, TokenBuf* out);   // appends ids
  size_t tokenizer_encode_part(Tokenizer* t, const void* text, size_t len, size_t pos, size_t max_bytes,
                               TokenBuf* out);   // encodes from pos for about max_bytes; returns where it stopped
  void   tokenizer_encode_doc(Tokenizer* t, const void* text, size_t len, TokenBuf* out);  // EOT + encode(text)
  size_t tokenizer_decode(const Tokenizer* t, const int* ids, size_t n, ByteBuf* out);    // appends bytes
  const uint8_t* tokenizer_token(const Tokenizer* t, int id, size_t* len);                // one token's bytes
  void   tokenizer_check_can_encode(const Tokenizer* t);          // fails (exit 2) if the vocabulary cannot encode
  size_t pretokenize_next(const uint8_t* s, size_t n, size_t i);  // end of the GPT-2 pre-token starting at i
  TokenBuf {int* ids; size_t n, cap} and ByteBuf {uint8_t* b; size_t n, cap}: zero-initialise, then tokbuf_push,
  tokbuf_free, bytebuf_append, bytebuf_free. Fields for users: t->vocab_size, t->eot_id (-1: none), t->n_merges.

Special tokens: encode treats its input as ordinary text, like llm.c's data scripts and tiktoken's
encode_ordinary: the characters "<|endoftext|>" in a document are encoded as text (7 tokens in GPT-2), never as
the EOT id, so no document can forge a document boundary. The EOT token enters only explicitly:
tokenizer_encode_doc() puts it before the document (llm.c's shard convention), or push t->eot_id yourself.

Encoding is exactly GPT-2's encoder.py: the text is split by GPT-2's pattern
    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
(hand-written below as a scanner over UTF-8 code points; classes from unicode_tables.h), then each piece's bytes
are merged by BPE: repeatedly take the adjacent pair with the lowest merge rank and merge all its occurrences left
to right (GPT-2's bpe()). A hash map gives pair -> rank, and a cache maps a piece's bytes to its ids, so common
words cost one lookup. A Tokenizer is not thread-safe (the cache and work buffers are inside it).

Invalid UTF-8: GPT-2 works on decoded strings and has no rule for bytes that are not UTF-8. We treat each byte
that does not start a valid, shortest-form UTF-8 sequence (stray continuation bytes, overlong forms, surrogates,
> U+10FFFF, truncated sequences) as one code point of class "other" (not letter, number or space). That keeps
the pre-tokenizer total (every byte lands in exactly one piece), matches GPT-2 on all valid text, and since BPE
works on bytes, decode(encode(x)) == x for every byte string x.

Our binary form (all integers little-endian uint32):
    "PDNTOKEN" (8 bytes) | version (1) | vocab_size | n_merges | n_special | eot_id (0xFFFFFFFF: none) | 0
    vocab_size x { len, len raw bytes }       token byte strings, by id
    n_merges   x { left id, right id }        merges in rank order; the result is the token whose bytes are
                                              left's + right's
    n_special  x { id }                       special tokens (never produced by encode; EOT is one of them)
    crc32                                     CRC-32 (zlib's) of every byte before it
*/
#ifndef PDN_TOKENIZER_H
#define PDN_TOKENIZER_H

#include "utils.h"
#include "unicode_tables.h"

#define TOKENIZER_MAGIC "PDNTOKEN"
#define TOKENIZER_VERSION 1
#define LLMC_TOKENIZER_MAGIC 20240328
#define TOKENIZER_CACHE_MAX_WORD 256       // pieces longer than this are not cached (rare, and would bloat it)
#define TOKENIZER_CACHE_MAX_ENTRIES (1u << 20)

// ----------------------------------------------------------------------------------------------------
// growable buffers of token ids and of bytes

typedef struct { int* ids; size_t n, cap; } TokenBuf;
typedef struct { uint8_t* b; size_t n, cap; } ByteBuf;

static void tokbuf_reserve(TokenBuf* tb, size_t n) {
    if (n <= tb->cap) { return; }
    size_t cap = tb->cap ? tb->cap : 1024;
    while (cap < n) { cap *= 2; }
    int* p = (int*)realloc(tb->ids, cap * sizeof(int));
    if (!p) { fail(EXIT_SYSTEM, "out of memory (token buffer of %zu ids)", cap); }
    tb->ids = p; tb->cap = cap;
}
static void tokbuf_push(TokenBuf* tb, int id) { tokbuf_reserve(tb, tb->n + 1); tb->ids[tb->n++] = id; }
static void tokbuf_free(TokenBuf* tb) { free(tb->ids); memset(tb, 0, sizeof(*tb)); }

static void bytebuf_append(ByteBuf* bb, const void* p, size_t n) {
    if (bb->n + n > bb->cap) {
        size_t cap = bb->cap ? bb->cap : 1024;
        while (cap < bb->n + n) { cap *= 2; }
        uint8_t* q = (uint8_t*)realloc(bb->b, cap);
        if (!q) { fail(EXIT_SYSTEM, "out of memory (byte buffer of %zu bytes)", cap); }
        bb->b = q; bb->cap = cap;
    }
    if (n) { memcpy(bb->b + bb->n, p, n); }
    bb->n += n;
}
static void bytebuf_free(ByteBuf* bb) { free(bb->b); memset(bb, 0, sizeof(*bb)); }

// the whole file in memory (plus a 0 byte after it, so text parsers may look one byte ahead)
static uint8_t* slurp_file(const char* path, size_t* n) {
    FILE* f = fopenCheck(path, "rb");
    long long sz = file_size(f);
    if (sz < 0) { fail(EXIT_BADFILE, "cannot stat '%s': %s", path, strerror(errno)); }
    uint8_t* buf = (uint8_t*)mallocCheck((size_t)sz + 1);
    freadCheck(buf, 1, (size_t)sz, f, path);
    fclose(f);
    buf[sz] = 0;
    *n = (size_t)sz;
    return buf;
}

// ----------------------------------------------------------------------------------------------------
// hash maps: PairMap (uint64 key -> uint64 value, open addressing) and BytesMap (byte string -> two uint32)

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return hash_u64(h ^ w);
}

#define PAIRMAP_EMPTY UINT64_MAX
typedef struct { uint64_t* key; uint64_t* val; size_t cap, n; } PairMap;

static uint64_t pair_key(int a, int b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static void pairmap_init(PairMap* m, size_t expected) {
    m->cap = 64;
    while (m->cap < 2 * expected) { m->cap *= 2; }
    m->key = (uint64_t*)mallocCheck(m->cap * sizeof(uint64_t));
    m->val = (uint64_t*)mallocCheck(m->cap * sizeof(uint64_t));
    for (size_t i = 0; i < m->cap; i++) { m->key[i] = PAIRMAP_EMPTY; }
    m->n = 0;
}

static void pairmap_free(PairMap* m) { free(m->key); free(m->val); memset(m, 0, sizeof(*m)); }

// the slot holding key, or the empty slot where it would go
static size_t pairmap_slot(const PairMap* m, uint64_t key) {
    size_t i = hash_u64(key) & (m->cap - 1);
    while (m->key[i] != key && m->key[i] != PAIRMAP_EMPTY) { i = (i + 1) & (m->cap - 1); }
    return i;
}

static int pairmap_get(const PairMap* m, uint64_t key, uint64_t* val) {
    if (!m->cap) { return 0; }
    size_t i = pairmap_slot(m, key);
    if (m->key[i] == PAIRMAP_EMPTY) { return 0; }
    *val = m->val[i];
    return 1;
}

static void pairmap_grow(PairMap* m) {
    PairMap bigger;
    pairmap_init(&bigger, m->cap);   // twice the slots
    for (size_t i = 0; i < m->cap; i++) {
        if (m->key[i] == PAIRMAP_EMPTY) { continue; }
        size_t j = pairmap_slot(&bigger, m->key[i]);
        bigger.key[j] = m->key[i]; bigger.val[j] = m->val[i]; bigger.n++;
    }
    pairmap_free(m);
    *m = bigger;
}

// a pointer to key's value, inserting it with value `init` if absent
static uint64_t* pairmap_ref(PairMap* m, uint64_t key, uint64_t init) {
    if (!m->cap) { pairmap_init(m, 16); }
    size_t i = pairmap_slot(m, key);
    if (m->key[i] == PAIRMAP_EMPTY) {
        if (2 * (m->n + 1) > m->cap) { pairmap_grow(m); i = pairmap_slot(m, key); }
        m->key[i] = key; m->val[i] = init; m->n++;
    }
    return &m->val[i];
}

typedef struct { uint64_t hash; size_t off; uint32_t len, a, b; } BytesEntry;
typedef struct {
    uint32_t* slot; size_t cap;      // entry index + 1 (0: empty); cap a power of two, at most half full
    BytesEntry* e; size_t n, ecap;
    ByteBuf arena;                   // the keys' bytes
} BytesMap;

static void bytesmap_free(BytesMap* m) { free(m->slot); free(m->e); bytebuf_free(&m->arena); memset(m, 0, sizeof(*m)); }

static void bytesmap_clear(BytesMap* m) {
    if (m->slot) { memset(m->slot, 0, m->cap * sizeof(uint32_t)); }
    m->n = 0; m->arena.n = 0;
}

// index of the entry with these bytes, or -1
static long bytesmap_find(const BytesMap* m, const uint8_t* k, size_t len, uint64_t h) {
    if (!m->cap) { return -1; }
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        uint32_t s = m->slot[i];
        if (!s) { return -1; }
        const BytesEntry* e = &m->e[s - 1];
        if (e->hash == h && e->len == len && memcmp(m->arena.b + e->off, k, len) == 0) { return (long)s - 1; }
    }
}

static void bytesmap_rehash(BytesMap* m, size_t cap) {
    free(m->slot);
    m->cap = cap;
    m->slot = (uint32_t*)callocCheck(cap, sizeof(uint32_t));
    for (size_t j = 0; j < m->n; j++) {
        size_t i = m->e[j].hash & (cap - 1);
        while (m->slot[i]) { i = (i + 1) & (cap - 1); }
        m->slot[i] = (uint32_t)(j + 1);
    }
}

// adds a key that is not in the map yet; returns its entry index
static size_t bytesmap_add(BytesMap* m, const uint8_t* k, size_t len, uint64_t h, uint32_t a, uint32_t b) {
    if (2 * (m->n + 1) > m->cap) { bytesmap_rehash(m, m->cap ? 2 * m->cap : 1024); }
    if (m->n == m->ecap) {
        m->ecap = m->ecap ? 2 * m->ecap : 1024;
        m->e = (BytesEntry*)realloc(m->e, m->ecap * sizeof(BytesEntry));
        if (!m->e) { fail(EXIT_SYSTEM, "out of memory (hash map)"); }
    }
    BytesEntry* e = &m->e[m->n];
    e->hash = h; e->off = m->arena.n; e->len = (uint32_t)len; e->a = a; e->b = b;
    bytebuf_append(&m->arena, k, len);
    size_t i = h & (m->cap - 1);
    while (m->slot[i]) { i = (i + 1) & (m->cap - 1); }
    m->slot[i] = (uint32_t)(m->n + 1);
    return m->n++;
}

// ----------------------------------------------------------------------------------------------------
// UTF-8 and the GPT-2 pre-tokenizer

// the class of a code point: ASCII from a table, the rest by binary search in unicode_tables.h
static const uint8_t ascii_class[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // \t..\r
    3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0,  // space, 0-9
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,  // A-Z
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,  // a-z
};

static int unicode_class(uint32_t cp) {
    if (cp < 128) { return ascii_class[cp]; }
    size_t lo = 0, hi = sizeof(unicode_ranges) / sizeof(unicode_ranges[0]);
    while (lo < hi) {   // first range with hi >= cp
        size_t mid = (lo + hi) / 2;
        if (unicode_ranges[mid].hi < cp) { lo = mid + 1; } else { hi = mid; }
    }
    if (lo < sizeof(unicode_ranges) / sizeof(unicode_ranges[0]) && unicode_ranges[lo].lo <= cp) {
        return unicode_ranges[lo].cls;
    }
    return UCLASS_OTHER;
}

// class of the "code point" at s[i]; an invalid byte is its own code point of class other
static int char_class_at(const uint8_t* s, size_t n, size_t i, size_t* len) {
    if (s[i] < 0x80) { *len = 1; return ascii_class[s[i]]; }
    int32_t cp = utf8_decode(s, n, i, len);
    return cp < 0 ? UCLASS_OTHER : unicode_class((uint32_t)cp);
}

// The end of the pre-token that starts at s[i] (i < n): GPT-2's pattern, alternatives tried in order,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Starting from a piece boundary depends on nothing before it, so a text can be encoded in parts.
static size_t pretokenize_next(const uint8_t* s, size_t n, size_t i) {
    // contractions: only these lowercase forms ("DON'T" gives "DON", "'", "T", as in GPT-2)
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t c = s[i + 1], d = i + 2 < n ? s[i + 2] : 0;
        if (c == 's' || c == 't' || c == 'm' || c == 'd') { return i + 2; }
        if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) { return i + 3; }
    }
    // an optional ASCII space, then a maximal run of letters, or of numbers, or of "other" (not space/letter/number)
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i, len;
    int cls = char_class_at(s, n, j, &len);
    if (cls != UCLASS_SPACE) {
        j += len;
        while (j < n && char_class_at(s, n, j, &len) == cls) { j += len; }
        return j;
    }
    // whitespace: \s+(?!\S) takes the run but leaves its last character when a non-space follows (so " word"
    // keeps its space); if that would leave nothing (a single space char before a non-space), \s+ takes it
    size_t last = i;
    j = i;
    while (j < n && char_class_at(s, n, j, &len) == UCLASS_SPACE) { last = j; j += len; }
    if (j == n || last == i) { return j; }
    return last;
}

// ----------------------------------------------------------------------------------------------------
// GPT-2's byte <-> unicode alphabet: printable bytes stand for themselves, the other 68 bytes are shifted to
// U+0100..U+0143, so every token is a printable string in encoder.json / vocab.bpe (space is 'Ġ' = U+0120).

static void gpt2_byte_alphabet(uint16_t byte_to_cp[256], int16_t cp_to_byte[324]) {
    for (int c = 0; c < 324; c++) { cp_to_byte[c] = -1; }
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = (uint16_t)(printable ? b : 256 + extra++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

// the order of the 256 byte tokens in GPT-2's encoder.json (printable bytes first), used for new vocabularies too
static void gpt2_byte_order(uint8_t order[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) { order[k++] = (uint8_t)b; }
    }
    for (int b = 0; b < 256; b++) {
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) { order[k++] = (uint8_t)b; }
    }
}

// ----------------------------------------------------------------------------------------------------
// the tokenizer

typedef struct {
    int vocab_size;
    int eot_id;                  // <|endoftext|>, -1 if the vocabulary has none
    int n_merges, n_special;
    int decode_only;             // llm.c's tokenizer file: no merges, so no encoding
    uint8_t* tok_bytes;          // token i = tok_bytes[tok_off[i] .. tok_off[i + 1])
    size_t* tok_off;
    uint8_t* is_special;         // [vocab_size]
    int* special;                // [n_special]
    int *merge_left, *merge_right, *merge_result;   // [n_merges], by rank
    int byte_token[256];         // the single-byte tokens (-1: missing; then the vocabulary cannot encode)
    PairMap ranks;               // (left, right) -> rank
    BytesMap cache;              // piece bytes -> (offset, count) in cache_ids
    TokenBuf cache_ids;
    int *w_id, *w_next, *w_prev, *w_merged;   // BPE work space for one piece
    uint64_t* w_heap;
    size_t w_cap;
} Tokenizer;

// what a vocabulary is made of; the loaders fill one and tokenizer_build checks it and derives the rest
typedef struct {
    int vocab_size;
    const uint8_t* bytes;        // token i = bytes[off[i] .. off[i + 1])
    const size_t* off;
    int n_merges;
    const int *left, *right;     // merges by rank
    int n_special;
    const int* special;
    int eot_id;                  // -1: none
    int decode_only;
} TokenizerParts;

static const uint8_t* tokenizer_token(const Tokenizer* t, int id, size_t* len) {
    if (id < 0 || id >= t->vocab_size) { *len = 0; return NULL; }
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_bytes + t->tok_off[id];
}

static void tokenizer_free(Tokenizer* t) {
    free(t->tok_bytes); free(t->tok_off); free(t->is_special); free(t->special);
    free(t->merge_left); free(t->merge_right); free(t->merge_result);
    pairmap_free(&t->ranks);
    bytesmap_free(&t->cache);
    tokbuf_free(&t->cache_ids);
    free(t->w_id); free(t->w_next); free(t->w_prev); free(t->w_merged); free(t->w_heap);
    memset(t, 0, sizeof(*t));
}

// Checks the parts (what: the file names, for messages) and builds the tokenizer: the merge results (the token
// whose bytes are left's + right's), the pair -> rank map and the single-byte tokens.
static void tokenizer_build(Tokenizer* t, const TokenizerParts* p, const char* what) {
    memset(t, 0, sizeof(*t));
    if (p->vocab_size < 1) { fail(EXIT_BADFILE, "%s: empty vocabulary", what); }
    int V = p->vocab_size;
    t->vocab_size = V;
    t->decode_only = p->decode_only;
    size_t nbytes = p->off[V];
    t->tok_bytes = (uint8_t*)mallocCheck(nbytes);
    memcpy(t->tok_bytes, p->bytes, nbytes);
    t->tok_off = (size_t*)mallocCheck((size_t)(V + 1) * sizeof(size_t));
    memcpy(t->tok_off, p->off, (size_t)(V + 1) * sizeof(size_t));
    t->is_special = (uint8_t*)callocCheck((size_t)V, 1);
    t->n_special = p->n_special;
    t->special = (int*)mallocCheck((size_t)p->n_special * sizeof(int));
    for (int i = 0; i < p->n_special; i++) {
        if (p->special[i] < 0 || p->special[i] >= V) {
            fail(EXIT_BADFILE, "%s: special token id %d outside the vocabulary (%d)", what, p->special[i], V);
        }
        t->special[i] = p->special[i];
        t->is_special[p->special[i]] = 1;
    }
    if (p->eot_id >= V) { fail(EXIT_BADFILE, "%s: end-of-text id %d outside the vocabulary (%d)", what, p->eot_id, V); }
    t->eot_id = p->eot_id;
    if (t->eot_id >= 0) { t->is_special[t->eot_id] = 1; }
    // ordinary token bytes -> id (a vocabulary must not hold the same bytes twice, or merges would be ambiguous)
    BytesMap ids;
    memset(&ids, 0, sizeof ids);
    for (int b = 0; b < 256; b++) { t->byte_token[b] = -1; }
    for (int i = 0; i < V; i++) {
        const uint8_t* s = t->tok_bytes + t->tok_off[i];
        size_t len = t->tok_off[i + 1] - t->tok_off[i];
        if (t->is_special[i]) { continue; }
        uint64_t h = hash_bytes(s, len);
        if (bytesmap_find(&ids, s, len, h) >= 0) {   // harmless in a decode-only vocabulary (no merges to resolve)
            if (!p->decode_only) { fail(EXIT_BADFILE, "%s: token %d has the same bytes as an earlier token", what, i); }
            continue;
        }
        bytesmap_add(&ids, s, len, h, (uint32_t)i, 0);
        if (len == 1 && t->byte_token[s[0]] < 0) { t->byte_token[s[0]] = i; }
    }
    t->n_merges = p->n_merges;
    t->merge_left = (int*)mallocCheck((size_t)p->n_merges * sizeof(int));
    t->merge_right = (int*)mallocCheck((size_t)p->n_merges * sizeof(int));
    t->merge_result = (int*)mallocCheck((size_t)p->n_merges * sizeof(int));
    pairmap_init(&t->ranks, (size_t)p->n_merges);
    ByteBuf cat;
    memset(&cat, 0, sizeof cat);
    for (int r = 0; r < p->n_merges; r++) {
        int a = p->left[r], b = p->right[r];
        if (a < 0 || a >= V || b < 0 || b >= V || t->is_special[a] || t->is_special[b]) {
            fail(EXIT_BADFILE, "%s: merge %d (%d, %d) refers to a token outside the ordinary vocabulary", what, r, a, b);
        }
        cat.n = 0;
        bytebuf_append(&cat, t->tok_bytes + t->tok_off[a], t->tok_off[a + 1] - t->tok_off[a]);
        bytebuf_append(&cat, t->tok_bytes + t->tok_off[b], t->tok_off[b + 1] - t->tok_off[b]);
        long e = bytesmap_find(&ids, cat.b, cat.n, hash_bytes(cat.b, cat.n));
        if (e < 0) {
            fail(EXIT_BADFILE, "%s: merge %d (%d, %d) makes a token that is not in the vocabulary", what, r, a, b);
        }
        uint64_t* rank = pairmap_ref(&t->ranks, pair_key(a, b), UINT64_MAX);
        if (*rank != UINT64_MAX) {
            fail(EXIT_BADFILE, "%s: merge %d (%d, %d) repeats merge %llu", what, r, a, b, (unsigned long long)*rank);
        }
        *rank = (uint64_t)r;
        t->merge_left[r] = a; t->merge_right[r] = b; t->merge_result[r] = (int)ids.e[e].a;
    }
    bytebuf_free(&cat);
    bytesmap_free(&ids);
}

// ---- encoding

static void bpe_reserve(Tokenizer* t, size_t n) {
    if (n <= t->w_cap) { return; }
    size_t cap = t->w_cap ? t->w_cap : 64;
    while (cap < n) { cap *= 2; }
    free(t->w_id); free(t->w_next); free(t->w_prev); free(t->w_merged); free(t->w_heap);
    t->w_id = (int*)mallocCheck(cap * sizeof(int));
    t->w_next = (int*)mallocCheck(cap * sizeof(int));
    t->w_prev = (int*)mallocCheck(cap * sizeof(int));
    t->w_merged = (int*)mallocCheck(cap * sizeof(int));
    t->w_heap = (uint64_t*)mallocCheck(3 * cap * sizeof(uint64_t));   // each merge pushes at most 2 new pairs
    t->w_cap = cap;
}

// min-heap of (rank << 32 | position): pops the lowest rank, and within a rank the leftmost position
static void heap_push(uint64_t* h, size_t* n, uint64_t x) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > x) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = x;
}

static uint64_t heap_pop(uint64_t* h, size_t* n) {
    uint64_t top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) { break; }
        if (c + 1 < *n && h[c + 1] < h[c]) { c++; }
        if (h[c] >= x) { break; }
        h[i] = h[c]; i = c;
    }
    if (*n) { h[i] = x; }
    return top;
}

// push the pair starting at symbol i, if it has a merge
static void bpe_push_pair(Tokenizer* t, size_t* hn, int i) {
    if (i < 0 || t->w_next[i] < 0) { return; }
    int j = t->w_next[i];
    uint64_t rank;
    if (pairmap_get(&t->ranks, pair_key(t->w_id[i], t->w_id[j]), &rank)) {
        heap_push(t->w_heap, hn, (rank << 32) | (uint32_t)i);
    }
}

// BPE on one piece, as GPT-2's bpe(): while some adjacent pair has a merge, take the lowest-rank pair and merge
// all its occurrences, left to right, in the piece as it was at the start of that round. The heap holds every
// mergeable pair; entries that went stale (a symbol was merged away or changed) are dropped when popped.
static void bpe_piece(Tokenizer* t, const uint8_t* w, size_t n, TokenBuf* out) {
    bpe_reserve(t, n);
    int *id = t->w_id, *next = t->w_next, *prev = t->w_prev;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_token[w[i]];
        next[i] = i + 1 < n ? (int)i + 1 : -1;
        prev[i] = (int)i - 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) { bpe_push_pair(t, &hn, (int)i); }
    while (hn > 0) {
        uint32_t rank = (uint32_t)(t->w_heap[0] >> 32);
        int a = t->merge_left[rank], b = t->merge_right[rank], m = t->merge_result[rank];
        size_t nm = 0;
        while (hn > 0 && (uint32_t)(t->w_heap[0] >> 32) == rank) {
            int i = (int)(uint32_t)heap_pop(t->w_heap, &hn), j = next[i];
            if (id[i] != a || j < 0 || id[j] != b) { continue; }   // stale: this pair is gone
            id[i] = m;
            id[j] = -1;
            next[i] = next[j];
            if (next[j] >= 0) { prev[next[j]] = i; }
            t->w_merged[nm++] = i;
        }
        for (size_t k = 0; k < nm; k++) {   // the new pairs around each merged symbol
            int i = t->w_merged[k];
            if (id[i] == m) { bpe_push_pair(t, &hn, prev[i]); bpe_push_pair(t, &hn, i); }
        }
    }
    for (int i = 0; i >= 0; i = next[i]) { tokbuf_push(out, id[i]); }
}

static void encode_piece(Tokenizer* t, const uint8_t* w, size_t n, TokenBuf* out) {
    if (n == 1) { tokbuf_push(out, t->byte_token[w[0]]); return; }
    if (n > TOKENIZER_CACHE_MAX_WORD) { bpe_piece(t, w, n, out); return; }
    uint64_t h = hash_bytes(w, n);
    long e = bytesmap_find(&t->cache, w, n, h);
    if (e >= 0) {
        const BytesEntry* en = &t->cache.e[e];
        tokbuf_reserve(out, out->n + en->b);
        memcpy(out->ids + out->n, t->cache_ids.ids + en->a, en->b * sizeof(int));
        out->n += en->b;
        return;
    }
    size_t start = out->n;
    bpe_piece(t, w, n, out);
    if (t->cache.n >= TOKENIZER_CACHE_MAX_ENTRIES) { bytesmap_clear(&t->cache); t->cache_ids.n = 0; }   // bounded memory
    size_t off = t->cache_ids.n, cnt = out->n - start;
    tokbuf_reserve(&t->cache_ids, off + cnt);
    memcpy(t->cache_ids.ids + off, out->ids + start, cnt * sizeof(int));
    t->cache_ids.n += cnt;
    bytesmap_add(&t->cache, w, n, h, (uint32_t)off, (uint32_t)cnt);
}

static void tokenizer_check_can_encode(const Tokenizer* t) {
    if (t->decode_only) {
        fail(EXIT_BADFILE, "this tokenizer file (llm.c's format) has no merges and can only decode\n"
             "  hint: encode with encoder.json + vocab.bpe or our .bin (tokenizer_save / train_bpe)");
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_token[b] < 0) {
            fail(EXIT_BADFILE, "the vocabulary has no token for byte 0x%02x, so it cannot encode every text", b);
        }
    }
}

// Encodes text[pos..] piece by piece until at least max_bytes are done (or the text ends); returns the new
// position, always a piece boundary, so a long text can be encoded in parts with the same result.
static size_t tokenizer_encode_part(Tokenizer* t, const void* text, size_t len, size_t pos, size_t max_bytes, TokenBuf* out) {
    tokenizer_check_can_encode(t);
    const uint8_t* s = (const uint8_t*)text;
    size_t stop = max_bytes >= len - pos ? len : pos + max_bytes;
    while (pos < stop) {
        size_t end = pretokenize_next(s, len, pos);
        encode_piece(t, s + pos, end - pos, out);
        pos = end;
    }
    return pos;
}

// ordinary text -> ids, appended to out (special-token strings in the text are encoded as text)
static void tokenizer_encode(Tokenizer* t, const void* text, size_t len, TokenBuf* out) {
    tokenizer_encode_part(t, text, len, 0, len, out);
}

// one document as it goes into a shard: EOT, then the text (llm.c's convention: EOT before each document)
static void tokenizer_encode_doc(Tokenizer* t, const void* text, size_t len, TokenBuf* out) {
    if (t->eot_id < 0) { fail(EXIT_BADFILE, "the vocabulary has no <|endoftext|> token to separate documents"); }
    tokbuf_push(out, t->eot_id);
    tokenizer_encode(t, text, len, out);
}

// ids -> bytes, appended to out; ids outside the vocabulary are skipped and counted (the return value)
static size_t tokenizer_decode(const Tokenizer* t, const int* ids, size_t n, ByteBuf* out) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t* s = tokenizer_token(t, ids[i], &len);
        if (!s) { bad++; continue; }
        bytebuf_append(out, s, len);
    }
    return bad;
}

// ----------------------------------------------------------------------------------------------------
// loading and saving

// a little-endian reader over a file held in memory; running past the end is a truncated file
typedef struct { const uint8_t* p; size_t n, i; const char* path; } Reader;

static const uint8_t* reader_take(Reader* r, size_t k) {
    if (k > r->n - r->i) {
        fail(EXIT_BADFILE, "%s: file is truncated (needed %zu more bytes at offset %zu, file has %zu)",
             r->path, k, r->i, r->n);
    }
    const uint8_t* p = r->p + r->i;
    r->i += k;
    return p;
}

static uint32_t reader_u32(Reader* r) { uint32_t v; memcpy(&v, reader_take(r, 4), 4); return v; }

// our binary form (see the top of this file)
static void tokenizer_load_bin(Tokenizer* t, const uint8_t* buf, size_t n, const char* path) {
    Reader r = {buf, n, 0, path};
    reader_take(&r, 8);
    uint32_t version = reader_u32(&r);
    if (version != TOKENIZER_VERSION) {
        fail(EXIT_BADFILE, "%s: tokenizer version %u, this build reads version %d", path, version, TOKENIZER_VERSION);
    }
    // the checksum first, so that a damaged count cannot send the parser astray
    if (n < 36) { fail(EXIT_BADFILE, "%s: file is truncated (%zu bytes, a tokenizer has at least 36)", path, n); }
    uint32_t crc;
    memcpy(&crc, buf + n - 4, 4);
    if (crc32_update(0, buf, n - 4) != crc) {
        fail(EXIT_BADFILE, "%s: checksum mismatch: the file is truncated or corrupted", path);
    }
    TokenizerParts p;
    memset(&p, 0, sizeof p);
    p.vocab_size = (int)reader_u32(&r);
    p.n_merges = (int)reader_u32(&r);
    p.n_special = (int)reader_u32(&r);
    uint32_t eot = reader_u32(&r);
    p.eot_id = eot == 0xFFFFFFFFu ? -1 : (int)eot;
    reader_u32(&r);
    if (p.vocab_size <= 0 || p.n_merges < 0 || p.n_special < 0 || (size_t)p.vocab_size > n || (size_t)p.n_merges > n ||
        (size_t)p.n_special > n) {
        fail(EXIT_BADFILE, "%s: implausible counts (vocab %d, merges %d, special %d)", path, p.vocab_size, p.n_merges,
             p.n_special);
    }
    size_t* off = (size_t*)mallocCheck((size_t)(p.vocab_size + 1) * sizeof(size_t));
    ByteBuf bytes;
    memset(&bytes, 0, sizeof bytes);
    off[0] = 0;
    for (int i = 0; i < p.vocab_size; i++) {
        uint32_t len = reader_u32(&r);
        bytebuf_append(&bytes, reader_take(&r, len), len);
        off[i + 1] = bytes.n;
    }
    int* lr = (int*)mallocCheck((size_t)p.n_merges * 2 * sizeof(int));
    for (int k = 0; k < 2 * p.n_merges; k++) { lr[k] = (int)reader_u32(&r); }
    int* left = (int*)mallocCheck((size_t)p.n_merges * sizeof(int));
    int* right = (int*)mallocCheck((size_t)p.n_merges * sizeof(int));
    for (int k = 0; k < p.n_merges; k++) { left[k] = lr[2 * k]; right[k] = lr[2 * k + 1]; }
    int* special = (int*)mallocCheck((size_t)p.n_special * sizeof(int));
    for (int k = 0; k < p.n_special; k++) { special[k] = (int)reader_u32(&r); }
    reader_u32(&r);   // the crc, checked above
    if (r.i != n) { fail(EXIT_BADFILE, "%s: %zu unexpected bytes after the end of the tokenizer", path, n - r.i); }
    p.bytes = bytes.b; p.off = off; p.left = left; p.right = right; p.special = special;
    tokenizer_build(t, &p, path);
    bytebuf_free(&bytes); free(off); free(lr); free(left); free(right); free(special);
}

// llm.c's gpt2_tokenizer.bin: uint32 header[256] ([0] magic 20240328, [1] version 1 (EOT is 50256) or 2 ([3] is
// the EOT id), [2] number of tokens), then per token a uint8 length and that many bytes. Decode only.
static void tokenizer_load_llmc(Tokenizer* t, const uint8_t* buf, size_t n, const char* path) {
    Reader r = {buf, n, 0, path};
    uint32_t header[256];
    memcpy(header, reader_take(&r, sizeof(header)), sizeof(header));
    if (header[1] != 1 && header[1] != 2) {
        fail(EXIT_BADFILE, "%s: llm.c tokenizer version %u, expected 1 or 2", path, header[1]);
    }
    TokenizerParts p;
    memset(&p, 0, sizeof p);
    p.vocab_size = (int)header[2];
    if (header[2] == 0 || header[2] > n) { fail(EXIT_BADFILE, "%s: implausible vocabulary size %u", path, header[2]); }
    p.eot_id = header[1] == 1 ? 50256 : (int)header[3];
    if (p.eot_id >= p.vocab_size) {
        fail(EXIT_BADFILE, "%s: end-of-text id %d outside the vocabulary (%d)", path, p.eot_id, p.vocab_size);
    }
    size_t* off = (size_t*)mallocCheck((size_t)(p.vocab_size + 1) * sizeof(size_t));
    ByteBuf bytes;
    memset(&bytes, 0, sizeof bytes);
    off[0] = 0;
    for (int i = 0; i < p.vocab_size; i++) {
        uint8_t len = *reader_take(&r, 1);
        bytebuf_append(&bytes, reader_take(&r, len), len);
        off[i + 1] = bytes.n;
    }
    p.n_special = 1;
    p.special = &p.eot_id;
    p.bytes = bytes.b; p.off = off;
    p.decode_only = 1;
    tokenizer_build(t, &p, path);
    bytebuf_free(&bytes); free(off);
}

// ---- a JSON reader sufficient for encoder.json: one object of string keys and integer values

typedef struct { const uint8_t* s; size_t n, i; const char* path; } Json;

static void json_fail(const Json* j, const char* what) {
    fail(EXIT_BADFILE, "%s: not a valid encoder.json (%s at byte %zu)", j->path, what, j->i);
}

static void json_ws(Json* j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) { j->i++; }
}

static void json_expect(Json* j, char c) {
    json_ws(j);
    if (j->i >= j->n || j->s[j->i] != (uint8_t)c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        json_fail(j, msg);
    }
    j->i++;
}

static uint32_t json_hex4(Json* j) {
    if (j->n - j->i < 4) { json_fail(j, "truncated \\u escape"); }
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = j->s[j->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) { json_fail(j, "bad \\u escape"); }
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

static void utf8_append(ByteBuf* out, uint32_t cp) {
    uint8_t b[4];
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const uint8_t lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    for (size_t k = n - 1; k > 0; k--) { b[k] = (uint8_t)(0x80 | (cp & 0x3F)); cp >>= 6; }   // continuation bytes
    b[0] = (uint8_t)(lead[n] | cp);
    bytebuf_append(out, b, n);
}

// a JSON string, decoded to UTF-8 into out
static void json_string(Json* j, ByteBuf* out) {
    json_expect(j, '"');
    out->n = 0;
    for (;;) {
        if (j->i >= j->n) { json_fail(j, "unterminated string"); }
        uint8_t c = j->s[j->i++];
        if (c == '"') { return; }
        if (c < 0x20) { json_fail(j, "control character in string"); }
        if (c != '\\') { bytebuf_append(out, &c, 1); continue; }
        if (j->i >= j->n) { json_fail(j, "unterminated escape"); }
        c = j->s[j->i++];
        const char* simple = strchr("\"\\/bfnrt", c);
        if (simple && c) {   // \" \\ \/ \b \f \n \r \t
            uint8_t v = (uint8_t)("\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]);
            bytebuf_append(out, &v, 1);
            continue;
        }
        if (c != 'u') { json_fail(j, "bad escape"); }
        uint32_t cp = json_hex4(j);
        if (cp >= 0xD800 && cp <= 0xDBFF) {   // a surrogate pair
            if (j->n - j->i < 6 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') { json_fail(j, "lone high surrogate"); }
            j->i += 2;
            uint32_t lo = json_hex4(j);
            if (lo < 0xDC00 || lo > 0xDFFF) { json_fail(j, "bad low surrogate"); }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) { json_fail(j, "lone low surrogate"); }
        utf8_append(out, cp);
    }
}

static long long json_int(Json* j) {
    json_ws(j);
    size_t start = j->i;
    long long v = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9' && j->i - start < 10) { v = v * 10 + (j->s[j->i++] - '0'); }
    if (j->i == start || v > INT32_MAX || (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')) {
        json_fail(j, "expected a token id (0 .. 2^31-1)");
    }
    return v;
}

// a string in GPT-2's byte alphabet -> raw bytes; -1 if a character is outside the alphabet
static int gpt2_unalphabet(const ByteBuf* s, ByteBuf* out, const int16_t cp_to_byte[324]) {
    out->n = 0;
    for (size_t i = 0; i < s->n;) {
        size_t len;
        int32_t cp = utf8_decode(s->b, s->n, i, &len);
        if (cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) { return -1; }
        uint8_t b = (uint8_t)cp_to_byte[cp];
        bytebuf_append(out, &b, 1);
        i += len;
    }
    return 0;
}

// GPT-2's published form. The only special token is "<|endoftext|>" (the EOT), found by name.
static void tokenizer_load_gpt2(Tokenizer* t, const char* encoder_json, const char* vocab_bpe) {
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    gpt2_byte_alphabet(byte_to_cp, cp_to_byte);
    size_t n;
    uint8_t* text = slurp_file(encoder_json, &n);
    Json j = {text, n, 0, encoder_json};
    // entries: key bytes (raw, after undoing the alphabet) -> id
    ByteBuf key, raw, all;
    memset(&key, 0, sizeof key); memset(&raw, 0, sizeof raw); memset(&all, 0, sizeof all);
    size_t cap = 1024, count = 0;
    size_t* koff = (size_t*)mallocCheck(cap * sizeof(size_t));
    int* kid = (int*)mallocCheck(cap * sizeof(int));
    int eot = -1;
    json_expect(&j, '{');
    json_ws(&j);
    if (j.i < j.n && j.s[j.i] == '}') { json_fail(&j, "empty vocabulary"); }
    for (;;) {
        json_string(&j, &key);
        json_expect(&j, ':');
        long long id = json_int(&j);
        if (key.n == 13 && memcmp(key.b, "<|endoftext|>", 13) == 0) { eot = (int)id; }
        if (gpt2_unalphabet(&key, &raw, cp_to_byte) != 0) {
            fail(EXIT_BADFILE, "%s: token %lld ('%.*s') has a character outside GPT-2's byte alphabet", encoder_json, id,
                 (int)key.n, key.b);
        }
        if (count + 1 >= cap) {
            cap *= 2;
            koff = (size_t*)realloc(koff, cap * sizeof(size_t)); kid = (int*)realloc(kid, cap * sizeof(int));
            if (!koff || !kid) { fail(EXIT_SYSTEM, "out of memory reading %s", encoder_json); }
        }
        koff[count] = all.n; kid[count] = (int)id; count++;
        bytebuf_append(&all, raw.b, raw.n);
        json_ws(&j);
        if (j.i < j.n && j.s[j.i] == ',') { j.i++; continue; }
        json_expect(&j, '}');
        break;
    }
    json_ws(&j);
    if (j.i != j.n) { json_fail(&j, "unexpected text after the object"); }
    koff[count] = all.n;
    // ids must be exactly 0 .. count-1: place each entry at its id
    TokenizerParts p;
    memset(&p, 0, sizeof p);
    p.vocab_size = (int)count;
    size_t* off = (size_t*)mallocCheck((count + 1) * sizeof(size_t));
    int* where = (int*)mallocCheck(count * sizeof(int));
    for (size_t i = 0; i < count; i++) { where[i] = -1; }
    for (size_t k = 0; k < count; k++) {
        if (kid[k] < 0 || (size_t)kid[k] >= count) {
            fail(EXIT_BADFILE, "%s: id %d outside 0..%zu (ids must be dense)", encoder_json, kid[k], count - 1);
        }
        if (where[kid[k]] >= 0) { fail(EXIT_BADFILE, "%s: id %d appears twice", encoder_json, kid[k]); }
        where[kid[k]] = (int)k;
    }
    ByteBuf bytes;
    memset(&bytes, 0, sizeof bytes);
    off[0] = 0;
    for (size_t i = 0; i < count; i++) {
        size_t k = (size_t)where[i];
        bytebuf_append(&bytes, all.b + koff[k], koff[k + 1] - koff[k]);
        off[i + 1] = bytes.n;
    }
    free(text);
    // vocab.bpe: "#version: ..." then "A B" per line; A and B are token strings; their ids via the bytes map
    BytesMap ids;
    memset(&ids, 0, sizeof ids);
    for (size_t i = 0; i < count; i++) {
        if ((int)i == eot) { continue; }
        const uint8_t* s = bytes.b + off[i];
        size_t len = off[i + 1] - off[i];
        uint64_t h = hash_bytes(s, len);
        if (bytesmap_find(&ids, s, len, h) < 0) { bytesmap_add(&ids, s, len, h, (uint32_t)i, 0); }
    }
    text = slurp_file(vocab_bpe, &n);
    if (n == 0) { // (freed first: the pointer is dead on this path, so a leak checker would count it)
        free(text);
        fail(EXIT_BADFILE, "%s is empty (a vocab.bpe holds a #version line, then one merge per line)", vocab_bpe);
    }
    size_t mcap = 1024;
    int* left = (int*)mallocCheck(mcap * sizeof(int));
    int* right = (int*)mallocCheck(mcap * sizeof(int));
    int nm = 0;
    size_t line = 0;
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && text[e] != '\n') { e++; }
        line++;
        size_t le = e > i && text[e - 1] == '\r' ? e - 1 : e;
        if (le > i && !(line == 1 && text[i] == '#')) {
            size_t sp = i;
            while (sp < le && text[sp] != ' ') { sp++; }
            if (sp == le || sp == i || sp + 1 == le || memchr(text + sp + 1, ' ', le - sp - 1)) {
                fail(EXIT_BADFILE, "%s:%zu: expected two tokens separated by one space", vocab_bpe, line);
            }
            int lr[2];
            for (int side = 0; side < 2; side++) {
                key.n = 0;
                if (side == 0) { bytebuf_append(&key, text + i, sp - i); }
                else { bytebuf_append(&key, text + sp + 1, le - sp - 1); }
                long ent = -1;
                if (gpt2_unalphabet(&key, &raw, cp_to_byte) == 0) { ent = bytesmap_find(&ids, raw.b, raw.n, hash_bytes(raw.b, raw.n)); }
                if (ent < 0) {
                    fail(EXIT_BADFILE, "%s:%zu: token '%.*s' is not in %s",
                         vocab_bpe, line, (int)key.n, key.b, encoder_json);
                }
                lr[side] = (int)ids.e[ent].a;
            }
            if ((size_t)nm == mcap) {
                mcap *= 2;
                left = (int*)realloc(left, mcap * sizeof(int)); right = (int*)realloc(right, mcap * sizeof(int));
                if (!left || !right) { fail(EXIT_SYSTEM, "out of memory reading %s", vocab_bpe); }
            }
            left[nm] = lr[0]; right[nm] = lr[1]; nm++;
        }
        i = e + 1;
    }
    free(text);
    p.bytes = bytes.b; p.off = off;
    p.n_merges = nm; p.left = left; p.right = right;
    p.eot_id = eot;
    p.n_special = eot >= 0 ? 1 : 0;
    p.special = &eot;
    char what[4200];
    snprintf(what, sizeof what, "%s + %s", encoder_json, vocab_bpe);
    tokenizer_build(t, &p, what);
    // every token of more than one byte must be what some merge makes: otherwise vocab.bpe is cut short or belongs
    // to another vocabulary, and encoding would silently never produce those tokens (with no merges at all, a
    // byte-level tokenizer)
    uint8_t* made = (uint8_t*)callocCheck((size_t)t->vocab_size, 1);
    for (int r = 0; r < t->n_merges; r++) { made[t->merge_result[r]] = 1; }
    int unmade = 0, first = -1;
    for (int i = 0; i < t->vocab_size; i++) {
        if (!t->is_special[i] && t->tok_off[i + 1] - t->tok_off[i] > 1 && !made[i]) { unmade++; first = first < 0 ? i : first; }
    }
    free(made);
    if (unmade) {
        fail(EXIT_BADFILE, "%s: %d tokens of %s (the first: id %d) are made by none of its %d merges: vocab.bpe is cut "
             "short or belongs to another vocabulary", vocab_bpe, unmade, encoder_json, first, t->n_merges);
    }
    bytesmap_free(&ids);
    bytebuf_free(&key); bytebuf_free(&raw); bytebuf_free(&all); bytebuf_free(&bytes);
    free(koff); free(kid); free(off); free(where); free(left); free(right);
}

// a directory holding encoder.json + vocab.bpe, our .bin, or llm.c's .bin
static void tokenizer_load(Tokenizer* t, const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { fail(EXIT_BADFILE, "cannot open tokenizer '%s': %s", path, strerror(errno)); }
    if (S_ISDIR(st.st_mode)) {
        char ej[2048], vb[2048];
        snprintf(ej, sizeof ej, "%s/encoder.json", path);
        snprintf(vb, sizeof vb, "%s/vocab.bpe", path);
        if (!file_exists(ej)) {   // a Hugging Face directory names the same two files vocab.json and merges.txt
            snprintf(ej, sizeof ej, "%s/vocab.json", path);
            snprintf(vb, sizeof vb, "%s/merges.txt", path);
            if (!file_exists(ej)) { snprintf(ej, sizeof ej, "%s/encoder.json", path); snprintf(vb, sizeof vb, "%s/vocab.bpe", path); }
        }
        tokenizer_load_gpt2(t, ej, vb);
        return;
    }
    size_t n;
    uint8_t* buf = slurp_file(path, &n);
    uint32_t magic = 0;
    if (n >= 4) { memcpy(&magic, buf, 4); }
    if (n >= 8 && memcmp(buf, TOKENIZER_MAGIC, 8) == 0) { tokenizer_load_bin(t, buf, n, path); }
    else if (magic == LLMC_TOKENIZER_MAGIC) { tokenizer_load_llmc(t, buf, n, path); }
    else {
        fail(EXIT_BADFILE, "%s: not a tokenizer file (bad magic)\n  hint: give our .bin (magic PDNTOKEN), llm.c's "
             "gpt2_tokenizer.bin, or a directory with encoder.json and vocab.bpe", path);
    }
    free(buf);
}

static void put_u32(ByteBuf* b, uint32_t v) { bytebuf_append(b, &v, 4); }

static void write_atomic(const char* path, const ByteBuf* b) {
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(b->b, 1, b->n, af.f);
    atomic_commit(&af);
}

static void tokenizer_save(const Tokenizer* t, const char* path) {
    ByteBuf b;
    memset(&b, 0, sizeof b);
    bytebuf_append(&b, TOKENIZER_MAGIC, 8);
    put_u32(&b, TOKENIZER_VERSION);
    put_u32(&b, (uint32_t)t->vocab_size);
    put_u32(&b, (uint32_t)t->n_merges);
    put_u32(&b, (uint32_t)t->n_special);
    put_u32(&b, t->eot_id < 0 ? 0xFFFFFFFFu : (uint32_t)t->eot_id);
    put_u32(&b, 0);
    for (int i = 0; i < t->vocab_size; i++) {
        size_t len;
        const uint8_t* s = tokenizer_token(t, i, &len);
        put_u32(&b, (uint32_t)len);
        bytebuf_append(&b, s, len);
    }
    for (int r = 0; r < t->n_merges; r++) { put_u32(&b, (uint32_t)t->merge_left[r]); put_u32(&b, (uint32_t)t->merge_right[r]); }
    for (int k = 0; k < t->n_special; k++) { put_u32(&b, (uint32_t)t->special[k]); }
    put_u32(&b, crc32_update(0, b.b, b.n));
    write_atomic(path, &b);
    bytebuf_free(&b);
}

// a token as a JSON string in GPT-2's byte alphabet, escaped like Python's json.dumps (ensure_ascii)
static void json_put_token(ByteBuf* out, const uint8_t* s, size_t len, const uint16_t byte_to_cp[256]) {
    bytebuf_append(out, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        uint32_t cp = byte_to_cp[s[i]];
        char esc[8];
        if (cp == '"' || cp == '\\') { esc[0] = '\\'; esc[1] = (char)cp; bytebuf_append(out, esc, 2); }
        else if (cp < 0x7F) { char c = (char)cp; bytebuf_append(out, &c, 1); }   // printable ASCII (controls are remapped)
        else { snprintf(esc, sizeof esc, "\\u%04x", cp); bytebuf_append(out, esc, 6); }
    }
    bytebuf_append(out, "\"", 1);
}

static void tokenizer_save_gpt2(const Tokenizer* t, const char* encoder_json, const char* vocab_bpe) {
    if (t->decode_only) { fail(EXIT_USAGE, "this tokenizer has no merges (llm.c's format): cannot write vocab.bpe"); }
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    gpt2_byte_alphabet(byte_to_cp, cp_to_byte);
    ByteBuf b;
    memset(&b, 0, sizeof b);
    bytebuf_append(&b, "{", 1);
    for (int i = 0; i < t->vocab_size; i++) {
        size_t len;
        const uint8_t* s = tokenizer_token(t, i, &len);
        char num[32];
        if (i) { bytebuf_append(&b, ", ", 2); }
        json_put_token(&b, s, len, byte_to_cp);
        snprintf(num, sizeof num, ": %d", i);
        bytebuf_append(&b, num, strlen(num));
    }
    bytebuf_append(&b, "}", 1);
    write_atomic(encoder_json, &b);
    b.n = 0;
    bytebuf_append(&b, "#version: 0.2\n", 14);
    for (int r = 0; r < t->n_merges; r++) {
        for (int side = 0; side < 2; side++) {
            size_t len;
            const uint8_t* s = tokenizer_token(t, side ? t->merge_right[r] : t->merge_left[r], &len);
            for (size_t i = 0; i < len; i++) { utf8_append(&b, byte_to_cp[s[i]]); }
            bytebuf_append(&b, side ? "\n" : " ", 1);
        }
    }
    write_atomic(vocab_bpe, &b);
    bytebuf_free(&b);
}

#endif // PDN_TOKENIZER_H
