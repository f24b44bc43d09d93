/*
make_mc: writes a multiple-choice eval file in llm.c's format (what dev/data/hellaswag.py writes for HellaSwag, and
what `train_pdn --eval mc --eval-file` reads) from hand-written items in a text file:

    Context line of item 1
    * the right ending
    a wrong ending
    another wrong ending
    (blank line)
    Context line of item 2
    ...

Each item: one context line, then 2 or more endings, one of them marked "* ". As hellaswag.py does, the context is
encoded alone and each ending as " " + ending (a GPT-2-style tokenizer folds the space into the first word).
Token ids must be below 65535 (the format's uint16).

usage: dev/data/make_mc --tokenizer FILE|DIR (or --encoder-json F --vocab-bpe F) --out OUT.bin ITEMS.txt
*/
#include "data_tools.h"

int main(int argc, char** argv) {
    TokenizerFlags tf = {0};
    const char *out = NULL, *in = NULL, *v;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: %s --tokenizer FILE|DIR --out OUT.bin ITEMS.txt (see the comment at the top of make_mc.c)\n", argv[0]);
            return 0;
        }
        if (tokenizer_flag(&tf, argc, argv, &i)) { continue; }
        if ((v = flag_value(argc, argv, &i, "--out"))) { out = v; continue; }
        if (argv[i][0] == '-') { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", argv[i]); }
        if (in) { fail(EXIT_USAGE, "one ITEMS.txt, got '%s' and '%s'", in, argv[i]); }
        in = argv[i];
    }
    if (!out || !in) { fail(EXIT_USAGE, "need --out OUT.bin and ITEMS.txt (see --help)"); }
    Tokenizer tok;
    if (!tokenizer_from_flags(&tok, &tf)) { fail(EXIT_USAGE, "need --tokenizer (or --encoder-json and --vocab-bpe)"); }
    tokenizer_check_can_encode(&tok);
    FILE* f = fopenCheck(in, "r");
    static char line[1 << 16];
    TokenBuf words;      // the examples' uint16 stream, as ints
    memset(&words, 0, sizeof words);
    int n = 0, lineno = 0, longest = 0, eof = 0;
    while (!eof) {
        // one item: lines up to a blank line or the end
        char* lines[64];
        int nl = 0, first = lineno + 1;
        while (1) {
            if (!fgets(line, sizeof line, f)) { eof = 1; break; }
            lineno++;
            size_t len = strlen(line);
            while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) { line[--len] = 0; }
            if (!len) { if (nl) { break; } first = lineno + 1; continue; }
            if (nl == 64) { fail(EXIT_BADFILE, "%s:%d: an item has more than 63 endings", in, lineno); }
            lines[nl++] = strdup(line);
        }
        if (!nl) { continue; }
        int label = -1;
        for (int k = 1; k < nl; k++) {
            if (strncmp(lines[k], "* ", 2) == 0) {
                if (label >= 0) { fail(EXIT_BADFILE, "%s:%d: two endings marked '* '", in, first + k); }
                label = k - 1;
            }
        }
        if (nl < 3 || label < 0) { fail(EXIT_BADFILE, "%s:%d: an item needs a context, 2 or more endings, one marked '* '", in, first); }
        size_t start = words.n;
        tokbuf_push(&words, 65535); tokbuf_push(&words, 0); tokbuf_push(&words, n); tokbuf_push(&words, label);
        tokbuf_push(&words, nl - 1);
        for (int k = 0; k < nl; k++) {
            TokenBuf t;
            memset(&t, 0, sizeof t);
            char buf[1 << 16];
            const char* s = k == 0 ? lines[0] : lines[k] + (k - 1 == label ? 2 : 0);
            snprintf(buf, sizeof buf, "%s%s", k ? " " : "", s);
            tokenizer_encode(&tok, buf, strlen(buf), &t);
            tokbuf_push(&words, (int)t.n);
            for (size_t i = 0; i < t.n; i++) {
                if (t.ids[i] >= 65535) { fail(EXIT_USAGE, "%s:%d: token id %d does not fit the format's uint16", in, first + k, t.ids[i]); }
                tokbuf_push(&words, t.ids[i]);
            }
            tokbuf_free(&t);
            free(lines[k]);
        }
        int bytes = (int)(2 * (words.n - start));
        if (bytes >= 65536) { fail(EXIT_USAGE, "%s:%d: an item of %d bytes; the format's examples are under 64 KiB", in, first, bytes); }
        words.ids[start + 1] = bytes;
        longest = bytes > longest ? bytes : longest;
        n++;
    }
    fclose(f);
    if (n == 0 || n >= 65536) { fail(EXIT_BADFILE, "%s: %d items (the format holds 1 to 65535)", in, n); }
    int32_t hd[256] = {20240522, 1, n, longest};
    uint16_t* w16 = (uint16_t*)mallocCheck(words.n * sizeof(uint16_t) + 1);
    for (size_t i = 0; i < words.n; i++) { w16[i] = (uint16_t)words.ids[i]; }
    FILE* o = fopenCheck(out, "wb");
    fwriteCheck(hd, 4, 256, o);
    fwriteCheck(w16, 2, words.n, o);
    if (fclose(o) != 0) { fail(EXIT_SYSTEM, "cannot write %s: %s", out, strerror(errno)); }
    printf("wrote %d items (%zu bytes) to %s\n", n, 1024 + 2 * words.n, out);
    free(w16);
    tokbuf_free(&words);
    tokenizer_free(&tok);
    return 0;
}
