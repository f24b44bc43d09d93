/*
bench_tokenizer.c: encoding and decoding speed of tokenizer.h on one core.

    ./dev/data/bench_tokenizer [--tokenizer PATH] [FILE]

Defaults: GPT-2 from ../shared/data/gpt2 and ../shared/data/tinyshakespeare.txt. Reports the first pass (an empty
word cache: what a large corpus sees) and the best of the next passes (cache warm), in MB of input text per
second, and checks that decoding gives the text back.
*/
#include "data_tools.h"

static void usage(void) {
    printf("usage: bench_tokenizer [flags] [FILE]\n"
           "Measures encoding/decoding speed (MB of text per second, one core).\n\n"
           TOKENIZER_FLAGS_HELP
           "                        (default ../shared/data/gpt2)\n"
           "  --passes N            encoding passes after the first (default 3)\n"
           "  --help                this text\n"
           "FILE defaults to ../shared/data/tinyshakespeare.txt\n");
}

int main(int argc, char** argv) {
    TokenizerFlags tf = {0};
    const char* file = "../shared/data/tinyshakespeare.txt";
    uint64_t passes = 3;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(); return 0; }
        if (a[0] != '-') { file = a; continue; }
        if (tokenizer_flag(&tf, argc, argv, &i)) { continue; }
        const char* v;
        if ((v = flag_value(argc, argv, &i, "--passes"))) { passes = parse_count(a, v); }
        else { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
    if (!tf.path && !tf.encoder_json) { tf.path = "../shared/data/gpt2"; }
    size_t n;
    uint8_t* text = slurp_file(file, &n);
    double t0 = wall_seconds();
    Tokenizer tok;
    tokenizer_from_flags(&tok, &tf);
    double t_load = wall_seconds() - t0;
    // pre-tokenizer alone
    t0 = wall_seconds();
    size_t pieces = 0;
    for (size_t i = 0; i < n; i = pretokenize_next(text, n, i)) { pieces++; }
    double t_pre = wall_seconds() - t0;
    TokenBuf ids = {0};
    t0 = wall_seconds();
    tokenizer_encode(&tok, text, n, &ids);
    double t_first = wall_seconds() - t0, t_best = 1e30;
    for (uint64_t p = 0; p < passes; p++) {
        ids.n = 0;
        t0 = wall_seconds();
        tokenizer_encode(&tok, text, n, &ids);
        double dt = wall_seconds() - t0;
        if (dt < t_best) { t_best = dt; }
    }
    ByteBuf back = {0};
    t0 = wall_seconds();
    tokenizer_decode(&tok, ids.ids, ids.n, &back);
    double t_dec = wall_seconds() - t0;
    int same = back.n == n && memcmp(back.b, text, n) == 0;
    printf("%s: %.2f MB, %s pieces, %s tokens (%.2f bytes/token); vocabulary %d (loaded in %.0f ms)\n", file, n / 1e6,
           with_commas(pieces), with_commas(ids.n), ids.n ? (double)n / ids.n : 0.0, tok.vocab_size, t_load * 1e3);
    printf("pre-tokenizer alone  %7.1f MB/s\n", n / 1e6 / t_pre);
    printf("encode, first pass   %7.1f MB/s  (empty word cache)\n", n / 1e6 / t_first);
    if (passes) { printf("encode, warm cache   %7.1f MB/s  (best of %llu)\n", n / 1e6 / t_best, (unsigned long long)passes); }
    printf("decode               %7.1f MB/s  round trip %s\n", n / 1e6 / t_dec, same ? "exact" : "DIFFERS");
    tokbuf_free(&ids); bytebuf_free(&back); free(text); tokenizer_free(&tok);
    return same ? 0 : 1;
}
