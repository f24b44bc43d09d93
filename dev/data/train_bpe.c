/*
train_bpe.c: learns a byte-level BPE vocabulary (GPT-2's scheme) from raw text files.

    ./dev/data/train_bpe --vocab-size 4096 --out-dir out/tok4k ../shared/data/tinyshakespeare.txt

writes out/tok4k/encoder.json + vocab.bpe (GPT-2's published form) and out/tok4k/tokenizer.bin (ours); any of
them loads with tokenizer.h. The vocabulary: ids 0..255 are the 256 bytes (in GPT-2's order, so they have
GPT-2's ids), then one token per merge in the order learned, then <|endoftext|> (the only special token) last.

The algorithm: split every file with GPT-2's pre-tokenizer (tokenizer.h), count each distinct piece; a piece is
a sequence of symbols, at first its bytes. Then repeatedly:
  - the pair count of adjacent symbols (x, y) is the sum, over every place in every piece where x is followed by
    y, of that piece's count (overlapping places count: "aaa" holds the pair (a, a) twice);
  - take the pair with the highest count; ties go to the pair whose left token's bytes are smallest in byte
    order (memcmp, a prefix sorting first), then the right token's bytes: a rule that does not depend on ids,
    hash order or the input order;
  - stop if that count is below --min-count (default 2) or the vocabulary is full; otherwise add the merged token
    and replace the pair in every piece, left to right without overlap (as GPT-2's bpe() does when encoding).
Counts are kept up to date incrementally (a max-heap with stale entries dropped when popped, and for each pair
the pieces where it occurs), so a merge costs time in proportion to the pieces it touches.
*/
#include "data_tools.h"

typedef struct { uint64_t count; int pair; } HeapItem;

typedef struct {
    // tokens learned so far: bytes and offsets
    ByteBuf tok;
    size_t* tok_off;
    int n_tok;
    // pieces: symbols (shrinking in place as merges apply), length, count
    int* sym;
    size_t* sym_off;
    int* len;
    uint64_t* freq;
    size_t n_words;
    // pairs: key -> index; per index: left, right, count, the pieces where it occurs
    PairMap index;
    int *pl, *pr;
    uint64_t* pcount;
    int** where;
    size_t *nwhere, *capwhere;
    uint64_t* old_count;      // the count before the current merge (for pairs in `touched`)
    uint32_t* touched_at;     // merge number that last touched the pair
    size_t n_pairs, cap_pairs;
    HeapItem* heap;
    size_t nheap, capheap;
    uint32_t* word_seen;      // merge number that last processed the piece
} Trainer;

static void trainer_free(Trainer* tr) {
    for (size_t p = 0; p < tr->n_pairs; p++) { free(tr->where[p]); }
    bytebuf_free(&tr->tok);
    free(tr->tok_off); free(tr->sym); free(tr->sym_off); free(tr->len); free(tr->freq);
    pairmap_free(&tr->index);
    free(tr->pl); free(tr->pr); free(tr->pcount); free(tr->where); free(tr->nwhere); free(tr->capwhere);
    free(tr->old_count); free(tr->touched_at); free(tr->heap); free(tr->word_seen);
    memset(tr, 0, sizeof(*tr));
}

static int token_cmp(const Trainer* tr, int a, int b) {
    size_t la = tr->tok_off[a + 1] - tr->tok_off[a], lb = tr->tok_off[b + 1] - tr->tok_off[b];
    int c = memcmp(tr->tok.b + tr->tok_off[a], tr->tok.b + tr->tok_off[b], la < lb ? la : lb);
    if (c) { return c; }
    return la < lb ? -1 : la > lb ? 1 : 0;
}

// the heap order: higher count first, then the smaller (left bytes, right bytes)
static int item_before(const Trainer* tr, HeapItem x, HeapItem y) {
    if (x.count != y.count) { return x.count > y.count; }
    int c = token_cmp(tr, tr->pl[x.pair], tr->pl[y.pair]);
    if (c) { return c < 0; }
    return token_cmp(tr, tr->pr[x.pair], tr->pr[y.pair]) < 0;
}

static void heap_push_item(Trainer* tr, HeapItem x) {
    if (tr->nheap == tr->capheap) {
        tr->capheap = tr->capheap ? 2 * tr->capheap : 1024;
        tr->heap = (HeapItem*)realloc(tr->heap, tr->capheap * sizeof(HeapItem));
        if (!tr->heap) { fail(EXIT_SYSTEM, "out of memory (pair heap)"); }
    }
    size_t i = tr->nheap++;
    while (i > 0 && item_before(tr, x, tr->heap[(i - 1) / 2])) { tr->heap[i] = tr->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    tr->heap[i] = x;
}

static HeapItem heap_pop_item(Trainer* tr) {
    HeapItem top = tr->heap[0], x = tr->heap[--tr->nheap];
    size_t i = 0, n = tr->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) { break; }
        if (c + 1 < n && item_before(tr, tr->heap[c + 1], tr->heap[c])) { c++; }
        if (!item_before(tr, tr->heap[c], x)) { break; }
        tr->heap[i] = tr->heap[c]; i = c;
    }
    if (n) { tr->heap[i] = x; }
    return top;
}

static int add_token(Trainer* tr, const uint8_t* b, size_t n) {
    bytebuf_append(&tr->tok, b, n);
    tr->tok_off = (size_t*)realloc(tr->tok_off, (size_t)(tr->n_tok + 2) * sizeof(size_t));
    if (!tr->tok_off) { fail(EXIT_SYSTEM, "out of memory (tokens)"); }
    if (tr->n_tok == 0) { tr->tok_off[0] = 0; }
    tr->tok_off[tr->n_tok + 1] = tr->tok.n;
    return tr->n_tok++;
}

// the index of pair (a, b), created with count 0 if new
static int pair_index(Trainer* tr, int a, int b) {
    uint64_t* v = pairmap_ref(&tr->index, pair_key(a, b), UINT64_MAX);
    if (*v != UINT64_MAX) { return (int)*v; }
    if (tr->n_pairs == tr->cap_pairs) {
        tr->cap_pairs = tr->cap_pairs ? 2 * tr->cap_pairs : 4096;
        size_t c = tr->cap_pairs;
        tr->pl = (int*)realloc(tr->pl, c * sizeof(int)); tr->pr = (int*)realloc(tr->pr, c * sizeof(int));
        tr->pcount = (uint64_t*)realloc(tr->pcount, c * sizeof(uint64_t));
        tr->where = (int**)realloc(tr->where, c * sizeof(int*));
        tr->nwhere = (size_t*)realloc(tr->nwhere, c * sizeof(size_t));
        tr->capwhere = (size_t*)realloc(tr->capwhere, c * sizeof(size_t));
        tr->old_count = (uint64_t*)realloc(tr->old_count, c * sizeof(uint64_t));
        tr->touched_at = (uint32_t*)realloc(tr->touched_at, c * sizeof(uint32_t));
        if (!tr->pl || !tr->pr || !tr->pcount || !tr->where || !tr->nwhere || !tr->capwhere || !tr->old_count ||
            !tr->touched_at) {
            fail(EXIT_SYSTEM, "out of memory (%zu pairs)", c);
        }
    }
    int p = (int)tr->n_pairs++;
    tr->pl[p] = a; tr->pr[p] = b; tr->pcount[p] = 0;
    tr->where[p] = NULL; tr->nwhere[p] = 0; tr->capwhere[p] = 0;
    tr->touched_at[p] = UINT32_MAX;
    *v = (uint64_t)p;
    return p;
}

static void where_add(Trainer* tr, int p, int w) {
    if (tr->nwhere[p] && tr->where[p][tr->nwhere[p] - 1] == w) { return; }
    if (tr->nwhere[p] == tr->capwhere[p]) {
        tr->capwhere[p] = tr->capwhere[p] ? 2 * tr->capwhere[p] : 4;
        tr->where[p] = (int*)realloc(tr->where[p], tr->capwhere[p] * sizeof(int));
        if (!tr->where[p]) { fail(EXIT_SYSTEM, "out of memory (pair occurrences)"); }
    }
    tr->where[p][tr->nwhere[p]++] = w;
}

// add (sign > 0) or remove piece w's count for each of its adjacent pairs. Pairs with the new token m (all pairs
// when m < 0) are new in w, so w joins their occurrence lists. With `touched`, each pair's count before merge
// number `stamp` is remembered once, to see afterwards whose count changed.
static void count_pairs(Trainer* tr, size_t w, int sign, int m, uint32_t stamp, int* touched, size_t* nt) {
    const int* s = tr->sym + tr->sym_off[w];
    for (int i = 0; i + 1 < tr->len[w]; i++) {
        int p = pair_index(tr, s[i], s[i + 1]);
        if (touched && tr->touched_at[p] != stamp) {
            tr->touched_at[p] = stamp;
            tr->old_count[p] = tr->pcount[p];
            touched[(*nt)++] = p;
        }
        if (sign < 0) { tr->pcount[p] -= tr->freq[w]; continue; }
        tr->pcount[p] += tr->freq[w];
        if (m < 0 || s[i] == m || s[i + 1] == m) { where_add(tr, p, (int)w); }
    }
}

// GPT-2's pre-tokenizer over every file; each distinct piece becomes a word with its count
static void count_words(Trainer* tr, char** files, int n_files, const uint8_t byte_order[256]) {
    int byte_id[256];
    for (int k = 0; k < 256; k++) { byte_id[byte_order[k]] = k; }
    BytesMap words = {0};
    uint64_t* freq = NULL;
    size_t cap = 0, total_bytes = 0, pieces = 0;
    for (int f = 0; f < n_files; f++) {
        size_t n;
        uint8_t* text = slurp_file(files[f], &n);
        total_bytes += n;
        for (size_t i = 0; i < n;) {
            size_t e = pretokenize_next(text, n, i);
            uint64_t h = hash_bytes(text + i, e - i);
            long k = bytesmap_find(&words, text + i, e - i, h);
            if (k < 0) {
                k = (long)bytesmap_add(&words, text + i, e - i, h, 0, 0);
                if ((size_t)k >= cap) {
                    cap = cap ? 2 * cap : 1 << 16;
                    freq = (uint64_t*)realloc(freq, cap * sizeof(uint64_t));
                    if (!freq) { fail(EXIT_SYSTEM, "out of memory (word counts)"); }
                }
                freq[k] = 0;
            }
            freq[k]++;
            pieces++;
            i = e;
        }
        free(text);
    }
    tr->n_words = words.n;
    tr->freq = freq;
    tr->len = (int*)mallocCheck(words.n * sizeof(int));
    tr->sym_off = (size_t*)mallocCheck(words.n * sizeof(size_t));
    tr->sym = (int*)mallocCheck(words.arena.n * sizeof(int));
    tr->word_seen = (uint32_t*)mallocCheck(words.n * sizeof(uint32_t));
    for (size_t w = 0; w < words.n; w++) {
        const BytesEntry* e = &words.e[w];
        tr->sym_off[w] = e->off;
        tr->len[w] = (int)e->len;
        for (uint32_t k = 0; k < e->len; k++) { tr->sym[e->off + k] = byte_id[words.arena.b[e->off + k]]; }
        tr->word_seen[w] = UINT32_MAX;
    }
    fprintf(stderr, "%.2f MB of text, %zu pieces, %zu distinct\n", total_bytes / 1e6, pieces, words.n);
    bytesmap_free(&words);
}

// replace (a, b) by m in piece w, left to right without overlap; returns whether anything changed
static int merge_word(Trainer* tr, size_t w, int a, int b, int m) {
    int* s = tr->sym + tr->sym_off[w];
    int n = tr->len[w], o = 0, changed = 0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) { s[o++] = m; i++; changed = 1; }
        else { s[o++] = s[i]; }
    }
    tr->len[w] = o;
    return changed;
}

static int word_has_pair(const Trainer* tr, size_t w, int a, int b) {
    const int* s = tr->sym + tr->sym_off[w];
    for (int i = 0; i + 1 < tr->len[w]; i++) { if (s[i] == a && s[i + 1] == b) { return 1; } }
    return 0;
}

static void usage(void) {
    printf("usage: train_bpe [flags] FILE...\n"
           "Learns a byte-level BPE vocabulary (GPT-2's pre-tokenizer and byte alphabet) from text files.\n\n"
           "  --vocab-size N   vocabulary size: 256 bytes + merges + <|endoftext|> (default 4096, >= 257)\n"
           "  --out-dir DIR    output directory (created): encoder.json, vocab.bpe, tokenizer.bin (required)\n"
           "  --min-count N    stop early when the best pair occurs fewer than N times (default 2)\n"
           "  --quiet 1        no progress lines\n"
           "  --help           this text\n");
}

int main(int argc, char** argv) {
    long vocab_size = 4096, min_count = 2, quiet = 0;
    const char* out_dir = NULL;
    char** files = (char**)mallocCheck((size_t)argc * sizeof(char*));
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(); free(files); return 0; }
        if (a[0] != '-') { files[n_files++] = argv[i]; continue; }
        const char* v;
        if ((v = flag_value(argc, argv, &i, "--out-dir"))) { out_dir = v; }
        else if ((v = flag_value(argc, argv, &i, "--vocab-size"))) { vocab_size = (long)parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--min-count"))) { min_count = (long)parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--quiet"))) { quiet = (long)parse_count(a, v); }
        else { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
    if (!out_dir) { fail(EXIT_USAGE, "--out-dir is required (see --help)"); }
    if (n_files == 0) { fail(EXIT_USAGE, "no input files (see --help)"); }
    if (vocab_size < 257 || vocab_size > (1L << 30)) {
        fail(EXIT_USAGE, "--vocab-size must be in 257 .. 2^30 (256 bytes + <|endoftext|> at least)");
    }
    if (min_count < 1) { fail(EXIT_USAGE, "--min-count must be >= 1"); }
    double t0 = wall_seconds();
    Trainer tr;
    memset(&tr, 0, sizeof(tr));
    uint8_t order[256];
    gpt2_byte_order(order);
    for (int k = 0; k < 256; k++) { add_token(&tr, &order[k], 1); }
    count_words(&tr, files, n_files, order);
    for (size_t w = 0; w < tr.n_words; w++) { count_pairs(&tr, w, +1, -1, 0, NULL, NULL); }
    for (size_t p = 0; p < tr.n_pairs; p++) { heap_push_item(&tr, (HeapItem){tr.pcount[p], (int)p}); }
    int max_merges = (int)vocab_size - 257, n_merges = 0;
    int* left = (int*)mallocCheck((size_t)max_merges * sizeof(int));
    int* right = (int*)mallocCheck((size_t)max_merges * sizeof(int));
    int* touched = NULL;
    size_t cap_touched = 0;
    uint64_t last_count = 0;
    while (n_merges < max_merges && tr.nheap > 0) {
        HeapItem top = heap_pop_item(&tr);
        if (top.count != tr.pcount[top.pair]) { continue; }   // stale entry
        if (top.count < (uint64_t)min_count) { break; }
        int a = tr.pl[top.pair], b = tr.pr[top.pair], p0 = top.pair;
        ByteBuf cat = {0};
        bytebuf_append(&cat, tr.tok.b + tr.tok_off[a], tr.tok_off[a + 1] - tr.tok_off[a]);
        bytebuf_append(&cat, tr.tok.b + tr.tok_off[b], tr.tok_off[b + 1] - tr.tok_off[b]);
        int m = add_token(&tr, cat.b, cat.n);
        bytebuf_free(&cat);
        uint32_t stamp = (uint32_t)n_merges;
        size_t nt = 0;
        for (size_t k = 0; k < tr.nwhere[p0]; k++) {
            size_t w = (size_t)tr.where[p0][k];
            if (tr.word_seen[w] == stamp || !word_has_pair(&tr, w, a, b)) { continue; }
            tr.word_seen[w] = stamp;
            size_t need = nt + 2 * (size_t)tr.len[w] + 2;   // touched pairs: at most the old and new pairs of w
            if (need > cap_touched) {
                cap_touched = 2 * need;
                touched = (int*)realloc(touched, cap_touched * sizeof(int));
                if (!touched) { fail(EXIT_SYSTEM, "out of memory"); }
            }
            count_pairs(&tr, w, -1, m, stamp, touched, &nt);
            merge_word(&tr, w, a, b, m);
            count_pairs(&tr, w, +1, m, stamp, touched, &nt);
        }
        for (size_t k = 0; k < nt; k++) {   // a changed count needs a fresh heap entry (the old one is now stale)
            int p = touched[k];
            if (tr.pcount[p] != tr.old_count[p] && tr.pcount[p] > 0) { heap_push_item(&tr, (HeapItem){tr.pcount[p], p}); }
        }
        free(tr.where[p0]); tr.where[p0] = NULL; tr.nwhere[p0] = tr.capwhere[p0] = 0;
        left[n_merges] = a; right[n_merges] = b; n_merges++;
        last_count = top.count;
        if (!quiet && (n_merges % 1000 == 0 || n_merges == max_merges)) {
            fprintf(stderr, "merge %d/%d: count %llu, %zu bytes\n", n_merges, max_merges, (unsigned long long)top.count,
                    tr.tok_off[m + 1] - tr.tok_off[m]);
        }
    }
    if (n_merges < max_merges) {
        fprintf(stderr, "stopped after %d of %d merges: no pair occurs %ld times or more (--min-count)\n", n_merges, max_merges,
                min_count);
    }
    int eot = add_token(&tr, (const uint8_t*)"<|endoftext|>", 13);
    TokenizerParts parts = {0};
    parts.vocab_size = tr.n_tok;
    parts.bytes = tr.tok.b; parts.off = tr.tok_off;
    parts.n_merges = n_merges; parts.left = left; parts.right = right;
    parts.n_special = 1; parts.special = &eot; parts.eot_id = eot;
    Tokenizer t;
    tokenizer_build(&t, &parts, "the trained vocabulary");   // checks that every merge makes a known token
    ensure_dir(out_dir);
    char ej[2048], vb[2048], bin[2048];
    snprintf(ej, sizeof ej, "%s/encoder.json", out_dir);
    snprintf(vb, sizeof vb, "%s/vocab.bpe", out_dir);
    snprintf(bin, sizeof bin, "%s/tokenizer.bin", out_dir);
    tokenizer_save_gpt2(&t, ej, vb);
    tokenizer_save(&t, bin);
    printf("vocabulary of %d tokens (256 bytes, %d merges, <|endoftext|> = %d; last merge count %llu) in %.1f s\n",
           t.vocab_size, n_merges, eot, (unsigned long long)last_count, wall_seconds() - t0);
    printf("wrote %s, %s, %s\n", ej, vb, bin);
    tokenizer_free(&t);
    trainer_free(&tr);
    free(left); free(right); free(touched); free(files);
    return 0;
}
