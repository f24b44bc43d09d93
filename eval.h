/*
eval.h: evaluations of a checkpoint, `-e CKPT --eval NAME`, written once for both trainers on top of their tr_* calls
(generation: tr_gen_open/feed/close; scoring: tr_logprobs). Each prints a table; with -o DIR it also writes
DIR/eval_NAME.tsv (the table) and DIR/eval_NAME_samples.tsv (one line per sample), which scripts/plot_run.sh
draws and scripts/gpu_eval_check.sh compares between builds.

  sniah1 | sniah2 | sniah3   RULER's single-needle retrieval (S-NIAH-1/2/3; ../shared/notes/evals.md §2). A needle
      "One of the special magic numbers for KEY is: VALUE." hides in a haystack at a depth; the prompt asks for the
      value, the model continues greedily from the recurrent state the prompt left (no re-run of the prefix) for up
      to --eval-gen tokens (RULER: 128; it stops early at <|endoftext|>), and a sample counts as correct when the
      value appears in the decoded text, case-insensitively (RULER's string_match_all with one reference).
        sniah1: haystack = RULER's noise lines, value = a 7-digit number
        sniah2: haystack = the text of --haystack FILE, value = a 7-digit number
        sniah3: haystack = the text of --haystack FILE, value = a UUID (version 4)
      RULER's -2/-3 use Paul Graham's essays, which we do not have: numbers on another text are not comparable.
      Key = ADJECTIVE-NOUN from the word lists below (RULER draws from wonderwords' lists; same form, other words).
      Length L (--eval-len) is RULER's budget: the prompt is exactly L - --eval-gen tokens, generation fills the
      rest. Depths (--eval-depths, percent of the haystack) place the needle at the nearest line start (noise) or
      sentence end (text), as the paper's runs did (RULER's noise task draws a uniform position instead).
      --eval-samples per (length, depth) cell, keys and values drawn from --seed.
  mc      multiple choice from llm.c's eval file (--eval-file; dev/data/hellaswag.py writes HellaSwag in it): per
      completion the log-likelihood of its tokens given the context; acc = argmax of the sum, acc_norm = argmax of
      the sum divided by the completion's length in characters (lm-evaluation-harness's definitions; the
      characters are those the tokens decode to, so acc_norm needs --tokenizer), and llm.c's own choice (the mean
      over the completion's tokens) as acc_tok. Ties go to the first completion, as numpy's argmax does.
  ppl     perplexity over the validation shards (-j): every window of L tokens of the split (--eval-len, each
      length a row; --eval-windows caps the windows per length), each scored from a zero state as one sequence
      (the first token of a window is context only). ppl = exp(mean nll per token); bits per byte = total nll
      / ln 2 / the UTF-8 bytes the target tokens decode to (needs --tokenizer), so models with different
      tokenizers compare. Special tokens (<|endoftext|>) count no bytes; their loss counts.
*/
#ifndef PDN_EVAL_H
#define PDN_EVAL_H

// ----------------------------------------------------------------------------------------------------
// the flags' lists

#define EVAL_MAX_LIST 32

// "1024,2048" into out (at most EVAL_MAX_LIST values, each in [lo, hi]); returns the count, fails on a bad list
static int eval_int_list(const char* s, int* out, int lo, int hi, const char* flag) {
    int n = 0;
    const char* p = s;
    while (*p) {
        char* end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno == ERANGE || v < lo || v > hi || (*end && *end != ',') || n == EVAL_MAX_LIST) {
            fail(EXIT_USAGE, "%s '%s': need up to %d comma-separated integers in [%d, %d]", flag, s, EVAL_MAX_LIST, lo, hi);
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) { fail(EXIT_USAGE, "%s '%s' ends with a comma", flag, s); }
    }
    if (n == 0) { fail(EXIT_USAGE, "%s is empty", flag); }
    return n;
}

#define EVAL_SNIAH 1
#define EVAL_MC 2
#define EVAL_PPL 3

// --eval's kind (0: none); the S-NIAH task number in *task
static int eval_kind(const char* name, int* task) {
    *task = 0;
    if (!name[0]) { return 0; }
    if (strcmp(name, "sniah1") == 0 || strcmp(name, "sniah2") == 0 || strcmp(name, "sniah3") == 0) {
        *task = name[5] - '0';
        return EVAL_SNIAH;
    }
    if (strcmp(name, "mc") == 0) { return EVAL_MC; }
    if (strcmp(name, "ppl") == 0) { return EVAL_PPL; }
    return -1;
}

// the evaluation flags, checked with the others (train_config_check)
static void eval_config_check(const TrainConfig* tc) {
    int task, kind = eval_kind(tc->eval, &task), v[EVAL_MAX_LIST];
    if (kind < 0) { fail(EXIT_USAGE, "--eval must be sniah1, sniah2, sniah3, mc or ppl, got '%s'", tc->eval); }
    if (!kind) { return; }
    if (!tc->init_ckpt[0]) { fail(EXIT_USAGE, "--eval %s needs -e CHECKPOINT, the model to evaluate", tc->eval); }
    if (tc->generate || tc->debug_state[0] || tc->train[0]) {
        fail(EXIT_USAGE, "--eval runs alone: leave out --generate, --debug-state and -i");
    }
    eval_int_list(tc->eval_len, v, 1, 1 << 20, "--eval-len");
    eval_int_list(tc->eval_depths, v, 0, 100, "--eval-depths");
    if (tc->eval_samples < 1 || tc->eval_gen < 1 || tc->eval_tokens < 1 || tc->eval_windows < 0) {
        fail(EXIT_USAGE, "need --eval-samples, --eval-gen, --eval-tokens >= 1 and --eval-windows >= 0");
    }
    if (kind == EVAL_SNIAH && !tc->tokenizer[0]) {
        fail(EXIT_USAGE, "--eval %s needs --tokenizer: the prompt is text, and the answer is read from the decoded text", tc->eval);
    }
    if (kind == EVAL_SNIAH && task > 1 && !tc->haystack[0]) {
        fail(EXIT_USAGE, "--eval %s needs --haystack FILE, a natural text for the haystack (RULER used Paul Graham's "
             "essays)", tc->eval);
    }
    if (kind == EVAL_MC && !tc->eval_file[0]) { fail(EXIT_USAGE, "--eval mc needs --eval-file FILE (llm.c's eval format)"); }
    if (kind == EVAL_PPL && !tc->val[0]) { fail(EXIT_USAGE, "--eval ppl needs -j 'VAL_GLOB', the validation shards"); }
}

// a tokenizer given with the checkpoint must be the model's (its ids inside the model's vocabulary)
static void eval_check_tokenizer(const Run* r) {
    if (r->tok && r->tok->vocab_size > r->mc->vocab_size) {
        fail(EXIT_USAGE, "the tokenizer has %d tokens, the model's vocabulary %d: they do not belong together",
             r->tok->vocab_size, r->mc->vocab_size);
    }
}

// the -o files of an evaluation: DIR/eval_NAME.tsv and DIR/eval_NAME_samples.tsv (NULL without -o)
static FILE* eval_open_tsv(const TrainConfig* tc, const char* suffix, const char* columns) {
    if (!tc->out_dir[0]) { return NULL; }
    ensure_dir(tc->out_dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/eval_%s%s.tsv", tc->out_dir, tc->eval, suffix);
    FILE* f = fopenCheck(path, "w");
    fprintf(f, "%s\n", columns);
    return f;
}

static void eval_close_tsv(FILE* f, const TrainConfig* tc, const char* suffix) {
    if (!f) { return; }
    if (fclose(f) != 0) { fail(EXIT_SYSTEM, "cannot write %s/eval_%s%s.tsv: %s", tc->out_dir, tc->eval, suffix, strerror(errno)); }
    printf("wrote %s/eval_%s%s.tsv\n", tc->out_dir, tc->eval, suffix);
}

// ----------------------------------------------------------------------------------------------------
// S-NIAH: the prompt builder and the scorer

// our word lists for the keys (adjective-noun, as RULER's; RULER's come from wonderwords)
static const char* const SNIAH_ADJ[] = {
    "ancient", "bitter", "brave", "bright", "calm", "clever", "crimson", "curious", "damp", "distant", "dusty", "eager",
    "fierce", "fragile", "frozen", "gentle", "golden", "hollow", "humble", "icy", "jagged", "lively", "lonely", "lucky",
    "misty", "narrow", "noble", "odd", "pale", "proud", "quiet", "rapid", "rusty", "scarlet", "silent", "silver",
    "sleepy", "smooth", "solemn", "sturdy", "swift", "tame", "tender", "vast", "velvet", "wicked", "wooden", "young",
};
static const char* const SNIAH_NOUN[] = {
    "anchor", "apple", "badger", "basket", "beacon", "bridge", "candle", "castle", "cedar", "cloud", "comet", "compass",
    "copper", "dragon", "drum", "falcon", "feather", "forest", "garden", "glacier", "hammer", "harbor", "island", "jacket",
    "kettle", "lantern", "lemon", "marble", "meadow", "mirror", "needle", "orchard", "otter", "pebble", "pepper", "pillow",
    "planet", "river", "saddle", "shadow", "spider", "thimble", "tiger", "tunnel", "violin", "wagon", "willow", "zebra",
};
#define SNIAH_NADJ ((int)(sizeof(SNIAH_ADJ) / sizeof(SNIAH_ADJ[0])))
#define SNIAH_NNOUN ((int)(sizeof(SNIAH_NOUN) / sizeof(SNIAH_NOUN[0])))

// RULER's noise sentence (the haystack of niah_single_1), one line
static const char SNIAH_NOISE[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// the haystack: a token stream, and where a needle may go (before token i when at[i], i in [0, n])
typedef struct {
    int task;                // 1: noise lines, 2 / 3: natural text
    int* ids; int n;         // (n) tokens
    uint8_t* at;             // (n + 1) 1: a line start (noise) or a sentence end (text)
} SniahHaystack;

static int sniah_token_ends(const Tokenizer* tok, int id, const char* set) {
    size_t len;
    const uint8_t* s = tokenizer_token(tok, id, &len);
    return s && len && strchr(set, s[len - 1]) != NULL;
}

// The haystack for task 1..3 with at least `need` tokens. Task 1: the noise line repeated, lines joined by "\n";
// tasks 2/3: the start of `text` (the --haystack file), which must be long enough.
static void sniah_haystack(SniahHaystack* h, int task, Tokenizer* tok, const uint8_t* text, size_t text_n, int need,
                           const char* what) {
    memset(h, 0, sizeof(*h));
    h->task = task;
    TokenBuf tb;
    memset(&tb, 0, sizeof tb);
    if (task == 1) {
        ByteBuf bb;
        memset(&bb, 0, sizeof bb);
        TokenBuf line;
        memset(&line, 0, sizeof line);
        tokenizer_encode(tok, SNIAH_NOISE, strlen(SNIAH_NOISE), &line);
        size_t reps = (size_t)need / (line.n + 1) + 2;
        for (size_t r = 0; r < reps; r++) {
            if (r) { bytebuf_append(&bb, "\n", 1); }
            bytebuf_append(&bb, SNIAH_NOISE, strlen(SNIAH_NOISE));
        }
        tokenizer_encode(tok, bb.b, bb.n, &tb);
        bytebuf_free(&bb);
        tokbuf_free(&line);
    } else {
        size_t pos = 0;
        while (pos < text_n && tb.n < (size_t)need) { pos = tokenizer_encode_part(tok, text, text_n, pos, 1 << 16, &tb); }
        if (tb.n < (size_t)need) {
            fail(EXIT_USAGE, "--haystack %s holds %zu tokens; the longest --eval-len needs %d haystack tokens\n  hint: give a "
                 "longer text (../shared/data/tinyshakespeare.txt holds ~338k GPT-2 tokens) or shorter lengths", what, tb.n, need);
        }
    }
    h->n = (int)tb.n;
    h->ids = tb.ids;
    h->at = (uint8_t*)callocCheck((size_t)h->n + 1, 1);
    h->at[0] = h->at[h->n] = 1;
    for (int i = 1; i < h->n; i++) {
        h->at[i] = task == 1 ? sniah_token_ends(tok, h->ids[i - 1], "\n") : sniah_token_ends(tok, h->ids[i - 1], ".!?\n");
    }
}

static void sniah_haystack_free(SniahHaystack* h) { free(h->ids); free(h->at); memset(h, 0, sizeof(*h)); }

// one sample's prompt
typedef struct {
    TokenBuf ids;            // the prompt, exactly the requested length
    int needle_at, needle_n; // where the needle's tokens start in it, and how many
    int hay_n, hay_at;       // haystack tokens in the prompt, and the needle's place among them (0..hay_n)
    char key[64], value[40];
} SniahPrompt;

// a key and a value from rng: ADJECTIVE-NOUN, and a 7-digit number (RULER: randint(10^6, 10^7 - 1)) or a UUID v4
static void sniah_draw(Rng* rng, int task, char* key, size_t kn, char* value, size_t vn) {
    snprintf(key, kn, "%s-%s", SNIAH_ADJ[rng_below(rng, SNIAH_NADJ)], SNIAH_NOUN[rng_below(rng, SNIAH_NNOUN)]);
    if (task < 3) { snprintf(value, vn, "%d", 1000000 + (int)rng_below(rng, 9000000)); return; }
    uint64_t hi = rng_u64(rng), lo = rng_u64(rng);
    hi = (hi & ~0xF000ull) | 0x4000ull;                       // version 4
    lo = (lo & ~(3ull << 62)) | (2ull << 62);                 // variant 10xx
    snprintf(value, vn, "%08llx-%04llx-%04llx-%04llx-%012llx", (unsigned long long)(hi >> 32),
             (unsigned long long)((hi >> 16) & 0xFFFF), (unsigned long long)(hi & 0xFFFF), (unsigned long long)(lo >> 48),
             (unsigned long long)(lo & 0xFFFFFFFFFFFFull));
}

// Builds the prompt of `len` tokens for a needle at depth_pct of the haystack: RULER's base-model form for one
// needle and one query (its template made singular, the answer prefix appended; notes/evals.md §2.2), after an
// <|endoftext|> when the tokenizer has one (as training documents start). Returns 0, or -1 when len is too short
// for the template and the needle.
static int sniah_prompt(SniahPrompt* p, const SniahHaystack* h, Tokenizer* tok, int len, int depth_pct, const char* key,
                        const char* value) {
    const char* v = h->task == 3 ? "uuid" : "number";
    char pre[320], needle[200], post[400];
    snprintf(pre, sizeof pre, "A special magic %s is hidden within the following text. Make sure to memorize it. I will quiz "
             "you about the %s afterwards.\n", v, v);
    // the needle keeps RULER's plural; a line of its own in the noise, a sentence after a sentence in text
    if (h->task == 1) { snprintf(needle, sizeof needle, "One of the special magic %ss for %s is: %s.\n", v, key, value); }
    else { snprintf(needle, sizeof needle, " One of the special magic %ss for %s is: %s.", v, key, value); }
    snprintf(post, sizeof post, "\nWhat is the special magic %s for %s mentioned in the provided text? The special magic %s for "
             "%s mentioned in the provided text is", v, key, v, key);
    TokenBuf tp, tn, tq;
    memset(&tp, 0, sizeof tp); memset(&tn, 0, sizeof tn); memset(&tq, 0, sizeof tq);
    if (tok->eot_id >= 0) { tokbuf_push(&tp, tok->eot_id); }
    tokenizer_encode(tok, pre, strlen(pre), &tp);
    tokenizer_encode(tok, needle, strlen(needle), &tn);
    tokenizer_encode(tok, post, strlen(post), &tq);
    long hay = (long)len - (long)(tp.n + tn.n + tq.n);
    int rc = -1;
    memset(p, 0, sizeof(*p));
    if (hay >= 0 && hay <= h->n) {
        // the allowed place nearest to depth_pct of the haystack (the earlier one on a tie)
        long target = (long)((double)depth_pct / 100.0 * (double)hay + 0.5), best = 0;
        for (long i = 0; i <= hay; i++) {
            if ((h->at[i] || i == hay) && labs(i - target) < labs(best - target)) { best = i; }
        }
        TokenBuf* o = &p->ids;
        for (size_t i = 0; i < tp.n; i++) { tokbuf_push(o, tp.ids[i]); }
        for (long i = 0; i < best; i++) { tokbuf_push(o, h->ids[i]); }
        p->needle_at = (int)o->n;
        p->needle_n = (int)tn.n;
        for (size_t i = 0; i < tn.n; i++) { tokbuf_push(o, tn.ids[i]); }
        for (long i = best; i < hay; i++) { tokbuf_push(o, h->ids[i]); }
        for (size_t i = 0; i < tq.n; i++) { tokbuf_push(o, tq.ids[i]); }
        p->hay_n = (int)hay;
        p->hay_at = (int)best;
        snprintf(p->key, sizeof p->key, "%s", key);
        snprintf(p->value, sizeof p->value, "%s", value);
        rc = 0;
    }
    tokbuf_free(&tp); tokbuf_free(&tn); tokbuf_free(&tq);
    return rc;
}

// the shortest --eval-len the template allows (a haystack of 0 tokens), for the error message
static int sniah_min_len(const SniahHaystack* h, Tokenizer* tok) {
    SniahPrompt p;
    int len = 1;
    while (sniah_prompt(&p, h, tok, len, 0, "ancient-anchor", "00000000-0000-0000-0000-000000000000") != 0) { len++; }
    tokbuf_free(&p.ids);
    return len;
}

// RULER's score of one sample: 1 when the value occurs in the generated text, ignoring case
static int sniah_score(const uint8_t* text, size_t n, const char* value) {
    size_t m = strlen(value);
    for (size_t i = 0; m && i + m <= n; i++) {
        size_t j = 0;
        while (j < m && tolower(text[i + j]) == tolower((unsigned char)value[j])) { j++; }
        if (j == m) { return 1; }
    }
    return 0;
}

// greedy continuation of a prompt from the recurrent state: up to max_new tokens into out, stopping after
// stop_id (when >= 0); lp[i] = log p(out[i]) from the carried state. Returns the number generated.
static int sniah_generate(Trainer* tr, int vocab, const int* prompt, int P, int max_new, int stop_id, int* out, float* lp,
                          double* t_prefill, double* t_decode) {
    GenState* g = tr_gen_open(tr, P, P + max_new);
    float* row = (float*)mallocCheck((size_t)vocab * sizeof(float));
    double t0 = wall_seconds();
    tr_gen_feed(g, prompt, P, row);
    double t1 = wall_seconds();
    int n = 0;
    while (n < max_new) {
        int best = 0;
        for (int i = 1; i < vocab; i++) { if (row[i] > row[best]) { best = i; } }
        double s = 0.0;
        for (int i = 0; i < vocab; i++) { s += exp((double)row[i] - row[best]); }
        lp[n] = (float)-log(s);
        out[n++] = best;
        if (best == stop_id || n == max_new) { break; }
        tr_gen_feed(g, &out[n - 1], 1, row);
    }
    *t_prefill = t1 - t0;
    *t_decode = wall_seconds() - t1;
    free(row);
    tr_gen_close(g);
    return n;
}

// The carried state against a full forward: the log-probs of the generated tokens from one forward pass over the
// prompt and the generation must be those the recurrent decoding gave. Returns the largest difference.
static double sniah_state_check(Trainer* tr, const int* prompt, int P, const int* gen, const float* lp, int n) {
    int T = P + n - 1; // the last generated token is a target only
    int* x = (int*)mallocCheck((size_t)T * sizeof(int));
    int* y = (int*)mallocCheck((size_t)T * sizeof(int));
    float* full = (float*)mallocCheck((size_t)T * sizeof(float));
    for (int t = 0; t < T; t++) {
        x[t] = t < P ? prompt[t] : gen[t - P];
        y[t] = t < P - 1 ? -1 : gen[t - (P - 1)];
    }
    tr_logprobs(tr, 1, T, x, y, full);
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)full[P - 1 + i] - lp[i]);
        worst = d > worst ? d : worst;
    }
    free(x); free(y); free(full);
    return worst;
}

static void run_sniah(Trainer* tr, const Run* r, int task) {
    const TrainConfig* tc = r->tc;
    Tokenizer* tok = r->tok;
    int lens[EVAL_MAX_LIST], depths[EVAL_MAX_LIST];
    int nl = eval_int_list(tc->eval_len, lens, 1, 1 << 20, "--eval-len");
    int nd = eval_int_list(tc->eval_depths, depths, 0, 100, "--eval-depths");
    eval_check_tokenizer(r);
    tokenizer_check_can_encode(tok);
    int maxlen = 0;
    for (int i = 0; i < nl; i++) { maxlen = lens[i] > maxlen ? lens[i] : maxlen; }
    size_t text_n = 0;
    uint8_t* text = task > 1 ? slurp_file(tc->haystack, &text_n) : NULL;
    SniahHaystack h;
    sniah_haystack(&h, task, tok, text, text_n, maxlen, tc->haystack);
    for (int i = 0; i < nl; i++) {
        if (lens[i] - tc->eval_gen < sniah_min_len(&h, tok)) {
            fail(EXIT_USAGE, "--eval-len %d leaves %d prompt tokens after --eval-gen %d; the template and the needle alone "
                 "take %d", lens[i], lens[i] - tc->eval_gen, tc->eval_gen, sniah_min_len(&h, tok));
        }
    }
    static const char* const what[4] = {"", "noise haystack (RULER's), 7-digit values",
        "haystack from --haystack (not RULER's essays: not comparable to the paper), 7-digit values",
        "haystack from --haystack (not RULER's essays: not comparable to the paper), UUID values"};
    printf("S-NIAH-%d: %s; %d samples per (length, depth), seed %ld, greedy, up to %d tokens (stop at <|endoftext|>)\n",
           task, what[task], tc->eval_samples, tc->seed, tc->eval_gen);
    FILE* ft = eval_open_tsv(tc, "", "length\tdepth\tsamples\tcorrect\taccuracy\tprefill_tok_s\tdecode_tok_s");
    FILE* fs = eval_open_tsv(tc, "_samples", "length\tdepth\tsample\tkey\tvalue\tneedle_at\tcorrect\tgenerated_ids\tgenerated_text");
    printf("%7s |", "length");
    for (int d = 0; d < nd; d++) { printf(" depth %3d%% |", depths[d]); }
    printf(" %8s | %13s | %12s | %s\n", "accuracy", "prefill tok/s", "decode tok/s", "state vs full forward");
    int* gen = (int*)mallocCheck((size_t)tc->eval_gen * sizeof(int));
    float* lp = (float*)mallocCheck((size_t)tc->eval_gen * sizeof(float));
    int correct_all = 0, samples_all = 0;
    for (int li = 0; li < nl; li++) {
        int L = lens[li], P = L - tc->eval_gen, right = 0;
        double tp = 0.0, td = 0.0, check = -1.0;
        long ntp = 0, ntd = 0;
        printf("%7d |", L);
        for (int d = 0; d < nd; d++) {
            int cell = 0;
            for (int s = 0; s < tc->eval_samples; s++) {
                // every (length, depth, sample) has its own key and value stream: a cell does not depend on the others
                Rng rng;
                uint64_t sm = (uint64_t)tc->seed ^ ((uint64_t)L << 40) ^ ((uint64_t)depths[d] << 32) ^ (uint64_t)s;
                rng_seed(&rng, splitmix64(&sm));
                char key[64], value[40];
                sniah_draw(&rng, task, key, sizeof key, value, sizeof value);
                SniahPrompt p;
                sniah_prompt(&p, &h, tok, P, depths[d], key, value);
                double a, b;
                int n = sniah_generate(tr, r->mc->vocab_size, p.ids.ids, P, tc->eval_gen, tok->eot_id, gen, lp, &a, &b);
                tp += a; ntp += P; td += b; ntd += n - 1; // the first token comes with the prefill
                if (check < 0) { check = sniah_state_check(tr, p.ids.ids, P, gen, lp, n); }
                ByteBuf bb;
                memset(&bb, 0, sizeof bb);
                tokenizer_decode(tok, gen, (size_t)n, &bb);
                int ok = sniah_score(bb.b, bb.n, value);
                cell += ok;
                if (fs) {
                    fprintf(fs, "%d\t%d\t%d\t%s\t%s\t%d\t%d\t", L, depths[d], s, key, value, p.needle_at, ok);
                    for (int i = 0; i < n; i++) { fprintf(fs, "%s%d", i ? " " : "", gen[i]); }
                    fputc('\t', fs);
                    for (size_t i = 0; i < bb.n; i++) { fputc(bb.b[i] == '\t' || bb.b[i] == '\n' || bb.b[i] == '\r' ? ' ' : bb.b[i], fs); }
                    fputc('\n', fs);
                }
                bytebuf_free(&bb);
                tokbuf_free(&p.ids);
            }
            right += cell;
            printf(" %9.1f%% |", 100.0 * cell / tc->eval_samples);
            if (ft) {
                fprintf(ft, "%d\t%d\t%d\t%d\t%.4f\t\t\n", L, depths[d], tc->eval_samples, cell, (double)cell / tc->eval_samples);
            }
        }
        int ns = nd * tc->eval_samples;
        double ptps = tp > 0 ? ntp / tp : 0.0, dtps = td > 0 ? ntd / td : 0.0;
        printf(" %7.1f%% | %13.0f | %12.1f | max |dlogp| %.2e\n", 100.0 * right / ns, ptps, dtps, check);
        if (ft) { fprintf(ft, "%d\tall\t%d\t%d\t%.4f\t%.1f\t%.2f\n", L, ns, right, (double)right / ns, ptps, dtps); }
        correct_all += right;
        samples_all += ns;
    }
    printf("overall: %d of %d correct (%.1f%%)\n", correct_all, samples_all, 100.0 * correct_all / samples_all);
    printf("(state vs full forward: the largest difference between the log-probs of the first sample's generated tokens "
           "from the carried state and from one forward pass over prompt + generation)\n");
    eval_close_tsv(ft, tc, "");
    eval_close_tsv(fs, tc, "_samples");
    free(gen); free(lp); free(text);
    sniah_haystack_free(&h);
}

// ----------------------------------------------------------------------------------------------------
// multiple choice: llm.c's eval file
//
//   header: 256 int32: [0] magic 20240522, [1] version 1, [2] examples, [3] the longest example in bytes
//   then each example as uint16: 65535, its size in bytes (these fields included), its index (0, 1, ...), the
//   label, the number of completions, the context's length and tokens, then per completion its length and tokens

#define MC_MAGIC 20240522
#define MC_HEADER_INTS 256

typedef struct { int label, n_comp, ctx_len; size_t ctx, comp; } McExample; // comp: its first completion's index
typedef struct {
    int n;                   // examples
    McExample* ex;
    int* tok;                // every context's and completion's tokens
    size_t* comp_tok;        // (completions) where each completion's tokens start in tok
    int* comp_len;
    size_t n_comp;
    int max_row;             // the longest context + completion, in tokens
} McSet;

static void mc_free(McSet* s) { free(s->ex); free(s->tok); free(s->comp_tok); free(s->comp_len); memset(s, 0, sizeof(*s)); }

// Reads an eval file, checking everything the format promises; a malformed file fails (exit 2) with the byte offset
// and what is wrong there. Token ids must lie in [0, vocab).
static void mc_read(McSet* s, const char* path, int vocab) {
    size_t nb;
    uint8_t* buf = slurp_file(path, &nb);
    memset(s, 0, sizeof(*s));
    if (nb < MC_HEADER_INTS * 4) { fail(EXIT_BADFILE, "%s: byte %zu: the file ends inside the 1024-byte header", path, nb); }
    int32_t hd[4];
    memcpy(hd, buf, sizeof hd);
    if (hd[0] != MC_MAGIC) { fail(EXIT_BADFILE, "%s: byte 0: magic %d, an eval file starts with %d (llm.c's format)", path, hd[0], MC_MAGIC); }
    if (hd[1] != 1) { fail(EXIT_BADFILE, "%s: byte 4: version %d, only version 1 is known", path, hd[1]); }
    if (hd[2] < 1) { fail(EXIT_BADFILE, "%s: byte 8: %d examples", path, hd[2]); }
    if (hd[3] < 12 || hd[3] >= 65536) { fail(EXIT_BADFILE, "%s: byte 12: longest example %d bytes is not possible", path, hd[3]); }
    if ((nb - MC_HEADER_INTS * 4) % 2) { fail(EXIT_BADFILE, "%s: byte %zu: the file ends inside a uint16", path, nb - 1); }
    const uint8_t* d = buf + MC_HEADER_INTS * 4;
    size_t nw = (nb - MC_HEADER_INTS * 4) / 2, w = 0, longest = 0;
    // offsets in the messages are of the file
#define MC_AT(i) ((size_t)MC_HEADER_INTS * 4 + 2 * (i))
#define MC_WORD(i) ((int)d[2 * (i)] | ((int)d[2 * (i) + 1] << 8))
    s->n = hd[2];
    s->ex = (McExample*)callocCheck((size_t)s->n, sizeof(McExample));
    s->tok = (int*)mallocCheck(nw * sizeof(int) + 1);
    s->comp_tok = (size_t*)mallocCheck(nw * sizeof(size_t) + 1);
    s->comp_len = (int*)mallocCheck(nw * sizeof(int) + 1);
    size_t nt = 0;
    for (int e = 0; e < s->n; e++) {
        size_t start = w;
        if (w + 6 > nw) { fail(EXIT_BADFILE, "%s: byte %zu: the file ends inside example %d's header (the header promises %d examples)", path, MC_AT(w), e, s->n); }
        if (MC_WORD(w) != 65535) { fail(EXIT_BADFILE, "%s: byte %zu: example %d does not start with the delimiter 65535 (found %d)", path, MC_AT(w), e, MC_WORD(w)); }
        size_t bytes = (size_t)MC_WORD(w + 1);
        if (bytes % 2 || bytes < 12 || start + bytes / 2 > nw) {
            fail(EXIT_BADFILE, "%s: byte %zu: example %d's size %zu bytes is %s", path, MC_AT(w + 1), e, bytes,
                 bytes % 2 || bytes < 12 ? "not possible" : "past the end of the file");
        }
        if (MC_WORD(w + 2) != e % 65536) { fail(EXIT_BADFILE, "%s: byte %zu: example %d has the index %d", path, MC_AT(w + 2), e, MC_WORD(w + 2)); }
        McExample* x = &s->ex[e];
        x->label = MC_WORD(w + 3);
        x->n_comp = MC_WORD(w + 4);
        if (x->n_comp < 2) { fail(EXIT_BADFILE, "%s: byte %zu: example %d has %d completions (a choice needs 2 or more)", path, MC_AT(w + 4), e, x->n_comp); }
        if (x->label >= x->n_comp) { fail(EXIT_BADFILE, "%s: byte %zu: example %d's label %d is not one of its %d completions", path, MC_AT(w + 3), e, x->label, x->n_comp); }
        size_t end = start + bytes / 2;
        w += 5;
        x->comp = s->n_comp;
        for (int k = -1; k < x->n_comp; k++) { // k = -1: the context
            if (w >= end) { fail(EXIT_BADFILE, "%s: byte %zu: example %d ends (its size says) before its %s", path, MC_AT(w), e, k < 0 ? "context" : "completions"); }
            int len = MC_WORD(w);
            if (len < 1 || w + 1 + (size_t)len > end) {
                char part[32] = "context";
                if (k >= 0) { snprintf(part, sizeof part, "completion %d", k); }
                fail(EXIT_BADFILE, "%s: byte %zu: example %d's %s has %d tokens, %s", path, MC_AT(w), e, part, len,
                     len < 1 ? "none" : "more than the example's size leaves");
            }
            if (k < 0) { x->ctx = nt; x->ctx_len = len; }
            else { s->comp_tok[s->n_comp] = nt; s->comp_len[s->n_comp] = len; s->n_comp++; }
            for (int i = 0; i < len; i++) {
                int t = MC_WORD(w + 1 + i);
                if (t >= vocab) { fail(EXIT_BADFILE, "%s: byte %zu: example %d: token %d is outside the model's vocabulary [0, %d)", path, MC_AT(w + 1 + i), e, t, vocab); }
                s->tok[nt++] = t;
            }
            w += 1 + (size_t)len;
            if (k >= 0 && x->ctx_len + len > s->max_row) { s->max_row = x->ctx_len + len; }
        }
        if (w != end) { fail(EXIT_BADFILE, "%s: byte %zu: example %d's size says it ends at byte %zu", path, MC_AT(w), e, MC_AT(end)); }
        if (bytes > longest) { longest = bytes; }
    }
    if (w != nw) { fail(EXIT_BADFILE, "%s: byte %zu: %zu bytes after the last of the header's %d examples", path, MC_AT(w), 2 * (nw - w), s->n); }
    if (longest != (size_t)hd[3]) {
        fail(EXIT_BADFILE, "%s: byte 12: the header's longest example is %d bytes, the longest is %zu", path, hd[3], longest);
    }
#undef MC_AT
#undef MC_WORD
    free(buf);
}

// The log-likelihood of every completion given its context (ll, one per completion): rows of T = the longest
// context + completion - 1 tokens, whole examples packed into batches of up to `rows` rows (at least one example's),
// each row scored by tr_logprobs (the context's tokens are inputs only, padding after the row is never seen by it).
static void mc_loglik(Trainer* tr, const McSet* s, int rows, double* ll) {
    int T = s->max_row - 1 > 0 ? s->max_row - 1 : 1, maxc = 0;
    for (int e = 0; e < s->n; e++) { maxc = s->ex[e].n_comp > maxc ? s->ex[e].n_comp : maxc; }
    if (rows < maxc) { rows = maxc; }
    size_t N = (size_t)rows * T;
    int* x = (int*)mallocCheck(N * sizeof(int));
    int* y = (int*)mallocCheck(N * sizeof(int));
    float* lp = (float*)mallocCheck(N * sizeof(float));
    for (int e0 = 0; e0 < s->n;) {
        int e1 = e0, used = 0;
        while (e1 < s->n && used + s->ex[e1].n_comp <= rows) { used += s->ex[e1].n_comp; e1++; }
        for (size_t i = 0; i < N; i++) { x[i] = 0; y[i] = -1; }
        int row = 0;
        for (int e = e0; e < e1; e++) {
            const McExample* ex = &s->ex[e];
            for (int k = 0; k < ex->n_comp; k++, row++) {
                int* xr = x + (size_t)row * T;
                int* yr = y + (size_t)row * T;
                size_t c = ex->comp + k;
                int n = ex->ctx_len + s->comp_len[c];
                for (int t = 0; t < n; t++) {
                    int tokv = t < ex->ctx_len ? s->tok[ex->ctx + t] : s->tok[s->comp_tok[c] + t - ex->ctx_len];
                    if (t < T) { xr[t] = tokv; }
                    if (t >= ex->ctx_len) { yr[t - 1] = tokv; } // the completion's tokens are the targets
                }
            }
        }
        tr_logprobs(tr, rows, T, x, y, lp);
        row = 0;
        for (int e = e0; e < e1; e++) {
            const McExample* ex = &s->ex[e];
            for (int k = 0; k < ex->n_comp; k++, row++) {
                double sum = 0.0;
                for (int t = 0; t < T; t++) { if (y[(size_t)row * T + t] >= 0) { sum += lp[(size_t)row * T + t]; } }
                ll[ex->comp + k] = sum;
            }
        }
        e0 = e1;
    }
    free(x); free(y); free(lp);
}

// Unicode characters in UTF-8 text (what Python's len() counts; a malformed byte counts as one)
static long utf8_chars(const uint8_t* b, size_t n) {
    long c = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        utf8_decode(b, n, i, &len);
        i += len ? len : 1;
        c++;
    }
    return c;
}

// acc, acc_norm (chars may be NULL: then not computed, -1) and acc_tok over the examples from the completions' ll
typedef struct { double acc, acc_norm, acc_tok; } McScores;
static McScores mc_tally(const McSet* s, const double* ll, const long* chars, int* pick, int* pick_norm) {
    long a = 0, an = 0, at = 0;
    for (int e = 0; e < s->n; e++) {
        const McExample* ex = &s->ex[e];
        int b = 0, bn = 0, bt = 0;
        for (int k = 1; k < ex->n_comp; k++) { // strictly greater: the first of equal scores wins (numpy's argmax)
            size_t c = ex->comp + k;
            if (ll[c] > ll[ex->comp + b]) { b = k; }
            if (chars && ll[c] / chars[c] > ll[ex->comp + bn] / chars[ex->comp + bn]) { bn = k; }
            if (ll[c] / s->comp_len[c] > ll[ex->comp + bt] / s->comp_len[ex->comp + bt]) { bt = k; }
        }
        a += b == ex->label; an += bn == ex->label; at += bt == ex->label;
        if (pick) { pick[e] = b; }
        if (pick_norm) { pick_norm[e] = chars ? bn : -1; }
    }
    McScores r = {(double)a / s->n, chars ? (double)an / s->n : -1.0, (double)at / s->n};
    return r;
}

// the completions' lengths in characters, from their decoded tokens
static long* mc_chars(const McSet* s, const Tokenizer* tok) {
    long* chars = (long*)mallocCheck(s->n_comp * sizeof(long) + 1);
    for (size_t c = 0; c < s->n_comp; c++) {
        ByteBuf bb;
        memset(&bb, 0, sizeof bb);
        tokenizer_decode(tok, s->tok + s->comp_tok[c], (size_t)s->comp_len[c], &bb);
        chars[c] = utf8_chars(bb.b, bb.n);
        if (chars[c] < 1) { chars[c] = 1; } // (a completion of special tokens only)
        bytebuf_free(&bb);
    }
    return chars;
}

static void run_mc(Trainer* tr, const Run* r) {
    const TrainConfig* tc = r->tc;
    McSet s;
    mc_read(&s, tc->eval_file, r->mc->vocab_size);
    eval_check_tokenizer(r);
    int rows = tc->eval_tokens / (s.max_row > 1 ? s.max_row - 1 : 1);
    double* ll = (double*)mallocCheck(s.n_comp * sizeof(double) + 1);
    double t0 = wall_seconds();
    mc_loglik(tr, &s, rows, ll);
    double dt = wall_seconds() - t0;
    long* chars = r->tok ? mc_chars(&s, r->tok) : NULL;
    int* pick = (int*)mallocCheck((size_t)s.n * sizeof(int));
    int* pick_norm = (int*)mallocCheck((size_t)s.n * sizeof(int));
    McScores sc = mc_tally(&s, ll, chars, pick, pick_norm);
    long toks = 0;
    for (size_t c = 0; c < s.n_comp; c++) { toks += s.comp_len[c]; }
    printf("multiple choice: %s, %d examples, %zu completions (%ld completion tokens), rows of %d tokens\n", tc->eval_file, s.n,
           s.n_comp, toks, s.max_row - 1);
    printf("%-9s | %8s | %s\n", "metric", "value", "definition");
    printf("%-9s | %8.4f | argmax of the summed log-likelihood (lm-eval acc)\n", "acc", sc.acc);
    if (chars) { printf("%-9s | %8.4f | argmax of log-likelihood / characters (lm-eval acc_norm)\n", "acc_norm", sc.acc_norm); }
    else { printf("%-9s | %8s | needs --tokenizer (the completions' characters)\n", "acc_norm", "-"); }
    printf("%-9s | %8.4f | argmax of the mean log-likelihood per token (llm.c's HellaSwag choice)\n", "acc_tok", sc.acc_tok);
    double chance = 0.0;
    for (int e = 0; e < s.n; e++) { chance += 1.0 / s.ex[e].n_comp / s.n; }
    printf("%-9s | %8.4f | 1 / completions, averaged over the examples\n", "chance", chance);
    printf("scored in %.2f s (%.0f rows/s)\n", dt, dt > 0 ? s.n_comp / dt : 0.0);
    FILE* ft = eval_open_tsv(tc, "", "examples\tacc\tacc_norm\tacc_tok");
    if (ft) { fprintf(ft, "%d\t%.6f\t%.6f\t%.6f\n", s.n, sc.acc, sc.acc_norm, sc.acc_tok); }
    eval_close_tsv(ft, tc, "");
    FILE* fs = eval_open_tsv(tc, "_samples", "example\tlabel\tpick\tpick_norm\tloglik_per_completion\tchars_per_completion");
    for (int e = 0; fs && e < s.n; e++) {
        fprintf(fs, "%d\t%d\t%d\t%d\t", e, s.ex[e].label, pick[e], pick_norm[e]);
        for (int k = 0; k < s.ex[e].n_comp; k++) { fprintf(fs, "%s%.6f", k ? " " : "", ll[s.ex[e].comp + k]); }
        fputc('\t', fs);
        for (int k = 0; k < s.ex[e].n_comp; k++) { fprintf(fs, "%s%ld", k ? " " : "", chars ? chars[s.ex[e].comp + k] : -1L); }
        fputc('\n', fs);
    }
    eval_close_tsv(fs, tc, "_samples");
    free(ll); free(chars); free(pick); free(pick_norm);
    mc_free(&s);
}

// ----------------------------------------------------------------------------------------------------
// perplexity and bits per byte over the validation shards

typedef struct { long windows, tokens, bytes; double nll, seconds; } PplResult;

// Every window of L tokens of the split (at most max_windows; 0: all), batches of `rows` windows; bytes counted
// when tok is given (else -1).
static PplResult ppl_measure(Trainer* tr, const char* glob, int vocab, int L, int rows, long max_windows, const Tokenizer* tok) {
    DataLoader dl;
    dataloader_init_val(&dl, glob, 1, L, 0, 1, vocab, -1); // one window per batch: rows are gathered below
    long total = dataloader_num_batches(&dl);
    if (max_windows > 0 && max_windows < total) { total = max_windows; }
    size_t N = (size_t)rows * L;
    int* x = (int*)mallocCheck(N * sizeof(int));
    int* y = (int*)mallocCheck(N * sizeof(int));
    float* lp = (float*)mallocCheck(N * sizeof(float));
    PplResult res = {0, 0, tok ? 0 : -1, 0.0, 0.0};
    double t0 = wall_seconds();
    for (long w0 = 0; w0 < total; w0 += rows) {
        int nr = total - w0 < rows ? (int)(total - w0) : rows;
        for (int i = 0; i < nr; i++) {
            dataloader_next(&dl);
            memcpy(x + (size_t)i * L, dl.inputs, (size_t)L * sizeof(int));
            memcpy(y + (size_t)i * L, dl.targets, (size_t)L * sizeof(int));
        }
        tr_logprobs(tr, nr, L, x, y, lp);
        for (size_t n = 0; n < (size_t)nr * L; n++) {
            res.nll -= lp[n];
            if (tok && !tok->is_special[y[n]]) { size_t len; tokenizer_token(tok, y[n], &len); res.bytes += (long)len; }
        }
        res.windows += nr;
        res.tokens += (long)nr * L;
    }
    res.seconds = wall_seconds() - t0;
    free(x); free(y); free(lp);
    dataloader_free(&dl);
    return res;
}

static void run_ppl(Trainer* tr, const Run* r) {
    const TrainConfig* tc = r->tc;
    int lens[EVAL_MAX_LIST];
    int nl = eval_int_list(tc->eval_len, lens, 1, 1 << 20, "--eval-len");
    const Tokenizer* tok = r->tok;
    eval_check_tokenizer(r);
    printf("perplexity: %s, windows of L tokens from a zero state, %s\n", tc->val,
           tc->eval_windows ? "the first --eval-windows of each length" : "every window of the split");
    printf("%7s | %8s | %10s | %10s | %9s | %10s | %8s | %10s\n", "length", "windows", "tokens", "bytes", "loss", "ppl", "bpb", "tok/s");
    FILE* ft = eval_open_tsv(tc, "", "length\twindows\ttokens\tbytes\tnll_sum\tloss\tppl\tbpb\ttok_s");
    for (int i = 0; i < nl; i++) {
        int rows = tc->eval_tokens / lens[i] > 0 ? tc->eval_tokens / lens[i] : 1;
        PplResult p = ppl_measure(tr, tc->val, r->mc->vocab_size, lens[i], rows, tc->eval_windows, tok);
        double loss = p.nll / p.tokens, bpb = p.bytes > 0 ? p.nll / log(2.0) / p.bytes : -1.0;
        char bs[32] = "-", bb[32] = "-";
        if (p.bytes >= 0) { snprintf(bs, sizeof bs, "%ld", p.bytes); }
        if (bpb >= 0) { snprintf(bb, sizeof bb, "%.6f", bpb); }
        printf("%7d | %8ld | %10ld | %10s | %9.6f | %10.4f | %8s | %10.0f\n", lens[i], p.windows, p.tokens, bs, loss, exp(loss),
               bb, p.seconds > 0 ? p.tokens / p.seconds : 0.0);
        if (ft) {
            fprintf(ft, "%d\t%ld\t%ld\t%ld\t%.6f\t%.8f\t%.6f\t%.8f\t%.1f\n", lens[i], p.windows, p.tokens, p.bytes, p.nll, loss,
                    exp(loss), bpb, p.seconds > 0 ? p.tokens / p.seconds : 0.0);
        }
    }
    if (!tok) { printf("(bits per byte need --tokenizer: the bytes are those the target tokens decode to)\n"); }
    eval_close_tsv(ft, tc, "");
}

// --eval NAME: the evaluation on the loaded checkpoint, then the process ends
static void run_eval(Trainer* tr, const Run* r) {
    int task, kind = eval_kind(r->tc->eval, &task);
    char vname[64];
    pdn_variant_name(r->mc, vname, sizeof vname);
    printf("eval %s: %s (%s, %zu parameters) on %s\n", r->tc->eval, r->tc->init_ckpt, vname, r->lay->num_params, r->precision);
    if (kind == EVAL_SNIAH) { run_sniah(tr, r, task); }
    else if (kind == EVAL_MC) { run_mc(tr, r); }
    else { run_ppl(tr, r); }
}

#endif // PDN_EVAL_H
