/*
prepare_shards.c: text files -> token shards in llm.c's format (shard.h), no Python.

    ./dev/data/prepare_shards --tokenizer ../shared/data/gpt2 --out data/tinyshakespeare/tiny \
        --val-tokens 32768 ../shared/data/tinyshakespeare.txt

Documents: each file is one document, or with --separator STR each file is split into documents at every STR
(the separator itself is dropped, or with --keep-separator 1 kept at the end of the document it ends; empty
documents are dropped). Each document goes into the token stream as EOT + encode(text) (llm.c's convention: the
end-of-text token before every document), so a single file with no separator becomes [EOT] + encode(file).
llm.c's tinyshakespeare.py stream is --separator '\n\n' --keep-separator 1 --val-tokens 32768.

Splits and names (llm.c's): the first --val-tokens tokens of the stream go to validation shards, the rest to
training shards; shards hold --shard-tokens tokens (the last of each split fewer) and are numbered across both
splits: PREFIX_val_000000.bin, PREFIX_train_000001.bin, ... The default --val-tokens equals --shard-tokens, so
shard 0 is the validation shard, as in llm.c's fineweb.py. The cut is exact, so a document may straddle it (as
llm.c's tinyshakespeare split does); --val-tokens 0 writes training shards only.

Token width: uint16 (magic 20240520) when the vocabulary has at most 65,535 tokens, else uint32 (20240801);
--dtype overrides (uint16 with a bigger vocabulary is refused).
*/
#define _GNU_SOURCE   // memmem
#include <sys/mman.h>
#include "data_tools.h"
#include "shard.h"

typedef struct {
    const char* prefix;
    uint64_t shard_tokens, val_left;   // val_left: validation tokens still to write
    int tok_bytes, quiet;
    ShardWriter* w;                    // NULL: none open
    int index, open_is_val;
    uint64_t in_shard;
    uint64_t tokens[2];                // written to train [0] / val [1]
    int shards[2];
} Sharder;

static void sharder_close(Sharder* s) {
    if (!s->w) { return; }
    shard_writer_close(s->w);
    free(s->w);
    s->w = NULL;
    s->shards[s->open_is_val]++;
    s->index++;
    s->in_shard = 0;
}

static void sharder_put(Sharder* s, const int* ids, size_t n) {
    while (n > 0) {
        if (!s->w) {
            s->open_is_val = s->val_left > 0;
            char path[2048];
            snprintf(path, sizeof path, "%s_%s_%06d.bin", s->prefix, s->open_is_val ? "val" : "train", s->index);
            s->w = (ShardWriter*)mallocCheck(sizeof(ShardWriter));
            shard_writer_open(s->w, path, s->tok_bytes);
        }
        uint64_t room = s->shard_tokens - s->in_shard;
        if (s->open_is_val && s->val_left < room) { room = s->val_left; }
        size_t k = n < room ? n : (size_t)room;
        shard_writer_put(s->w, ids, k);
        s->in_shard += k;
        s->tokens[s->open_is_val] += k;
        if (s->open_is_val) { s->val_left -= k; }
        ids += k; n -= k;
        if (s->in_shard == s->shard_tokens || (s->open_is_val && s->val_left == 0)) { sharder_close(s); }
    }
}

// "\n", "\t", "\\", "\xNN" in a separator given on the command line
static size_t unescape(const char* in, char* out) {
    size_t o = 0;
    for (const char* p = in; *p; p++) {
        if (*p != '\\' || !p[1]) { out[o++] = *p; continue; }
        p++;
        if (*p == 'n') { out[o++] = '\n'; }
        else if (*p == 't') { out[o++] = '\t'; }
        else if (*p == 'r') { out[o++] = '\r'; }
        else if (*p == '\\') { out[o++] = '\\'; }
        else if (*p == 'x' && p[1] && p[2]) {
            char hex[3] = {p[1], p[2], 0};
            char* end;
            long v = strtol(hex, &end, 16);
            if (*end) { fail(EXIT_USAGE, "bad \\x escape in --separator"); }
            out[o++] = (char)v;
            p += 2;
        } else { fail(EXIT_USAGE, "unknown escape '\\%c' in --separator (\\n \\t \\r \\\\ \\xNN)", *p); }
    }
    return o;
}

static void usage(void) {
    printf("usage: prepare_shards [flags] FILE...\n"
           "Tokenizes text files into llm.c-format shards: PREFIX_val_000000.bin, PREFIX_train_000001.bin, ...\n"
           "Each document is stored as <|endoftext|> + its tokens.\n\n"
           TOKENIZER_FLAGS_HELP
           "  --out PREFIX          output path prefix, e.g. data/tiny/tiny (required; the directory is created)\n"
           "  --shard-tokens N      tokens per shard (default 100000000)\n"
           "  --val-tokens N        the first N tokens go to validation shards (default: --shard-tokens; 0: none)\n"
           "  --separator STR       split files into documents at STR (escapes \\n \\t \\r \\\\ \\xNN);\n"
           "                        default: one document per file\n"
           "  --keep-separator 1    keep the separator at the end of each document it ends (llm.c's\n"
           "                        tinyshakespeare.py: --separator '\\n\\n' --keep-separator 1 --val-tokens 32768)\n"
           "  --dtype T             auto | uint16 | uint32 (default auto: uint16 up to 65,535 tokens)\n"
           "  --quiet 1             no progress bar\n"
           "  --help                this text\n");
}

int main(int argc, char** argv) {
    TokenizerFlags tf = {0};
    const char *prefix = NULL, *dtype = "auto", *sep_arg = NULL;
    int keep_sep = 0;
    uint64_t shard_tokens = 100000000, val_tokens = UINT64_MAX;
    int quiet = 0;
    char** files = (char**)mallocCheck((size_t)argc * sizeof(char*));
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(); free(files); return 0; }
        if (a[0] != '-') { files[n_files++] = argv[i]; continue; }
        if (tokenizer_flag(&tf, argc, argv, &i)) { continue; }
        const char* v;
        if ((v = flag_value(argc, argv, &i, "--out"))) { prefix = v; }
        else if ((v = flag_value(argc, argv, &i, "--shard-tokens"))) { shard_tokens = parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--val-tokens"))) { val_tokens = parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--separator"))) { sep_arg = v; }
        else if ((v = flag_value(argc, argv, &i, "--keep-separator"))) { keep_sep = (int)parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--dtype"))) { dtype = v; }
        else if ((v = flag_value(argc, argv, &i, "--quiet"))) { quiet = (int)parse_count(a, v); }
        else { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
    if (!prefix) { fail(EXIT_USAGE, "--out PREFIX is required (see --help)"); }
    if (n_files == 0) { fail(EXIT_USAGE, "no input files (see --help)"); }
    if (shard_tokens < 1) { fail(EXIT_USAGE, "--shard-tokens must be >= 1"); }
    if (val_tokens == UINT64_MAX) { val_tokens = shard_tokens; }
    char sep[4096];
    size_t sep_len = 0;
    if (sep_arg) {
        if (strlen(sep_arg) >= sizeof sep) { fail(EXIT_USAGE, "--separator too long"); }
        sep_len = unescape(sep_arg, sep);
        if (sep_len == 0) { fail(EXIT_USAGE, "--separator must not be empty"); }
    }
    Tokenizer tok;
    if (!tokenizer_from_flags(&tok, &tf)) {
        fail(EXIT_USAGE, "no tokenizer: give --tokenizer PATH or --encoder-json F --vocab-bpe F (see --help)");
    }
    tokenizer_check_can_encode(&tok);
    if (tok.eot_id < 0) { fail(EXIT_BADFILE, "the tokenizer has no <|endoftext|> token to put before each document"); }
    int tok_bytes;
    if (strcmp(dtype, "auto") == 0) { tok_bytes = tok.vocab_size <= 65535 ? 2 : 4; }
    else if (strcmp(dtype, "uint16") == 0) { tok_bytes = 2; }
    else if (strcmp(dtype, "uint32") == 0) { tok_bytes = 4; }
    else { fail(EXIT_USAGE, "--dtype must be auto, uint16 or uint32, got '%s'", dtype); }
    if (tok_bytes == 2 && tok.vocab_size > 65536) {
        fail(EXIT_USAGE, "--dtype uint16 cannot hold the ids of a %d-token vocabulary", tok.vocab_size);
    }
    // the output directory, made with every missing directory above it
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", prefix);
    char* slash = strrchr(dir, '/');
    if (slash && slash != dir) { *slash = 0; ensure_dir(dir); }
    // open every input first, so a bad path fails before any work
    uint64_t total_bytes = 0;
    for (int f = 0; f < n_files; f++) {
        struct stat st;
        if (stat(files[f], &st) != 0) { fail(EXIT_BADFILE, "cannot read '%s': %s", files[f], strerror(errno)); }
        if (!S_ISREG(st.st_mode)) { fail(EXIT_BADFILE, "cannot read '%s': not a regular file", files[f]); }
        total_bytes += (uint64_t)st.st_size;
    }
    Sharder sh = {0};
    sh.prefix = prefix; sh.shard_tokens = shard_tokens; sh.val_left = val_tokens; sh.tok_bytes = tok_bytes;
    Progress prog;
    progress_init(&prog, quiet);
    TokenBuf buf = {0};
    uint64_t done_bytes = 0, docs = 0;
    for (int f = 0; f < n_files; f++) {
        FILE* fp = fopenCheck(files[f], "rb");
        long long size = file_size(fp);
        const uint8_t* text = NULL;
        if (size > 0) {   // mapped, not read: a file may be larger than memory
            void* m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fileno(fp), 0);
            if (m == MAP_FAILED) { fail(EXIT_BADFILE, "cannot map '%s': %s", files[f], strerror(errno)); }
            text = (const uint8_t*)m;
        }
        size_t n = size > 0 ? (size_t)size : 0;
        for (size_t pos = 0;;) {
            // the next document: [pos, end), up to the separator or the end of the file; empty ones are dropped
            size_t end = n, next = n;
            if (sep_len) {
                const uint8_t* hit = (const uint8_t*)memmem(text + pos, n - pos, sep, sep_len);
                if (hit) { end = (size_t)(hit - text); next = end + sep_len; }
                if (hit && keep_sep) { end = next; }
            }
            if (end > pos) {
                buf.n = 0;
                tokbuf_push(&buf, tok.eot_id);
                for (size_t p = pos; p < end;) {   // encode in parts of ~1 MB so memory stays bounded
                    p = tokenizer_encode_part(&tok, text, end, p, 1 << 20, &buf);
                    sharder_put(&sh, buf.ids, buf.n);
                    buf.n = 0;
                    char extra[96];
                    snprintf(extra, sizeof extra, "%s tokens, shard %d", with_commas(sh.tokens[0] + sh.tokens[1]), sh.index);
                    progress_draw(&prog, done_bytes + p, total_bytes, extra, 0);
                }
                docs++;
            }
            if (next >= n) { break; }
            pos = next;
        }
        done_bytes += n;
        if (text) { munmap((void*)text, n); }
        fclose(fp);
    }
    sharder_close(&sh);
    progress_draw(&prog, done_bytes, total_bytes, "", 1);
    progress_done(&prog);
    double el = wall_seconds() - prog.t0;
    uint64_t all = sh.tokens[0] + sh.tokens[1];
    printf("documents %s | tokens %s (val %s, train %s) | shards %d (%d val, %d train) of %s tokens: %s_*.bin\n",
           with_commas(docs), with_commas(all), with_commas(sh.tokens[1]), with_commas(sh.tokens[0]), sh.shards[0] + sh.shards[1],
           sh.shards[1], sh.shards[0], tok_bytes == 2 ? "uint16" : "uint32", prefix);
    printf("text %.2f MB in %.2f s = %.1f MB/s\n", done_bytes / 1e6, el, el > 0 ? done_bytes / 1e6 / el : 0.0);
    if (sh.tokens[0] == 0) {
        fprintf(stderr, "warning: no training tokens (everything went to validation: lower --val-tokens)\n");
    }
    tokbuf_free(&buf);
    tokenizer_free(&tok);
    free(files);
    return 0;
}
