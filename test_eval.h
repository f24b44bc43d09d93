/*
test_eval.h: the tests of eval.h (issue 16), included by test_pdn.c (fp32 build); run_eval_tests(). Uses test_pdn.c's
CHECK, TestDir, run_cmd, run_child, write_bytes, small_config, randomize_params, train_small_tokenizer.
  - S-NIAH prompts: exact length, the needle at its depth (to the nearest allowed place), the value recoverable by
    the scorer; handing the scorer the right answer gives 100%, a constant answer 0%
  - multiple choice: a hand-written eval file scored through the trainer (chunkwise mixer, rows packed) against each
    completion scored alone with the per-token mixer; acc / acc_norm / acc_tok on hand-worked numbers where they
    differ; malformed files refused with the byte offset; the CLI end to end
  - perplexity: bits per byte against a direct computation on a short text (one window: its bytes are the text's)
  - the carried state at long lengths: prefill + decoding against one full forward (sniah_state_check)
  - bad --eval flags refused
*/

// a sentence-rich natural-ish text for the text haystack (sniah2/3), made from a seed
static size_t eval_text(Rng* r, char* out, size_t cap) {
    static const char* const words[] = {"the", "river", "ran", "past", "a", "quiet", "town", "where", "old", "men", "told",
                                        "stories", "of", "kings", "and", "storms", "under", "grey", "skies", "at", "night"};
    size_t n = 0;
    while (n + 200 < cap) {
        int len = 4 + (int)rng_below(r, 10);
        for (int i = 0; i < len; i++) {
            n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? " " : (n ? " " : ""), words[rng_below(r, 21)]);
        }
        n += (size_t)snprintf(out + n, cap - n, "%s", rng_below(r, 5) == 0 ? ".\n" : (rng_below(r, 4) == 0 ? "?" : "."));
    }
    return n;
}

static void test_sniah_builder(Tokenizer* tok) {
    static char text[1 << 16];
    Rng r;
    rng_seed(&r, 77);
    size_t tn = eval_text(&r, text, sizeof text);
    int lens[2] = {300, 900}, depths[5] = {0, 25, 50, 75, 100};
    for (int task = 1; task <= 3; task++) {
        SniahHaystack h;
        sniah_haystack(&h, task, tok, (const uint8_t*)text, tn, 900, "(test text)");
        // the needle goes to the allowed place nearest to its depth: at most half the widest gap between places away
        int gap = 0, last = 0;
        for (int i = 1; i <= h.n; i++) { if (h.at[i]) { gap = i - last > gap ? i - last : gap; last = i; } }
        int bad_len = 0, bad_depth = 0, bad_place = 0, bad_value = 0, right = 0, constant = 0, total = 0;
        for (int li = 0; li < 2; li++) {
            for (int d = 0; d < 5; d++) {
                for (int s = 0; s < 4; s++) {
                    char key[64], value[40];
                    sniah_draw(&r, task, key, sizeof key, value, sizeof value);
                    SniahPrompt p;
                    int rc = sniah_prompt(&p, &h, tok, lens[li], depths[d], key, value);
                    bad_len += rc != 0 || p.ids.n != (size_t)lens[li];
                    if (rc != 0) { continue; }
                    double want = depths[d] / 100.0 * p.hay_n;
                    bad_depth += fabs(p.hay_at - want) > gap / 2.0 + 0.5;
                    bad_place += !h.at[p.hay_at] && p.hay_at != p.hay_n;
                    // the needle's tokens decode to the needle, with the value and the key
                    ByteBuf nb;
                    memset(&nb, 0, sizeof nb);
                    tokenizer_decode(tok, p.ids.ids + p.needle_at, (size_t)p.needle_n, &nb);
                    bytebuf_append(&nb, "", 1);
                    bad_value += !strstr((char*)nb.b, value) || !strstr((char*)nb.b, key) || !strstr((char*)nb.b, "One of the special magic");
                    bytebuf_free(&nb);
                    // a model handed the answer (as it would write it) scores; a constant answer never does
                    char ans[64];
                    snprintf(ans, sizeof ans, " %s.", value);
                    for (int k = 0; ans[k]; k++) { if (k % 3 == 0) { ans[k] = (char)toupper(ans[k]); } } // any case counts
                    TokenBuf ta;
                    memset(&ta, 0, sizeof ta);
                    tokenizer_encode(tok, ans, strlen(ans), &ta);
                    ByteBuf db;
                    memset(&db, 0, sizeof db);
                    tokenizer_decode(tok, ta.ids, ta.n, &db);
                    right += sniah_score(db.b, db.n, value);
                    const char* c = task == 3 ? " 00000000-0000-0000-0000-000000000000." : " 0000000.";
                    constant += sniah_score((const uint8_t*)c, strlen(c), value);
                    total++;
                    tokbuf_free(&ta); bytebuf_free(&db); tokbuf_free(&p.ids);
                }
            }
        }
        CHECK(bad_len == 0, "sniah%d: %d prompts not of the requested length", task, bad_len);
        CHECK(bad_depth == 0, "sniah%d: %d needles farther than %d tokens from their depth", task, bad_depth, gap / 2 + 1);
        CHECK(bad_place == 0, "sniah%d: %d needles not at a line start / sentence end", task, bad_place);
        CHECK(bad_value == 0, "sniah%d: %d needles whose tokens do not decode to the key and the value", task, bad_value);
        CHECK(right == total && constant == 0, "sniah%d: the right answer scored %d/%d, a constant one %d/%d", task, right, total,
              constant, total);
        printf("  sniah%d prompts: %d of lengths 300/900 exactly, needles within %d tokens of their depth, at a %s; the "
               "right answer scores %.0f%%, a constant one %.0f%%\n", task, total, gap / 2 + 1,
               task == 1 ? "line start" : "sentence end", 100.0 * right / total, 100.0 * constant / total);
        sniah_haystack_free(&h);
    }
    // the scorer: case-insensitive substring, nothing else
    CHECK(sniah_score((const uint8_t*)"is 12345678", 11, "1234567") == 1 && sniah_score((const uint8_t*)"is 123456", 9, "1234567") == 0 &&
          sniah_score((const uint8_t*)"AB-CD", 5, "ab-cd") == 1, "sniah_score: substring / case rules");
}

// ---- multiple choice

// a hand-built eval file in llm.c's format (written here, independently of mc_read): examples of 2..4 completions
typedef struct { int label, nc, ctx[8], nctx, comp[4][6], ncomp[4]; } HandEx;

static size_t mc_write(const char* path, const HandEx* ex, int n) {
    static uint16_t w[4096];
    size_t nw = 0, longest = 0;
    for (int e = 0; e < n; e++) {
        size_t st = nw;
        w[nw++] = 65535; w[nw++] = 0; w[nw++] = (uint16_t)e; w[nw++] = (uint16_t)ex[e].label; w[nw++] = (uint16_t)ex[e].nc;
        w[nw++] = (uint16_t)ex[e].nctx;
        for (int i = 0; i < ex[e].nctx; i++) { w[nw++] = (uint16_t)ex[e].ctx[i]; }
        for (int k = 0; k < ex[e].nc; k++) {
            w[nw++] = (uint16_t)ex[e].ncomp[k];
            for (int i = 0; i < ex[e].ncomp[k]; i++) { w[nw++] = (uint16_t)ex[e].comp[k][i]; }
        }
        w[st + 1] = (uint16_t)(2 * (nw - st));
        if (2 * (nw - st) > longest) { longest = 2 * (nw - st); }
    }
    int32_t hd[256] = {MC_MAGIC, 1, n, (int32_t)longest};
    FILE* f = fopenCheck(path, "wb");
    fwriteCheck(hd, 4, 256, f);
    fwriteCheck(w, 2, nw, f);
    fclose(f);
    return 1024 + 2 * nw;
}

static const char* mc_child_path;
static void child_mc_read(void* vocab) { McSet s; mc_read(&s, mc_child_path, *(int*)vocab); }

// log p of `n` tokens seq[ctx..n) given seq[0..ctx) from one per-token forward of this sequence alone (double)
static double ll_per_token(Model* m, const int* seq, int n, int ctx) {
    Acts a = acts_alloc(m, 1, n - 1, 0);
    pdn_forward(m, &a, seq, NULL);
    int Vv = m->cfg.vocab_size;
    double ll = 0.0;
    for (int t = ctx - 1; t < n - 1; t++) {
        const real* lg = a.logits + (size_t)t * Vv;
        double mx = -1e300, s = 0.0;
        for (int i = 0; i < Vv; i++) { mx = lg[i] > mx ? lg[i] : mx; }
        for (int i = 0; i < Vv; i++) { s += exp(lg[i] - mx); }
        ll += lg[seq[t + 1]] - mx - log(s);
    }
    acts_free(&a);
    return ll;
}

static void test_mc(void) {
    TestDir td;
    tdir_open(&td, "eval_mc");
    PdnConfig c = small_config("pgdn", 0, 1);
    Rng r;
    rng_seed(&r, 31);
    HandEx ex[7];
    memset(ex, 0, sizeof ex);
    for (int e = 0; e < 7; e++) {
        ex[e].nc = 2 + e % 3; ex[e].label = e % ex[e].nc; ex[e].nctx = 1 + (int)rng_below(&r, 8);
        for (int i = 0; i < ex[e].nctx; i++) { ex[e].ctx[i] = (int)rng_below(&r, c.vocab_size); }
        for (int k = 0; k < ex[e].nc; k++) {
            ex[e].ncomp[k] = 1 + (int)rng_below(&r, 6);
            for (int i = 0; i < ex[e].ncomp[k]; i++) { ex[e].comp[k][i] = (int)rng_below(&r, c.vocab_size); }
        }
    }
    const char* f = pathf("%s/hand.bin", td.path);
    size_t fbytes = mc_write(f, ex, 7);
    McSet s;
    mc_read(&s, f, c.vocab_size);
    CHECK(s.n == 7 && s.n_comp == 20, "mc_read: %d examples, %zu completions (want 7, 20)", s.n, s.n_comp);
    // the trainer's scoring (chunkwise mixer, chunks of 4; batches of 4 rows: whole examples packed, rows padded)
    Trainer tr;
    memset(&tr, 0, sizeof tr);
    model_init(&tr.m, &c, 4, 1);
    randomize_params(&tr.m);
    double ll[20];
    mc_loglik(&tr, &s, 4, ll);
    Model mt;   // the same parameters in the per-token form
    model_init(&mt, &c, 4, 0);
    memcpy(mt.params, tr.m.params, tr.m.lay.num_elems * sizeof(real));
    double worst = 0.0, ref[20];
    for (int e = 0, ci = 0; e < 7; e++) {
        for (int k = 0; k < ex[e].nc; k++, ci++) {
            int seq[16], n = 0;
            for (int i = 0; i < ex[e].nctx; i++) { seq[n++] = ex[e].ctx[i]; }
            for (int i = 0; i < ex[e].ncomp[k]; i++) { seq[n++] = ex[e].comp[k][i]; }
            ref[ci] = ll_per_token(&mt, seq, n, ex[e].nctx);
            double d = fabs(ll[ci] - ref[ci]) / (1.0 + fabs(ref[ci]));
            worst = d > worst ? d : worst;
        }
    }
    // fp32 forward passes of a few tokens: ~1e-6 relative; 1e-4 leaves room and catches any misplaced target
    CHECK(worst < 1e-4, "mc log-likelihoods vs the per-token form alone: rel err %.2e", worst);
    printf("  mc: 20 completions of a hand-written file, packed rows (chunkwise) vs each alone (per-token): rel err %.1e\n", worst);
    // the CLI end to end: the same numbers in the samples file
    const char* ck = pathf("%s/model.bin", td.path);
    pdn_checkpoint_write(ck, &c, &tr.m.lay, tr.m.params, REAL_DTYPE, 0);
    int rc = run_cmd(pathf("./train_pdn -e %s --eval mc --eval-file %s --eval-tokens 20 -o %s", ck, f, td.path), outbuf, sizeof outbuf);
    CHECK(rc == 0 && strstr(outbuf, "acc_tok"), "--eval mc failed (rc %d):\n%s", rc, outbuf);
    FILE* sf = fopen(pathf("%s/eval_mc_samples.tsv", td.path), "r");
    double cli_worst = sf ? 0.0 : 1.0;
    char line[1024];
    for (int e = -1; sf && fgets(line, sizeof line, sf); e++) {
        if (e < 0) { continue; }
        int idx, lab, pk, pn, used;
        char* p = line;
        if (sscanf(p, "%d\t%d\t%d\t%d\t%n", &idx, &lab, &pk, &pn, &used) != 4) { cli_worst = 1.0; break; }
        p += used;
        for (int k = 0; k < ex[e].nc; k++) {
            double v = strtod(p, &p);
            double d = fabs(v - ref[s.ex[e].comp + k]) / (1.0 + fabs(ref[s.ex[e].comp + k]));
            cli_worst = d > cli_worst ? d : cli_worst;
        }
    }
    if (sf) { fclose(sf); }
    CHECK(cli_worst < 1e-4, "--eval mc's samples file vs the per-token lls: rel err %.2e", cli_worst);
    // acc, acc_norm, acc_tok by hand: the sums, per character and per token pick differently
    McSet hs;
    memset(&hs, 0, sizeof hs);
    McExample hex[4] = {{0, 2, 1, 0, 0}, {0, 2, 1, 0, 2}, {0, 2, 1, 0, 4}, {1, 2, 1, 0, 6}};
    int hlen[8] = {1, 8, 1, 1, 2, 2, 5, 1};                 // tokens
    double hll[8] = {-10, -4, -3, -6, -2, -2, -8, -9};
    long hch[8] = {40, 5, 3, 30, 2, 2, 10, 40};
    hs.n = 4; hs.ex = hex; hs.comp_len = hlen; hs.n_comp = 8;
    // acc: ex0 picks 1 (wrong), ex1 0 (right), ex2 tie -> 0 (right), ex3 0 (wrong): 0.5
    // acc_norm: -0.25 vs -0.8 -> 0 right; -1 vs -0.2 -> 1 wrong; tie -> 0 right; -0.8 vs -0.225 -> 1 right: 0.75
    // acc_tok: -10 vs -0.5 -> 1 wrong; -3 vs -6 -> 0 right; -1 vs -1 -> 0 right; -1.6 vs -9 -> 0 wrong: 0.5
    McScores sc = mc_tally(&hs, hll, hch, NULL, NULL);
    CHECK(fabs(sc.acc - 0.5) < 1e-12 && fabs(sc.acc_norm - 0.75) < 1e-12 && fabs(sc.acc_tok - 0.5) < 1e-12,
          "mc_tally by hand: acc %.3f (want 0.5), acc_norm %.3f (0.75), acc_tok %.3f (0.5)", sc.acc, sc.acc_norm, sc.acc_tok);
    McScores nc = mc_tally(&hs, hll, NULL, NULL, NULL);
    CHECK(nc.acc_norm == -1.0, "acc_norm without characters must be absent");
    printf("  mc: acc 0.50 / acc_norm 0.75 / acc_tok 0.50 on the hand-worked case (ties to the first)\n");
    // malformed files: each refused (exit 2) naming the byte where it goes wrong
    static uint8_t good[8192], bad[8192];
    FILE* gf = fopenCheck(f, "rb");
    size_t gn = fread(good, 1, sizeof good, gf);
    fclose(gf);
    CHECK(gn == fbytes, "hand file size %zu, wrote %zu", gn, fbytes);
    size_t ex1 = 1024 + (size_t)good[1024 + 2] + ((size_t)good[1024 + 3] << 8); // example 1's first byte
    struct { const char* what; size_t at; int val; long cut; const char* want; } cases[] = {
        {"magic", 0, 7, 0, "byte 0: magic"},
        {"version", 4, 2, 0, "byte 4: version"},
        {"delimiter of example 1", ex1, 1, 0, "example 1 does not start"},
        {"index of example 1", ex1 + 4, 5, 0, "example 1 has the index 5"},
        {"label = completions", 1024 + 6, 2, 0, "label 2 is not one of its 2"},
        {"empty context", 1024 + 10, 0, 0, "context has 0 tokens"},
        {"token outside the vocabulary", 1024 + 12, 13, 0, "outside the model's vocabulary"},
        {"truncated", 0, -1, 7, "byte"},
        {"trailing bytes", 0, -1, -2, "after the last"},
        {"longest example", 12, 1000, 0, "byte 12: the header's longest"},
    };
    int vocab = c.vocab_size, refused = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, good, gn);
        size_t bn = gn;
        if (cases[i].cut > 0) { bn = gn - (size_t)cases[i].cut; }
        else if (cases[i].cut < 0) { bn = gn + 2; bad[gn] = bad[gn + 1] = 0; }
        else if (cases[i].at < 16) { int32_t v = cases[i].val; memcpy(bad + cases[i].at, &v, 4); }
        else { bad[cases[i].at] = (uint8_t)cases[i].val; bad[cases[i].at + 1] = 0; }
        const char* bp = pathf("%s/bad%zu.bin", td.path, i);
        write_bytes(bp, bad, bn);
        mc_child_path = bp;
        int crc = run_child(child_mc_read, &vocab, data_msg, sizeof data_msg);
        int ok = crc == EXIT_BADFILE && strstr(data_msg, cases[i].want) && strstr(data_msg, "byte ");
        refused += ok;
        CHECK(ok, "malformed eval file (%s): rc %d, message: %s", cases[i].what, crc, data_msg);
    }
    printf("  mc: %d malformed files refused (exit 2) with the byte offset and the reason\n", refused);
    mc_free(&s);
    acts_free(&tr.eval);
    model_free(&tr.m);
    model_free(&mt);
    tdir_close(&td);
}

// ---- perplexity and bits per byte

static void test_ppl_bpb(Tokenizer* tok) {
    TestDir td;
    tdir_open(&td, "eval_ppl");
    PdnConfig c = small_config("gdn", 0, 1);
    c.vocab_size = tok->vocab_size;
    Model m;
    model_init(&m, &c, 8, 0);
    randomize_params(&m);
    const char* text = "First Citizen:\nBefore we proceed any further, hear me speak. Caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 "
                       "all: speak, speak.\nYou are all resolved rather to die than to famish?";
    TokenBuf tb;
    memset(&tb, 0, sizeof tb);
    tokenizer_encode_doc(tok, text, strlen(text), &tb); // <|endoftext|> then the text
    int N = (int)tb.n, L1 = N - 1, L2 = (N - 1) / 3;
    shard_write(pathf("%s/v_val_000000.bin", td.path), 2, tb.ids, tb.n);
    const char* ck = pathf("%s/model.bin", td.path);
    pdn_checkpoint_write(ck, &c, &m.lay, m.params, REAL_DTYPE, 0);
    // direct: the per-token form over each window alone, nll in double; the one-window case's bytes are the text's
    double nll[2] = {0, 0};
    long bytes[2] = {(long)strlen(text), 0};
    int Ls[2] = {L1, L2};
    for (int k = 0; k < 2; k++) {
        for (int w = 0; (w + 1) * Ls[k] + 1 <= N; w++) {
            nll[k] -= ll_per_token(&m, tb.ids + (size_t)w * Ls[k], Ls[k] + 1, 1);
            for (int i = 1; k == 1 && i <= Ls[k]; i++) { size_t len; tokenizer_token(tok, tb.ids[w * Ls[k] + i], &len); bytes[1] += (long)len; }
        }
    }
    int rc = run_cmd(pathf("./train_pdn -e %s --eval ppl -j '%s/v_val_*.bin' --tokenizer %s/small/tokenizer.bin --eval-len %d,%d "
                           "--eval-tokens 64 -o %s", ck, td.path, test_root, L1, L2, td.path), outbuf, sizeof outbuf);
    CHECK(rc == 0, "--eval ppl failed (rc %d):\n%s", rc, outbuf);
    FILE* f = fopen(pathf("%s/eval_ppl.tsv", td.path), "r");
    char line[512];
    int rows = 0;
    for (int k = -1; f && fgets(line, sizeof line, f); k++) {
        if (k < 0 || k > 1) { continue; }
        int len; long win, toks, by; double nsum, loss, ppl, bpb;
        if (sscanf(line, "%d\t%ld\t%ld\t%ld\t%lf\t%lf\t%lf\t%lf", &len, &win, &toks, &by, &nsum, &loss, &ppl, &bpb) != 8) { break; }
        double want = nll[k] / log(2.0) / bytes[k];
        // fp32 chunkwise vs per-token in double-summed log-softmax: ~1e-6; 1e-4 catches an off-by-one target or byte
        CHECK(len == Ls[k] && by == bytes[k] && fabs(bpb - want) < 1e-4 * want && fabs(ppl - exp(nll[k] / toks)) < 1e-4 * ppl,
              "ppl length %d: bytes %ld (want %ld), bpb %.6f (direct %.6f), ppl %.4f (direct %.4f)", len, by, bytes[k], bpb, want,
              ppl, exp(nll[k] / toks));
        rows++;
    }
    if (f) { fclose(f); }
    CHECK(rows == 2, "eval_ppl.tsv: %d rows of 2", rows);
    printf("  ppl: bits per byte of a %zu-byte text (UTF-8 included) = the direct computation (%.4f), and for 3 windows\n",
           strlen(text), nll[0] / log(2.0) / bytes[0]);
    tokbuf_free(&tb);
    model_free(&m);
    tdir_close(&td);
}

// ---- generation with the carried state at long lengths

static void test_state_long(void) {
    const char* variants[3] = {"gdn", "pgdn", "pkda"};
    for (int v = 0; v < 3; v++) {
        PdnConfig c = small_config(variants[v], 0, 1);
        Trainer tr;
        memset(&tr, 0, sizeof tr);
        model_init(&tr.m, &c, 64, 1);
        randomize_params(&tr.m);
        // a 3000-token prompt (47 chunks of 64 and a part), then 60 tokens decoded one at a time
        int P = 3000, G = 60;
        int* prompt = (int*)mallocCheck((size_t)P * sizeof(int));
        for (int i = 0; i < P; i++) { prompt[i] = (int)rng_below(&trng, c.vocab_size); }
        int gen[60];
        float lp[60];
        double a, b;
        int n = sniah_generate(&tr, c.vocab_size, prompt, P, G, -1, gen, lp, &a, &b);
        double d = sniah_state_check(&tr, prompt, P, gen, lp, n);
        // fp32 log-probs of order 1 through 3000 tokens of recurrence: summation order ~1e-5; 1e-3 fails any lost state
        CHECK(n == G && d < 1e-3, "%s: prefill %d + %d decoded: max |dlogp| vs the full forward %.2e", variants[v], P, n, d);
        printf("  %-4s prefill of %d + %d decoded tokens: log-probs = one full forward's (max diff %.1e)\n", variants[v], P, n, d);
        free(prompt);
        acts_free(&tr.eval);
        model_free(&tr.m);
    }
}

static void test_eval_cli(void) {
    struct { const char* args; const char* want; } cases[] = {
        {"--eval bogus -e x.bin", "--eval must be"},
        {"--eval mc", "needs -e"},
        {"--eval mc -e x.bin", "--eval-file"},
        {"--eval sniah1 -e x.bin", "--tokenizer"},
        {"--eval sniah2 -e x.bin --tokenizer t", "--haystack"},
        {"--eval ppl -e x.bin", "-j"},
        {"--eval ppl -e x.bin -j 'v*' --eval-len 64,,2", "--eval-len"},
        {"--eval sniah1 -e x.bin --tokenizer t --eval-depths 0,101", "--eval-depths"},
        {"--eval mc -e x.bin --eval-file f --generate 5", "runs alone"},
    };
    int ok = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = run_cmd(pathf("./train_pdn %s", cases[i].args), outbuf, sizeof outbuf);
        int good = rc == EXIT_USAGE && strstr(outbuf, cases[i].want);
        ok += good;
        CHECK(good, "'%s': rc %d (want %d), output: %s", cases[i].args, rc, EXIT_USAGE, outbuf);
    }
    printf("  %d bad --eval command lines refused (exit 1) with the reason\n", ok);
}

static void run_eval_tests(void) {
    printf("evaluations (issue 16):\n");
    Tokenizer small;
    train_small_tokenizer(&small);
    test_sniah_builder(&small);
    test_mc();
    test_ppl_bpb(&small);
    test_state_long();
    test_eval_cli();
    tokenizer_free(&small);
}
