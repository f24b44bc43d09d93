/*
inspect_shard.c: what is in a token shard (shard.h's format): the header fields, the token count, the range of
token ids, and with a tokenizer the number of documents (end-of-text tokens) and a decoded sample.

    ./dev/data/inspect_shard --tokenizer ../shared/data/gpt2 data/tiny/tiny_val_000000.bin

With --vocab N it also checks that every id is below N and exits with code 2 if not (as the data loader would).
*/
#include "data_tools.h"
#include "shard.h"

// text for a terminal: valid UTF-8 as is, \n \t and \r escaped, other control or invalid bytes as \xNN
static void print_escaped(const uint8_t* s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t cp = utf8_decode(s, n, i, &len);
        if (cp == '\n') { fputs("\\n", stdout); }
        else if (cp == '\t') { fputs("\\t", stdout); }
        else if (cp == '\r') { fputs("\\r", stdout); }
        else if (cp == '\\') { fputs("\\\\", stdout); }
        else if (cp < 0 || cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) { printf("\\x%02x", s[i]); len = 1; }
        else { fwrite(s + i, 1, len, stdout); }
        i += len;
    }
}

static void usage(void) {
    printf("usage: inspect_shard [flags] SHARD...\n"
           "Prints a shard's header, token count, id range and (with a tokenizer) documents and a decoded sample.\n\n"
           TOKENIZER_FLAGS_HELP
           "  --sample N            tokens to decode (default 64)\n"
           "  --offset N            first token of the sample (default 0)\n"
           "  --vocab N             check that every id is below N (exit code 2 otherwise)\n"
           "  --help                this text\n");
}

static int inspect(const char* path, Tokenizer* tok, uint64_t sample, uint64_t offset, uint64_t vocab) {
    int fd = shard_open_fd(path);
    struct stat st;
    if (fstat(fd, &st) != 0) { fail(EXIT_BADFILE, "cannot stat '%s'", path); }
    ShardInfo info;
    shard_info_fd(fd, path, &info);   // fails on a bad magic, version or size
    int32_t h[4];
    pread_full(fd, h, sizeof h, 0, path);
    printf("file      %s\n", path);
    printf("format    %s tokens (magic %d, version %d)\n", info.tok_bytes == 2 ? "uint16" : "uint32", h[0], h[1]);
    printf("header    [0] %d  [1] %d  [2] %d  [3] %d  (count = [2] + 2^32 x [3], unsigned)\n", h[0], h[1], h[2], h[3]);
    printf("tokens    %s (file %s bytes = 1024 + %d x %s)\n", with_commas(info.count), with_commas((uint64_t)st.st_size),
           info.tok_bytes, with_commas(info.count));
    // one pass over all tokens: id range, end-of-text count, ids outside --vocab
    size_t chunk = 1 << 20;
    uint32_t* buf = (uint32_t*)mallocCheck(chunk * sizeof(uint32_t));
    uint32_t lo = UINT32_MAX, hi = 0;
    uint64_t eot = 0, bad = 0, first_bad = 0;
    for (uint64_t s = 0; s < info.count; s += chunk) {
        size_t k = info.count - s < chunk ? (size_t)(info.count - s) : chunk;
        shard_read_tokens(fd, path, &info, s, k, buf);
        for (size_t i = 0; i < k; i++) {
            uint32_t v = buf[i];
            if (v < lo) { lo = v; }
            if (v > hi) { hi = v; }
            if (tok && tok->eot_id >= 0 && v == (uint32_t)tok->eot_id) { eot++; }
            if (vocab && v >= vocab) { if (!bad) { first_bad = s + i; } bad++; }
        }
    }
    if (info.count) {
        printf("ids       min %u, max %u (a model needs a vocabulary of at least %llu)\n", lo, hi, (unsigned long long)hi + 1);
    }
    if (tok && tok->eot_id >= 0) { printf("documents %s (end-of-text id %d)\n", with_commas(eot), tok->eot_id); }
    int rc = 0;
    if (tok) {
        if (info.count && hi >= (uint32_t)tok->vocab_size) {
            printf("warning   ids up to %u but the tokenizer has %d tokens\n", hi, tok->vocab_size);
        }
        uint64_t a = offset < info.count ? offset : info.count;
        size_t k = info.count - a < sample ? (size_t)(info.count - a) : (size_t)sample;
        uint32_t* ids = (uint32_t*)mallocCheck((k + 1) * sizeof(uint32_t));
        if (k) { shard_read_tokens(fd, path, &info, a, k, ids); }
        printf("sample    tokens %llu..%llu:", (unsigned long long)a, (unsigned long long)(a + k));
        for (size_t i = 0; i < k && i < 16; i++) { printf(" %u", ids[i]); }
        printf("%s\n          \"", k > 16 ? " ..." : "");
        ByteBuf text = {0};
        for (size_t i = 0; i < k; i++) {
            int id = (int)ids[i];
            tokenizer_decode(tok, &id, 1, &text);
        }
        print_escaped(text.b, text.n);
        printf("\"\n");
        bytebuf_free(&text);
        free(ids);
    }
    if (bad) {
        fprintf(stderr, "error: %s: %s token ids are >= --vocab %llu (the first at position %llu)\n", path, with_commas(bad),
                (unsigned long long)vocab, (unsigned long long)first_bad);
        rc = EXIT_BADFILE;
    }
    free(buf);
    close(fd);
    return rc;
}

int main(int argc, char** argv) {
    TokenizerFlags tf = {0};
    uint64_t sample = 64, offset = 0, vocab = 0;
    char** files = (char**)mallocCheck((size_t)argc * sizeof(char*));
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(); free(files); return 0; }
        if (a[0] != '-') { files[n_files++] = argv[i]; continue; }
        if (tokenizer_flag(&tf, argc, argv, &i)) { continue; }
        const char* v;
        if ((v = flag_value(argc, argv, &i, "--sample"))) { sample = parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--offset"))) { offset = parse_count(a, v); }
        else if ((v = flag_value(argc, argv, &i, "--vocab"))) { vocab = parse_count(a, v); }
        else { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
    if (n_files == 0) { fail(EXIT_USAGE, "no shard files given (see --help)"); }
    Tokenizer tok;
    int have_tok = tokenizer_from_flags(&tok, &tf);
    int rc = 0;
    for (int f = 0; f < n_files; f++) {
        if (f) { printf("\n"); }
        int r = inspect(files[f], have_tok ? &tok : NULL, sample, offset, vocab);
        if (r) { rc = r; }
    }
    if (have_tok) { tokenizer_free(&tok); }
    free(files);
    return rc;
}
