/*
data_tools.h: small helpers shared by the dev/data command-line tools: numeric flag values, the tokenizer
flags (--tokenizer, or --encoder-json with --vocab-bpe), thousands separators, and a progress bar on stderr.
*/
#ifndef PDN_DATA_TOOLS_H
#define PDN_DATA_TOOLS_H

#include "tokenizer.h"

// if argv[*i] is `name`: its value (consumed; a missing value is an error), else NULL. An unknown flag is left to
// the caller, so that "--bogus" says "unknown flag" whether or not a value follows it.
static const char* flag_value(int argc, char** argv, int* i, const char* name) {
    if (strcmp(argv[*i], name) != 0) { return NULL; }
    if (*i + 1 >= argc) { fail(EXIT_USAGE, "flag %s needs a value (see --help)", name); }
    return argv[++*i];
}

// a non-negative count: digits, or a float form that is an exact integer ("1e8", "100000000")
static uint64_t parse_count(const char* flag, const char* v) {
    char* end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !(x >= 0) || x > 9.0e18 || x != (double)(uint64_t)x) {
        fail(EXIT_USAGE, "bad value '%s' for %s (a non-negative integer, e.g. 100000000 or 1e8)", v, flag);
    }
    return (uint64_t)x;
}

typedef struct { const char *path, *encoder_json, *vocab_bpe; } TokenizerFlags;

// returns 1 if argv[*i] was a tokenizer flag (and consumes its value)
static int tokenizer_flag(TokenizerFlags* tf, int argc, char** argv, int* i) {
    const char* v;
    if ((v = flag_value(argc, argv, i, "--tokenizer"))) { tf->path = v; return 1; }
    if ((v = flag_value(argc, argv, i, "--encoder-json"))) { tf->encoder_json = v; return 1; }
    if ((v = flag_value(argc, argv, i, "--vocab-bpe"))) { tf->vocab_bpe = v; return 1; }
    return 0;
}

// loads the tokenizer the flags name; returns 0 if none was named
static int tokenizer_from_flags(Tokenizer* t, const TokenizerFlags* tf) {
    if (!tf->encoder_json != !tf->vocab_bpe) { fail(EXIT_USAGE, "--encoder-json and --vocab-bpe go together"); }
    if (tf->encoder_json && tf->path) { fail(EXIT_USAGE, "give --tokenizer or --encoder-json/--vocab-bpe, not both"); }
    if (tf->encoder_json) { tokenizer_load_gpt2(t, tf->encoder_json, tf->vocab_bpe); return 1; }
    if (tf->path) { tokenizer_load(t, tf->path); return 1; }
    return 0;
}

#define TOKENIZER_FLAGS_HELP \
    "  --tokenizer PATH      our tokenizer .bin, llm.c's gpt2_tokenizer.bin (decode only), or a directory\n" \
    "                        holding GPT-2's encoder.json and vocab.bpe\n" \
    "  --encoder-json FILE   GPT-2's encoder.json (with --vocab-bpe)\n" \
    "  --vocab-bpe FILE      GPT-2's vocab.bpe (with --encoder-json)\n"

// 1234567 -> "1,234,567" (rotating static buffers: up to 4 in one printf)
static const char* with_commas(uint64_t x) {
    static char bufs[4][32];
    static int k = 0;
    char* out = bufs[k++ & 3];
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)x), o = 0;
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0) { out[o++] = ','; }
        out[o++] = tmp[i];
    }
    out[o] = 0;
    return out;
}

// a one-line progress bar on stderr, redrawn at most 10 times a second, only when stderr is a terminal
typedef struct { double t0, last; int tty; } Progress;

static void progress_init(Progress* p, int quiet) { p->t0 = p->last = wall_seconds(); p->tty = !quiet && isatty(2); }

static void progress_draw(Progress* p, uint64_t done, uint64_t total, const char* extra, int force) {
    if (!p->tty) { return; }
    double now = wall_seconds();
    if (!force && now - p->last < 0.1) { return; }
    p->last = now;
    double frac = total ? (double)done / (double)total : 1.0;
    char bar[41];
    int fill = (int)(frac * 40);
    for (int i = 0; i < 40; i++) { bar[i] = i < fill ? '=' : i == fill ? '>' : ' '; }
    bar[40] = 0;
    double el = now - p->t0;
    double rate = el > 0 ? done / 1e6 / el : 0.0;
    fprintf(stderr, "\r[%s] %5.1f%% %8.1f MB %6.1f MB/s %s\033[K", bar, 100 * frac, done / 1e6, rate, extra);
    fflush(stderr);
}

static void progress_done(Progress* p) { if (p->tty) { fprintf(stderr, "\n"); } }

#endif // PDN_DATA_TOOLS_H
