/*
test_mqar.h: the tests of Zoology's MQAR generator (mqar.h, --mqar-gen zoology) and its data source, included by
test_pdn.c after its subprocess helpers (run_cmd, outbuf, check_resumed).
- the generator against its definition (../shared/notes/evals.md §1.1): disjoint key and value halves, distinct
  keys and values, every key queried exactly once at a query slot, the label there = the value stored after that
  key, no label anywhere else, the fill uniform over [0, V) (chi-square), the token after a query only as often
  the answer as chance says; the query slots against the power law (chi-square of the first and the second key's
  slot against their exact distributions under drawing without replacement); determinism per (seed, index);
  Zoology's asserts
- the data source: the training order (one order every epoch, a short last batch padded with target-free rows),
  ranks, save/restore, the whole test set per evaluation
- end to end (./train_pdn): resume across an epoch boundary bit for bit, refused resumes, early stopping
  (--mqar-stop-acc) after learning, and bad flags
*/

// Wilson-Hilferty: the chi-square quantile with k degrees of freedom that a chi-square variable exceeds with
// probability Q(z) (z = 4.753: 1e-6, one-sided). A correct generator fails a test at this bound once in a million
// seeds; the seeds here are fixed, so the tests are deterministic.
static double chi2_bound(int k, double z) {
    double a = 2.0 / (9.0 * k);
    double c = 1.0 - a + z * sqrt(a);
    return k * c * c * c;
}

static double chi2_stat(const long* count, const double* prob, int n, long total) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        s += (count[i] - e) * (count[i] - e) / e;
    }
    return s;
}

// one example of the set (seed) at index i, through the batch call (first = i, B = 1)
static void zoo_one(const MqarConfig* c, uint64_t seed, long i, int* x, int* y) {
    mqar_zoology_batch(c, seed, i + 1, i, 1, x, y);
}

static void test_mqar_zoology_invariants(void) {
    MqarConfig c = {256, 128, 16, 0.01f};
    CHECK(mqar_check_zoology(&c) == NULL, "valid Zoology MQAR config rejected");
    MqarConfig odd = {256, 127, 16, 0.01f}, small = {128, 128, 16, 0.01f};
    CHECK(mqar_check_zoology(&odd) != NULL, "Zoology MQAR with an odd length accepted (multiquery_ar asserts it even)");
    CHECK(mqar_check_zoology(&small) != NULL, "Zoology MQAR with vocab <= length accepted (multiquery_ar asserts V > L)");
    int T = c.seq_len, N = c.pairs, V = c.vocab, C = 2 * N, M = 2000;
    int *x = (int*)mallocCheck(sizeof(int) * T), *y = (int*)mallocCheck(sizeof(int) * T);
    int ok_kv = 1, ok_labels = 1, ok_fill = 1;
    long after_is_answer = 0, queries = 0;
    for (long e = 0; e < M; e++) {
        zoo_one(&c, 77, e, x, y);
        for (int i = 0; i < N; i++) { // keys in [1, V/2), values in [V/2, V), each distinct
            ok_kv &= x[2 * i] >= 1 && x[2 * i] < V / 2 && x[2 * i + 1] >= V / 2 && x[2 * i + 1] < V;
            for (int j = 0; j < i; j++) { ok_kv &= x[2 * i] != x[2 * j] && x[2 * i + 1] != x[2 * j + 1]; }
        }
        int seen[16] = {0}, labelled = 0;
        for (int t = 0; t < T; t++) {
            ok_fill &= x[t] >= 0 && x[t] < V;
            if (y[t] < 0) { continue; }
            labelled++;
            ok_labels &= t >= C && (t - C) % 2 == 0; // a query slot
            int k = -1;
            for (int i = 0; i < N; i++) { if (x[2 * i] == x[t]) { k = i; } }
            ok_labels &= k >= 0 && y[t] == x[2 * k + 1]; // a key; the label is the value stored after it
            if (k >= 0) { seen[k]++; }
            queries++;
            after_is_answer += x[t + 1] == y[t]; // t + 1 <= T - 1: the last slot sits at T - 2
        }
        ok_labels &= labelled == N;
        for (int i = 0; i < N; i++) { ok_labels &= seen[i] == 1; } // every key queried exactly once
    }
    CHECK(ok_kv, "Zoology MQAR: keys/values outside their halves or repeated within an example");
    CHECK(ok_labels, "Zoology MQAR: labels not exactly one per key, at its query slot, equal to its value");
    CHECK(ok_fill, "Zoology MQAR: a token outside [0, vocab)");
    // the token after a query is fill: it equals the answer with probability 1/V (binomial; bound mean + 6 sd). A
    // generator that wrote the value after its query would score 100%.
    double mean = (double)queries / V, bound = mean + 6.0 * sqrt(mean);
    CHECK(after_is_answer < bound, "Zoology MQAR: the token after a query is its answer %ld times of %ld (chance %.0f)",
          after_is_answer, queries, mean);
    printf("  Zoology MQAR invariants over %d examples (V %d, L %d, N %d): halves, distinct keys/values, one query per key "
           "with its value as label, no other labels; token after a query = answer %ld times (chance %.0f)\n",
           M, V, T, N, after_is_answer, mean);
    free(x); free(y);
}

// the fill: every position that is neither a key/value nor a query is uniform over [0, V) (Zoology's torch.randint(V))
static void test_mqar_zoology_fill(void) {
    MqarConfig c = {96, 64, 4, 0.01f};
    int T = c.seq_len, V = c.vocab, M = 2000;
    long* count = (long*)callocCheck((size_t)V, sizeof(long));
    double* prob = (double*)mallocCheck(sizeof(double) * V);
    int x[64], y[64];
    long total = 0;
    for (long e = 0; e < M; e++) {
        zoo_one(&c, 5, e, x, y);
        for (int t = 2 * c.pairs; t < T; t++) {
            if (y[t] >= 0) { continue; }
            count[x[t]]++;
            total++;
        }
    }
    for (int v = 0; v < V; v++) { prob[v] = 1.0 / V; }
    double s = chi2_stat(count, prob, V, total), b = chi2_bound(V - 1, 4.753);
    CHECK(s < b, "Zoology MQAR fill not uniform over [0, %d): chi-square %.1f >= %.1f (df %d)", V, s, b, V - 1);
    CHECK(count[0] > 0 && count[V - 1] > 0 && count[V / 2] > 0, "Zoology MQAR fill misses 0, the top or the value half");
    printf("  Zoology MQAR fill: %ld tokens uniform over [0, %d) (chi-square %.1f < %.1f, df %d), 0 and both halves drawn\n",
           total, V, s, b, V - 1);
    free(count); free(prob);
}

// The query slots: key j is queried at the j-th slot drawn, without replacement, with p_i ~ i^(a-1). So the first
// key's slot follows p exactly and the second key's q_k = p_k * sum_{i != k} p_i / (1 - p_i) (first i, then k among
// the rest). Chi-square of both against these, and, to show the test has power, of the first against uniform.
static void test_mqar_zoology_slots(void) {
    MqarConfig c = {128, 64, 8, 0.01f};
    int T = c.seq_len, C = 2 * c.pairs, S = (T - C) / 2, M = 40000;
    double p[24], q[24], u[24];
    double tot = 0.0;
    for (int i = 0; i < S; i++) { p[i] = 0.01 * pow(i + 1.0, 0.01 - 1.0); tot += p[i]; } // Zoology's formula
    for (int i = 0; i < S; i++) { p[i] /= tot; u[i] = 1.0 / S; }
    for (int k = 0; k < S; k++) {
        double s = 0.0;
        for (int i = 0; i < S; i++) { if (i != k) { s += p[i] / (1.0 - p[i]); } }
        q[k] = p[k] * s;
    }
    long c1[24] = {0}, c2[24] = {0};
    int x[64], y[64];
    for (long e = 0; e < M; e++) {
        zoo_one(&c, 99, e, x, y);
        for (int t = C; t < T; t += 2) {
            if (y[t] < 0) { continue; }
            if (x[t] == x[0]) { c1[(t - C) / 2]++; }
            if (x[t] == x[2]) { c2[(t - C) / 2]++; }
        }
    }
    double b = chi2_bound(S - 1, 4.753);
    double s1 = chi2_stat(c1, p, S, M), s2 = chi2_stat(c2, q, S, M), su = chi2_stat(c1, u, S, M);
    CHECK(s1 < b, "Zoology MQAR: first key's slot vs the power law: chi-square %.1f >= %.1f (df %d)", s1, b, S - 1);
    CHECK(s2 < b, "Zoology MQAR: second key's slot vs drawing without replacement: chi-square %.1f >= %.1f", s2, b);
    CHECK(su > 10 * b, "chi-square against uniform placement only %.1f: the slot test would not see a wrong law", su);
    printf("  Zoology MQAR query slots (%d examples, %d slots, power_a 0.01): first key vs p chi-square %.1f, second key "
           "vs without-replacement q %.1f, bound %.1f (df %d, 1e-6); uniform placement would score %.0f\n",
           M, S, s1, s2, b, S - 1, su);
}

// determinism per (seed, index), the batch = consecutive examples, the data seeds' ranges
static void test_mqar_zoology_determinism(void) {
    MqarConfig c = {128, 64, 8, 0.01f};
    int x1[4 * 64], y1[4 * 64], x2[64], y2[64];
    mqar_zoology_batch(&c, 1234, 100, 10, 4, x1, y1);
    int same = 1;
    for (int b = 0; b < 4; b++) {
        zoo_one(&c, 1234, 10 + b, x2, y2);
        same &= memcmp(x1 + b * 64, x2, sizeof x2) == 0 && memcmp(y1 + b * 64, y2, sizeof y2) == 0;
    }
    CHECK(same, "Zoology MQAR: batch rows differ from the examples made one by one (same seed and index)");
    zoo_one(&c, 1235, 10, x2, y2);
    CHECK(memcmp(x1, x2, sizeof x2) != 0, "Zoology MQAR: another set seed gives the same example");
    CHECK(memcmp(x1, x1 + 64, sizeof x2) != 0, "Zoology MQAR: consecutive examples are equal");
    // past the set's end: padding rows without targets
    mqar_zoology_batch(&c, 1234, 12, 10, 4, x1, y1);
    int pad = 1;
    for (int t = 2 * 64; t < 4 * 64; t++) { pad &= x1[t] == 0 && y1[t] == -1; }
    CHECK(pad, "Zoology MQAR: rows past the end of the set are not target-free padding");
    uint64_t tr, te, tr2, te2;
    mqar_zoology_seeds(123, &tr, &te);
    mqar_zoology_seeds(124, &tr2, &te2);
    CHECK(tr < (1ull << 31) && te >= (1ull << 31) && te < (1ull << 32) && tr != tr2 && te != te2,
          "Zoology MQAR seeds: train %llu, test %llu (want train in [0, 2^31), test in [2^31, 2^32), per data seed)",
          (unsigned long long)tr, (unsigned long long)te);
    printf("  Zoology MQAR: an example depends only on (seed, index); padding past the end; train seed %llu < 2^31 <= "
           "test seed %llu (data seed 123)\n", (unsigned long long)tr, (unsigned long long)te);
}

// the data source with --mqar-gen zoology: a TrainConfig as the command line would leave it
static void zoo_source(DataSource* ds, int B, long n_train, long n_test, int rank, int world) {
    static TrainConfig tc;
    train_defaults(&tc);
    tc.mqar_gen = "zoology"; tc.B = B; tc.T = 32; tc.mqar_pairs = 4; tc.mqar_vocab = 64;
    tc.mqar_train = n_train; tc.mqar_test = n_test;
    train_config_check(&tc, world);
    int vocab = 0;
    data_init(ds, &tc, 0, &vocab, rank, world);
}

static void test_mqar_zoology_source(void) {
    const int B = 4, T = 32;
    const long n_train = 10, n_test = 6; // 3 batches an epoch, the last of 2 examples
    DataSource ds;
    zoo_source(&ds, B, n_train, n_test, 0, 1);
    int xs[8][4 * 32], ys[8][4 * 32], x[4 * 32], y[4 * 32], xe[32], ye[32];
    for (int g = 0; g < 8; g++) { data_next(&ds, xs[g], ys[g]); }
    int ok = 1;
    for (int g = 0; g < 3; g++) { // epoch 1: examples 0..9 in order, then padding
        for (int b = 0; b < B; b++) {
            long e = (long)g * B + b;
            if (e < n_train) {
                zoo_one(&ds.mq, ds.train_seed, e, xe, ye);
                ok &= memcmp(xs[g] + b * T, xe, sizeof xe) == 0 && memcmp(ys[g] + b * T, ye, sizeof ye) == 0;
            } else {
                for (int t = 0; t < T; t++) { ok &= ys[g][b * T + t] == -1; }
            }
        }
    }
    for (int g = 3; g < 8; g++) { ok &= memcmp(xs[g], xs[g % 3], sizeof x) == 0 && memcmp(ys[g], ys[g % 3], sizeof y) == 0; }
    CHECK(ok, "Zoology MQAR source: the training order is not examples 0..n-1 in batches, the same every epoch");
    // two ranks: rank r's k-th batch is the single-process batch 2k + r
    for (int r = 0; r < 2; r++) {
        DataSource dr;
        zoo_source(&dr, B, n_train, n_test, r, 2);
        for (int k = 0; k < 3; k++) {
            data_next(&dr, x, y);
            ok &= memcmp(x, xs[2 * k + r], sizeof x) == 0;
        }
        data_free(&dr);
    }
    CHECK(ok, "Zoology MQAR source: 2 ranks do not split the single-process batches");
    // save after 5 batches, restore into a fresh source: the 6th batch follows
    DataSource d2;
    zoo_source(&d2, B, n_train, n_test, 0, 1);
    for (int g = 0; g < 5; g++) { data_next(&d2, x, y); }
    TrainState st;
    memset(&st, 0, sizeof st);
    data_save(&d2, &st);
    data_free(&d2);
    zoo_source(&d2, B, n_train, n_test, 0, 1);
    data_restore(&d2, &st, "test");
    data_next(&d2, x, y);
    CHECK(st.data_kind == DATA_ZOOLOGY && memcmp(x, xs[5], sizeof x) == 0, "Zoology MQAR source: save/restore loses the position");
    data_free(&d2);
    // evaluation: the whole test set (its own seed), ceil(n_test / B) batches, the rest padding
    long nb = data_val_begin(&ds);
    int val_ok = nb == 2;
    for (long bi = 0; bi < nb; bi++) {
        data_val_next(&ds, x, y);
        for (int b = 0; b < B; b++) {
            long e = bi * B + b;
            if (e < n_test) {
                zoo_one(&ds.mq, ds.test_seed, e, xe, ye);
                val_ok &= memcmp(x + b * T, xe, sizeof xe) == 0;
            } else {
                for (int t = 0; t < T; t++) { val_ok &= y[b * T + t] == -1; }
            }
        }
    }
    CHECK(val_ok, "Zoology MQAR source: an evaluation is not the whole test set (%ld batches)", nb);
    CHECK(memcmp(xs[0], x, sizeof xe) != 0 && ds.train_seed != ds.test_seed, "Zoology MQAR: test set = training set");
    printf("  Zoology MQAR source: one training order every epoch (10 examples, batches of 4, the last padded), 2 ranks "
           "split it, save/restore, each evaluation the whole test set\n");
    data_free(&ds);
}

static void test_mqar_zoology_runs(void) {
    char base[] = "/tmp/pdn_test_zoo_XXXXXX";
    CHECK(mkdtemp(base) != NULL, "mkdtemp failed");
    char cmd[2048], pa[512];
    // 22 examples in batches of 4: 6 batches an epoch, the sixth of 2; 12 steps = two epochs, resumed at the boundary
    const char* flags = "--preset pgdn-tiny --mqar-gen zoology --mqar-vocab 64 -b 4 -t 32 --mqar-pairs 4 --mqar-train 22 "
                        "--mqar-test 8 -x 12 -n 6 -v 0";
    snprintf(cmd, sizeof cmd, "./train_pdn %s -o %s/a && mkdir -p %s/c && cp %s/a/model_00000006.bin %s/a/state_00000006.bin "
             "%s/c/ && ./train_pdn %s -o %s/c -y 1", flags, base, base, base, base, base, flags, base);
    CHECK(run_cmd(cmd, outbuf, sizeof outbuf) == 0 && strstr(outbuf, "resuming from"), "Zoology MQAR resume runs failed:\n%s", outbuf);
    check_resumed(base, 7, 12, "Zoology MQAR resume");
    // resuming with other data settings or the other generator is refused
    snprintf(cmd, sizeof cmd, "./train_pdn %s --mqar-data-seed 7 -x 13 -o %s/c -y 1", flags, base);
    int rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "other Zoology MQAR data"), "resume with another data seed: rc %d\n%s", rc, outbuf);
    snprintf(cmd, sizeof cmd, "./train_pdn --preset pgdn-tiny --mqar-vocab 64 -b 4 -t 32 --mqar-pairs 4 -x 13 -o %s/c -y 1", base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "training on Zoology's MQAR (--mqar-gen zoology), but this run trains on MQAR"),
          "resume of a Zoology state with the pdn generator: rc %d\n%s", rc, outbuf);
    printf("  Zoology MQAR resume across the epoch boundary (short sixth batch): steps 7-12, checkpoint and state bit for "
           "bit; other data settings or the pdn generator refused (exit 1)\n");
    // learning, and Zoology's early stopping: a tiny PGDN passes 50% (chance 3%) and the run ends at that evaluation
    double t0 = wall_seconds();
    snprintf(cmd, sizeof cmd, "./train_pdn --preset pgdn-tiny --mqar-gen zoology --mqar-vocab 64 --mqar-pairs 4 -t 32 -b 16 "
             "-x 500 -l 3e-3 -u 20 -v 25 --mqar-test 256 --mqar-stop-acc 0.5 --threads 1 -o %s/e", base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    long stop = -1, done = -1;
    double acc = -1;
    char* p = strstr(outbuf, "early stop at step ");
    if (p) { sscanf(p, "early stop at step %ld: recall accuracy %lf", &stop, &acc); }
    p = strstr(outbuf, "done: ");
    if (p) { sscanf(p, "done: %ld steps", &done); }
    snprintf(pa, sizeof pa, "%s/e/model_%08ld.bin", base, stop);
    CHECK(rc == 0 && stop > 0 && stop < 500 && stop % 25 == 0 && done == stop && acc > 50.0 && file_exists(pa),
          "Zoology MQAR early stop: rc %d, stopped at %ld (done %ld) with %.2f%%, checkpoint %s\n%s", rc, stop, done, acc,
          file_exists(pa) ? "written" : "missing", outbuf);
    printf("  tiny PGDN on Zoology's MQAR (4 pairs, vocab 64, length 32): %.1f%% at step %ld, where --mqar-stop-acc 0.5 "
           "ended the run (checkpoint written) in %.0f s\n", acc, stop, wall_seconds() - t0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    CHECK(system(cmd) == 0, "cannot remove %s", base);
}

static void test_mqar_zoology_cli(void) {
    struct { const char* args; const char* expect; } cases[] = {
        {"--mqar-gen zipf", "--mqar-gen must be pdn or zoology"},
        {"--mqar-gen zoology -t 63 --mqar-pairs 4 --mqar-vocab 128", "even sequence length"},
        {"--mqar-gen zoology -t 64 --mqar-pairs 4 --mqar-vocab 64", "needs --mqar-vocab > -t"},
        {"--mqar-gen zoology --mqar-train 0", "1 <= --mqar-train"},
        {"--mqar-stop-acc 1.5", "--mqar-stop-acc is a fraction"},
        {"--mqar-gen zoology -i '/tmp/x_train_*.bin'", "--mqar-gen zoology is for MQAR"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./train_pdn -x 1 %s", cases[i].args);
        int rc = run_cmd(cmd, outbuf, sizeof outbuf);
        CHECK(rc == EXIT_USAGE && strstr(outbuf, cases[i].expect), "'%s': expected rc %d and '%s', got rc %d:\n%s",
              cases[i].args, EXIT_USAGE, cases[i].expect, rc, outbuf);
    }
    printf("  %zu bad Zoology MQAR settings refused with a reason (exit 1)\n", sizeof(cases) / sizeof(cases[0]));
}

static void run_mqar_zoology_tests(void) {
    printf("Zoology's MQAR generator (--mqar-gen zoology):\n");
    test_mqar_zoology_invariants();
    test_mqar_zoology_fill();
    test_mqar_zoology_slots();
    test_mqar_zoology_determinism();
    test_mqar_zoology_source();
    if (!file_exists("./train_pdn")) { return; } // run_float_tests reports the missing binary
    test_mqar_zoology_cli();
    test_mqar_zoology_runs();
}
